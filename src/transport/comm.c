/* SPDX-License-Identifier: BSD-3-Clause */
/* The public comm and listener API, dispatched to the transports
 * (include/taskwire/comm.h). */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/sockios.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <time.h>

#include <event2/event.h>

#include <taskwire/error.h>

#include "transport/comm_budget.h"
#include "transport/comm_impl.h"
#include "transport/relay.h"
#include "transport/stream_comm.h"
#include "transport/transport.h"

/* Free what every comm has, then the transport's part. */
void tw__comm_watch(tw_comm *c, struct tw__watch *w)
{
	w->next = c->watchers;
	w->pprev = &c->watchers;
	if (c->watchers != NULL)
		c->watchers->pprev = &w->next;
	c->watchers = w;
}

void tw__comm_unwatch(struct tw__watch *w)
{
	if (w->pprev == NULL)
		return;
	*w->pprev = w->next;
	if (w->next != NULL)
		w->next->pprev = w->pprev;
	w->next = NULL;
	w->pprev = NULL;
}

void tw__comm_relayed(tw_comm *c)
{
	for (struct tw__watch *w = c->watchers, *next; w != NULL; w = next) {
		next = w->next; /* w may unwatch itself */
		if (w->relayed != NULL)
			w->relayed(w);
	}
}

struct tw_comm_watch {
	struct tw_comm_watch *next, **pprev;
	tw_comm *comm;
	tw_comm_ended_fn fn;
	void *arg;
};

static void unlink_end_watch(tw_comm_watch *w)
{
	*w->pprev = w->next;
	if (w->next != NULL)
		w->next->pprev = w->pprev;
	else
		w->comm->end_tail = w->pprev;
}

static void set_callbacks(tw_comm *c, tw_recv_cb recv_cb, tw_close_cb close_cb,
			  tw_drain_cb drain_cb, void *arg)
{
	c->recv_cb = recv_cb;
	c->close_cb = close_cb;
	c->drain_cb = drain_cb;
	c->arg = arg;
}

/* The owner no longer hears from c: its callbacks are cleared and the
 * upper layer is told, so nothing runs for an owner that freed c. */
static void owner_detach(tw_comm *c)
{
	set_callbacks(c, NULL, NULL, NULL, NULL);
	if (c->up_ops != NULL && c->up_ops->owner_gone != NULL)
		c->up_ops->owner_gone(c, c->up);
}

/* Let go of the context's budgets: an ended comm holds nothing (its
 * write queue left the write budget when it stopped). */
static void leave_budgets(tw_comm *c)
{
	tw__budget_release(&c->ctx->rbudget, &c->rx_claim);
}

static void destroy_comm(tw_comm *c)
{
	leave_budgets(c);
	while (c->end_watches != NULL) { /* context teardown: never run */
		tw_comm_watch *w = c->end_watches;
		unlink_end_watch(w);
		free(w);
	}
	tw__event_free(c->end_ev);
	while (c->watchers != NULL) {
		struct tw__watch *w = c->watchers;
		tw__comm_unwatch(w);
		w->gone(w);
	}
	tw__event_free(c->timeout_ev);
	tw__event_free(c->deadline_ev);
	tw__comm_set_upper(c, NULL, NULL);
	c->ops->destroy(c);
}

static void kill_comm(struct tw__node *n)
{
	tw_comm *c = (tw_comm *)((char *)n - offsetof(tw_comm, node));
	c->ended = 1;
	c->ops->stop(c);
	destroy_comm(c);
}

void tw__connect_cancel(tw_context *ctx, void *arg)
{
	struct tw__node *head = &ctx->objects;
	for (struct tw__node *n = head->next; n != head && arg != NULL; n = n->next) {
		tw_comm *c;
		if (n->connect_arg != arg)
			continue;
		/* one stage at a time holds a connect: the first is the one */
		if ((c = tw__node_comm(n)) != NULL) {
			n->connect_arg = NULL;
			tw_comm_free(c); /* a ws upgrade: the comm is not handed out yet */
		} else {
			tw__ctx_untrack(n);
			n->kill(n);
		}
		return;
	}
}

void tw__comm_connected(tw_comm *c, uint64_t deadline_ms)
{
	uint64_t now = tw__mono_ms(), left = deadline_ms > now ? deadline_ms - now : 0;
	/* 1 at least: 0 means "not from a connect" (a deadline_ms of 0: no
	 * connect timeout); a comm handed out at its deadline gets 1 ms, as
	 * Dask's wait_for(read, time_left() == 0) gives up at once */
	if (deadline_ms != 0 && left == 0)
		left = 1;
	c->connect_left_ms = left > UINT32_MAX ? UINT32_MAX : (uint32_t)left;
}

uint32_t tw__comm_connect_left_ms(const tw_comm *c)
{
	return c->connect_left_ms;
}

uint32_t tw__stage_ms(uint64_t deadline_ms, uint32_t own_ms, int *by_connect)
{
	uint64_t now = tw__mono_ms(), left = deadline_ms > now ? deadline_ms - now : 0;
	*by_connect = deadline_ms != 0 && left < own_ms;
	return *by_connect ? (uint32_t)left : own_ms;
}

tw_comm *tw__node_comm(struct tw__node *n)
{
	return n->kill == kill_comm ? (tw_comm *)((char *)n - offsetof(tw_comm, node)) : NULL;
}

/* The step ahead: as many bytes as the message has received so far,
 * within [TW__RX_MIN_STEP_BYTES, TW__RX_STEP_BYTES], and no more than
 * are still to come. A fixed 4 MiB step let 20 peers that declared 1 GiB
 * and sent 2 KB/s hold 80 MiB of a 64 MiB budget for a few KB received,
 * and an honest 16 MiB message waited for ever (breaker b1, session 12);
 * now a slow peer holds about what it sent, and a fast one doubles its
 * step each time it uses it up, reaching 4 MiB after 4 MiB. */
static uint64_t rx_step(uint64_t got, uint64_t left)
{
	uint64_t step = got < TW__RX_MIN_STEP_BYTES ? TW__RX_MIN_STEP_BYTES
			: got > TW__RX_STEP_BYTES   ? TW__RX_STEP_BYTES
						    : got;
	return left < step ? left : step;
}

int tw__comm_rx_budget(tw_comm *c, uint64_t got, uint64_t left, uint64_t rest, size_t *len)
{
	uint64_t held = c->rx_claim.held;
	tw__budget_moved(&c->ctx->rbudget, &c->rx_claim, got);
	if (held <= got) {
		uint64_t step = rx_step(got, left);
		if (step == 0)
			return 0;
		if (tw__budget_reserve(&c->ctx->rbudget, &c->rx_claim, step, rest) != 0)
			return TW_EAGAIN;
		held = c->rx_claim.held;
	}
	if (*len > held - got)
		*len = (size_t)(held - got);
	return 0;
}

void tw__comm_rx_release(tw_comm *c)
{
	tw__budget_release(&c->ctx->rbudget, &c->rx_claim);
}

void tw__comm_wq_add(tw_comm *c, uint64_t n)
{
	tw__ctx_write_queued(c->ctx, n);
}

void tw__comm_wq_sub(tw_comm *c, uint64_t n)
{
	tw__ctx_write_gone(c->ctx, n);
}

void tw__comm_wq_hold(tw_comm *c, uint64_t n)
{
	tw__ctx_write_held(c->ctx, n);
}

void tw__comm_wq_unhold(tw_comm *c, uint64_t n)
{
	tw__ctx_write_unheld(c->ctx, n);
}

/* The pause limit changed: tell each comm that watches by it. */
static void pause_limit_set(tw_context *ctx)
{
	for (struct tw__node *n = ctx->objects.next; n != &ctx->objects; n = n->next) {
		tw_comm *c = tw__node_comm(n);
		if (c != NULL && !c->ended && c->ops->pause_limit_set != NULL)
			c->ops->pause_limit_set(c);
	}
}

void tw__comm_init(tw_comm *c, const struct tw__comm_ops *ops, tw_context *ctx)
{
	c->ops = ops;
	c->ctx = ctx;
	c->limits = ctx->limits;
	c->refs = 1; /* the owner's */
	c->end_tail = &c->end_watches;
	tw__ctx_track(ctx, &c->node, kill_comm);
	tw__overload_attach(ctx);
	ctx->pause_limit_set = pause_limit_set;
}

void tw__comm_set_addresses(tw_comm *c, int fd, const char *scheme)
{
	struct sockaddr_storage ss;
	socklen_t sl = sizeof(ss);
	if (getpeername(fd, (struct sockaddr *)&ss, &sl) == 0)
		tw__uri_format_sa(scheme, (struct sockaddr *)&ss, c->peer, sizeof(c->peer));
	sl = sizeof(ss);
	if (getsockname(fd, (struct sockaddr *)&ss, &sl) == 0)
		tw__uri_format_sa(scheme, (struct sockaddr *)&ss, c->local, sizeof(c->local));
}

void tw__comm_set_peer(tw_comm *c, const struct sockaddr *sa, const char *scheme)
{
	if (sa != NULL)
		tw__uri_format_sa(scheme, sa, c->peer, sizeof(c->peer));
}

void tw__comm_seterr(tw_comm *c, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(c->error, sizeof(c->error), fmt, ap);
	va_end(ap);
}

/* After a callback: free now if the application asked for it inside. */
static int after_callback(tw_comm *c)
{
	if (--c->depth == 0 && c->free_pending) {
		tw__ctx_untrack(&c->node);
		destroy_comm(c);
		return 0;
	}
	return !c->ended;
}

void tw__comm_hold(tw_comm *c)
{
	c->depth++;
}

int tw__comm_release(tw_comm *c)
{
	return after_callback(c);
}

int tw__comm_deliver(tw_comm *c, tw_msg *m)
{
	if (c->deadline_ms != 0) /* one clock read; the timer stays as it is */
		c->last_msg_ms = tw__mono_ms();
	c->depth++;
	c->recv_cb(c, m, c->arg);
	return after_callback(c);
}

int tw__comm_call(tw_comm *c, void (*fn)(tw_comm *c, void *arg), void *arg)
{
	c->depth++;
	fn(c, arg);
	return after_callback(c);
}

void tw_comm_pause(tw_comm *c)
{
	c->app_paused = 1;
	if (!c->ended)
		c->ops->pause(c);
}

void tw_comm_resume(tw_comm *c)
{
	if (!c->app_paused)
		return; /* not paused: reading is the upper layer's business */
	c->app_paused = 0;
	if (c->ended || c->recv_cb == NULL)
		return;
	if (c->up_ops != NULL && c->up_ops->resume != NULL)
		c->up_ops->resume(c, c->up);
	else
		c->ops->start(c);
}

int tw__comm_drained(tw_comm *c)
{
	if (c->drain_cb == NULL)
		return !c->ended;
	c->depth++;
	c->drain_cb(c, c->arg);
	return after_callback(c);
}

/* A close that failed says what it did not deliver: queued bytes and
 * bytes the peer's TCP never acknowledged, which the kernel drops as the
 * socket closes after a linger, or is reset (reset_on_end: the memory
 * limit's and the relay stall's ends counted only the queued bytes,
 * up to a send buffer short). */
static void tell_undelivered(tw_comm *c, uint64_t queued)
{
	int kernel = c->linger.on || c->reset_on_end;
	uint64_t lost = queued + (kernel ? tw__unacked_bytes(c->linger.fd, c->linger.fin) : 0);
	size_t len = strlen(c->error);
	if (lost == 0 || c->linger.told || len + 1 >= sizeof(c->error))
		return;
	snprintf(c->error + len, sizeof(c->error) - len, "%s%llu bytes not delivered",
		 len > 0 ? "; " : "", (unsigned long long)lost);
	c->linger.told = 1;
}

/* c ends with err: its timers and I/O stop and it leaves the budgets. */
static void mark_ended(tw_comm *c, int err)
{
	c->ended = 1;
	c->end_err = err;
	if (c->timeout_ev != NULL)
		event_del(c->timeout_ev);
	if (c->deadline_ev != NULL)
		event_del(c->deadline_ev);
	c->ops->stop(c);
	leave_budgets(c);
}

void tw__comm_end(tw_comm *c, int err)
{
	uint64_t queued = c->ops->queued(c);
	if (c->ended)
		return;
	/* Never success with data missing. */
	if (err == 0 && queued > 0)
		err = TW_ECLOSED;
	if (err != 0)
		tell_undelivered(c, queued);
	mark_ended(c, err);
	if (c->close_cb == NULL) {
		tw__comm_end_known(c);
		return;
	}
	c->depth++;
	c->close_cb(c, err, c->arg);
	if (!c->close_owed)
		tw__comm_end_known(c);
	after_callback(c);
}

void tw__comm_fail(tw_comm *c, int err)
{
	if (c->ended)
		return;
	if (c->ops->fail == NULL) {
		tw__comm_end(c, err);
		return;
	}
	c->ops->fail(c, err);
}

int tw__comm_defer_fail(tw_comm *c, int err)
{
	if (c->ended || c->up_ops == NULL || c->up_ops->backlog == NULL ||
	    !c->up_ops->backlog(c, c->up))
		return 0;
	c->fail_deferred = err;
	return 1;
}

void tw__comm_delivered(tw_comm *c)
{
	int err = c->fail_deferred;
	if (err == 0)
		return;
	c->fail_deferred = 0;
	tw__comm_fail(c, err);
}

void tw__comm_end_known(tw_comm *c)
{
	c->close_owed = 0;
	if (c->end_known)
		return;
	c->end_known = 1;
	if (c->end_watches != NULL)
		event_active(c->end_ev, EV_TIMEOUT, 0);
}

/* Drop one reference; the last frees c, at once or when the callback of
 * c that is running returns. */
static void drop_ref(tw_comm *c)
{
	if (--c->refs > 0)
		return;
	if (c->depth > 0) {
		c->free_pending = 1;
		return;
	}
	tw__ctx_untrack(&c->node);
	destroy_comm(c);
}

void tw_comm_hold(tw_comm *c)
{
	c->refs++;
}

void tw_comm_release(tw_comm *c)
{
	if (c != NULL)
		drop_ref(c);
}

/* The end watches, outside any other call: each holds a reference, so c
 * stays valid in fn; one more is held across the loop, since fn may
 * release others or unwatch the rest. */
static void run_end_watches(evutil_socket_t fd, short what, void *arg)
{
	tw_comm *c = arg;
	tw_comm_watch *w;
	(void)fd;
	(void)what;
	c->refs++;
	while ((w = c->end_watches) != NULL) {
		unlink_end_watch(w);
		w->pprev = NULL; /* running: tw_comm_unwatch(w) in fn does nothing */
		w->fn(c, c->end_err, w->arg);
		free(w);
		drop_ref(c);
	}
	drop_ref(c);
}

int tw_comm_watch_end(tw_comm *c, tw_comm_ended_fn fn, void *arg, tw_comm_watch **out)
{
	tw_comm_watch *w;
	if (c == NULL || fn == NULL)
		return TW_EINVAL;
	if (c->end_ev == NULL &&
	    (c->end_ev = event_new(c->ctx->base, -1, 0, run_end_watches, c)) == NULL)
		return TW_ENOMEM;
	if ((w = calloc(1, sizeof(*w))) == NULL)
		return TW_ENOMEM;
	w->comm = c;
	w->fn = fn;
	w->arg = arg;
	w->pprev = c->end_tail;
	*c->end_tail = w;
	c->end_tail = &w->next;
	c->refs++;
	if (c->end_known)
		event_active(c->end_ev, EV_TIMEOUT, 0);
	if (out != NULL)
		*out = w;
	return 0;
}

void tw_comm_unwatch(tw_comm_watch *w)
{
	tw_comm *c;
	if (w == NULL || w->pprev == NULL) /* NULL pprev: its fn is running */
		return;
	c = w->comm;
	unlink_end_watch(w);
	free(w);
	drop_ref(c);
}

int tw__comm_attach(tw_comm *c, tw_recv_cb recv_cb, tw_close_cb close_cb, void *arg)
{
	if (c->ended)
		return TW_ECLOSED;
	set_callbacks(c, recv_cb, close_cb, NULL, arg);
	return c->ops->start(c);
}

void tw__comm_detach(tw_comm *c)
{
	c->recv_cb = NULL;
	c->close_cb = NULL;
	c->drain_cb = NULL;
	c->arg = NULL;
	if (!c->ended)
		c->ops->pause(c);
}

static void on_timeout(evutil_socket_t fd, short what, void *arg)
{
	tw_comm *c = arg;
	(void)fd;
	(void)what;
	tw__comm_seterr(c, "timed out");
	tw__comm_end(c, TW_ETIMEDOUT);
}

/* Liveness (issue 16): the peer owes us a message. */
static void arm_deadline(tw_comm *c, uint64_t ms)
{
	struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)(ms % 1000) * 1000};
	evtimer_add(c->deadline_ev, &tv);
}

static void on_deadline(evutil_socket_t fd, short what, void *arg)
{
	tw_comm *c = arg;
	uint64_t due = c->last_msg_ms + c->deadline_ms, now = tw__mono_ms();
	(void)fd;
	(void)what;
	if (c->ended || c->deadline_ms == 0)
		return;
	if (now < due) { /* a message came meanwhile: sleep for the rest */
		arm_deadline(c, due - now);
		return;
	}
	tw__comm_seterr(c, "no message from %s within %u ms (the receive deadline)",
			c->peer[0] != '\0' ? c->peer : "the peer", (unsigned)c->deadline_ms);
	tw__comm_end(c, TW_ETIMEDOUT);
}

int tw_comm_set_recv_deadline_ms(tw_comm *c, uint32_t ms)
{
	if (c == NULL)
		return TW_EINVAL;
	if (c->ended)
		return TW_ECLOSED;
	if (c->deadline_ev == NULL && ms != 0 &&
	    (c->deadline_ev = evtimer_new(c->ctx->base, on_deadline, c)) == NULL)
		return TW_ENOMEM;
	c->deadline_ms = ms;
	if (ms == 0) {
		if (c->deadline_ev != NULL)
			event_del(c->deadline_ev);
		return 0;
	}
	c->last_msg_ms = tw__mono_ms();
	arm_deadline(c, ms);
	return 0;
}

int tw__comm_arm_timeout(tw_comm *c, uint32_t ms)
{
	struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)(ms % 1000) * 1000};
	if (c->timeout_ev == NULL &&
	    (c->timeout_ev = evtimer_new(c->ctx->base, on_timeout, c)) == NULL)
		return TW_ENOMEM;
	return evtimer_add(c->timeout_ev, &tv) == 0 ? 0 : TW_EIO;
}

void tw__comm_disarm_timeout(tw_comm *c)
{
	if (c->timeout_ev != NULL)
		event_del(c->timeout_ev);
}

/* The minimum receive rate. */

/* Checks closer together than this gain nothing: a peer right at the
 * minimum would otherwise wake us every millisecond. */
#define RATE_MIN_CHECK_MS 100

uint64_t tw__mono_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void rate_arm(tw_comm *c, uint64_t ms)
{
	struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)(ms % 1000) * 1000};
	c->rate.on = evtimer_add(c->rate.ev, &tv) == 0;
}

static uint64_t msgs_received(const tw_comm *c)
{
	return atomic_load_explicit(&c->stats.msgs_received, memory_order_relaxed);
}

static void rate_start(tw_comm *c)
{
	c->rate.start_ms = tw__mono_ms();
	c->rate.bytes = atomic_load_explicit(&c->stats.bytes_received, memory_order_relaxed);
	c->rate.msgs = msgs_received(c);
	rate_arm(c, c->limits.min_rate_grace_ms);
}

/* A comm whose message the receive budget cut (rx_cut, sock_comm.c) has
 * its rate event activated, to end it from the loop: stopped or armed
 * again before that ran, the event lost its activation (libevent's
 * event_del drops it, and evtimer_add a timeout's), and the comm, whose
 * reads the budget refuses from then on, waited for ever, its read event
 * gone (check_wbudget memory_limit_ends_non_readers over wss under
 * valgrind at load: its read was refused by the cut in the same loop
 * turn, and stopped the rate). Both leave it alone then. */
void tw__comm_rate_watch(tw_comm *c, int busy)
{
	if (c->rx_claim.cut)
		return;
	if (!busy)
		tw__comm_rate_stop(c);
	else if (c->limits.min_rate_bytes != 0 && (!c->rate.on || c->rate.msgs != msgs_received(c)))
		rate_start(c); /* a message stalled, or one completed and the next stalled */
}

void tw__comm_rate_stop(tw_comm *c)
{
	if (c->rx_claim.cut && !c->ended)
		return;
	if ((c->rate.on || c->ended) && c->rate.ev != NULL) { /* ended: a cut's notice too */
		event_del(c->rate.ev);
		c->rate.on = 0;
	}
}

/* Milliseconds that `bytes` cover at `rate` bytes/s (no overflow). */
static uint64_t covered_ms(uint64_t bytes, uint64_t rate)
{
	return bytes / rate * 1000 + bytes % rate * 1000 / rate;
}

int tw__comm_rate_due(tw_comm *c, int busy, int fd)
{
	uint64_t rate = c->limits.min_rate_bytes, grace = c->limits.min_rate_grace_ms;
	uint64_t elapsed, got, covered, next;
	int unread = 0;
	c->rate.on = 0;
	if (!busy || rate == 0)
		return 0;
	if (c->rate.msgs != msgs_received(c)) {
		rate_start(c); /* a new message has been arriving since we last read */
		return 0;
	}
	elapsed = tw__mono_ms() - c->rate.start_ms;
	got = atomic_load_explicit(&c->stats.bytes_received, memory_order_relaxed) - c->rate.bytes;
	covered = covered_ms(got, rate);
	/* Bytes that came while our loop was busy elsewhere are the peer's
	 * too: the timer may run before the read that takes them. */
	if (elapsed >= grace && covered < elapsed && ioctl(fd, FIONREAD, &unread) == 0 &&
	    unread > 0) {
		got += (uint64_t)unread;
		covered = covered_ms(got, rate);
	}
	if (elapsed >= grace && covered < elapsed) {
		tw__comm_seterr(c,
				"peer sent %llu bytes in %.1f s while a message was in progress, "
				"below the minimum of %llu bytes/s",
				(unsigned long long)got, (double)elapsed / 1000,
				(unsigned long long)rate);
		return 1;
	}
	/* Next look: when the bytes so far stop covering the time, if no
	 * more come. */
	next = (covered + 1 > grace ? covered + 1 : grace) - elapsed;
	rate_arm(c, next > RATE_MIN_CHECK_MS ? next : RATE_MIN_CHECK_MS);
	return 0;
}

/* The close linger. */

uint64_t tw__unacked_bytes(int fd, int fin_sent)
{
	int n = 0;
	if (fd < 0 || ioctl(fd, SIOCOUTQ, &n) != 0 || n <= 0)
		return 0;
	/* the FIN takes a sequence number, the last one, while unacknowledged */
	return (uint64_t)n - (fin_sent ? 1 : 0);
}

void tw__abort_fd(int fd)
{
	struct linger l = {1, 0};
	setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof(l));
}

static uint64_t linger_tick_ms(const tw_comm *c)
{
	uint64_t ms = c->limits.close_linger_ms;
	if (ms > TW__LINGER_END_MS)
		ms = TW__LINGER_END_MS;
	return ms >= 4 ? ms / 4 : 1;
}

/* All written, waiting for the peer's TCP to acknowledge the rest: look
 * often, so a close that is delivered ends soon after (a delayed ACK
 * takes up to 40 ms on Linux). */
#define LINGER_ACK_POLL_MS 20

static void linger_arm(tw_comm *c, int acks_only)
{
	uint64_t ms = linger_tick_ms(c);
	if (acks_only && ms > LINGER_ACK_POLL_MS)
		ms = LINGER_ACK_POLL_MS;
	struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)(ms % 1000) * 1000};
	evtimer_add(c->linger.ev, &tv);
}

void tw__linger_start(tw_comm *c, int fd)
{
	if (c->linger.on)
		return;
	c->linger.on = 1;
	c->linger.fd = fd;
	c->linger.last_ms = tw__mono_ms();
	c->linger.sent = atomic_load_explicit(&c->stats.bytes_sent, memory_order_relaxed);
	c->linger.unacked = tw__unacked_bytes(fd, 0);
	linger_arm(c, 0);
}

int tw__linger_due(tw_comm *c, uint64_t queued, int end_sent, int peer_done)
{
	uint64_t now = tw__mono_ms(), linger = c->limits.close_linger_ms, idle;
	uint64_t sent = atomic_load_explicit(&c->stats.bytes_sent, memory_order_relaxed);
	uint64_t unacked = tw__unacked_bytes(c->linger.fd, c->linger.fin);
	/* Progress: we wrote more, or the peer's TCP took more of what we
	 * wrote (bytes it acknowledged are in its kernel). */
	if (sent != c->linger.sent || unacked < c->linger.unacked)
		c->linger.last_ms = now;
	c->linger.sent = sent;
	c->linger.unacked = unacked;
	idle = now - c->linger.last_ms;
	if (end_sent && queued == 0 && unacked == 0 &&
	    (peer_done || idle >= (linger < TW__LINGER_END_MS ? linger : TW__LINGER_END_MS)))
		return 1;
	if (idle >= linger) {
		char was[sizeof(c->error)];
		snprintf(was, sizeof(was), "%s", c->error);
		tw__comm_seterr(c,
				"%s%sclose gave up after %llu ms with no progress: %llu bytes not "
				"delivered (%llu queued, %llu unacknowledged by the peer's TCP)",
				was, was[0] != '\0' ? "; " : "", (unsigned long long)idle,
				(unsigned long long)(queued + unacked), (unsigned long long)queued,
				(unsigned long long)unacked);
		c->linger.told = 1;
		return -1;
	}
	linger_arm(c, end_sent && queued == 0 && unacked > 0);
	return 0;
}

void tw__comm_set_upper(tw_comm *c, const struct tw__upper_ops *ops, void *up)
{
	if (c->up_ops != NULL)
		c->up_ops->free(c->up);
	c->up_ops = ops;
	c->up = ops != NULL ? up : NULL;
}

void *tw__comm_upper(const tw_comm *c, const struct tw__upper_ops *ops)
{
	return c->up_ops == ops ? c->up : NULL;
}

int tw__comm_start(tw_comm *c)
{
	return c->ended ? 0 : c->ops->start(c);
}

void tw__comm_pause_reading(tw_comm *c)
{
	if (!c->ended)
		c->ops->pause(c);
}

void tw__comm_set_place(tw_comm *c, tw__place_fn fn, void *arg)
{
	c->ops->set_place(c, fn, arg);
}

unsigned tw__comm_state(const tw_comm *c)
{
	return (c->ended ? TW__COMM_ENDED : 0u) | (c->closing ? TW__COMM_CLOSING : 0u) |
	       (c->owner_gone ? TW__COMM_OWNER_GONE : 0u) |
	       (c->app_paused ? TW__COMM_APP_PAUSED : 0u) |
	       (c->recv_cb != NULL ? TW__COMM_HAS_CALLBACKS : 0u) |
	       (c->relaying ? TW__COMM_RELAYING : 0u);
}

struct tw__limits *tw__comm_limits(tw_comm *c)
{
	return &c->limits;
}

void tw__comm_end_owed(tw_comm *c)
{
	c->close_owed = 1;
}

int tw_comm_set_callbacks(tw_comm *c, tw_recv_cb recv_cb, tw_close_cb close_cb,
			  tw_drain_cb drain_cb, void *arg)
{
	int rv;
	if (c == NULL || recv_cb == NULL || close_cb == NULL || c->recv_cb != NULL)
		return TW_EINVAL;
	if (c->ended)
		return TW_ECLOSED;
	set_callbacks(c, recv_cb, close_cb, drain_cb, arg);
	if ((rv = c->ops->start(c)) != 0) /* a callback that failed never runs */
		set_callbacks(c, NULL, NULL, NULL, NULL);
	return rv;
}

/* What refuses m on c whatever the queues hold (0: nothing). */
static int write_invalid(const tw_comm *c, const tw_msg *m)
{
	if (c == NULL || m == NULL || tw_msg_nframes(m) == 0)
		return TW_EINVAL;
	if (tw_msg_nframes(m) > c->limits.max_frames)
		return TW_ETOOBIG;
	if (c->ended)
		return TW_ECLOSED;
	/* relay frames have no bytes in memory: only a stream comm's writer
	 * (which refuses them over tls) can splice them (transport/relay.h) */
	if (!tw__stream_is(c) && tw__relay_in_msg(m))
		return TW_EINVAL;
	return 0;
}

/* The write budget across comms (core/budget.h): once it is spent, a
 * comm with bytes of its own queued waits for its drain; one with none
 * queued may queue one message, so a peer that stops reading holds up
 * only its own comm. The queue is asked only past the budget. */
static int wbudget_refuse(const tw_comm *c)
{
	return !c->closing && tw__wbudget_spent(&c->ctx->wbudget) && c->ops->queued(c) > 0;
}

int tw__comm_write_unbudgeted(tw_comm *c, tw_msg *m)
{
	int rv = write_invalid(c, m);
	return rv != 0 ? rv : c->ops->write(c, m);
}

int tw_comm_write(tw_comm *c, tw_msg *m)
{
	/* Checked first, so that TW_EAGAIN always means "retry after the
	 * drain": a message the comm can never take is refused at once, not
	 * parked by a caller and refused after the drain. */
	int rv = write_invalid(c, m);
	if (rv != 0)
		return rv;
	if (wbudget_refuse(c))
		return TW_EAGAIN;
	return c->ops->write(c, m);
}

uint64_t tw_comm_queued_bytes(const tw_comm *c)
{
	return c->ops->queued(c);
}

uint64_t tw__comm_queued_held(const tw_comm *c)
{
	return c->ops->queued(c) - c->relay_queued;
}

int tw__comm_rx_pending(const tw_comm *c)
{
	return (c->ops->rx_pending != NULL && c->ops->rx_pending(c)) ||
	       (c->up_ops != NULL && c->up_ops->backlog != NULL && c->up_ops->backlog(c, c->up));
}

void tw__comm_closing(tw_comm *c)
{
	if (!c->closing && !c->ended)
		for (struct tw__watch *w = c->watchers; w != NULL; w = w->next)
			if (w->closing != NULL)
				w->closing(w);
	c->closing = 1;
}

void tw_comm_close(tw_comm *c)
{
	tw__comm_closing(c);
	if (!c->ended)
		c->ops->close(c);
}

void tw_comm_abort(tw_comm *c)
{
	/* An ended comm keeps the reason it ended with. */
	if (c->ended)
		return;
	tw__comm_seterr(c, "aborted by the application");
	tw__comm_end(c, TW_ECANCELED);
}

void tw_comm_free(tw_comm *c)
{
	if (c == NULL || c->owner_gone)
		return;
	c->owner_gone = 1;
	if (!c->ended) {
		if (c->error[0] == '\0')
			tw__comm_seterr(c, "freed by the application");
		mark_ended(c, TW_ECANCELED);
	}
	owner_detach(c);
	tw__comm_end_known(c);
	drop_ref(c);
}

void tw_comm_stats(const tw_comm *c, tw_stats *out, size_t size)
{
	tw__stats_snapshot(&c->stats, out, size);
}

int tw__io_err(int e)
{
	return e == EPROTO ? TW_ETLS : e == ETIMEDOUT ? TW_ETIMEDOUT : TW_EIO;
}

const char *tw_comm_last_error(const tw_comm *c)
{
	return c->error;
}

static int copy_out(const char *s, char *buf, size_t len)
{
	if (buf == NULL || strlen(s) >= len)
		return TW_ERANGE;
	memcpy(buf, s, strlen(s) + 1);
	return 0;
}

tw_context *tw_comm_context(const tw_comm *c)
{
	return c != NULL ? c->ctx : NULL;
}

int tw_comm_peer_address(const tw_comm *c, char *buf, size_t len)
{
	return copy_out(c->peer, buf, len);
}

int tw_comm_local_address(const tw_comm *c, char *buf, size_t len)
{
	return copy_out(c->local, buf, len);
}

static void kill_listener(struct tw__node *n)
{
	tw_listener *l = (tw_listener *)((char *)n - offsetof(tw_listener, node));
	l->destroy(l);
}

void tw__listener_init(tw_listener *l, tw_context *ctx, void (*destroy)(tw_listener *),
		       tw_accept_cb cb, void *arg)
{
	l->ctx = ctx;
	l->destroy = destroy;
	l->accept_cb = cb;
	l->arg = arg;
	tw__ctx_track(ctx, &l->node, kill_listener);
}

int tw_listener_new(tw_context *ctx, const char *uri, tw_accept_cb cb, void *arg, tw_listener **out)
{
	struct tw__uri u;
	const struct tw__transport *t;
	if (ctx == NULL || cb == NULL || out == NULL)
		return TW_EINVAL;
	if (tw__uri_parse(uri, &u) != 0)
		return TW_EADDR;
	if ((t = tw__transport_find(u.scheme)) == NULL)
		return TW_ESCHEME;
	return t->listen(ctx, &u, cb, arg, out);
}

int tw_listener_set_error_cb(tw_listener *l, tw_accept_error_cb cb, void *arg)
{
	if (l == NULL)
		return TW_EINVAL;
	l->error_cb = cb;
	l->error_arg = arg;
	return 0;
}

void tw__listener_failed(tw_listener *l, int err, const char *peer, const char *why)
{
	if (l->error_cb != NULL)
		l->error_cb(l, err, peer, why, l->error_arg);
}

int tw_listener_address(const tw_listener *l, char *buf, size_t len)
{
	return copy_out(l->address, buf, len);
}

void tw_listener_free(tw_listener *l)
{
	if (l == NULL)
		return;
	tw__ctx_untrack(&l->node);
	l->destroy(l);
}

int tw_comm_connect(tw_context *ctx, const char *uri, tw_connect_cb cb, void *arg)
{
	struct tw__uri u;
	const struct tw__transport *t;
	unsigned seq;
	int rv;
	if (ctx == NULL || cb == NULL)
		return TW_EINVAL;
	seq = ctx->error_seq;
	if (tw__uri_parse(uri, &u) != 0)
		rv = TW_EADDR;
	else if ((t = tw__transport_find(u.scheme)) == NULL)
		rv = TW_ESCHEME;
	else
		rv = t->connect(ctx, &u, cb, arg);
	/* refused at once: why, unless the transport said it */
	if (rv != 0 && ctx->error_seq == seq)
		tw__ctx_seterr(ctx, "cannot connect to %s: %s", uri != NULL ? uri : "(null)",
			       tw_strerror(rv));
	return rv;
}

const struct tw__transport *tw__transport_find(const char *scheme)
{
	static const struct tw__transport *const table[] = {&tw__tcp_transport, &tw__tls_transport,
							    &tw__ws_transport, &tw__wss_transport};
	for (size_t i = 0; i < sizeof(table) / sizeof(table[0]); i++)
		if (strcmp(table[i]->scheme, scheme) == 0)
			return table[i];
	return NULL;
}
