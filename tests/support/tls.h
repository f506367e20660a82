/* SPDX-License-Identifier: BSD-3-Clause */
/* Helpers for the tls:// suites (tests/check_tls*.c), on top of the TCP
 * harness (tests/support/harness.h): TLS configurations from the test
 * certificates (tests/support/certs.h), extra contexts on the harness's
 * loop (a client with another certificate), connects that report why they
 * failed, fd counting, SHA-256. Real Dask peers: tests/support/proc.h. */
#ifndef TW_TESTS_SUPPORT_TLS_H
#define TW_TESTS_SUPPORT_TLS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <taskwire/taskwire.h>

#include "tests/support/certs.h"
#include "tests/support/proc.h"
#include "tests/support/harness.h"

/* A configuration from certificate names (NULL: not set). Asserts that
 * loading works. */
tw_tls_config *tt_config(const char *ca, const char *cert, const char *key);
/* Give ctx that configuration. */
void tt_use_tls(tw_context *ctx, const char *ca, const char *cert, const char *key);

/* tu_init with mutual TLS (ca.pem, cert.pem, key.pem) on h->ctx, which
 * then both listens and connects. */
void tt_init(struct tu *h);
/* tt_init, an echo listener on tls://127.0.0.1:0 and one connected client
 * peer that keeps what it receives. */
struct tu_peer *tt_setup_echo(struct tu *h);
/* Free the extra contexts and their peers, then tu_fini. */
void tt_fini(struct tu *h);

/* Another context on h's loop, with its own TLS configuration (names as
 * tt_config; all NULL: no TLS). Freed by tt_fini. */
tw_context *tt_context(struct tu *h, const char *ca, const char *cert, const char *key);

/* Connect from ctx (any context on h's loop) and wait. Returns the
 * connect callback's error; on 0 *out is a started client peer. On
 * failure, why (may be NULL) gets tw_context_last_error(ctx). */
int tt_connect(struct tu *h, tw_context *ctx, const char *uri, struct tu_peer **out, char *why,
	       size_t why_len);

/* A connect that should be refused: connect from ctx, and if the connect
 * succeeds, read (and, with `write`, first write one small message) until
 * the comm ends. Returns the connect error or the comm's close error (0
 * if the comm was still open after ms), with the reason in why:
 * tw_context_last_error or tw_comm_last_error. *stage gets 0 when the
 * connect failed, 1 when the comm failed. */
int tt_refused(struct tu *h, tw_context *ctx, const char *uri, int write, int ms, int *stage,
	       char *why, size_t why_len);

/* A started peer for comm c (after a handshake), freed by tt_fini. */
struct tu_peer *tt_peer(struct tu *h, tw_comm *c);
/* Free a peer made by tt_connect or a tt_listen listener. */
void tt_peer_free(struct tu_peer *p);

/* Like tt_connect, but *out is the bare comm (no callbacks set). */
int tt_connect_bare(struct tu *h, tw_context *ctx, const char *uri, tw_comm **out, char *why,
		    size_t why_len);

/* A client peer connected from h->ctx to uri and through the Dask
 * handshake (connecting side); it keeps what it receives. Asserts, with
 * the reason. */
struct tu_peer *tt_dask_client(struct tu *h, const char *uri);
/* identity on p (a tt_dask_client of a Dask scheduler), within ms: the
 * reply is a map with an "id" and type "Scheduler". Asserts. */
void tt_assert_scheduler(struct tu *h, struct tu_peer *p, int ms);
/* echo(data=<len bytes of data from off, out of band>) on p, within ms:
 * the reply is the same bytes (len 0: no data). Asserts. */
void tt_assert_echo(struct tu *h, struct tu_peer *p, tw_block *data, size_t off, size_t len,
		    int ms);

/* The Dask handshake on a comm of h's loop, waited for. Returns its err;
 * on failure why gets tw_comm_last_error and the comm is freed. */
int tt_handshake(struct tu *h, tw_comm *c, int listener_side, char *why, size_t why_len);

/* A listener on ctx (any context on h's loop) whose comms echo every
 * message (server peers appended to h->srv); with `dask`, each comm does
 * the Dask handshake (listener side) first, and handshake failures are
 * counted in *failed (may be NULL). addr gets the bound address. Freed
 * with its context. */
tw_listener *tt_listen(struct tu *h, tw_context *ctx, const char *uri, int dask, int *failed,
		       char *addr, size_t addr_len);

/* uri with its scheme replaced ("tls://127.0.0.1:5" -> "tcp://127.0.0.1:5"),
 * into buf. */
const char *tt_uri_as(const char *uri, const char *scheme, char *buf, size_t len);

/* A small echo on a healthy comm (the canary of the rejection tests). */
void tt_canary(struct tu_peer *cli, unsigned seed);

/* Open file descriptors of this process (entries of /proc/self/fd). */
int tt_fd_count(void);

/* TCP sockets of this host in CLOSE_WAIT with `port` at either end
 * (/proc/net/tcp and tcp6). */
int tt_close_wait_count(unsigned port);
/* The port of a "scheme://host:port" URI. */
unsigned tt_uri_port(const char *uri);

/* SHA-256 of n bytes. */
void tt_sha256(const void *p, size_t n, uint8_t out[32]);

#endif
