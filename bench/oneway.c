/* SPDX-License-Identifier: BSD-3-Clause */
/* oneway: pipelined one-way messages over loopback tcp, for
 * bench/oneway-bench.sh. The process forks: the child sends COUNT messages
 * of SIZE bytes as fast as its peer takes them, the parent receives them
 * and times the stream from its first message to its last.
 *
 *   oneway PEER SIZE COUNT [HWM]
 *
 * PEER:
 *   tw-raw      taskwire, one tw_comm_write per message (one frame of SIZE
 *               bytes, copied into the message as zmq_send copies)
 *   tw-batched  taskwire's batched sender (tw_batched_send of a msgpack map
 *               of SIZE bytes; the receiver counts the maps of each batch
 *               from frame 0's array header, no decoding)
 *   zmq         ZeroMQ PUSH/PULL (default high-water marks)
 *   nng         NNG push0/pull0
 *   tcp         raw blocking sockets, 8-byte length then the bytes: one
 *               write per message, two reads (length, then body)
 *   tw-fill     no stream: the sender queues messages of SIZE bytes until
 *               the high-water mark refuses one, to a peer that does not
 *               read, and prints how many it took and how its RSS grew
 *               (what a queued message costs; COUNT is not used)
 * HWM: the taskwire sender's write high-water mark in bytes (default: the
 * library's, 64 MiB).
 *
 * Prints one line: "PEER SIZE B: N msgs/s, recv X us/msg cpu, send Y us/msg
 * cpu, sender peak RSS Z MB". CPU times are getrusage's (user + system):
 * the receiver's from its first message on, the sender's whole life. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <event2/event.h>
#include <nng/nng.h>
#include <nng/protocol/pipeline0/pull.h>
#include <nng/protocol/pipeline0/push.h>
#include <zmq.h>

#include <taskwire/taskwire.h>

#include "examples/common.h"

/* Messages the sender writes per loop turn before it lets the loop flush
 * them (it goes on at once, unless the high-water mark stopped it). */
#define SEND_CHUNK 256

static size_t size;
static long count;
static uint64_t hwm;

static double cpu_secs(void)
{
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 +
	       (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
}

static char *payload(void)
{
	char *p = malloc(size + 8);
	for (size_t i = 0; p != NULL && i < size + 8; i++)
		p[i] = (char)('0' + i % 10);
	return p;
}

/* The receiver's clock: started at the first message, stopped at the last. */
static long got;
static double t_first, t_last, cpu_first, cpu_last;

static int received(long n)
{
	if (got == 0) {
		t_first = tw_ex_now();
		cpu_first = cpu_secs();
	}
	got += n;
	if (got < count)
		return 0;
	t_last = tw_ex_now();
	cpu_last = cpu_secs();
	return 1;
}

static void die(const char *what)
{
	fprintf(stderr, "oneway: %s failed\n", what);
	exit(1);
}

/* ---- taskwire ---- */

struct tw_side {
	struct event_base *base;
	tw_context *ctx;
	tw_comm *comm;
	tw_batched *batched;
	struct event *more, *quit;
	int batched_mode, fill_mode;
	long sent;
	char *data;
	size_t packed_len;
};

/* The number of maps in a batch: frame 0 starts with the array header. */
static long batch_count(const tw_msg *m)
{
	const tw_slice *f = tw_msg_frame(m, 0);
	const uint8_t *p = f != NULL ? tw_slice_data(f) : NULL;
	if (p == NULL || f->len < 1)
		return -1;
	if ((p[0] & 0xf0) == 0x90)
		return p[0] & 0x0f;
	if (p[0] == 0xdc && f->len >= 3)
		return (long)p[1] << 8 | p[2];
	if (p[0] == 0xdd && f->len >= 5)
		return (long)p[1] << 24 | (long)p[2] << 16 | (long)p[3] << 8 | p[4];
	if (p[0] >= 0x80 && p[0] <= 0x8f) /* a batch of one may be one map */
		return 1;
	return -1;
}

static void tw_recv(tw_comm *comm, tw_msg *m, void *arg)
{
	struct tw_side *t = arg;
	long n = t->batched_mode ? batch_count(m) : tw_msg_bytes(m) == size ? 1 : -1;
	(void)comm;
	if (n < 0)
		die("message check");
	if (received(n))
		event_base_loopbreak(t->base);
}

static void tw_closed(tw_comm *comm, int err, void *arg)
{
	struct tw_side *t = arg;
	(void)comm;
	if (got < count) {
		fprintf(stderr, "oneway: comm ended (%s) after %ld messages\n", tw_strerror(err),
			got);
		exit(1);
	}
	event_base_loopbreak(t->base);
}

static void tw_recv_hs(tw_comm *comm, int err, const tw_handshake_info *info, void *arg)
{
	(void)info;
	if (((struct tw_side *)arg)->fill_mode)
		return; /* never read: the sender's queue fills (and it may go first) */
	if (err != 0)
		die("receiver handshake");
	if (tw_comm_set_callbacks(comm, tw_recv, tw_closed, NULL, arg) != 0)
		die("receiver callbacks");
}

static void tw_accepted(tw_listener *l, tw_comm *comm, void *arg)
{
	struct tw_side *t = arg;
	(void)l;
	t->comm = comm;
	if (tw_comm_handshake(comm, TW_HANDSHAKE_LISTENER, tw_recv_hs, arg) != 0)
		die("handshake");
}

/* Write until the mark refuses or a chunk went; the drain callbacks (or
 * the next loop turn) go on. */
static void tw_send_more(struct tw_side *t)
{
	for (int i = 0; i < SEND_CHUNK && t->sent < count; i++) {
		int rv;
		if (t->batched_mode) {
			rv = tw_batched_send(t->batched, t->data, t->packed_len);
		} else {
			tw_msg *m;
			if (tw_msg_new(&m) != 0 || tw_msg_append_copy(m, t->data, size) != 0)
				die("message");
			if ((rv = tw_comm_write(t->comm, m)) != 0)
				tw_msg_free(m);
		}
		if (rv == TW_EAGAIN)
			return; /* the drain callback goes on */
		if (rv != 0)
			die("write");
		t->sent++;
	}
	if (t->sent < count) {
		/* the next loop turn (event_active would run it in this one,
		 * ahead of the timers: the batch's interval among them) */
		struct timeval now = {0, 0};
		evtimer_add(t->more, &now);
	} else if (t->batched_mode)
		tw_batched_flush(t->batched);
}

static void tw_more(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	tw_send_more(arg);
}

static void tw_drained(tw_comm *comm, void *arg)
{
	(void)comm;
	tw_send_more(arg);
}

static void tw_batched_drained(tw_batched *b, void *arg)
{
	(void)b;
	tw_send_more(arg);
}

static void tw_ignore(tw_comm *comm, tw_msg *m, void *arg)
{
	(void)comm;
	(void)m;
	(void)arg;
}

static void tw_send_closed(tw_comm *comm, int err, void *arg)
{
	(void)comm;
	(void)arg;
	if (err != 0)
		die("sender comm");
}

/* A map of exactly SIZE bytes packed: {"op": "x", "d": bin(...)}. */
static char *packed_map(size_t *len)
{
	msgpack_sbuffer sb;
	msgpack_packer pk;
	size_t pad = size > 16 ? size - 16 : 0;
	for (int tries = 0; tries < 8; tries++) {
		msgpack_sbuffer_init(&sb);
		msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
		msgpack_pack_map(&pk, 2);
		tw_msgpack_pack_str(&pk, "op");
		tw_msgpack_pack_str(&pk, "x");
		tw_msgpack_pack_str(&pk, "d");
		msgpack_pack_bin(&pk, pad);
		msgpack_pack_bin_body(&pk, memset(malloc(pad + 1), 'x', pad), pad);
		if (sb.size == size || pad == 0)
			break;
		pad += size > sb.size ? size - sb.size : 0;
		pad -= sb.size > size ? sb.size - size : 0;
		msgpack_sbuffer_destroy(&sb);
	}
	*len = sb.size;
	return sb.data;
}

/* Queue messages until the mark refuses one, without running the loop
 * (nothing is written meanwhile); say what that cost. */
static void tw_fill(struct tw_side *t)
{
	uint64_t rss0 = tw_ex_rss(), rss1;
	long n = 0;
	for (;;) {
		tw_msg *m;
		if (tw_msg_new(&m) != 0 || tw_msg_append_copy(m, t->data, size) != 0)
			die("message");
		if (tw_comm_write(t->comm, m) != 0) {
			tw_msg_free(m);
			break;
		}
		n++;
	}
	rss1 = tw_ex_rss();
	printf("tw-fill %zu B: %ld messages queued at a %llu-byte mark, %llu bytes of them; RSS "
	       "grew %.1f MB, %.0f B per message\n",
	       size, n, (unsigned long long)(hwm ? hwm : 64 << 20),
	       (unsigned long long)tw_comm_queued_bytes(t->comm), (double)(rss1 - rss0) / 1e6,
	       (double)(rss1 - rss0) / (double)n);
	fflush(stdout);
	_exit(0);
}

static void tw_send_hs(tw_comm *comm, int err, const tw_handshake_info *info, void *arg)
{
	struct tw_side *t = arg;
	(void)info;
	if (t->fill_mode && err == 0)
		tw_fill(t);
	if (err != 0 || tw_comm_set_callbacks(comm, tw_ignore, tw_send_closed,
					      t->batched_mode ? NULL : tw_drained, t) != 0)
		die("sender handshake");
	if (t->batched_mode) {
		if (tw_batched_new(comm, 0, &t->batched) != 0)
			die("batched sender");
		tw_batched_set_drain_cb(t->batched, tw_batched_drained, t);
	}
	tw_send_more(t);
}

static void tw_connected(tw_comm *comm, int err, void *arg)
{
	struct tw_side *t = arg;
	if (err != 0)
		die("connect");
	t->comm = comm;
	if (tw_comm_handshake(comm, TW_HANDSHAKE_CONNECTOR, tw_send_hs, t) != 0)
		die("handshake");
}

static void tw_quit(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	event_base_loopbreak(((struct tw_side *)arg)->base);
}

static void tw_sender(const char *addr, int batched_mode, int fill_mode, int done_fd)
{
	struct tw_side t;
	memset(&t, 0, sizeof(t));
	t.batched_mode = batched_mode;
	t.fill_mode = fill_mode;
	t.base = event_base_new();
	t.data = batched_mode ? packed_map(&t.packed_len) : payload();
	if (t.base == NULL || tw_context_new(t.base, &t.ctx) != 0)
		die("context");
	if (hwm != 0 && tw_context_set_write_hwm_bytes(t.ctx, hwm) != 0)
		die("hwm");
	t.more = evtimer_new(t.base, tw_more, &t);
	t.quit = event_new(t.base, done_fd, EV_READ, tw_quit, &t);
	event_add(t.quit, NULL);
	if (tw_comm_connect(t.ctx, addr, tw_connected, &t) != 0)
		die("connect");
	event_base_dispatch(t.base);
	/* The receiver has them all: no need to flush or close politely. */
	_exit(0);
}

static void tw_receiver(int batched_mode, int fill_fd, int addr_fd)
{
	struct tw_side t;
	tw_listener *l;
	char addr[128];
	memset(&t, 0, sizeof(t));
	t.batched_mode = batched_mode;
	t.fill_mode = fill_fd >= 0;
	t.base = event_base_new();
	if (t.base == NULL || tw_context_new(t.base, &t.ctx) != 0 ||
	    tw_listener_new(t.ctx, "tcp://127.0.0.1:0", tw_accepted, &t, &l) != 0 ||
	    tw_listener_address(l, addr, sizeof(addr)) != 0)
		die("listen");
	if (write(addr_fd, addr, strlen(addr) + 1) < 0)
		die("pipe");
	if (t.fill_mode) { /* until the sender exits (its end of the pipe closes) */
		t.quit = event_new(t.base, fill_fd, EV_READ, tw_quit, &t);
		event_add(t.quit, NULL);
	}
	event_base_dispatch(t.base);
	if (!t.fill_mode && got < count)
		die("receive");
}

/* ---- ZeroMQ ---- */

static void zmq_receiver(int addr_fd)
{
	void *ctx = zmq_ctx_new(), *s = zmq_socket(ctx, ZMQ_PULL);
	char addr[128];
	size_t alen = sizeof(addr);
	zmq_msg_t m;
	if (zmq_bind(s, "tcp://127.0.0.1:*") != 0 ||
	    zmq_getsockopt(s, ZMQ_LAST_ENDPOINT, addr, &alen) != 0)
		die("zmq bind");
	if (write(addr_fd, addr, strlen(addr) + 1) < 0)
		die("pipe");
	zmq_msg_init(&m);
	for (;;) {
		int n = zmq_msg_recv(&m, s, 0);
		if (n != (int)size)
			die("zmq recv");
		if (received(1))
			break;
	}
	zmq_msg_close(&m);
}

static void zmq_sender(const char *addr, int done_fd)
{
	void *ctx = zmq_ctx_new(), *s = zmq_socket(ctx, ZMQ_PUSH);
	char *data = payload(), c;
	if (zmq_connect(s, addr) != 0)
		die("zmq connect");
	for (long i = 0; i < count; i++)
		if (zmq_send(s, data, size, 0) != (int)size)
			die("zmq send");
	while (read(done_fd, &c, 1) > 0)
		;
	_exit(0);
}

/* ---- NNG ---- */

static void nng_receiver(int addr_fd)
{
	nng_socket s;
	nng_listener l;
	nng_sockaddr sa;
	char addr[128];
	if (nng_pull0_open(&s) != 0 || nng_listener_create(&l, s, "tcp://127.0.0.1:0") != 0 ||
	    nng_listener_start(l, 0) != 0 || nng_listener_get_addr(l, NNG_OPT_LOCADDR, &sa) != 0)
		die("nng listen");
	snprintf(addr, sizeof(addr), "tcp://127.0.0.1:%u", ntohs(sa.s_in.sa_port));
	if (write(addr_fd, addr, strlen(addr) + 1) < 0)
		die("pipe");
	for (;;) {
		nng_msg *m;
		if (nng_recvmsg(s, &m, 0) != 0 || nng_msg_len(m) != size)
			die("nng recv");
		nng_msg_free(m);
		if (received(1))
			break;
	}
}

static void nng_sender(const char *addr, int done_fd)
{
	nng_socket s;
	char *data = payload(), c;
	if (nng_push0_open(&s) != 0 || nng_dial(s, addr, NULL, 0) != 0)
		die("nng dial");
	for (long i = 0; i < count; i++)
		if (nng_send(s, data, size, 0) != 0)
			die("nng send");
	while (read(done_fd, &c, 1) > 0)
		;
	_exit(0);
}

/* ---- raw TCP ---- */

static int read_full(int fd, void *buf, size_t n)
{
	size_t have = 0;
	while (have < n) {
		ssize_t r = read(fd, (char *)buf + have, n - have);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return -1;
		have += (size_t)r;
	}
	return 0;
}

static void tcp_receiver(int addr_fd)
{
	struct sockaddr_in a;
	socklen_t alen = sizeof(a);
	int l = socket(AF_INET, SOCK_STREAM, 0), fd;
	char addr[128], *buf = malloc(size);
	memset(&a, 0, sizeof(a));
	a.sin_family = AF_INET;
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (bind(l, (struct sockaddr *)&a, sizeof(a)) != 0 || listen(l, 1) != 0 ||
	    getsockname(l, (struct sockaddr *)&a, &alen) != 0)
		die("tcp listen");
	snprintf(addr, sizeof(addr), "%u", ntohs(a.sin_port));
	if (write(addr_fd, addr, strlen(addr) + 1) < 0 || (fd = accept(l, NULL, NULL)) < 0)
		die("tcp accept");
	for (;;) {
		uint64_t len;
		if (read_full(fd, &len, 8) != 0 || len != size || read_full(fd, buf, len) != 0)
			die("tcp read");
		if (received(1))
			break;
	}
}

static void tcp_sender(const char *port, int done_fd)
{
	struct sockaddr_in a;
	int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
	char *data = payload(), c;
	uint64_t len = size;
	memset(&a, 0, sizeof(a));
	a.sin_family = AF_INET;
	a.sin_port = htons((uint16_t)atoi(port));
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	if (connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0)
		die("tcp connect");
	memcpy(data, &len, 8);
	for (long i = 0; i < count; i++)
		if (write(fd, data, size + 8) != (ssize_t)(size + 8))
			die("tcp write");
	while (read(done_fd, &c, 1) > 0)
		;
	_exit(0);
}

int main(int argc, char **argv)
{
	int addr_pipe[2], done_pipe[2], exit_pipe[2], status;
	const char *peer;
	struct rusage ru;
	pid_t pid;
	if (argc < 4 || argc > 5) {
		fprintf(stderr,
			"usage: oneway tw-raw|tw-batched|tw-fill|zmq|nng|tcp SIZE COUNT [HWM]\n");
		return 2;
	}
	peer = argv[1];
	size = (size_t)tw_ex_parse_size(argv[2]);
	count = atol(argv[3]);
	hwm = argc == 5 ? tw_ex_parse_size(argv[4]) : 0;
	if (size == 0 || count < 2 || pipe(addr_pipe) != 0 || pipe(done_pipe) != 0 ||
	    pipe(exit_pipe) != 0)
		die("arguments");
	if ((pid = fork()) < 0)
		die("fork");
	if (pid == 0) {
		char addr[128];
		ssize_t n;
		close(done_pipe[1]);
		close(exit_pipe[0]);
		if ((n = read(addr_pipe[0], addr, sizeof(addr) - 1)) <= 0)
			_exit(1);
		addr[n] = '\0';
		if (strncmp(peer, "tw-", 3) == 0)
			tw_sender(addr, strcmp(peer, "tw-batched") == 0,
				  strcmp(peer, "tw-fill") == 0, done_pipe[0]);
		else if (strcmp(peer, "zmq") == 0)
			zmq_sender(addr, done_pipe[0]);
		else if (strcmp(peer, "nng") == 0)
			nng_sender(addr, done_pipe[0]);
		else
			tcp_sender(addr, done_pipe[0]);
		_exit(1);
	}
	close(done_pipe[0]);
	close(exit_pipe[1]);
	if (strcmp(peer, "tw-fill") == 0) {
		tw_receiver(0, exit_pipe[0], addr_pipe[1]);
		return waitpid(pid, &status, 0) == pid && WIFEXITED(status) &&
				       WEXITSTATUS(status) == 0
			       ? 0
			       : 1;
	}
	if (strcmp(peer, "tw-raw") == 0 || strcmp(peer, "tw-batched") == 0)
		tw_receiver(strcmp(peer, "tw-batched") == 0, -1, addr_pipe[1]);
	else if (strcmp(peer, "zmq") == 0)
		zmq_receiver(addr_pipe[1]);
	else if (strcmp(peer, "nng") == 0)
		nng_receiver(addr_pipe[1]);
	else if (strcmp(peer, "tcp") == 0)
		tcp_receiver(addr_pipe[1]);
	else
		die("peer name");
	close(done_pipe[1]); /* the sender may go */
	if (wait4(pid, &status, 0, &ru) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
		die("sender");
	printf("%s %zu B: %.0f msgs/s, recv %.3f us/msg cpu, send %.3f us/msg cpu, sender peak RSS "
	       "%.0f MB\n",
	       peer, size, (double)(count - 1) / (t_last - t_first),
	       (cpu_last - cpu_first) * 1e6 / (double)(count - 1),
	       ((double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 +
		(double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6) *
		       1e6 / (double)count,
	       (double)ru.ru_maxrss / 1024.0);
	return 0;
}
