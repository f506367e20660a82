/* SPDX-License-Identifier: BSD-3-Clause */
/* Driving a test's event_base (tests/support/loop.h). */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <check.h>
#include <taskwire/stats.h>

#include "tests/support/loop.h"

long long ts_now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void ts_sleep_ms(int ms)
{
	struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000};
	nanosleep(&ts, NULL);
}

int ts_quick(void)
{
	const char *q = getenv("TW_TEST_QUICK");
	return q != NULL && *q != '\0' && strcmp(q, "0") != 0;
}

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define TS_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define TS_SANITIZED 1
#endif
#endif

int ts_sanitized(void)
{
#ifdef TS_SANITIZED
	return 1;
#else
	return 0;
#endif
}

int ts_data_timeout_s(int s)
{
#ifdef TS_SANITIZED
	return 3 * s;
#else
	return s;
#endif
}

uint64_t ts_progress(void)
{
	tw_stats st;
	tw_stats_global(&st, sizeof(st));
	return st.bytes_sent + st.bytes_received + st.msgs_sent + st.msgs_received;
}

static void on_tick(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	(void)arg;
}

struct event *ts_tick_new(struct event_base *base, int ms)
{
	struct timeval tv = {ms / 1000, (long)(ms % 1000) * 1000};
	struct event *ev = event_new(base, -1, EV_PERSIST, on_tick, NULL);
	ck_assert_ptr_nonnull(ev);
	ck_assert_int_eq(event_add(ev, &tv), 0);
	return ev;
}

static void guard_tick(evutil_socket_t fd, short what, void *arg)
{
	(void)fd, (void)what, (void)arg;
}

/* The guard is looked at between loop passes; a tick wakes the loop at
 * least every second, so that a loop with nothing else pending (a peer
 * that ended and will send nothing) fails the wait instead of sleeping
 * in epoll_wait for ever (hygiene19: relay_bytes_not_held under valgrind,
 * CK_FORK=no: no tcase timeout either). */
int ts_run_until(struct event_base *base, int (*pred)(void *arg), void *arg, int ms)
{
	long long deadline = ts_now_ms() + ms;
	uint64_t seen = ts_progress();
	struct timeval second = {1, 0};
	struct event *tick = event_new(base, -1, EV_PERSIST, guard_tick, NULL);
	int ok = 1;
	ck_assert_ptr_nonnull(tick);
	ck_assert_int_eq(event_add(tick, &second), 0);
	while (!pred(arg)) {
		uint64_t io = ts_progress();
		if (io != seen) {
			seen = io;
			deadline = ts_now_ms() + ms;
		} else if (ts_now_ms() > deadline) {
			ok = 0;
			break;
		}
		event_base_loop(base, EVLOOP_ONCE);
	}
	event_free(tick);
	return ok;
}

static int flag_set(void *arg)
{
	return *(const int *)arg != 0;
}

int ts_wait_flag(struct event_base *base, const int *flag, int ms)
{
	return ts_run_until(base, flag_set, (void *)flag, ms);
}

void ts_run_for(struct event_base *base, int ms)
{
	long long end = ts_now_ms() + ms;
	while (ts_now_ms() <= end)
		event_base_loop(base, EVLOOP_ONCE);
}

uint64_t ts_blocks_live(void)
{
	tw_stats st;
	tw_stats_global(&st, sizeof(st));
	return st.blocks_live;
}
