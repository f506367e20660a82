/* SPDX-License-Identifier: BSD-3-Clause */
/* A comm's side of the context's budgets (core/budget.h; docs/design.md,
 * Budgets across comms): what a transport reserves before reading a large
 * message, and what its write queue holds. */
#ifndef TW_TRANSPORT_COMM_BUDGET_H
#define TW_TRANSPORT_COMM_BUDGET_H

#include <stddef.h>
#include <stdint.h>

#include <taskwire/comm.h>

/* The receive budget (tw_context_set_receive_budget_bytes). Before a read
 * of up to *len bytes of a large message on c, of which `got` bytes have
 * arrived and at most `left` are still to come before the reader asks
 * again (the step's cap), and `rest` bytes of the whole message are still
 * to come (the order among waiters; UINT64_MAX when unknown, as over ws
 * before the last frame's last fragment: a rest that is only the current
 * fragment's made a peer that drips fragments for ever look nearest to
 * done, breaker b8): the bytes are reserved a
 * step ahead of what arrived (as many as arrived so far, at least
 * TW__RX_MIN_STEP_BYTES, at most TW__RX_STEP_BYTES), and *len is cut to
 * what is reserved. 0, or TW_EAGAIN: stop reading; c->rx_claim.granted runs (from inside some
 * other comm's release: schedule the read, do not run it) once the step
 * is reserved. tw__comm_rx_release gives back all c holds (a message
 * complete, a comm ending) and drops c from the waiters. */
#define TW__RX_MIN_STEP_BYTES ((uint64_t)64 << 10)
#define TW__RX_STEP_BYTES     ((uint64_t)4 << 20)
int tw__comm_rx_budget(tw_comm *c, uint64_t got, uint64_t left, uint64_t rest, size_t *len);
void tw__comm_rx_release(tw_comm *c);
/* The memory of c's write queue, for the receive budget: a message of
 * n bytes (tw_msg_bytes) entered it (hold), or left it written or
 * dropped, after it was freed (unhold). */
void tw__comm_wq_hold(tw_comm *c, uint64_t n);
void tw__comm_wq_unhold(tw_comm *c, uint64_t n);
/* The write budget (tw_context_set_write_budget_bytes): bytes entering
 * c's write queue, and leaving it (written, or dropped). */
void tw__comm_wq_add(tw_comm *c, uint64_t n);
void tw__comm_wq_sub(tw_comm *c, uint64_t n);

#endif
