/* SPDX-License-Identifier: BSD-3-Clause */
/* relay-stall: how long after its source's last progress the relay stall
 * rule ends a destination whose peer reads nothing (docs/design.md,
 * Relay, Stall; check_relay `relay_stall_ended_before_source_timeout` asserts
 * the rule, this prints the time).
 *
 *   relay-stall [PAUSE_MS [FRAME_MiB [RUNS]]]     (defaults 2000 256 3)
 *
 * One process, loopback tcp. A raw source writes a message of a 10-byte
 * frame and a FRAME_MiB frame to a listener with relay on (64 KiB); its
 * comm forwards the large frame, relayed, to the comm of a raw peer that
 * never reads. The pause limit (tw_context_set_receive_budget_pause_ms)
 * is PAUSE_MS. Printed per run: the time from the source's last progress
 * (its socket full: it waits for the relay) to the destination's close
 * callback, in ms and in pause limits, with its err and text. The rule
 * ends it by 9/8 of a limit after its peer's last ack (a look every eighth
 * of the limit), and the source stops moving about when that ack comes;
 * before breaker20's fix it was up to 2 limits (40 s by default, past
 * the source's peer's 30 s TCP timeout). Wall clock on a shared machine:
 * run it under `flock /work/notes/bench.lock`, niced, and read the
 * spread. */
#include <errno.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>
#include <taskwire/taskwire.h>

#define MiB ((size_t)1 << 20)

struct run {
	struct event_base *base;
	tw_context *ctx;
	tw_listener *lis;
	tw_comm *acc[2]; /* the source's comm (the hub), the destination's */
	int nacc, dst_ended, dst_err;
	char dst_text[512];
	int src, dst;
	uint8_t *wire;
	size_t n, done;
	long long last_ms, end_ms;
	struct event *feed;
};

static long long now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void die(const char *what, int rv)
{
	fprintf(stderr, "relay-stall: %s: %s\n", what, rv != 0 ? tw_strerror(rv) : strerror(errno));
	exit(1);
}

/* The hub's message: "hdr" and its relayed frame 1 go to the destination. */
static void hub_recv(tw_comm *c, tw_msg *m, void *arg)
{
	struct run *r = arg;
	tw_msg *out;
	int rv;
	if (c != r->acc[0])
		return;
	if ((rv = tw_msg_new(&out)) != 0 || (rv = tw_msg_append_copy(out, "hdr", 3)) != 0 ||
	    (rv = tw_msg_append(out, tw_msg_frame(m, 1))) != 0 ||
	    (rv = tw_comm_write(r->acc[1], out)) != 0)
		die("forward", rv);
}

static void acc_close(tw_comm *c, int err, void *arg)
{
	struct run *r = arg;
	if (c != r->acc[1])
		return;
	r->end_ms = now_ms();
	r->dst_ended = 1;
	r->dst_err = err;
	snprintf(r->dst_text, sizeof(r->dst_text), "%s", tw_comm_last_error(c));
	event_base_loopbreak(r->base);
}

static void on_accept(tw_listener *l, tw_comm *c, void *arg)
{
	struct run *r = arg;
	int rv;
	(void)l;
	if (r->nacc == 2)
		die("a third comm", TW_EINVAL);
	r->acc[r->nacc++] = c;
	if ((rv = tw_comm_set_relay_bytes(c, 64 * 1024)) != 0 ||
	    (rv = tw_comm_set_callbacks(c, hub_recv, acc_close, NULL, r)) != 0)
		die("accept", rv);
}

/* The source is fed as its socket takes bytes; last_ms: its last progress. */
static void on_src_writable(evutil_socket_t fd, short what, void *arg)
{
	struct run *r = arg;
	(void)what;
	while (r->done < r->n) {
		ssize_t k =
			send(fd, r->wire + r->done, r->n - r->done, MSG_DONTWAIT | MSG_NOSIGNAL);
		if (k <= 0)
			break;
		r->done += (size_t)k;
		r->last_ms = now_ms();
	}
	if (r->done == r->n)
		event_del(r->feed); /* all of it went: nothing stalled */
}

static int raw_connect(const char *uri)
{
	const char *h = strstr(uri, "://") + 3, *colon = strrchr(uri, ':');
	char host[64];
	struct addrinfo *ai;
	int fd;
	snprintf(host, sizeof(host), "%.*s", (int)(colon - h), h);
	if (getaddrinfo(host, colon + 1, NULL, &ai) != 0)
		die("getaddrinfo", TW_EINVAL);
	fd = socket(ai->ai_family, SOCK_STREAM, 0);
	if (fd < 0 || connect(fd, ai->ai_addr, ai->ai_addrlen) != 0)
		die("connect", 0);
	freeaddrinfo(ai);
	return fd;
}

/* The stream framing: total, frame count, lengths, then the frames. */
static uint8_t *make_wire(size_t big, size_t *n)
{
	uint64_t lens[2] = {10, big}, nf = 2, total = 8 + 8 * 2 + 10 + big;
	uint8_t *p = calloc(1, total + 8);
	if (p == NULL)
		die("calloc", TW_ENOMEM);
	memcpy(p, &total, 8);
	memcpy(p + 8, &nf, 8);
	memcpy(p + 16, lens, 16);
	*n = total + 8;
	return p;
}

static void accept_one(struct run *r, int want)
{
	while (r->nacc < want)
		event_base_loop(r->base, EVLOOP_ONCE);
}

static void one_run(uint32_t pause_ms, size_t big, int i)
{
	struct run r = {0};
	char addr[128];
	int rv;
	r.base = event_base_new();
	if ((rv = tw_context_new(r.base, &r.ctx)) != 0 ||
	    (rv = tw_context_set_receive_budget_pause_ms(r.ctx, pause_ms)) != 0 ||
	    (rv = tw_listener_new(r.ctx, "tcp://127.0.0.1:0", on_accept, &r, &r.lis)) != 0 ||
	    (rv = tw_listener_address(r.lis, addr, sizeof(addr))) != 0)
		die("setup", rv);
	r.src = raw_connect(addr);
	accept_one(&r, 1);
	r.dst = raw_connect(addr); /* never read */
	accept_one(&r, 2);
	r.wire = make_wire(big, &r.n);
	r.last_ms = now_ms();
	r.feed = event_new(r.base, r.src, EV_WRITE | EV_PERSIST, on_src_writable, &r);
	event_add(r.feed, NULL);
	event_base_dispatch(r.base); /* until the destination ends */
	printf("run %d: pause limit %u ms, frame %zu MiB: ended %lld ms after the source's last "
	       "progress (%.2f limits), %zu of %zu bytes fed; err %s: %s\n",
	       i, pause_ms, big / MiB, r.end_ms - r.last_ms,
	       (double)(r.end_ms - r.last_ms) / pause_ms, r.done, r.n, tw_strerror(r.dst_err),
	       r.dst_text);
	fflush(stdout);
	event_free(r.feed);
	tw_comm_free(r.acc[0]);
	tw_comm_free(r.acc[1]);
	tw_listener_free(r.lis);
	tw_context_free(r.ctx);
	event_base_free(r.base);
	close(r.src);
	close(r.dst);
	free(r.wire);
}

int main(int argc, char **argv)
{
	uint32_t pause_ms = argc > 1 ? (uint32_t)strtoul(argv[1], NULL, 10) : 2000;
	size_t big = (argc > 2 ? strtoull(argv[2], NULL, 10) : 256) * MiB;
	int runs = argc > 3 ? atoi(argv[3]) : 3;
	if (pause_ms == 0 || big == 0 || runs <= 0) {
		fprintf(stderr, "usage: relay-stall [PAUSE_MS>0 [FRAME_MiB>0 [RUNS>0]]]\n");
		return 2;
	}
	for (int i = 1; i <= runs; i++)
		one_run(pause_ms, big, i);
	return 0;
}
