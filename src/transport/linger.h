/* SPDX-License-Identifier: BSD-3-Clause */
/* The close linger (tw_context_set_close_linger_ms; docs/design.md, Close):
 * how long a closing comm waits for its bytes to reach the peer's TCP, and
 * for the peer's end. comm.c keeps the books; the transport owns the timer
 * and tells what was sent and received. */
#ifndef TW_TRANSPORT_LINGER_H
#define TW_TRANSPORT_LINGER_H

#include <stdint.h>

#include <taskwire/comm.h>

struct event;

/* The close linger (tw_context_set_close_linger_ms): while a comm closes
 * (tw_comm_close, a peer's half-close, a failure whose replies still go
 * out), how long bytes may stand still before the close gives up. The
 * transport makes the timer `ev` with its comm (its callback calls
 * tw__linger_due) and frees it; comm.c keeps the books. */
struct tw__linger {
	struct event *ev;
	int on;           /* a close is under way: tw__linger_start ran */
	int fd;           /* the socket, for SIOCOUTQ (set with the socket) */
	int told;         /* the error text already says what was not delivered */
	int fin;          /* our FIN was sent (shutdown) */
	uint64_t last_ms; /* bytes last moved (CLOCK_MONOTONIC) */
	uint64_t sent;    /* stats.bytes_sent at the last look */
	uint64_t unacked; /* the kernel's unacknowledged bytes at the last look */
};

/* The close linger. tw__linger_start: a close began on socket fd; arms
 * the timer (idempotent). tw__linger_due, from the timer or when the
 * peer's end arrives: `queued` bytes are still ours to write (linger.fin
 * says our FIN is in the kernel: its sequence number is not a byte),
 * `end_sent` that our end (FIN, close_notify or close frame) went out,
 * `peer_done` that the peer's end arrived. Returns 1 when everything was
 * delivered (our end sent, nothing queued, the kernel's send queue
 * acknowledged by the peer's TCP) and the peer's end came or the wait for
 * it is over (the linger, at most TW__LINGER_END_MS): end the comm with
 * its close error; -1 when no byte moved for the linger: the error text
 * says how many bytes were not delivered, and the transport aborts
 * (tw__abort_fd) and ends the comm; 0 to wait (the timer is re-armed). */
#define TW__LINGER_END_MS 2000
void tw__linger_start(tw_comm *c, int fd);
int tw__linger_due(tw_comm *c, uint64_t queued, int end_sent, int peer_done);
/* Bytes in fd's send queue that the peer's TCP has not acknowledged
 * (SIOCOUTQ), our FIN excluded when fin_sent; 0 when unknown. */
uint64_t tw__unacked_bytes(int fd, int fin_sent);
/* Make close(fd) reset the connection (SO_LINGER 0): a close that gave
 * up leaves nothing for the kernel to retry. */
void tw__abort_fd(int fd);

#endif
