/* SPDX-License-Identifier: BSD-3-Clause */
#include "core/pass.h"

#include <event2/event.h>
#include <stdatomic.h>
#include <sys/time.h>
#include <time.h>

/* About a millisecond of copying per pass for all comms together on a
 * quiet machine, and a minimum per comm so that a small message is never
 * held back. On a busy one copying is slower (budget-bench: 7 MB of
 * send and recv took 25 ms of loop CPU with the 2 CPUs shared by 13
 * processes), so once a pass has run PASS_NS comms get their minimum
 * only; and the minimum is small, as 50 comms reading and 50 writing
 * take it 100 times a pass. */
#define PASS_BYTES ((size_t)4 << 20)
#define PASS_MIN   ((size_t)16 << 10)
#define PASS_NS    2000000L
/* Bytes a pass may write to pages not faulted in yet (tw__pass_cold): a
 * fresh page costs 5-10 times its copy (about 3.5 ms per MB in a VM on a
 * busy machine, budget-bench), and past this a comm gets one page. */
#define COLD_BYTES ((size_t)128 << 10)
#define COLD_MIN   ((size_t)4096)

/* tw__pass_cap's cap (0: none) and tw__pass_spend's switch;
 * process-wide, set by tests. */
static atomic_size_t test_cap;
static atomic_int test_spent;

/* One loop per thread: the pass is the thread's. */
static _Thread_local struct {
	struct timeval tv;
	struct timespec t0; /* CLOCK_MONOTONIC at the pass's first allow or step */
	size_t used, cold;
	unsigned steps; /* TLS handshake steps started (tw__pass_step) */
	int open;       /* a comm's read: from tw__pass_read to tw__pass_close */
	int cut;        /* tw__pass_cold gave less than asked since tw__pass_spent */
	/* comms' ends released or sent (tw__pass_release) */
	unsigned releases;
} pass;

/* Nanoseconds since the pass began (vDSO: tens of nanoseconds). */
static long pass_ran(void)
{
	struct timespec t;
	if (atomic_load_explicit(&test_spent, memory_order_relaxed))
		return PASS_NS;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (t.tv_sec - pass.t0.tv_sec) * 1000000000L + (t.tv_nsec - pass.t0.tv_nsec);
}

/* A new pass (libevent's cached time moved) starts afresh; in the same
 * one, the bytes' budget is spent once its time is. */
static void pass_look(struct event_base *base)
{
	struct timeval now;
	if (event_base_gettimeofday_cached(base, &now) == 0 &&
	    (now.tv_sec != pass.tv.tv_sec || now.tv_usec != pass.tv.tv_usec)) {
		pass.tv = now;
		pass.used = 0;
		pass.cold = 0;
		pass.steps = 0;
		pass.releases = 0;
		clock_gettime(CLOCK_MONOTONIC, &pass.t0);
	} else if (pass.used < PASS_BYTES && pass_ran() >= PASS_NS) {
		pass.used = PASS_BYTES;
	}
}

size_t tw__pass_allow(struct event_base *base, size_t want)
{
	size_t left, most = atomic_load_explicit(&test_cap, memory_order_relaxed);
	if (most != 0 && want > most)
		want = most;
	pass_look(base);
	pass.cut = 0; /* a comm starts its turn uncut */
	left = pass.used < PASS_BYTES ? PASS_BYTES - pass.used : 0;
	if (left < PASS_MIN)
		left = PASS_MIN;
	return want < left ? want : left;
}

/* One unit of costly work of a kind counted by *started: while the
 * pass's time is not spent, and the pass's first always. */
static int pass_unit(struct event_base *base, unsigned *started)
{
	pass_look(base); /* a new pass zeroes the counts */
	if (*started > 0 && pass.used >= PASS_BYTES)
		return 0;
	++*started;
	return 1;
}

int tw__pass_step(struct event_base *base)
{
	return pass_unit(base, &pass.steps);
}

uint32_t tw__pass_lag_ms(struct event_base *base)
{
	struct timeval cached, now;
	long long lag;
	if (event_base_gettimeofday_cached(base, &cached) != 0)
		return 0;
	evutil_gettimeofday(&now, NULL);
	lag = (long long)(now.tv_sec - cached.tv_sec) * 1000 +
	      (now.tv_usec - cached.tv_usec) / 1000;
	return lag > 0 && lag < 86400000 ? (uint32_t)lag : 0;
}

int tw__pass_release(struct event_base *base)
{
	return pass_unit(base, &pass.releases);
}

size_t tw__pass_spent(size_t left, size_t n)
{
	pass.used += n;
	if (pass.cut) {
		pass.cut = 0;
		return 0;
	}
	if (pass.used < PASS_BYTES && pass_ran() >= PASS_NS)
		pass.used = PASS_BYTES; /* the others get their minimum */
	if (pass.used >= PASS_BYTES && left > PASS_MIN && n > 0)
		return 0; /* the pass is spent: only minimums go on */
	return n < left ? left - n : 0;
}

size_t tw__pass_cold(size_t want)
{
	size_t left = pass.cold < COLD_BYTES ? COLD_BYTES - pass.cold : 0;
	if (!pass.open)
		return want;
	if (left < COLD_MIN)
		left = COLD_MIN;
	if (want > left) {
		want = left;
		pass.cut = 1;
	}
	pass.cold += want;
	return want;
}

size_t tw__pass_read(struct event_base *base, size_t want)
{
	size_t n = tw__pass_allow(base, want);
	pass.open = 1;
	return n;
}

void tw__pass_close(void)
{
	pass.open = 0;
}

void tw__pass_cap(size_t bytes)
{
	atomic_store_explicit(&test_cap, bytes, memory_order_relaxed);
}

void tw__pass_spend(int on)
{
	atomic_store_explicit(&test_spent, on, memory_order_relaxed);
}

int tw__iov_cap(struct iovec *iov, int k, size_t cap)
{
	for (int i = 0; i < k; i++) {
		if (iov[i].iov_len >= cap) {
			iov[i].iov_len = cap;
			return i + 1;
		}
		cap -= iov[i].iov_len;
	}
	return k;
}
