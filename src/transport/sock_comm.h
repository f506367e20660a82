/* SPDX-License-Identifier: BSD-3-Clause */
/* The socket shell every socket comm stands on: the stream comm (tcp, tls:
 * stream_comm.c) and the WebSocket comm (ws, wss: ws_*.c). It holds the
 * connected socket and its byte I/O (plain or TLS, a tw__stream_io), the
 * read, write and timer events, the out queue and what it counts, and the
 * comm operations that are the same for both (queued, pause, stop,
 * destroy, rx_pending). The framing above it (preludes, WebSocket frames)
 * stays in its comm, which tells the shell what it needs through a hook
 * table (nng's pipe/stream split is the model: one socket, one framing).
 * Everything here runs on the comm's loop thread. */
#ifndef TW_TRANSPORT_SOCK_COMM_H
#define TW_TRANSPORT_SOCK_COMM_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

#include "core/reap.h"
#include "transport/comm_impl.h"
#include "transport/stream_io.h"

struct event;
struct tw__sock;

/* A ring of queued messages, of entries of `esize` bytes each (the comm's
 * own entry type). Entries move when it grows: they must not point into
 * themselves. */
struct tw__sockq {
	char *ring; /* cap entries */
	size_t esize, head, n, cap;
};

/* Entry i from the head (i < n). */
static inline void *tw__sockq_at(const struct tw__sockq *q, size_t i)
{
	return q->ring + ((q->head + i) % q->cap) * q->esize;
}

/* The entry at the tail, growing the ring when it is full; not queued
 * until tw__sockq_commit (a write may still fail). NULL: out of memory. */
void *tw__sockq_tail(struct tw__sockq *q);

static inline void tw__sockq_commit(struct tw__sockq *q)
{
	q->n++;
}

/* The head entry is done with (its message freed by the caller). */
static inline void tw__sockq_pop(struct tw__sockq *q)
{
	q->head = (q->head + 1) % q->cap;
	q->n--;
}

/* What the shell asks of the comm above it. */
struct tw__sock_hooks {
	void (*readable)(struct tw__sock *s); /* the read event fired */
	void (*writable)(struct tw__sock *s); /* the write event fired */
	void (*timer)(struct tw__sock *s);    /* the timer fired: the close linger's */
	/* A message is partly received (the minimum receive rate's clock
	 * runs only then; a next message's bytes, for rx_pending). */
	int (*rx_busy)(const struct tw__sock *s);
	/* Input is still delivered: neither closing nor ended. */
	int (*open)(const struct tw__sock *s);
	/* The peer is below the minimum receive rate (the error text says
	 * so): end the comm. */
	void (*too_slow)(struct tw__sock *s);
	/* Stop: a queued entry that will not be written; free its message
	 * (tw__sock_msg_gone) and what the entry owns. */
	void (*drop)(struct tw__sock *s, void *entry);
	/* Stop: drop what was received (a message cut short, reservations),
	 * so an ended comm holds no memory for its peer's bytes. */
	void (*stopped)(struct tw__sock *s);
	/* Destroy: free what the comm owns besides the shell; or NULL. */
	void (*fini)(struct tw__sock *s);
};

struct tw__sock {
	struct tw_comm base;
	const struct tw__sock_hooks *hooks;
	int fd; /* -1 once stopped */
	const struct tw__stream_io *io;
	void *io_arg;
	/* Read and write persist (level-triggered); the timer is the close
	 * linger's (base.linger.ev), and ws times its upgrade with it first. */
	struct event *rev, *wev, *timer;
	int reading; /* deliver messages (paused while no one takes them) */
	struct tw__sockq q;
	uint64_t queued_bytes; /* wire bytes in q not yet written */
	/* Stopped in a pass with no time left: the events' removal, the
	 * socket (park_fd) and the I/O layer's release wait in the context's
	 * queue (core/reap.h; park.pprev is not NULL meanwhile), and so does
	 * the memory once the comm is destroyed (destroy_owed). */
	struct tw__reap park;
	int park_fd;
	int destroy_owed;
	/* Bytes written once, best effort, as the socket is released (now or
	 * parked): a ws comm's close frame when it fails (too slow, bad
	 * input, too many pings: tw__wsc_send_close_now). The write is part
	 * of the release, so it waits with it when the pass has no time
	 * left: 200 wss comms below the minimum receive rate, cut in one
	 * pass, wrote their close frames in it (an SSL_write and a send
	 * each). Points into the comm; parting_len 0: none. */
	const void *parting;
	size_t parting_len;
};

/* Set up the shell of a comm allocated (zeroed) by the caller, whose
 * entries are esize bytes: the events, the comm's common part (tracked by
 * the context from here on) and its addresses as scheme:// URIs. The
 * socket and io are the comm's once this returns 0; on TW_ENOMEM nothing
 * was set up and the caller still owns them. */
int tw__sock_init(struct tw__sock *s, const struct tw__comm_ops *ops,
		  const struct tw__sock_hooks *hooks, tw_context *ctx, int fd, const char *scheme,
		  const struct tw__stream_io *io, void *io_arg, size_t esize);

/* Comm operations shared by every socket comm. */
uint64_t tw__sock_queued(const tw_comm *c);
/* Bytes of the connection's output its peer's TCP acknowledged
 * (tcpi_bytes_acked, Linux 4.1): what the peer took, whatever our own
 * socket buffer lets us write (a send buffer becomes writable again only
 * once half of it is free, so bytes written stand still for seconds
 * while a slow peer reads). 0 once the socket is gone. */
uint64_t tw__sock_acked(const tw_comm *c);
void tw__sock_pause(tw_comm *c);
void tw__sock_stop(tw_comm *c);
void tw__sock_destroy(tw_comm *c);
int tw__sock_rx_pending(const tw_comm *c);

/* The I/O layer's text of its last failure, or strerror(errno). */
const char *tw__sock_io_error(const struct tw__sock *s);
/* 1 when the I/O layer holds message bytes already taken from the
 * socket (TLS records), which the socket's readiness will not show. */
int tw__sock_io_pending(const struct tw__sock *s);
/* ... or those, or an end that came with them (tw__stream_io end_held). */
int tw__sock_io_more(const struct tw__sock *s);
/* 1 when the I/O layer holds bytes of the last write that the next one
 * must repeat unchanged (tw__stream_io write_held). */
int tw__sock_write_held(const struct tw__sock *s);

/* One read or write of one buffer, readv/writev's returns. */
ssize_t tw__sock_read1(struct tw__sock *s, void *p, size_t n);
ssize_t tw__sock_write1(struct tw__sock *s, const void *p, size_t n);
/* Write iov[0..k-1], at most budget bytes (> 0) of it and at most one
 * call's (tw__pass_call), unless the I/O layer holds a record of the
 * last write: its retry must offer at least as many bytes (OpenSSL fails
 * a shorter one with "bad length"). */
ssize_t tw__sock_send(struct tw__sock *s, struct iovec *iov, int k, size_t budget);

/* n bytes went out: counted, and off the queue and the write budget. */
void tw__sock_sent(struct tw__sock *s, uint64_t n);
/* n bytes of a relay frame went out (spliced from their source): counted
 * and off the queue; they were in no budget (base.relay_queued). */
void tw__sock_relayed(struct tw__sock *s, uint64_t n);
/* A message of `wire` bytes entered the queue, `relayed` of them its
 * relay frames' (0 but over tcp): counted for tw_comm_queued_bytes; its
 * bytes in memory (all but its relay frames') for the write budget and
 * the receive budget. */
void tw__sock_queue_add(struct tw__sock *s, tw_msg *m, uint64_t wire, uint64_t relayed);
/* A queued message leaves (written, or dropped): freed, and its memory
 * (all but the `relayed` bytes of its relay frames, as queued) leaves the
 * receive budget's count. */
void tw__sock_msg_gone(struct tw__sock *s, tw_msg *m, uint64_t relayed);

/* Write from the loop, not from inside the caller: activate the write
 * event unless it waits for the socket already. */
void tw__sock_kick_write(struct tw__sock *s);
/* Read from the loop: bytes may wait in memory (TLS, read ahead) where
 * the socket's readiness does not show them. */
void tw__sock_read_again(struct tw__sock *s);
/* The socket ran dry: a message left partly received starts the clock
 * of the minimum receive rate; none in progress stops it. */
void tw__sock_ran_dry(struct tw__sock *s);
/* Reading stops for this pass, the comm's allowance spent (core/pass.h),
 * which leaves the socket's bytes to the next pass: epoll reports it
 * again while it holds any. But the last read may have taken exactly
 * what the allowance left and the socket's last byte (reads end so
 * often under load, when a pass's time is up): then no event comes until
 * the peer sends more, so a message left partly received starts the
 * clock of the minimum receive rate here, as when the socket ran dry. */
void tw__sock_yield(struct tw__sock *s);
/* A large message's next bytes do not fit the receive budget: stop
 * reading (and the rate clock: the wait is ours, not the peer's) until
 * the budget grants them (rx_claim.granted reads on). */
void tw__sock_rx_wait(struct tw__sock *s);

/* Closing: read and drop the peer's bytes, so our close never turns into
 * a reset that could destroy data we sent. Returns 0 to wait for more,
 * 1 when the peer's end came (its EOF, or an error with nothing of ours
 * still on the way: the read event is off), -1 on an error while bytes
 * of ours were queued or unacknowledged (errno says which). */
int tw__sock_drain(struct tw__sock *s);
/* Closing: ask the close linger (tw__linger_due) with what is queued;
 * on -1 (nothing moved for the linger) the socket is set to reset on
 * close (tw__abort_fd). Same returns. */
int tw__sock_linger(struct tw__sock *s, int end_sent, int peer_done);

#endif
