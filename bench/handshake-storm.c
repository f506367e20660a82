/* SPDX-License-Identifier: BSD-3-Clause */
/* handshake-storm: does a storm of TLS handshakes stall a server's loop?
 * (issue 17, breaker17 b17-6).
 *
 *   handshake-storm [--clients N] [--rounds R] [TLS options] [SCHEME]
 *
 * Forks an echo server (one loop, SCHEME://127.0.0.1:0, default tls;
 * tcp, ws and wss too) whose loop runs a 1 ms timer: the longest
 * loop-thread CPU time between two ticks is its longest pass (CPU, not
 * wall: preemption on a loaded machine is not the loop's work). A canary
 * comm (a thread of this process, its own loop) echoes a 10-byte message
 * every 2 ms throughout. Each round, a forked client process (one loop)
 * starts N connects at once (default 200; mutual TLS with the TLS
 * options: scripts/make-test-certs.sh makes them), and each comm echoes
 * one small message. One line per round: how long until every comm had
 * its echo, the canary's latency p50/p99/max over that time (and over
 * the 0.5 s before, quiet), and the server loop's longest pass and how
 * many passed 5 ms. Beside them, what the machine did: how long the
 * canary's thread waited for a CPU during its slowest echo, and the
 * longest wall time between two of the server's ticks with the part of
 * it its loop's thread waited for a CPU (schedstat's run delay): a
 * canary p99 of 127.6 ms over 2,000 wss comms freed, while the server's
 * passes stayed under 3.7 ms of CPU, was the canary's thread waiting
 * (94.4 ms, of which 91.3 waiting, in a rerun at load 10-13), not the
 * server's loop. Run it niced on a shared machine and say the load.
 *
 * Then the N comms end at once (issue 17, the mass close), as --close
 * says (one round per mode, in turn; default exit): exit, the client
 * process exits (the server reads N EOFs); reset, it exits with its
 * sockets set to reset (N resets); close, the server calls tw_comm_close
 * on its N comms in one callback (the clients free theirs as they see
 * the end); free, the server calls tw_comm_free on them in one callback
 * (as tw_pool_free does); ctx, the server calls tw_context_free with its
 * N comms open (the last round: the server is gone after it). Printed:
 * the time until every comm ended (for close and free: until the clients
 * saw every end), the canary's latency over that time and the server
 * loop's longest pass (for ctx: tw_context_free's time). */
#include <fcntl.h>
#include <getopt.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>

#include <taskwire/taskwire.h>

#include "examples/common.h"

/* A loaded machine may take seconds per handshake: nothing times out. */
static void patient(tw_context *ctx)
{
	tw_context_set_connect_timeout_ms(ctx, 600000);
	tw_context_set_tls_handshake_timeout_ms(ctx, 600000);
	tw_context_set_handshake_timeout_ms(ctx, 600000);
}

static void raise_nofile(void)
{
	struct rlimit r;
	if (getrlimit(RLIMIT_NOFILE, &r) == 0 && r.rlim_cur < r.rlim_max) {
		r.rlim_cur = r.rlim_max;
		setrlimit(RLIMIT_NOFILE, &r);
	}
}

static double thread_cpu_ms(void)
{
	struct timespec t;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
	return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

/* ---- the server (a child process) ---- */

struct server {
	struct event_base *base;
	tw_context *ctx;
	int ctl_fd; /* commands in, answers out */
	double last_cpu, max_cpu;
	unsigned long over;
	/* The longest wall time between two ticks, and how much of it the
	 * loop's thread waited for a CPU (its schedstat run delay): a pass
	 * long in wall time but not in CPU is the machine's, not the loop's. */
	int sched_fd; /* /proc/thread-self/schedstat, or -1 */
	double last_wall, last_wait, max_wall, max_wait;
	/* The storm's comms (not the canary's, the first accepted). */
	tw_comm **comms;
	size_t ncomms, cap, accepted;
	int waiting; /* 'w' asked: answer once ncomms is 0 */
};

static void srv_recv(tw_comm *comm, tw_msg *m, void *arg)
{
	(void)arg;
	if (tw_comm_write(comm, tw_msg_hold(m)) != 0)
		tw_msg_free(m);
}

/* Answers are NANS doubles. */
#define NANS 4

static void srv_answer(struct server *s, double a, double b, double c, double d)
{
	double ans[NANS] = {a, b, c, d};
	if (write(s->ctl_fd, ans, sizeof(ans)) != sizeof(ans))
		exit(1);
}

static void srv_forget(struct server *s, tw_comm *comm)
{
	for (size_t i = s->ncomms; i-- > 0;)
		if (s->comms[i] == comm) {
			s->comms[i] = s->comms[--s->ncomms];
			break;
		}
	if (s->ncomms == 0 && s->waiting) {
		s->waiting = 0;
		srv_answer(s, 0, 0, 0, 0);
	}
}

static void srv_close(tw_comm *comm, int err, void *arg)
{
	(void)err;
	srv_forget(arg, comm);
	tw_comm_free(comm);
}

static void srv_accept(tw_listener *l, tw_comm *comm, void *arg)
{
	struct server *s = arg;
	(void)l;
	tw_comm_set_callbacks(comm, srv_recv, srv_close, NULL, arg);
	if (s->accepted++ == 0)
		return; /* the canary's */
	s->comms = tw_ex_grow(s->comms, s->ncomms + 1, &s->cap, 1024, sizeof(*s->comms));
	s->comms[s->ncomms++] = comm;
}

/* Every storm comm at once, in this one callback: 'c' tw_comm_close,
 * 'f' tw_comm_free, 'x' tw_context_free (answered with its wall and
 * thread CPU time, in ms). */
static void srv_end_all(struct server *s, char cmd)
{
	double t0 = tw_ex_now(), c0 = thread_cpu_ms();
	size_t n = s->ncomms;
	if (cmd == 'x') {
		tw_context_free(s->ctx);
		srv_answer(s, (tw_ex_now() - t0) * 1e3, thread_cpu_ms() - c0, 0, 0);
		_exit(0);
	}
	if (cmd == 'c') { /* a close callback may run inside: on a copy */
		tw_comm **all = malloc(n * sizeof(*all) + 1);
		if (all == NULL)
			exit(1);
		memcpy(all, s->comms, n * sizeof(*all));
		for (size_t i = 0; i < n; i++)
			tw_comm_close(all[i]); /* their ends come later */
		free(all);
		return;
	}
	for (size_t i = 0; i < n; i++)
		tw_comm_free(s->comms[i]);
	s->ncomms = 0;
}

/* Milliseconds this thread has waited for a CPU (schedstat's second
 * field, ns), or 0 when the kernel does not say. */
static double run_wait_ms(int fd)
{
	char b[128];
	unsigned long long run, wait;
	ssize_t n = fd < 0 ? -1 : pread(fd, b, sizeof(b) - 1, 0);
	if (n <= 0)
		return 0;
	b[n] = '\0';
	return sscanf(b, "%llu %llu", &run, &wait) == 2 ? (double)wait / 1e6 : 0;
}

static void srv_tick(evutil_socket_t fd, short what, void *arg)
{
	struct server *s = arg;
	double now = thread_cpu_ms(), wall = tw_ex_now() * 1e3, wait = run_wait_ms(s->sched_fd);
	(void)fd, (void)what;
	if (s->last_cpu > 0 && now - s->last_cpu > s->max_cpu)
		s->max_cpu = now - s->last_cpu;
	if (s->last_cpu > 0 && now - s->last_cpu > 5)
		s->over++;
	if (s->last_cpu > 0 && wall - s->last_wall > s->max_wall) {
		s->max_wall = wall - s->last_wall;
		s->max_wait = wait - s->last_wait;
	}
	s->last_cpu = now;
	s->last_wall = wall;
	s->last_wait = wait;
}

/* 'm': answer the longest pass and the count over 5 ms since the last
 * 'm', and start again; 'w': answer once the storm's comms have all
 * ended; 'c', 'f', 'x': srv_end_all; 'q' or EOF: quit. */
static void srv_ctl(evutil_socket_t fd, short what, void *arg)
{
	struct server *s = arg;
	char cmd;
	(void)what;
	if (read(fd, &cmd, 1) != 1 || cmd == 'q') {
		event_base_loopbreak(s->base);
		return;
	}
	if (cmd == 'w') {
		s->waiting = 1;
		srv_forget(s, NULL);
		return;
	}
	if (cmd != 'm') {
		srv_end_all(s, cmd);
		return;
	}
	srv_answer(s, s->max_cpu, (double)s->over, s->max_wall, s->max_wait);
	s->max_cpu = 0, s->over = 0, s->max_wall = 0, s->max_wait = 0;
}

static int serve(const char *scheme, const struct tw_ex_tls *tls, int ctl_fd)
{
	static const struct timeval ms = {0, 1000};
	struct server s = {.ctl_fd = ctl_fd};
	char uri[64], addr[128] = "";
	struct event *tick, *ctl;
	tw_context *ctx;
	tw_listener *l;
	raise_nofile();
	if ((s.base = event_base_new()) == NULL || tw_context_new(s.base, &ctx) != 0)
		return 1;
	s.ctx = ctx;
	tw_ex_tls_setup(ctx, tls);
	patient(ctx);
	snprintf(uri, sizeof(uri), "%s://127.0.0.1:0", scheme);
	if (tw_listener_new(ctx, uri, srv_accept, &s, &l) != 0) {
		fprintf(stderr, "handshake-storm: listen %s: %s\n", uri,
			tw_context_last_error(ctx));
		return 1;
	}
	tw_listener_address(l, addr, sizeof(addr));
	if (write(ctl_fd, addr, sizeof(addr)) != sizeof(addr))
		return 1;
	s.sched_fd = open("/proc/thread-self/schedstat", O_RDONLY | O_CLOEXEC);
	tick = event_new(s.base, -1, EV_PERSIST, srv_tick, &s);
	ctl = event_new(s.base, ctl_fd, EV_READ | EV_PERSIST, srv_ctl, &s);
	event_add(tick, &ms);
	event_add(ctl, NULL);
	event_base_dispatch(s.base);
	_exit(0); /* the comms go with the process */
}

/* ---- the storm (a child process): N connects at once ---- */

struct storm {
	struct event_base *base;
	tw_context *ctx;
	size_t n, echoed, failed, ended;
	int ready; /* every comm echoed: an end now is the close's */
	int fd;    /* to the bench: a byte once all have ended (after ready) */
};

static void st_end_one(struct storm *s)
{
	if (s->echoed + s->failed == s->n)
		event_base_loopbreak(s->base);
}

static void st_recv(tw_comm *comm, tw_msg *m, void *arg)
{
	(void)comm, (void)m;
	((struct storm *)arg)->echoed++;
	st_end_one(arg);
}

static void st_close(tw_comm *comm, int err, void *arg)
{
	struct storm *s = arg;
	if (s->ready) { /* the server ended it */
		tw_comm_free(comm);
		if (++s->ended == s->n && write(s->fd, "e", 1) != 1)
			_exit(1);
		return;
	}
	if (s->failed++ < 3)
		fprintf(stderr, "handshake-storm: a comm ended: %s: %s\n", tw_strerror(err),
			tw_comm_last_error(comm));
	st_end_one(s);
}

static void st_connected(tw_comm *comm, int err, void *arg)
{
	struct storm *s = arg;
	tw_msg *m;
	if (err != 0) {
		if (s->failed++ < 3)
			fprintf(stderr, "handshake-storm: connect: %s: %s\n", tw_strerror(err),
				tw_context_last_error(s->ctx));
		st_end_one(s);
		return;
	}
	tw_comm_set_callbacks(comm, st_recv, st_close, NULL, s);
	if ((m = tw_ex_small_echo()) == NULL || tw_comm_write(comm, m) != 0)
		abort();
}

/* Every TCP socket of this process resets as it closes. */
static void reset_all(void)
{
	struct rlimit r;
	getrlimit(RLIMIT_NOFILE, &r);
	for (int fd = 3; fd < (int)r.rlim_cur && fd < 65536; fd++) {
		struct sockaddr_storage ss;
		socklen_t sl = sizeof(ss);
		struct linger lg = {1, 0};
		if (getsockname(fd, (struct sockaddr *)&ss, &sl) == 0 &&
		    (ss.ss_family == AF_INET || ss.ss_family == AF_INET6))
			setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
	}
}

/* The storm's end: 'r' reset every socket, then (or on 'x' or EOF) exit. */
static void st_ctl(evutil_socket_t fd, short what, void *arg)
{
	char b = 'x';
	(void)what, (void)arg;
	if (read(fd, &b, 1) == 1 && b == 'r')
		reset_all();
	_exit(0);
}

/* Says on fd 0 when every comm had its echo (else 1), then its comms
 * stay open (ending those the server ends) until a byte from fd
 * (st_ctl). */
static int storm(const char *addr, const struct tw_ex_tls *tls, size_t n, int fd)
{
	char b;
	struct storm s = {.n = n, .fd = fd};
	struct event *ctl;
	raise_nofile();
	if ((s.base = event_base_new()) == NULL || tw_context_new(s.base, &s.ctx) != 0)
		return 1;
	tw_ex_tls_setup(s.ctx, tls);
	patient(s.ctx);
	for (size_t i = 0; i < n; i++)
		if (tw_comm_connect(s.ctx, addr, st_connected, &s) != 0)
			return 1;
	event_base_dispatch(s.base);
	b = s.failed == 0 ? 0 : 1;
	s.ready = 1;
	if (write(fd, &b, 1) != 1 || (ctl = event_new(s.base, fd, EV_READ, st_ctl, &s)) == NULL ||
	    event_add(ctl, NULL) != 0)
		_exit(1);
	event_base_dispatch(s.base);
	_exit(1);
}

/* ---- the canary (a thread of this process) ---- */

#define MAX_LAT 1000000

struct canary {
	const char *addr;
	const struct tw_ex_tls *tls;
	struct event_base *base;
	tw_context *ctx;
	tw_comm *comm;
	struct event *next;
	double sent, sent_wait;
	int sched_fd; /* the canary thread's schedstat, or -1 */
	atomic_int stop, ready, failed, server_gone;
	double *lat;  /* milliseconds, while recording */
	double *wait; /* of each: ms the canary's thread waited for a CPU */
	atomic_size_t nlat;
	atomic_int recording;
};

static void cn_send(evutil_socket_t fd, short what, void *arg)
{
	struct canary *c = arg;
	tw_msg *m = tw_ex_small_echo();
	(void)fd, (void)what;
	if (atomic_load(&c->stop)) {
		event_base_loopbreak(c->base);
		return;
	}
	c->sent = tw_ex_now();
	c->sent_wait = run_wait_ms(c->sched_fd);
	if (m == NULL || tw_comm_write(c->comm, m) != 0)
		abort();
}

static void cn_recv(tw_comm *comm, tw_msg *m, void *arg)
{
	static const struct timeval two_ms = {0, 2000};
	struct canary *c = arg;
	size_t i = atomic_load(&c->nlat);
	(void)comm, (void)m;
	if (atomic_load(&c->recording) && i < MAX_LAT) {
		c->lat[i] = (tw_ex_now() - c->sent) * 1e3;
		c->wait[i] = run_wait_ms(c->sched_fd) - c->sent_wait;
		atomic_store(&c->nlat, i + 1);
	}
	event_add(c->next, &two_ms);
}

static void cn_close(tw_comm *comm, int err, void *arg)
{
	struct canary *c = arg;
	if (!atomic_load(&c->server_gone))
		fprintf(stderr, "handshake-storm: the canary ended: %s: %s\n", tw_strerror(err),
			tw_comm_last_error(comm));
	atomic_store(&c->failed, 1);
	event_base_loopbreak(c->base);
}

static void cn_connected(tw_comm *comm, int err, void *arg)
{
	struct canary *c = arg;
	if (err != 0) {
		fprintf(stderr, "handshake-storm: canary connect: %s\n", tw_strerror(err));
		atomic_store(&c->failed, 1);
		event_base_loopbreak(c->base);
		return;
	}
	c->comm = comm;
	tw_comm_set_callbacks(comm, cn_recv, cn_close, NULL, c);
	atomic_store(&c->ready, 1);
	cn_send(-1, 0, c);
}

static void *canary_main(void *arg)
{
	struct canary *c = arg;
	if ((c->base = event_base_new()) == NULL || tw_context_new(c->base, &c->ctx) != 0)
		abort();
	c->sched_fd = open("/proc/thread-self/schedstat", O_RDONLY | O_CLOEXEC);
	tw_ex_tls_setup(c->ctx, c->tls);
	patient(c->ctx);
	c->next = event_new(c->base, -1, 0, cn_send, c);
	if (tw_comm_connect(c->ctx, c->addr, cn_connected, c) != 0)
		abort();
	event_base_dispatch(c->base);
	tw_comm_free(c->comm);
	event_free(c->next);
	tw_context_free(c->ctx);
	event_base_free(c->base);
	return NULL;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

/* p50, p99 and max of what the canary recorded in [from, to), and how
 * long the canary's thread waited for a CPU during the slowest echo. */
static void canary_stats(struct canary *c, size_t from, size_t to, char *out, size_t len)
{
	size_t n = to - from, worst = from;
	double *v = c->lat + from;
	if (n == 0) {
		snprintf(out, len, "no echo");
		return;
	}
	for (size_t i = from; i < to; i++)
		if (c->lat[i] > c->lat[worst])
			worst = i;
	qsort(v, n, sizeof(*v), cmp_double);
	snprintf(out, len,
		 "p50 %.2f p99 %.2f max %.2f ms (%zu echoes; the canary waited %.1f ms "
		 "for a CPU in its slowest)",
		 v[n / 2], v[n * 99 / 100], v[n - 1], n, c->wait[worst]);
}

/* The server's longest pass and passes over 5 ms since the last ask. */
static int ask(int fd, double ans[NANS])
{
	if (write(fd, "m", 1) != 1 || read(fd, ans, NANS * sizeof(double)) != NANS * sizeof(double))
		return -1;
	return 0;
}

static const char usage_text[] =
	"usage: handshake-storm [--clients N] [--rounds R] [--close MODES] [TLS options] "
	"[SCHEME]\n" TW_EX_TLS_USAGE
	"  SCHEME: tls (default), wss, tcp, ws. Each round N clients (default\n"
	"  200) connect at once to a forked echo server and echo one small\n"
	"  message each, while a canary comm echoes every 2 ms: its latency,\n"
	"  and the server loop's longest pass (loop-thread CPU between 1 ms ticks).\n"
	"  Then the N comms end at once, each round the next of MODES (comma\n"
	"  separated; default exit): exit (the clients exit), reset (they exit\n"
	"  with resets), close (the server closes them), free (the server frees\n"
	"  them), ctx (the server frees its context; the last round).\n";

static void usage(FILE *f)
{
	fputs(usage_text, f);
}

static const struct option opts[] = {{"clients", required_argument, NULL, 'c'},
				     {"rounds", required_argument, NULL, 'r'},
				     {"close", required_argument, NULL, 'C'},
				     {"help", no_argument, NULL, 'h'},
				     TW_EX_TLS_OPTIONS,
				     {NULL, 0, NULL, 0}};

/* The storm's comms end at once as mode says; returns once the server
 * has none left (for ctx: once it has freed its context; ans then holds
 * tw_context_free's wall and CPU ms). */
static int end_all(const char *mode, int srv_fd, int storm_fd, struct canary *c, double ans[NANS])
{
	if (strcmp(mode, "exit") == 0 || strcmp(mode, "reset") == 0) {
		if (write(storm_fd, mode[0] == 'r' ? "r" : "x", 1) != 1)
			return -1;
	} else if (strcmp(mode, "close") == 0 || strcmp(mode, "free") == 0) {
		if (write(srv_fd, mode[0] == 'c' ? "c" : "f", 1) != 1)
			return -1;
	} else if (strcmp(mode, "ctx") == 0) {
		atomic_store(&c->server_gone, 1);
		if (write(srv_fd, "x", 1) != 1)
			return -1;
		return read(srv_fd, ans, NANS * sizeof(double)) == NANS * sizeof(double) ? 0 : -1;
	} else {
		return -1;
	}
	if (write(srv_fd, "w", 1) != 1 ||
	    read(srv_fd, ans, NANS * sizeof(double)) != NANS * sizeof(double))
		return -1;
	/* close, free: until the clients saw every end (the sockets closed) */
	if (mode[0] == 'c' || mode[0] == 'f') {
		char b;
		if (read(storm_fd, &b, 1) != 1)
			return -1;
	}
	return 0;
}

int main(int argc, char **argv)
{
	struct tw_ex_tls tls = {NULL, NULL, NULL};
	const char *scheme = "tls";
	char modes_arg[256] = "exit", *modes[16], *save = NULL;
	size_t clients = 200, rounds = 0, nmodes = 0;
	int sv[2], o, rv = 0;
	char addr[128];
	struct canary c = {0};
	pthread_t th;
	pid_t srv;
	while ((o = getopt_long(argc, argv, "c:r:h", opts, NULL)) != -1) {
		switch (o) {
		case 'c': clients = (size_t)tw_ex_parse_size(optarg); break;
		case 'r': rounds = (size_t)tw_ex_parse_size(optarg); break;
		case 'C': snprintf(modes_arg, sizeof(modes_arg), "%s", optarg); break;
		case 'h': usage(stdout); return 0;
		default: tw_ex_other_option(&tls, o, optarg, usage);
		}
	}
	for (char *m = strtok_r(modes_arg, ",", &save); m != NULL && nmodes < 16;
	     m = strtok_r(NULL, ",", &save))
		modes[nmodes++] = m;
	if (rounds == 0)
		rounds = nmodes;
	if (optind < argc)
		scheme = argv[optind++];
	if (optind != argc || clients == 0 || nmodes == 0) {
		usage(stderr);
		return 2;
	}
	signal(SIGPIPE, SIG_IGN);
	/* the server's control socket: sv[1] there, sv[0] here */
	if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0)
		return 1;
	fflush(stdout);
	if ((srv = fork()) == 0)
		_exit(serve(scheme, &tls, sv[1]));
	close(sv[1]);
	if (read(sv[0], addr, sizeof(addr)) != sizeof(addr))
		return 1;
	c.addr = addr;
	c.tls = &tls;
	if ((c.lat = malloc(MAX_LAT * sizeof(*c.lat))) == NULL ||
	    (c.wait = malloc(MAX_LAT * sizeof(*c.wait))) == NULL ||
	    pthread_create(&th, NULL, canary_main, &c) != 0)
		return 1;
	while (!atomic_load(&c.ready) && !atomic_load(&c.failed))
		usleep(1000);
	for (size_t r = 0; r < rounds && rv == 0 && !atomic_load(&c.failed); r++) {
		const char *mode = modes[r % nmodes];
		double ans[NANS], shut[NANS], t0, t1, t2, t3;
		char quiet[160], during[160], closing[160], b = 1;
		size_t from, mid, to;
		int sp[2];
		pid_t pid;
		atomic_store(&c.nlat, 0);
		atomic_store(&c.recording, 1);
		usleep(500000);
		from = atomic_load(&c.nlat);
		if (ask(sv[0], ans) != 0)
			return 1;
		t0 = tw_ex_now();
		fflush(stdout);
		if (socketpair(AF_UNIX, SOCK_STREAM, 0, sp) != 0)
			return 1;
		if ((pid = fork()) == 0)
			_exit(storm(addr, &tls, clients, sp[1]));
		close(sp[1]);
		if (pid < 0 || read(sp[0], &b, 1) != 1)
			return 1;
		t1 = tw_ex_now();
		atomic_store(&c.recording, 0);
		usleep(20000); /* an echo being recorded is in */
		rv = b;
		mid = atomic_load(&c.nlat);
		if (ask(sv[0], ans) != 0)
			return 1;
		/* then the storm's comms all end at once */
		atomic_store(&c.recording, 1);
		t2 = tw_ex_now();
		if (end_all(mode, sv[0], sp[0], &c, shut) != 0)
			return 1;
		t3 = tw_ex_now();
		if (strcmp(mode, "ctx") == 0) {
			printf("%s %zu clients: %s in %.2f s; ctx: tw_context_free with %zu comms "
			       "took %.1f ms (%.1f ms CPU)\n",
			       scheme, clients, rv == 0 ? "all echoed" : "FAILED", t1 - t0, clients,
			       shut[0], shut[1]);
			fflush(stdout);
			if (write(sp[0], "x", 1) != 1) /* the storm may be gone */
				rv = 0;
			waitpid(pid, NULL, 0);
			close(sp[0]);
			break;
		}
		usleep(20000);
		atomic_store(&c.recording, 0);
		usleep(20000);
		to = atomic_load(&c.nlat);
		if (ask(sv[0], shut) != 0)
			return 1;
		if (write(sp[0], "x", 1) != 1) /* exit and reset: it is gone */
			rv = 0;
		if (waitpid(pid, NULL, 0) != pid)
			return 1;
		close(sp[0]);
		canary_stats(&c, from, mid, during, sizeof(during));
		canary_stats(&c, mid, to, closing, sizeof(closing));
		canary_stats(&c, 0, from, quiet, sizeof(quiet));
		printf("%s %zu clients: %s in %.2f s; canary %s (quiet before: %s); "
		       "server loop's longest pass %.1f ms CPU, %.0f over 5 ms, longest wall "
		       "between ticks %.1f ms (%.1f waiting for a CPU)\n"
		       "%s %zu %s: all ended in %.1f ms; canary %s; server loop's longest pass "
		       "%.1f ms CPU, %.0f over 5 ms, longest wall between ticks %.1f ms (%.1f "
		       "waiting for a CPU)\n",
		       scheme, clients, rv == 0 ? "all echoed" : "FAILED", t1 - t0, during, quiet,
		       ans[0], ans[1], ans[2], ans[3], scheme, clients, mode, (t3 - t2) * 1e3,
		       closing, shut[0], shut[1], shut[2], shut[3]);
		fflush(stdout);
	}
	atomic_store(&c.stop, 1);
	pthread_join(th, NULL);
	free(c.lat);
	free(c.wait);
	if (!atomic_load(&c.server_gone) && write(sv[0], "q", 1) != 1)
		rv = 1;
	waitpid(srv, NULL, 0);
	return rv != 0 || (atomic_load(&c.failed) && !atomic_load(&c.server_gone));
}
