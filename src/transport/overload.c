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
 * process be killed. Only comms that hold memory they will not give back
 * soon (hoards) are ended: a queue that drains gives its bytes back. */
#include <taskwire/error.h>

#include "core/context.h"
#include "transport/comm_impl.h"
#include "transport/upper.h"

/* How long a look watches a comm's queue before it may end it: 10 looks.
 * A peer that reads at all takes some in that time: its TCP acknowledges
 * bytes as its reads free its receive buffer (tw__sock_acked; bytes we
 * write stand still until half our send buffer is free). */
#define WATCH_MS 1000u

/* Whether c, looked at now, holds memory it will not give back soon: its
 * peer took none of its queued bytes for WATCH_MS, or, watched for
 * WATCH_MS or more, took them so slowly since the first look that saw
 * them queued that the rest would take longer than the receive budget's
 * pause limit (the receive side's rule for a peer that drips: a peer that
 * reads one byte a second is not stalled, and would hold its queue for
 * ever). The kernel takes some bytes of a queue at once, reader or not:
 * a non-reader is so ended by the first rule, or by the second once its
 * rate falls, never let off. Every look keeps each comm's watch up to
 * date (a queue that empties starts afresh). */
static int hoards(const tw_context *ctx, tw_comm *c, uint64_t now)
{
	uint64_t q = c->ended ? 0 : c->ops->queued(c), took, watched, pause, sent;
	int seen = c->ov_look != 0 && c->ov_look + 1 >= ctx->mem_looks;
	if (q == 0) {
		c->ov_look = 0;
		return 0;
	}
	sent = c->ops->acked(c); /* what the peer took, not what we wrote */
	if (!seen) {
		c->ov_from_sent = sent;
		c->ov_from_ms = now;
	}
	if (!seen || sent != c->ov_sent) {
		c->ov_sent = sent;
		c->ov_still_ms = now;
	}
	c->ov_look = ctx->mem_looks;
	watched = now - c->ov_from_ms;
	if (watched < WATCH_MS)
		return 0;
	if (now - c->ov_still_ms >= WATCH_MS)
		return 1;
	/* q / (took / watched) > pause */
	took = sent - c->ov_from_sent;
	pause = ctx->limits.budget_pause_ms;
	return pause > 0 && (double)q * (double)watched > (double)pause * (double)took;
}

/* The comm with most bytes queued among those that hoard, or NULL. */
static tw_comm *most_hoarding(tw_context *ctx, uint64_t now)
{
	tw_comm *worst = NULL;
	uint64_t most = 0;
	for (struct tw__node *n = ctx->objects.next; n != &ctx->objects; n = n->next) {
		tw_comm *c = tw__node_comm(n);
		uint64_t q;
		if (c == NULL || !hoards(ctx, c, now))
			continue;
		if ((q = c->ops->queued(c)) > most) {
			most = q;
			worst = c;
		}
	}
	return worst;
}

static void end_hoarder(tw_context *ctx, tw_comm *c, uint64_t now)
{
	tw__comm_seterr(c,
			"ended by the memory limit: its peer took %llu of its queued bytes in "
			"%llu ms (none in the last %llu ms), too few to take the %llu still "
			"queued within the pause limit, while the context held %llu bytes "
			"(received and queued), more than its memory limit of %llu bytes "
			"(tw_context_set_memory_limit_bytes)",
			(unsigned long long)(c->ov_sent - c->ov_from_sent),
			(unsigned long long)(now - c->ov_from_ms),
			(unsigned long long)(now - c->ov_still_ms),
			(unsigned long long)c->ops->queued(c),
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
	while ((c = most_hoarding(ctx, now)) != NULL && tw__ctx_held(ctx) > ctx->mem_limit)
		end_hoarder(ctx, c, now);
}

void tw__overload_attach(tw_context *ctx)
{
	ctx->mem_cut = mem_cut;
}
