/* SPDX-License-Identifier: BSD-3-Clause */
/* loops-bench: aggregate small RPCs against one tw_server on 1 or more
 * loop threads (tw_context_set_loop_threads; issue 20, "every core").
 *
 *   loops-bench server LOOPS
 *       a tw_server (built-in echo) on tcp://127.0.0.1:0 with LOOPS loop
 *       threads; prints "listening on URI"; runs until SIGTERM or SIGINT.
 *   loops-bench client URI COMMS SECONDS [DEPTH [SERVER_PID]]
 *       COMMS connections, each doing the Dask handshake and then echo
 *       calls of 10 bytes, DEPTH in flight per comm (default 1); counts
 *       the replies of SECONDS seconds after one second of warm-up.
 *       Prints round trips/s and, with SERVER_PID, the CPU the server
 *       and the client used meanwhile (from /proc and getrusage).
 *
 * The client is cheap on purpose: one thread, raw epoll, requests
 * pre-encoded, one recv and one send per ready comm per wakeup however
 * many replies it read, so that on a small machine the server, not the
 * load generator, is what is measured. Not a test: no pass or fail. */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>

#include <taskwire/taskwire.h>

/* --- the server --- */

static void on_signal(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	event_base_loopbreak(arg);
}

static int run_server(unsigned loops)
{
	struct event_base *base = event_base_new();
	struct event *term, *intr;
	tw_context *ctx;
	tw_server *s;
	char addr[128];
	if (base == NULL || tw_context_new(base, &ctx) != 0) {
		fprintf(stderr, "loops-bench: no context\n");
		return 1;
	}
	if (tw_context_set_loop_threads(ctx, loops) != 0 || tw_server_new(ctx, &s) != 0 ||
	    tw_server_listen(s, "tcp://127.0.0.1:0") != 0 ||
	    tw_server_address(s, 0, addr, sizeof(addr)) != 0) {
		fprintf(stderr, "loops-bench: server setup failed\n");
		return 1;
	}
	term = evsignal_new(base, SIGTERM, on_signal, base);
	intr = evsignal_new(base, SIGINT, on_signal, base);
	event_add(term, NULL);
	event_add(intr, NULL);
	printf("listening on %s (%u loop threads)\n", addr, loops);
	fflush(stdout);
	event_base_dispatch(base);
	tw_server_free(s);
	tw_context_free(ctx);
	event_free(term);
	event_free(intr);
	event_base_free(base);
	return 0;
}

/* --- the client --- */

struct conn {
	int fd;
	int ready; /* the server's handshake came */
	size_t have;
	uint8_t buf[4096];
};

/* One message of one frame, as the stream framing puts it on the wire:
 * u64 total (16 + len), u64 N = 1, u64 len, then the frame. */
static size_t wire(uint8_t *out, const uint8_t *frame, size_t len)
{
	uint64_t h[3] = {16 + len, 1, len}; /* little-endian hosts only */
	memcpy(out, h, sizeof(h));
	memcpy(out + sizeof(h), frame, len);
	return sizeof(h) + len;
}

/* {"compression": nil, "python": [3, 11, 2], "pickle-protocol": 5} */
static const uint8_t HELLO[] = {0x83, 0xab, 'c',  'o',  'm', 'p', 'r', 'e', 's', 's', 'i',
				'o',  'n',  0xc0, 0xa6, 'p', 'y', 't', 'h', 'o', 'n', 0x93,
				3,    11,   2,    0xaf, 'p', 'i', 'c', 'k', 'l', 'e', '-',
				'p',  'r',  'o',  't',  'o', 'c', 'o', 'l', 5};
/* {"op": "echo", "data": b"0123456789"} */
static const uint8_t ECHO[] = {0x82, 0xa2, 'o', 'p', 0xa4, 'e', 'c', 'h', 'o', 0xa4, 'd', 'a', 't',
			       'a',  0xc4, 10,  '0', '1',  '2', '3', '4', '5', '6',  '7', '8', '9'};

static uint8_t req[64];
static size_t req_len;

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static double self_cpu(void)
{
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 +
	       (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
}

/* utime + stime of a process, in seconds (-1: unknown). */
static double proc_cpu(long pid)
{
	char path[64], line[1024], *p;
	unsigned long ut, st;
	FILE *f;
	snprintf(path, sizeof(path), "/proc/%ld/stat", pid);
	if (pid <= 0 || (f = fopen(path, "r")) == NULL)
		return -1;
	p = fgets(line, sizeof(line), f);
	fclose(f);
	if (p == NULL || (p = strrchr(line, ')')) == NULL ||
	    sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) != 2)
		return -1;
	return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

static int parse_uri(const char *uri, struct sockaddr_in *sa)
{
	unsigned a, b, c, d, port;
	if (sscanf(uri, "tcp://%u.%u.%u.%u:%u", &a, &b, &c, &d, &port) != 5)
		return -1;
	memset(sa, 0, sizeof(*sa));
	sa->sin_family = AF_INET;
	sa->sin_port = htons((uint16_t)port);
	sa->sin_addr.s_addr = htonl(a << 24 | b << 16 | c << 8 | d);
	return 0;
}

static void die(const char *what)
{
	perror(what);
	exit(1);
}

static void send_all(int fd, const uint8_t *p, size_t n)
{
	ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
	if (w != (ssize_t)n) /* small writes into an emptied socket buffer */
		die("send");
}

/* Whole messages at the front of c->buf: consumed, and counted. */
static int take_messages(struct conn *c)
{
	size_t off = 0;
	int n = 0;
	for (;;) {
		uint64_t total;
		if (c->have - off < 8)
			break;
		memcpy(&total, c->buf + off, 8);
		if (total > sizeof(c->buf) - 8) {
			fprintf(stderr, "loops-bench: a reply of %llu bytes\n",
				(unsigned long long)total);
			exit(1);
		}
		if (c->have - off < 8 + total)
			break;
		off += 8 + total;
		n++;
	}
	memmove(c->buf, c->buf + off, c->have - off);
	c->have -= off;
	return n;
}

static int run_client(const char *uri, int ncomms, double seconds, int depth, long server_pid)
{
	struct sockaddr_in sa;
	struct conn *conns = calloc((size_t)ncomms, sizeof(*conns));
	struct epoll_event evs[256];
	uint8_t hello[128], *burst = malloc(req_len * (size_t)(depth > 64 ? depth : 64));
	size_t hello_len = wire(hello, HELLO, sizeof(HELLO));
	int ep = epoll_create1(EPOLL_CLOEXEC), ready = 0;
	long long counted = 0;
	double t0 = 0, t1 = 0, s0 = 0, c0 = 0, warm, end, giveup;
	int measuring = 0;
	if (conns == NULL || burst == NULL || ep < 0 || parse_uri(uri, &sa) != 0) {
		fprintf(stderr, "loops-bench: bad URI or no memory\n");
		return 1;
	}
	for (int i = 0; i < ncomms; i++) {
		struct epoll_event ev = {.events = EPOLLIN, .data.u32 = (uint32_t)i};
		int one = 1, fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
		if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0)
			die("connect");
		setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
		fcntl(fd, F_SETFL, O_NONBLOCK);
		send_all(fd, hello, hello_len);
		conns[i].fd = fd;
		if (epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) != 0)
			die("epoll_ctl");
	}
	warm = now() + 1e9; /* set once every comm is up */
	end = warm;
	giveup = now() + 60; /* every handshake by then */
	for (;;) {
		int n = epoll_wait(ep, evs, 256, 1000);
		double t;
		if (n < 0 && errno != EINTR)
			die("epoll_wait");
		for (int k = 0; k < n; k++) {
			struct conn *c = &conns[evs[k].data.u32];
			ssize_t r = recv(c->fd, c->buf + c->have, sizeof(c->buf) - c->have, 0);
			int got, again;
			if (r <= 0) {
				if (r < 0 && errno == EAGAIN)
					continue;
				fprintf(stderr, "loops-bench: the server closed a comm\n");
				return 1;
			}
			c->have += (size_t)r;
			got = take_messages(c);
			if (got == 0)
				continue;
			if (!c->ready) { /* the server's handshake, then our first calls */
				c->ready = 1;
				got--;
				again = depth;
				if (++ready == ncomms) {
					warm = now() + 1.0;
					end = warm + seconds;
				}
			} else {
				again = got;
				if (measuring)
					counted += got;
			}
			for (int j = 0; j < again; j++)
				memcpy(burst + (size_t)j * req_len, req, req_len);
			if (again > 0)
				send_all(c->fd, burst, (size_t)again * req_len);
		}
		t = now();
		if (ready < ncomms && t >= giveup) {
			fprintf(stderr, "loops-bench: %d of %d comms did their handshake\n", ready,
				ncomms);
			return 1;
		}
		if (!measuring && t >= warm) {
			measuring = 1;
			t0 = t;
			s0 = proc_cpu(server_pid);
			c0 = self_cpu();
		} else if (measuring && t >= end) {
			t1 = t;
			break;
		}
	}
	{
		double dt = t1 - t0, s1 = proc_cpu(server_pid), c1 = self_cpu();
		printf("comms %d depth %d: %.0f round trips/s", ncomms, depth,
		       (double)counted / dt);
		if (s0 >= 0 && s1 >= 0)
			printf(", server CPU %.2f cores, %.0f round trips per server CPU-second",
			       (s1 - s0) / dt, (double)counted / (s1 - s0));
		printf(", client CPU %.2f cores\n", (c1 - c0) / dt);
	}
	for (int i = 0; i < ncomms; i++)
		close(conns[i].fd);
	close(ep);
	free(conns);
	free(burst);
	return 0;
}

/* 1,000 comms on each side: more than the usual soft limit of 1,024
 * files once the server's own are counted. */
static void raise_files(void)
{
	struct rlimit rl;
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		setrlimit(RLIMIT_NOFILE, &rl);
	}
}

int main(int argc, char **argv)
{
	raise_files();
	req_len = wire(req, ECHO, sizeof(ECHO));
	if (argc == 3 && strcmp(argv[1], "server") == 0)
		return run_server((unsigned)atoi(argv[2]));
	if (argc >= 5 && argc <= 7 && strcmp(argv[1], "client") == 0) {
		int depth = argc >= 6 ? atoi(argv[5]) : 1;
		if (depth < 1 || depth > 64)
			depth = 1;
		return run_client(argv[2], atoi(argv[3]), atof(argv[4]), depth,
				  argc >= 7 ? atol(argv[6]) : 0);
	}
	fprintf(stderr, "usage: loops-bench server LOOPS\n"
			"       loops-bench client URI COMMS SECONDS [DEPTH [SERVER_PID]]\n");
	return 2;
}
