/* SPDX-License-Identifier: BSD-3-Clause */
/* The RPC layer (tw_server, tw_pool, streams, the batched sender) against
 * misbehaving peers and unlucky call orders, from an attack on it: servers
 * freed mid-handshake and from handlers, ops with NUL bytes, duplicate
 * replies, a batched sender against a peer that never reads, maps after
 * close-stream, pipelined requests, resets mid-reply, cancels from
 * callbacks, big stream batches. */
#include <arpa/inet.h>
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <check.h>
#include <event2/event.h>
#include <msgpack.h>

#include "tests/support/pack.h"
#include "tests/support/rpc.h"
#include "tests/support/harness.h"
#include "tests/support/suite.h"
#include "tests/support/ws.h"

/* Diagnostics, with TU_VERBOSE set. */
#define SAY(...)                                                                                   \
	do {                                                                                       \
		if (getenv("TU_VERBOSE") != NULL)                                                  \
			fprintf(stderr, __VA_ARGS__);                                              \
	} while (0)

/* ---- raw wire helpers ---- */

static void le64(uint8_t *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

/* Append one message of nf frames (f[i], n[i] bytes) to sb: the stream
 * prelude (total, N, lengths; little-endian u64s), then the frames. */
static void wire_n(msgpack_sbuffer *out, const void *const *f, const size_t *n, size_t nf)
{
	uint8_t u[8];
	uint64_t total = 8 + 8 * nf;
	for (size_t i = 0; i < nf; i++)
		total += n[i];
	le64(u, total);
	msgpack_sbuffer_write(out, (const char *)u, 8);
	le64(u, nf);
	msgpack_sbuffer_write(out, (const char *)u, 8);
	for (size_t i = 0; i < nf; i++) {
		le64(u, n[i]);
		msgpack_sbuffer_write(out, (const char *)u, 8);
	}
	for (size_t i = 0; i < nf; i++)
		msgpack_sbuffer_write(out, f[i], n[i]);
}

/* Append one single-frame message (frame 0 = f, n bytes) to sb. */
static void wire1(msgpack_sbuffer *out, const void *f, size_t n)
{
	wire_n(out, &f, &n, 1);
}

static void pk_str(msgpack_packer *pk, const char *s, size_t n)
{
	msgpack_pack_str(pk, n);
	msgpack_pack_str_body(pk, s, n);
}

static void handshake_bytes(msgpack_sbuffer *out)
{
	struct ts_pack p;
	ts_pack_handshake_info(ts_pack_start(&p), 0);
	wire1(out, p.sb.data, p.sb.size);
	msgpack_sbuffer_destroy(&p.sb);
}

/* A request whose header is what was packed into p (p's buffer freed). */
static tw_msg *packed_req(struct ts_pack *p)
{
	tw_msg *m = rq_raw(p->sb.data, p->sb.size);
	msgpack_sbuffer_destroy(&p->sb);
	return m;
}

/* Whole messages (8-byte little-endian length, then that many bytes) at
 * the start of buf[0..n); *used (may be NULL) gets the bytes they take. */
static size_t whole_msgs(const uint8_t *buf, size_t n, size_t *used)
{
	size_t off = 0, k = 0;
	while (off + 8 <= n) {
		uint64_t total = 0;
		for (int i = 7; i >= 0; i--)
			total = total << 8 | buf[off + i];
		if (total > n - off - 8)
			break;
		off += 8 + (size_t)total;
		k++;
	}
	if (used != NULL)
		*used = off;
	return k;
}

/* Read what the server sends (driving the loop) until buf holds nmsgs
 * whole messages, the server closes, or buf is full; fails when nothing
 * of that happens within the hang guard. */
static size_t raw_read(struct tu *h, int fd, uint8_t *buf, size_t cap, size_t nmsgs)
{
	size_t got = 0;
	long long end = ts_now_ms() + TU_WAIT_MS;
	while (got < cap && whole_msgs(buf, got, NULL) < nmsgs) {
		ssize_t n;
		ck_assert_msg(ts_now_ms() < end, "%zu bytes, %zu whole messages from the server",
			      got, whole_msgs(buf, got, NULL));
		tu_run_for(h, 10);
		while ((n = recv(fd, buf + got, cap - got, MSG_DONTWAIT)) > 0)
			got += (size_t)n;
		if (n == 0)
			break;
	}
	return got;
}

/* Read what the server sends until it closes: exactly `want` whole
 * messages (its handshake, then the replies), nothing after them. */
static void read_msgs_to_eof(struct tu *h, int fd, uint8_t *buf, size_t cap, size_t want)
{
	size_t got = raw_read(h, fd, buf, cap, SIZE_MAX), used = 0; /* to the server's EOF */
	size_t n = whole_msgs(buf, got, &used);
	ck_assert_msg(used == got && n == want,
		      "%zu messages (%zu bytes, parsed %zu) from the server, not %zu", n, got, used,
		      want);
}

/* ---- 1. tw_server_free while an accepted comm is mid-handshake ---- */

START_TEST(server_free_mid_handshake)
{
	struct tu h;
	tw_server *s;
	char addr[128];
	msgpack_sbuffer hs;
	int fd;
	uint8_t buf[4096];
	tu_init(&h);
	ck_assert_int_eq(tw_server_new(h.ctx, &s), 0);
	ck_assert_int_eq(tw_server_listen(s, "tcp://127.0.0.1:0"), 0);
	ck_assert_int_eq(tw_server_address(s, 0, addr, sizeof(addr)), 0);
	fd = ts_raw_connect(addr);
	ck_assert_int_ge(fd, 0);
	/* the server accepts and writes its handshake; we have not answered */
	raw_read(&h, fd, buf, sizeof(buf), 1);
	tw_server_free(s);
	/* now finish the handshake: on_handshake runs with the freed server */
	msgpack_sbuffer_init(&hs);
	handshake_bytes(&hs);
	ck_assert_uint_eq(send(fd, hs.data, hs.size, 0), hs.size);
	msgpack_sbuffer_destroy(&hs);
	tu_run_for(&h, 300);
	close(fd);
	tu_run_for(&h, 100);
	tu_fini(&h);
}
END_TEST

/* ---- 1b. a zstd bomb inside the Dask handshake: 64 KB of RLE blocks
 * that inflate to 2 GiB; the handshake's 64 KiB bound applies to what
 * decoding allocates, not only to the wire ---- */

static size_t zstd_rle_bomb(uint8_t *buf, size_t nblocks)
{
	size_t o = 0;
	buf[o++] = 0x28, buf[o++] = 0xb5, buf[o++] = 0x2f, buf[o++] = 0xfd;
	buf[o++] = 0x00; /* no content size */
	buf[o++] = 0x38; /* window 128 KiB */
	for (size_t b = 0; b < nblocks; b++) {
		/* an RLE block of 128 KiB: one byte repeated */
		uint32_t bh = (131072u << 3) | (1u << 1) | (b + 1 == nblocks ? 1u : 0u);
		buf[o++] = (uint8_t)bh, buf[o++] = (uint8_t)(bh >> 8),
		buf[o++] = (uint8_t)(bh >> 16);
		buf[o++] = 0x41;
	}
	return o;
}

START_TEST(handshake_zstd_bomb)
{
	enum { NBLOCKS = 16000 };
	static uint8_t z[16 + 4 * NBLOCKS], buf[4096];
	struct ts_pack f0, f1;
	msgpack_sbuffer wire;
	msgpack_packer *pk;
	tw_stats before, after;
	struct rf f;
	struct rc rc;
	int fd;
	rf_init(&f);
	pk = ts_pack_start(&f0);
	ts_pack_handshake_info(pk, 1);
	tw_msgpack_pack_str(pk, "x");
	msgpack_pack_map(pk, 1);
	tw_msgpack_pack_str(pk, "__Serialized__");
	msgpack_pack_uint8(pk, 1);
	pk = ts_pack_start(&f1);
	msgpack_pack_map(pk, 3);
	tw_msgpack_pack_str(pk, "serializer");
	tw_msgpack_pack_str(pk, "dask");
	tw_msgpack_pack_str(pk, "num-sub-frames");
	msgpack_pack_uint8(pk, 1);
	tw_msgpack_pack_str(pk, "compression");
	msgpack_pack_array(pk, 1);
	tw_msgpack_pack_str(pk, "zstd");
	{
		const void *fr[3] = {f0.sb.data, f1.sb.data, z};
		size_t n[3] = {f0.sb.size, f1.sb.size, zstd_rle_bomb(z, NBLOCKS)};
		msgpack_sbuffer_init(&wire);
		wire_n(&wire, fr, n, 3);
	}
	ck_assert_uint_le(wire.size, 65536); /* within the handshake's wire bound */
	fd = ts_raw_connect(f.s.addr);
	ck_assert_int_ge(fd, 0);
	ck_assert_uint_gt(raw_read(&f.h, fd, buf, sizeof(buf), 1), 0); /* its handshake */
	tw_stats_global(&before, sizeof(before));
	ck_assert_uint_eq(send(fd, wire.data, wire.size, 0), wire.size);
	raw_read(&f.h, fd, buf, sizeof(buf), SIZE_MAX); /* until the server closes */
	tw_stats_global(&after, sizeof(after));
	SAY("handshake bomb: %llu block bytes allocated\n",
	    (unsigned long long)(after.block_bytes_allocated - before.block_bytes_allocated));
	ck_assert_uint_lt(after.block_bytes_allocated - before.block_bytes_allocated, 1u << 20);
	ck_assert_int_eq(recv(fd, buf, 1, MSG_DONTWAIT), 0); /* refused: closed */
	/* the server serves on */
	ck_assert_int_eq(rc_call(&f.h, f.pool, f.s.addr, rq_op("identity"), 5000, &rc), 0);
	rc_clear(&rc);
	close(fd);
	msgpack_sbuffer_destroy(&f0.sb);
	msgpack_sbuffer_destroy(&f1.sb);
	msgpack_sbuffer_destroy(&wire);
	rf_fini(&f);
}
END_TEST

/* ---- 1c. tw_comm_handshake twice on one comm: refused during and after
 * the first (a second one freed the placement state a ws comm still used:
 * a use-after-free on the next large message) ---- */

struct twice {
	int done, err, during, after, got;
	tw_comm *comm;
};

static void twice_hs(tw_comm *c, int err, const tw_handshake_info *info, void *arg)
{
	struct twice *t = arg;
	(void)info;
	t->err = err;
	t->after = tw_comm_handshake(c, TW_HANDSHAKE_CONNECTOR, twice_hs, t);
	t->done = 1;
}

static void twice_connected(tw_comm *c, int err, void *arg)
{
	struct twice *t = arg;
	ck_assert_int_eq(err, 0);
	t->comm = c;
	ck_assert_int_eq(tw_comm_handshake(c, TW_HANDSHAKE_CONNECTOR, twice_hs, t), 0);
	t->during = tw_comm_handshake(c, TW_HANDSHAKE_CONNECTOR, twice_hs, t);
}

static void twice_recv(tw_comm *c, tw_decoded *d, int err, const char *detail, void *arg)
{
	struct twice *t = arg;
	const uint8_t *p;
	size_t n;
	(void)c;
	ck_assert_msg(err == 0, "%s", detail);
	ck_assert_int_eq(tw_decoded_bytes(d, tw_decoded_root(d), &p, &n), 0);
	ck_assert_uint_eq(n, 1 << 20);
	t->got = 1;
	tw_decoded_free(d);
}

static void twice_close(tw_comm *c, int err, void *arg)
{
	(void)c, (void)err, (void)arg;
}

START_TEST(handshake_twice)
{
	static const char *const uris[] = {"tcp://127.0.0.1:0", "ws://127.0.0.1:0"};
	struct tu h;
	struct rs s;
	struct twice t = {0};
	tw_slice big = ts_pattern_slice(1 << 20, 3);
	tw_builder *b;
	tu_init(&h);
	rs_start(&s, h.ctx, h.base, uris[_i]);
	ck_assert_int_eq(tw_comm_connect(h.ctx, s.addr, twice_connected, &t), 0);
	ck_assert(tu_wait_flag(&h, &t.done, TU_WAIT_MS));
	ck_assert_int_eq(t.err, 0);
	ck_assert_int_eq(t.during, TW_EINVAL);
	ck_assert_int_eq(t.after, TW_EINVAL);
	/* the comm works on, large payloads (placed by the handshake's state)
	 * included */
	ck_assert_int_eq(tw_comm_set_decoded_callbacks(t.comm, twice_recv, twice_close, NULL, &t),
			 0);
	b = rq_begin("echo", 1);
	rq_bytes(b, "data", &big);
	ck_assert_int_eq(tw_comm_write(t.comm, rq_end(b)), 0);
	ck_assert(tu_wait_flag(&h, &t.got, TU_WAIT_MS));
	tw_block_free(big.block);
	tw_comm_free(t.comm);
	rs_stop(&s);
	tu_fini(&h);
}
END_TEST

/* ---- 2. tw_server_free from inside a stream handler (batch of 2) ---- */

/* A server with stream op `op` (fn, with the server as its arg), and a
 * comm that turns stream and
 * sends one batch of three {"op": op} maps; returns once the comm closed
 * (or TU_WAIT_MS passed without progress: 2 s were not enough on a loaded
 * machine, and the callers' checks need the close). The caller frees w
 * and, unless fn did, the server. */
static tw_server *stream_batch(struct tu *h, const char *op, tw_stream_fn fn, struct rw *w)
{
	tw_server *srv;
	char addr[128];
	struct ts_pack p;
	msgpack_packer *pk;
	tw_builder *b = rq_begin("connection_stream", 1);
	ck_assert_int_eq(tw_server_new(h->ctx, &srv), 0);
	ck_assert_int_eq(tw_server_add_stream_op(srv, op, fn, srv), 0);
	ck_assert_int_eq(tw_server_listen(srv, "tcp://127.0.0.1:0"), 0);
	ck_assert_int_eq(tw_server_address(srv, 0, addr, sizeof(addr)), 0);
	ck_assert_int_eq(rw_open(h, h->ctx, addr, w), 0);
	rq_bool(b, "reply", 0);
	rw_send(w, rq_end(b));
	pk = ts_pack_start(&p);
	msgpack_pack_array(pk, 3);
	for (int i = 0; i < 3; i++) {
		msgpack_pack_map(pk, 1);
		tw_msgpack_pack_str(pk, "op");
		tw_msgpack_pack_str(pk, op);
	}
	rw_send(w, packed_req(&p));
	tu_wait_flag(h, &w->closed, TU_WAIT_MS);
	return srv;
}

static tw_server *g_srv;
static int g_calls;

/* arg: the server, freed by the first map */
static void stream_kill(tw_comm *c, const tw_decoded *d, const msgpack_object *m, void *arg)
{
	(void)c, (void)d, (void)m;
	if (g_calls++ == 0)
		tw_server_free(arg);
}

START_TEST(server_free_in_stream_handler)
{
	struct tu h;
	struct rw w;
	tu_init(&h);
	stream_batch(&h, "kill", stream_kill, &w); /* freed by its handler */
	ck_assert_int_eq(g_calls, 1);              /* the server is gone after the first */
	rw_free(&w);
	tu_fini(&h);
}
END_TEST

/* ---- 3. tw_server_free from inside an op handler ---- */

static void op_kill(tw_request *r, void *arg)
{
	(void)arg;
	tw_server_free(g_srv);
	g_srv = NULL;
	ck_assert_int_eq(tw_request_reply(r), TW_ECLOSED);
}

START_TEST(server_free_in_op_handler)
{
	struct tu h;
	char addr[128];
	struct rw w;
	tu_init(&h);
	ck_assert_int_eq(tw_server_new(h.ctx, &g_srv), 0);
	ck_assert_int_eq(tw_server_add_op(g_srv, "kill", op_kill, NULL), 0);
	ck_assert_int_eq(tw_server_listen(g_srv, "tcp://127.0.0.1:0"), 0);
	ck_assert_int_eq(tw_server_address(g_srv, 0, addr, sizeof(addr)), 0);
	ck_assert_int_eq(rw_open(&h, h.ctx, addr, &w), 0);
	rw_send(&w, rq_op("kill"));
	rw_send(&w, rq_op("identity"));
	ck_assert(tu_wait_flag(&h, &w.closed, TU_WAIT_MS));
	rw_free(&w);
	tu_fini(&h);
}
END_TEST

/* ---- 4. op with an embedded NUL: "close\0junk" is not `close` ---- */

/* One request packed by `put`, on a fresh comm: its reply goes to
 * `check`, then an identity call shows the comm still serving. */
static void raw_request(void (*put)(msgpack_packer *pk), void (*check)(const tw_decoded *d))
{
	struct rf f;
	struct rw w;
	struct ts_pack p;
	const tw_decoded *d;
	rf_init_rw(&f, &w);
	put(ts_pack_start(&p));
	rw_send(&w, packed_req(&p));
	d = rw_msg(&w, 0);
	ck_assert_ptr_nonnull(d);
	check(d);
	rw_send(&w, rq_op("identity"));
	ck_assert_ptr_nonnull(rw_msg(&w, 1));
	ck_assert_int_eq(w.closed, 0);
	rw_free(&w);
	rf_fini(&f);
}

static void put_nul_op(msgpack_packer *pk)
{
	msgpack_pack_map(pk, 1);
	tw_msgpack_pack_str(pk, "op");
	pk_str(pk, "close\0junk", 10);
}

/* Dask (and tw's own find_op) treat "close\0junk" as an unknown op: reply
 * nil, keep the comm open. */
static void check_nil(const tw_decoded *d)
{
	ck_assert_int_eq(tw_decoded_root(d)->type, MSGPACK_OBJECT_NIL);
}

START_TEST(op_with_nul_is_not_builtin)
{
	raw_request(put_nul_op, check_nil);
}
END_TEST

/* ---- 4b. `reply` read as Python reads it (Dask: `if reply:`): 0, nil,
 * "" and [] mean no reply; 1 and "x" mean a reply ---- */

static tw_msg *identity_with_reply(void (*put)(msgpack_packer *pk))
{
	struct ts_pack p;
	msgpack_packer *pk = ts_pack_start(&p);
	msgpack_pack_map(pk, 2);
	tw_msgpack_pack_str(pk, "op");
	tw_msgpack_pack_str(pk, "identity");
	tw_msgpack_pack_str(pk, "reply");
	put(pk);
	return packed_req(&p);
}

static void put_zero(msgpack_packer *pk)
{
	msgpack_pack_int(pk, 0);
}
static void put_nil(msgpack_packer *pk)
{
	msgpack_pack_nil(pk);
}
static void put_empty_str(msgpack_packer *pk)
{
	tw_msgpack_pack_str(pk, "");
}
static void put_empty_array(msgpack_packer *pk)
{
	msgpack_pack_array(pk, 0);
}
static void put_one(msgpack_packer *pk)
{
	msgpack_pack_int(pk, 1);
}
static void put_str(msgpack_packer *pk)
{
	tw_msgpack_pack_str(pk, "x");
}

START_TEST(reply_flag_is_python_truth)
{
	void (*no[])(msgpack_packer *) = {put_zero, put_nil, put_empty_str, put_empty_array};
	void (*yes[])(msgpack_packer *) = {put_one, put_str};
	struct rf f;
	struct rw w;
	rf_init_rw(&f, &w);
	for (size_t i = 0; i < 4; i++)
		rw_send(&w, identity_with_reply(no[i]));
	for (size_t i = 0; i < 2; i++)
		rw_send(&w, identity_with_reply(yes[i]));
	/* requests are served in order: the two replies are the last two's */
	ck_assert_ptr_nonnull(rw_msg(&w, 1));
	tu_run_for(&f.h, 50);
	ck_assert_uint_eq(w.n, 2);
	ck_assert_int_eq(tw_decoded_root(w.msgs[0])->type, MSGPACK_OBJECT_MAP);
	ck_assert_int_eq(w.closed, 0);
	rw_free(&w);
	rf_fini(&f);
}
END_TEST

/* ---- 4c. duplicate keys: the last counts, as in the dict Python's
 * msgpack makes ({"op": "close", "reply": false, "op": "echo", ...} is an
 * echo with a reply) ---- */

static void put_dup_keys(msgpack_packer *pk)
{
	msgpack_pack_map(pk, 6);
	tw_msgpack_pack_str(pk, "op");
	tw_msgpack_pack_str(pk, "close");
	tw_msgpack_pack_str(pk, "reply");
	msgpack_pack_false(pk);
	tw_msgpack_pack_str(pk, "data");
	tw_msgpack_pack_str(pk, "first");
	tw_msgpack_pack_str(pk, "op");
	tw_msgpack_pack_str(pk, "echo");
	tw_msgpack_pack_str(pk, "data");
	tw_msgpack_pack_str(pk, "last");
	tw_msgpack_pack_str(pk, "reply");
	msgpack_pack_true(pk);
}

static void check_last(const tw_decoded *d)
{
	ck_assert(tw_msgpack_str_eq(tw_decoded_root(d), "last"));
}

START_TEST(duplicate_keys_last_wins)
{
	raw_request(put_dup_keys, check_last);
}
END_TEST

/* ---- 5. a peer that answers one call twice: the extra reply, which
 * arrived before the second request was even written, is taken as the
 * reply of a call made from the first call's callback ---- */

struct dup_srv {
	tw_listener *l;
	char addr[128];
	int nreq;
};

static void dup_close(tw_comm *c, int err, void *arg)
{
	(void)err, (void)arg;
	tw_comm_free(c);
}

static void dup_recv(tw_comm *c, tw_msg *m, void *arg)
{
	struct dup_srv *s = arg;
	(void)m;
	s->nreq++;
	if (s->nreq == 1) {
		tw_comm_write(c, rq_raw("\xa6reply1", 7));
		tw_comm_write(c, rq_raw("\xa5stale", 6));
	} else {
		tw_comm_write(c, rq_raw("\xa6reply2", 7));
	}
}

static void dup_hs(tw_comm *c, int err, const tw_handshake_info *info, void *arg)
{
	(void)info;
	if (err != 0) {
		tw_comm_free(c);
		return;
	}
	ck_assert_int_eq(tw_comm_set_callbacks(c, dup_recv, dup_close, NULL, arg), 0);
}

static void dup_accept(tw_listener *l, tw_comm *c, void *arg)
{
	(void)l;
	ck_assert_int_eq(tw_comm_handshake(c, TW_HANDSHAKE_LISTENER, dup_hs, arg), 0);
}

struct chain {
	tw_pool *pool;
	const char *uri;
	struct rc second;
	char first[32];
	int first_err;
	int done1;
};

static void chain_first(tw_call *call, int err, tw_decoded *reply, void *arg)
{
	struct chain *ch = arg;
	(void)call;
	ch->first_err = err;
	if (err == 0) {
		const msgpack_object *o = tw_decoded_root(reply);
		snprintf(ch->first, sizeof(ch->first), "%.*s", (int)o->via.str.size,
			 o->via.str.ptr);
	}
	tw_decoded_free(reply);
	ch->done1 = 1;
	rc_start(ch->pool, ch->uri, rq_op("second"), 5000, &ch->second);
}

START_TEST(pool_duplicate_reply_misattributed)
{
	struct tu h;
	struct dup_srv s = {0};
	tw_pool *pool;
	struct chain ch;
	const msgpack_object *o;
	tu_init(&h);
	ck_assert_int_eq(tw_listener_new(h.ctx, "tcp://127.0.0.1:0", dup_accept, &s, &s.l), 0);
	ck_assert_int_eq(tw_listener_address(s.l, s.addr, sizeof(s.addr)), 0);
	ck_assert_int_eq(tw_pool_new(h.ctx, &pool), 0);
	memset(&ch, 0, sizeof(ch));
	ch.pool = pool;
	ch.uri = s.addr;
	ck_assert_int_eq(tw_pool_call(pool, s.addr, rq_op("first"), 5000, chain_first, &ch, NULL),
			 0);
	ck_assert(tu_wait_flag(&h, &ch.done1, TU_WAIT_MS));
	ck_assert_str_eq(ch.first, "reply1");
	ck_assert(rc_wait(&h, &ch.second, TU_WAIT_MS));
	if (ch.second.err == 0) {
		o = tw_decoded_root(ch.second.reply);
		/* the second call must not get the first call's stale extra reply */
		ck_assert_msg(!tw_msgpack_str_eq(o, "stale"),
			      "second call answered with the stale duplicate of the first's reply");
	}
	rc_clear(&ch.second);
	tw_pool_free(pool);
	tw_listener_free(s.l);
	tu_fini(&h);
}
END_TEST

/* ---- 6. batched sender on a peer that never reads: told to wait (TW_EAGAIN)
 * at the write high-water mark, not queueing without bound ---- */

START_TEST(batched_unbounded)
{
	struct tu h;
	struct bh b;
	struct tu_peer *cli;
	tw_batched *bs;
	static uint8_t map[1024];
	size_t accepted = 0;
	int err = 0;
	tu_init(&h);
	tw_context_set_write_hwm_bytes(h.ctx, 1 << 20);
	bh_start(&b, h.base, NULL, 0);
	ck_assert_int_eq(tu_connect_async(&h, b.addr, &cli, &err), 0);
	ck_assert(tu_wait_connected(&h, &err, TU_WAIT_MS));
	ck_assert_int_eq(err, 0);
	ck_assert_int_eq(tw_batched_new(cli->comm, 1, &bs), 0);
	/* a fixmap {"x": bin 1000} */
	map[0] = 0x81;
	map[1] = 0xa1;
	map[2] = 'x';
	map[3] = 0xc5;
	map[4] = 0x03;
	map[5] = 0xe8;
	for (int i = 0; i < 64 * 1024; i++) { /* 64 MiB of maps */
		int rv = tw_batched_send(bs, map, 1006);
		if (rv != 0) {
			ck_assert_int_eq(rv, TW_EAGAIN); /* told to wait, not failed */
			break;
		}
		accepted += 1006;
		if (i % 256 == 0)
			tu_run_for(&h, 1);
	}
	tu_run_for(&h, 50);
	SAY("batched: accepted %zu bytes, comm queue %llu bytes (hwm 1 MiB)\n", accepted,
	    (unsigned long long)tw_comm_queued_bytes(cli->comm));
	ck_assert_msg(accepted < ((size_t)16 << 20),
		      "tw_batched_send accepted %zu bytes for a peer that reads nothing", accepted);
	tw_batched_free(bs);
	tu_peer_free(cli);
	bh_stop(&b);
	tu_fini(&h);
}
END_TEST

/* ---- 7. handshake + a 1 MiB request in one write (pipelined) ---- */

START_TEST(pipelined_handshake_big_request)
{
	struct rf f;
	msgpack_sbuffer out;
	struct ts_pack fr;
	msgpack_packer *pk;
	int fd;
	static uint8_t buf[4 << 20];
	size_t got;
	char *data = malloc(1 << 20);
	rf_init(&f);
	memset(data, 'a', 1 << 20);
	msgpack_sbuffer_init(&out);
	handshake_bytes(&out);
	pk = ts_pack_start(&fr);
	msgpack_pack_map(pk, 2);
	tw_msgpack_pack_str(pk, "op");
	tw_msgpack_pack_str(pk, "nbytes");
	tw_msgpack_pack_str(pk, "data");
	msgpack_pack_bin(pk, 1 << 20);
	msgpack_pack_bin_body(pk, data, 1 << 20);
	wire1(&out, fr.sb.data, fr.sb.size);
	fd = ts_raw_connect(f.s.addr);
	ck_assert_int_ge(fd, 0);
	tu_raw_send(&f.h, fd, out.data, out.size);
	got = raw_read(&f.h, fd, buf, sizeof(buf), 2);
	/* server handshake, then the reply: an int 1 MiB */
	{
		size_t off = 0, nmsg = 0;
		while (off + 24 <= got) {
			uint64_t total = 0;
			for (int i = 7; i >= 0; i--)
				total = total << 8 | buf[off + i];
			if (nmsg == 1)
				ck_assert_msg(buf[off + 24] == 0xce && buf[off + 25] == 0x00 &&
						      buf[off + 26] == 0x10,
					      "second message is not uint32 1048576");
			off += 8 + total;
			nmsg++;
		}
		ck_assert_msg(nmsg == 2, "got %zu messages (%zu bytes)", nmsg, got);
	}
	close(fd);
	msgpack_sbuffer_destroy(&out);
	msgpack_sbuffer_destroy(&fr.sb);
	free(data);
	rf_fini(&f);
}
END_TEST

/* ---- 8. pipelining 20k requests without reading replies: memory ---- */

START_TEST(pipelined_no_read)
{
	struct rf f;
	msgpack_sbuffer out;
	int fd;
	uint64_t rss0, rss1;
	rf_init(&f);
	msgpack_sbuffer_init(&out);
	handshake_bytes(&out);
	for (int i = 0, n = ts_quick() ? 20000 : 200000; i < n; i++) { /* quick: valgrind */
		static const uint8_t req[] = {0x82, 0xa2, 'o', 'p', 0xa4, 'e',  'c',  'h', 'o',
					      0xa4, 'd',  'a', 't', 'a',  0xc5, 0x04, 0x00};
		static uint8_t fr[sizeof(req) + 1024];
		memcpy(fr, req, sizeof(req));
		wire1(&out, fr, sizeof(fr));
	}
	fd = ts_raw_connect(f.s.addr);
	rss0 = tu_rss_bytes();
	/* send with a nonblocking loop, but never read */
	{
		size_t off = 0;
		for (int t = 0; t < 3000 && off < out.size; t++) {
			ssize_t n = send(fd, out.data + off, out.size - off, MSG_DONTWAIT);
			if (n > 0)
				off += (size_t)n;
			tu_run_for(&f.h, 1);
		}
		SAY("pipelined: sent %zu of %zu bytes\n", off, out.size);
	}
	rss1 = tu_rss_bytes();
	{
		tw_stats st;
		tw_stats_global(&st, sizeof(st));
		SAY("pipelined: rss grew %lld KiB, block bytes live %llu KiB\n",
		    (long long)(rss1 - rss0) / 1024,
		    (unsigned long long)st.block_bytes_live / 1024);
		ck_assert_uint_lt(st.block_bytes_live, (uint64_t)100 << 20);
	}
	close(fd);
	msgpack_sbuffer_destroy(&out);
	rf_fini(&f);
}
END_TEST

/* ---- 9. close-stream, then more maps in the same read (offloaded) ---- */

/* out (initialized here): our handshake, then {"op":
 * "connection_stream", "reply": false}. */
static void stream_start(msgpack_sbuffer *out)
{
	msgpack_sbuffer_init(out);
	handshake_bytes(out);
	wire1(out,
	      "\x82\xa2op\xb1"
	      "connection_stream\xa5reply\xc2",
	      29);
}

/* {"op": op, "i": i, "name": "m<i>"} */
static void pack_item(msgpack_packer *pk, const char *op, int64_t i)
{
	char name[32];
	snprintf(name, sizeof(name), "m%lld", (long long)i);
	msgpack_pack_map(pk, 3);
	tw_msgpack_pack_str(pk, "op");
	tw_msgpack_pack_str(pk, op);
	tw_msgpack_pack_str(pk, "i");
	msgpack_pack_int64(pk, i);
	tw_msgpack_pack_str(pk, "name");
	tw_msgpack_pack_str(pk, name);
}

/* Append a message of one item map to out. */
static void item_map(msgpack_sbuffer *out, const char *op, int64_t i)
{
	struct ts_pack p;
	pack_item(ts_pack_start(&p), op, i);
	wire1(out, p.sb.data, p.sb.size);
	msgpack_sbuffer_destroy(&p.sb);
}

START_TEST(stream_data_after_close_stream)
{
	struct rf f;
	msgpack_sbuffer out;
	int fd;
	rf_init(&f);
	ck_assert_int_eq(tw_context_set_offload_threshold_bytes(f.h.ctx, 0), 0);
	stream_start(&out);
	item_map(&out, "item", 0);
	item_map(&out, "close-stream", 99);
	item_map(&out, "item", 1);
	item_map(&out, "item", 2);
	fd = ts_raw_connect(f.s.addr);
	tu_raw_send(&f.h, fd, out.data, out.size);
	tu_raw_wait_closed(&f.h, fd, TU_WAIT_MS); /* the maps before it are handled by then */
	tu_run_for(&f.h, 200);
	SAY("stream after close-stream: %zu items handled\n", f.s.items);
	ck_assert_msg(f.s.items == 1, "%zu stream maps handled; only 1 came before close-stream",
		      f.s.items);
	close(fd);
	msgpack_sbuffer_destroy(&out);
	rf_fini(&f);
}
END_TEST

/* ---- 10. a server that resets the connection mid-reply ---- */

#include <netinet/in.h>
#include <pthread.h>
#include <arpa/inet.h>

struct rst_srv {
	int lfd;
	unsigned port;
};

static void *rst_thread(void *arg)
{
	struct rst_srv *r = arg;
	msgpack_sbuffer hs;
	uint8_t buf[4096], part[40];
	struct linger lg = {1, 0};
	int fd = accept(r->lfd, NULL, NULL);
	if (fd < 0)
		return NULL;
	msgpack_sbuffer_init(&hs);
	handshake_bytes(&hs);
	send(fd, hs.data, hs.size, 0);
	msgpack_sbuffer_destroy(&hs);
	/* their handshake, then their request */
	{
		size_t got = 0;
		ssize_t n;
		int msgs = 0;
		while (msgs < 2 && (n = recv(fd, buf + got, sizeof(buf) - got, 0)) > 0) {
			got += (size_t)n;
			msgs = 0;
			for (size_t off = 0; off + 8 <= got;) {
				uint64_t t = 0;
				for (int i = 7; i >= 0; i--)
					t = t << 8 | buf[off + i];
				if (off + 8 + t > got)
					break;
				off += 8 + t;
				msgs++;
			}
		}
	}
	/* a reply of one 100-byte frame, cut after 10 bytes, then RST */
	le64(part, 8 + 8 + 100);
	le64(part + 8, 1);
	le64(part + 16, 100);
	memset(part + 24, 0xa0, 16);
	send(fd, part, sizeof(part), 0);
	usleep(100000);
	setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
	close(fd);
	return NULL;
}

START_TEST(pool_reset_mid_reply)
{
	struct tu h;
	struct rst_srv r;
	pthread_t th;
	tw_pool *pool;
	struct rc rc;
	char uri[64];
	tu_init(&h);
	r.lfd = ts_raw_listen("tcp", 4, 0, uri, sizeof(uri));
	pthread_create(&th, NULL, rst_thread, &r);
	ck_assert_int_eq(tw_pool_new(h.ctx, &pool), 0);
	rc_call(&h, pool, uri, rq_op("x"), 5000, &rc);
	SAY("reset mid-reply: err %d (%s)\n", rc.err, tw_strerror(rc.err));
	ck_assert_msg(rc.err == TW_EIO || rc.err == TW_ECLOSED,
		      "err %d (%s) is not one rpc.h documents", rc.err, tw_strerror(rc.err));
	pthread_join(th, NULL);
	close(r.lfd);
	rc_clear(&rc);
	tw_pool_free(pool);
	tu_fini(&h);
}
END_TEST

/* ---- 11. cancel other calls from inside callbacks ---- */

struct cx {
	tw_call *victim;
	int runs, err;
};

static void cx_cb(tw_call *c, int err, tw_decoded *reply, void *arg)
{
	struct cx *x = arg;
	(void)c;
	x->runs++;
	x->err = err;
	tw_decoded_free(reply);
	if (x->victim != NULL) {
		tw_call *v = x->victim;
		x->victim = NULL;
		tw_call_cancel(v);
	}
}

static int cx_ran(void *arg)
{
	struct cx **x = arg;
	for (; *x != NULL; x++)
		if ((*x)->runs == 0)
			return 0;
	return 1;
}

/* Wait until every callback in the NULL-terminated list ran, then a
 * while more, in which none may run again. */
static void cx_wait(struct tu *h, struct cx **x)
{
	ck_assert_msg(tu_run_until(h, cx_ran, x, TU_WAIT_MS), "a callback never ran");
	tu_run_for(h, 500);
}

START_TEST(cancel_from_callbacks)
{
	struct rf f;
	struct cx a = {0}, b = {0}, c = {0}, d = {0}, e = {0};
	tw_call *cb_, *cc_, *ce_;
	char refused[64];
	rf_init(&f);
	tw_pool_set_limit(f.pool, 1);
	/* A slow; B waits; A's callback cancels B */
	ck_assert_int_eq(tw_pool_call(f.pool, f.s.addr, rq_slow(0.1), 5000, cx_cb, &a, NULL), 0);
	ck_assert_int_eq(tw_pool_call(f.pool, f.s.addr, rq_op("identity"), 5000, cx_cb, &b, &cb_),
			 0);
	a.victim = cb_;
	cx_wait(&f.h, (struct cx *[]){&a, &b, NULL});
	ck_assert_int_eq(a.runs, 1);
	ck_assert_int_eq(b.runs, 1);
	ck_assert_int_eq(b.err, TW_ECANCELED);
	/* refused: C, D, E doomed together; C's callback cancels E */
	ru_refused_uri(refused, sizeof(refused));
	ck_assert_int_eq(tw_pool_call(f.pool, refused, rq_op("x"), 5000, cx_cb, &c, &cc_), 0);
	ck_assert_int_eq(tw_pool_call(f.pool, refused, rq_op("x"), 5000, cx_cb, &d, NULL), 0);
	ck_assert_int_eq(tw_pool_call(f.pool, refused, rq_op("x"), 5000, cx_cb, &e, &ce_), 0);
	c.victim = ce_;
	cx_wait(&f.h, (struct cx *[]){&c, &d, &e, NULL});
	ck_assert_int_eq(c.runs, 1);
	ck_assert_int_eq(d.runs, 1);
	ck_assert_int_eq(e.runs, 1);
	(void)cc_;
	rf_fini(&f);
}
END_TEST

/* ---- 12. a stream batch of 100k maps, some without op / non-maps ---- */

START_TEST(stream_big_batch)
{
	struct rf f;
	msgpack_sbuffer out, sb;
	msgpack_packer pk;
	int64_t nmaps = ts_quick() ? 10000 : 100000; /* quick: valgrind */
	int fd;
	rf_init(&f);
	stream_start(&out);
	msgpack_sbuffer_init(&sb);
	msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
	msgpack_pack_array(&pk, (uint32_t)nmaps + 3);
	msgpack_pack_int(&pk, 7); /* not a map */
	msgpack_pack_map(&pk, 0); /* no op */
	msgpack_pack_map(&pk, 1); /* op not a str */
	tw_msgpack_pack_str(&pk, "op");
	msgpack_pack_int(&pk, 3);
	for (int64_t i = 0; i < nmaps; i++) {
		pack_item(&pk, "item", i);
	}
	wire1(&out, sb.data, sb.size);
	wire1(&out, "\x90", 1); /* an empty batch */
	fd = ts_raw_connect(f.s.addr);
	tu_raw_send(&f.h, fd, out.data, out.size);
	ck_assert(tu_wait_count(&f.h, &f.s.items, (size_t)nmaps, 20000));
	tu_run_for(&f.h, 100);
	ck_assert_uint_eq(f.s.item_errors, 0);
	close(fd);
	msgpack_sbuffer_destroy(&out);
	msgpack_sbuffer_destroy(&sb);
	rf_fini(&f);
}
END_TEST

/* ---- 13. a stream handler aborts its own comm mid-batch: the rest of
 * the batch is skipped (the loop went on over the freed connection) ---- */

static int r1_calls;
static void stream_abort(tw_comm *c, const tw_decoded *d, const msgpack_object *m, void *arg)
{
	(void)d, (void)m, (void)arg;
	r1_calls++;
	tw_comm_abort(c);
}

START_TEST(stream_handler_aborts_comm)
{
	struct tu h;
	tw_server *srv;
	struct rw w;
	tu_init(&h);
	srv = stream_batch(&h, "abort", stream_abort, &w);
	rw_free(&w);
	tw_server_free(srv);
	tu_fini(&h);
}
END_TEST

/* ---- 14-16. a pooled comm holding part of a message nobody asked for is
 * dropped, so the next call gets a new comm (it hung: the comm was never
 * reused yet held the only place under the limit, and the idle sweep
 * dropped it without dispatching the waiting call) ---- */

struct raw_srv {
	int lfd;
	int fds[4];
	int n;
	char addr[64];
};

static void raw_srv_start(struct raw_srv *s)
{
	memset(s, 0, sizeof(*s));
	s->lfd = ts_raw_listen("tcp", 8, SOCK_NONBLOCK, s->addr, sizeof(s->addr));
}

/* Accept a connection within ms, send our handshake; return its fd. */
/* Accept a connection of the pool's and greet it with a handshake; -1
 * when none came within the hang guard ms. */
static int raw_srv_accept(struct tu *h, struct raw_srv *s, int ms)
{
	msgpack_sbuffer hs;
	long long end = ts_now_ms() + ms;
	while (ts_now_ms() < end) {
		int fd = accept(s->lfd, NULL, NULL);
		if (fd >= 0) {
			msgpack_sbuffer_init(&hs);
			handshake_bytes(&hs);
			ck_assert_int_eq(send(fd, hs.data, hs.size, 0), (ssize_t)hs.size);
			msgpack_sbuffer_destroy(&hs);
			s->fds[s->n++] = fd;
			return fd;
		}
		tu_run_for(h, 10);
	}
	return -1;
}

/* Drain what the client sent (its handshake and requests) until the
 * bytes hold `op` (its request's op name); returns the bytes drained. */
static size_t raw_drain_until(struct tu *h, int fd, const char *op)
{
	static uint8_t buf[1 << 16];
	size_t got = 0;
	long long end = ts_now_ms() + TU_WAIT_MS;
	while (memmem(buf, got, op, strlen(op)) == NULL) {
		ssize_t n;
		ck_assert_msg(ts_now_ms() < end, "no request %s from the pool (%zu bytes)", op,
			      got);
		tu_run_for(h, 10);
		while (got < sizeof(buf) &&
		       (n = recv(fd, buf + got, sizeof(buf) - got, MSG_DONTWAIT)) > 0)
			got += (size_t)n;
	}
	return got;
}

/* Drain what the client sent for ms. */
static void raw_drain(struct tu *h, int fd, int ms)
{
	uint8_t buf[4096];
	for (int t = 0; t < ms; t += 10) {
		tu_run_for(h, 10);
		while (recv(fd, buf, sizeof(buf), MSG_DONTWAIT) > 0)
			;
	}
}

static void raw_reply(int fd, const char *s, int partial_after)
{
	msgpack_sbuffer out, sb;
	msgpack_packer pk;
	msgpack_sbuffer_init(&out);
	msgpack_sbuffer_init(&sb);
	msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
	tw_msgpack_pack_str(&pk, s);
	wire1(&out, sb.data, sb.size);
	if (partial_after) {
		/* the header of a next message (one frame of 100 bytes), 2 of them sent */
		uint8_t pre[26] = {0};
		le64(pre, 8 + 8 + 100);
		le64(pre + 8, 1);
		le64(pre + 16, 100);
		pre[24] = 0xa1;
		msgpack_sbuffer_write(&out, (const char *)pre, sizeof(pre));
	}
	ck_assert_int_eq(send(fd, out.data, out.size, 0), (ssize_t)out.size);
	msgpack_sbuffer_destroy(&out);
	msgpack_sbuffer_destroy(&sb);
}

static void pool_partial_common(int limit, uint32_t idle_ms, uint32_t call_timeout)
{
	struct tu h;
	struct raw_srv s;
	tw_pool *pool;
	struct rc r1, r2;
	int fd, fd2;
	tu_init(&h);
	raw_srv_start(&s);
	ck_assert_int_eq(tw_pool_new(h.ctx, &pool), 0);
	ck_assert_int_eq(tw_pool_set_limit(pool, (size_t)limit), 0);
	ck_assert_int_eq(tw_pool_set_idle(pool, 16, idle_ms), 0);
	rc_start(pool, s.addr, rq_op("first"), 5000, &r1);
	fd = raw_srv_accept(&h, &s, TU_WAIT_MS);
	ck_assert_int_ge(fd, 0);
	ck_assert_uint_gt(raw_drain_until(&h, fd, "first"), 0); /* the reply comes after it */
	raw_reply(fd, "reply1", 1);
	ck_assert(rc_wait(&h, &r1, TU_WAIT_MS));
	ck_assert_int_eq(r1.err, 0);
	rc_clear(&r1);
	tu_run_for(&h, 100);
	/* second call: the only comm holds a partial unsolicited message */
	rc_start(pool, s.addr, rq_op("second"), call_timeout, &r2);
	fd2 = raw_srv_accept(&h, &s, TU_WAIT_MS);
	if (fd2 >= 0) {
		raw_drain_until(&h, fd2, "second");
		raw_reply(fd2, "reply2", 0);
	}
	rc_wait(&h, &r2, TU_WAIT_MS); /* the sweep is a timer: a hang guard only */
	SAY("partial: limit=%d idle=%u timeout=%u: second call done=%d err=%d (%s), new comm %s, "
	    "open comms %zu\n",
	    limit, idle_ms, call_timeout, r2.done, r2.err, tw_strerror(r2.err),
	    fd2 >= 0 ? "opened" : "never opened", tw_pool_open_comms(pool, s.addr));
	ck_assert_msg(r2.done, "second call still waiting (no timeout set)");
	ck_assert_msg(r2.err == 0, "second call: %s", tw_strerror(r2.err)); /* on a new comm */
	rc_clear(&r2);
	tw_pool_free(pool);
	for (int i = 0; i < s.n; i++)
		close(s.fds[i]);
	close(s.lfd);
	tu_fini(&h);
}

START_TEST(pool_partial_limit1_sweep_hangs)
{
	/* limit 1, idle timeout 1 s, no call timeout */
	pool_partial_common(1, 1000, 0);
}
END_TEST

START_TEST(pool_partial_limit1_timeout)
{
	/* limit 1, default idle, call timeout 3 s */
	pool_partial_common(1, 60000, 3000);
}
END_TEST

START_TEST(pool_partial_default_limit)
{
	pool_partial_common(512, 60000, 0);
}
END_TEST

/* ---- 17. a peer that speaks first: its handshake and a message nobody
 * asked for in one write. Each new comm was dropped as stale and the pool
 * reconnected at once, without end (5,000 connects a second, the call
 * waiting for ever with no timeout); now the call fails like a failed
 * connect ---- */

/* _i: 1 call (default limit), 4 calls (default limit: 4 comms at once),
 * 3 calls with a limit of 1 */
static int all_done(const struct rc *r, int n)
{
	for (int i = 0; i < n; i++)
		if (!r[i].done)
			return 0;
	return 1;
}

START_TEST(pool_peer_speaks_first)
{
	static const int ncalls[] = {1, 4, 3}, limits[] = {512, 512, 1};
	struct tu h;
	struct raw_srv s;
	tw_pool *pool;
	struct rc r[4];
	msgpack_sbuffer out;
	int accepted = 0, n = ncalls[_i];
	tu_init(&h);
	raw_srv_start(&s);
	msgpack_sbuffer_init(&out);
	handshake_bytes(&out);
	wire1(&out, "\xa5hello", 6);
	ck_assert_int_eq(tw_pool_new(h.ctx, &pool), 0);
	ck_assert_int_eq(tw_pool_set_limit(pool, (size_t)limits[_i]), 0);
	for (int i = 0; i < n; i++)
		rc_start(pool, s.addr, rq_op("identity"), 0, &r[i]);
	/* until every call failed, or the pool reconnects without end */
	for (long long end = ts_now_ms() + TU_WAIT_MS;
	     ts_now_ms() < end && !all_done(r, n) && accepted < 100;) {
		int fd;
		while (accepted < 100 && (fd = accept(s.lfd, NULL, NULL)) >= 0) {
			accepted++;
			ck_assert_int_eq(send(fd, out.data, out.size, 0), (ssize_t)out.size);
			raw_drain(&h, fd, 20);
			close(fd);
		}
		tu_run_for(&h, 10);
	}
	SAY("speaks first: %d calls, %d connections\n", n, accepted);
	for (int i = 0; i < n; i++) {
		ck_assert_int_eq(r[i].done, 1);
		ck_assert_int_eq(r[i].err, TW_EPROTO);
		rc_assert_why(&r[i], "sent a message before any request: not a Dask server");
	}
	ck_assert_int_le(accepted, n);
	tw_pool_free(pool);
	msgpack_sbuffer_destroy(&out);
	close(s.lfd);
	tu_fini(&h);
}
END_TEST

/* ---- 20. a request, then one that is not a map, in one write: the
 * first is served and its reply reaches the peer before the server drops
 * the comm (issue 17, finding 2; design.md, Close). Before, the reply was
 * queued when the second request was read, and dropped with the comm ---- */

/* A raw client sends the handshake, the request req (rn bytes of frame
 * 0) and then bad (n bytes) in one write, to a server whose context
 * offloads every decode when offload is set: it gets the server's
 * handshake and the reply, then EOF. */
static void reply_then_bad_req(const void *req, size_t rn, const void *bad, size_t n, int offload)
{
	struct rf f;
	msgpack_sbuffer out;
	static uint8_t buf[65536];
	int fd;
	rf_init(&f);
	if (offload)
		ck_assert_int_eq(tw_context_set_offload_threshold_bytes(f.h.ctx, 0), 0);
	msgpack_sbuffer_init(&out);
	handshake_bytes(&out);
	wire1(&out, req, rn);
	msgpack_sbuffer_write(&out, bad, n);
	fd = ts_raw_connect(f.s.addr);
	ck_assert_uint_eq(tu_raw_send(&f.h, fd, out.data, out.size), out.size);
	read_msgs_to_eof(&f.h, fd, buf, sizeof(buf), 2); /* its handshake and the reply */
	close(fd);
	msgpack_sbuffer_destroy(&out);
	rf_fini(&f);
}

/* reply_then_bad_req with {"op": "identity"}. */
static void reply_then_bad(const void *bad, size_t n, int offload)
{
	reply_then_bad_req("\x81\xa2op\xa8identity", 13, bad, n, offload); /* {"op": "identity"} */
}

START_TEST(reply_before_bad_request_drop)
{
	msgpack_sbuffer bad;
	msgpack_sbuffer_init(&bad);
	wire1(&bad, "\x07", 1); /* not a map: the server drops the comm */
	reply_then_bad(bad.data, bad.size, 0);
	msgpack_sbuffer_destroy(&bad);
}
END_TEST

/* The same with the request decoded on the offload pool and a bad
 * prelude (a message of 0 frames) after it in the same write: the comm
 * ended at the bad prelude, the request was served when its decode came
 * back, and its reply was dropped (evidence18 D1); now the bad input's
 * end waits for the requests before it. */
START_TEST(reply_before_bad_prelude_offloaded)
{
	static const uint64_t bad[2] = {8, 0}; /* total 8: a prelude of 0 frames */
	reply_then_bad(bad, sizeof(bad), 1);
}
END_TEST

static int counted_one(void *arg)
{
	return ((struct rs *)arg)->counted >= 1;
}

/* A raw client sends the handshake, an echo of 16 MiB, the request req
 * (rn bytes of frame 0) and a bad prelude in one write, to a server that
 * offloads every decode and whose write high-water mark is hwm (0: the
 * default); once the server counted req (when counted is set) it reads
 * to the server's EOF, which must come after msgs whole messages. */
static void big_then_bad(const char *req, size_t rn, size_t hwm, int counted, size_t msgs)
{
	static const uint64_t bad[2] = {8, 0}; /* total 8: a prelude of 0 frames */
	static const uint8_t head[] = {0x82, 0xa2, 'o', 'p', 0xa4, 'e',  'c',  'h',  'o', 0xa4,
				       'd',  'a',  't', 'a', 0xc6, 0x01, 0x00, 0x00, 0x00};
	size_t big = (size_t)16 << 20, cap = big + 4096;
	uint8_t *buf = malloc(cap), *echo = calloc(1, sizeof(head) + big);
	struct rf f;
	msgpack_sbuffer out;
	int fd;
	ck_assert_ptr_nonnull(buf);
	ck_assert_ptr_nonnull(echo);
	rf_init(&f);
	ck_assert_int_eq(tw_context_set_offload_threshold_bytes(f.h.ctx, 0), 0);
	if (hwm != 0)
		ck_assert_int_eq(tw_context_set_write_hwm_bytes(f.h.ctx, hwm), 0);
	memcpy(echo, head, sizeof(head)); /* {"op": "echo", "data": <bin32 of 16 MiB>} */
	msgpack_sbuffer_init(&out);
	handshake_bytes(&out);
	wire1(&out, echo, sizeof(head) + big);
	wire1(&out, req, rn);
	msgpack_sbuffer_write(&out, (const char *)bad, sizeof(bad));
	fd = ts_raw_connect(f.s.addr);
	ck_assert_uint_eq(tu_raw_send(&f.h, fd, out.data, out.size), out.size);
	if (counted)
		ck_assert(tu_run_until(&f.h, counted_one, &f.s, TU_WAIT_MS));
	read_msgs_to_eof(&f.h, fd, buf, cap, msgs);
	close(fd);
	msgpack_sbuffer_destroy(&out);
	free(echo);
	free(buf);
	rf_fini(&f);
}

/* {"op": "count"} after the echo, with a write high-water mark of 1 byte
 * and a peer that reads nothing until count was served: the echo's reply
 * is queued, count's is refused (the queue is over the mark) and waits
 * for the queue to drain (server.c on_drain). Both replies go out, then
 * EOF. Before (breaker21), the deferred fail ran once count was delivered
 * and closed the comm, so count's reply was never queued: the server's
 * handshake and the echo's reply, then EOF. Inline, the bad prelude is
 * read only once count's reply is queued and the comm resumed. */
START_TEST(refused_reply_before_bad_prelude_offloaded)
{
	big_then_bad("\x81\xa2op\xa5"
		     "count",
		     10, 1, 1, 3);
}
END_TEST

/* A request that does not decode (a str of 5 bytes with 4) after the
 * echo: the server drops the comm for it, which closes after the echo's
 * reply (16 MiB: a peer reads it over many writes); then EOF. Before
 * (breaker21), the deferred fail of the bad prelude ran on the closing
 * comm and ended it at once: the echo's reply was cut after its first
 * write (16,450 bytes of it came). */
START_TEST(undecodable_request_before_bad_prelude_offloaded)
{
	big_then_bad("\x81\xa2op\xa5"
		     "coun",
		     9, 0, 0, 2);
}
END_TEST

/* One taskwire message of a single frame as a ws client sends it
 * (masked): the count message (N = 1, 8 bytes little-endian), then the
 * frame as a binary message (ws_comm.h). */
static void ws_msg1(msgpack_sbuffer *out, const void *f, size_t n)
{
	uint8_t u[8], *b = malloc(n + 14);
	ck_assert_ptr_nonnull(b);
	le64(u, 1);
	msgpack_sbuffer_write(out, (const char *)b, wu_frame(b, 1, 2, u, 8, 1));
	msgpack_sbuffer_write(out, (const char *)b, wu_frame(b, 1, 2, f, n, 1));
	free(b);
}

/* Taskwire messages in the server's frames f[0..n) before its close
 * frame (the last): each is a count message, then that many frames, a
 * large one in fragments (continuation frames, opcode 0). */
static size_t ws_msgs(const struct wu_fr *f, size_t n)
{
	size_t i = 0, msgs = 0;
	while (i + 1 < n) {
		uint64_t nf;
		ck_assert_msg(f[i].op == 2 && f[i].len == 8,
			      "frame %zu: op %d, %llu bytes, not a count", i, f[i].op,
			      (unsigned long long)f[i].len);
		memcpy(&nf, f[i].payload, 8);
		i++;
		for (nf = le64toh(nf); nf > 0 && i < n; nf--)
			for (i++; i < n && f[i].op == 0; i++)
				;
		msgs++;
	}
	ck_assert_uint_eq(i, n - 1);
	return msgs;
}

/* {"op": "later"} (held until rs_release) and a bad prelude in one write
 * (_i: decoded inline, on the offload pool): the late reply goes out,
 * then EOF. Before (breaker21), inline: the reply went, and the comm
 * stayed open for ever (to the hang guard): the bad prelude, read along
 * with the request, was checked only when more bytes came. Offloaded: the
 * deferred fail ran as the request was delivered and the late reply was
 * dropped (tw_request_reply: TW_ECLOSED; the server's handshake, then EOF). */
START_TEST(late_reply_before_bad_prelude)
{
	static const uint64_t bad[2] = {8, 0}; /* total 8: a prelude of 0 frames */
	static uint8_t buf[65536];
	struct rf f;
	msgpack_sbuffer out;
	int fd;
	rf_init(&f);
	if (_i)
		ck_assert_int_eq(tw_context_set_offload_threshold_bytes(f.h.ctx, 0), 0);
	msgpack_sbuffer_init(&out);
	handshake_bytes(&out);
	wire1(&out,
	      "\x81\xa2op\xa5"
	      "later",
	      10);
	msgpack_sbuffer_write(&out, (const char *)bad, sizeof(bad));
	fd = ts_raw_connect(f.s.addr);
	ck_assert_uint_eq(tu_raw_send(&f.h, fd, out.data, out.size), out.size);
	ck_assert(tu_run_until(&f.h, rs_held_one, &f.s, TU_WAIT_MS));
	rs_release(&f.s, 0);
	read_msgs_to_eof(&f.h, fd, buf, sizeof(buf), 2); /* its handshake and the reply */
	ck_assert_int_eq(f.s.last_reply_rv, 0);
	close(fd);
	msgpack_sbuffer_destroy(&out);
	rf_fini(&f);
}
END_TEST

/* A raw ws client (scheme: ws or wss) sends the handshake, the request req
 * (rn bytes) and a frame of opcode 3 (RFC 6455 section 5.2: reserved) in
 * one write, to a server that offloads every decode when offload is set:
 * it gets the server's handshake, the reply, then close 1002. */
static void ws_reply_then_bad(const char *scheme, const void *req, size_t rn, int offload)
{
	struct tu h;
	struct rs s;
	struct wu_raw r;
	struct wu_fr f[16];
	struct ts_pack p;
	msgpack_sbuffer out;
	char reason[128];
	size_t n;
	wu_init(&h, scheme);
	if (offload)
		ck_assert_int_eq(tw_context_set_offload_threshold_bytes(h.ctx, 0), 0);
	rs_start(&s, h.ctx, h.base,
		 strcmp(scheme, "ws") == 0 ? "ws://127.0.0.1:0" : "wss://127.0.0.1:0");
	ck_assert_int_eq(wu_raw_open(&h, s.addr, NULL, &r), 101);
	msgpack_sbuffer_init(&out);
	ts_pack_handshake_info(ts_pack_start(&p), 0);
	ws_msg1(&out, p.sb.data, p.sb.size);
	msgpack_sbuffer_destroy(&p.sb);
	ws_msg1(&out, req, rn);                                             /* {"op": "identity"} */
	n = wu_hex("83 80 37 fa 21 3d", (uint8_t *)reason, sizeof(reason)); /* opcode 3 */
	msgpack_sbuffer_write(&out, reason, n);
	ck_assert_uint_eq(wu_raw_send(&r, out.data, out.size), out.size);
	ck_assert_msg(wu_raw_read_eof(&r, WU_WAIT_MS), "server kept the connection open");
	n = wu_parse(r.in, r.nin, f, 16, NULL);
	ck_assert_uint_ge(n, 1);
	ck_assert_int_eq(f[n - 1].op, 8);
	ck_assert_int_eq(wu_close_code(r.in, r.nin, reason, sizeof(reason)), 1002);
	ck_assert_msg(ws_msgs(f, n) == 2,
		      "%zu messages from the server, not its handshake and the reply",
		      ws_msgs(f, n));
	wu_raw_close(&r);
	msgpack_sbuffer_destroy(&out);
	rs_stop(&s);
	tu_fini(&h);
}

/* The same over ws and wss: the request decoded on the offload pool, and
 * the bad frame after it. The comm ended at the bad frame at once and the
 * reply was dropped (the server's handshake, then close 1002); now the bad
 * frame's close waits for the request's reply. */
START_TEST(reply_before_bad_frame_offloaded_ws)
{
	ws_reply_then_bad(wu_scheme(_i), "\x81\xa2op\xa8identity", 13, 1);
}
END_TEST

/* {"op": "close", "reply": true}: Dask's close op, answered "OK" before the
 * server closes the comm. */
static const char close_req[] = "\x82\xa2op\xa5"
				"close\xa5reply\xc3";

/* The close op, then a bad prelude in the same write (_i: decoded inline,
 * on the offload pool): the "OK" goes out, then EOF. Offloaded, the op's
 * tw_comm_close came while the bad prelude's fail was deferred, and that
 * fail, run after the op, found the comm closing and ended it at once:
 * the server's handshake, then EOF (breaker21). */
START_TEST(close_op_then_bad_prelude)
{
	static const uint64_t bad[2] = {8, 0}; /* total 8: a prelude of 0 frames */
	reply_then_bad_req(close_req, sizeof(close_req) - 1, bad, sizeof(bad), _i);
}
END_TEST

/* The same over ws and wss (_i: scheme, then inline or offloaded), with
 * a frame of opcode 3 after the close op: "OK", then close 1002. Before
 * (breaker21), inline: the bad frame came while the close waited for the
 * reply to go, and the comm ended at once (read_closing took it for the
 * peer's end): the server's handshake, no close frame. Offloaded: the
 * op's close read on from inside the bad frame, with the same end. */
START_TEST(close_op_then_bad_frame_ws)
{
	ws_reply_then_bad(wu_scheme(_i % 2), close_req, sizeof(close_req) - 1, _i / 2);
}
END_TEST

/* Over ws and wss: an echo of 16 MiB, a request that does not decode and
 * then a frame of opcode 3 in one write, every decode offloaded: the
 * server drops the comm for the request after the echo's reply, closing
 * with the deferred frame's code (1002). Before (breaker21), the deferred
 * fail ran on the closing comm and ended it at once: part of the echo's
 * reply, no close frame. */
START_TEST(undecodable_request_before_bad_frame_offloaded_ws)
{
	static const uint8_t head[] = {0x82, 0xa2, 'o', 'p', 0xa4, 'e',  'c',  'h',  'o', 0xa4,
				       'd',  'a',  't', 'a', 0xc6, 0x01, 0x00, 0x00, 0x00};
	const char *scheme = wu_scheme(_i);
	size_t big = (size_t)16 << 20, n;
	uint8_t *echo = calloc(1, sizeof(head) + big), bad[8];
	struct tu h;
	struct rs s;
	struct wu_raw r;
	struct wu_fr f[64];
	struct ts_pack p;
	msgpack_sbuffer out;
	ck_assert_ptr_nonnull(echo);
	memcpy(echo, head, sizeof(head)); /* {"op": "echo", "data": <bin32 of 16 MiB>} */
	wu_init(&h, scheme);
	ck_assert_int_eq(tw_context_set_offload_threshold_bytes(h.ctx, 0), 0);
	rs_start(&s, h.ctx, h.base,
		 strcmp(scheme, "ws") == 0 ? "ws://127.0.0.1:0" : "wss://127.0.0.1:0");
	ck_assert_int_eq(wu_raw_open(&h, s.addr, NULL, &r), 101);
	msgpack_sbuffer_init(&out);
	ts_pack_handshake_info(ts_pack_start(&p), 0);
	ws_msg1(&out, p.sb.data, p.sb.size);
	msgpack_sbuffer_destroy(&p.sb);
	ws_msg1(&out, echo, sizeof(head) + big);
	ws_msg1(&out,
		"\x81\xa2op\xa5"
		"coun",
		9);
	n = wu_hex("83 80 37 fa 21 3d", bad, sizeof(bad)); /* opcode 3 */
	msgpack_sbuffer_write(&out, (const char *)bad, n);
	ck_assert_uint_eq(wu_raw_send(&r, out.data, out.size), out.size);
	ck_assert_msg(wu_raw_read_eof(&r, WU_WAIT_MS), "server kept the connection open");
	n = wu_parse(r.in, r.nin, f, 64, NULL);
	ck_assert_uint_ge(n, 1);
	ck_assert_int_eq(f[n - 1].op, 8);
	ck_assert_int_eq(wu_close_code(r.in, r.nin, NULL, 0), 1002);
	ck_assert_msg(ws_msgs(f, n) == 2,
		      "%zu messages from the server, not its handshake and the echo's reply",
		      ws_msgs(f, n));
	wu_raw_close(&r);
	msgpack_sbuffer_destroy(&out);
	free(echo);
	rs_stop(&s);
	tu_fini(&h);
}
END_TEST

int main(void)
{
	TCase *tc =
		ts_tcase("attack", 120, TS_TESTS(server_free_mid_handshake, handshake_zstd_bomb));
	ts_add_loop(tc, 2, TS_TESTS(handshake_twice));
	ts_add(tc, TS_TESTS(server_free_in_stream_handler, server_free_in_op_handler,
			    op_with_nul_is_not_builtin, reply_flag_is_python_truth,
			    duplicate_keys_last_wins, pool_duplicate_reply_misattributed,
			    batched_unbounded, pipelined_handshake_big_request, pipelined_no_read,
			    stream_data_after_close_stream, pool_reset_mid_reply,
			    cancel_from_callbacks, stream_big_batch, stream_handler_aborts_comm,
			    pool_partial_limit1_sweep_hangs, pool_partial_limit1_timeout,
			    pool_partial_default_limit));
	ts_add_loop(tc, 3, TS_TESTS(pool_peer_speaks_first));
	ts_add(tc, TS_TESTS(reply_before_bad_request_drop, reply_before_bad_prelude_offloaded));
	ts_add_loop(tc, 2, TS_TESTS(reply_before_bad_frame_offloaded_ws));
	ts_add_loop(tc, 2, TS_TESTS(close_op_then_bad_prelude));
	ts_add(tc, TS_TESTS(refused_reply_before_bad_prelude_offloaded,
			    undecodable_request_before_bad_prelude_offloaded));
	ts_add_loop(tc, 4, TS_TESTS(close_op_then_bad_frame_ws));
	ts_add_loop(tc, 2, TS_TESTS(undecodable_request_before_bad_frame_offloaded_ws));
	ts_add_loop(tc, 2, TS_TESTS(late_reply_before_bad_prelude));
	return ts_main("rpc_bad", TS_NO_SIGPIPE | TS_CERTS, TS_CASES(tc));
}
