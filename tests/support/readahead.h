/* SPDX-License-Identifier: BSD-3-Clause */
/* Read-ahead (docs/design.md, Receive path, item 5) against real sockets,
 * for the tcp and tls suites: a raw peer (a plain socket, or a client SSL
 * driven by hand on one) writes stream-framed bytes exactly as the test
 * says, in one write or one message at a time (request/response pacing,
 * which is what switches read-ahead on), to a listener whose comms keep
 * what they receive and never answer. The scenarios check that every
 * good message arrives in order and byte for byte, that a bad head ends
 * only its comm and with its own code, what payload_bytes_copied says
 * (at most 4096 bytes a message, 0 for a large message right after the
 * handshake), and that read-ahead bytes left in the receiver are
 * delivered after tw_comm_resume, at the peer's EOF, and freed when the
 * comm goes away mid-message. */
#ifndef TW_TESTS_SUPPORT_READAHEAD_H
#define TW_TESTS_SUPPORT_READAHEAD_H

#include <stddef.h>
#include <stdint.h>

#include <openssl/ssl.h>

#include "tests/support/harness.h"

/* Largest read-ahead (stream_comm.c GULP_MAX): the copy bound a message. */
#define RA_GULP_MAX 4096

struct ra_peer {
	struct tu *h;
	int fd;
	SSL *ssl;           /* NULL: plain tcp */
	SSL_CTX *ssl_ctx;   /* freed with the peer when set */
	struct tu_peer *sp; /* the server side of this connection */
};

/* Connect a raw peer to h->addr (its TLS handshake done, for tls); the
 * scenarios find its server comm (sp). */
typedef void (*ra_open_fn)(struct tu *h, struct ra_peer *p);

/* The plain tcp opener. */
void ra_open_tcp(struct tu *h, struct ra_peer *p);
/* Send all n bytes (one write as far as the socket takes it), driving the
 * loop while the socket is full. */
void ra_send(struct ra_peer *p, const void *buf, size_t n);
/* Read exactly n bytes, driving the loop; 1 when they came. */
int ra_recv(struct ra_peer *p, void *buf, size_t n);
/* Half-close: close_notify (tls), then FIN. */
void ra_shutdown(struct ra_peer *p);
void ra_close(struct ra_peer *p);

/* A byte string being built. */
struct ra_buf {
	uint8_t *p;
	size_t len, cap;
};
void ra_buf_free(struct ra_buf *b);
/* Append the wire bytes of a message of nf frames (lens), frame i filled
 * with ts_fill(seed + i). */
void ra_put_msg(struct ra_buf *b, const size_t *lens, size_t nf, unsigned seed);
/* Append raw u64 little-endian words. */
void ra_put_u64(struct ra_buf *b, const uint64_t *w, size_t n);

/* A listener on h->ctx at uri whose comms keep every message and never
 * echo; with dask, each comm does the Dask handshake (listener side)
 * first. Server peers go to h->srv. */
void ra_listen(struct tu *h, const char *uri, int dask);

/* The scenarios; each opens its own raw peers with `open`. `good` is a
 * taskwire client of the same listener (its server peer is good_srv),
 * checked after each bad comm. */
struct ra_env {
	struct tu *h;
	ra_open_fn open;
	struct tu_peer *good, *good_srv;
	unsigned seed;
	unsigned soak_rounds; /* of the soak scenario, without TW_TEST_QUICK */
	int peeks;            /* the transport reads ahead by peeking (tcp): never copies */
};
/* Fill e for harness h with the transport's opener; good is left NULL. */
void ra_env_init(struct ra_env *e, struct tu *h, ra_open_fn open, unsigned seed,
		 unsigned soak_rounds);
/* (a) 1,000 small messages in one write, after a paced run and without. */
void ra_pipelined(struct ra_env *e);
/* (b) runs of small messages (0..5, paced or in the same write), then a
 * large message whose first frame is tiny. */
void ra_runs_then_large(struct ra_env *e, size_t large);
/* (c) a run, then good messages and a bad head in one write. */
void ra_bad_heads(struct ra_env *e);
/* Read-ahead bytes pending while the comm is paused, closed, freed,
 * aborted, or at the peer's EOF. */
void ra_pending(struct ra_env *e);
/* The per-wakeup read limit reached with read-ahead bytes pending. */
void ra_read_calls(struct ra_env *e);
/* A random stream in random writes, with pauses: nmsgs messages. */
void ra_soak(struct ra_env *e, unsigned nmsgs);
/* After the Dask handshake (a ra_listen(..., 1) listener): a large
 * message right after it copies nothing. */
void ra_after_handshake(struct ra_env *e, size_t large);

/* The scenarios above as one table, for a loop test per transport: each
 * runs on its own context, with a 5 MiB large message (1 MiB with
 * TW_TEST_QUICK). */
struct ra_case {
	void (*run)(struct ra_env *e);
	int dask; /* the raw peer does the Dask handshake first */
};
extern const struct ra_case ra_cases[];
#define RA_NCASES 7

#endif
