/* SPDX-License-Identifier: BSD-3-Clause */
/* A harness for tests with real Dask peers (tests/check_dask.c) and for
 * decode tests over loopback comms (tests/check_serial.c).
 *
 * Child processes: each peer runs in a process group of its own, with its
 * stdout and stderr in a log file, and dies with the process that started
 * it (PR_SET_PDEATHSIG), so a test killed at its timeout leaves nothing
 * behind. du_stop kills the group and reaps it; an atexit handler stops
 * whatever the starting process did not.
 *
 * Loop: one context on an event_base that the test drives itself
 * (du_run_until), with a tick so every wait checks its deadline. Deadlines
 * only bound waits; no test asserts on time. */
#ifndef TW_TESTS_DASK_UTIL_H
#define TW_TESTS_DASK_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <taskwire/taskwire.h>

/* Hang guards: a wait that sees no progress for this long means the test
 * failed (du_run_until restarts it whenever comms move bytes). */
#define DU_WAIT_MS  60000
#define DU_START_MS 60000

/* The Python with Debian's python3-distributed (not the first on PATH). */
#define DU_PYTHON "/usr/bin/python3"

/* Child processes. */

struct du_proc {
	pid_t pid;     /* 0 when not running */
	pid_t owner;   /* the process that started it */
	char log[256]; /* its stdout and stderr */
	int status;    /* wait status, once reaped */
	int exited;
};

/* Start argv[0] (a path) with argv, in its own process group, with the
 * environment plus env_add ("NAME=value" strings, NULL-terminated, may be
 * NULL). Returns 0 or -1. */
int du_spawn(struct du_proc *p, char *const argv[], char *const env_add[]);

/* Wait until the log has a line containing `marker`; copy the first
 * whitespace-delimited word after it into out. Returns 1, or 0 when the
 * process exited or ms passed first. */
int du_wait_log(struct du_proc *p, const char *marker, char *out, size_t len, int ms);

/* Wait for the process to exit by itself (status in p->status). Returns 1
 * when it did, 0 at the deadline. */
int du_wait_exit(struct du_proc *p, int ms);

/* SIGTERM to the group, a grace period, then SIGKILL; reap; remove the log.
 * Accepts a stopped or never-started p. */
void du_stop(struct du_proc *p);

/* The last `len - 1` bytes of the log, for failure messages. */
const char *du_log_tail(const struct du_proc *p, char *buf, size_t len);

/* $TW_TOP_SRCDIR/tests/interop/name into buf. */
void du_script(const char *name, char *buf, size_t len);

/* A loop driven by the test. */

struct du_loop {
	struct event_base *base;
	tw_context *ctx;
	struct event *tick;
};

void du_loop_init(struct du_loop *l);
void du_loop_fini(struct du_loop *l);

/* Drive the loop until pred(arg) (returns 1) or ms pass (0). */
int du_run_until(struct du_loop *l, int (*pred)(void *arg), void *arg, int ms);
/* Drive the loop until *flag != 0; returns *flag != 0. */
int du_wait_flag(struct du_loop *l, const int *flag, int ms);

/* A taskwire client comm, after the Dask handshake, that keeps every
 * message it receives. */

struct du_client {
	struct du_loop *loop;
	tw_comm *comm;
	int done;             /* connect and handshake finished */
	int err;              /* their result */
	char compression[16]; /* negotiated, "" for none */
	char peer_compression[16];
	int pickle_protocol;
	tw_msg **msgs; /* received, held */
	size_t nmsgs, cap;
	int closed, close_err;
	char last_error[256]; /* tw_comm_last_error at close */
};

/* Connect to uri and do the handshake. Returns the error (0 on success)
 * and sets *out either way (free it with du_client_free). */
int du_client_open(struct du_loop *l, const char *uri, struct du_client **out);
/* Write msg (taken; freed on failure). Returns the tw_comm_write code. */
int du_client_write(struct du_client *c, tw_msg *msg);
/* The i-th received message, waiting for it; NULL at the deadline or when
 * the comm ended first. */
tw_msg *du_client_msg(struct du_client *c, size_t i, int ms);
void du_client_free(struct du_client *c);

/* Raw POSIX client for bad peers. */

/* Blocking connect to "tcp://host:port"; returns the fd or -1. */
int du_raw_connect(const char *uri);
/* Send n bytes, driving the loop while the socket is full. Returns 0, or
 * -1 when the peer closed first. */
int du_raw_send(struct du_loop *l, int fd, const void *p, size_t n);
/* Drive the loop until one whole stream message arrives on fd; its frames
 * go into *out (a new message). Returns 0, or -1 on EOF or after ms
 * without a byte. */
int du_raw_recv_msg(struct du_loop *l, int fd, tw_msg **out, int ms);
/* Drive the loop until fd sees EOF (or ECONNRESET): returns 1, else 0
 * (data arrived instead, or the deadline passed). */
int du_raw_wait_eof(struct du_loop *l, int fd, int ms);

/* The stream encoding of msg (prelude and frames), malloc'd. */
uint8_t *du_encode(const tw_msg *msg, size_t *len);

/* Fill p with the pattern byte i = (i + seed) % 251; check it (returns the
 * first offset that differs, or -1). */
void du_fill(uint8_t *p, size_t n, unsigned seed);
long long du_check(const uint8_t *p, size_t n, unsigned seed);

#endif
