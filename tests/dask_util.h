/* SPDX-License-Identifier: BSD-3-Clause */
/* A harness for tests with real Dask peers (tests/check_dask.c) and for
 * decode tests over loopback comms (tests/check_serial.c). Child
 * processes: tests/support/proc.h.
 *
 * Loop: one context on an event_base that the test drives itself
 * (du_run_until), with a tick so every wait checks its deadline. Deadlines
 * only bound waits; no test asserts on time. */
#ifndef TW_TESTS_DASK_UTIL_H
#define TW_TESTS_DASK_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <taskwire/taskwire.h>

#include "tests/support/loop.h"
#include "tests/support/pattern.h"
#include "tests/support/proc.h"
#include "tests/support/sock.h"

/* Hang guards: a wait that sees no progress for this long means the test
 * failed (du_run_until restarts it whenever comms move bytes). */
#define DU_WAIT_MS 60000

/* A loop driven by the test. */

struct du_loop {
	struct event_base *base;
	tw_context *ctx;
	struct event *tick;
};

void du_loop_init(struct du_loop *l);
void du_loop_fini(struct du_loop *l);

/* Drive the loop until pred(arg) (returns 1) or ms pass with no progress
 * (0): ts_run_until on l->base. */
int du_run_until(struct du_loop *l, int (*pred)(void *arg), void *arg, int ms);
/* Drive the loop until *flag != 0; returns *flag != 0. */
int du_wait_flag(struct du_loop *l, const int *flag, int ms);

/* A taskwire client comm, after the Dask handshake, that keeps every
 * message it receives. */

struct du_client {
	struct du_loop *loop;
	tw_comm *comm;
	int done;             /* connect and handshake finished */
	int err;              /* their result */
	char compression[16]; /* negotiated, "" for none */
	char peer_compression[16];
	int pickle_protocol;
	tw_msg **msgs; /* received, held */
	size_t nmsgs, cap;
	int closed, close_err;
	char last_error[256]; /* tw_comm_last_error at close */
};

/* Connect to uri and do the handshake. Returns the error (0 on success)
 * and sets *out either way (free it with du_client_free). */
int du_client_open(struct du_loop *l, const char *uri, struct du_client **out);
/* Write msg (taken; freed on failure). Returns the tw_comm_write code. */
int du_client_write(struct du_client *c, tw_msg *msg);
/* The i-th received message, waiting for it; NULL at the deadline or when
 * the comm ended first. */
tw_msg *du_client_msg(struct du_client *c, size_t i, int ms);
void du_client_free(struct du_client *c);

/* Raw POSIX client for bad peers (ts_raw_connect). */

/* Send n bytes, driving the loop while the socket is full. Returns 0, or
 * -1 when the peer closed first. */
int du_raw_send(struct du_loop *l, int fd, const void *p, size_t n);
/* Drive the loop until one whole stream message arrives on fd; its frames
 * go into *out (a new message). Returns 0, or -1 on EOF or after ms
 * without a byte. */
int du_raw_recv_msg(struct du_loop *l, int fd, tw_msg **out, int ms);
/* Drive the loop until fd sees EOF (or ECONNRESET): returns 1, else 0
 * (data arrived instead, or the deadline passed). */
int du_raw_wait_eof(struct du_loop *l, int fd, int ms);

/* The stream encoding of msg (prelude and frames), malloc'd. */
uint8_t *du_encode(const tw_msg *msg, size_t *len);

#endif
