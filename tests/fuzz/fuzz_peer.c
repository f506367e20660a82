/* SPDX-License-Identifier: BSD-3-Clause */
/* A raw peer over loopback TCP for the comm-level fuzz targets
 * (tests/fuzz/fuzz_peer.h). */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <event2/event.h>
#include <msgpack.h>

#include "core/context.h"
#include "tests/fuzz/fuzz_peer.h"
#include "transport/frame_rx.h"

static void check(int ok)
{
	if (!ok)
		abort();
}

struct fp_env *fp_env(void)
{
	static struct fp_env e;
	if (e.base != NULL)
		return &e;
	check((e.base = event_base_new()) != NULL);
	for (int i = 0; i < 2; i++) {
		check(tw_context_new(e.base, &e.ctx[i]) == 0);
		/* a stuck comm shows as libFuzzer's timeout, not as a wait */
		check(tw_context_set_handshake_timeout_ms(e.ctx[i], 5000) == 0);
	}
	check(tw_context_set_compression(e.ctx[1], "zstd") == 0);
	return &e;
}

void fp_once(int *made, void (*make)(int i, tw_context *ctx))
{
	struct fp_env *e;
	if (*made)
		return;
	e = fp_env();
	for (int i = 0; i < 2; i++)
		make(i, e->ctx[i]);
	*made = 1;
}

size_t fp_live(const tw_context *ctx)
{
	size_t n = 0;
	for (const struct tw__node *o = ctx->objects.next; o != &ctx->objects; o = o->next)
		n++;
	return n;
}

static void put(uint8_t **buf, size_t *len, const void *p, size_t n)
{
	uint8_t *b = realloc(*buf, *len + n + 1);
	check(b != NULL);
	if (n > 0)
		memcpy(b + *len, p, n);
	*buf = b;
	*len += n;
}

static void put_u64(uint8_t **buf, size_t *len, uint64_t v)
{
	uint8_t b[8];
	for (int i = 0; i < 8; i++)
		b[i] = (uint8_t)(v >> (8 * i));
	put(buf, len, b, 8);
}

void fp_wire(const uint8_t *p, size_t n, uint8_t **buf, size_t *len)
{
	size_t off = 0;
	while (off < n) {
		size_t nf = p[off++] & 15, lens[15], sum = 0;
		for (size_t i = 0; i < nf; i++) {
			lens[i] = off + 1 < n ? p[off] | (size_t)p[off + 1] << 8 : 0;
			off = off + 2 < n ? off + 2 : n;
		}
		for (size_t i = 0; i < nf; i++) {
			if (lens[i] > n - off - sum)
				lens[i] = n - off - sum;
			sum += lens[i];
		}
		put_u64(buf, len, 8 + 8 * nf + sum);
		put_u64(buf, len, nf);
		for (size_t i = 0; i < nf; i++)
			put_u64(buf, len, lens[i]);
		put(buf, len, p + off, sum);
		off += sum;
	}
}

void fp_wire_frame(const void *frame, size_t n, uint8_t **buf, size_t *len)
{
	put_u64(buf, len, 8 + 8 + n);
	put_u64(buf, len, 1);
	put_u64(buf, len, n);
	put(buf, len, frame, n);
}

void fp_handshake_frame(const char *codec, uint8_t **buf, size_t *len)
{
	msgpack_sbuffer sb;
	msgpack_packer pk;
	msgpack_sbuffer_init(&sb);
	msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
	msgpack_pack_map(&pk, 3);
	msgpack_pack_str_with_body(&pk, "compression", 11);
	if (codec != NULL)
		msgpack_pack_str_with_body(&pk, codec, strlen(codec));
	else
		msgpack_pack_nil(&pk);
	msgpack_pack_str_with_body(&pk, "python", 6);
	msgpack_pack_array(&pk, 3);
	msgpack_pack_uint8(&pk, 3);
	msgpack_pack_uint8(&pk, 11);
	msgpack_pack_uint8(&pk, 2);
	msgpack_pack_str_with_body(&pk, "pickle-protocol", 15);
	msgpack_pack_uint8(&pk, 5);
	fp_wire_frame(sb.data, sb.size, buf, len);
	msgpack_sbuffer_destroy(&sb);
}

int fp_dial(const char *uri)
{
	struct sockaddr_in sa;
	const char *port = strrchr(uri, ':');
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	check(fd >= 0 && port != NULL);
	memset(&sa, 0, sizeof(sa));
	sa.sin_family = AF_INET;
	sa.sin_port = htons((uint16_t)atoi(port + 1));
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	/* Each input is a new connection, so a long run leaves thousands of
	 * ports in TIME_WAIT: with other programs' connections on a shared
	 * machine, connect may find no free port for a moment (a long run of
	 * fuzz_stream_dispatch stopped so). Wait for one, as a client
	 * would; any other failure is the harness's bug. */
	for (int tries = 0; connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0; tries++) {
		if ((errno != EADDRNOTAVAIL && errno != EAGAIN && errno != EINTR) ||
		    tries == 1000) {
			fprintf(stderr, "fuzz_peer: connect to %s: %s\n", uri, strerror(errno));
			abort();
		}
		usleep(10000);
	}
	return fd;
}

struct peer {
	int fd;
	const uint8_t *in;
	size_t n, off;
	int shut, eof;
	struct tw__rx rx;
	size_t msgs;
	struct event *ev;
};

/* What the library wrote must be whole messages it can decode itself. */
static void take(struct peer *p)
{
	tw_decode_limits lim = {(uint64_t)1 << 30};
	tw_decoded *d = NULL;
	char why[256];
	tw_msg *m = tw__rx_take(&p->rx);
	check(m != NULL);
	if (tw_decode(m, &lim, &d, why, sizeof(why)) != 0) {
		fprintf(stderr, "fuzz_peer: the library wrote a message it cannot decode: %s\n",
			why);
		abort();
	}
	tw_decoded_free(d);
	tw_msg_free(m);
	p->msgs++;
}

static void got(struct peer *p, const uint8_t *b, size_t n)
{
	size_t off = 0;
	while (off < n) {
		size_t used = 0;
		int rv = tw__rx_feed(&p->rx, b + off, n - off, &used);
		if (rv < 0) {
			fprintf(stderr, "fuzz_peer: the library wrote a bad stream (%d)\n", rv);
			abort();
		}
		off += used;
		if (rv == 1)
			take(p);
	}
}

static void on_io(evutil_socket_t fd, short what, void *arg)
{
	struct peer *p = arg;
	if ((what & EV_WRITE) && !p->shut) {
		ssize_t k =
			p->off < p->n ? send(fd, p->in + p->off, p->n - p->off, MSG_NOSIGNAL) : 0;
		if (k > 0)
			p->off += (size_t)k;
		/* the library closed first, or everything is written */
		if (p->off == p->n || (k < 0 && errno != EAGAIN && errno != EINTR)) {
			shutdown(fd, SHUT_WR);
			p->shut = 1;
			event_del(p->ev);
			event_assign(p->ev, event_get_base(p->ev), fd, EV_READ | EV_PERSIST, on_io,
				     p);
			event_add(p->ev, NULL);
		}
	}
	if (what & EV_READ) {
		uint8_t b[65536];
		ssize_t k = recv(fd, b, sizeof(b), 0);
		if (k > 0)
			got(p, b, (size_t)k);
		else if (k == 0 || (errno != EAGAIN && errno != EINTR)) {
			p->eof = 1;
			event_del(p->ev);
		}
	}
}

size_t fp_run(struct fp_env *e, tw_context *ctx, size_t live, int fd, const uint8_t *in, size_t n)
{
	struct tw__limits l = {0};
	struct peer p;
	struct linger lg = {1, 0};
	memset(&p, 0, sizeof(p));
	l.max_message_bytes = (uint64_t)1 << 30;
	l.max_frames = (uint64_t)1 << 16;
	l.small_frame_bytes = 65536;
	tw__rx_init(&p.rx, &l);
	p.fd = fd;
	p.in = in;
	p.n = n;
	check(fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) == 0);
	check((p.ev = event_new(e->base, fd, EV_READ | EV_WRITE | EV_PERSIST, on_io, &p)) != NULL);
	event_add(p.ev, NULL);
	while (!p.eof || fp_live(ctx) > live)
		if (event_base_loop(e->base, EVLOOP_ONCE) != 0) {
			fprintf(stderr,
				"fuzz_peer: stuck: peer %s, %zu objects live, %zu expected\n",
				p.eof ? "closed" : "open", fp_live(ctx), live);
			abort();
		}
	event_free(p.ev);
	tw__rx_fini(&p.rx);
	/* a reset, not TIME_WAIT: millions of connections go through here */
	setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
	close(fd);
	return p.msgs;
}
