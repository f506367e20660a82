/* SPDX-License-Identifier: BSD-3-Clause */
/* The socket shell under the stream and WebSocket comms (sock_comm.h). */
#include <errno.h>
#include <linux/tcp.h> /* tcpi_bytes_acked: glibc's struct tcp_info stops before it */
#include <netinet/in.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <event2/event.h>

#include <taskwire/error.h>

#include "core/context.h"
#include "core/msg.h"
#include "core/pass.h"
#include "core/reap.h"
#include "transport/comm_budget.h"
#include "transport/sock_comm.h"

void *tw__sockq_tail(struct tw__sockq *q)
{
	if (q->n == q->cap) {
		size_t cap = q->cap ? 2 * q->cap : 8;
		char *ring = malloc(cap * q->esize);
		if (ring == NULL)
			return NULL;
		/* unrolled, so the ring starts at 0 again */
		for (size_t i = 0; i < q->n; i++)
			memcpy(ring + i * q->esize, tw__sockq_at(q, i), q->esize);
		free(q->ring);
		q->ring = ring;
		q->cap = cap;
		q->head = 0;
	}
	return q->ring + ((q->head + q->n) % q->cap) * q->esize;
}

/* One callback for the shell's three events; `what` says which fired: the
 * read event's EV_READ, the write event's EV_WRITE (also when activated
 * by hand), the timer's EV_TIMEOUT. */
static void on_event(evutil_socket_t fd, short what, void *arg)
{
	struct tw__sock *s = arg;
	(void)fd;
	if (s->park.pprev != NULL) { /* stopped: its release waits (sock_park) */
		event_del(s->rev);
		event_del(s->wev);
		return;
	}
	if (what & EV_READ)
		s->hooks->readable(s);
	else if (what & EV_WRITE)
		s->hooks->writable(s);
	else
		s->hooks->timer(s);
}

/* The clock of the minimum receive rate runs only while a message is
 * partly received and we read: time we do not read is ours. */
static void on_rate_timer(evutil_socket_t fd, short what, void *arg)
{
	struct tw__sock *s = arg;
	int busy = s->reading && s->hooks->open(s) && s->hooks->rx_busy(s);
	(void)fd;
	(void)what;
	if (s->base.rx_claim.cut) { /* rx_cut: its message ends the comm */
		if (s->hooks->open(s))
			s->hooks->too_slow(s);
		return;
	}
	if (tw__comm_rate_due(&s->base, busy, s->fd))
		s->hooks->too_slow(s);
}

/* The receive budget cut this comm's message (core/budget.c): it
 * dripped too slowly to finish within the pause limit, or stood still
 * for it, while the bytes past the budget were too many (cut_hoarders);
 * or its peer sent nothing for the pause limit while other messages
 * waited (cut_still). End the comm from the loop (this runs inside the
 * budget), as for a peer below the minimum receive rate, with the reason. */
static void rx_cut(struct tw__claim *claim)
{
	struct tw__sock *s =
		(struct tw__sock *)(void *)((char *)claim - offsetof(tw_comm, rx_claim));
	const struct tw__budget *b = &s->base.ctx->rbudget;
	if (claim->cut == TW__BUDGET_CUT_STILL)
		tw__comm_seterr(&s->base,
				"message cut by the receive budget: its peer sent %llu bytes of "
				"the message, then nothing for the pause limit of %u ms "
				"(tw_context_set_receive_budget_pause_ms), while other messages "
				"waited for the budget of %llu bytes",
				(unsigned long long)claim->got, s->base.ctx->limits.budget_pause_ms,
				(unsigned long long)b->limit);
	else
		tw__comm_seterr(&s->base,
				"message cut by the receive budget: its peer sent %llu bytes of "
				"the message, then too little to finish it within the pause limit "
				"(tw_context_set_receive_budget_pause_ms), while more than %llu "
				"bytes were reserved past the budget of %llu bytes",
				(unsigned long long)claim->got,
				(unsigned long long)tw__budget_past_bytes(b),
				(unsigned long long)b->limit);
	event_active(s->base.rate.ev, EV_TIMEOUT, 0);
}

/* Bytes waiting in the socket (the receive budget's look at a waiter:
 * its peer sent them, the budget holds them). */
static uint64_t rx_ready(const struct tw__claim *claim)
{
	const struct tw__sock *s =
		(const struct tw__sock *)(const void *)((const char *)claim -
							offsetof(tw_comm, rx_claim));
	int n = 0;
	/* a TLS record already read holds bytes the socket's count does not
	 * show: at least one is unread (else a waiter with its last record
	 * there looked stood still, core/budget.c stood_still) */
	uint64_t more = tw__sock_io_pending(s) ? 1 : 0;
	if (s->fd < 0 || ioctl(s->fd, FIONREAD, &n) != 0 || n < 0)
		return more;
	return (uint64_t)n + more;
}

/* The receive budget has room for the next bytes: read on, from the loop
 * (this runs inside another comm's release, so it must not read here). */
static void rx_granted(struct tw__claim *claim)
{
	struct tw__sock *s =
		(struct tw__sock *)(void *)((char *)claim - offsetof(tw_comm, rx_claim));
	if (!s->reading || !s->hooks->open(s))
		return;
	tw__comm_rate_watch(&s->base, 1);
	if (!event_pending(s->rev, EV_READ, NULL))
		event_add(s->rev, NULL);
	tw__sock_read_again(s);
}

static void free_events(struct tw__sock *s)
{
	tw__event_free(s->rev);
	tw__event_free(s->wev);
	tw__event_free(s->timer);
	tw__event_free(s->base.rate.ev);
}

int tw__sock_init(struct tw__sock *s, const struct tw__comm_ops *ops,
		  const struct tw__sock_hooks *hooks, tw_context *ctx, int fd, const char *scheme,
		  const struct tw__stream_io *io, void *io_arg, size_t esize)
{
	s->rev = event_new(ctx->base, fd, EV_READ | EV_PERSIST, on_event, s);
	s->wev = event_new(ctx->base, fd, EV_WRITE | EV_PERSIST, on_event, s);
	s->timer = evtimer_new(ctx->base, on_event, s);
	s->base.rate.ev = evtimer_new(ctx->base, on_rate_timer, s);
	if (s->rev == NULL || s->wev == NULL || s->timer == NULL || s->base.rate.ev == NULL) {
		free_events(s);
		return TW_ENOMEM;
	}
	s->hooks = hooks;
	s->fd = fd;
	s->base.linger.fd = fd; /* a reset end counts its unacknowledged bytes too */
	s->io = io;
	s->io_arg = io_arg;
	s->q.esize = esize;
	tw__comm_init(&s->base, ops, ctx);
	s->base.linger.ev = s->timer;
	s->base.rx_claim.granted = rx_granted;
	s->base.rx_claim.cut_off = rx_cut;
	s->base.rx_claim.ready = rx_ready;
	tw__comm_set_addresses(&s->base, fd, scheme);
	return 0;
}

uint64_t tw__sock_acked(const tw_comm *c)
{
	const struct tw__sock *s = (const struct tw__sock *)c;
	struct tcp_info ti;
	socklen_t len = sizeof(ti);
	memset(&ti, 0, sizeof(ti));
	if (s->fd < 0 || getsockopt(s->fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0)
		return 0;
	if (len < offsetof(struct tcp_info, tcpi_bytes_acked) + sizeof(ti.tcpi_bytes_acked))
		/* a kernel before 4.1: what we wrote is the nearest count */
		return atomic_load_explicit(&s->base.stats.bytes_sent, memory_order_relaxed);
	return ti.tcpi_bytes_acked;
}

uint64_t tw__sock_queued(const tw_comm *c)
{
	return ((const struct tw__sock *)c)->queued_bytes;
}

void tw__sock_pause(tw_comm *c)
{
	((struct tw__sock *)c)->reading = 0;
	tw__comm_rate_stop(c);
}

/* The socket and its I/O layer (TLS), released on a later pass when
 * this one has no time left (core/reap.h): SSL_free and close(2) were
 * most of a comm's end. The events' removal waits with them: a read
 * event's event_del is an epoll_ctl (1.5-2 us), which was half of
 * tw_comm_free's time when 2,000 comms were freed in one callback
 * (3.1-4.5 ms of 6-12 ms, bench/handshake-storm --close free). So
 * is the memory of a comm destroyed meanwhile (destroy_owed), and the
 * close frame of a failing ws comm (parting), written just before. */
static void release_now(struct tw__sock *s, int fd)
{
	if (s->parting_len > 0) {
		struct iovec iov = {(void *)s->parting, s->parting_len};
		(void)s->io->writev(s->io_arg, fd, &iov, 1); /* then it closes */
		s->parting_len = 0;
	}
	if (s->io->free != NULL)
		s->io->free(s->io_arg);
	close(fd);
}

static void sock_free(struct tw__sock *s)
{
	free_events(s);
	free(s->q.ring);
	if (s->hooks->fini != NULL)
		s->hooks->fini(s);
	free(s);
}

static void release_parked(struct tw__reap *r)
{
	struct tw__sock *s =
		(struct tw__sock *)(void *)((char *)r - offsetof(struct tw__sock, park));
	event_del(s->rev);
	event_del(s->wev);
	release_now(s, s->park_fd);
	s->park_fd = -1;
	if (s->destroy_owed)
		sock_free(s);
}

/* 1 when s's events, socket and I/O layer wait in the queue, 0 when the
 * caller releases them now. */
static int sock_park(struct tw__sock *s)
{
	if (tw__reap_now(s->base.ctx))
		return 0;
	s->park.fn = release_parked;
	s->park_fd = s->fd;
	return tw__reap_later(s->base.ctx, &s->park) == 0;
}

/* Stop the socket now; no callback runs after (a parked comm's events
 * that fire meanwhile only turn themselves off: on_event). The queue and
 * what was received are dropped at once, not when the comm is freed; the
 * events, socket and TLS are released now or, when the loop's pass has
 * no time left, on a later one (sock_park). */
void tw__sock_stop(tw_comm *c)
{
	struct tw__sock *s = (struct tw__sock *)c;
	int parked;
	if (s->fd < 0)
		return;
	if (c->reset_on_end)
		tw__abort_fd(s->fd); /* the close below, now or parked, resets */
	if (!(parked = sock_park(s))) {
		event_del(s->rev);
		event_del(s->wev);
	}
	event_del(s->timer);
	tw__comm_rate_stop(c);
	for (size_t i = 0; i < s->q.n; i++)
		s->hooks->drop(s, tw__sockq_at(&s->q, i));
	s->q.n = 0;
	tw__comm_wq_sub(c, s->queued_bytes - c->relay_queued);
	s->queued_bytes = 0; /* tw_comm_queued_bytes: nothing is queued any more */
	c->relay_queued = 0;
	c->relay_wait = 0;
	s->hooks->stopped(s);
	if (!parked)
		release_now(s, s->fd);
	s->fd = -1;
}

void tw__sock_destroy(tw_comm *c)
{
	struct tw__sock *s = (struct tw__sock *)c;
	tw__sock_stop(c);
	if (s->park.pprev != NULL) /* release_parked frees it */
		s->destroy_owed = 1;
	else
		sock_free(s);
}

/* A running relay (stream comms) is not a next message (its rx_busy says
 * no); whether the comm takes a call meanwhile is TW__COMM_RELAYING's. */
int tw__sock_rx_pending(const tw_comm *c)
{
	const struct tw__sock *s = (const struct tw__sock *)c;
	return s->hooks->rx_busy(s) || tw__sock_io_pending(s);
}

const char *tw__sock_io_error(const struct tw__sock *s)
{
	const char *e = s->io->error != NULL ? s->io->error(s->io_arg) : NULL;
	return e != NULL ? e : strerror(errno);
}

int tw__sock_io_pending(const struct tw__sock *s)
{
	return s->io->pending != NULL && s->io->pending(s->io_arg);
}

int tw__sock_io_more(const struct tw__sock *s)
{
	return tw__sock_io_pending(s) || (s->io->end_held != NULL && s->io->end_held(s->io_arg));
}

int tw__sock_write_held(const struct tw__sock *s)
{
	return s->io->write_held != NULL && s->io->write_held(s->io_arg);
}

ssize_t tw__sock_read1(struct tw__sock *s, void *p, size_t n)
{
	struct iovec iov = {p, n};
	return s->io->readv(s->io_arg, s->fd, &iov, 1);
}

ssize_t tw__sock_write1(struct tw__sock *s, const void *p, size_t n)
{
	struct iovec iov = {(void *)p, n};
	return s->io->writev(s->io_arg, s->fd, &iov, 1);
}

ssize_t tw__sock_send(struct tw__sock *s, struct iovec *iov, int k, size_t budget)
{
	if (!tw__sock_write_held(s))
		k = tw__iov_cap(iov, k, tw__pass_call(budget));
	return s->io->writev(s->io_arg, s->fd, iov, k);
}

void tw__sock_sent(struct tw__sock *s, uint64_t n)
{
	TW__COUNT(&s->base.stats, bytes_sent, n);
	s->queued_bytes -= n;
	tw__comm_wq_sub(&s->base, n);
}

void tw__sock_relayed(struct tw__sock *s, uint64_t n)
{
	TW__COUNT(&s->base.stats, bytes_sent, n);
	s->queued_bytes -= n;
	s->base.relay_queued -= n;
}

void tw__sock_queue_add(struct tw__sock *s, tw_msg *m, uint64_t wire, uint64_t relayed)
{
	s->queued_bytes += wire;
	s->base.relay_queued += relayed;
	tw__comm_wq_add(&s->base, wire - relayed);
	tw__comm_wq_hold(&s->base, tw_msg_bytes(m) - relayed);
}

void tw__sock_msg_gone(struct tw__sock *s, tw_msg *m, uint64_t relayed)
{
	uint64_t mb = tw_msg_bytes(m) - relayed;
	tw_msg_free(m);
	tw__comm_wq_unhold(&s->base, mb);
}

void tw__sock_kick_write(struct tw__sock *s)
{
	if (!event_pending(s->wev, EV_WRITE, NULL))
		event_active(s->wev, EV_WRITE, 0);
}

void tw__sock_read_again(struct tw__sock *s)
{
	event_active(s->rev, EV_READ, 0);
}

void tw__sock_ran_dry(struct tw__sock *s)
{
	tw__comm_rate_watch(&s->base, s->hooks->open(s) && s->hooks->rx_busy(s));
}

void tw__sock_yield(struct tw__sock *s)
{
	tw__sock_ran_dry(s);
}

void tw__sock_rx_wait(struct tw__sock *s)
{
	tw__comm_rate_stop(&s->base);
	event_del(s->rev);
}

int tw__sock_drain(struct tw__sock *s)
{
	char sink[16384];
	ssize_t n;
	int e;
	while ((n = tw__sock_read1(s, sink, sizeof(sink))) > 0)
		;
	e = errno;
	if (n < 0 && (e == EAGAIN || e == EWOULDBLOCK || e == EINTR))
		return 0;
	event_del(s->rev);
	/* a reset with bytes of ours still on the way: they are lost */
	if (n < 0 && (s->queued_bytes > 0 || tw__unacked_bytes(s->fd, s->base.linger.fin) > 0)) {
		errno = e;
		return -1;
	}
	return 1;
}

int tw__sock_linger(struct tw__sock *s, int end_sent, int peer_done)
{
	int r = tw__linger_due(&s->base, s->queued_bytes, end_sent, peer_done);
	if (r < 0)
		tw__abort_fd(s->fd);
	return r;
}
