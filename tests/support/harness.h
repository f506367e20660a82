/* SPDX-License-Identifier: BSD-3-Clause */
/* A small harness for TCP integration tests on loopback.
 *
 * One context on an event_base that the test drives itself
 * (tu_run_until), an echo server that records the comms it accepts, a
 * client peer that records what it receives, a raw POSIX socket client for
 * bad peers, and a byte pattern that is cheap to fill and check.
 * Everything runs on the test's thread. Deadlines only bound waits; no
 * test asserts on time. */
#ifndef TW_TESTS_SUPPORT_HARNESS_H
#define TW_TESTS_SUPPORT_HARNESS_H

#include <stddef.h>
#include <stdint.h>

#include <taskwire/taskwire.h>

#include "tests/support/loop.h"
#include "tests/support/pattern.h"
#include "tests/support/sock.h"

/* Hang guard: a wait that sees no progress for this long means the test
 * failed. Waits restart it on progress, so a slow machine only waits
 * longer. Under valgrind (TW_TEST_QUICK=1) one TLS handshake step went
 * without progress for over 30 s with two suites and other builds sharing
 * 2 CPUs, so quick runs allow 120 s. */
#define TU_WAIT_MS          (ts_quick() ? 120000 : 30000)
#define TU_MAX_SERVER_COMMS 512

struct tu;

/* One comm and what happened on it. */
struct tu_peer {
	struct tu *h;
	tw_comm *comm; /* NULL once freed */
	size_t nmsgs;  /* messages received */
	tw_msg **msgs; /* received while keep was set, held */
	size_t nkept, cap;
	uint64_t bytes;    /* payload bytes received */
	int keep;          /* hold received messages in msgs */
	int echo;          /* write every received message back */
	int free_in_recv;  /* tw_comm_free from inside the recv callback */
	int free_in_close; /* tw_comm_free from inside the close callback */
	int closed;        /* the close callback ran */
	int close_err;
	int drains;             /* drain callbacks */
	char last_error[512];   /* tw_comm_last_error at close */
	size_t nmsgs_at_close;  /* messages received before the close callback */
	uint64_t live_at_close; /* global block_bytes_live during the close callback */
	tw_msg **pending;       /* echo: messages refused with TW_EAGAIN */
	size_t npending, pcap;
	void (*on_recv)(struct tu_peer *p, tw_msg *m); /* extra hook */
	void (*on_close)(struct tu_peer *p);           /* extra hook, after closed is set */
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

void tu_init(struct tu *h);
/* Free the peers, the listener, the context and the base. */
void tu_fini(struct tu *h);

/* Listen on uri (e.g. "tcp://127.0.0.1:0"); h->addr gets the bound
 * address. Returns the tw_listener_new code. */
int tu_listen(struct tu *h, const char *uri);

/* Realistic networks (tests/netns-check.sh): loopback's 64 KiB MTU hides
 * segmentation, so the transport suites can also run with their servers
 * across a real link. With TW_TEST_HOST set (e.g. 10.200.0.2), servers
 * listen on that host instead of 127.0.0.1; with TW_TEST_LISTEN_NETNS set
 * (a namespace file such as /run/netns/NAME), their listening sockets are
 * made in that network namespace (setns(2) on this thread, then back), so
 * clients in the test's own namespace reach them over the link, and so
 * do the comms they accept. Unset, both change nothing. */
const char *tu_host(void);
/* uri with a host of 127.0.0.1 replaced by tu_host(), into buf. */
const char *tu_uri_host(const char *uri, char *buf, size_t len);
/* Enter the listening namespace; returns what tu_ns_leave needs (-1 when
 * there is none). Asserts on failure. */
int tu_ns_enter(void);
void tu_ns_leave(int saved);
/* tw_listener_new on tu_uri_host(uri), in the listening namespace. */
int tu_tw_listen(tw_context *ctx, const char *uri, tw_accept_cb cb, void *arg, tw_listener **out);

/* A listener's error callback (tw_listener_set_error_cb) that records
 * its calls: their count, and the last one's err, peer and why. */
struct tu_refusal {
	int n, err;
	char peer[128], why[512];
};
void tu_on_refused(tw_listener *l, int err, const char *peer, const char *why, void *arg);
/* A client of h->lis (scheme "tls", "ws" or "wss") that resets before its
 * handshake or upgrade (ts_raw_reset) is told to the listener's error
 * callback with TW_EIO and its address, kept from accept (issue 17: 170
 * of 200 such log lines had none), in the reason too; no comm is made. */
void tu_reset_named(struct tu *h, const char *scheme);

/* Drive the loop until pred(arg) is true (returns 1) or ms pass with no
 * ts_progress (0): ts_run_until on h->base. */
int tu_run_until(struct tu *h, int (*pred)(void *arg), void *arg, int ms);
/* Drive the loop for about ms milliseconds. */
void tu_run_for(struct tu *h, int ms);

/* Wait until *p != 0 (or the deadline); returns *p != 0. */
int tu_wait_flag(struct tu *h, const int *p, int ms);
/* Wait (TU_WAIT_MS) until p's close callback ran; assert it got err. */
void tu_expect_closed(struct tu *h, struct tu_peer *p, int err);
/* Wait until *p >= n; returns *p >= n. */
int tu_wait_count(struct tu *h, const size_t *p, size_t n, int ms);
/* Wait until *p >= n or *stop != 0 (stop may be NULL: a comm's closed
 * flag, after which no more will come); returns 1 when one of them
 * happened before the deadline. */
int tu_wait_count_or(struct tu *h, const size_t *p, size_t n, const int *stop, int ms);

/* Peers. */
struct tu_peer *tu_peer_new(struct tu *h);
void tu_peer_free(struct tu_peer *p);
int tu_peer_start(struct tu_peer *p, tw_comm *c); /* set callbacks */

/* Connect a client peer to uri and wait for the result. Returns the err of
 * the connect callback (or of tw_comm_connect); on 0 *out is the started
 * peer. */
int tu_connect(struct tu *h, const char *uri, struct tu_peer **out);
/* Start a connect whose callback starts a peer into *out when it succeeds
 * and stores the error in *err (left at 1 until then). */
int tu_connect_async(struct tu *h, const char *uri, struct tu_peer **out, int *err);

/* Connect from ctx to uri and do the Dask handshake (the connecting
 * side); cb runs once with the outcome: cb(NULL, err, NULL, arg) when the
 * connect failed, else the handshake's (comm, err, info, arg). The comm is
 * the caller's either way. Returns tw_comm_connect's code (cb never runs when
 * it fails). */
int tu_connect_handshake(tw_context *ctx, const char *uri, tw_handshake_cb cb, void *arg);

/* One tw_comm_connect's outcome as its callback saw it: err, and
 * tw_context_last_error(ctx) at that moment (ctx set by the caller). */
struct tu_connect_result {
	tw_context *ctx;
	int done, err;
	char why[512];
};
/* The tw_connect_cb filling a struct tu_connect_result (arg); it frees
 * the comm. */
void tu_connect_result_cb(tw_comm *c, int err, void *arg);

/* A comm's end as a test records it: how many times the end callback
 * ran, and its last err. */
struct tu_ended {
	int n;
	int err;
};
/* A tw_comm_ended_fn (tw_comm_watch_end, tw_comm_dispatch_stream)
 * recording into the struct tu_ended arg. */
void tu_ended_cb(tw_comm *comm, int err, void *arg);

/* Wait until a tu_connect_async finished (*err != 1); returns 1 then. */
int tu_wait_connected(struct tu *h, const int *err, int ms);

/* The n-th accepted server peer, waiting for it to be accepted. */
struct tu_peer *tu_server_peer(struct tu *h, size_t n);

/* Send n bytes, driving the loop while the socket is full (the server
 * reads on this thread). Stops early when the server closed the
 * connection; returns the bytes sent. */
size_t tu_raw_send(struct tu *h, int fd, const void *p, size_t n);
/* Drive the loop until the server closed fd's connection (recv returns 0
 * or ECONNRESET); returns 1 when closed, 0 at the deadline. */
int tu_raw_wait_closed(struct tu *h, int fd, int ms);

/* Common setup: tu_init, an echo listener on tcp://127.0.0.1:0 and one
 * connected client peer that keeps what it receives. */
struct tu_peer *tu_setup_echo(struct tu *h);
/* Write a pattern message (lens, seed) on cli and check the echo, byte by
 * byte. */
void tu_echo_check(struct tu_peer *cli, const size_t *lens, size_t nf, unsigned seed, int ms);

/* A Dask request: {"op": op}, or {"op": op, "data": <data as out-of-band
 * bytes>} when data is not NULL. */
tw_msg *tu_request(const char *op, const tw_slice *data);
/* Write m on p (which keeps what it receives) and decode the reply that
 * comes within ms; the test fails otherwise. */
tw_decoded *tu_call(struct tu *h, struct tu_peer *p, tw_msg *m, int ms);

/* Resident set size of this process, in bytes (VmRSS). */
uint64_t tu_rss_bytes(void);

#endif
