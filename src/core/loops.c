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

static void conf_copy_tls(tw_context *to, void *tls, void *(*hold)(void *), void (*release)(void *))
{
	if (to->tls == tls)
		return;
	if (to->tls_release != NULL)
		to->tls_release(to->tls);
	to->tls = tls != NULL ? hold(tls) : NULL;
	to->tls_hold = tls != NULL ? hold : NULL;
	to->tls_release = tls != NULL ? release : NULL;
}

void tw__loop_conf_take(tw_context *main, struct tw__loop_conf *conf)
{
	conf->limits = main->limits;
	conf->tls = main->tls != NULL ? main->tls_hold(main->tls) : NULL;
	conf->tls_hold = main->tls_hold;
	conf->tls_release = main->tls_release;
}

void tw__loop_conf_apply(tw_context *loop, struct tw__loop_conf *conf)
{
	if (loop->main == NULL) /* the main loop has them already */
		goto out;
	loop->limits = conf->limits;
	conf_copy_tls(loop, conf->tls, conf->tls_hold, conf->tls_release);
out:
	if (conf->tls != NULL)
		conf->tls_release(conf->tls);
	conf->tls = NULL;
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
	conf_copy_tls(l, main->tls, main->tls_hold, main->tls_release);
	l->offload_threads = main->offload_threads / n > 0 ? main->offload_threads / n : 1;
	l->offload_threshold = main->offload_threshold;
	tw__budget_set_limit(&l->rbudget, main->rbudget.limit);
	l->wbudget.limit = main->wbudget.limit;
	*out = l;
	return 0;
}

int tw_context_set_loop_threads(tw_context *ctx, unsigned n)
{
	tw_context **loops;
	uint64_t rlimit, wlimit;
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
	tw__budget_set_limit(&ctx->rbudget, share(rlimit, n));
	ctx->wbudget.limit = share(wlimit, n);
	for (unsigned i = 1; i < n && rv == 0; i++)
		rv = loop_new(ctx, i, &loops[i]);
	if (rv != 0) {
		tw__loops_free(ctx);
		tw__budget_set_limit(&ctx->rbudget, rlimit);
		ctx->wbudget.limit = wlimit;
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
