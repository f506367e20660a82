/* SPDX-License-Identifier: BSD-3-Clause */
/* The minimum receive rate (tw_context_set_min_receive_rate; docs/design.md,
 * Slow peers): a comm's clock while a message is partly received. comm.c
 * runs it; the transport owns the timer and says when its socket ran dry. */
#ifndef TW_TRANSPORT_RATE_H
#define TW_TRANSPORT_RATE_H

#include <stdint.h>

#include <taskwire/comm.h>

struct event;

/* The clock of the minimum receive rate (tw_context_set_min_receive_rate).
 * The transport makes the timer `ev` with its comm (its callback calls
 * tw__comm_rate_due) and frees it; comm.c runs the clock. */
struct tw__rate {
	struct event *ev;
	int on;            /* the clock runs and ev is armed */
	uint64_t start_ms; /* when it started (CLOCK_MONOTONIC) */
	uint64_t bytes;    /* stats.bytes_received then */
	uint64_t msgs;     /* stats.msgs_received then: a message since is a new one */
};

/* The minimum receive rate. A transport calls tw__comm_rate_watch when
 * its socket ran dry (a read would block) and when reading resumes, with
 * busy = a message is partly received: the clock starts for a message
 * that has none (bytes and time are counted from now), and stops when no
 * message is in progress. Cheap when idle with the clock stopped, which
 * is what small messages that arrive whole leave behind. */
void tw__comm_rate_watch(tw_comm *c, int busy);
/* Stop the clock: we stop reading (pause, close, stop). */
void tw__comm_rate_stop(tw_comm *c);
/* The timer fired; busy as above. Returns 0 when the peer keeps up (the
 * timer is armed for the next check, or the clock stopped), or 1 when it
 * is too slow: the error text is set, and the transport ends the comm
 * with TW_ETIMEDOUT. Bytes unread in fd's socket count as received. */
int tw__comm_rate_due(tw_comm *c, int busy, int fd);

#endif
