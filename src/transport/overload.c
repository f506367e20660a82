/* SPDX-License-Identifier: BSD-3-Clause */
/* Past the context's memory limit (tw_context_set_memory_limit_bytes):
 * the comms whose peers take none of their queued bytes are ended, the
 * one with most queued first, until what the context holds is back
 * within the limit. The budgets pause reads and refuse writes, but a
 * comm with an empty queue may always queue one message (so that one
 * peer that stops reading holds up its own comm only), and the receive
 * budget lets one message pass when no bytes come back (so that two
 * contexts that wait for each other's reads go on): peers that send and
 * never read had their replies queued one pass after another (breaker17
 * b17-23: 30 such peers held 968 MiB through 64 + 8 MiB budgets until
 * their TCP timeout, 30 s). Seen from one process they look like peers
 * that wait for its reads; the limit is where a context stops telling
 * them apart, as a proxy's overload manager resets the streams holding
 * the most memory (Envoy's reset_high_memory_stream) rather than let the
 * process be killed. */
#include <stdatomic.h>

#include <taskwire/error.h>

#include "core/context.h"
#include "transport/comm_impl.h"
#include "transport/upper.h"

/* How long a peer may take none of its queued bytes while the context is
 * past its memory limit: 10 looks. A peer that reads at all takes some in
 * that time (the kernel's buffers free as it reads); one paused that long
 * while its process is past its limit is ended like one that never
 * reads. */
#define STALL_MS 1000u

/* How long c's peer has taken none of its queued bytes, seen at this
 * look and the one before (0: nothing queued, or it took some since). */
static uint64_t stood_still(const tw_context *ctx, tw_comm *c, uint64_t now)
{
	uint64_t sent = atomic_load_explicit(&c->stats.bytes_sent, memory_order_relaxed);
	int seen = c->ov_look != 0 && c->ov_look + 1 >= ctx->mem_looks;
	if (c->ended || c->ops->queued(c) == 0) {
		c->ov_look = 0;
		return 0;
	}
	if (!seen || sent != c->ov_sent) {
		c->ov_sent = sent;
		c->ov_still_ms = now;
	}
	c->ov_look = ctx->mem_looks;
	return now - c->ov_still_ms;
}

/* The comm with most bytes queued among those whose peers took none of
 * them for STALL_MS, or NULL. Every comm's look is brought up to date. */
static tw_comm *most_stalled(tw_context *ctx, uint64_t now)
{
	tw_comm *worst = NULL;
	uint64_t most = 0;
	for (struct tw__node *n = ctx->objects.next; n != &ctx->objects; n = n->next) {
		tw_comm *c = tw__node_comm(n);
		uint64_t q;
		if (c == NULL || stood_still(ctx, c, now) < STALL_MS)
			continue;
		if ((q = c->ops->queued(c)) > most) {
			most = q;
			worst = c;
		}
	}
	return worst;
}

static void end_stalled(tw_context *ctx, tw_comm *c, uint64_t now)
{
	tw__comm_seterr(c,
			"ended by the memory limit: its peer took none of the %llu bytes queued "
			"for it in %llu ms while the context held %llu bytes (received and "
			"queued), more than its memory limit of %llu bytes "
			"(tw_context_set_memory_limit_bytes)",
			(unsigned long long)c->ops->queued(c),
			(unsigned long long)(now - c->ov_still_ms),
			(unsigned long long)tw__ctx_held(ctx), (unsigned long long)ctx->mem_limit);
	tw__comm_end(c, TW_ENOMEM);
}

/* A look (every pass interval while the context is past its limit).
 * Ending a comm runs its close callback, which may free comms: the walk
 * starts again after each. An ended comm's queue leaves the budgets at
 * once (tw__comm_end), so held falls with each. */
static void mem_cut(tw_context *ctx)
{
	uint64_t now = tw__mono_ms();
	tw_comm *c;
	while ((c = most_stalled(ctx, now)) != NULL && tw__ctx_held(ctx) > ctx->mem_limit)
		end_stalled(ctx, c, now);
}

void tw__overload_attach(tw_context *ctx)
{
	ctx->mem_cut = mem_cut;
}
