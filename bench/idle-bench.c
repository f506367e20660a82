/* SPDX-License-Identifier: BSD-3-Clause */
/* idle-bench: what an idle comm costs (issue 20). For each scheme, a
 * server process (forked) listens on 127.0.0.1; this process connects
 * COUNT comms to it, a WINDOW of connects in flight at a time, and on
 * each sends one small message, which the server echoes. Then every comm
 * is idle, and both processes report what the COUNT comms added to their
 * RSS (VmRSS) and to their malloc heap in use (mallinfo2), per comm, and
 * how long the connects took (transport handshakes: TCP, TLS, the ws
 * upgrade; the echoes after). WARM comms are connected first and kept
 * open: the baseline is read after them, so one-time costs (OpenSSL's
 * lazy tables, libevent's fd arrays) are not charged to the idle comms.
 *
 *   idle-bench [--count N] [--window W] [--warm N] [--openssl-sites N]
 *              [TLS options] SCHEME...
 *
 * Each scheme runs in two fresh processes (client and server).
 * SCHEME: tcp, tls, ws, wss. The TLS options name the PEM files tls and
 * wss use (mutual TLS: scripts/make-test-certs.sh). bench/idle-bench.sh
 * makes certificates and runs all four. One line per scheme. The heap
 * figure is what malloc handed out and not yet got back (mallinfo2:
 * uordblks + hblkhd); RSS counts only pages touched, so a buffer
 * allocated whole but written only at its start (OpenSSL's record
 * buffers after a small message) counts in full in the heap figure and
 * in part in RSS, until a large message touches it all. On a shared
 * machine the wall time of the connects follows the load: the CPU
 * seconds of each process over the connects and echoes say more.
 * --openssl-sites N counts OpenSSL's allocations by source line
 * (bench/openssl-sites.c) and prints, per idle comm, what OpenSSL holds
 * and its N largest sites, on both sides (docs/tls-memory.md); the
 * counting adds 16 bytes to each of OpenSSL's allocations, and to the
 * RSS and heap figures.
 */
#include <errno.h>
#include <getopt.h>
#include <malloc.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <event2/event.h>

#include <taskwire/taskwire.h>

#include "bench/openssl-sites.h"
#include "examples/common.h"

/* What a process measures: RSS and heap in use, in bytes, and the CPU
 * seconds it used (user and system). */
struct mem {
	uint64_t rss, heap;
	double cpu;
};

static struct mem mem_now(void)
{
	struct mallinfo2 mi = mallinfo2();
	struct rusage ru;
	struct mem m = {tw_ex_rss(), (uint64_t)mi.uordblks + (uint64_t)mi.hblkhd, 0};
	if (getrusage(RUSAGE_SELF, &ru) == 0)
		m.cpu = (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 +
			(double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
	return m;
}

static void raise_nofile(void)
{
	struct rlimit r;
	if (getrlimit(RLIMIT_NOFILE, &r) == 0 && r.rlim_cur < r.rlim_max) {
		r.rlim_cur = r.rlim_max;
		setrlimit(RLIMIT_NOFILE, &r);
	}
}

/* A loaded machine may take seconds per handshake: no stage may time
 * out (the defaults, 10 s, cut hundreds of TLS handshakes short). */
static void patient(tw_context *ctx)
{
	tw_context_set_connect_timeout_ms(ctx, 600000);
	tw_context_set_tls_handshake_timeout_ms(ctx, 600000);
	tw_context_set_handshake_timeout_ms(ctx, 600000);
}

static tw_msg *small_msg(void)
{
	static const char text[32] = "an idle comm's one message";
	tw_msg *m;
	if (tw_msg_new(&m) != 0)
		return NULL;
	if (tw_msg_append_copy(m, text, sizeof(text)) != 0) {
		tw_msg_free(m);
		return NULL;
	}
	return m;
}

/* --openssl-sites N: the top N sites of OpenSSL's allocations per comm
 * (0: not counted). */
static size_t sites_top;

/* ---- the server process ---- */

struct server {
	struct event_base *base;
	int ctl_in, ctl_out; /* commands from the client process, answers to it */
	struct event *ctl_ev;
	tw_comm **comms;
	size_t n, cap;
	size_t sites_n; /* comms at the last --openssl-sites report */
};

static void srv_recv(tw_comm *comm, tw_msg *m, void *arg)
{
	(void)arg;
	if (tw_comm_write(comm, tw_msg_hold(m)) != 0)
		tw_msg_free(m);
}

static void srv_close(tw_comm *comm, int err, void *arg)
{
	(void)comm, (void)err, (void)arg; /* freed at the end */
}

static void srv_accept(tw_listener *l, tw_comm *comm, void *arg)
{
	struct server *s = arg;
	(void)l;
	s->comms = tw_ex_grow(s->comms, s->n, &s->cap, 1024, sizeof(*s->comms));
	s->comms[s->n++] = comm;
	tw_comm_set_callbacks(comm, srv_recv, srv_close, NULL, s);
}

/* Commands: 'm' measure (answer a struct mem and the comm count), 'q' quit. */
static void srv_ctl(evutil_socket_t fd, short what, void *arg)
{
	struct server *s = arg;
	char cmd;
	(void)what;
	if (read(fd, &cmd, 1) != 1 || cmd == 'q') {
		event_base_loopbreak(s->base);
		return;
	}
	struct mem m = mem_now();
	uint64_t n = s->n;
	tw_bench_sites_report(stderr, "server", s->n - s->sites_n, sites_top);
	s->sites_n = s->n;
	if (write(s->ctl_out, &m, sizeof(m)) != sizeof(m) ||
	    write(s->ctl_out, &n, sizeof(n)) != sizeof(n))
		exit(1);
}

static int serve(const char *scheme, const struct tw_ex_tls *tls, int ctl_in, int ctl_out)
{
	struct server s = {.ctl_in = ctl_in, .ctl_out = ctl_out};
	char uri[64], addr[128] = "";
	tw_context *ctx;
	tw_listener *l;
	raise_nofile();
	s.base = event_base_new();
	if (s.base == NULL || tw_context_new(s.base, &ctx) != 0)
		return 1;
	tw_ex_tls_setup(ctx, tls);
	patient(ctx);
	snprintf(uri, sizeof(uri), "%s://127.0.0.1:0", scheme);
	if (tw_listener_new(ctx, uri, srv_accept, &s, &l) != 0) {
		fprintf(stderr, "idle-bench: listen %s: %s\n", uri, tw_context_last_error(ctx));
		return 1;
	}
	tw_listener_address(l, addr, sizeof(addr));
	if (write(ctl_out, addr, sizeof(addr)) != sizeof(addr))
		return 1;
	s.ctl_ev = event_new(s.base, ctl_in, EV_READ | EV_PERSIST, srv_ctl, &s);
	event_add(s.ctl_ev, NULL);
	event_base_dispatch(s.base);
	for (size_t i = 0; i < s.n; i++)
		tw_comm_free(s.comms[i]);
	free(s.comms);
	event_free(s.ctl_ev);
	tw_listener_free(l);
	tw_context_free(ctx);
	event_base_free(s.base);
	return 0;
}

/* ---- the client process (this one) ---- */

struct client {
	struct event_base *base;
	tw_context *ctx;
	const char *addr;
	tw_comm **comms;
	size_t target;  /* comms to have in all */
	size_t started; /* connects begun */
	size_t connected, echoed, failed;
	size_t window;
	double t_connected; /* when the last connect finished */
};

static void start_more(struct client *c);

static void cl_recv(tw_comm *comm, tw_msg *m, void *arg)
{
	struct client *c = arg;
	(void)comm, (void)m;
	if (++c->echoed + c->failed == c->target)
		event_base_loopbreak(c->base);
}

static void cl_close(tw_comm *comm, int err, void *arg)
{
	struct client *c = arg;
	if (c->failed < 5)
		fprintf(stderr, "idle-bench: a comm ended: %s: %s\n", tw_strerror(err),
			tw_comm_last_error(comm));
	if (++c->failed + c->echoed == c->target)
		event_base_loopbreak(c->base);
}

static void cl_connected(tw_comm *comm, int err, void *arg)
{
	struct client *c = arg;
	tw_msg *m;
	if (err != 0) {
		if (c->failed < 5)
			fprintf(stderr, "idle-bench: connect failed: %s: %s\n", tw_strerror(err),
				tw_context_last_error(c->ctx));
		c->failed++;
	} else {
		c->comms[c->connected++] = comm;
		tw_comm_set_callbacks(comm, cl_recv, cl_close, NULL, c);
		if ((m = small_msg()) == NULL || tw_comm_write(comm, m) != 0)
			abort();
	}
	if (c->connected + c->failed == c->target)
		c->t_connected = tw_ex_now();
	start_more(c);
	if (c->failed + c->echoed == c->target)
		event_base_loopbreak(c->base);
}

static void start_more(struct client *c)
{
	while (c->started < c->target && c->started - c->connected - c->failed < c->window) {
		c->started++;
		if (tw_comm_connect(c->ctx, c->addr, cl_connected, c) != 0) {
			fprintf(stderr, "idle-bench: %s\n", tw_context_last_error(c->ctx));
			exit(1);
		}
	}
}

/* Connect until `target` comms exist, each with its one echo back. */
static int connect_to(struct client *c, size_t target)
{
	c->target = target;
	start_more(c);
	event_base_dispatch(c->base);
	return c->failed == 0 ? 0 : -1;
}

static struct mem ask_server(int to, int from, uint64_t *n)
{
	struct mem m = {0, 0, 0};
	char cmd = 'm';
	if (write(to, &cmd, 1) != 1 || read(from, &m, sizeof(m)) != sizeof(m) ||
	    read(from, n, sizeof(*n)) != sizeof(*n)) {
		fprintf(stderr, "idle-bench: server gone\n");
		exit(1);
	}
	return m;
}

static double per_comm_kib(uint64_t after, uint64_t before, size_t n)
{
	return ((double)after - (double)before) / (double)n / 1024.0;
}

static int run(const char *scheme, const struct tw_ex_tls *tls, size_t count, size_t warm,
	       size_t window)
{
	int to_srv[2], from_srv[2], status = 0;
	char addr[128];
	pid_t pid;
	uint64_t sn = 0;
	struct client c = {.addr = addr, .window = window};
	struct mem s0, s1, c0, c1;
	double t0, t1;
	if (pipe(to_srv) != 0 || pipe(from_srv) != 0)
		return 1;
	fflush(stdout);
	if ((pid = fork()) == 0) {
		close(to_srv[1]);
		close(from_srv[0]);
		_exit(serve(scheme, tls, to_srv[0], from_srv[1]));
	}
	close(to_srv[0]);
	close(from_srv[1]);
	if (read(from_srv[0], addr, sizeof(addr)) != sizeof(addr))
		return 1;
	c.base = event_base_new();
	if (c.base == NULL || tw_context_new(c.base, &c.ctx) != 0)
		return 1;
	tw_ex_tls_setup(c.ctx, tls);
	patient(c.ctx);
	if ((c.comms = calloc(count + warm, sizeof(*c.comms))) == NULL)
		return 1;
	if (connect_to(&c, warm) != 0)
		return 1;
	s0 = ask_server(to_srv[1], from_srv[0], &sn);
	c0 = mem_now();
	tw_bench_sites_report(stderr, "client", 0, sites_top); /* the baseline */
	t0 = tw_ex_now();
	if (connect_to(&c, warm + count) != 0)
		return 1;
	t1 = tw_ex_now();
	c1 = mem_now();
	tw_bench_sites_report(stderr, "client", count, sites_top);
	s1 = ask_server(to_srv[1], from_srv[0], &sn);
	if (sn != warm + count)
		fprintf(stderr, "idle-bench: the server holds %llu comms, not %zu\n",
			(unsigned long long)sn, warm + count);
	printf("%-4s %zu comms: connect %.2f s wall (+echo %.2f s), cpu server %.2f s client "
	       "%.2f s | per idle comm: server rss %.1f KiB heap %.1f KiB, client rss %.1f KiB "
	       "heap %.1f KiB\n",
	       scheme, count, c.t_connected - t0, t1 - c.t_connected, s1.cpu - s0.cpu,
	       c1.cpu - c0.cpu, per_comm_kib(s1.rss, s0.rss, count),
	       per_comm_kib(s1.heap, s0.heap, count), per_comm_kib(c1.rss, c0.rss, count),
	       per_comm_kib(c1.heap, c0.heap, count));
	fflush(stdout);
	for (size_t i = 0; i < c.connected; i++)
		tw_comm_free(c.comms[i]);
	free(c.comms);
	tw_context_free(c.ctx);
	event_base_free(c.base);
	if (write(to_srv[1], "q", 1) != 1)
		return 1;
	waitpid(pid, &status, 0);
	close(to_srv[1]);
	close(from_srv[0]);
	return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}

static void usage(FILE *f)
{
	fprintf(f, "usage: idle-bench [--count N] [--window W] [--warm N] [--openssl-sites N] "
		   "[TLS options] SCHEME...\n" TW_EX_TLS_USAGE
		   "  SCHEME: tcp tls ws wss. COUNT comms (default 5000) to a forked\n"
		   "  server on 127.0.0.1, WINDOW connects in flight (default 16), one\n"
		   "  small echo each, then idle: RSS and heap per idle comm on both sides,\n"
		   "  and the time to connect them. --openssl-sites N: what OpenSSL holds\n"
		   "  per idle comm, and its N largest allocation sites.\n");
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {{"count", required_argument, NULL, 'c'},
					     {"window", required_argument, NULL, 'w'},
					     {"warm", required_argument, NULL, 'W'},
					     {"openssl-sites", required_argument, NULL, 'S'},
					     {"help", no_argument, NULL, 'h'},
					     TW_EX_TLS_OPTIONS,
					     {NULL, 0, NULL, 0}};
	struct tw_ex_tls tls = {NULL, NULL, NULL};
	size_t count = 5000, window = 16, warm = 16;
	int o, rv = 0;
	while ((o = getopt_long(argc, argv, "c:w:W:h", opts, NULL)) != -1) {
		switch (o) {
		case 'c': count = (size_t)tw_ex_parse_size(optarg); break;
		case 'w': window = (size_t)tw_ex_parse_size(optarg); break;
		case 'W': warm = (size_t)tw_ex_parse_size(optarg); break;
		case 'S': sites_top = (size_t)tw_ex_parse_size(optarg); break;
		case 'h': usage(stdout); return 0;
		default: tw_ex_other_option(&tls, o, optarg, usage);
		}
	}
	if (optind == argc || count == 0 || window == 0 || warm == 0) {
		usage(stderr);
		return 2;
	}
	if (sites_top > 0 && tw_bench_sites_start() != 0) {
		fprintf(stderr, "idle-bench: OpenSSL allocated before --openssl-sites\n");
		return 1;
	}
	signal(SIGPIPE, SIG_IGN);
	raise_nofile();
	/* Each scheme in fresh processes: heap freed by an earlier one would
	 * hide the next one's growth in RSS. */
	for (int i = optind; i < argc && rv == 0; i++) {
		int status = 0;
		pid_t pid;
		fflush(stdout);
		if ((pid = fork()) == 0)
			_exit(run(argv[i], &tls, count, warm, window));
		if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status))
			rv = 1;
		else
			rv = WEXITSTATUS(status);
	}
	return rv;
}
