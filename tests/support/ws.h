/* SPDX-License-Identifier: BSD-3-Clause */
/* Helpers for the ws:// and wss:// suites (tests/check_ws*.c), on top of
 * the TCP and TLS harnesses (tests/support/harness.h, tests/support/tls.h).
 *
 * - wu_init: a harness whose context listens on ws:// or wss:// (mutual
 *   TLS with the test certificates) and connects with the same settings.
 * - Frames built here with our own encoder and masking (not the code
 *   under test), client frames masked with the key 37 fa 21 3d of
 *   RFC 6455 section 5.7's examples, and a parser for what a server
 *   sends back.
 * - A raw client (POSIX socket, optionally OpenSSL on top) that does the
 *   upgrade by hand and reads every byte the server sends until it closes
 *   the connection, driving the harness's loop while it waits.
 * - A fake server on a thread of its own (blocking sockets), which answers
 *   an upgrade with bytes the test chooses: bad servers for the client.
 * - A Dask listener whose comms run a hook on each received message. */
#ifndef TW_TESTS_SUPPORT_WS_H
#define TW_TESTS_SUPPORT_WS_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <taskwire/taskwire.h>

#include "tests/support/harness.h"
#include "tests/support/tls.h"

/* The raw clients' hang guard: TU_WAIT_MS (30 s, 120 s in quick runs). A
 * raw TLS connect's deadline does not restart on the library's progress,
 * and under valgrind beside other suites one TLS handshake step went
 * without progress for over 30 s (harness.h). */
#define WU_WAIT_MS TU_WAIT_MS
/* The upgrade request of RFC 6455 section 1.3 uses this key;
 * the server must answer with WU_ACCEPT. */
#define WU_KEY    "dGhlIHNhbXBsZSBub25jZQ=="
#define WU_ACCEPT "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="

/* The scheme of loop test _i: 0 "ws", 1 "wss". */
const char *wu_scheme(int i);

/* tu_init; for wss, mutual TLS (ca.pem, cert.pem, key.pem) on h->ctx. */
void wu_init(struct tu *h, const char *scheme);
/* wu_init, an echo listener on scheme://127.0.0.1:0 and one connected
 * client peer that keeps what it receives. */
struct tu_peer *wu_setup_echo(struct tu *h, const char *scheme);

/* Bytes. */

/* Decode hex (spaces allowed) into out; returns the byte count. */
size_t wu_hex(const char *hex, uint8_t *out, size_t cap);
/* A frame into out (room for 14 + len bytes): FIN, opcode (with RSV bits
 * if op > 15: op is then the whole first byte), minimal length form,
 * masked with 37 fa 21 3d when masked. Returns its length. */
size_t wu_frame(uint8_t *out, int fin, unsigned op, const void *payload, size_t len, int masked);

/* Sec-WebSocket-Accept for key (RFC 6455 section 4.2.2), computed here
 * with OpenSSL's SHA-1 and base64, not by the code under test. */
void wu_accept_of(const char *key, char out[32]);

/* One frame a peer sent. */
struct wu_fr {
	int fin, rsv, op, masked;
	uint8_t key[4]; /* masking key, when masked */
	uint64_t len;
	const uint8_t *payload; /* unmasked when masked (in the buffer) */
};
/* Parse up to max whole frames from p[0..n); returns how many. Masked
 * payloads are unmasked in place and their key in the buffer zeroed, so
 * parsing the same bytes again gives the same frames. *used (may be NULL):
 * bytes they took. */
size_t wu_parse(uint8_t *p, size_t n, struct wu_fr *out, size_t max, size_t *used);
/* The code of the first close frame in p[0..n): its code, 1005 for an
 * empty body, -1 when there is none. reason (may be NULL) gets its text. */
int wu_close_code(uint8_t *p, size_t n, char *reason, size_t reason_len);

/* Raw client. */

struct wu_raw {
	struct tu *h;
	int fd;
	void *ssl;        /* SSL * for wss, else NULL */
	void *ssl_ctx;    /* SSL_CTX * */
	char status[128]; /* the response's status line */
	char head[4096];  /* the response's header block */
	uint8_t *in;      /* bytes the server sent after its header block */
	size_t nin, cap;
	int eof; /* the server closed the connection */
};

/* Connect to uri (ws:// or wss://; wss with the test client certificate)
 * and send `request` (NULL: an upgrade request with WU_KEY).
 * Reads the response's header block into r->status and r->head (unless
 * the server closes first). Returns the HTTP status, or 0 when none came.
 * Asserts on connect and TLS failures. */
int wu_raw_open(struct tu *h, const char *uri, const char *request, struct wu_raw *r);
/* Connect and do the TLS handshake only (wss), or TCP only. */
void wu_raw_connect(struct tu *h, const char *uri, struct wu_raw *r);
/* One nonblocking write of what the socket takes now: bytes, 0 to wait,
 * -1 when the peer is gone. Over TLS, after 0, write the same bytes
 * again (OpenSSL's rule for a write it could not finish). */
ssize_t wu_raw_write(struct wu_raw *r, const uint8_t *p, size_t n);
/* Send n bytes (driving the loop while the socket is full). Returns the
 * bytes sent (fewer when the server closed the connection). */
size_t wu_raw_send(struct wu_raw *r, const void *p, size_t n);
/* Send hex bytes. */
void wu_raw_send_hex(struct wu_raw *r, const char *hex);
/* Read what the server sends into r->in until it closes the connection
 * (returns 1) or ms pass (0). */
int wu_raw_read_eof(struct wu_raw *r, int ms);
/* Read until r->in holds at least n bytes (1) or ms pass / EOF (0). */
int wu_raw_read_n(struct wu_raw *r, size_t n, int ms);
void wu_raw_close(struct wu_raw *r);

/* Drippers (the receive budget's tests): n raw peers (wu_raw_connect:
 * tcp, or TLS alone with a wss:// uri) that each send `burst` as the
 * socket takes it, then `chunk` every tick, for ever; the server comm of
 * peer i is sp[i] (the listener's i-th). A peer whose server comm closed
 * sends no more. The tick paces them; a test asserts nothing on it. */
#define WU_DRIP_MAX 8
struct wu_drip {
	int n;
	struct wu_raw r[WU_DRIP_MAX];
	struct tu_peer *sp[WU_DRIP_MAX];
	const uint8_t *burst, *chunk;
	size_t blen, clen, off[WU_DRIP_MAX];
	struct event *ev;
	uint8_t *own; /* wu_drip_stream's burst, freed by wu_drip_stop */
	uint8_t own_chunk[64];
};
/* Set d's burst to the head of a one-frame tcp/tls message of `declared`
 * bytes and its first n bytes (ts_fill, seed), and its chunk to 64 more. */
void wu_drip_stream(struct wu_drip *d, uint64_t declared, size_t n, unsigned seed);
void wu_drip_start(struct tu *h, struct wu_drip *d, const char *uri, int n, int tick_ms);
/* Stop the tick, close the peers, free what wu_drip_stream made. */
void wu_drip_stop(struct wu_drip *d);
/* Drive the loop until cli has received a message; fails when the bytes
 * srv and cli have read together stop moving for ms (the watchdog of a
 * test whose drippers keep the loop busy, so tu_run_until's never fires). */
void wu_wait_msg_moving(struct tu *h, struct tu_peer *cli, struct tu_peer *srv, int ms);

/* Fake server (for the taskwire client). */

enum wu_fake_mode {
	WU_FAKE_101,        /* a correct 101, then `extra` in the same write */
	WU_FAKE_BAD_ACCEPT, /* 101 with Sec-WebSocket-Accept AAAA...= */
	WU_FAKE_EXTENSION,  /* 101 adding permessage-deflate, not offered */
	WU_FAKE_200,        /* 200 OK instead of 101 */
};

struct wu_fake {
	enum wu_fake_mode mode;
	uint8_t extra[1024]; /* bytes sent right behind the response */
	size_t nextra;
	int lfd;
	char uri[64]; /* ws://127.0.0.1:PORT */
	pthread_t th;
	char request[4096]; /* what the client sent, header block */
	uint8_t got[65536]; /* what it sent after it, until EOF */
	size_t ngot;
	int done; /* the thread finished (read after wu_fake_join) */
	/* stall: after its response, read nothing more (a peer that stopped
	 * reading) until `release` is set, then close. */
	int stall;
	_Atomic int release;
};
/* Listen on 127.0.0.1 and start the thread (one connection). */
void wu_fake_start(struct wu_fake *f);
/* Wait for the thread (it gives up WU_WAIT_MS after starting). */
void wu_fake_join(struct wu_fake *f);

/* Dask listener: each accepted comm does the handshake (listener side),
 * then echoes every message, with hook(peer, msg) run first. Server peers
 * are appended to h->srv. failed counts failed handshakes. */
struct wu_dask_srv {
	struct tu *h;
	tw_listener *l;
	char addr[128];
	int failed;
	void (*hook)(struct tu_peer *p, tw_msg *m);
	void *user;
};
void wu_dask_listen(struct tu *h, const char *uri, struct wu_dask_srv *s);

/* Global stats, now. */
tw_stats wu_stats(void);

#endif
