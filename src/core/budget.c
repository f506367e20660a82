/* SPDX-License-Identifier: BSD-3-Clause */
/* Byte budgets across the comms of a context (core/budget.h). */
#include <limits.h>
#include <stdatomic.h>
#include <time.h>
#include <unistd.h>

#include <taskwire/error.h>
#include <taskwire/limits.h>

#include "core/block.h"
#include "core/budget.h"
#include "core/memlimit.h"
#include "core/reclaim.h"

uint64_t tw__budget_mono_ms(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000 + (uint64_t)t.tv_nsec / 1000000;
}

/* The budget's time now; 0 without a clock. */
static uint64_t now_of(const struct tw__budget *b)
{
	return b->now_ms != NULL ? b->now_ms() : 0;
}

static void list_init(struct tw__claim *head)
{
	head->next = head->prev = head;
	head->hnext = head->hprev = head;
}

static int waiting(const struct tw__claim *c)
{
	return c->next != NULL;
}

static void unwait(struct tw__claim *c)
{
	if (!waiting(c))
		return;
	c->prev->next = c->next;
	c->next->prev = c->prev;
	c->next = c->prev = NULL;
}

static void enqueue(struct tw__claim *head, struct tw__claim *c)
{
	c->next = head;
	c->prev = head->prev;
	head->prev->next = c;
	head->prev = c;
}

/* What reserved and `also` leave of the limit, for the block cache
 * (b->room): a block freed between two looks of the budget is cached
 * only within it (tw__block_cache_watch). Before every change of `used`,
 * `also` or the limit returns to the caller. */
static void publish(struct tw__budget *b)
{
	uint64_t held = b->used + (b->also != NULL ? *b->also : 0);
	atomic_store_explicit(&b->room.bytes, held < b->limit ? b->limit - held : 0,
			      memory_order_relaxed);
}

static void grant(struct tw__budget *b, struct tw__claim *c, uint64_t bytes)
{
	/* The passer's steps are no bytes coming back; whether it moves is
	 * what it received (tw__budget_pass), not how often it asks: one
	 * that asked for 1 KiB fragments every 10 ms kept the pass (b8). */
	if (c != b->passer && c != b->express)
		b->progress++;
	if (c->held == 0) { /* a new holder: its peer sent its message's head */
		c->heard_ms = now_of(b);
		c->hnext = &b->hold;
		c->hprev = b->hold.hprev;
		b->hold.hprev->hnext = c;
		b->hold.hprev = c;
	}
	c->held += bytes;
	b->used += bytes;
	publish(b);
}

/* The process's cache of large blocks counts too: its pages are memory
 * as much as a message's. It gives way to a comm: trimmed (its pages go
 * back to the system) so that reserved + queued + cached + bytes stay
 * within the limit, as far as it can. */
static void make_room(const struct tw__budget *b, uint64_t need)
{
	if (need + tw__block_cache_bytes() > b->limit)
		tw__block_cache_trim(need < b->limit ? (size_t)(b->limit - need) : 0);
}

/* Reserved, queued for writing (`also`), still being unmapped by the
 * reclaimer (freed messages' pages, resident until it gets to them),
 * prefaulted ahead of the bytes (tw__block_warm_ahead), and `bytes`
 * more. */
static uint64_t need_for(const struct tw__budget *b, uint64_t bytes)
{
	uint64_t need = b->used + (b->also != NULL ? *b->also : 0) + tw__reclaim_pending() +
			tw__block_warm_ahead() + bytes;
	return need < bytes ? UINT64_MAX : need;
}

/* Whether bytes more fit with what is reserved, queued for writing and
 * being unmapped; the cache is trimmed to make room. */
static int fits(const struct tw__budget *b, uint64_t bytes)
{
	uint64_t need = need_for(b, bytes);
	if (need > b->limit)
		return 0;
	make_room(b, need);
	return 1;
}

/* Whether bytes will come back without anyone passing the budget:
 * messages being written, pages the reclaimer has still to unmap. */
static int drains(const struct tw__budget *b)
{
	return (b->also != NULL && *b->also > 0) || tw__reclaim_pending() > 0;
}

/* Past the memory limit with bytes queued for writing: a pass would take
 * in a message whose reply is queued too, and queues whose peers do not
 * read grew by one message a pass (breaker17 b17-23: 30 peers that sent
 * 32 MiB and never read held 968 MiB through 64 + 8 MiB budgets). No pass
 * starts until the owner has ended those comms (transport/overload.c) or
 * the queues drain. Without bytes queued, the receive budget's own rules
 * bound what it holds, and holding the pass could deadlock it. */
int tw__budget_over_hard(const struct tw__budget *b)
{
	uint64_t also = b->also != NULL ? *b->also : 0;
	return b->hard != NULL && also > 0 && b->used + also > *b->hard;
}

/* So that nothing deadlocks, one message at a time goes on past the
 * limit (the passer), as far as it needs: a message larger than the
 * budget has no other way in, and the messages being written may wait
 * for our reads (a peer with a budget of its own, or one that writes
 * before it reads). It may start when nothing can come back by itself,
 * or once the owner says no bytes came back for a while
 * (tw__budget_pass): while writes drain, waiters wait for them, and the
 * budget holds. */
static int may_start_pass(const struct tw__budget *b)
{
	return b->passer == NULL && !tw__budget_over_hard(b) && (!drains(b) || b->may_pass);
}

static int alone(const struct tw__budget *b)
{
	return b->used == 0 && may_start_pass(b);
}

/* Every message holding bytes waits for more: none can finish, none
 * gives anything back, without a pass. */
static int all_wait(const struct tw__budget *b)
{
	for (const struct tw__claim *h = b->hold.hnext; h != &b->hold; h = h->hnext)
		if (!waiting(h))
			return 0;
	return 1;
}

/* A message in progress waits for bytes that do not fit: the messages
 * holding the budget cannot all finish within it. */
static int holder_waits(const struct tw__budget *b)
{
	for (const struct tw__claim *h = b->hold.hnext; h != &b->hold; h = h->hnext)
		if (waiting(h))
			return 1;
	return 0;
}

/* The bytes of h's message still to come (UINT64_MAX when unknown). */
static uint64_t to_come(const struct tw__claim *h)
{
	return h->end > h->got ? h->end - h->got : 0;
}

/* What h received since the owner started the current pass interval. */
static uint64_t moved(const struct tw__budget *b, const struct tw__claim *h)
{
	return h->mark_epoch == b->epoch ? h->got - h->got_mark : 0;
}

/* h, slow, moves again: it received TW__BUDGET_MOVING_BYTES a pass
 * interval on average since it slowed. Not one interval's worth: a
 * hoarder that stood still 15 s, then sent 100 KB at once, over and over
 * (6.7 KB/s), started its count afresh each time and was never cut, while
 * a 16 MiB message waited for ever (breaker15 b15-1, b15-3); a peer back
 * from a pause at full speed makes up the pause's floor in an interval or
 * two (a 64 MiB message that paused 0.5 s: 320 KiB). */
static void caught_up(struct tw__claim *h)
{
	if (h->slow > 0 && h->got >= h->slow_from &&
	    h->got - h->slow_from >= TW__BUDGET_MOVING_BYTES * h->slow)
		h->slow = h->drips = 0;
}

/* More than tw__budget_past_bytes past the limit with no passer (a limit
 * lowered under what is held): no pass may start before someone is cut,
 * so a waiter's wait is no longer ours only. */
static int blocked(const struct tw__budget *b)
{
	return b->passer == NULL && b->used > b->limit + tw__budget_past_bytes(b);
}

/* h waits for bytes its peer sent already, TW__BUDGET_MOVING_BYTES of them
 * or all of its message still to come: its wait is ours, not a pause
 * (tw__budget_pass counts nothing for it), unless blocked: then the
 * waiters' counts run too, and the one holding the most (but the one to
 * pass) is cut at the pause limit; waiters excused for ever would hold
 * the budget for ever. */
static int waits_for_us(const struct tw__budget *b, const struct tw__claim *h)
{
	uint64_t rest = to_come(h);
	if (!waiting(h) || h->ready == NULL || blocked(b))
		return 0;
	return h->ready(h) >= (rest < TW__BUDGET_MOVING_BYTES ? rest : TW__BUDGET_MOVING_BYTES);
}

/* h holds room for bytes its peer sent, TW__BUDGET_MOVING_BYTES of them
 * (or all of its message still to come), that we have not read yet: the interval's
 * slowness is ours, not a drip or a pause of its peer, and its count
 * stands still, as for a waiter whose next bytes wait (waits_for_us;
 * unless blocked, as there). Counted, a loaded process that read its
 * holders slower than their peers sent cut them as hoarders, "too little
 * to finish", with 400 KB of their messages waiting in their sockets
 * (check_wbudget memory_limit_ends_non_readers over wss under valgrind
 * at load: 64 KiB read a second). */
static int ahead_of_us(const struct tw__budget *b, const struct tw__claim *h)
{
	uint64_t rest = to_come(h);
	if (waiting(h) || h->held <= h->got || h->ready == NULL || blocked(b))
		return 0;
	return h->ready(h) >= (rest < TW__BUDGET_MOVING_BYTES ? rest : TW__BUDGET_MOVING_BYTES);
}

/* The bytes of c's message still to come, for the order: the most once
 * it was seen dripping (tw__budget_pass), unless it waits with its next
 * bytes in its socket (ready_wait: an 8 MiB message dripped to its last
 * 8 bytes, all sent, ranked last behind a full budget and was cut as a
 * hoarder, breaker15 b15-4); one fewer when unknown (ws
 * before the last fragment of the last frame: UINT64_MAX), so that a
 * message not seen dripping always comes before one that was. Unknown
 * ranked with slow let ws drippers keep the pass from any honest message
 * whose large frame is not its last (a Dask message with two arrays): the
 * slow passer handed it only to a waiter with fewer bytes to come
 * (breaker17 b17-1, session 14). */
static uint64_t rest_of(const struct tw__claim *c)
{
	if (c->slow && !c->ready_wait)
		return UINT64_MAX;
	return c->rest < UINT64_MAX - 1 ? c->rest : UINT64_MAX - 1;
}

/* A message in progress that is not waiting has fewer bytes still to come
 * than c: it goes on within what it holds, and is the one to pass when
 * it asks for more. */
static int nearer_holder(const struct tw__budget *b, const struct tw__claim *c)
{
	for (const struct tw__claim *h = b->hold.hnext; h != &b->hold; h = h->hnext)
		if (!waiting(h) && rest_of(h) < rest_of(c))
			return 1;
	return 0;
}

static void set_passer(struct tw__budget *b, struct tw__claim *c)
{
	b->passer = c;
	b->may_pass = 0;
	c->lag = 0; /* its count as passer starts afresh */
}

uint64_t tw__budget_past_bytes(const struct tw__budget *b)
{
	return b->limit / 8 > TW__BUDGET_PAST_BYTES ? b->limit / 8 : TW__BUDGET_PAST_BYTES;
}

/* c holds nothing and waits for nothing any more; a passer's pass ends. */
static void drop(struct tw__budget *b, struct tw__claim *c)
{
	unwait(c);
	c->want = 0;
	c->ready_wait = 0;
	if (b->passer == c) { /* its bytes come back: a pass starts afresh */
		b->passer = NULL;
		b->may_pass = 0;
	}
	if (b->finisher == c)
		b->finisher = NULL;
	if (b->express == c)
		b->express = NULL;
	if (c->held > 0) {
		b->used -= c->held;
		c->held = 0;
		c->hprev->hnext = c->hnext;
		c->hnext->hprev = c->hprev;
		c->hnext = c->hprev = NULL;
		publish(b);
	}
}

/* The pause limit in pass intervals (0: nobody is cut). */
static uint64_t pause_intervals(const struct tw__budget *b)
{
	uint64_t ms = b->pause_ms != NULL ? *b->pause_ms : TW_DEFAULT_RECEIVE_BUDGET_PAUSE_MS;
	return (ms + TW__BUDGET_PASS_MS - 1) / TW__BUDGET_PASS_MS;
}

/* Whether h, a holder, hoards (may be cut while the bytes past the limit
 * are too many). A peer that pauses (a blocked event loop, a GC, a worker
 * under memory pressure) sends nothing, and then the rest: h dripped in
 * fewer than TW__BUDGET_DRIP_TIMES of its last TW__BUDGET_DRIP_INTERVALS
 * (once is a read of bytes that came before the pause, seen late), and is
 * waited for until it has been slow for the pause limit. A peer that
 * drips (it moved, less than TW__BUDGET_MOVING_BYTES a pass interval, for
 * TW__BUDGET_CUT_INTERVALS) hoards when, at the rate it dripped since it
 * slowed, its rest would take longer than the pause limit: a message near
 * its end, or on a slow link with little to come, finishes first. Cutting
 * whoever was slow for 2 s cut honest peers that paused (breaker13 b7, 8 s
 * pauses: 12 of 30 cut; breaker17 b17-24, session 14), and waiting for
 * every pause let 10 drippers hold 680 MiB through 16 MiB (b17-5). */
static int hoards(const struct tw__budget *b, const struct tw__claim *h)
{
	uint64_t limit = pause_intervals(b), rest = to_come(h), dripped;
	unsigned times = 0;
	if (limit == 0 || (h->slow < limit && h->slow < TW__BUDGET_CUT_INTERVALS))
		return 0;
	/* All it has still to come is in its socket: reading it ends the
	 * message, whatever the peer did before (a slow link's 8 MiB message
	 * was cut 8 bytes before its end, all sent, "too little to finish
	 * it": breaker15 b15-4) */
	if (h->ready != NULL && h->ready(h) >= rest)
		return 0;
	if (h->slow >= limit)
		return 1;
	dripped = h->got > h->slow_got ? h->got - h->slow_got : 0;
	for (unsigned i = 0; i < TW__BUDGET_DRIP_INTERVALS; i++)
		times += (h->drips >> i) & 1u;
	if (times < TW__BUDGET_DRIP_TIMES || dripped == 0)
		return 0;
	/* rest / (dripped per interval) > limit intervals */
	return (double)rest * (double)(h->slow - 1) > (double)limit * (double)dripped;
}

/* The hoarder (hoards) that holds the most, other than c. */
static struct tw__claim *largest_slow(struct tw__budget *b, const struct tw__claim *c)
{
	struct tw__claim *best = NULL;
	for (struct tw__claim *h = b->hold.hnext; h != &b->hold; h = h->hnext)
		if (h != c && hoards(b, h) && (best == NULL || h->held > best->held))
			best = h;
	return best;
}

/* h gives back all it holds and asks in vain until released; its owner
 * is told why (cut_off). */
static void cut(struct tw__budget *b, struct tw__claim *h, int why)
{
	drop(b, h);
	h->cut = why;
	if (h->cut_off != NULL)
		h->cut_off(h);
}

/* A new pass is about to start for c, past the limit: the messages
 * replaced as passers before it kept what they received (each up to its
 * whole message), so pass after pass they piled up past the limit: 10
 * peers that each sent 64 MiB of a 256 MiB message as fast as they were
 * read, and then dripped, held 680 MiB through a 16 MiB budget (breaker17
 * b17-5, session 14). While what is reserved passes the limit by more
 * than tw__budget_past_bytes, the hoarder that holds the most is cut
 * (its comm ends, as for a peer below the minimum receive rate: it has
 * dripped, or stood still for the pause limit, while holding memory past
 * the budget), so that memory stays within the limit, that much more,
 * and the one message passing. */
static void cut_hoarders(struct tw__budget *b, const struct tw__claim *c)
{
	struct tw__claim *h;
	while (b->used > b->limit + tw__budget_past_bytes(b) && (h = largest_slow(b, c)) != NULL)
		cut(b, h, TW__BUDGET_CUT_HOARD);
}

/* h's peer sent nothing lately, as far as a look can tell (m: what h
 * received in the pass interval that ended): no byte of its message
 * came, none waits unread in its socket, and more is to come. Whether h
 * waited for the budget or not: the bytes of a peer we paused wait in
 * its socket, so a wait of ours never looks like this, and a peer that
 * pauses looks like this whatever we did to its reads. */
static int stood_still(const struct tw__claim *h, uint64_t m)
{
	return m == 0 && to_come(h) > 0 && (h->ready == NULL || h->ready(h) == 0);
}

/* Cut every holder whose peer has sent nothing (stood_still, heard_ms)
 * for the pause limit, while comms wait (the looks run only then),
 * wherever it is in the budget: the passer, the express message, a
 * waiter, a holder within the limit. The hoarders' rule (cut_hoarders)
 * cuts only while the bytes past the limit are too many, and counts only
 * the intervals in which comms waited: 8 raw peers that each sent 8 MiB
 * of a 16 MiB message and then nothing held a 64 MiB budget for 40 s, and
 * every 16 MiB message beside them waited for the one pass at a time; a
 * holder that asked for its next step with its socket empty counted as
 * waiting for us, never slow (pause19). */
static void cut_still(struct tw__budget *b, uint64_t now)
{
	uint64_t ms = b->pause_ms != NULL ? *b->pause_ms : TW_DEFAULT_RECEIVE_BUDGET_PAUSE_MS;
	struct tw__claim *h = b->hold.hnext;
	while (ms != 0 && b->now_ms != NULL && h != &b->hold) {
		struct tw__claim *next = h->hnext;
		if (to_come(h) > 0 && now - h->heard_ms >= ms)
			cut(b, h, TW__BUDGET_CUT_STILL);
		h = next;
	}
}

/* The waiter whose message will give its bytes back soonest: the fewest
 * bytes still to come, the oldest among equals. Past a full budget it is
 * the one to pass, whether it holds bytes or not: passing the oldest
 * message in progress (the rule before) let a peer that declared 1 GiB
 * and dripped it above the minimum rate hold the pass for ever, while an
 * honest 16 MiB message waited behind it (breaker b1, session 12). */
static struct tw__claim *nearest_done(struct tw__budget *b)
{
	struct tw__claim *best = b->wait.next;
	if (best == &b->wait)
		return NULL;
	for (struct tw__claim *c = best->next; c != &b->wait; c = c->next)
		if (rest_of(c) < rest_of(best))
			best = c;
	return best;
}

/* The waiter to go on next within the limit: the one with the fewest
 * bytes of its message still to come (comms with the largest messages
 * are paused first, and stay paused longest: a message done gives its
 * bytes back, and the nearest to done gives them back soonest), the
 * oldest among equals; but once the oldest waiter has been passed over
 * TW__BUDGET_MAX_SKIPS times, nobody passes it any more, so a large
 * message is not kept waiting for ever by a stream of smaller ones. */
static struct tw__claim *next_waiter(struct tw__budget *b)
{
	struct tw__claim *best = b->wait.next;
	if (best == &b->wait || best->skips >= TW__BUDGET_MAX_SKIPS)
		return best == &b->wait ? NULL : best;
	return nearest_done(b);
}

/* Grant c what it waits for; the waiters older than c were passed over.
 * c->granted runs unless c is `self` (the claim reserving right now). */
static void grant_wait(struct tw__budget *b, struct tw__claim *c, struct tw__claim *self)
{
	unwait(c);
	grant(b, c, c->want);
	c->want = 0;
	c->skips = 0;
	c->ready_wait = 0;
	c->wait_epoch = b->epoch; /* what it reads now waited in its socket */
	if (c != self)
		c->granted(c);
}

static void admit_one(struct tw__budget *b, struct tw__claim *c, struct tw__claim *self)
{
	for (struct tw__claim *o = b->wait.next; o != c; o = o->next)
		o->skips++;
	grant_wait(b, c, self);
}

/* A waiter whose step is the last of its message, TW__BUDGET_MOVING_BYTES
 * at most, with all of it in its socket, goes on at once, past the limit
 * if need be: reading it ends the message, which gives back all it holds.
 * Waiting, it waited for the passer to end (an 8 MiB message of a slow
 * link held 8 MiB for its last 8 bytes, all sent, behind a full budget:
 * breaker15 b15-4). One at a time (b->finisher, until it is released):
 * bytes that the socket's count promises but that do not end it (a TLS
 * record not all there) hold that step past the limit, no more. Only
 * grants: whoever it passes goes on by the other rules. */
static void finish(struct tw__budget *b, struct tw__claim *self)
{
	if (b->finisher != NULL)
		return;
	for (struct tw__claim *c = b->wait.next; c != &b->wait; c = c->next)
		if (c->want <= TW__BUDGET_MOVING_BYTES && c->want >= c->rest && c->ready != NULL &&
		    c->ready(c) >= c->want) {
			b->finisher = c;
			make_room(b, need_for(b, c->want));
			grant_wait(b, c, self);
			return;
		}
}

/* A holder's peer is slower than we read, and it is far from done: at
 * the end of the interval, holding room (not waiting), less than a step
 * of it waited in its socket (we had read all its peer sent: our own
 * slowness fills the socket) and its bytes to come, at the rate it
 * received in the interval, would take more than TW__BUDGET_LAG_FINISH
 * intervals. Counted in h->lag, intervals in a row (one with a step in
 * its socket, or a fast one, starts the count afresh); a waiter keeps its
 * count. Nearest to done in bytes is not in time: an upload at 1 MB/s,
 * above the slow floor, with 16-32 MiB to come, kept the pass 16-32 s
 * (breaker18 b18-2); budget-bench's passers (100 MiB, their peers as fast
 * as we read) received 1-30 MiB an interval with 0.5-5 MiB in their
 * sockets, and lagged 2 intervals in a row at most. */
static void lag_look(struct tw__budget *b)
{
	for (struct tw__claim *h = b->hold.hnext; h != &b->hold; h = h->hnext) {
		uint64_t rest = to_come(h);
		if (waiting(h))
			continue;
		if (h->ready == NULL ||
		    h->ready(h) >=
			    (rest < TW__BUDGET_MOVING_BYTES ? rest : TW__BUDGET_MOVING_BYTES) ||
		    rest / TW__BUDGET_LAG_FINISH <= moved(b, h))
			h->lag = 0;
		else if (h->lag < UINT_MAX)
			h->lag++;
	}
}

/* The passer lagged TW__BUDGET_LAG_LOOKS intervals in a row (lag_look). */
static int passer_lags(const struct tw__budget *b)
{
	return b->passer != NULL && b->passer->lag >= TW__BUDGET_LAG_LOOKS;
}

/* Whether c may go on past the limit beside the passer (express): not
 * slow, its peer sent its next bytes (TW__BUDGET_MOVING_BYTES, or all
 * still to come), and a message of a sixteenth of the limit and a step
 * at most (a 4 MiB array with its message's head and lengths, through
 * 64 MiB), or, once the passer lags (passer_lags), of the limit and a
 * step at most if it never lagged itself (an upload at 1 MB/s waiting
 * beside the one passing would take the place for as long). Not larger
 * beside a passer that does not lag: with a quarter, budget-bench's
 * 100 MiB messages went beside passers as fast as we read them and its
 * peak went past budget + 10% (TW__BUDGET_EXPRESS_SHARE). By its size,
 * not by its bytes to come: an upload near its end has few to come, and
 * a message that started while there was room waits with part of it in. */
static int express_fits(const struct tw__budget *b, const struct tw__claim *c)
{
	uint64_t rest = to_come(c);
	uint64_t size =
		passer_lags(b) && c->lag == 0 ? b->limit : b->limit / TW__BUDGET_EXPRESS_SHARE;
	return !c->cut && c->slow == 0 && c->end <= size + TW__BUDGET_MOVING_BYTES &&
	       c->ready != NULL &&
	       c->ready(c) >= (rest < TW__BUDGET_MOVING_BYTES ? rest : TW__BUDGET_MOVING_BYTES);
}

/* Past a full budget, one small message at a time goes on past the
 * limit beside the passer (b->express, until released), while it is not
 * slow: the waiter with the fewest bytes to come among those
 * express_fits takes, at once when nothing can come back by itself, else after
 * tw__budget_pass, as a pass starts. The passer is the message nearest
 * to done in bytes, not in time: an honest upload at 1 MB/s (above the
 * slow floor) with 15 MiB to come kept the pass for 15 s, and once what
 * it took past the limit passed tw__budget_past_bytes no pass could start
 * for anyone else until it ended: an honest 16 MiB message whose peer
 * sent it at once waited 12 s behind two 48 MiB uploads at 1 MB/s
 * through a 64 MiB budget, 29 s behind two of 64 MiB (breaker18 b18-2:
 * 39 s).
 * What it adds past the limit is one message of a sixteenth of the limit
 * (and a step), or of the limit beside a passer that lags (express_fits):
 * a peer that takes the place and then drips or
 * pauses keeps it (it waits when it asks again, as any holder) until it
 * ends or is cut as a hoarder, so peers that drip, however many, hold
 * that much at most through it, one at a time. */
static void express(struct tw__budget *b, struct tw__claim *self)
{
	struct tw__claim *best = NULL;
	if (b->express != NULL || tw__budget_over_hard(b) || (drains(b) && !b->may_pass))
		return;
	for (struct tw__claim *c = b->wait.next; c != &b->wait; c = c->next)
		if (c != b->passer && express_fits(b, c) &&
		    (best == NULL || to_come(c) < to_come(best)))
			best = c;
	if (best == NULL)
		return;
	b->express = best;
	make_room(b, need_for(b, best->want));
	grant_wait(b, best, self);
}

/* While comms wait, the block cache takes in no more (freed large blocks
 * go back to the system): what it would keep is memory the budget does
 * not see come back. */
static void set_tight(struct tw__budget *b)
{
	int tight = b->wait.next != &b->wait;
	if (tight != b->tight)
		tw__block_cache_bypass(tight);
	b->tight = tight;
}

/* Past a full budget, who goes on past the limit: the message nearest to
 * done (nearest_done). A pass starts when nothing is reserved (the next
 * waiter, larger than the budget), or, with the budget full, when a
 * message in progress waits for its next bytes or no bytes came back for
 * a while (tw__budget_pass): then the waiter with the fewest bytes still
 * to come goes, unless a message in progress that is not waiting has
 * fewer (it passes when it asks). Bytes to come count as the most for
 * a message that is slow (tw__budget_pass: it moved less than
 * TW__BUDGET_MOVING_BYTES in a pass interval) or whose rest is unknown
 * (ws before the last fragment of the last frame). A passer that is
 * slow hands the pass to a waiter with fewer bytes to come, so a passer
 * that drips cannot keep a message that would finish sooner waiting,
 * while a passer that moves keeps it (handing it over at once let every
 * message nearer to done past the limit too); the passer replaced keeps
 * what it holds (all it received) and waits when it asks again; no
 * pass starts on top of more than tw__budget_past_bytes past the limit
 * (cut_hoarders), so what the passers hold past the limit stays within
 * that and one message. */
static void pass(struct tw__budget *b, struct tw__claim *self)
{
	struct tw__claim *c = next_waiter(b);
	if (c == NULL || fits(b, c->want))
		return;
	if (!alone(b)) {
		/* The oldest waiter, once passed over TW__BUDGET_MAX_SKIPS
		 * times, is the one to pass too, whatever its rest: else a ws
		 * message (its rest unknown) or one seen slow lost to every
		 * message with a known rest for ever while honest traffic kept
		 * the budget full (breaker17 b17-17, b17-20, session 14). */
		struct tw__claim *o = b->wait.next;
		int due = o->skips >= TW__BUDGET_MAX_SKIPS;
		c = due ? o : nearest_done(b);
		if (b->passer != NULL ? !b->may_pass || !b->passer->slow ||
						(!due && rest_of(c) >= rest_of(b->passer))
				      : !may_start_pass(b) || !(b->may_pass || holder_waits(b)) ||
						(!due && nearer_holder(b, c)))
			return;
	}
	cut_hoarders(b, c);
	/* Still too much past the limit, held by messages that moved lately,
	 * paused, or drip fast enough to finish: no new pass on top; they go
	 * on, or are cut once they hoard (a later tw__budget_pass). What c
	 * holds is not on top: it goes on with it (else waiters alone past
	 * the bound, c among them, never passed, as c is never cut for itself).
	 * Nor is a pass held back when every holder waits (a limit lowered
	 * under the messages in progress): nothing would come back, and
	 * their counts ran until all but one were cut, with their bytes in
	 * their sockets (breaker18 b18-3, session 16: 6 honest 128 MiB
	 * messages, budget lowered from 1 GiB to 16 MiB, all 6 cut). The one
	 * nearest to done passes, to its end, and gives its bytes back; the
	 * next passes then: memory only falls. */
	if (b->used - c->held > b->limit + tw__budget_past_bytes(b) && !all_wait(b))
		return;
	if (!fits(b, c->want)) /* else the cuts made room: no pass needed */
		set_passer(b, c);
	make_room(b, need_for(b, c->want));
	admit_one(b, c, self);
}

static void admit(struct tw__budget *b, struct tw__claim *self)
{
	struct tw__claim *c;
	/* Pages the reclaimer or the prefaulter took on since the cache's
	 * last look: trim it back within what the reservations leave (a
	 * budget the cache does not watch, b->room, sees freed blocks here
	 * first; 300 x 3 MiB through 64 MiB peaked at the budget + 45-69%
	 * with the cache before, breaker13 b5-cache). */
	make_room(b, need_for(b, 0));
	while ((c = next_waiter(b)) != NULL && fits(b, c->want)) {
		make_room(b, need_for(b, c->want));
		admit_one(b, c, self);
	}
	finish(b, self);
	pass(b, self);
	express(b, self);
	set_tight(b);
	/* Comms wait: the owner watches for bytes coming back (and for the
	 * passer's steps), and calls tw__budget_pass when none do. */
	if (b->tight && b->stuck != NULL)
		b->stuck(b);
	/* The reclaimer gives bytes back without telling anyone: look again
	 * shortly while it has some and comms wait for room. */
	if (b->tight && b->later != NULL && tw__reclaim_pending() > 0)
		b->later(b);
}

void tw__budget_admit(struct tw__budget *b)
{
	admit(b, NULL);
}

void tw__budget_also_grew(struct tw__budget *b)
{
	publish(b);
	make_room(b, need_for(b, 0));
}

void tw__budget_also_fell(struct tw__budget *b)
{
	publish(b);
	if (b->wait.next != &b->wait) /* bytes written may let waiters in */
		admit(b, NULL);
}

void tw__budget_init(struct tw__budget *b, uint64_t limit)
{
	b->limit = limit;
	b->used = 0;
	b->also = NULL;
	b->now_ms = NULL;
	b->pause_ms = NULL;
	b->hard = NULL;
	b->later = NULL;
	b->stuck = NULL;
	b->passer = NULL;
	b->finisher = NULL;
	b->express = NULL;
	b->may_pass = 0;
	b->progress = 0;
	b->tight = 0;
	b->epoch = 0;
	b->room.next = b->room.prev = NULL;
	list_init(&b->wait);
	list_init(&b->hold);
	publish(b);
}

int tw__budget_reserve(struct tw__budget *b, struct tw__claim *c, uint64_t bytes, uint64_t rest)
{
	if (waiting(c) || c->cut) /* a cut claim asks in vain until released */
		return TW_EAGAIN;
	c->end = rest < UINT64_MAX - c->got ? c->got + rest : UINT64_MAX;
	/* the passer, to its end, fitting or not; the express message too,
	 * while it is not slow */
	if (c == b->passer || (c == b->express && c->slow == 0)) {
		make_room(b, need_for(b, bytes));
		c->rest = rest;
		if (c == b->passer) /* it moves */
			b->may_pass = 0;
		grant(b, c, bytes);
		return 0;
	}
	caught_up(c);
	c->want = bytes;
	c->rest = rest;
	c->skips = 0;
	c->wait_epoch = b->epoch;
	enqueue(&b->wait, c);
	/* slow, it ranks by its rest only with its next bytes here */
	c->ready_wait = c->slow > 0 && waits_for_us(b, c);
	admit(b, c);
	return waiting(c) || c->cut ? TW_EAGAIN : 0;
}

void tw__budget_moved(struct tw__budget *b, struct tw__claim *c, uint64_t got)
{
	if (got != c->got) /* its peer sent bytes */
		c->heard_ms = now_of(b);
	if (c->mark_epoch != b->epoch) { /* first look in this interval */
		c->mark_epoch = b->epoch;
		c->got_mark = c->got <= got ? c->got : 0;
	}
	c->got = got;
}

void tw__budget_release(struct tw__budget *b, struct tw__claim *c)
{
	drop(b, c);
	c->got = c->got_mark = 0; /* the next message counts from 0 */
	c->slow = c->drips = 0;
	c->ready_wait = 0;
	c->lag = 0;
	c->cut = 0;
	b->progress++;
	admit(b, NULL);
}

/* A pass interval ended (tw__budget_look, tw__budget_pass): a holder (the passer among
 * them) that moved less than TW__BUDGET_MOVING_BYTES in it is slow (one
 * more interval; a waiter already slow stays so and counts on, but for
 * one whose peer sent its next bytes: waits_for_us), and its rest counts
 * as the most until it moves again (caught_up). Fewer
 * bytes to come is no sign of finishing sooner when they drip: a peer
 * that declared 8 MiB and sent 4 MiB at once holds the rest ahead, never
 * asks, and drips it at 2 KB/s; 8 of them held an honest 16 MiB message
 * for ever (breaker b4, session 13). A waiter's rate is not known (it is
 * paused), so this is a rate floor (64 KiB per 100 ms, about 640 KB/s)
 * rather than a finish-time estimate: a holder above it with fewer bytes
 * to come finishes soon, one below it may take hours (its rest at the
 * minimum receive rate). An honest message that is marked (a slow peer,
 * a loaded machine) loses its place until it moves again, and is cut
 * only when slow for TW__BUDGET_CUT_INTERVALS while the bytes past the
 * limit are too many (cut_hoarders). */
static void mark(struct tw__budget *b, int quiet, uint64_t now)
{
	for (struct tw__claim *h = b->hold.hnext; h != &b->hold; h = h->hnext) {
		uint64_t m = moved(b, h);
		if (!stood_still(h, m))
			h->heard_ms = now;
		/* While bytes come back, a waiter may wait for them: its count
		 * stands still (counted in such intervals, a slow link's 8 MiB
		 * message that waited with less than a step in its socket
		 * looked slower than it sent and was cut, 2 MiB before its end,
		 * as too slow to finish) */
		if (!quiet && waiting(h))
			continue;
		/* A waiter whose peer sent its next bytes moves as soon as the
		 * budget lets it: its wait is ours, its count stands still
		 * (counted on, a waiter that was slow before it waited ranked
		 * last and was cut at the pause limit while its bytes waited:
		 * 7 of breaker13's b7 pausers, once) */
		if ((h->ready_wait = waits_for_us(b, h)) != 0 || ahead_of_us(b, h))
			continue;
		if (h->slow == 0 && (m >= TW__BUDGET_MOVING_BYTES || (waiting(h) && !blocked(b))))
			continue; /* it moves, or it waits for us since it moved */
		/* A waiter's bytes, or those of one that waited or was granted
		 * in the interval, came as the budget let them: no drip (a peer
		 * paused 2 s, back to a full budget, looked a dripper) */
		int drip = m > 0 && !waiting(h) && h->wait_epoch != b->epoch;
		if (h->slow == 0) { /* its drip counts from here, its rate from the start of it */
			h->slow_from = h->got - m;
			h->slow_got = h->got;
		} else if (!drip) {
			h->slow_got += m;
		}
		if (h->slow < UINT_MAX)
			h->slow++;
		h->drips = h->drips << 1 | (unsigned)drip;
		caught_up(h);
	}
}

/* Every pass interval, bytes coming back or not: slow marks and the
 * hoarders' cut do not wait for a quiet interval (only a new pass does).
 * While they waited for one, a peer sending a 60 KB message every 20 ms
 * on another comm (each echoed: more than a step's worth written every
 * interval, no reservation) kept every interval "moving": no holder was
 * ever marked slow, no hoarder cut, and an honest 16 MiB message waited
 * for ever behind two hoarders (breaker18 b18-1, session 16; b15-2 with
 * larger chatter). A hoarder is judged on its own bytes over seconds
 * (hoards), not on what other comms do. */
void tw__budget_look(struct tw__budget *b)
{
	uint64_t used = b->used;
	uint64_t now = now_of(b);
	lag_look(b);
	mark(b, 0, now);
	cut_still(b, now);
	cut_hoarders(b, NULL);
	/* the cuts made room, or the passer lags: a waiter may go beside it */
	if (b->used != used || (passer_lags(b) && b->express == NULL))
		admit(b, NULL);
}

void tw__budget_pass(struct tw__budget *b)
{
	uint64_t now = now_of(b);
	lag_look(b);
	mark(b, 1, now);
	cut_still(b, now);
	b->may_pass = 1;
	admit(b, NULL);
}

void tw__budget_set_limit(struct tw__budget *b, uint64_t limit)
{
	b->limit = limit;
	publish(b);
	admit(b, NULL);
}

void tw__wbudget_init(struct tw__wbudget *b, uint64_t limit)
{
	b->limit = limit;
	b->used = 0;
}

void tw__wbudget_add(struct tw__wbudget *b, uint64_t n)
{
	b->used += n;
}

void tw__wbudget_sub(struct tw__wbudget *b, uint64_t n)
{
	b->used -= n;
}

uint64_t tw__budget_default_bytes(void)
{
	uint64_t q = tw__memory_limit("/sys/fs/cgroup", "/proc/self/cgroup") / 4;
	return q > ((uint64_t)256 << 20) ? q : (uint64_t)256 << 20;
}
