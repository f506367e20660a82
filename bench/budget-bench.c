/* SPDX-License-Identifier: BSD-3-Clause */
/* budget-bench: memory and loop stalls of a server under large messages
 * (issue 17).
 *
 *   budget-bench [--peers N] [--size BYTES] [--budget BYTES]
 *                [--big BYTES[,BYTES...]|none] [--bombs N] [--bomb-size BYTES]
 *                [--cache BYTES] [--gaps MS]
 *
 * Forks a taskwire echo server (one loop, receive budget --budget,
 * default 1 GiB; 0 leaves the library's default) and measures, in three
 * phases:
 *  1. load: N peers (default 50) each send one message of --size bytes
 *     (default 100 MiB) at once; every echo is checked byte for byte;
 *  2. large frees: one comm sends each --big message (default 1 GiB and
 *     2 GiB) and checks its echo; the server frees each after writing it;
 *  3. zstd bombs: --bombs messages (default 3) whose payload is a zstd
 *     frame of a few KB that inflates to --bomb-size (default 2047 MiB: a
 *     frame is compressed up to 2^31 bytes), to a
 *     listener that decodes (offload pool) and frees the result.
 * Throughout, a canary comm on a thread of its own does small echo round
 * trips (p50/p99/max per phase), and the server's loop runs a 1 ms timer
 * (--cache sets the server's large-block cache, tw_block_cache_set_limit;
 * default the library's 256 MiB, which counts in its RSS)
 * whose longest gap is the longest stall of its loop (wall clock, and the
 * loop thread's CPU time between two ticks: on a loaded machine the wall
 * gap counts preemption, the CPU gap only the loop's own work). The server's peak
 * RSS (VmHWM) is read after phase 1. Prints one line per phase; of the
 * passes over 5 ms of loop CPU it says how many were idle (moved under
 * 256 KiB, no munmap/mprotect/madvise/mincore call: this VM charges a
 * thread time it did not spend, docs/design.md). --gaps MS
 * logs (stderr) every gap between ticks of more than MS ms of loop CPU,
 * with its CLOCK_MONOTONIC bounds, to find its work in `perf record -k
 * mono -p PID` samples, and says what each such pass did: the bytes and
 * calls of its reads and writes (recv, readv, send, sendmsg: the tcp
 * transport's), its calls that map, unmap or prefault memory, its page
 * faults and context switches. A pass that did what a 1 ms pass does yet
 * counted 10 ms of CPU was not busy with its work (docs/design.md,
 * Receive path, step 4).
 * Built with -DBUDGET_BENCH_NO_BUDGETS it runs against a library that has
 * no budgets (the numbers before issue 17). */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>

#include <taskwire/taskwire.h>

#include "examples/common.h"

/* --- the server (a child process) --- */

struct srv {
	struct event_base *base;
	tw_context *ctx;
	struct event *tick, *ctl;
	double last, max_gap;
	double last_cpu, max_cpu;  /* the loop thread's CPU time between ticks */
	double log_ms;             /* --gaps: log gaps of more loop CPU than this */
	unsigned long ticks, over; /* gaps, and those of more than 5 ms loop CPU */
	/* loop passes: from epoll_wait's return to the next epoll_wait */
	double pass_cpu0, pass_wall0, pass_max_cpu, pass_max_wall;
	unsigned long passes, passes_over, passes_over_idle;
	int ctl_fd;
	/* The work of the pass in progress (page faults and switches: --gaps) */
	struct work {
		unsigned long reads, writes, mm;
		unsigned long long rbytes, wbytes;
		struct rusage ru;
	} w;
};

/* The calling thread's CPU time, in seconds. */
static double thread_cpu(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The server's loop passes, measured where libevent waits: budget-bench
 * defines epoll_wait, which libevent's epoll backend calls (an
 * executable's definition comes before libc's), and times the server
 * loop thread's CPU from one return to the next call. The 1 ms tick
 * cannot: libevent's timers run on the coarse monotonic clock (4 ms
 * steps with HZ=250), so on a busy loop its gaps are windows of several
 * passes. */
static _Thread_local struct srv *watched;
/* A pass that moved less than this and made no memory call is idle: the
 * loop copies it in well under a millisecond. */
#define IDLE_BYTES (256u << 10)

static void pass_done(struct srv *s)
{
	double cpu = (thread_cpu() - s->pass_cpu0) * 1e3,
	       wall = (tw_ex_now() - s->pass_wall0) * 1e3;
	s->passes++;
	s->passes_over += cpu > 5;
	/* Over 5 ms of CPU with next to nothing done: time the thread was
	 * charged, not its work (docs/design.md, Receive path 4). */
	s->passes_over_idle += cpu > 5 && s->w.rbytes + s->w.wbytes < IDLE_BYTES && s->w.mm == 0;
	if (cpu > s->pass_max_cpu)
		s->pass_max_cpu = cpu;
	if (wall > s->pass_max_wall)
		s->pass_max_wall = wall;
	if (s->log_ms > 0 && cpu > s->log_ms) {
		struct rusage ru;
		getrusage(RUSAGE_THREAD, &ru);
		fprintf(stderr,
			"server: pass %.6f-%.6f: %.1f ms (%.1f ms CPU): read %lu x %.2f MB, "
			"wrote %lu x %.2f MB, %lu memory calls, %ld page faults, %ld+%ld "
			"switches\n",
			s->pass_wall0, s->pass_wall0 + wall * 1e-3, wall, cpu, s->w.reads,
			(double)s->w.rbytes * 1e-6, s->w.writes, (double)s->w.wbytes * 1e-6,
			s->w.mm, ru.ru_minflt - s->w.ru.ru_minflt, ru.ru_nvcsw - s->w.ru.ru_nvcsw,
			ru.ru_nivcsw - s->w.ru.ru_nivcsw);
	}
}

/* The server loop's reads, writes and memory calls, counted for the pass
 * (the library's calls reach these before libc's, as epoll_wait below). */
static ssize_t counted(ssize_t n, int write)
{
	struct srv *s = watched;
	if (s == NULL)
		return n;
	if (write)
		s->w.writes++;
	else
		s->w.reads++;
	if (n > 0 && write)
		s->w.wbytes += (unsigned long long)n;
	else if (n > 0)
		s->w.rbytes += (unsigned long long)n;
	return n;
}

__attribute__((visibility("default"))) ssize_t recv(int fd, void *buf, size_t len, int flags)
{
	return counted(syscall(SYS_recvfrom, fd, buf, len, flags, NULL, NULL), 0);
}

__attribute__((visibility("default"))) ssize_t readv(int fd, const struct iovec *iov, int n)
{
	return counted(syscall(SYS_readv, fd, iov, n), 0);
}

__attribute__((visibility("default"))) ssize_t send(int fd, const void *buf, size_t len, int flags)
{
	return counted(syscall(SYS_sendto, fd, buf, len, flags, NULL, 0), 1);
}

__attribute__((visibility("default"))) ssize_t sendmsg(int fd, const struct msghdr *m, int flags)
{
	return counted(syscall(SYS_sendmsg, fd, m, flags), 1);
}

static long mm_call(long rv)
{
	struct srv *s = watched;
	if (s != NULL)
		s->w.mm++;
	return rv;
}

__attribute__((visibility("default"))) int mprotect(void *p, size_t len, int prot)
{
	return (int)mm_call(syscall(SYS_mprotect, p, len, prot));
}

__attribute__((visibility("default"))) int munmap(void *p, size_t len)
{
	return (int)mm_call(syscall(SYS_munmap, p, len));
}

__attribute__((visibility("default"))) int madvise(void *p, size_t len, int advice)
{
	return (int)mm_call(syscall(SYS_madvise, p, len, advice));
}

__attribute__((visibility("default"))) int mincore(void *p, size_t len, unsigned char *vec)
{
	return (int)mm_call(syscall(SYS_mincore, p, len, vec));
}

__attribute__((visibility("default"))) int epoll_wait(int epfd, struct epoll_event *events,
						      int maxevents, int timeout)
{
	struct srv *s = watched;
	int n;
	if (s != NULL && s->pass_wall0 > 0)
		pass_done(s);
	n = (int)syscall(SYS_epoll_wait, epfd, events, maxevents, timeout);
	if (s != NULL) {
		memset(&s->w, 0, sizeof(s->w));
		if (s->log_ms > 0)
			getrusage(RUSAGE_THREAD, &s->w.ru);
		s->pass_cpu0 = thread_cpu();
		s->pass_wall0 = tw_ex_now();
	}
	return n;
}

struct conn {
	tw_comm *comm;
	tw_msg **pending;
	size_t n, cap;
};

static void srv_tick(evutil_socket_t fd, short what, void *arg)
{
	struct srv *s = arg;
	double now = tw_ex_now(), cpu = thread_cpu();
	(void)fd;
	(void)what;
	if (s->last > 0 && now - s->last > s->max_gap)
		s->max_gap = now - s->last;
	if (s->last > 0 && cpu - s->last_cpu > s->max_cpu)
		s->max_cpu = cpu - s->last_cpu;
	if (s->last > 0) {
		s->ticks++;
		s->over += cpu - s->last_cpu > 5e-3;
	}
	/* CLOCK_MONOTONIC, as `perf record -k mono` stamps its samples */
	if (s->last > 0 && s->log_ms > 0 && (cpu - s->last_cpu) * 1e3 > s->log_ms)
		fprintf(stderr, "server: gap %.6f-%.6f: %.1f ms (%.1f ms CPU)\n", s->last, now,
			(now - s->last) * 1e3, (cpu - s->last_cpu) * 1e3);
	s->last = now;
	s->last_cpu = cpu;
}

static void flush_pending(struct conn *c)
{
	size_t done = 0;
	while (done < c->n && tw_comm_write(c->comm, c->pending[done]) == 0)
		done++;
	memmove(c->pending, c->pending + done, (c->n - done) * sizeof(*c->pending));
	c->n -= done;
	if (c->n == 0)
		tw_comm_resume(c->comm);
}

static void echo_recv(tw_comm *comm, tw_msg *msg, void *arg)
{
	struct conn *c = arg;
	tw_msg_hold(msg);
	if (c->n == 0 && tw_comm_write(comm, msg) == 0)
		return;
	if (c->n == c->cap) {
		c->cap = c->cap ? 2 * c->cap : 4;
		if ((c->pending = realloc(c->pending, c->cap * sizeof(*c->pending))) == NULL)
			abort();
	}
	c->pending[c->n++] = msg;
	tw_comm_pause(comm);
}

static void echo_drain(tw_comm *comm, void *arg)
{
	(void)comm;
	flush_pending(arg);
}

static void conn_close(tw_comm *comm, int err, void *arg)
{
	struct conn *c = arg;
	(void)err;
	for (size_t i = 0; i < c->n; i++)
		tw_msg_free(c->pending[i]);
	free(c->pending);
	free(c);
	tw_comm_free(comm);
}

static void echo_accept(tw_listener *l, tw_comm *comm, void *arg)
{
	struct conn *c = calloc(1, sizeof(*c));
	(void)l;
	(void)arg;
	c->comm = comm;
	tw_comm_set_callbacks(comm, echo_recv, conn_close, echo_drain, c);
}

/* Bombs: decoded (offloaded), freed here on the loop, answered "ok". */
static void bomb_decoded(tw_comm *comm, tw_decoded *d, int err, const char *detail, void *arg)
{
	static const uint8_t ok[2] = {'o', 'k'};
	tw_msg *m;
	(void)arg;
	if (err != 0)
		fprintf(stderr, "server: bomb not decoded: %s (%s)\n", tw_strerror(err), detail);
	tw_decoded_free(d);
	if (tw_msg_new(&m) == 0 && tw_msg_append_copy(m, ok, sizeof(ok)) == 0 &&
	    tw_comm_write(comm, m) == 0)
		return;
	tw_msg_free(m);
}

static void bomb_close(tw_comm *comm, int err, void *arg)
{
	(void)err;
	(void)arg;
	tw_comm_free(comm);
}

static void bomb_accept(tw_listener *l, tw_comm *comm, void *arg)
{
	(void)l;
	(void)arg;
	tw_comm_set_decoded_callbacks(comm, bomb_decoded, bomb_close, NULL, NULL);
}

/* Control: 'r' resets the longest gap, 'q' answers "HWM GAP_MS CPU_MS
 * TICKS OVER PASS_CPU_MS PASS_WALL_MS PASSES PASSES_OVER IDLE" (OVER: gaps or
 * passes of more than 5 ms loop CPU; IDLE: those passes that were idle). */
static void srv_ctl(evutil_socket_t fd, short what, void *arg)
{
	struct srv *s = arg;
	char c, out[128];
	(void)what;
	if (read(fd, &c, 1) != 1) {
		event_base_loopbreak(s->base);
		return;
	}
	if (c == 'r') {
		s->max_gap = s->max_cpu = 0;
		s->last = 0;
		s->ticks = s->over = 0;
		s->pass_max_cpu = s->pass_max_wall = 0;
		s->passes = s->passes_over = s->passes_over_idle = 0;
		return;
	}
	snprintf(out, sizeof(out), "%llu %.3f %.3f %lu %lu %.3f %.3f %lu %lu %lu\n",
		 (unsigned long long)tw_ex_peak_rss(), s->max_gap * 1e3, s->max_cpu * 1e3, s->ticks,
		 s->over, s->pass_max_cpu, s->pass_max_wall, s->passes, s->passes_over,
		 s->passes_over_idle);
	if (write(fd, out, strlen(out)) < 0)
		event_base_loopbreak(s->base);
}

static int server_main(int ctl_fd, int out_fd, uint64_t budget, long long cache, double log_ms)
{
	struct srv s = {0};
	struct timeval ms = {0, 1000};
	tw_listener *l1, *l2;
	char a1[128], a2[128], line[300];
	if (cache >= 0)
		tw_block_cache_set_limit((size_t)cache);
	s.log_ms = log_ms;
	watched = &s;
	s.base = event_base_new();
	if (s.base == NULL || tw_context_new(s.base, &s.ctx) != 0)
		return 1;
#ifndef BUDGET_BENCH_NO_BUDGETS
	if (budget > 0 && tw_context_set_receive_budget_bytes(s.ctx, budget) != 0)
		return 1;
#endif
	if (tw_listener_new(s.ctx, "tcp://127.0.0.1:0", echo_accept, &s, &l1) != 0 ||
	    tw_listener_new(s.ctx, "tcp://127.0.0.1:0", bomb_accept, &s, &l2) != 0)
		return 1;
	tw_listener_address(l1, a1, sizeof(a1));
	tw_listener_address(l2, a2, sizeof(a2));
	s.tick = event_new(s.base, -1, EV_PERSIST, srv_tick, &s);
	s.ctl = event_new(s.base, ctl_fd, EV_READ | EV_PERSIST, srv_ctl, &s);
	event_add(s.tick, &ms);
	event_add(s.ctl, NULL);
	snprintf(line, sizeof(line), "%s %s %llu\n", a1, a2, (unsigned long long)tw_ex_peak_rss());
	if (write(out_fd, line, strlen(line)) < 0)
		return 1;
	close(out_fd);
	event_base_dispatch(s.base);
	tw_listener_free(l1);
	tw_listener_free(l2);
	tw_context_free(s.ctx);
	return 0;
}

/* --- the canary: small echoes on a thread of its own --- */

struct canary {
	pthread_t thread;
	struct event_base *base;
	tw_context *ctx;
	tw_comm *comm;
	char addr[128];
	double sent;
	double *rtt;
	size_t n, cap;
	atomic_int phase; /* -1: stop; samples are taken in phases >= 1 */
};

static void canary_send(struct canary *k)
{
	tw_msg *m;
	static const uint8_t ten[10] = "0123456789";
	if (tw_msg_new(&m) != 0 || tw_msg_append_copy(m, ten, sizeof(ten)) != 0 ||
	    tw_comm_write(k->comm, m) != 0)
		abort();
	k->sent = tw_ex_now();
}

static void canary_recv(tw_comm *comm, tw_msg *msg, void *arg)
{
	struct canary *k = arg;
	int phase = atomic_load(&k->phase);
	(void)comm;
	(void)msg;
	if (phase < 0) {
		event_base_loopbreak(k->base);
		return;
	}
	if (phase >= 1) {
		if (k->n == k->cap) {
			k->cap = k->cap ? 2 * k->cap : 65536;
			if ((k->rtt = realloc(k->rtt, k->cap * sizeof(*k->rtt))) == NULL)
				abort();
		}
		k->rtt[k->n++] = (tw_ex_now() - k->sent) * 1e3;
	}
	canary_send(k);
}

static void canary_close(tw_comm *comm, int err, void *arg)
{
	(void)comm;
	fprintf(stderr, "canary: comm ended: %s\n", tw_strerror(err));
	event_base_loopbreak(((struct canary *)arg)->base);
}

static void canary_connected(tw_comm *comm, int err, void *arg)
{
	struct canary *k = arg;
	if (err != 0 || tw_comm_set_callbacks(comm, canary_recv, canary_close, NULL, k) != 0) {
		fprintf(stderr, "canary: connect failed: %s\n", tw_strerror(err));
		exit(1);
	}
	k->comm = comm;
	canary_send(k);
}

static void *canary_main(void *arg)
{
	struct canary *k = arg;
	tw_comm_connect(k->ctx, k->addr, canary_connected, k);
	event_base_dispatch(k->base);
	return NULL;
}

static int cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

/* p50, p99 and max of the canary's samples in [from, to). */
static void canary_line(struct canary *k, size_t from, size_t to, char *out, size_t len)
{
	size_t n = to - from;
	double *v;
	if (n == 0) {
		snprintf(out, len, "canary: no round trip");
		return;
	}
	v = malloc(n * sizeof(*v));
	memcpy(v, k->rtt + from, n * sizeof(*v));
	qsort(v, n, sizeof(*v), cmp);
	snprintf(out, len, "canary %zu round trips: p50 %.3f ms, p99 %.3f ms, max %.3f ms", n,
		 v[n / 2], v[n * 99 / 100], v[n - 1]);
	free(v);
}

/* --- the load (main thread) --- */

struct load {
	struct event_base *base;
	tw_context *ctx;
	const uint8_t *data; /* what every frame holds */
	size_t size;
	size_t want, connected, echoed, bad;
	tw_comm **comms;
};

static void load_recv(tw_comm *comm, tw_msg *msg, void *arg)
{
	struct load *l = arg;
	const tw_slice *f = tw_msg_frame(msg, 0);
	(void)comm;
	if (tw_msg_nframes(msg) != 1 || f->len != l->size ||
	    memcmp(tw_slice_data(f), l->data, l->size) != 0)
		l->bad++;
	if (++l->echoed == l->want)
		event_base_loopbreak(l->base);
}

static void load_close(tw_comm *comm, int err, void *arg)
{
	(void)comm;
	(void)arg;
	fprintf(stderr, "budget-bench: a load comm ended: %s\n", tw_strerror(err));
	exit(1);
}

static void load_connected(tw_comm *comm, int err, void *arg)
{
	struct load *l = arg;
	if (err != 0 || tw_comm_set_callbacks(comm, load_recv, load_close, NULL, l) != 0) {
		fprintf(stderr, "budget-bench: connect failed: %s\n", tw_strerror(err));
		exit(1);
	}
	l->comms[l->connected++] = comm;
	if (l->connected == l->want)
		event_base_loopbreak(l->base);
}

/* n comms to addr, each sending one message of the shared buffer. */
static void run_load(struct load *l, const char *addr, size_t n)
{
	l->want = n;
	l->connected = l->echoed = 0;
	l->comms = calloc(n, sizeof(*l->comms));
	for (size_t i = 0; i < n; i++)
		tw_comm_connect(l->ctx, addr, load_connected, l);
	event_base_dispatch(l->base);
	for (size_t i = 0; i < n; i++) {
		tw_msg *m;
		if (tw_msg_new(&m) != 0 ||
		    tw_msg_append_ref(m, l->data, l->size, NULL, NULL) != 0 ||
		    tw_comm_write(l->comms[i], m) != 0) {
			fprintf(stderr, "budget-bench: write refused\n");
			exit(1);
		}
	}
	event_base_dispatch(l->base);
	for (size_t i = 0; i < n; i++)
		tw_comm_free(l->comms[i]);
	free(l->comms);
}

/* A message whose payload is a zstd frame inflating to `size` zero bytes. */
static tw_msg *bomb(size_t size)
{
	tw_block *blk;
	if (tw_block_new(size, &blk) != 0)
		return NULL;
	return tw_ex_data_msg("nbytes", "zstd", blk, size);
}

struct bombs {
	struct event_base *base;
	tw_comm *comm;
	tw_msg *m;
	int left;
};

static void bomb_reply(tw_comm *comm, tw_msg *msg, void *arg)
{
	struct bombs *b = arg;
	(void)msg;
	if (--b->left == 0) {
		event_base_loopbreak(b->base);
		return;
	}
	if (tw_comm_write(comm, tw_msg_hold(b->m)) != 0)
		exit(1);
}

static void bomb_connected(tw_comm *comm, int err, void *arg)
{
	struct bombs *b = arg;
	if (err != 0 || tw_comm_set_callbacks(comm, bomb_reply, load_close, NULL, b) != 0 ||
	    tw_comm_write(comm, tw_msg_hold(b->m)) != 0) {
		fprintf(stderr, "budget-bench: bomb connect failed: %s\n", tw_strerror(err));
		exit(1);
	}
	b->comm = comm;
}

/* The server's peak RSS, its loop's longest gap between two 1 ms ticks
 * (wall clock: preemption on a loaded machine counts), and the most CPU
 * time its loop thread spent between two ticks (the work one pass did,
 * which is what the library controls): stored in gap[0] and gap[1], ms. */
static double stall_cpu_ms, pass_cpu_ms, pass_wall_ms;
static unsigned long stall_ticks, stall_over, passes, passes_over, passes_over_idle;
static char stall_line[256];

static void query(int ctl, uint64_t *hwm, double *gap)
{
	char buf[128];
	ssize_t n;
	unsigned long long h = 0;
	if (write(ctl, "q", 1) != 1 || (n = read(ctl, buf, sizeof(buf) - 1)) <= 0)
		exit(1);
	buf[n] = 0;
	sscanf(buf, "%llu %lf %lf %lu %lu %lf %lf %lu %lu %lu", &h, gap, &stall_cpu_ms,
	       &stall_ticks, &stall_over, &pass_cpu_ms, &pass_wall_ms, &passes, &passes_over,
	       &passes_over_idle);
	*hwm = h;
	snprintf(stall_line, sizeof(stall_line),
		 "server loop longest pass %.1f ms CPU (%.1f ms wall), %lu of %lu passes over 5 ms "
		 "CPU (%lu of them idle); 1 ms tick longest gap %.1f ms (%.1f ms CPU), %lu of %lu "
		 "over 5 ms CPU",
		 pass_cpu_ms, pass_wall_ms, passes_over, passes, passes_over_idle, *gap,
		 stall_cpu_ms, stall_over, stall_ticks);
}

static void reset_gap(int ctl)
{
	if (write(ctl, "r", 1) != 1)
		exit(1);
}

int main(int argc, char **argv)
{
	uint64_t size = (uint64_t)100 << 20, budget = (uint64_t)1 << 30,
		 bomb_size = (uint64_t)2047 << 20, hwm0, hwm;
	size_t peers = 50, nbig = 2, bombs_n = 3;
	long long cache = -1;
	double log_ms = 0;
	uint64_t big[8] = {(uint64_t)1 << 30, (uint64_t)2 << 30};
	int ctl[2], out[2];
	char a1[128], a2[128], line[300];
	struct canary k = {0};
	struct load l = {0};
	double gap;
	pid_t pid;
	FILE *f;
	static const struct option opts[] = {
		{"peers", 1, 0, 'n'}, {"size", 1, 0, 's'},  {"budget", 1, 0, 'b'},
		{"big", 1, 0, 'g'},   {"bombs", 1, 0, 'z'}, {"bomb-size", 1, 0, 'Z'},
		{"cache", 1, 0, 'c'}, {"gaps", 1, 0, 'G'},  {0, 0, 0, 0}};
	for (int c; (c = getopt_long(argc, argv, "", opts, NULL)) != -1;) {
		char *tok, *save = NULL;
		switch (c) {
		case 'n': peers = (size_t)strtoull(optarg, NULL, 10); break;
		case 's': size = tw_ex_parse_size(optarg); break;
		case 'b': budget = tw_ex_parse_size(optarg); break;
		case 'z': bombs_n = (size_t)strtoull(optarg, NULL, 10); break;
		case 'Z': bomb_size = tw_ex_parse_size(optarg); break;
		case 'c': cache = (long long)tw_ex_parse_size(optarg); break;
		case 'G': log_ms = strtod(optarg, NULL); break;
		case 'g':
			nbig = 0;
			if (strcmp(optarg, "none") == 0)
				break;
			for (tok = strtok_r(optarg, ",", &save); tok != NULL && nbig < 8;
			     tok = strtok_r(NULL, ",", &save))
				big[nbig++] = tw_ex_parse_size(tok);
			break;
		default: return 2;
		}
	}
	signal(SIGPIPE, SIG_IGN);
	if (socketpair(AF_UNIX, SOCK_STREAM, 0, ctl) != 0 || pipe(out) != 0)
		return 1;
	if ((pid = fork()) == 0) {
		close(ctl[0]);
		close(out[0]);
		_exit(server_main(ctl[1], out[1], budget, cache, log_ms));
	}
	close(ctl[1]);
	close(out[1]);
	if ((f = fdopen(out[0], "r")) == NULL || fgets(line, sizeof(line), f) == NULL ||
	    sscanf(line, "%127s %127s %llu", a1, a2, (unsigned long long *)&hwm0) != 3) {
		fprintf(stderr, "budget-bench: server did not start\n");
		return 1;
	}
	fclose(f);
	printf("server pid %d, echo %s, decode %s, receive budget %llu MiB, idle RSS %llu MiB\n",
	       (int)pid, a1, a2, (unsigned long long)(budget >> 20),
	       (unsigned long long)(hwm0 >> 20));
	fflush(stdout); /* the pid, for perf and strace, before the load */

	/* the canary, on a loop thread of its own */
	k.base = event_base_new();
	tw_context_new(k.base, &k.ctx);
	snprintf(k.addr, sizeof(k.addr), "%s", a1);
	pthread_create(&k.thread, NULL, canary_main, &k);

	l.base = event_base_new();
	tw_context_new(l.base, &l.ctx);
#ifndef BUDGET_BENCH_NO_BUDGETS
	tw_context_set_receive_budget_bytes(l.ctx, UINT64_MAX >> 1); /* the client takes all */
	tw_context_set_write_budget_bytes(l.ctx, UINT64_MAX >> 1);
#endif

	/* 1. load */
	l.size = size;
	l.data = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	for (size_t i = 0; i < size; i++)
		((uint8_t *)l.data)[i] = (uint8_t)(i * 131 + 7);
	reset_gap(ctl[0]);
	atomic_store(&k.phase, 1);
	{
		double t0 = tw_ex_now();
		run_load(&l, a1, peers);
		atomic_store(&k.phase, 2);
		query(ctl[0], &hwm, &gap);
		canary_line(&k, 0, k.n, line, sizeof(line));
		printf("load: %zu peers x %llu MiB echoed (%zu bad) in %.2f s | server VmHWM %llu "
		       "MiB "
		       "(budget + %.1f%%) | %s | %s\n",
		       peers, (unsigned long long)(size >> 20), l.bad, tw_ex_now() - t0,
		       (unsigned long long)(hwm >> 20),
		       budget ? 100.0 * ((double)hwm - (double)budget) / (double)budget : 0.0,
		       stall_line, line);
		fflush(stdout);
	}
	munmap((void *)l.data, size);

	/* 2. large frees */
	for (size_t i = 0; i < nbig; i++) {
		size_t from;
		l.size = big[i];
		l.data = mmap(NULL, big[i], PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1,
			      0);
		memset((void *)l.data, 0x5a, big[i]);
		usleep(200000);
		from = k.n;
		reset_gap(ctl[0]);
		run_load(&l, a1, 1);
		usleep(200000); /* the server frees the echo once written */
		query(ctl[0], &hwm, &gap);
		canary_line(&k, from, k.n, line, sizeof(line));
		printf("free: one %llu MiB message echoed (%zu bad) | %s | %s\n",
		       (unsigned long long)(big[i] >> 20), l.bad, stall_line, line);
		fflush(stdout);
		munmap((void *)l.data, big[i]);
	}

	/* 3. zstd bombs to the decoding listener */
	if (bombs_n > 0) {
		struct bombs b = {l.base, NULL, bomb(bomb_size), (int)bombs_n};
		size_t from;
		if (b.m == NULL)
			return 1;
		usleep(200000);
		from = k.n;
		reset_gap(ctl[0]);
		tw_comm_connect(l.ctx, a2, bomb_connected, &b);
		event_base_dispatch(l.base);
		query(ctl[0], &hwm, &gap);
		canary_line(&k, from, k.n, line, sizeof(line));
		printf("bombs: %zu x %llu bytes inflating to %llu MiB, decoded and freed | %s | "
		       "%s\n",
		       bombs_n, (unsigned long long)tw_msg_bytes(b.m),
		       (unsigned long long)(bomb_size >> 20), stall_line, line);
		tw_comm_free(b.comm);
		tw_msg_free(b.m);
	}

	atomic_store(&k.phase, -1);
	pthread_join(k.thread, NULL);
	tw_comm_free(k.comm);
	tw_context_free(k.ctx);
	event_base_free(k.base);
	free(k.rtt);
	close(ctl[0]);
	kill(pid, SIGTERM);
	waitpid(pid, NULL, 0);
	tw_context_free(l.ctx);
	event_base_free(l.base);
	return 0;
}
