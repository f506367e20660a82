/* SPDX-License-Identifier: BSD-3-Clause */
/* rpc-load: a lean load generator of small RPCs for one Dask-protocol
 * server over tcp (bench/loops-bench.sh; issue 20, "every core"), built
 * the way wrk, memtier or redis-benchmark -P are: C, one thread, raw
 * non-blocking sockets and epoll, requests encoded once, replies counted
 * by their frame lengths and never decoded.
 *
 *   rpc-load URI COMMS SECONDS [DEPTH [SERVER_PID]]
 *       COMMS connections to URI (tcp://A.B.C.D:PORT). Each writes the
 *       Dask handshake and reads the server's, then keeps DEPTH echo calls
 *       of 10 bytes in flight (default 1; 1 to 64): each reply read is
 *       answered with one more call. Counts the replies of SECONDS seconds
 *       after one second of warm-up, and prints
 *         comms C depth D: N round trips/s, server CPU X cores, S us per
 *         round trip, client CPU Y cores, C us per round trip, server
 *         threads (cores) X1 X2 ...
 *       (the server's part with SERVER_PID only: utime + stime of all its
 *       threads from /proc/PID/stat, then of each thread that used more
 *       than 0.01 core, busiest first, from /proc/PID/task/TID/stat: how
 *       the work spread over its loop threads; the client's from
 *       getrusage).
 *
 * The bytes are the taskwire client's: the handshake is the map
 * src/protocol/handshake.c writes ({"compression": nil, "python":
 * [3, 11, 2], "pickle-protocol": 5}, packed the same way with msgpack-c),
 * the request is the one bench/rpc-client.c sends through a tw_pool
 * (examples/common.h tw_ex_small_echo, built here by the library's own
 * tw_builder), and both go out in Dask's tcp framing
 * (distributed/comm/tcp.py write: u64 total bytes of what follows, then
 * pack_frames_prelude: u64 frame count, u64 length per frame; then the
 * frames; little-endian). A reply is consumed by its first u64 alone.
 *
 * Per ready comm and wakeup: one recv, and one send of as many calls as
 * replies it read (DEPTH copies of the request are laid out once, so a
 * send copies nothing). That is the floor for a peer that uses the
 * sockets API: it is what a round trip costs the kernel on the client's
 * side, and on loopback the client's send also runs the server's TCP
 * receive (and the server's send the client's). Not a test: no pass or
 * fail. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <msgpack.h>
#include <taskwire/taskwire.h>

#include "examples/common.h"

#define MAX_DEPTH 64

struct conn {
	int fd;
	int ready; /* the server's handshake came */
	size_t have;
	uint8_t buf[4096];
};

/* Dask's tcp framing of a message's n frames (pointers and lengths)
 * into out (of cap bytes); returns the length, 0 when it does not fit. */
static size_t frame_msg(uint8_t *out, size_t cap, const uint8_t *const *data, const size_t *len,
			size_t n)
{
	uint64_t total = 8 + 8 * (uint64_t)n, word;
	size_t off = 16 + 8 * n;
	for (size_t i = 0; i < n; i++)
		total += len[i];
	if (8 + total > cap)
		return 0;
	memcpy(out, &total, 8); /* little-endian hosts only, as Dask's "Q" on x86 */
	word = n;
	memcpy(out + 8, &word, 8);
	for (size_t i = 0; i < n; i++) {
		word = len[i];
		memcpy(out + 16 + 8 * i, &word, 8);
		memcpy(out + off, data[i], len[i]);
		off += len[i];
	}
	return off;
}

/* The handshake, packed as write_info in src/protocol/handshake.c does. */
static size_t encode_hello(uint8_t *out, size_t cap)
{
	msgpack_sbuffer sb;
	msgpack_packer pk;
	const uint8_t *data;
	size_t n, len;
	msgpack_sbuffer_init(&sb);
	msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
	msgpack_pack_map(&pk, 3);
	tw_msgpack_pack_str(&pk, "compression");
	msgpack_pack_nil(&pk);
	tw_msgpack_pack_str(&pk, "python");
	msgpack_pack_array(&pk, 3);
	msgpack_pack_uint8(&pk, 3);
	msgpack_pack_uint8(&pk, 11);
	msgpack_pack_uint8(&pk, 2);
	tw_msgpack_pack_str(&pk, "pickle-protocol");
	msgpack_pack_uint8(&pk, 5);
	data = (const uint8_t *)sb.data;
	len = sb.size;
	n = frame_msg(out, cap, &data, &len, 1);
	msgpack_sbuffer_destroy(&sb);
	return n;
}

/* The echo call of bench/rpc-client.c, made by the library's builder. */
static size_t encode_request(uint8_t *out, size_t cap)
{
	tw_msg *m = tw_ex_small_echo();
	const uint8_t *data[8];
	size_t n = m != NULL ? tw_msg_nframes(m) : 0, lens[8], len = 0;
	if (n >= 1 && n <= 8) {
		for (size_t i = 0; i < n; i++) {
			data[i] = tw_slice_data(tw_msg_frame(m, i));
			lens[i] = tw_msg_frame(m, i)->len;
		}
		len = frame_msg(out, cap, data, lens, n);
	}
	tw_msg_free(m);
	return len;
}

static double self_cpu(void)
{
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 +
	       (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
}

/* utime + stime from a /proc stat file, in seconds (-1: unknown). */
static double stat_cpu(const char *path)
{
	char line[1024], *p;
	unsigned long ut, st;
	FILE *f = fopen(path, "r");
	if (f == NULL)
		return -1;
	p = fgets(line, sizeof(line), f);
	fclose(f);
	if (p == NULL || (p = strrchr(line, ')')) == NULL ||
	    sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) != 2)
		return -1;
	return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

/* A process (all its threads), and up to MAX_TASKS of its threads. */
#define MAX_TASKS 64
struct cpu_snap {
	double all;
	int n;
	long tid[MAX_TASKS];
	double cpu[MAX_TASKS];
};

static void proc_cpu(long pid, struct cpu_snap *snap)
{
	char path[64];
	DIR *d;
	struct dirent *e;
	snprintf(path, sizeof(path), "/proc/%ld/stat", pid);
	snap->all = pid > 0 ? stat_cpu(path) : -1;
	snap->n = 0;
	snprintf(path, sizeof(path), "/proc/%ld/task", pid);
	if (pid <= 0 || (d = opendir(path)) == NULL)
		return;
	while ((e = readdir(d)) != NULL && snap->n < MAX_TASKS) {
		char tpath[300];
		long tid = atol(e->d_name);
		if (tid <= 0)
			continue;
		snprintf(tpath, sizeof(tpath), "/proc/%ld/task/%ld/stat", pid, tid);
		snap->tid[snap->n] = tid;
		snap->cpu[snap->n++] = stat_cpu(tpath);
	}
	closedir(d);
}

/* The cores each thread of the server used between a and b, busiest
 * first, those above 0.01 core: how the work spread over its loops. */
static void print_threads(const struct cpu_snap *a, const struct cpu_snap *b, double dt)
{
	double used[MAX_TASKS];
	int n = 0;
	for (int i = 0; i < b->n; i++)
		for (int j = 0; j < a->n; j++)
			if (a->tid[j] == b->tid[i] && a->cpu[j] >= 0 && b->cpu[i] >= 0)
				used[n++] = (b->cpu[i] - a->cpu[j]) / dt;
	for (int i = 1; i < n; i++) /* insertion sort, descending */
		for (int j = i; j > 0 && used[j] > used[j - 1]; j--) {
			double t = used[j];
			used[j] = used[j - 1];
			used[j - 1] = t;
		}
	printf(", server threads (cores)");
	for (int i = 0; i < n && used[i] >= 0.01; i++)
		printf(" %.2f", used[i]);
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
	if (w != (ssize_t)n) /* at most 64 small calls into a socket the replies emptied */
		die("send");
}

/* Whole messages at the front of c->buf: consumed by their first u64
 * (the bytes that follow it), and counted. */
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
			fprintf(stderr, "rpc-load: a reply of %llu bytes\n",
				(unsigned long long)total);
			exit(1);
		}
		if (c->have - off < 8 + total)
			break;
		off += 8 + total;
		n++;
	}
	if (off < c->have)
		memmove(c->buf, c->buf + off, c->have - off);
	c->have -= off;
	return n;
}

static int run(const char *uri, int ncomms, double seconds, int depth, long server_pid)
{
	struct sockaddr_in sa;
	struct conn *conns = calloc((size_t)ncomms, sizeof(*conns));
	struct epoll_event evs[1024];
	uint8_t hello[128], req[128], *burst;
	size_t hello_len = encode_hello(hello, sizeof(hello));
	size_t req_len = encode_request(req, sizeof(req));
	int ep = epoll_create1(EPOLL_CLOEXEC), ready = 0, measuring = 0;
	long long counted = 0;
	double t0 = 0, t1 = 0, c0 = 0, warm, end, giveup;
	static struct cpu_snap s0, s1;
	burst = malloc(req_len * MAX_DEPTH + 1);
	if (conns == NULL || burst == NULL || ep < 0 || hello_len == 0 || req_len == 0 ||
	    parse_uri(uri, &sa) != 0) {
		fprintf(stderr, "rpc-load: bad URI, or no memory\n");
		return 1;
	}
	for (int j = 0; j < MAX_DEPTH; j++) /* laid out once: sends copy nothing */
		memcpy(burst + (size_t)j * req_len, req, req_len);
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
	warm = end = tw_ex_now() + 1e9; /* set once every comm is up */
	giveup = tw_ex_now() + 60;      /* every handshake by then */
	for (;;) {
		int n = epoll_wait(ep, evs, 1024, 1000);
		double t;
		if (n < 0 && errno != EINTR)
			die("epoll_wait");
		for (int k = 0; k < n; k++) {
			struct conn *c = &conns[evs[k].data.u32];
			ssize_t r = recv(c->fd, c->buf + c->have, sizeof(c->buf) - c->have, 0);
			int got;
			if (r <= 0) {
				if (r < 0 && errno == EAGAIN)
					continue;
				fprintf(stderr, "rpc-load: the server closed a comm\n");
				return 1;
			}
			c->have += (size_t)r;
			if ((got = take_messages(c)) == 0)
				continue;
			if (!c->ready) { /* the server's handshake, then our first calls */
				c->ready = 1;
				got = got - 1 + depth;
				if (++ready == ncomms) {
					warm = tw_ex_now() + 1.0;
					end = warm + seconds;
				}
			} else if (measuring) {
				counted += got;
			}
			if (got > 0)
				send_all(c->fd, burst, (size_t)got * req_len);
		}
		t = tw_ex_now();
		if (ready < ncomms && t >= giveup) {
			fprintf(stderr, "rpc-load: %d of %d comms did their handshake\n", ready,
				ncomms);
			return 1;
		}
		if (!measuring && t >= warm) {
			measuring = 1;
			t0 = t;
			proc_cpu(server_pid, &s0);
			c0 = self_cpu();
		} else if (measuring && t >= end) {
			t1 = t;
			break;
		}
	}
	{
		double dt = t1 - t0, c1, rts = (double)counted;
		proc_cpu(server_pid, &s1);
		c1 = self_cpu();
		printf("comms %d depth %d: %.0f round trips/s", ncomms, depth, rts / dt);
		if (s0.all >= 0 && s1.all >= 0)
			printf(", server CPU %.2f cores, %.2f us per round trip",
			       (s1.all - s0.all) / dt, (s1.all - s0.all) * 1e6 / rts);
		printf(", client CPU %.2f cores, %.2f us per round trip", (c1 - c0) / dt,
		       (c1 - c0) * 1e6 / rts);
		if (s0.all >= 0 && s1.all >= 0)
			print_threads(&s0, &s1, dt);
		printf("\n");
	}
	for (int i = 0; i < ncomms; i++)
		close(conns[i].fd);
	close(ep);
	free(conns);
	free(burst);
	return 0;
}

int main(int argc, char **argv)
{
	int depth;
	if (argc < 4 || argc > 6) {
		fprintf(stderr, "usage: rpc-load URI COMMS SECONDS [DEPTH [SERVER_PID]]\n");
		return 2;
	}
	depth = argc >= 5 ? atoi(argv[4]) : 1;
	if (depth < 1 || depth > MAX_DEPTH) {
		fprintf(stderr, "rpc-load: DEPTH is 1 to %d\n", MAX_DEPTH);
		return 2;
	}
	tw_ex_raise_files();
	return run(argv[1], atoi(argv[2]), atof(argv[3]), depth, argc >= 6 ? atol(argv[5]) : 0);
}
