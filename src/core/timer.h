/* SPDX-License-Identifier: BSD-3-Clause */
/* Timers that leave the loop's sleep alone: a one-shot timer at an
 * absolute CLOCK_MONOTONIC time, kept on a timerfd that the loop watches
 * like a socket. While a libevent timer is pending, every epoll_wait of
 * the loop takes a timeout, and the kernel arms and cancels a timer of
 * its own on each wakeup: 0.4 us per round trip of a small RPC (the raw
 * epoll client of bench/rpc-peers.c, p50 14.9 us with no timeout and
 * 15.3 us with one). A timerfd costs a system call when it is armed
 * instead, which the pool does once per deadline that comes sooner, not
 * once per call. For timers that stay pending for long: a pool's call
 * deadlines and its idle sweep. */
#ifndef TW_CORE_TIMER_H
#define TW_CORE_TIMER_H

#include <stdint.h>

struct event;
struct event_base;

struct tw__timer {
	struct event *ev;
	int fd;         /* the timerfd */
	uint64_t at_ms; /* when it fires (CLOCK_MONOTONIC ms); 0: not armed */
	void (*cb)(void *arg);
	void *arg;
};

/* tw__timer_init: an unarmed timer on base that calls cb(arg) on the
 * loop thread when it fires. Returns 0, or TW_EIO when the system refuses
 * a timerfd (out of descriptors) or libevent its event. */
int tw__timer_init(struct tw__timer *t, struct event_base *base, void (*cb)(void *arg), void *arg);

/* tw__timer_arm: fire at at_ms, CLOCK_MONOTONIC in milliseconds (a time
 * already past fires at once, on the next loop turn), replacing any
 * earlier arming. */
void tw__timer_arm(struct tw__timer *t, uint64_t at_ms);

/* Stop and release it; a timer whose init failed is fine too. */
void tw__timer_fini(struct tw__timer *t);

#endif
