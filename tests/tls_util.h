/* SPDX-License-Identifier: BSD-3-Clause */
/* Helpers for the tls:// suites (tests/check_tls*.c), on top of the TCP
 * harness (tests/tcp_util.h): test certificates, TLS configurations,
 * extra contexts on the harness's loop (a client with another
 * certificate), connects that report why they failed, fd counting,
 * SHA-256, and child processes (real Dask peers).
 *
 * Certificates: tt_make_certs runs $TW_TOP_SRCDIR/scripts/make-test-certs.sh
 * into a fresh temporary directory once per process (the suite's main);
 * tt_cert names a file in it: "ca.pem", "cert.pem", "key.pem",
 * "other-ca.pem", "other-cert.pem", "other-key.pem", "expired-cert.pem",
 * "expired-key.pem". */
#ifndef TW_TESTS_TLS_UTIL_H
#define TW_TESTS_TLS_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <taskwire/taskwire.h>

#include "tests/tcp_util.h"

/* The Python with Debian's python3-distributed (not the first on PATH). */
#define TT_PYTHON "/usr/bin/python3"

/* Certificates. */
void tt_make_certs(void);
void tt_remove_certs(void);
/* The path of `name` in the certificate directory (static storage, one
 * of a few rotating buffers). */
const char *tt_cert(const char *name);

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

/* Child processes: own process group, stdout and stderr into a log file,
 * killed with the test process (PR_SET_PDEATHSIG and an atexit handler). */
struct tt_proc {
	pid_t pid; /* 0 when not running */
	int status, exited;
	char log[192];
};
/* Start argv[0] (a path). Returns 0 or -1. */
int tt_spawn(struct tt_proc *p, char *const argv[]);
/* Drive h's loop until the log has a line containing marker; the word
 * after it goes into out. Returns 1, or 0 if the process exited or ms
 * passed first. */
int tt_wait_log(struct tu *h, struct tt_proc *p, const char *marker, char *out, size_t len, int ms);
/* Drive h's loop until the process exits (status in p->status). Returns 1
 * when it did, 0 at the deadline. */
int tt_wait_exit(struct tu *h, struct tt_proc *p, int ms);
/* SIGTERM to the group, a grace period, SIGKILL, reap, remove the log.
 * Accepts a stopped or never-started p. */
void tt_stop(struct tt_proc *p);
/* Stop every process still running (a checked fixture's teardown). */
void tt_stop_all(void);
/* The last len - 1 bytes of the log. */
const char *tt_log_tail(const struct tt_proc *p, char *buf, size_t len);

#endif
