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

/* Every test's timer and what it saw, set up and torn down around it (a
 * checked fixture: in the test's own process). */
static struct tw__timer tm;
static struct fired fr;

static void fx_setup(void)
{
	setup(&fr, &tm);
}

static void fx_teardown(void)
{
	teardown(&fr, &tm);
}

/* Fires once, not before its time; a later arming replaces it. */
START_TEST(fires_once_at_its_time)
{
	uint64_t start;
	start = now_ms();
	tw__timer_arm(&tm, start + 10);
	tw__timer_arm(&tm, start + 40); /* replaces +10 */
	ck_assert_uint_eq(tm.at_ms, start + 40);
	run(&fr, GUARD_MS);
	ck_assert_int_eq(fr.n, 1);
	ck_assert_uint_ge(fr.at[0], start + 40);
	ck_assert_uint_eq(tm.at_ms, 0);
}
END_TEST

/* A sooner arming replaces a far one: it fires long before the first. */
START_TEST(sooner_replaces)
{
	tw__timer_arm(&tm, now_ms() + 3600 * 1000);
	tw__timer_arm(&tm, now_ms() + 5);
	run(&fr, GUARD_MS);
	ck_assert_int_eq(fr.n, 1);
}
END_TEST

/* A time already past, and 0, fire on the next loop turn. */
START_TEST(past_fires_at_once)
{
	tw__timer_arm(&tm, now_ms() - 1000);
	ck_assert_int_eq(event_base_loop(fr.base, EVLOOP_ONCE), 0);
	ck_assert_int_eq(fr.n, 1);
	tw__timer_arm(&tm, 0);
	ck_assert_uint_ne(tm.at_ms, 0);
	ck_assert_int_eq(event_base_loop(fr.base, EVLOOP_ONCE), 0);
	ck_assert_int_eq(fr.n, 2);
}
END_TEST

/* A timer re-armed from its own callback fires again (the pool's
 * sweep). */
START_TEST(rearm_from_callback)
{
	fr.again = 3;
	tw__timer_arm(&tm, now_ms() + 5);
	run(&fr, GUARD_MS);
	ck_assert_int_eq(fr.n, 4);
	for (int i = 1; i < 4; i++)
		ck_assert_uint_ge(fr.at[i], fr.at[i - 1] + 5);
}
END_TEST

/* An armed timer leaves the loop no libevent timeout: epoll_wait sleeps
 * with none, which is what the timerfd is for. Freed while armed, it
 * never fires. */
START_TEST(no_loop_timeout_while_armed)
{
	tw__timer_arm(&tm, now_ms() + 5);
	ck_assert_int_eq(loop_timeouts(fr.base), 0);
	tw__timer_fini(&tm);
	run(&fr, 50);
	ck_assert_int_eq(fr.n, 0);
}
END_TEST

int main(void)
{
	TCase *tc = ts_tcase("timer", 0,
			     TS_TESTS(fires_once_at_its_time, sooner_replaces, past_fires_at_once,
				      rearm_from_callback, no_loop_timeout_while_armed));
	tcase_add_checked_fixture(tc, fx_setup, fx_teardown);
	return ts_main("timer", 0, TS_CASES(tc));
}
