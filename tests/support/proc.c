/* SPDX-License-Identifier: BSD-3-Clause */
/* Child processes for real peers (tests/support/proc.h). */
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <check.h>

#include "tests/support/loop.h"
#include "tests/support/proc.h"

#define MAX_PROCS     16
#define GRACE_MS      5000
#define POLL_MS       20
#define EXIT_SLICE_MS 1000

extern char **environ;

static struct ts_proc *live[MAX_PROCS];

void ts_proc_stop_all(void)
{
	for (int i = 0; i < MAX_PROCS; i++)
		if (live[i] != NULL && live[i]->owner == getpid())
			ts_proc_stop(live[i]);
}

static void track(struct ts_proc *p)
{
	static int registered;
	if (!registered) {
		atexit(ts_proc_stop_all);
		registered = 1;
	}
	for (int i = 0; i < MAX_PROCS; i++)
		if (live[i] == NULL) {
			live[i] = p;
			return;
		}
	ck_abort_msg("more than %d child processes", MAX_PROCS);
}

static void untrack(struct ts_proc *p)
{
	for (int i = 0; i < MAX_PROCS; i++)
		if (live[i] == p)
			live[i] = NULL;
}

/* The environment plus env_add, for execve. */
static char **make_env(char *const env_add[])
{
	size_t n = 0, k = 0, i;
	char **env;
	while (environ[n] != NULL)
		n++;
	while (env_add != NULL && env_add[k] != NULL)
		k++;
	if ((env = calloc(n + k + 1, sizeof(*env))) == NULL)
		return NULL;
	for (i = 0; i < n; i++)
		env[i] = environ[i];
	for (i = 0; i < k; i++)
		env[n + i] = env_add[i];
	return env;
}

static void child(const char *log, pid_t parent, char *const argv[], char **env)
{
	int fd = open(log, O_WRONLY | O_TRUNC), nul = open("/dev/null", O_RDONLY);
	setpgid(0, 0);
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	if (getppid() != parent || fd < 0 || nul < 0)
		_exit(127);
	dup2(nul, STDIN_FILENO);
	dup2(fd, STDOUT_FILENO);
	dup2(fd, STDERR_FILENO);
	close(fd);
	close(nul);
	execve(argv[0], argv, env);
	_exit(127);
}

int ts_spawn(struct ts_proc *p, char *const argv[], char *const env_add[])
{
	const char *tmp = getenv("TMPDIR");
	pid_t parent = getpid();
	char **env;
	int fd;
	memset(p, 0, sizeof(*p));
	snprintf(p->log, sizeof(p->log), "%s/tw-peer-XXXXXX", tmp != NULL ? tmp : "/tmp");
	if ((fd = mkstemp(p->log)) < 0)
		return -1;
	close(fd);
	if ((env = make_env(env_add)) == NULL)
		return -1;
	fflush(NULL);
	p->pid = fork();
	if (p->pid == 0)
		child(p->log, parent, argv, env);
	free(env);
	if (p->pid < 0) {
		p->pid = 0;
		unlink(p->log);
		return -1;
	}
	setpgid(p->pid, p->pid); /* also here, so a kill right away finds the group */
	p->owner = parent;
	track(p);
	return 0;
}

/* Reap without blocking; 1 when the process is gone. */
static int reaped(struct ts_proc *p)
{
	if (p->exited)
		return 1;
	if (p->pid > 0 && waitpid(p->pid, &p->status, WNOHANG) == p->pid)
		p->exited = 1;
	return p->exited;
}

/* 1 when the process has exited, without reaping it (its pid and group id
 * stay reserved until waitpid). */
static int ended(const struct ts_proc *p)
{
	siginfo_t si;
	if (p->exited)
		return 1;
	memset(&si, 0, sizeof(si));
	return waitid(P_PID, p->pid, &si, WEXITED | WNOHANG | WNOWAIT) == 0 && si.si_pid == p->pid;
}

/* Find marker in the log; copy the next word into out. */
static int scan_log(const struct ts_proc *p, const char *marker, char *out, size_t len)
{
	char line[4096];
	int found = 0;
	FILE *f = fopen(p->log, "r");
	if (f == NULL)
		return 0;
	while (!found && fgets(line, sizeof(line), f) != NULL) {
		char *at = strstr(line, marker);
		size_t n;
		if (at == NULL || strchr(line, '\n') == NULL)
			continue;
		at += strlen(marker);
		at += strspn(at, " \t");
		n = strcspn(at, " \t\r\n");
		if (n == 0 || n >= len)
			continue;
		memcpy(out, at, n);
		out[n] = '\0';
		found = 1;
	}
	fclose(f);
	return found;
}

/* Poll done(arg) every POLL_MS until it is true or ms pass: on base when
 * there is one (its tick returns the loop), else by sleeping. */
static int poll_until(struct event_base *base, int (*done)(void *arg), void *arg, int ms)
{
	long long deadline = ts_now_ms() + ms;
	if (base != NULL)
		return ts_run_until(base, done, arg, ms);
	while (!done(arg)) {
		if (ts_now_ms() > deadline)
			return 0;
		ts_sleep_ms(POLL_MS);
	}
	return 1;
}

struct log_wait {
	struct ts_proc *p;
	const char *marker;
	char *out;
	size_t len;
	int found;
};

static int log_ready(void *arg)
{
	struct log_wait *w = arg;
	w->found = scan_log(w->p, w->marker, w->out, w->len);
	if (!w->found && ended(w->p))
		w->found = scan_log(w->p, w->marker, w->out, w->len) ? 1 : -1;
	return w->found != 0;
}

static int is_reaped(void *arg)
{
	return reaped(arg);
}

static long long log_size(const struct ts_proc *p)
{
	struct stat st;
	return p->log[0] != '\0' && stat(p->log, &st) == 0 ? (long long)st.st_size : -1;
}

/* CPU time the process has used (utime + stime of /proc/PID/stat, in
 * clock ticks), -1 when unknown. */
static long long cpu_ticks(const struct ts_proc *p)
{
	char path[64], buf[1024];
	unsigned long long ut, st;
	const char *at;
	size_t n;
	FILE *f;
	snprintf(path, sizeof(path), "/proc/%d/stat", (int)p->pid);
	if ((f = fopen(path, "r")) == NULL)
		return -1;
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = '\0';
	/* after "pid (comm) ": state, then fields 4 to 13, utime, stime */
	if ((at = strrchr(buf, ')')) == NULL ||
	    sscanf(at + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) != 2)
		return -1;
	return (long long)(ut + st);
}

/* What shows a peer moving: its log's size and its CPU time. */
struct motion {
	long long log, cpu;
};

static struct motion motion_of(const struct ts_proc *p)
{
	struct motion m = {log_size(p), cpu_ticks(p)};
	return m;
}

/* Poll done(arg) until it is true, restarting the wait whenever the peer
 * moves (its log grows or it uses CPU): a loaded machine (distcheck
 * beside other builds at load 30, valgrind suites beside a Python peer
 * still importing distributed) slows a peer without failing it; ms
 * bounds a peer that has gone still. */
static int wait_moving(struct ts_proc *p, struct event_base *base, int (*done)(void *arg),
		       void *arg, int ms)
{
	struct motion seen = motion_of(p);
	int left = ms;
	while (left > 0) {
		int slice = left < EXIT_SLICE_MS ? left : EXIT_SLICE_MS;
		struct motion now;
		if (poll_until(base, done, arg, slice))
			return 1;
		now = motion_of(p);
		left = now.log != seen.log || now.cpu != seen.cpu ? ms : left - slice;
		seen = now;
	}
	return done(arg);
}

int ts_proc_wait_log(struct ts_proc *p, struct event_base *base, const char *marker, char *out,
		     size_t len, int ms)
{
	struct log_wait w = {p, marker, out, len, 0};
	wait_moving(p, base, log_ready, &w, ms);
	return w.found == 1;
}

int ts_proc_wait_exit(struct ts_proc *p, struct event_base *base, int ms)
{
	return wait_moving(p, base, is_reaped, p, ms);
}

static int has_ended(void *arg)
{
	return ended(arg);
}

void ts_proc_stop(struct ts_proc *p)
{
	if (p->pid > 0 && !p->exited) {
		kill(-p->pid, SIGTERM);
		poll_until(NULL, has_ended, p, GRACE_MS);
		kill(-p->pid, SIGKILL); /* a peer still running, or what it left in its group */
		waitpid(p->pid, &p->status, 0);
		p->exited = 1;
	}
	if (p->log[0] != '\0' && getenv("TW_KEEP_LOGS") == NULL)
		unlink(p->log);
	untrack(p);
	p->pid = 0;
	p->log[0] = '\0';
}

const char *ts_proc_log_tail(const struct ts_proc *p, char *buf, size_t len)
{
	FILE *f = fopen(p->log, "r");
	size_t n = 0;
	buf[0] = '\0';
	if (f == NULL)
		return buf;
	if (fseek(f, 0, SEEK_END) == 0) {
		long size = ftell(f);
		long from = size > (long)len - 1 ? size - ((long)len - 1) : 0;
		if (fseek(f, from, SEEK_SET) == 0)
			n = fread(buf, 1, len - 1, f);
	}
	buf[n] = '\0';
	fclose(f);
	return buf;
}

void ts_script(const char *name, char *buf, size_t len)
{
	const char *top = getenv("TW_TOP_SRCDIR");
	snprintf(buf, len, "%s/tests/interop/%s", top != NULL ? top : ".", name);
}
