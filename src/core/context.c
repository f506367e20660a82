/* SPDX-License-Identifier: BSD-3-Clause */
/* Contexts: limits, the event loop, cross-thread calls
 * (include/taskwire/context.h). */
#include <assert.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <event2/event.h>
#include <event2/thread.h>

#include <taskwire/error.h>

#include "core/block.h"
#include "core/context.h"
#include "core/reap.h"
#include "core/reclaim.h"

static pthread_once_t threads_once = PTHREAD_ONCE_INIT;
static int threads_rv;

static void threads_init(void)
{
	threads_rv = evthread_use_pthreads();
}

/* Run the queued calls; on the loop thread. */
static void run_calls(evutil_socket_t fd, short what, void *arg)
{
	tw_context *ctx = arg;
	struct tw__call *c;
	uint64_t n;
	(void)what;
	if (fd >= 0 && read(fd, &n, sizeof(n)) < 0)
		(void)0; /* EAGAIN: another wakeup already drained it */
	pthread_mutex_lock(&ctx->lock);
	c = ctx->calls;
	ctx->calls = NULL;
	ctx->calls_tail = &ctx->calls;
	pthread_mutex_unlock(&ctx->lock);
	while (c != NULL) {
		struct tw__call *next = c->next;
		int owned = c->owned;
		c->fn(c->arg);
		if (owned)
			free(c);
		c = next;
	}
}

/* Comms wait for the receive budget while the reclaimer still holds
 * bytes it counts: look again in a millisecond (rbudget.later). */
static void rbudget_due(evutil_socket_t fd, short what, void *arg)
{
	tw_context *ctx = arg;
	(void)fd;
	(void)what;
	tw__budget_admit(&ctx->rbudget);
}

static void rbudget_later(struct tw__budget *b)
{
	tw_context *ctx = (tw_context *)(void *)((char *)b - offsetof(tw_context, rbudget));
	struct timeval ms = {0, 1000};
	if (!event_pending(ctx->rbudget_ev, EV_TIMEOUT, NULL))
		event_add(ctx->rbudget_ev, &ms);
}

/* Comms wait for the receive budget: if no bytes came back (none
 * written, none unmapped, no grant or release, no step for the passer)
 * for PASS_MS, the writes' peers may be waiting for our reads, so one
 * message may pass, or the pass may go from a passer that stopped moving
 * to a message nearer to done (tw__budget_pass); else look again. Not
 * sooner: while bytes come back, waiting for them keeps the budget. */
#define PASS_MS TW__BUDGET_PASS_MS

static void pass_arm(tw_context *ctx)
{
	struct timeval tv = {0, PASS_MS * 1000};
	ctx->pass_progress = ctx->rbudget.progress;
	ctx->pass_written = ctx->written;
	ctx->rbudget.epoch++; /* holders' moves count from here (nearer_holder) */
	ctx->pass_pending = tw__reclaim_pending();
	event_add(ctx->pass_ev, &tv);
}

/* Past the memory limit: look every pass interval, while it lasts, at the
 * comms' queues (ctx->mem_cut: a comm whose peer took none of its bytes
 * for a while is ended, the one with most queued first). */
static void mem_watch(tw_context *ctx)
{
	struct timeval tv = {0, PASS_MS * 1000};
	if (tw__ctx_held(ctx) > ctx->mem_limit && !event_pending(ctx->mem_ev, EV_TIMEOUT, NULL))
		event_add(ctx->mem_ev, &tv);
}

static void mem_due(evutil_socket_t fd, short what, void *arg)
{
	tw_context *ctx = arg;
	(void)fd;
	(void)what;
	ctx->mem_looks++;
	if (ctx->mem_cut != NULL)
		ctx->mem_cut(ctx);
	mem_watch(ctx);
}

uint64_t tw__ctx_held(const tw_context *ctx)
{
	return ctx->rbudget.used + ctx->wq_held;
}

static void pass_due(evutil_socket_t fd, short what, void *arg)
{
	tw_context *ctx = arg;
	struct tw__budget *b = &ctx->rbudget;
	(void)fd;
	(void)what;
	if (!b->tight)
		return;
	mem_watch(ctx); /* reservations grow too */
	/* Bytes written count as coming back only when a holder's step's
	 * worth went out in the interval: a cluster's heartbeats (a small
	 * message every 50 ms) made every interval look moving, so no holder
	 * was ever seen slow, no hoarder cut, and the waiters waited for ever
	 * (breaker15 b15-2, session 15). */
	if (b->progress != ctx->pass_progress ||
	    ctx->written - ctx->pass_written >= TW__BUDGET_MOVING_BYTES ||
	    tw__reclaim_pending() < ctx->pass_pending) {
		tw__budget_look(b);
		if (b->tight)
			pass_arm(ctx);
		return;
	}
	tw__budget_pass(b);
}

static void rbudget_stuck(struct tw__budget *b)
{
	tw_context *ctx = (tw_context *)(void *)((char *)b - offsetof(tw_context, rbudget));
	if (!event_pending(ctx->pass_ev, EV_TIMEOUT, NULL))
		pass_arm(ctx);
}

static _Thread_local tw_context *current;

tw_context *tw__ctx_current(void)
{
	return current;
}

static void *loop_main(void *arg)
{
	tw_context *ctx = arg;
	current = ctx;
	event_base_loop(ctx->base, EVLOOP_NO_EXIT_ON_EMPTY);
	return NULL;
}

void tw__limits_init(struct tw__limits *l)
{
	l->max_message_bytes = TW_DEFAULT_MAX_MESSAGE_BYTES;
	l->max_frames = TW_DEFAULT_MAX_FRAMES;
	l->connect_timeout_ms = TW_DEFAULT_CONNECT_TIMEOUT_MS;
	l->tcp_timeout_ms = TW_DEFAULT_TCP_TIMEOUT_MS;
	l->close_linger_ms = TW_DEFAULT_CLOSE_LINGER_MS;
	l->write_hwm_bytes = TW_DEFAULT_WRITE_HWM_BYTES;
	l->small_frame_bytes = TW_DEFAULT_SMALL_FRAME_BYTES;
	l->handshake_timeout_ms = TW_DEFAULT_HANDSHAKE_TIMEOUT_MS;
	l->tls_handshake_timeout_ms = TW_DEFAULT_TLS_HANDSHAKE_TIMEOUT_MS;
	l->ws_shard_bytes = TW_DEFAULT_WS_SHARD_BYTES;
	l->ws_max_fragments = TW_DEFAULT_WS_MAX_FRAGMENTS;
	l->ws_min_ping_interval_ms = TW_DEFAULT_WS_MIN_PING_INTERVAL_MS;
	l->ws_ping_strikes = TW_DEFAULT_WS_PING_STRIKES;
	l->min_rate_bytes = TW_DEFAULT_MIN_RECEIVE_RATE;
	l->min_rate_grace_ms = TW_DEFAULT_MIN_RECEIVE_GRACE_MS;
	l->budget_pause_ms = TW_DEFAULT_RECEIVE_BUDGET_PAUSE_MS;
	l->compression = NULL;
	l->relay_min_bytes = 0;
}

void tw__event_free(struct event *ev)
{
	if (ev != NULL)
		event_free(ev);
}

/* What tw_context_new makes, freed: the end of tw__ctx_free, and of a
 * tw_context_new that failed part way (what it did not make is NULL, or
 * -1 for wake_fd). */
static void release(tw_context *ctx)
{
	tw__block_cache_unwatch(&ctx->rbudget.room);
	tw__event_free(ctx->reap_ev);
	tw__event_free(ctx->pass_ev);
	tw__event_free(ctx->mem_ev);
	tw__event_free(ctx->rbudget_ev);
	tw__event_free(ctx->call_ev);
	if (ctx->wake_fd >= 0)
		close(ctx->wake_fd);
	if (ctx->own_base && ctx->base != NULL)
		event_base_free(ctx->base);
	pthread_mutex_destroy(&ctx->lock);
	free(ctx);
}

/* Callbacks a pass of the loop runs before it polls again. libevent runs
 * an event activated during a pass (a comm reading on from what it read
 * ahead, a write resumed) in that same pass; with peers that keep every
 * comm fed, a pass without this bound never ends, and nothing that needs
 * the poll runs: timers (handshake and call deadlines), the call queue
 * (accepted comms of other loops, offload results), new sockets. A pass
 * of 64 callbacks still serves a busy loop's comms in turn; the poll
 * after it takes a syscall (epoll_wait with no wait). */
#define TW__PASS_CALLBACKS 64

static struct event_base *own_base_new(void)
{
	struct event_config *cfg = event_config_new();
	struct event_base *b = NULL;

	if (cfg == NULL)
		return NULL;
	/* no time bound: libevent would refresh its cached time after every
	 * callback, and the cached time is what tells passes apart (pass.h) */
	if (event_config_set_max_dispatch_interval(cfg, NULL, TW__PASS_CALLBACKS, 0) == 0)
		b = event_base_new_with_config(cfg);
	event_config_free(cfg);
	return b;
}

int tw_context_new(struct event_base *base, tw_context **out)
{
	tw_context *ctx;
	uint64_t budget;
	if (out == NULL)
		return TW_EINVAL;
	pthread_once(&threads_once, threads_init);
	if (threads_rv != 0)
		return TW_EIO;
	if ((ctx = calloc(1, sizeof(*ctx))) == NULL)
		return TW_ENOMEM;
	ctx->wake_fd = -1;
	pthread_mutex_init(&ctx->lock, NULL);
	ctx->calls_tail = &ctx->calls;
	ctx->objects.next = ctx->objects.prev = &ctx->objects;
	tw__limits_init(&ctx->limits);
	budget = tw__budget_default_bytes(); /* reads the cgroup files: once */
	tw__budget_init(&ctx->rbudget, budget);
	tw__wbudget_init(&ctx->wbudget, budget);
	ctx->rbudget.also = &ctx->wq_held;
	ctx->rbudget.pause_ms = &ctx->limits.budget_pause_ms;
	ctx->rbudget.now_ms = tw__budget_mono_ms;
	ctx->mem_limit = 3 * budget; /* each budget a quarter of the memory */
	ctx->rbudget.hard = &ctx->mem_limit;
	ctx->rbudget.later = rbudget_later;
	ctx->rbudget.stuck = rbudget_stuck;
	tw__block_cache_watch(&ctx->rbudget.room);
	ctx->own_base = base == NULL;
	ctx->base = base != NULL ? base : own_base_new();
	if (ctx->base == NULL)
		goto fail;
	/* Other threads wake the loop through an eventfd that the loop
	 * watches like any socket, so this works on a base made before
	 * libevent's locking was on (an application's own base), where
	 * event_active from another thread would be a data race. */
	ctx->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (ctx->wake_fd < 0)
		goto fail;
	ctx->call_ev = event_new(ctx->base, ctx->wake_fd, EV_READ | EV_PERSIST, run_calls, ctx);
	if (ctx->call_ev == NULL || event_add(ctx->call_ev, NULL) != 0)
		goto fail;
	if ((ctx->rbudget_ev = event_new(ctx->base, -1, 0, rbudget_due, ctx)) == NULL ||
	    (ctx->pass_ev = event_new(ctx->base, -1, 0, pass_due, ctx)) == NULL ||
	    (ctx->mem_ev = event_new(ctx->base, -1, 0, mem_due, ctx)) == NULL)
		goto fail;
	if (ctx->own_base) {
		if (pthread_create(&ctx->thread, NULL, loop_main, ctx) != 0)
			goto fail;
		ctx->has_thread = 1;
	}
	*out = ctx;
	return 0;
fail:
	release(ctx);
	return TW_EIO;
}

void tw__context_post(tw_context *ctx, struct tw__call *c)
{
	c->next = NULL;
	uint64_t one = 1;
	int first;
	pthread_mutex_lock(&ctx->lock);
	first = ctx->calls == NULL;
	*ctx->calls_tail = c;
	ctx->calls_tail = &c->next;
	pthread_mutex_unlock(&ctx->lock);
	if (first && write(ctx->wake_fd, &one, sizeof(one)) < 0)
		(void)0; /* the counter is already non-zero: a wakeup is pending */
}

int tw_context_call(tw_context *ctx, void (*fn)(void *arg), void *arg)
{
	struct tw__call *c = malloc(sizeof(*c));
	if (c == NULL)
		return TW_ENOMEM;
	c->fn = fn;
	c->arg = arg;
	c->owned = 1;
	tw__context_post(ctx, c);
	return 0;
}

/* Abort every comm and listener; on the loop thread (or with no loop). */
static void kill_all(void *arg)
{
	tw_context *ctx = arg;
	/* Extensions first stop taking work (the offload pool's workers):
	 * tearing the comms down may release whatever a running job waits
	 * for, and the jobs still queued then must be canceled, not run. */
	for (unsigned i = 0; i < TW__EXT_SLOTS; i++)
		if (ctx->ext[i].ops != NULL && ctx->ext[i].ops->stop != NULL)
			ctx->ext[i].ops->stop(ctx->ext[i].state);
	while (ctx->objects.next != &ctx->objects) {
		struct tw__node *n = ctx->objects.next;
		tw__ctx_untrack(n);
		n->kill(n);
	}
}

static void exit_loop(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	event_base_loopexit(arg, NULL);
}

/* The loop runs one more pass after the kill: callbacks that libevent
 * defers to it (evdns reporting the lookups canceled just now) still run,
 * and free what they hold. */
static void stop_loop(void *arg)
{
	static const struct timeval now = {0, 0};
	tw_context *ctx = arg;
	kill_all(ctx);
	if (event_base_once(ctx->base, -1, EV_TIMEOUT, exit_loop, ctx->base, &now) != 0)
		event_base_loopbreak(ctx->base);
}

void tw_context_free(tw_context *ctx)
{
	if (ctx == NULL || ctx->main != NULL) /* a loop goes with its main context */
		return;
	tw__ctx_free(ctx);
}

void tw__ctx_free(tw_context *ctx)
{
	if (ctx->has_thread) {
		if (tw_context_call(ctx, stop_loop, ctx) != 0)
			abort(); /* cannot stop the loop thread safely without memory */
		pthread_join(ctx->thread, NULL);
	}
	kill_all(ctx); /* connects first: they cancel their lookups */
	/* the comms' sockets and TLS left to later passes, all at once */
	tw__reap_all(ctx);
	/* then the other loops: what the kill posted to them (a listener's
	 * stand-ins) runs before they stop */
	tw__loops_free(ctx);
	/* the extensions, last set first; jobs an offload pool cancels or
	 * finishes post their results, which run_calls runs */
	for (unsigned i = TW__EXT_SLOTS; i-- > 0;)
		if (ctx->ext[i].ops != NULL)
			tw__ctx_set_ext(ctx, ctx->ext[i].ops, NULL);
	run_calls(-1, 0, ctx);
	release(ctx);
}

void *tw__ctx_ext(const tw_context *ctx, const struct tw__ext_ops *ops)
{
	for (unsigned i = 0; i < TW__EXT_SLOTS; i++)
		if (ctx->ext[i].ops == ops)
			return ctx->ext[i].state;
	return NULL;
}

int tw__ctx_set_ext(tw_context *ctx, const struct tw__ext_ops *ops, void *state)
{
	struct tw__ext *free_slot = NULL;
	for (unsigned i = 0; i < TW__EXT_SLOTS; i++) {
		struct tw__ext *e = &ctx->ext[i];
		if (e->ops == ops) {
			void *old = e->state;
			if (old == state)
				return 0;
			if (state == NULL)
				e->ops = NULL;
			e->state = state;
			ops->release(old);
			return 0;
		}
		if (e->ops == NULL && free_slot == NULL)
			free_slot = e;
	}
	if (state == NULL)
		return 0;
	assert(free_slot != NULL);
	if (free_slot == NULL)
		return TW_ENOMEM;
	free_slot->ops = ops;
	free_slot->state = state;
	return 0;
}

struct event_base *tw_context_base(tw_context *ctx)
{
	return ctx->base;
}

void tw__ctx_track(tw_context *ctx, struct tw__node *n, void (*kill)(struct tw__node *))
{
	n->kill = kill;
	n->connect_arg = NULL;
	n->next = ctx->objects.next;
	n->prev = &ctx->objects;
	ctx->objects.next->prev = n;
	ctx->objects.next = n;
}

void tw__ctx_untrack(struct tw__node *n)
{
	if (n->next == NULL)
		return;
	n->prev->next = n->next;
	n->next->prev = n->prev;
	n->next = n->prev = NULL;
}

int tw_context_set_max_message_bytes(tw_context *ctx, uint64_t bytes)
{
	if (ctx == NULL || bytes == 0)
		return TW_EINVAL;
	ctx->limits.max_message_bytes = bytes;
	if (!ctx->max_frames_set) /* the frame bound follows the byte limit */
		ctx->limits.max_frames = TW_MAX_FRAMES_FOR(bytes);
	return 0;
}

int tw_context_set_max_frames(tw_context *ctx, uint64_t frames)
{
	if (ctx == NULL || frames == 0)
		return TW_EINVAL;
	ctx->limits.max_frames = frames;
	ctx->max_frames_set = 1;
	return 0;
}

int tw_context_set_connect_timeout_ms(tw_context *ctx, uint32_t ms)
{
	return TW__SET_LIMIT(ctx, connect_timeout_ms, ms, ms > 0);
}

int tw_context_set_tcp_timeout_ms(tw_context *ctx, uint32_t ms)
{
	/* TCP_USER_TIMEOUT is an int */
	return TW__SET_LIMIT(ctx, tcp_timeout_ms, ms, ms <= INT32_MAX);
}

int tw_context_set_close_linger_ms(tw_context *ctx, uint32_t ms)
{
	return TW__SET_LIMIT(ctx, close_linger_ms, ms, ms > 0);
}

int tw_context_set_write_hwm_bytes(tw_context *ctx, size_t bytes)
{
	return TW__SET_LIMIT(ctx, write_hwm_bytes, bytes, bytes > 0);
}

/* Budgets apply at once, to every comm: a larger one lets waiting
 * comms go on now. */
int tw_context_set_receive_budget_bytes(tw_context *ctx, uint64_t bytes)
{
	if (ctx == NULL || bytes == 0)
		return TW_EINVAL;
	tw__budget_set_limit(&ctx->rbudget, bytes);
	return 0;
}

/* Read by the budget and the memory limit at each look (rbudget.pause_ms;
 * they look every pass interval). The relay stall watches look every
 * eighth of the limit: they look again now, so that a lowered limit
 * applies at once, not at a look scheduled under the old one (breaker20:
 * 20,000 -> 1,000 ms ended a stalled destination 3.5 s later). */
int tw_context_set_receive_budget_pause_ms(tw_context *ctx, uint32_t ms)
{
	int rv = TW__SET_LIMIT(ctx, budget_pause_ms, ms, 1);
	if (rv == 0 && ctx->pause_limit_set != NULL)
		ctx->pause_limit_set(ctx);
	return rv;
}

int tw_context_set_write_budget_bytes(tw_context *ctx, uint64_t bytes)
{
	if (ctx == NULL || bytes == 0)
		return TW_EINVAL;
	ctx->wbudget.limit = bytes; /* refused comms hear it with their drain */
	return 0;
}

void tw__ctx_write_gone(tw_context *ctx, uint64_t n)
{
	ctx->written += n; /* bytes going out: their memory comes back (pass_due) */
	tw__wbudget_sub(&ctx->wbudget, n);
}

/* The write queues count in the receive budget (rbudget.also): the
 * cache gives way to them, and waiters may go on once they are written.
 * On the path of every message written: cheap while nobody waits. */
void tw__ctx_write_held(tw_context *ctx, uint64_t n)
{
	ctx->wq_held += n;
	tw__budget_also_grew(&ctx->rbudget);
	mem_watch(ctx);
}

void tw__ctx_write_unheld(tw_context *ctx, uint64_t n)
{
	ctx->wq_held -= n;
	tw__budget_also_fell(&ctx->rbudget);
}

/* A budget's limit and use, each where the caller asked for it. */
static int budget_out(uint64_t lim, uint64_t use, uint64_t *limit, uint64_t *used)
{
	if (limit != NULL)
		*limit = lim;
	if (used != NULL)
		*used = use;
	return 0;
}

int tw_context_receive_budget_bytes(const tw_context *ctx, uint64_t *limit, uint64_t *used)
{
	if (ctx == NULL)
		return TW_EINVAL;
	return budget_out(ctx->rbudget.limit, ctx->rbudget.used, limit, used);
}

int tw_context_write_budget_bytes(const tw_context *ctx, uint64_t *limit, uint64_t *used)
{
	if (ctx == NULL)
		return TW_EINVAL;
	return budget_out(ctx->wbudget.limit, ctx->wbudget.used, limit, used);
}

/* A lower limit starts the looks now (mem_watch); a higher one lets a
 * pass start now. */
int tw_context_set_memory_limit_bytes(tw_context *ctx, uint64_t bytes)
{
	if (ctx == NULL || bytes == 0)
		return TW_EINVAL;
	ctx->mem_limit = bytes;
	mem_watch(ctx);
	tw__budget_admit(&ctx->rbudget);
	return 0;
}

int tw_context_memory_limit_bytes(const tw_context *ctx, uint64_t *limit, uint64_t *held)
{
	if (ctx == NULL)
		return TW_EINVAL;
	return budget_out(ctx->mem_limit, tw__ctx_held(ctx), limit, held);
}

int tw_context_set_small_frame_bytes(tw_context *ctx, size_t bytes)
{
	return TW__SET_LIMIT(ctx, small_frame_bytes, bytes,
			     bytes > 0 && bytes <= TW__MAP_MIN_BYTES);
}

void tw__ctx_seterr(tw_context *ctx, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(ctx->error, sizeof(ctx->error), fmt, ap);
	va_end(ap);
	ctx->error_seq++;
}

const char *tw_context_last_error(const tw_context *ctx)
{
	return ctx->error;
}

int tw_context_set_ws_shard_bytes(tw_context *ctx, size_t bytes)
{
	return TW__SET_LIMIT(ctx, ws_shard_bytes, bytes, bytes > 0);
}

int tw_context_set_ws_max_fragments(tw_context *ctx, uint64_t fragments)
{
	return TW__SET_LIMIT(ctx, ws_max_fragments, fragments, fragments > 0);
}

/* 0 is allowed in both: it turns the ping-rate policy off. */
int tw_context_set_ws_min_ping_interval_ms(tw_context *ctx, uint32_t ms)
{
	return TW__SET_LIMIT(ctx, ws_min_ping_interval_ms, ms, 1);
}

int tw_context_set_ws_ping_strikes(tw_context *ctx, uint32_t strikes)
{
	return TW__SET_LIMIT(ctx, ws_ping_strikes, strikes, 1);
}

/* 0 bytes/s turns the check off; a zero grace period with it on would
 * cut every message that does not arrive in one read. */
int tw_context_set_min_receive_rate(tw_context *ctx, uint32_t bytes_per_sec, uint32_t grace_ms)
{
	if (ctx == NULL || (bytes_per_sec != 0 && grace_ms == 0))
		return TW_EINVAL;
	ctx->limits.min_rate_bytes = bytes_per_sec;
	ctx->limits.min_rate_grace_ms = grace_ms;
	return 0;
}
