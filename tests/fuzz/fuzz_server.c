/* SPDX-License-Identifier: BSD-3-Clause */
/* Fuzz targets: a tw_server's request dispatch and stream dispatch
 * (protocol/server.c, with delivery.c, decode and the reply builder
 * under it) on live tcp comms, fed by a raw peer (tests/fuzz/fuzz_peer.h).
 *
 *   server           the peer's handshake, then requests;
 *   stream_dispatch  the peer's handshake and {"op": "connection_stream",
 *                    "reply": false}, then stream messages.
 *
 * Byte 0: bit 0 the server's context offers zstd, bit 1 the peer's
 * handshake offers zstd, bit 2 raw: no handshake (nor connection_stream)
 * is put first, the input's own messages are all there is. The rest is
 * the peer's messages (fuzz_peer.h's layout).
 *
 * Ops: the built-in identity, echo and close; `fail` replies an error,
 * `later` replies from the next loop pass (deferred), `back` replies the
 * whole request with its payloads (tw_builder_pack_object), `bytes` the
 * bytes of its `data` (tw_decoded_bytes). Stream ops: `count`, `look`
 * (reads `x` as bytes), `abort` (aborts the comm from the handler).
 *
 * Invariants (a broken one aborts): what the server wrote is whole,
 * decodable messages (the last may be cut short by an abort); the comm
 * is freed once the peer has closed; no block is left alive. A crash,
 * leak or hang is ASan's or libFuzzer's.
 *
 * Built by `CC=clang ./configure --enable-fuzzers && make` (see
 * tests/Makefile.inc); replayed over tests/fuzz/corpus/server and
 * corpus/stream_dispatch by tests/check_peer_fuzz_replay under
 * `make check`. */
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

#include <event2/event.h>

#include "tests/fuzz/fuzz.h"
#include "tests/fuzz/fuzz_peer.h"

static void check(int ok)
{
	if (!ok)
		abort();
}

static void op_fail(tw_request *r, void *arg)
{
	(void)arg;
	tw_request_reply_error(r, "fuzz: failed", NULL);
}

/* Deferred replies not sent yet: a run waits for them, so the request's
 * blocks are gone before it checks. */
static int later_pending;

static void reply_later(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	later_pending--;
	tw_request_reply(arg);
}

static void op_later(tw_request *r, void *arg)
{
	static const struct timeval now = {0, 0};
	check(event_base_once(fp_env()->base, -1, EV_TIMEOUT, reply_later, r, &now) == 0);
	later_pending++;
	(void)arg;
}

static void op_back(tw_request *r, void *arg)
{
	const tw_decoded *d = tw_request_decoded(r);
	tw_builder *b = tw_request_reply_builder(r);
	(void)arg;
	if (b != NULL && tw_builder_pack_object(b, d, tw_decoded_root(d)) != 0) {
		tw_request_reply_error(r, "fuzz: cannot pack", NULL);
		return;
	}
	tw_request_reply(r);
}

static void op_bytes(tw_request *r, void *arg)
{
	const msgpack_object *data = tw_request_arg(r, "data");
	tw_builder *b = tw_request_reply_builder(r);
	const uint8_t *p;
	size_t n;
	(void)arg;
	if (b != NULL && data != NULL && tw_decoded_bytes(tw_request_decoded(r), data, &p, &n) == 0)
		msgpack_pack_uint64(tw_builder_packer(b), n);
	tw_request_reply(r);
}

static unsigned long stream_maps;

static void s_count(tw_comm *comm, const tw_decoded *d, const msgpack_object *msg, void *arg)
{
	(void)comm;
	(void)d;
	(void)msg;
	(void)arg;
	stream_maps++;
}

static void s_look(tw_comm *comm, const tw_decoded *d, const msgpack_object *msg, void *arg)
{
	const msgpack_object *x = tw_msgpack_map_get(msg, "x");
	const uint8_t *p;
	size_t n;
	volatile unsigned sum = 0;
	(void)comm;
	(void)arg;
	if (x != NULL && tw_decoded_bytes(d, x, &p, &n) == 0)
		for (size_t i = 0; i < n; i++)
			sum += p[i];
	(void)sum;
}

static void s_abort(tw_comm *comm, const tw_decoded *d, const msgpack_object *msg, void *arg)
{
	(void)d;
	(void)msg;
	(void)arg;
	tw_comm_abort(comm);
}

struct srv {
	tw_server *s;
	char uri[64];
};

static struct srv srvs[2];

static void make_server(int i, tw_context *ctx)
{
	struct srv *s = &srvs[i];
	check(tw_server_new(ctx, &s->s) == 0);
	check(tw_server_add_op(s->s, "fail", op_fail, NULL) == 0);
	check(tw_server_add_op(s->s, "later", op_later, NULL) == 0);
	check(tw_server_add_op(s->s, "back", op_back, NULL) == 0);
	check(tw_server_add_op(s->s, "bytes", op_bytes, NULL) == 0);
	check(tw_server_add_stream_op(s->s, "count", s_count, NULL) == 0);
	check(tw_server_add_stream_op(s->s, "look", s_look, NULL) == 0);
	check(tw_server_add_stream_op(s->s, "abort", s_abort, NULL) == 0);
	check(tw_server_listen(s->s, "tcp://127.0.0.1:0") == 0);
	check(tw_server_address(s->s, 0, s->uri, sizeof(s->uri)) == 0);
}

static struct srv *server_of(int k)
{
	static int made;
	fp_once(&made, make_server);
	return &srvs[k];
}

/* {"op": "connection_stream", "reply": false} */
static const uint8_t CONNECTION_STREAM[] = "\x82\xa2op\xb1"
					   "connection_stream\xa5reply\xc2";

static int serve(const uint8_t *data, size_t size, int stream)
{
	struct fp_env *e = fp_env();
	int flags = size > 0 ? data[0] : 0;
	struct srv *s = server_of(flags & 1);
	tw_context *ctx = e->ctx[flags & 1];
	uint8_t *in = NULL;
	size_t n = 0, live = fp_live(ctx);
	tw_stats before, after;
	tw_stats_global(&before, sizeof(before));
	if (!(flags & 4)) {
		fp_handshake_frame(flags & 2 ? "zstd" : NULL, &in, &n);
		if (stream)
			fp_wire_frame(CONNECTION_STREAM, sizeof(CONNECTION_STREAM) - 1, &in, &n);
	}
	if (size > 0)
		fp_wire(data + 1, size - 1, &in, &n);
	fp_run(e, ctx, live, fp_dial(s->uri), in, n);
	while (later_pending > 0)
		check(event_base_loop(e->base, EVLOOP_ONCE) == 0);
	free(in);
	tw_stats_global(&after, sizeof(after));
	check(after.blocks_live == before.blocks_live);
	return 0;
}

int peer_fuzz_server(const uint8_t *data, size_t size)
{
	return serve(data, size, 0);
}

int peer_fuzz_stream(const uint8_t *data, size_t size)
{
	return serve(data, size, 1);
}

#ifndef TW_FUZZ_REPLAY
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
#ifdef TW_FUZZ_STREAM_DISPATCH
	return peer_fuzz_stream(data, size);
#else
	return peer_fuzz_server(data, size);
#endif
}
#endif
