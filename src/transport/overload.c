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

/* How long a look watches a comm's queue before it may judge its rate:
 * as long as the receive budget watches a holder before it may call it a
 * dripper. A look is a pass interval, and a dripper is told from a pauser
 * by the receive budget's counts too (core/budget.h). */
#define WATCH_MS (TW__BUDGET_CUT_INTERVALS * TW__BUDGET_PASS_MS)

/* The bytes of c's queue in memory, which its peer is to take: none
 * while its writer waits for a relay's source (its peer took all there
 * was; user19: behind a worker that paused, the client a scheduler relayed
 * its data to was ended), and never those of relay frames, which wait in
 * their source's socket (transport/relay.h). */
static uint64_t mem_queued(const tw_comm *c)
{
	return c->ended || c->relay_wait ? 0 : tw__comm_queued_held(c);
}

/* Whether c, looked at now, holds memory it will not give back soon
 * (0: no; 1: its peer stood still; 2: it takes too slowly). The pause
 * limit (tw_context_set_receive_budget_pause_ms; 0: never) is the
 * receive side's: its peer took none of its queued bytes for it (a peer
 * that pauses, a blocked event loop, a GC, is waited for that long, as a
 * sender is: ending one after 1 s ended 5 of 8 honest readers that
 * paused 3 s, breaker19 B2), or, watched for WATCH_MS or more and
 * dripping, took them so slowly since the first look that saw them
 * queued that the rest would take longer than the pause limit at that
 * rate (the receive side's rule
 * for a peer that drips: one that reads a byte a second would never stand
 * still). What the peer took is what its TCP acknowledged
 * (tw__sock_acked): bytes we write stand still until half our send
 * buffer is free, seconds for a slow reader. Every look keeps each comm's
 * watch up to date (a queue that empties starts afresh). */
static int hoards(const tw_context *ctx, tw_comm *c, uint64_t now)
{
	uint64_t q = mem_queued(c), pause = ctx->limits.budget_pause_ms;
	uint64_t took, watched, acked;
	int seen = c->ov_look != 0 && c->ov_look + 1 >= ctx->mem_looks;
	int first = c->ov_look != ctx->mem_looks; /* this look's first call */
	unsigned times = 0;
	if (q == 0) {
		c->ov_look = 0;
		return 0;
	}
	acked = c->ops->acked(c);
	if (!seen) {
		c->ov_from_acked = acked;
		c->ov_from_ms = now;
		c->ov_drips = 0;
	} else if (first) {
		c->ov_drips = c->ov_drips << 1 | (acked != c->ov_acked);
	}
	if (!seen || acked != c->ov_acked) {
		c->ov_acked = acked;
		c->ov_still_ms = now;
	}
	c->ov_look = ctx->mem_looks;
	watched = now - c->ov_from_ms;
	if (pause == 0 || watched < WATCH_MS)
		return 0;
	if (now - c->ov_still_ms >= pause)
		return 1;
	/* A peer that took nothing lately pauses (the rule above waits for
	 * it): judged by its rate, the average fell while it paused, and 4 of
	 * 8 honest readers pausing 3 s were ended at 2.9 s (breaker19 B2). It
	 * drips once it took bytes at TW__BUDGET_DRIP_TIMES of the last
	 * TW__BUDGET_DRIP_INTERVALS looks, as the receive budget tells a
	 * dripper from a pauser. */
	for (unsigned i = 0; i < TW__BUDGET_DRIP_INTERVALS; i++)
		times += (c->ov_drips >> i) & 1u;
	/* ... but for the pause limit at most: a peer reading a burst every
	 * 1.1 s takes bytes at 1 look in 10, and held 28 MiB past the limit
	 * for 2 minutes (breaker19 H5); the receive budget's slow holder is
	 * cut once slow for the pause limit, however it dripped. */
	if (times < TW__BUDGET_DRIP_TIMES && watched < pause)
		return 0;
	/* q / (took / watched) > pause */
	took = acked - c->ov_from_acked;
	return (double)q * (double)watched > (double)pause * (double)took ? 2 : 0;
}

/* The comm with most bytes queued among those that hoard, or NULL. */
static tw_comm *most_hoarding(tw_context *ctx, uint64_t now)
{
	tw_comm *worst = NULL;
	uint64_t most = 0;
	for (struct tw__node *n = ctx->objects.next; n != &ctx->objects; n = n->next) {
		tw_comm *c = tw__node_comm(n);
		uint64_t q;
		if (c == NULL || hoards(ctx, c, now) == 0)
			continue;
		if ((q = mem_queued(c)) > most) {
			most = q;
			worst = c;
		}
	}
	return worst;
}

static void end_hoarder(tw_context *ctx, tw_comm *c, uint64_t now)
{
	uint64_t took = c->ov_acked - c->ov_from_acked;
	tw__comm_seterr(c,
			"ended by the memory limit: its peer took %llu of its queued bytes in "
			"%llu ms, %s, with %llu still queued, while the context held %llu bytes "
			"(received and queued), more than its memory limit of %llu bytes "
			"(tw_context_set_memory_limit_bytes)",
			(unsigned long long)took, (unsigned long long)(now - c->ov_from_ms),
			now - c->ov_still_ms >= ctx->limits.budget_pause_ms
				? "then none for the pause limit"
				: "too few to take the rest within the pause limit",
			(unsigned long long)c->ops->queued(c),
			(unsigned long long)tw__ctx_held(ctx), (unsigned long long)ctx->mem_limit);
	c->reset_on_end = 1; /* as Envoy resets the stream, and frees the kernel's copy */
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
