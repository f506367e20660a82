/* SPDX-License-Identifier: BSD-3-Clause */
/* The real-peer test harness (tests/dask_util.h). */
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <check.h>
#include <event2/event.h>

#include "tests/dask_util.h"

#define TICK_MS   10
#define MAX_PROCS 16
#define GRACE_MS  5000

extern char **environ;

static long long now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sleep_ms(int ms)
{
	struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000};
	nanosleep(&ts, NULL);
}

/* Child processes. */

static struct du_proc *live[MAX_PROCS];

static void stop_all(void)
{
	for (int i = 0; i < MAX_PROCS; i++)
		if (live[i] != NULL && live[i]->owner == getpid())
			du_stop(live[i]);
}

static void track(struct du_proc *p)
{
	static int registered;
	if (!registered) {
		atexit(stop_all);
		registered = 1;
	}
	for (int i = 0; i < MAX_PROCS; i++)
		if (live[i] == NULL) {
			live[i] = p;
			return;
		}
}

static void untrack(struct du_proc *p)
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
	int fd = open(log, O_WRONLY | O_TRUNC);
	setpgid(0, 0);
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	if (getppid() != parent || fd < 0)
		_exit(127);
	dup2(fd, STDOUT_FILENO);
	dup2(fd, STDERR_FILENO);
	close(fd);
	execve(argv[0], argv, env);
	_exit(127);
}

int du_spawn(struct du_proc *p, char *const argv[], char *const env_add[])
{
	const char *tmp = getenv("TMPDIR");
	pid_t parent = getpid();
	char **env;
	int fd;
	memset(p, 0, sizeof(*p));
	snprintf(p->log, sizeof(p->log), "%s/tw-dask-XXXXXX", tmp != NULL ? tmp : "/tmp");
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
static int reaped(struct du_proc *p)
{
	if (p->exited)
		return 1;
	if (p->pid > 0 && waitpid(p->pid, &p->status, WNOHANG) == p->pid)
		p->exited = 1;
	return p->exited;
}

/* 1 when the process has exited, without reaping it (its pid and group id
 * stay reserved until waitpid). */
static int ended(const struct du_proc *p)
{
	siginfo_t si;
	if (p->exited)
		return 1;
	memset(&si, 0, sizeof(si));
	return waitid(P_PID, p->pid, &si, WEXITED | WNOHANG | WNOWAIT) == 0 && si.si_pid == p->pid;
}

/* Find marker in the log; copy the next word into out. */
static int scan_log(const struct du_proc *p, const char *marker, char *out, size_t len)
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

int du_wait_log(struct du_proc *p, const char *marker, char *out, size_t len, int ms)
{
	long long deadline = now_ms() + ms;
	while (now_ms() < deadline) {
		if (scan_log(p, marker, out, len))
			return 1;
		if (ended(p))
			return scan_log(p, marker, out, len);
		sleep_ms(20);
	}
	return 0;
}

int du_wait_exit(struct du_proc *p, int ms)
{
	long long deadline = now_ms() + ms;
	while (!reaped(p)) {
		if (now_ms() > deadline)
			return 0;
		sleep_ms(20);
	}
	return 1;
}

void du_stop(struct du_proc *p)
{
	if (p->pid > 0 && !p->exited) {
		long long deadline = now_ms() + GRACE_MS;
		kill(-p->pid, SIGTERM);
		while (!ended(p) && now_ms() < deadline)
			sleep_ms(20);
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

const char *du_log_tail(const struct du_proc *p, char *buf, size_t len)
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

void du_script(const char *name, char *buf, size_t len)
{
	const char *top = getenv("TW_TOP_SRCDIR");
	snprintf(buf, len, "%s/tests/interop/%s", top != NULL ? top : ".", name);
}

/* The loop. */

static void on_tick(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	(void)arg;
}

void du_loop_init(struct du_loop *l)
{
	struct timeval tv = {0, TICK_MS * 1000};
	memset(l, 0, sizeof(*l));
	signal(SIGPIPE, SIG_IGN); /* the raw client writes to closed sockets */
	l->base = event_base_new();
	ck_assert_ptr_nonnull(l->base);
	ck_assert_int_eq(tw_context_new(l->base, &l->ctx), 0);
	l->tick = event_new(l->base, -1, EV_PERSIST, on_tick, NULL);
	ck_assert_ptr_nonnull(l->tick);
	event_add(l->tick, &tv);
}

void du_loop_fini(struct du_loop *l)
{
	tw_context_free(l->ctx);
	event_free(l->tick);
	event_base_free(l->base);
	memset(l, 0, sizeof(*l));
}

/* Bytes and messages moved by every comm of the process: while this
 * changes, a wait is slow (a loaded machine, valgrind), not stuck. */
static uint64_t progress(void)
{
	tw_stats st;
	tw_stats_global(&st);
	return st.bytes_sent + st.bytes_received + st.msgs_sent + st.msgs_received;
}

int du_run_until(struct du_loop *l, int (*pred)(void *arg), void *arg, int ms)
{
	long long deadline = now_ms() + ms;
	uint64_t seen = progress();
	while (!pred(arg)) {
		uint64_t io = progress();
		if (io != seen) {
			seen = io;
			deadline = now_ms() + ms;
		} else if (now_ms() > deadline) {
			return 0;
		}
		event_base_loop(l->base, EVLOOP_ONCE);
	}
	return 1;
}

static int flag_set(void *arg)
{
	return *(const int *)arg != 0;
}

int du_wait_flag(struct du_loop *l, const int *flag, int ms)
{
	return du_run_until(l, flag_set, (void *)flag, ms);
}

/* The client comm. */

static void on_recv(tw_comm *comm, tw_msg *msg, void *arg)
{
	struct du_client *c = arg;
	(void)comm;
	if (c->nmsgs == c->cap) {
		c->cap = c->cap ? 2 * c->cap : 8;
		c->msgs = realloc(c->msgs, c->cap * sizeof(*c->msgs));
		if (c->msgs == NULL)
			abort();
	}
	c->msgs[c->nmsgs++] = tw_msg_hold(msg);
}

static void on_close(tw_comm *comm, int err, void *arg)
{
	struct du_client *c = arg;
	snprintf(c->last_error, sizeof(c->last_error), "%s", tw_comm_last_error(comm));
	c->close_err = err;
	c->closed = 1;
}

static void copy_name(char *dst, size_t len, const char *s)
{
	snprintf(dst, len, "%s", s != NULL ? s : "");
}

static void on_handshake(tw_comm *comm, int err, const tw_handshake_info *info, void *arg)
{
	struct du_client *c = arg;
	if (err == 0) {
		copy_name(c->compression, sizeof(c->compression), info->compression);
		copy_name(c->peer_compression, sizeof(c->peer_compression), info->peer_compression);
		c->pickle_protocol = info->pickle_protocol;
		err = tw_comm_set_callbacks(comm, on_recv, on_close, NULL, c);
	} else {
		snprintf(c->last_error, sizeof(c->last_error), "%s", tw_comm_last_error(comm));
	}
	c->err = err;
	c->done = 1;
}

static void on_connect(tw_comm *comm, int err, void *arg)
{
	struct du_client *c = arg;
	c->comm = comm;
	if (err == 0 && (err = tw_comm_handshake(comm, 0, on_handshake, c)) == 0)
		return;
	c->err = err;
	c->done = 1;
}

int du_client_open(struct du_loop *l, const char *uri, struct du_client **out)
{
	struct du_client *c = calloc(1, sizeof(*c));
	int rv;
	ck_assert_ptr_nonnull(c);
	c->loop = l;
	*out = c;
	if ((rv = tw_connect(l->ctx, uri, on_connect, c)) != 0)
		return rv;
	if (!du_wait_flag(l, &c->done, DU_WAIT_MS))
		return TW_ETIMEDOUT;
	return c->err;
}

int du_client_write(struct du_client *c, tw_msg *msg)
{
	int rv = c->comm != NULL ? tw_comm_write(c->comm, msg) : TW_ECLOSED;
	if (rv != 0)
		tw_msg_free(msg);
	return rv;
}

struct msg_wait {
	struct du_client *c;
	size_t n;
};

static int has_msg(void *arg)
{
	struct msg_wait *w = arg;
	return w->c->nmsgs >= w->n || w->c->closed;
}

tw_msg *du_client_msg(struct du_client *c, size_t i, int ms)
{
	struct msg_wait w = {c, i + 1};
	du_run_until(c->loop, has_msg, &w, ms);
	return i < c->nmsgs ? c->msgs[i] : NULL;
}

void du_client_free(struct du_client *c)
{
	if (c == NULL)
		return;
	for (size_t i = 0; i < c->nmsgs; i++)
		tw_msg_free(c->msgs[i]);
	free(c->msgs);
	tw_comm_free(c->comm);
	free(c);
}

/* Raw client. */

int du_raw_connect(const char *uri)
{
	char host[128], *colon;
	struct addrinfo hints = {0}, *ai;
	int fd = -1;
	if (strncmp(uri, "tcp://", 6) != 0 || strlen(uri + 6) >= sizeof(host))
		return -1;
	strcpy(host, uri + 6);
	if ((colon = strrchr(host, ':')) == NULL)
		return -1;
	*colon = '\0';
	hints.ai_socktype = SOCK_STREAM;
	if (getaddrinfo(host, colon + 1, &hints, &ai) != 0)
		return -1;
	fd = socket(ai->ai_family, SOCK_STREAM, 0);
	if (fd >= 0 && connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
		close(fd);
		fd = -1;
	}
	freeaddrinfo(ai);
	if (fd >= 0)
		fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
	return fd;
}

int du_raw_send(struct du_loop *l, int fd, const void *p, size_t n)
{
	const uint8_t *b = p;
	long long deadline = now_ms() + DU_WAIT_MS;
	while (n > 0 && now_ms() < deadline) {
		ssize_t w = send(fd, b, n, MSG_NOSIGNAL);
		if (w > 0) {
			b += w;
			n -= (size_t)w;
			deadline = now_ms() + DU_WAIT_MS; /* a hang guard: slow is not stuck */
		} else if (w < 0 && errno != EAGAIN && errno != EINTR) {
			return -1;
		} else {
			event_base_loop(l->base, EVLOOP_ONCE | EVLOOP_NONBLOCK);
		}
	}
	return n == 0 ? 0 : -1;
}

/* Read exactly n bytes into p, driving the loop while none are there;
 * -1 after ms without a byte. */
static int raw_read(struct du_loop *l, int fd, void *p, size_t n, int ms)
{
	uint8_t *b = p;
	long long deadline = now_ms() + ms;
	while (n > 0) {
		ssize_t r = recv(fd, b, n, 0);
		if (r > 0) {
			b += r;
			n -= (size_t)r;
			deadline = now_ms() + ms;
		} else if (r == 0 || (errno != EAGAIN && errno != EINTR) || now_ms() > deadline) {
			return -1;
		} else {
			event_base_loop(l->base, EVLOOP_ONCE);
		}
	}
	return 0;
}

static uint64_t le64(const uint8_t *p)
{
	uint64_t v;
	memcpy(&v, p, 8);
	return le64toh(v);
}

static int raw_frames(struct du_loop *l, int fd, uint64_t n, tw_msg *m, int ms)
{
	uint8_t word[8];
	uint64_t *lens = calloc(n, sizeof(*lens));
	int rv = lens != NULL ? 0 : -1;
	for (uint64_t i = 0; rv == 0 && i < n; i++)
		if ((rv = raw_read(l, fd, word, 8, ms)) == 0)
			lens[i] = le64(word);
	for (uint64_t i = 0; rv == 0 && i < n; i++) {
		uint8_t *buf = malloc(lens[i] ? lens[i] : 1);
		rv = buf != NULL ? raw_read(l, fd, buf, lens[i], ms) : -1;
		if (rv == 0)
			rv = tw_msg_append_copy(m, buf, lens[i]) == 0 ? 0 : -1;
		free(buf);
	}
	free(lens);
	return rv;
}

int du_raw_recv_msg(struct du_loop *l, int fd, tw_msg **out, int ms)
{
	uint8_t head[16];
	tw_msg *m;
	uint64_t n;
	if (raw_read(l, fd, head, 16, ms) != 0)
		return -1;
	n = le64(head + 8);
	if (n == 0 || n > 1024 || tw_msg_new(&m) != 0)
		return -1;
	if (raw_frames(l, fd, n, m, ms) != 0) {
		tw_msg_free(m);
		return -1;
	}
	*out = m;
	return 0;
}

int du_raw_wait_eof(struct du_loop *l, int fd, int ms)
{
	long long deadline = now_ms() + ms;
	uint8_t b;
	while (now_ms() < deadline) {
		ssize_t r = recv(fd, &b, 1, 0);
		if (r == 0 || (r < 0 && errno == ECONNRESET))
			return 1;
		if (r > 0 || (errno != EAGAIN && errno != EINTR))
			return 0;
		event_base_loop(l->base, EVLOOP_ONCE);
	}
	return 0;
}

static void put_le64(uint8_t *p, uint64_t v)
{
	v = htole64(v);
	memcpy(p, &v, 8);
}

uint8_t *du_encode(const tw_msg *msg, size_t *len)
{
	size_t n = tw_msg_nframes(msg), off = 16 + 8 * n;
	size_t total = off + (size_t)tw_msg_bytes(msg);
	uint8_t *p = malloc(total);
	if (p == NULL)
		return NULL;
	put_le64(p, total - 8);
	put_le64(p + 8, n);
	for (size_t i = 0; i < n; i++) {
		const tw_slice *f = tw_msg_frame(msg, i);
		put_le64(p + 16 + 8 * i, f->len);
		if (f->len > 0)
			memcpy(p + off, tw_slice_data(f), f->len);
		off += f->len;
	}
	*len = total;
	return p;
}

void du_fill(uint8_t *p, size_t n, unsigned seed)
{
	uint8_t period[251];
	size_t i;
	for (i = 0; i < 251; i++)
		period[i] = (uint8_t)((i + seed) % 251);
	for (i = 0; i + 251 <= n; i += 251)
		memcpy(p + i, period, 251);
	if (i < n)
		memcpy(p + i, period, n - i);
}

long long du_check(const uint8_t *p, size_t n, unsigned seed)
{
	uint8_t period[251];
	size_t i;
	for (i = 0; i < 251; i++)
		period[i] = (uint8_t)((i + seed) % 251);
	for (i = 0; i < n; i += 251) {
		size_t k = n - i < 251 ? n - i : 251;
		if (memcmp(p + i, period, k) != 0)
			for (size_t j = 0; j < k; j++)
				if (p[i + j] != period[j])
					return (long long)(i + j);
	}
	return -1;
}
