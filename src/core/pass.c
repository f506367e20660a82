/* SPDX-License-Identifier: BSD-3-Clause */
#include "core/pass.h"

#include <event2/event.h>
#include <sys/time.h>

/* About a millisecond of copying per pass for all comms together, and a
 * minimum per comm so that a small message is never held back. */
#define PASS_BYTES ((size_t)4 << 20)
#define PASS_MIN   ((size_t)64 << 10)

/* One loop per thread: the pass is the thread's. */
static _Thread_local struct {
	struct timeval tv;
	size_t used;
} pass;

size_t tw__pass_allow(struct event_base *base, size_t want)
{
	struct timeval now;
	size_t left;
	if (event_base_gettimeofday_cached(base, &now) == 0 &&
	    (now.tv_sec != pass.tv.tv_sec || now.tv_usec != pass.tv.tv_usec)) {
		pass.tv = now;
		pass.used = 0;
	}
	left = pass.used < PASS_BYTES ? PASS_BYTES - pass.used : 0;
	if (left < PASS_MIN)
		left = PASS_MIN;
	return want < left ? want : left;
}

void tw__pass_spent(size_t n)
{
	pass.used += n;
}
