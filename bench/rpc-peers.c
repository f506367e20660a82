/* SPDX-License-Identifier: BSD-3-Clause */
/* rpc-peers: the small-RPC baselines for bench/rpc-bench.sh: a 10-byte
 * echo over loopback tcp with ZeroMQ REQ/REP, NNG req/rep, and raw epoll
 * (the floor: the syscalls any epoll-driven peer pays per message, send,
 * epoll_wait and recv on each side, with no protocol at all). The ZeroMQ
 * and NNG clients take a payload SIZE too (bench/report.sh's throughput
 * against message size).
 *
 *   rpc-peers zmq-server PORT | zmq-client PORT COUNT [SIZE]
 *   rpc-peers nng-server PORT | nng-client PORT COUNT [SIZE]
 *   rpc-peers raw-server PORT | raw-client PORT COUNT
 * Clients print "<name>: N round trips/s, p50 X us, p99 Y us, Z MB/s
 * payload each way".
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <nng/nng.h>
#include <nng/protocol/reqrep0/rep.h>
#include <nng/protocol/reqrep0/req.h>
#include <zmq.h>

#include "examples/common.h"

static int cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static void report_sized(const char *name, double *lat, size_t n, double secs, size_t size)
{
	qsort(lat, n, sizeof(double), cmp);
	printf("%s: %.0f round trips/s, p50 %.1f us, p99 %.1f us, %.1f MB/s payload each way\n",
	       name, (double)n / secs, lat[n / 2], lat[n * 99 / 100],
	       (double)size * (double)n / secs / 1e6);
}

static void report(const char *name, double *lat, size_t n, double secs)
{
	report_sized(name, lat, n, secs, 10);
}

/* The payload of COUNT echoes: "0123456789" repeated to SIZE bytes. */
static char *payload(size_t size)
{
	char *p = malloc(size);
	for (size_t i = 0; p != NULL && i < size; i++)
		p[i] = (char)('0' + i % 10);
	return p;
}

static int zmq_server(const char *port)
{
	void *ctx = zmq_ctx_new(), *s = zmq_socket(ctx, ZMQ_REP);
	char addr[64];
	snprintf(addr, sizeof(addr), "tcp://127.0.0.1:%s", port);
	if (zmq_bind(s, addr) != 0)
		return 1;
	for (;;) {
		zmq_msg_t m;
		zmq_msg_init(&m);
		if (zmq_msg_recv(&m, s, 0) < 0 || zmq_msg_send(&m, s, 0) < 0)
			return 1;
	}
}

static int zmq_client(const char *port, long count, size_t size)
{
	void *ctx = zmq_ctx_new(), *s = zmq_socket(ctx, ZMQ_REQ);
	char addr[64], *msg = payload(size), *buf = malloc(size);
	double *lat = malloc((size_t)count * sizeof(double)), t0;
	snprintf(addr, sizeof(addr), "tcp://127.0.0.1:%s", port);
	if (lat == NULL || msg == NULL || buf == NULL || zmq_connect(s, addr) != 0)
		return 1;
	t0 = tw_ex_now();
	for (long i = 0; i < count; i++) {
		double t = tw_ex_now();
		if (zmq_send(s, msg, size, 0) != (int)size ||
		    zmq_recv(s, buf, size, 0) != (int)size)
			return 1;
		lat[i] = (tw_ex_now() - t) * 1e6;
	}
	report_sized("zeromq req/rep", lat, (size_t)count, tw_ex_now() - t0, size);
	return 0;
}

static int nng_server(const char *port)
{
	nng_socket s;
	char addr[64];
	snprintf(addr, sizeof(addr), "tcp://127.0.0.1:%s", port);
	if (nng_rep0_open(&s) != 0 || nng_socket_set_size(s, NNG_OPT_RECVMAXSZ, 0) != 0 ||
	    nng_listen(s, addr, NULL, 0) != 0)
		return 1;
	for (;;) {
		nng_msg *m;
		if (nng_recvmsg(s, &m, 0) != 0 || nng_sendmsg(s, m, 0) != 0)
			return 1;
	}
}

static int nng_client(const char *port, long count, size_t size)
{
	nng_socket s;
	char addr[64], *msg = payload(size);
	double *lat = malloc((size_t)count * sizeof(double)), t0;
	snprintf(addr, sizeof(addr), "tcp://127.0.0.1:%s", port);
	/* NNG refuses messages over 1 MiB by default (NNG_OPT_RECVMAXSZ). */
	if (lat == NULL || msg == NULL || nng_req0_open(&s) != 0 ||
	    nng_socket_set_size(s, NNG_OPT_RECVMAXSZ, 0) != 0 || nng_dial(s, addr, NULL, 0) != 0)
		return 1;
	t0 = tw_ex_now();
	for (long i = 0; i < count; i++) {
		double t = tw_ex_now();
		char *buf;
		size_t n;
		if (nng_send(s, msg, size, 0) != 0 || nng_recv(s, &buf, &n, NNG_FLAG_ALLOC) != 0 ||
		    n != size)
			return 1;
		nng_free(buf, n);
		lat[i] = (tw_ex_now() - t) * 1e6;
	}
	report_sized("nng req/rep", lat, (size_t)count, tw_ex_now() - t0, size);
	return 0;
}

/* Raw epoll: nonblocking sockets, one epoll set, 10 bytes each way. */
static int raw_setup(int fd)
{
	int one = 1, ep = epoll_create1(0);
	struct epoll_event ev = {.events = EPOLLIN};
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	if (ep < 0 || fcntl(fd, F_SETFL, O_NONBLOCK) != 0 ||
	    epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) != 0)
		return -1;
	return ep;
}

/* Wait for and read exactly n bytes; -1 at EOF or on an error. */
static int raw_read(int ep, int fd, char *buf, size_t n)
{
	size_t got = 0;
	while (got < n) {
		struct epoll_event ev;
		ssize_t r;
		if (epoll_wait(ep, &ev, 1, -1) < 0 && errno != EINTR)
			return -1;
		r = recv(fd, buf + got, n - got, 0);
		if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR))
			return -1;
		got += r > 0 ? (size_t)r : 0;
	}
	return 0;
}

static struct sockaddr_in raw_addr(const char *port)
{
	struct sockaddr_in a;
	memset(&a, 0, sizeof(a));
	a.sin_family = AF_INET;
	a.sin_port = htons((uint16_t)atoi(port));
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	return a;
}

static int raw_server(const char *port)
{
	struct sockaddr_in a = raw_addr(port);
	int one = 1, l = socket(AF_INET, SOCK_STREAM, 0);
	setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(l, (struct sockaddr *)&a, sizeof(a)) != 0 || listen(l, 8) != 0)
		return 1;
	for (;;) { /* one client at a time, each round a new one */
		char buf[10];
		int fd = accept(l, NULL, NULL), ep = fd < 0 ? -1 : raw_setup(fd);
		while (ep >= 0 && raw_read(ep, fd, buf, sizeof(buf)) == 0 &&
		       send(fd, buf, sizeof(buf), MSG_NOSIGNAL) == (ssize_t)sizeof(buf))
			;
		if (ep >= 0)
			close(ep);
		if (fd >= 0)
			close(fd);
	}
}

static int raw_client(const char *port, long count)
{
	struct sockaddr_in a = raw_addr(port);
	int fd = socket(AF_INET, SOCK_STREAM, 0), ep;
	double *lat = malloc((size_t)count * sizeof(double)), t0;
	char buf[10];
	if (lat == NULL || connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0 ||
	    (ep = raw_setup(fd)) < 0)
		return 1;
	t0 = tw_ex_now();
	for (long i = 0; i < count; i++) {
		double t = tw_ex_now();
		if (send(fd, "0123456789", 10, MSG_NOSIGNAL) != 10 ||
		    raw_read(ep, fd, buf, sizeof(buf)) != 0)
			return 1;
		lat[i] = (tw_ex_now() - t) * 1e6;
	}
	report("raw epoll", lat, (size_t)count, tw_ex_now() - t0);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc == 3 && strcmp(argv[1], "raw-server") == 0)
		return raw_server(argv[2]);
	if (argc == 4 && strcmp(argv[1], "raw-client") == 0)
		return raw_client(argv[2], atol(argv[3]));
	if (argc == 3 && strcmp(argv[1], "zmq-server") == 0)
		return zmq_server(argv[2]);
	size_t size = argc == 5 ? (size_t)atol(argv[4]) : 10;
	if ((argc == 4 || argc == 5) && size > 0 && strcmp(argv[1], "zmq-client") == 0)
		return zmq_client(argv[2], atol(argv[3]), size);
	if (argc == 3 && strcmp(argv[1], "nng-server") == 0)
		return nng_server(argv[2]);
	if ((argc == 4 || argc == 5) && size > 0 && strcmp(argv[1], "nng-client") == 0)
		return nng_client(argv[2], atol(argv[3]), size);
	fprintf(stderr, "usage: rpc-peers {zmq,nng,raw}-server PORT | raw-client PORT COUNT |\n"
			"       {zmq,nng}-client PORT COUNT [SIZE]\n");
	return 2;
}
