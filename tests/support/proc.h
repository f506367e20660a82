/* SPDX-License-Identifier: BSD-3-Clause */
/* Child processes for the suites' real peers (Python with Debian's
 * python3-distributed, shell scripts).
 *
 * Each child runs in a process group of its own, with its stdout and
 * stderr in a log file under $TMPDIR, and dies with the process that
 * started it (PR_SET_PDEATHSIG), so a test killed at its timeout leaves
 * nothing behind. ts_proc_stop kills the group and reaps it; an atexit
 * handler stops whatever the starting process did not. Until a child is
 * reaped its pid and group id stay reserved (waitid WNOWAIT), so a kill of
 * the group never reaches a recycled one. TW_KEEP_LOGS=1 keeps the logs. */
#ifndef TW_TESTS_SUPPORT_PROC_H
#define TW_TESTS_SUPPORT_PROC_H

#include <stddef.h>
#include <sys/types.h>

#include <event2/event.h>

/* The Python with Debian's python3-distributed (not the first on PATH). */
#define TS_PYTHON "/usr/bin/python3"

/* Hang guard for a peer's start (importing distributed takes seconds). */
#define TS_START_MS 60000

struct ts_proc {
	pid_t pid;     /* 0 when not running */
	pid_t owner;   /* the process that started it */
	char log[256]; /* its stdout and stderr */
	int status;    /* wait status, once reaped */
	int exited;
};

/* Start argv[0] (a path) with argv, with the environment plus env_add
 * ("NAME=value" strings, NULL-terminated, may be NULL). Returns 0 or -1. */
int ts_spawn(struct ts_proc *p, char *const argv[], char *const env_add[]);

/* Wait until the log has a line containing marker; copy the first word
 * after it into out. base (may be NULL) is driven while waiting, so comms
 * of the test keep moving. Returns 1, or 0 when the process exited or
 * went ms without moving (no log output, no CPU time) first. */
int ts_proc_wait_log(struct ts_proc *p, struct event_base *base, const char *marker, char *out,
		     size_t len, int ms);

/* Wait for the process to exit by itself (status in p->status), driving
 * base (may be NULL). Returns 1 when it did, 0 when it went ms without
 * moving (no log output, no CPU time). */
int ts_proc_wait_exit(struct ts_proc *p, struct event_base *base, int ms);

/* SIGTERM to the group, a grace period, then SIGKILL; reap; remove the
 * log. Accepts a stopped or never-started p. */
void ts_proc_stop(struct ts_proc *p);
/* Stop every process this process started and did not stop (a checked
 * fixture's teardown). */
void ts_proc_stop_all(void);

/* The last len - 1 bytes of the log, for failure messages. */
const char *ts_proc_log_tail(const struct ts_proc *p, char *buf, size_t len);

/* $TW_TOP_SRCDIR/tests/interop/name into buf. */
void ts_script(const char *name, char *buf, size_t len);

#endif
