/* SPDX-License-Identifier: BSD-3-Clause */
/* Loop threads: one context, n event loops (tw_context_set_loop_threads,
 * docs/design.md "Loop threads"). Each extra loop is a context of its own
 * with its own event_base and thread; everything that crosses loops goes
 * through a loop's call queue (tw__context_post), never a lock held on
 * the hot path. */
#include <pthread.h>
#include <stdlib.h>

#include <taskwire/error.h>

#include "core/context.h"

/* More loops than this is a mistake, not a machine. */
#define MAX_LOOPS 1024

/* The main context's state of extension e, held again for a loop. */
static void *ext_hold(const struct tw__ext *e, unsigned nloops)
{
	return e->ops != NULL && e->ops->hold != NULL ? e->ops->hold(e->state, nloops) : NULL;
}

void tw__loop_conf_take(tw_context *main, struct tw__loop_conf *conf)
{
	conf->limits = main->limits;
	for (unsigned i = 0; i < TW__EXT_SLOTS; i++) {
		const struct tw__ext *e = &main->ext[i];
		int pass = e->ops != NULL && e->ops->per_comm;
		conf->ext[i].ops = pass ? e->ops : NULL;
		conf->ext[i].state = pass ? ext_hold(e, main->nloops) : NULL;
	}
}

static int conf_has(const struct tw__loop_conf *conf, const struct tw__ext_ops *ops)
{
	for (unsigned i = 0; i < TW__EXT_SLOTS; i++)
		if (conf->ext[i].ops == ops)
			return 1;
	return 0;
}

/* A loop's per_comm extensions become the main context's: one the main
 * context dropped (tw_context_set_tls(ctx, NULL)) goes from the loop. */
void tw__loop_conf_apply(tw_context *loop, struct tw__loop_conf *conf)
{
	if (loop->main != NULL) { /* the main loop has them already */
		loop->limits = conf->limits;
		for (unsigned i = 0; i < TW__EXT_SLOTS; i++) {
			const struct tw__ext_ops *ops = loop->ext[i].ops;
			if (ops != NULL && ops->per_comm && !conf_has(conf, ops))
				tw__ctx_set_ext(loop, ops, NULL);
		}
	}
	for (unsigned i = 0; i < TW__EXT_SLOTS; i++) {
		struct tw__ext *e = &conf->ext[i];
		if (e->state != NULL &&
		    (loop->main == NULL || tw__ctx_ext(loop, e->ops) == e->state ||
		     tw__ctx_set_ext(loop, e->ops, e->state) != 0))
			e->ops->release(e->state);
		e->ops = NULL;
		e->state = NULL;
	}
}

tw_context *tw__ctx_next_loop(tw_context *ctx)
{
	if (ctx->nloops <= 1)
		return ctx;
	if (ctx->next_loop >= ctx->nloops)
		ctx->next_loop = 0;
	return ctx->loops[ctx->next_loop++];
}

/* The per-loop share of a budget: the context-wide budgets are split
 * evenly, so that each loop checks its own without a shared counter. */
static uint64_t share(uint64_t total, unsigned n)
{
	uint64_t s = total / n;
	return s > 0 ? s : 1;
}

static int loop_new(tw_context *main, unsigned index, tw_context **out)
{
	tw_context *l;
	int rv;
	unsigned n = main->nloops;
	if ((rv = tw_context_new(NULL, &l)) != 0)
		return rv;
	/* The loop's thread runs already, but reads none of this before the
	 * first call posted to it (the queue's lock orders the writes). */
	l->main = main;
	l->index = index;
	l->limits = main->limits;
	l->max_frames_set = main->max_frames_set;
	for (unsigned i = 0; i < TW__EXT_SLOTS; i++) {
		void *st = ext_hold(&main->ext[i], n);
		if (st != NULL && tw__ctx_set_ext(l, main->ext[i].ops, st) != 0)
			main->ext[i].ops->release(st); /* cannot happen: l has free slots */
	}
	tw__budget_set_limit(&l->rbudget, main->rbudget.limit);
	l->wbudget.limit = main->wbudget.limit;
	l->mem_limit = main->mem_limit;
	*out = l;
	return 0;
}

int tw_context_set_loop_threads(tw_context *ctx, unsigned n)
{
	tw_context **loops;
	uint64_t rlimit, wlimit, mlimit;
	int rv = 0;
	if (ctx == NULL || ctx->main != NULL || ctx->nloops > 1 || n == 0 || n > MAX_LOOPS)
		return TW_EINVAL;
	if (ctx->objects.next != &ctx->objects)
		return TW_EINVAL; /* comms or listeners exist: they would stay on loop 0 */
	if (n == 1)
		return 0;
	if ((loops = calloc(n, sizeof(*loops))) == NULL)
		return TW_ENOMEM;
	loops[0] = ctx;
	ctx->loops = loops;
	ctx->nloops = n;
	rlimit = ctx->rbudget.limit;
	wlimit = ctx->wbudget.limit;
	mlimit = ctx->mem_limit;
	tw__budget_set_limit(&ctx->rbudget, share(rlimit, n));
	ctx->wbudget.limit = share(wlimit, n);
	ctx->mem_limit = share(mlimit, n);
	for (unsigned i = 1; i < n && rv == 0; i++)
		rv = loop_new(ctx, i, &loops[i]);
	if (rv != 0) {
		tw__loops_free(ctx);
		tw__budget_set_limit(&ctx->rbudget, rlimit);
		ctx->wbudget.limit = wlimit;
		ctx->mem_limit = mlimit;
	}
	return rv;
}

unsigned tw_context_loop_count(const tw_context *ctx)
{
	if (ctx == NULL)
		return 0;
	if (ctx->main != NULL)
		ctx = ctx->main;
	return ctx->nloops > 1 ? ctx->nloops : 1;
}

tw_context *tw_context_loop(tw_context *ctx, unsigned i)
{
	if (ctx == NULL)
		return NULL;
	if (ctx->main != NULL)
		ctx = ctx->main;
	if (i == 0)
		return ctx;
	return i < ctx->nloops ? ctx->loops[i] : NULL;
}

unsigned tw_context_loop_index(const tw_context *ctx)
{
	return ctx != NULL ? ctx->index : 0;
}

void tw__loops_free(tw_context *ctx)
{
	for (unsigned i = 1; i < ctx->nloops; i++)
		if (ctx->loops[i] != NULL)
			tw__ctx_free(ctx->loops[i]);
	free(ctx->loops);
	ctx->loops = NULL;
	ctx->nloops = 0;
}

struct run_wait {
	struct tw__call call;
	void (*fn)(void *arg);
	void *arg;
	pthread_mutex_t lock;
	pthread_cond_t cv;
	int done;
};

static void run_wait_run(void *arg)
{
	struct run_wait *w = arg;
	w->fn(w->arg);
	pthread_mutex_lock(&w->lock);
	w->done = 1;
	pthread_cond_signal(&w->cv);
	pthread_mutex_unlock(&w->lock);
}

void tw__ctx_run_wait(tw_context *loop, void (*fn)(void *arg), void *arg)
{
	struct run_wait w = {.fn = fn, .arg = arg};
	if (!loop->has_thread || pthread_equal(loop->thread, pthread_self())) {
		fn(arg);
		return;
	}
	pthread_mutex_init(&w.lock, NULL);
	pthread_cond_init(&w.cv, NULL);
	w.call.fn = run_wait_run;
	w.call.arg = &w;
	w.call.owned = 0;
	tw__context_post(loop, &w.call);
	pthread_mutex_lock(&w.lock);
	while (!w.done)
		pthread_cond_wait(&w.cv, &w.lock);
	pthread_mutex_unlock(&w.lock);
	pthread_cond_destroy(&w.cv);
	pthread_mutex_destroy(&w.lock);
}
