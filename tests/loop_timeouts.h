/* SPDX-License-Identifier: BSD-3-Clause */
/* How many libevent timeouts are pending on a base: a pool or timer that
 * should leave epoll_wait with none adds none (core/timer.h). */
#ifndef TW_TESTS_LOOP_TIMEOUTS_H
#define TW_TESTS_LOOP_TIMEOUTS_H

#include <check.h>
#include <event2/event.h>

#define LT_MAX 256

struct lt_seen {
	const struct event *ev[LT_MAX];
	int n;
};

static inline int lt_collect(const struct event_base *base, const struct event *ev, void *arg)
{
	struct lt_seen *s = arg;
	(void)base;
	s->ev[s->n++] = ev;
	return s->n == LT_MAX; /* stops the walk: the count would be short */
}

/* On the loop's thread, outside the loop. event_base_foreach_event holds
 * the base's lock and event_pending takes it (not recursively on every
 * base): the events are asked after the walk. */
static inline int loop_timeouts(struct event_base *base)
{
	static struct lt_seen s;
	int n = 0;
	s.n = 0;
	ck_assert_int_eq(event_base_foreach_event(base, lt_collect, &s), 0);
	for (int i = 0; i < s.n; i++)
		n += event_pending(s.ev[i], EV_TIMEOUT, NULL) != 0;
	return n;
}

#endif
