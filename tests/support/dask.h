/* SPDX-License-Identifier: BSD-3-Clause */
/* A harness for tests with real Dask peers (tests/check_dask.c) and for
 * decode tests over loopback comms (tests/check_serial.c). Child
 * processes: tests/support/proc.h.
 *
 * The loop is the harness's (struct tu, tests/support/harness.h): one
 * context on an event_base that the test drives itself. Deadlines only
 * bound waits; no test asserts on time. */
#ifndef TW_TESTS_SUPPORT_DASK_H
#define TW_TESTS_SUPPORT_DASK_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <taskwire/taskwire.h>

#include "tests/support/harness.h"
#include "tests/support/proc.h"

/* Hang guards: a wait that sees no progress for this long means the test
 * failed (tu_run_until restarts it whenever comms move bytes). */
#define DU_WAIT_MS 60000

/* A taskwire client comm, after the Dask handshake, that keeps every
 * message it receives. */

struct du_client {
	struct tu *loop;
	tw_comm *comm;
	int done;             /* connect and handshake finished */
	int err;              /* their result */
	char compression[16]; /* negotiated, "" for none */
	char peer_compression[16];
	int pickle_protocol;
	tw_msg **msgs; /* received, held */
	size_t nmsgs, cap;
	int closed, close_err;
	char last_error[512]; /* tw_comm_last_error at close */
};

/* Connect to uri and do the handshake. Returns the error (0 on success)
 * and sets *out either way (free it with du_client_free). */
int du_client_open(struct tu *l, const char *uri, struct du_client **out);
/* Write msg (taken; freed on failure). Returns the tw_comm_write code. */
int du_client_write(struct du_client *c, tw_msg *msg);
/* The i-th received message, waiting for it; NULL at the deadline or when
 * the comm ended first. */
tw_msg *du_client_msg(struct du_client *c, size_t i, int ms);
void du_client_free(struct du_client *c);

/* A taskwire listener that runs the Dask handshake (listener side) on
 * each comm it accepts, at most DU_SRV_MAX_COMMS of them (more are
 * freed), then gives each comm recv and close with arg. */
#define DU_SRV_MAX_COMMS 8
struct du_srv {
	tw_listener *lis;
	char addr[128]; /* its address, a URI */
	tw_comm *comms[DU_SRV_MAX_COMMS];
	size_t ncomms;
	/* comms refused (over the limit, tw_comm_handshake failed), whose
	 * handshake failed or whose callbacks were refused */
	int hs_failures;
	tw_recv_cb recv;
	tw_close_cb close;
	void *arg;
};
/* Listen on uri (a tcp:// URI, port 0 for any) with ctx; s->addr says
 * where. Asserts on failure. */
void du_srv_start(struct du_srv *s, tw_context *ctx, const char *uri, tw_recv_cb recv,
		  tw_close_cb close, void *arg);
/* Free its comms and the listener. */
void du_srv_stop(struct du_srv *s);

/* Raw POSIX client for bad peers (ts_raw_connect; sending: tu_raw_send). */

/* Drive the loop until one whole stream message arrives on fd; its frames
 * go into *out (a new message). Returns 0, or -1 on EOF or after ms
 * without a byte. */
int du_raw_recv_msg(struct tu *l, int fd, tw_msg **out, int ms);
/* Drive the loop until fd sees EOF (or ECONNRESET): returns 1, else 0
 * (data arrived instead, or the deadline passed). */
int du_raw_wait_eof(struct tu *l, int fd, int ms);

/* The stream encoding of msg (prelude and frames), malloc'd. */
uint8_t *du_encode(const tw_msg *msg, size_t *len);

#endif
