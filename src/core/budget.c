/* SPDX-License-Identifier: BSD-3-Clause */
/* Byte budgets across the comms of a context (core/budget.h). */
#include <unistd.h>

#include <taskwire/error.h>

#include "core/budget.h"

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

static void grant(struct tw__budget *b, struct tw__claim *c, uint64_t bytes)
{
	if (c->held == 0) { /* a new holder: the youngest */
		c->hnext = &b->hold;
		c->hprev = b->hold.hprev;
		b->hold.hprev->hnext = c;
		b->hold.hprev = c;
	}
	c->held += bytes;
	b->used += bytes;
}

static int fits(const struct tw__budget *b, uint64_t bytes)
{
	uint64_t also = b->also != NULL ? *b->also : 0;
	return b->used == 0 || b->used + also + bytes <= b->limit;
}

/* The budget is full and nobody can go on: the oldest message in
 * progress goes on, past the limit and past the waiters, finishes, and
 * gives back what it holds. The bytes queued for writing count as full
 * too: their peers may be waiting for our reads before they read what we
 * wrote (a taskwire peer with a budget of its own, or one that writes
 * before it reads). With room, the oldest waits its turn like any other,
 * so the freed bytes go round the waiters. */
static int must_pass(const struct tw__budget *b, const struct tw__claim *c, uint64_t bytes)
{
	return c->held > 0 && b->hold.hnext == c && !fits(b, bytes);
}

static void admit_one(struct tw__budget *b, struct tw__claim *c)
{
	unwait(c);
	grant(b, c, c->want);
	c->want = 0;
	c->granted(c);
}

/* Grant waiters in order while the first of them fits; and the oldest
 * holder, wherever it waits, when it must pass. */
void tw__budget_admit(struct tw__budget *b)
{
	struct tw__claim *old;
	while (b->wait.next != &b->wait && fits(b, b->wait.next->want))
		admit_one(b, b->wait.next);
	old = b->hold.hnext;
	if (old != &b->hold && waiting(old) && must_pass(b, old, old->want))
		admit_one(b, old);
}

void tw__budget_init(struct tw__budget *b, uint64_t limit)
{
	b->limit = limit;
	b->used = 0;
	b->also = NULL;
	list_init(&b->wait);
	list_init(&b->hold);
}

int tw__budget_reserve(struct tw__budget *b, struct tw__claim *c, uint64_t bytes)
{
	if (waiting(c))
		return TW_EAGAIN;
	/* Nobody passes a waiter, except the oldest holder when it must. */
	if ((fits(b, bytes) && b->wait.next == &b->wait) || must_pass(b, c, bytes)) {
		grant(b, c, bytes);
		return 0;
	}
	c->want = bytes;
	enqueue(&b->wait, c);
	return TW_EAGAIN;
}

void tw__budget_release(struct tw__budget *b, struct tw__claim *c)
{
	unwait(c);
	c->want = 0;
	if (c->held > 0) {
		b->used -= c->held;
		c->held = 0;
		c->hprev->hnext = c->hnext;
		c->hnext->hprev = c->hprev;
		c->hnext = c->hprev = NULL;
		tw__budget_admit(b);
	}
}

void tw__budget_set_limit(struct tw__budget *b, uint64_t limit)
{
	b->limit = limit;
	tw__budget_admit(b);
}

void tw__wbudget_init(struct tw__wbudget *b, uint64_t limit)
{
	b->limit = limit;
	b->used = 0;
	b->posted = 0;
	list_init(&b->refused);
}

int tw__wbudget_refuse(struct tw__wbudget *b, struct tw__claim *c)
{
	if (b->used < b->limit)
		return 0;
	if (!waiting(c))
		enqueue(&b->refused, c);
	return 1;
}

void tw__wbudget_forget(struct tw__claim *c)
{
	unwait(c);
}

void tw__wbudget_add(struct tw__wbudget *b, uint64_t n)
{
	b->used += n;
}

int tw__wbudget_sub(struct tw__wbudget *b, uint64_t n)
{
	b->used -= n;
	return b->used < b->limit && b->refused.next != &b->refused && !b->posted;
}

void tw__wbudget_due(struct tw__wbudget *b)
{
	b->posted = 0;
	while (b->used < b->limit && b->refused.next != &b->refused) {
		struct tw__claim *c = b->refused.next;
		unwait(c);
		c->granted(c); /* may write, and so fill the budget again */
	}
}

uint64_t tw__budget_default_bytes(void)
{
	long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGESIZE);
	uint64_t q = pages > 0 && size > 0 ? (uint64_t)pages * (uint64_t)size / 4 : 0;
	return q > ((uint64_t)256 << 20) ? q : (uint64_t)256 << 20;
}
