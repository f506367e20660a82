/* SPDX-License-Identifier: BSD-3-Clause */
/* Timers on a timerfd (core/timer.h; timerfd_create(2)). */
#include <stdint.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>

#include <taskwire/error.h>

#include "core/context.h"
#include "core/timer.h"

static void set(struct tw__timer *t, uint64_t at_ms)
{
	struct itimerspec its = {{0, 0}, {0, 0}}; /* no interval: one shot */
	its.it_value.tv_sec = (time_t)(at_ms / 1000);
	its.it_value.tv_nsec = (long)(at_ms % 1000) * 1000000;
	/* cannot fail: our fd, a valid time */
	timerfd_settime(t->fd, TFD_TIMER_ABSTIME, &its, NULL);
	t->at_ms = at_ms;
}

static void on_fire(evutil_socket_t fd, short what, void *arg)
{
	struct tw__timer *t = arg;
	uint64_t expirations;
	(void)what;
	/* clears the readiness; EAGAIN when a re-arm came after it fired */
	if (read(fd, &expirations, sizeof(expirations)) != (ssize_t)sizeof(expirations))
		return;
	t->at_ms = 0;
	t->cb(t->arg);
}

int tw__timer_init(struct tw__timer *t, struct event_base *base, void (*cb)(void *arg), void *arg)
{
	t->at_ms = 0;
	t->cb = cb;
	t->arg = arg;
	t->ev = NULL;
	t->fd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
	if (t->fd < 0)
		return TW_EIO;
	t->ev = event_new(base, t->fd, EV_READ | EV_PERSIST, on_fire, t);
	if (t->ev == NULL || event_add(t->ev, NULL) != 0) {
		tw__event_free(t->ev);
		close(t->fd);
		t->ev = NULL;
		return TW_EIO;
	}
	return 0;
}

void tw__timer_arm(struct tw__timer *t, uint64_t at_ms)
{
	set(t, at_ms != 0 ? at_ms : 1); /* 0 would disarm; 1 ms after boot is past */
}

void tw__timer_fini(struct tw__timer *t)
{
	if (t->ev == NULL)
		return;
	event_free(t->ev);
	close(t->fd);
	t->ev = NULL;
	t->at_ms = 0;
}
