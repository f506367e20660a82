/* SPDX-License-Identifier: BSD-3-Clause */
/* Byte budgets across the comms of a context (issue 17): what a context
 * holds for messages being received, and for messages queued to write.
 * Per-message and per-comm limits multiply by the number of comms: 50
 * peers each sending a 99 MiB message held 4.84 GiB in a server. Loop
 * thread only, like everything of a context's comms. */
#ifndef TW_CORE_BUDGET_H
#define TW_CORE_BUDGET_H

#include <stdint.h>

#include "core/block.h"

/* One comm's place in a budget. Zeroed: holds nothing, waits for nothing. */
struct tw__claim {
	struct tw__claim *prev, *next;   /* in the waiting list, while waiting */
	struct tw__claim *hprev, *hnext; /* in the holders, while held > 0 */
	uint64_t held;                   /* bytes reserved */
	uint64_t want;                   /* bytes asked for while waiting */
	uint64_t rest;  /* bytes of its message still to come, when it last asked */
	unsigned skips; /* younger waiters granted first, while waiting */
	/* Bytes of its message received (tw__budget_moved), and what it had
	 * received when the budget's `epoch` became `mark_epoch`: what it
	 * moved in the current pass interval. */
	uint64_t got, got_mark, mark_epoch;
	/* Seen dripping: the pass intervals it held bytes since it first
	 * moved less than TW__BUDGET_MOVING_BYTES in one, until it made the
	 * floor up on average (0: moving); intervals in which it waited with
	 * its next bytes in its socket do not count. While not 0, its rest
	 * counts as the most (but for `ready_wait`). Of them, `drips`: bit i set
	 * when it dripped i intervals ago (it moved bytes, not while it
	 * waited for the budget or was granted: what it moved then is ours;
	 * moving nothing, its peer paused); `slow_got`: what it had received
	 * at the end of the first, and in the intervals it did not drip
	 * (what it moved past that is its drip). */
	unsigned slow, drips;
	uint64_t slow_got;
	/* What it had received when its count began: it moves again once it
	 * received TW__BUDGET_MOVING_BYTES an interval on average since then
	 * (one burst does not end the count). */
	uint64_t slow_from;
	/* At the last look it waited with its next bytes in its socket
	 * (`ready`): its count stands still, and it ranks by its rest. */
	int ready_wait;
	uint64_t wait_epoch; /* the pass interval in which it last waited or was granted */
	/* Pass intervals in a row at whose end it held room, not waiting, and
	 * lagged (lag_look in budget.c); a waiter keeps its count. From 0
	 * when it starts to pass, and for its next message. */
	unsigned lag;
	/* Where its message ends (got + rest when it last asked; UINT64_MAX
	 * when unknown): what is still to come is end - got. */
	uint64_t end;
	/* Waiting ended (the bytes asked for are reserved now, or, for the
	 * write budget, the budget has room again). Runs inside
	 * tw__budget_release or the setter: it must only schedule work (an
	 * event), never run the comm's callbacks. */
	void (*granted)(struct tw__claim *c);
	/* When its peer was last seen sending (CLOCK_MONOTONIC, ms): a read
	 * that received bytes of its message (tw__budget_moved), bytes
	 * unread in its socket at a look (`ready`), or its first grant.
	 * Waiting for the budget or not: a peer we paused leaves its bytes
	 * in its socket (stood_still in budget.c). */
	uint64_t heard_ms;
	/* Cut by the receive budget (TW__BUDGET_CUT_HOARD: a slow holder,
	 * while the bytes past the limit would pass TW__BUDGET_PAST_BYTES;
	 * TW__BUDGET_CUT_STILL: its peer sent nothing for the pause limit
	 * while comms waited): what it held is given
	 * back at once, it asks in vain (TW_EAGAIN, never granted) until
	 * released, and cut_off runs, as granted does (schedule the comm's
	 * end, never run it). NULL: nobody is told (tests). */
	int cut;
	void (*cut_off)(struct tw__claim *c);
	/* Bytes its peer sent that wait unread (its socket's, and 1 for a
	 * TLS record already read), for a waiter: TW__BUDGET_MOVING_BYTES or
	 * more, its wait is ours, not a pause; any, for any holder, its peer
	 * did not stand still (heard_ms). NULL: not known (0). */
	uint64_t (*ready)(const struct tw__claim *c);
};

#define TW__BUDGET_CUT_HOARD 1
#define TW__BUDGET_CUT_STILL 2

/* The receive budget. Messages reserve their bytes as they arrive, a
 * step ahead (so memory follows the bytes, and every message in progress
 * keeps moving: a comm that stops reading for longer than its peer's TCP
 * timeout is cut by the peer). A reservation is granted while what is
 * reserved, `also`, the bytes the reclaimer has still to unmap and the
 * block cache (trimmed to make room) stay within `limit`. Waiters go on
 * fewest bytes still to come first: past the budget, the comms with the
 * largest messages pause first (issue 17), as the message nearest to
 * done gives its bytes back soonest; a waiter passed over
 * TW__BUDGET_MAX_SKIPS times is passed no more. So that nothing
 * deadlocks, one message at a time (the passer) goes on past the limit,
 * whatever its size, to its end: the next waiter when nothing is
 * reserved; with the budget full, once a message in progress waits for
 * its next bytes or no bytes came back for a while (tw__budget_pass),
 * the message nearest to done (fewest bytes still to come, held or not;
 * the most when unknown or once it was seen slow: it received less than
 * TW__BUDGET_MOVING_BYTES in the interval before a tw__budget_pass); and
 * once the passer is slow, a waiter with fewer bytes to come takes the
 * pass over (so a passer that drips holds up nobody nearer to done); and,
 * besides, one waiter at a time whose last step (TW__BUDGET_MOVING_BYTES
 * at most) is all in its socket (`finisher`: reading it ends the message). It
 * starts at once when no bytes can come back by themselves (nothing
 * being written, nothing with the reclaimer), else only after
 * tw__budget_pass (the writes' peers may be waiting for our reads).
 * And one message at a time (`express`) of a sixteenth of the limit and a
 * step at most, whose peer sent its next bytes, goes on past the limit beside the
 * passer, while it is not slow, to its end: a passer that moves above
 * the floor but slowly (an honest upload at 1 MB/s) keeps the pass for
 * as long as it takes, and once what it took past the limit passes
 * tw__budget_past_bytes no other pass starts until it ends (an honest
 * 16 MiB message waited 12-39 s behind two such uploads: breaker18
 * b18-2). Beside a passer that lags (its peer slower than we read, and
 * far from done at its rate: TW__BUDGET_LAG_LOOKS), the express message
 * may be as large as the limit, if it never lagged itself. While anyone
 * waits, the block cache takes in nothing (tw__block_cache_bypass). */
#define TW__BUDGET_MAX_SKIPS 8
struct tw__budget {
	uint64_t limit, used;
	/* Bytes counted with `used` when a reservation is checked, but never
	 * against the one that goes on when nothing is reserved: the write
	 * queues, whose peers may wait for our reads. */
	const uint64_t *also;
	/* The clock of heard_ms (ms, monotonic): tw__budget_mono_ms in a
	 * context; NULL: none, and no holder is cut for standing still
	 * (cut_still in budget.c; unit tests that run intervals at their
	 * own pace, faster than any clock). */
	uint64_t (*now_ms)(void);
	/* The pause limit in ms (tw_context_set_receive_budget_pause_ms; 0:
	 * nobody is cut), read at each look; NULL: the default. */
	const uint32_t *pause_ms;
	/* The memory limit (tw_context_set_memory_limit_bytes), read at each
	 * look; NULL: none. While what is reserved and `also` pass it, with
	 * bytes queued for writing, no pass starts: the owner ends the comms
	 * whose peers take none of their queued bytes (transport/overload.c)
	 * until they are back within it. */
	const uint64_t *hard;
	struct tw__claim wait, hold; /* list heads: waiting in arrival order, holders */
	int tight;                   /* comms wait: this budget keeps the block cache bypassed */
	/* Called when comms wait while the reclaimer still holds bytes,
	 * which it gives back without a word: the owner calls
	 * tw__budget_admit again soon (a timer). NULL: nobody does. */
	void (*later)(struct tw__budget *b);
	/* Called when comms wait: the owner calls tw__budget_pass if
	 * `progress` (grants, not the passer's steps, releases; and the
	 * owner's own count: bytes written, a step's worth or more) and the reclaimer's bytes stay
	 * put for a while. NULL: nobody does. */
	void (*stuck)(struct tw__budget *b);
	struct tw__claim *passer; /* the one message past the limit, or NULL */
	/* A waiter granted its last step (at most TW__BUDGET_MOVING_BYTES) past
	 * the limit because all of it was in its socket, until released. */
	struct tw__claim *finisher;
	/* A message of a sixteenth of the limit at most (of the limit beside
	 * a passer that lags), granted past the limit beside the passer while
	 * it moves, until released (express() in budget.c). */
	struct tw__claim *express;
	int may_pass; /* tw__budget_pass said so, and no passer started or moved since */
	uint64_t progress;
	/* Bumped by the owner when it starts a pass interval (the timer that
	 * calls tw__budget_pass): holders' moves are counted from there. */
	uint64_t epoch;
	/* What reserved and `also` leave of the limit, kept up to date for
	 * the block cache; the owner has the cache watch it
	 * (tw__block_cache_watch), so that a block freed between two looks
	 * of the budget is cached only within it. */
	struct tw__cache_room room;
};

/* A holder that moves less than this in a pass interval is slow (see
 * tw__budget_pass in budget.c). */
#define TW__BUDGET_MOVING_BYTES ((uint64_t)64 << 10)
/* What the messages replaced as passer may hold past the limit,
 * together, when a new pass starts: an eighth of the limit, at least
 * this many bytes (see pass() in budget.c). */
#define TW__BUDGET_PAST_BYTES ((uint64_t)4 << 20)
/* The pass interval (the owner's timer: core/context.c). */
#define TW__BUDGET_PASS_MS 100u
/* The express message (see express() in budget.c) is at most this
 * fraction of the limit (1/16) when it starts: with 1/4, 100 MiB messages
 * through a 1 GiB budget went beside the passer and budget-bench's peak
 * rose from budget + 9.2% to + 16.3%. */
#define TW__BUDGET_EXPRESS_SHARE 16u
/* A holder lags (lag_look in budget.c) when, at the end of a pass
 * interval, we had read all its peer sent (less than
 * TW__BUDGET_MOVING_BYTES waited in its socket) and its bytes to come, at
 * the rate it received in the interval, would take more than
 * TW__BUDGET_LAG_FINISH intervals (2 s). Once the passer lagged
 * TW__BUDGET_LAG_LOOKS intervals in a row, the express message may be of
 * any size within the limit, if it never lagged. */
#define TW__BUDGET_LAG_LOOKS  5u
#define TW__BUDGET_LAG_FINISH 20u
/* While the bytes past the limit are too many, a holder seen slow for
 * this many pass intervals in a row (2 s at least) is cut if it drips
 * (in at least TW__BUDGET_DRIP_TIMES of the last TW__BUDGET_DRIP_INTERVALS)
 * too slowly to finish within the pause limit; otherwise it is paused,
 * and cut only once slow for the pause limit (see hoards() in budget.c).
 * Besides, at every look while comms wait, within the limit or past it,
 * a holder whose peer has sent nothing for the pause limit (heard_ms) is
 * cut (cut_still in budget.c). */
#define TW__BUDGET_CUT_INTERVALS  20u
#define TW__BUDGET_DRIP_INTERVALS 10u
#define TW__BUDGET_DRIP_TIMES     2u
uint64_t tw__budget_past_bytes(const struct tw__budget *b);
/* CLOCK_MONOTONIC in ms: a context's budget's now_ms. */
uint64_t tw__budget_mono_ms(void);
/* What is reserved and `also` pass the memory limit (b->hard), with
 * bytes in `also`: no pass starts. */
int tw__budget_over_hard(const struct tw__budget *b);

void tw__budget_init(struct tw__budget *b, uint64_t limit);
/* Reserve `bytes` more for c, whose message has `rest` bytes still to
 * come (the order among waiters): 0 when granted; TW_EAGAIN when c must wait
 * (c->granted runs once the bytes are reserved for it). A claim already
 * waiting gets TW_EAGAIN again and keeps its place. Other waiters are
 * granted only by release, admit and set_limit. */
int tw__budget_reserve(struct tw__budget *b, struct tw__claim *c, uint64_t bytes, uint64_t rest);
/* c's message has received `got` bytes in all (before each read): what
 * tells a holder that moves from one that drips. */
void tw__budget_moved(struct tw__budget *b, struct tw__claim *c, uint64_t got);
/* Give back all c holds and stop waiting; waiters that now fit are granted. */
void tw__budget_release(struct tw__budget *b, struct tw__claim *c);
/* Grant the waiters that fit now (the reclaimer gave bytes back). */
void tw__budget_admit(struct tw__budget *b);
/* `also` grew (a message queued for writing): the cache's room follows
 * and the cache gives way. `also` fell (a message written and freed):
 * the room follows, and waiters that now fit are granted. Both run for
 * every message written: a few loads and a store, no lock, while nobody
 * waits and the cache fits. */
void tw__budget_also_grew(struct tw__budget *b);
void tw__budget_also_fell(struct tw__budget *b);
/* A pass interval ended while comms wait: holders that moved less than
 * a step's worth in it are marked slow, and hoarders past the limit cut
 * (tw__budget_look, every interval); when no bytes came back in it, one
 * message may also pass the limit (tw__budget_pass). */
void tw__budget_look(struct tw__budget *b);
void tw__budget_pass(struct tw__budget *b);
/* A new limit; waiters that now fit are granted. */
void tw__budget_set_limit(struct tw__budget *b, uint64_t limit);

/* The write budget: bytes queued for writing on all comms. While `used`
 * is at `limit` or more, a write is refused only on a comm that still has
 * bytes of its own queued; a comm with an empty queue may always queue
 * one message. So a peer that stops reading holds up its own comm alone:
 * refusing every writer while the sum was full made one such peer stall
 * every write of the context until its TCP timeout (breaker17 b17-8,
 * session 14). A refused comm has bytes queued, so its drain callback
 * (its queue empty) tells it when to write again: no wakeup of the budget's
 * own is needed, none is lost. Past the limit the queues hold at most the
 * message that crossed it and one message for each comm that wrote with
 * an empty queue. */
struct tw__wbudget {
	uint64_t limit, used;
};

void tw__wbudget_init(struct tw__wbudget *b, uint64_t limit);
/* 1 when the budget is spent: a write on a comm with bytes of its own
 * queued is refused now (transport/comm.c, wbudget_refuse). */
static inline int tw__wbudget_spent(const struct tw__wbudget *b)
{
	return b->used >= b->limit;
}
/* Bytes queued (add), or gone: written or dropped (sub). */
void tw__wbudget_add(struct tw__wbudget *b, uint64_t n);
void tw__wbudget_sub(struct tw__wbudget *b, uint64_t n);

/* The default of both budgets: a quarter of the machine's physical memory
 * (sysconf), at least 256 MiB. */
uint64_t tw__budget_default_bytes(void);

#endif
