/* SPDX-License-Identifier: BSD-3-Clause */
/* Driving a test's own event_base: every suite's waits go through
 * ts_run_until, which fails a wait only after `ms` with no progress of
 * any comm of the process (tw_stats_global), so a loaded machine or
 * valgrind makes a test slower, never wrong. No test asserts on time. */
#ifndef TW_TESTS_SUPPORT_LOOP_H
#define TW_TESTS_SUPPORT_LOOP_H

#include <stdint.h>

#include <event2/event.h>

/* CLOCK_MONOTONIC in milliseconds. */
long long ts_now_ms(void);
/* Sleep ms milliseconds (between polls of something outside the loop). */
void ts_sleep_ms(int ms);

/* Blocks live in the whole process (tw_stats_global's blocks_live): a
 * test takes it before and asserts it is back after its comms are gone. */
uint64_t ts_blocks_live(void);

/* TW_TEST_QUICK=1 (valgrind runs): big tests shrink. */
int ts_quick(void);

/* The Check timeout (seconds) of a test case that moves a lot of data:
 * s on a plain build, 3 * s under AddressSanitizer or ThreadSanitizer
 * (every copy and hash of the payload is checked: several times slower;
 * CK_TIMEOUT_MULTIPLIER still scales the result). Valgrind runs do not
 * fork, so Check enforces no timeout there. Waits inside a test restart
 * on progress; this is only the guard against a test stuck elsewhere. */
int ts_data_timeout_s(int s);

/* 1 under AddressSanitizer or ThreadSanitizer: their allocators map
 * more address space than they hand out (size classes, quarantine), so
 * bounds on VmData scale with this. */
int ts_sanitized(void);

/* Bytes and messages moved by every comm of the process so far: while
 * this changes, a wait is slow, not stuck. */
uint64_t ts_progress(void);

/* A persistent no-op timer every ms on base, so that one
 * event_base_loop(EVLOOP_ONCE) returns and a wait checks its deadline.
 * Free it with event_free. Asserts on failure. */
struct event *ts_tick_new(struct event_base *base, int ms);

/* Drive base until pred(arg) is true (returns 1) or ms pass with no
 * ts_progress (0). */
int ts_run_until(struct event_base *base, int (*pred)(void *arg), void *arg, int ms);
/* Drive base until *flag != 0; returns *flag != 0. */
int ts_wait_flag(struct event_base *base, const int *flag, int ms);
/* Drive base for about ms milliseconds. */
void ts_run_for(struct event_base *base, int ms);

#endif
