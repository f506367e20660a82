/* SPDX-License-Identifier: BSD-3-Clause */
/* core/timer: one-shot timers on a timerfd. Each test runs its own event
 * base; waits are bounded by a guard on that base, and times are only
 * checked from below (a timer never fires before its time). */
#include <event2/event.h>
#include <time.h>

#include "core/timer.h"
#include "tests/loop_timeouts.h"
#include "tests/unit.h"
#include "tests/support/suite.h"

#define GUARD_MS 10000 /* a hang guard, not a measure */

struct fired {
	struct event_base *base;
	struct tw__timer *t;
	int n, again; /* calls so far; re-arms left for the callback */
	uint64_t at[4];
};

static uint64_t now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void on_fire(void *arg)
{
	struct fired *f = arg;
	f->at[f->n < 4 ? f->n : 3] = now_ms();
	f->n++;
	if (f->again > 0) {
		f->again--;
		tw__timer_arm(f->t, now_ms() + 5);
	} else {
		event_base_loopbreak(f->base);
	}
}

/* Run the loop until on_fire breaks it or the guard ends it. */
static void run(struct fired *f, int guard_ms)
{
	struct timeval tv = {guard_ms / 1000, (guard_ms % 1000) * 1000};
	event_base_loopexit(f->base, &tv);
	event_base_dispatch(f->base);
}

static void setup(struct fired *f, struct tw__timer *t)
{
	memset(f, 0, sizeof(*f));
	f->base = event_base_new();
	f->t = t;
	ck_assert_ptr_nonnull(f->base);
	ck_assert_int_eq(tw__timer_init(t, f->base, on_fire, f), 0);
	ck_assert_uint_eq(t->at_ms, 0);
}

static void teardown(struct fired *f, struct tw__timer *t)
{
	tw__timer_fini(t);
	tw__timer_fini(t); /* twice is harmless */
	event_base_free(f->base);
}

/* Fires once, not before its time; a later arming replaces it. */
START_TEST(fires_once_at_its_time)
{
	struct tw__timer t;
	struct fired f;
	uint64_t start;
	setup(&f, &t);
	start = now_ms();
	tw__timer_arm(&t, start + 10);
	tw__timer_arm(&t, start + 40); /* replaces +10 */
	ck_assert_uint_eq(t.at_ms, start + 40);
	run(&f, GUARD_MS);
	ck_assert_int_eq(f.n, 1);
	ck_assert_uint_ge(f.at[0], start + 40);
	ck_assert_uint_eq(t.at_ms, 0);
	teardown(&f, &t);
}
END_TEST

/* A sooner arming replaces a far one: it fires long before the first. */
START_TEST(sooner_replaces)
{
	struct tw__timer t;
	struct fired f;
	setup(&f, &t);
	tw__timer_arm(&t, now_ms() + 3600 * 1000);
	tw__timer_arm(&t, now_ms() + 5);
	run(&f, GUARD_MS);
	ck_assert_int_eq(f.n, 1);
	teardown(&f, &t);
}
END_TEST

/* A time already past, and 0, fire on the next loop turn. */
START_TEST(past_fires_at_once)
{
	struct tw__timer t;
	struct fired f;
	setup(&f, &t);
	tw__timer_arm(&t, now_ms() - 1000);
	ck_assert_int_eq(event_base_loop(f.base, EVLOOP_ONCE), 0);
	ck_assert_int_eq(f.n, 1);
	tw__timer_arm(&t, 0);
	ck_assert_uint_ne(t.at_ms, 0);
	ck_assert_int_eq(event_base_loop(f.base, EVLOOP_ONCE), 0);
	ck_assert_int_eq(f.n, 2);
	teardown(&f, &t);
}
END_TEST

/* A timer re-armed from its own callback fires again (the pool's
 * sweep). */
START_TEST(rearm_from_callback)
{
	struct tw__timer t;
	struct fired f;
	setup(&f, &t);
	f.again = 3;
	tw__timer_arm(&t, now_ms() + 5);
	run(&f, GUARD_MS);
	ck_assert_int_eq(f.n, 4);
	for (int i = 1; i < 4; i++)
		ck_assert_uint_ge(f.at[i], f.at[i - 1] + 5);
	teardown(&f, &t);
}
END_TEST

/* An armed timer leaves the loop no libevent timeout: epoll_wait sleeps
 * with none, which is what the timerfd is for. Freed while armed, it
 * never fires. */
START_TEST(no_loop_timeout_while_armed)
{
	struct tw__timer t;
	struct fired f;
	setup(&f, &t);
	tw__timer_arm(&t, now_ms() + 5);
	ck_assert_int_eq(loop_timeouts(f.base), 0);
	tw__timer_fini(&t);
	run(&f, 50);
	ck_assert_int_eq(f.n, 0);
	teardown(&f, &t);
}
END_TEST

int main(void)
{
	return ts_main_one("timer", 0, 0,
			   TS_TESTS(fires_once_at_its_time, sooner_replaces, past_fires_at_once,
				    rearm_from_callback, no_loop_timeout_while_armed));
}
