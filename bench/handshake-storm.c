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
 * many passed 5 ms. Run it niced on a shared machine and say the load. */
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
	int ctl_fd; /* commands in, answers out */
	double last_cpu, max_cpu;
	unsigned long over;
};

static void srv_recv(tw_comm *comm, tw_msg *m, void *arg)
{
	(void)arg;
	if (tw_comm_write(comm, tw_msg_hold(m)) != 0)
		tw_msg_free(m);
}

static void srv_close(tw_comm *comm, int err, void *arg)
{
	(void)err, (void)arg;
	tw_comm_free(comm);
}

static void srv_accept(tw_listener *l, tw_comm *comm, void *arg)
{
	(void)l;
	tw_comm_set_callbacks(comm, srv_recv, srv_close, NULL, arg);
}

static void srv_tick(evutil_socket_t fd, short what, void *arg)
{
	struct server *s = arg;
	double now = thread_cpu_ms();
	(void)fd, (void)what;
	if (s->last_cpu > 0 && now - s->last_cpu > s->max_cpu)
		s->max_cpu = now - s->last_cpu;
	if (s->last_cpu > 0 && now - s->last_cpu > 5)
		s->over++;
	s->last_cpu = now;
}

/* 'm': answer the longest pass and the count over 5 ms since the last
 * 'm', and start again; 'q' or EOF: quit. */
static void srv_ctl(evutil_socket_t fd, short what, void *arg)
{
	struct server *s = arg;
	double ans[2];
	char cmd;
	(void)what;
	if (read(fd, &cmd, 1) != 1 || cmd == 'q') {
		event_base_loopbreak(s->base);
		return;
	}
	ans[0] = s->max_cpu, ans[1] = (double)s->over;
	s->max_cpu = 0, s->over = 0;
	if (write(s->ctl_fd, ans, sizeof(ans)) != sizeof(ans))
		exit(1);
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
	size_t n, echoed, failed;
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

/* Says on fd 0 when every comm had its echo (else 1), then waits for a
 * byte from fd before it exits, its comms open until then. */
static int storm(const char *addr, const struct tw_ex_tls *tls, size_t n, int fd)
{
	char b;
	struct storm s = {.n = n};
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
	if (write(fd, &b, 1) != 1 || read(fd, &b, 1) != 1)
		_exit(1);
	_exit(0);
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
	double sent;
	atomic_int stop, ready, failed;
	double *lat; /* milliseconds, while recording */
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
		atomic_store(&c->nlat, i + 1);
	}
	event_add(c->next, &two_ms);
}

static void cn_close(tw_comm *comm, int err, void *arg)
{
	struct canary *c = arg;
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

/* p50, p99 and max of what the canary recorded since `from`. */
static void canary_stats(struct canary *c, size_t from, char *out, size_t len)
{
	size_t n = atomic_load(&c->nlat) - from;
	double *v = c->lat + from;
	if (n == 0) {
		snprintf(out, len, "no echo");
		return;
	}
	qsort(v, n, sizeof(*v), cmp_double);
	snprintf(out, len, "p50 %.2f p99 %.2f max %.2f ms (%zu echoes)", v[n / 2], v[n * 99 / 100],
		 v[n - 1], n);
}

/* The server's longest pass and passes over 5 ms since the last ask. */
static int ask(int fd, double ans[2])
{
	if (write(fd, "m", 1) != 1 || read(fd, ans, 2 * sizeof(double)) != 2 * sizeof(double))
		return -1;
	return 0;
}

static const char usage_text[] =
	"usage: handshake-storm [--clients N] [--rounds R] [TLS options] [SCHEME]\n" TW_EX_TLS_USAGE
	"  SCHEME: tls (default), wss, tcp, ws. Each round N clients (default\n"
	"  200) connect at once to a forked echo server and echo one small\n"
	"  message each, while a canary comm echoes every 2 ms: its latency,\n"
	"  and the server loop's longest pass (loop-thread CPU between 1 ms ticks).\n";

static void usage(FILE *f)
{
	fputs(usage_text, f);
}

static const struct option opts[] = {{"clients", required_argument, NULL, 'c'},
				     {"rounds", required_argument, NULL, 'r'},
				     {"help", no_argument, NULL, 'h'},
				     TW_EX_TLS_OPTIONS,
				     {NULL, 0, NULL, 0}};

int main(int argc, char **argv)
{
	struct tw_ex_tls tls = {NULL, NULL, NULL};
	const char *scheme = "tls";
	size_t clients = 200, rounds = 1;
	int sv[2], o, rv = 0;
	char addr[128];
	struct canary c = {0};
	pthread_t th;
	pid_t srv;
	while ((o = getopt_long(argc, argv, "c:r:h", opts, NULL)) != -1) {
		switch (o) {
		case 'c': clients = (size_t)tw_ex_parse_size(optarg); break;
		case 'r': rounds = (size_t)tw_ex_parse_size(optarg); break;
		case 'h': usage(stdout); return 0;
		default: tw_ex_other_option(&tls, o, optarg, usage);
		}
	}
	if (optind < argc)
		scheme = argv[optind++];
	if (optind != argc || clients == 0) {
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
	    pthread_create(&th, NULL, canary_main, &c) != 0)
		return 1;
	while (!atomic_load(&c.ready) && !atomic_load(&c.failed))
		usleep(1000);
	for (size_t r = 0; r < rounds && rv == 0 && !atomic_load(&c.failed); r++) {
		double ans[2], shut[2], t0, t1;
		char quiet[96], during[96], b = 1;
		size_t from;
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
		if (ask(sv[0], ans) != 0)
			return 1;
		/* then the storm's comms all close at once */
		if (write(sp[0], "x", 1) != 1 || waitpid(pid, NULL, 0) != pid)
			return 1;
		close(sp[0]);
		usleep(200000);
		if (ask(sv[0], shut) != 0)
			return 1;
		canary_stats(&c, from, during, sizeof(during));
		atomic_store(&c.nlat, from);
		canary_stats(&c, 0, quiet, sizeof(quiet));
		printf("%s %zu clients: %s in %.2f s; canary %s (quiet before: %s); "
		       "server loop's longest pass %.1f ms CPU, %.0f over 5 ms; as the %zu "
		       "comms close at once: %.1f ms, %.0f over 5 ms\n",
		       scheme, clients, rv == 0 ? "all echoed" : "FAILED", t1 - t0, during, quiet,
		       ans[0], ans[1], clients, shut[0], shut[1]);
		fflush(stdout);
	}
	atomic_store(&c.stop, 1);
	pthread_join(th, NULL);
	free(c.lat);
	if (write(sv[0], "q", 1) != 1)
		rv = 1;
	waitpid(srv, NULL, 0);
	return rv != 0 || atomic_load(&c.failed);
}
