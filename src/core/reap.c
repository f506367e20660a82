/* SPDX-License-Identifier: BSD-3-Clause */
#include "core/reap.h"

#include <event2/event.h>

#include "core/context.h"
#include "core/pass.h"

/* When a queued item runs: the next pass of the loop. */
static const struct timeval next_pass = {0, TW__PASS_NEXT_US};

int tw__reap_now(tw_context *ctx)
{
	return tw__pass_release(ctx->base);
}

void tw__reap_cancel(tw_context *ctx, struct tw__reap *r)
{
	if (r->pprev == NULL)
		return;
	*r->pprev = r->next;
	if (r->next != NULL)
		r->next->pprev = r->pprev;
	else
		ctx->reap_tail = r->pprev;
	r->next = NULL, r->pprev = NULL;
	if (ctx->reap_head == NULL) /* nothing left for the timer */
		evtimer_del(ctx->reap_ev);
}

static void run_one(tw_context *ctx)
{
	struct tw__reap *r = ctx->reap_head;
	tw__reap_cancel(ctx, r);
	r->fn(r);
}

/* A pass's share of the queue: while it has time, and one at least
 * (counted as the pass's). */
static void reap_pass(evutil_socket_t fd, short what, void *arg)
{
	tw_context *ctx = arg;
	(void)fd, (void)what;
	/* Cancelled since the timer was armed (a closing comm whose end
	 * waited stopped first: tw-mini-scheduler dereferenced NULL here in
	 * CI): nothing to run. */
	if (ctx->reap_head == NULL)
		return;
	(void)tw__pass_release(ctx->base);
	do
		run_one(ctx);
	while (ctx->reap_head != NULL && tw__pass_release(ctx->base));
	if (ctx->reap_head != NULL)
		evtimer_add(ctx->reap_ev, &next_pass);
}

int tw__reap_later(tw_context *ctx, struct tw__reap *r)
{
	if (ctx->reap_ev == NULL && (ctx->reap_ev = evtimer_new(ctx->base, reap_pass, ctx)) == NULL)
		return TW_ENOMEM;
	if (ctx->reap_tail == NULL)
		ctx->reap_tail = &ctx->reap_head;
	r->next = NULL;
	r->pprev = ctx->reap_tail;
	*ctx->reap_tail = r;
	ctx->reap_tail = &r->next;
	if (!evtimer_pending(ctx->reap_ev, NULL))
		evtimer_add(ctx->reap_ev, &next_pass);
	return 0;
}

int tw__reap_defer(tw_context *ctx, struct tw__reap *r, void (*fn)(struct tw__reap *r))
{
	if (r->pprev != NULL)
		return 1;
	if (tw__reap_now(ctx))
		return 0;
	r->fn = fn;
	return tw__reap_later(ctx, r) == 0;
}

void tw__reap_all(tw_context *ctx)
{
	while (ctx->reap_head != NULL)
		run_one(ctx);
	if (ctx->reap_ev != NULL)
		evtimer_del(ctx->reap_ev);
}
