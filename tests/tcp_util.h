/* A small harness for TCP integration tests on loopback.
 *
 * One context on an event_base that the test drives itself
 * (tu_run_until), an echo server that records the comms it accepts, a
 * client peer that records what it receives, a raw POSIX socket client for
 * bad peers, and a byte pattern that is cheap to fill and check.
 * Everything runs on the test's thread. Deadlines only bound waits; no
 * test asserts on time. */
#ifndef TW_TESTS_TCP_UTIL_H
#define TW_TESTS_TCP_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include <taskwire/taskwire.h>

/* Deadlines: a wait that takes this long means the test failed. */
#define TU_WAIT_MS 30000
#define TU_MAX_SERVER_COMMS 512

struct tu;

/* One comm and what happened on it. */
struct tu_peer {
	struct tu *h;
	tw_comm *comm;       /* NULL once freed */
	tw_msg **msgs;       /* received messages, held (when keep is set) */
	size_t nmsgs, cap;   /* nmsgs counts every message received */
	uint64_t bytes;      /* payload bytes received */
	int keep;            /* hold received messages in msgs */
	int echo;            /* write every received message back */
	int free_in_recv;    /* tw_comm_free from inside the recv callback */
	int free_in_close;   /* tw_comm_free from inside the close callback */
	int closed;          /* the close callback ran */
	int close_err;
	int drains;          /* drain callbacks */
	char last_error[256]; /* tw_comm_last_error at close */
	tw_msg **pending;    /* echo: messages refused with TW_EAGAIN */
	size_t npending, pcap;
	void (*on_recv)(struct tu_peer *p, tw_msg *m); /* extra hook */
	void *user;
};

/* Server behaviour for comms accepted from now on. */
struct tu_server_opts {
	int echo, keep, free_in_recv, free_in_close;
	int no_callbacks; /* accept but do not read (the kernel keeps the bytes) */
};

struct tu {
	struct event_base *base;
	tw_context *ctx;
	struct event *tick;
	tw_listener *lis;
	char addr[128];
	struct tu_server_opts sopts;
	struct tu_peer *srv[TU_MAX_SERVER_COMMS];
	size_t nsrv;
};

/* TW_TEST_QUICK=1 (valgrind runs): big tests shrink. */
int tu_quick(void);

void tu_init(struct tu *h);
/* Free the peers, the listener, the context and the base. */
void tu_fini(struct tu *h);

/* Listen on uri (e.g. "tcp://127.0.0.1:0"); h->addr gets the bound
 * address. Returns the tw_listen code. */
int tu_listen(struct tu *h, const char *uri);

/* Drive the loop until pred(arg) is true (returns 1) or ms pass (0). */
int tu_run_until(struct tu *h, int (*pred)(void *arg), void *arg, int ms);
/* Drive the loop for about ms milliseconds. */
void tu_run_for(struct tu *h, int ms);

/* Wait until *p != 0 (or the deadline); returns *p != 0. */
int tu_wait_flag(struct tu *h, const int *p, int ms);
/* Wait until *p >= n; returns *p >= n. */
int tu_wait_count(struct tu *h, const size_t *p, size_t n, int ms);

/* Peers. */
struct tu_peer *tu_peer_new(struct tu *h);
void tu_peer_free(struct tu_peer *p);
int tu_peer_start(struct tu_peer *p, tw_comm *c); /* set callbacks */

/* Connect a client peer to uri and wait for the result. Returns the err of
 * the connect callback (or of tw_connect); on 0 *out is the started
 * peer. */
int tu_connect(struct tu *h, const char *uri, struct tu_peer **out);
/* Start a connect whose callback starts a peer into *out when it succeeds
 * and stores the error in *err (left at 1 until then). */
int tu_connect_async(struct tu *h, const char *uri, struct tu_peer **out, int *err);

/* The n-th accepted server peer, waiting for it to be accepted. */
struct tu_peer *tu_server_peer(struct tu *h, size_t n);

/* Pattern: byte i of a frame with seed s is ((i + s) mod 251)*131+7 mod
 * 251 (the seed-0 pattern is (i*131+7) mod 251). */
void tu_fill(uint8_t *p, size_t n, unsigned seed);
/* Returns the first offset that differs, or -1 when all n bytes match. */
long long tu_check(const uint8_t *p, size_t n, unsigned seed);

/* A message of nf frames with lengths lens[i], frame i filled with seed
 * seed + i. */
tw_msg *tu_msg_pattern(const size_t *lens, size_t nf, unsigned seed);
/* 1 when m has nf frames of lengths lens filled with seed + i. */
int tu_msg_matches(const tw_msg *m, const size_t *lens, size_t nf, unsigned seed);

/* Raw POSIX client: blocking connect to a "tcp://host:port" URI. */
int tu_raw_connect(const char *uri);
void tu_raw_send(int fd, const void *p, size_t n);
/* Drive the loop until the server closed fd's connection (recv returns 0
 * or ECONNRESET); returns 1 when closed, 0 at the deadline. */
int tu_raw_wait_closed(struct tu *h, int fd, int ms);

/* Resident set size of this process, in bytes (VmRSS). */
uint64_t tu_rss_bytes(void);

#endif
