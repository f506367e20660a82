/* SPDX-License-Identifier: BSD-3-Clause */
/* The transports of the conformance suite (tests/check_conformance.c),
 * as fixtures on the harness (tests/support/harness.h): what differs
 * between tcp, tls, ws and wss is the URI scheme, whether the context
 * gets mutual TLS with the test certificates (tests/support/certs.h, made
 * at test time), and the bytes a message takes on the wire. A test that
 * holds for every transport is written once, as a loop test whose _i is
 * the transport, and inserted once per transport (ts_tran_tcase). */
#ifndef TW_TESTS_SUPPORT_TRAN_H
#define TW_TESTS_SUPPORT_TRAN_H

#include <stddef.h>
#include <stdint.h>

#include <check.h>

#include "tests/support/harness.h"

enum ts_tran { TS_TCP, TS_TLS, TS_WS, TS_WSS, TS_NTRAN };

/* "tcp", "tls", "ws", "wss". */
const char *ts_tran_scheme(int t);
/* 1 for tls and wss. */
int ts_tran_tls(int t);
/* 1 for ws and wss. */
int ts_tran_ws(int t);

/* tu_init, and for tls and wss mutual TLS (ca.pem, cert.pem, key.pem) on
 * h->ctx, which then both listens and connects. */
void ts_tran_init(struct tu *h, int t);
/* Listen on scheme://127.0.0.1:0 with h->sopts (h->addr: the bound
 * address). Asserts. */
void ts_tran_listen(struct tu *h, int t);
/* Listen on scheme://host:0, host numeric ("::1" gets its brackets).
 * Returns the tu_listen code. */
int ts_tran_listen_at(struct tu *h, int t, const char *host);
/* A client peer connected to h->addr, keeping what it receives. Asserts,
 * with the context's last error. */
struct tu_peer *ts_tran_connect(struct tu *h);
/* ts_tran_init, ts_tran_listen (an echo server) and ts_tran_connect. */
struct tu_peer *ts_tran_setup_echo(struct tu *h, int t);

/* Bytes that a message of nf frames of lens[i] bytes takes on the wire
 * of transport t, as the comms count them (tw_stats bytes_sent and
 * bytes_received: TLS records are not counted, WebSocket headers are):
 * the stream prelude and frames; for ws, the count message, then each
 * frame as one WebSocket message in fragments of at most shard bytes,
 * each header in its minimal form (RFC 6455 section 5.2), with a 4-byte
 * masking key when the client sent it (section 5.3). */
uint64_t ts_tran_wire_bytes(int t, const size_t *lens, size_t nf, size_t shard, int from_client);

/* Echo one pattern message on cli (srv: its server peer), every byte
 * checked, and check the bytes each side counted each way against
 * ts_tran_wire_bytes (shard: the context's WebSocket shard size). */
void ts_tran_echo_wire(int t, struct tu_peer *cli, struct tu_peer *srv, const size_t *lens,
		       size_t nf, unsigned seed, size_t shard);

/* A TCase named after transport t holding every test of tests[] (NULL
 * terminated) as a loop test for t alone (_i == t). */
TCase *ts_tran_tcase(int t, const TTest *const tests[], int timeout_s);

#endif
