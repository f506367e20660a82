/* SPDX-License-Identifier: BSD-3-Clause */
/* Interop with real Dask peers (Debian's python3-distributed 2022.12.1):
 *
 *   scheduler*  a taskwire client against `dask scheduler` (its RPC ops);
 *   server*     a taskwire client against tests/interop/dask_server.py, a
 *               distributed.core.Server(deserialize=True) with an op that
 *               raises, one that replies out of band, and Worker.get_data's
 *               exchange (a tw_pool with TW_CALL_ACK_OK);
 *   python_client  tests/interop/dask_client.py, a Python
 *               distributed.comm.connect client, against a taskwire
 *               comm-level echo server run by the test.
 * The -zstd and -lz4 cases pin the Python peer's codec with
 * DASK_DISTRIBUTED__COMM__COMPRESSION and offer the same codec from
 * taskwire, so both sides send compressed sub-frames.
 *
 * Each scheduler or server TCase starts its peer once (an unchecked
 * fixture, in the runner process) and stops it after its last test; every
 * test opens a comm of its own. TW_KEEP_LOGS=1 keeps the peers' logs
 * (their paths are in failure messages). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include <check.h>

#include "tests/support/dask.h"
#include "tests/support/pack.h"
#include "tests/support/suite.h"

#define BIG   ((size_t)70 << 20)
#define SHARD ((size_t)64 << 20)

/* The Python peer of the running TCase. */
static struct ts_proc peer;
static char peer_addr[128];
static char peer_error[1024];
static const char *peer_codec; /* pinned in Python, offered by taskwire */
static int peer_is_scheduler;

/* The running test's loop and client. */
static struct tu loop;
static struct du_client *cli;

/* Peers. */

static void start_peer(int scheduler, const char *codec)
{
	char script[4096], env_codec[64];
	char *sched_argv[] = {TS_PYTHON,
			      "-m",
			      "distributed.cli.dask_scheduler",
			      "--host",
			      "127.0.0.1",
			      "--port",
			      "0",
			      "--dashboard-address",
			      "127.0.0.1:0",
			      "--no-show",
			      NULL};
	char *server_argv[] = {TS_PYTHON, script, NULL};
	char *env[] = {"PYTHONNOUSERSITE=1", codec != NULL ? env_codec : NULL, NULL};
	char tail[512];
	ts_script("dask_server.py", script, sizeof(script));
	snprintf(env_codec, sizeof(env_codec), "DASK_DISTRIBUTED__COMM__COMPRESSION=%s",
		 codec != NULL ? codec : "");
	peer_addr[0] = '\0';
	peer_error[0] = '\0';
	peer_codec = codec;
	peer_is_scheduler = scheduler;
	if (ts_spawn(&peer, scheduler ? sched_argv : server_argv, env) != 0) {
		snprintf(peer_error, sizeof(peer_error), "cannot start %s", TS_PYTHON);
		return;
	}
	if (!ts_proc_wait_log(&peer, NULL, scheduler ? "Scheduler at:" : "listening on", peer_addr,
			      sizeof(peer_addr), TS_START_MS)) {
		peer_addr[0] = '\0';
		snprintf(peer_error, sizeof(peer_error), "no address in %s: %s", peer.log,
			 ts_proc_log_tail(&peer, tail, sizeof(tail)));
	}
}

static void start_scheduler(void)
{
	start_peer(1, NULL);
}
static void start_scheduler_zstd(void)
{
	start_peer(1, "zstd");
}
static void start_scheduler_lz4(void)
{
	start_peer(1, "lz4");
}
static void start_server(void)
{
	start_peer(0, NULL);
}
static void start_server_zstd(void)
{
	start_peer(0, "zstd");
}
static void start_server_lz4(void)
{
	start_peer(0, "lz4");
}

static void stop_peer(void)
{
	ts_proc_stop(&peer);
}

/* Per test: a loop and a comm to the peer, after the handshake. */
static void open_client(void)
{
	int rv;
	ck_assert_msg(peer_addr[0] != '\0', "the Python peer did not start: %s", peer_error);
	tu_init(&loop);
	if (peer_codec != NULL)
		ck_assert_int_eq(tw_context_set_compression(loop.ctx, peer_codec), 0);
	rv = du_client_open(&loop, peer_addr, &cli);
	ck_assert_msg(rv == 0, "connect/handshake to %s: %s: %s", peer_addr, tw_strerror(rv),
		      cli->last_error);
}

static void close_client(void)
{
	du_client_free(cli);
	cli = NULL;
	tu_fini(&loop);
}

/* Requests. */

static void pack_str(msgpack_packer *pk, const char *s)
{
	msgpack_pack_str(pk, strlen(s));
	msgpack_pack_str_body(pk, s, strlen(s));
}

/* A builder with {"op": op, ...nargs more pairs}, compressing payloads
 * with the negotiated codec. */
static tw_builder *req_begin(const char *op, size_t nargs)
{
	tw_builder *b;
	const char *codec = cli->compression[0] != '\0' ? cli->compression : NULL;
	ck_assert_int_eq(tw_builder_new(codec, &b), 0);
	msgpack_pack_map(tw_builder_packer(b), 1 + nargs);
	pack_str(tw_builder_packer(b), "op");
	pack_str(tw_builder_packer(b), op);
	return b;
}

static tw_msg *req_end(tw_builder *b)
{
	tw_msg *m;
	ck_assert_int_eq(tw_builder_finish(b, &m), 0);
	tw_builder_free(b);
	return m;
}

static tw_msg *req_op(const char *op)
{
	return req_end(req_begin(op, 0));
}

/* {"op": op, "data": <bin>} */
static tw_msg *req_bin(const char *op, const void *p, size_t n)
{
	tw_builder *b = req_begin(op, 1);
	pack_str(tw_builder_packer(b), "data");
	msgpack_pack_bin(tw_builder_packer(b), n);
	msgpack_pack_bin_body(tw_builder_packer(b), p, n);
	return req_end(b);
}

/* {"op": op, "data": <out-of-band bytes>} */
static tw_msg *req_oob(const char *op, const tw_slice *data)
{
	tw_builder *b = req_begin(op, 1);
	pack_str(tw_builder_packer(b), "data");
	ck_assert_int_eq(tw_builder_pack_bytes(b, data), 0);
	return req_end(b);
}

static void send_req(tw_msg *m)
{
	int rv = du_client_write(cli, m);
	ck_assert_msg(rv == 0, "write: %s", tw_strerror(rv));
}

/* Replies. */

static tw_decoded *reply(size_t i)
{
	char why[256] = "";
	tw_decoded *d;
	tw_msg *m = du_client_msg(cli, i, DU_WAIT_MS);
	int rv;
	ck_assert_msg(m != NULL, "no reply %zu: comm closed=%d (%s: %s)", i, cli->closed,
		      tw_strerror(cli->close_err), cli->last_error);
	rv = tw_decode(m, NULL, &d, why, sizeof(why));
	ck_assert_msg(rv == 0, "reply %zu: %s: %s", i, tw_strerror(rv), why);
	return d;
}

static tw_decoded *call(tw_msg *req)
{
	send_req(req);
	return reply(cli->nmsgs);
}

/* The bytes o stands for: inline bin, or one out-of-band frame (*pl). */
static void get_bytes(const tw_decoded *d, const msgpack_object *o, const uint8_t **p, size_t *n,
		      const tw_payload **pl)
{
	*pl = o != NULL ? tw_decoded_payload(d, o) : NULL;
	if (*pl != NULL) {
		ck_assert_uint_eq((*pl)->nframes, 1);
		*p = tw_slice_data(&(*pl)->frames[0]);
		*n = (*pl)->frames[0].len;
		return;
	}
	ck_assert_msg(o != NULL && o->type == MSGPACK_OBJECT_BIN,
		      "expected bytes, inline or out of band (type %d)", o ? (int)o->type : -1);
	*p = (const uint8_t *)o->via.bin.ptr;
	*n = o->via.bin.size;
}

static void check_pattern(const uint8_t *p, size_t n, size_t want, unsigned seed)
{
	long long at;
	ck_assert_uint_eq(n, want);
	at = n > 0 ? ts_check(p, n, seed) : -1;
	ck_assert_msg(at == -1, "byte %lld of %zu differs", at, n);
}

static void check_str(const msgpack_object *o, const char *want)
{
	ck_assert_msg(tw_msgpack_str_eq(o, want), "expected the str \"%s\" (type %d)", want,
		      o != NULL ? (int)o->type : -1);
}

/* A block with the pattern of seed 0: the slice at offset s has seed s. */
static tw_block *pattern_block(size_t n)
{
	tw_block *b;
	ck_assert_int_eq(tw_block_new(n + 251, &b), 0);
	ts_fill(tw_block_data(b), n + 251, 0);
	return b;
}

/* The codec of sub-frame j of a payload, "" for none. */
static void sub_codec(const tw_payload *pl, uint32_t j, char *buf, size_t len)
{
	const msgpack_object *c = tw_msgpack_map_get(pl->sub_header, "compression");
	buf[0] = '\0';
	if (c != NULL && c->type == MSGPACK_OBJECT_ARRAY && j < c->via.array.size &&
	    c->via.array.ptr[j].type == MSGPACK_OBJECT_STR)
		snprintf(buf, len, "%.*s", (int)c->via.array.ptr[j].via.str.size,
			 c->via.array.ptr[j].via.str.ptr);
}

static uint64_t sub_frames(const tw_payload *pl)
{
	const msgpack_object *n = tw_msgpack_map_get(pl->sub_header, "num-sub-frames");
	ck_assert(n != NULL && n->type == MSGPACK_OBJECT_POSITIVE_INTEGER);
	return n->via.u64;
}

/* Tests shared by the scheduler and server TCases. */

START_TEST(handshake_and_identity)
{
	const msgpack_object *root, *id;
	tw_decoded *d;
	ck_assert_int_eq(cli->pickle_protocol, 5);
	ck_assert_str_eq(cli->compression, peer_codec != NULL ? peer_codec : "");
	if (peer_codec != NULL)
		ck_assert_str_eq(cli->peer_compression, peer_codec);
	d = call(req_op("identity"));
	root = tw_decoded_root(d);
	ck_assert_int_eq(root->type, MSGPACK_OBJECT_MAP);
	check_str(tw_msgpack_map_get(root, "type"), peer_is_scheduler ? "Scheduler" : "Server");
	id = tw_msgpack_map_get(root, "id");
	ck_assert(id != NULL && id->type == MSGPACK_OBJECT_STR && id->via.str.size > 0);
	tw_decoded_free(d);
}
END_TEST

START_TEST(echo_inline_bin)
{
	static const char data[] = "taskwire \0\xff inline";
	tw_decoded *d = call(req_bin("echo", data, sizeof(data)));
	const msgpack_object *root = tw_decoded_root(d);
	ck_assert_int_eq(root->type, MSGPACK_OBJECT_BIN);
	ck_assert_uint_eq(root->via.bin.size, sizeof(data));
	ck_assert_mem_eq(root->via.bin.ptr, data, sizeof(data));
	tw_decoded_free(d);
}
END_TEST

static const size_t echo_sizes[] = {0, 3, 20000, BIG};

/* call(op with n pattern bytes of seed, out of band): the reply's bytes
 * are the pattern. Returns the reply (the caller frees it); *pl is its
 * payload, NULL for inline bytes. */
static tw_decoded *call_oob(const char *op, size_t n, unsigned seed, const tw_payload **pl)
{
	tw_block *pat = pattern_block(n);
	const uint8_t *p;
	size_t got;
	tw_decoded *d = call(req_oob(op, &(tw_slice){pat, seed, n}));
	get_bytes(d, tw_decoded_root(d), &p, &got, pl);
	check_pattern(p, got, n, seed);
	tw_block_free(pat);
	return d;
}

/* echo of out-of-band bytes; the reply may be inline (a server that
 * deserialized them) or out of band (the scheduler echoes them as it got
 * them). */
START_TEST(echo_oob)
{
	const tw_payload *pl;
	tw_decoded_free(call_oob("echo", echo_sizes[_i], (unsigned)(_i * 17 % 251), &pl));
}
END_TEST

/* An error reply: the server's op raises; on the scheduler, echo with an
 * argument it does not take raises TypeError. */
START_TEST(error_reply)
{
	const msgpack_object *root, *text, *tb, *exc;
	const tw_payload *pl;
	tw_decoded *d;
	if (peer_is_scheduler) {
		tw_builder *b = req_begin("echo", 1);
		pack_str(tw_builder_packer(b), "bogus");
		msgpack_pack_int(tw_builder_packer(b), 1);
		d = call(req_end(b));
	} else {
		d = call(req_op("raise"));
	}
	root = tw_decoded_root(d);
	ck_assert_int_eq(root->type, MSGPACK_OBJECT_MAP);
	check_str(tw_msgpack_map_get(root, "status"), "uncaught-error");
	text = tw_msgpack_map_get(root, "exception_text");
	check_str(
		text,
		peer_is_scheduler
			? "TypeError(\"Server.echo() got an unexpected keyword argument 'bogus'\")"
			: "RuntimeError('taskwire test error')");
	tb = tw_msgpack_map_get(root, "traceback_text");
	ck_assert(tb != NULL && tb->type == MSGPACK_OBJECT_STR && tb->via.str.size > 0);
	/* The pickled exception rides out of band, as a pickle (protocol 2+). */
	exc = tw_msgpack_map_get(root, "exception");
	pl = tw_decoded_payload(d, exc);
	ck_assert_ptr_nonnull(pl);
	ck_assert_uint_eq(pl->nframes, 1);
	ck_assert_uint_gt(pl->frames[0].len, 2);
	ck_assert_uint_eq(tw_slice_data(&pl->frames[0])[0], 0x80);
	tw_decoded_free(d);
}
END_TEST

/* Unknown op: nil, and the comm goes on. */
START_TEST(unknown_op)
{
	tw_decoded *d = call(req_op("taskwire_no_such_op"));
	ck_assert_int_eq(tw_decoded_root(d)->type, MSGPACK_OBJECT_NIL);
	tw_decoded_free(d);
	d = call(req_bin("echo", "after", 5));
	ck_assert_int_eq(tw_decoded_root(d)->type, MSGPACK_OBJECT_BIN);
	ck_assert_mem_eq(tw_decoded_root(d)->via.bin.ptr, "after", 5);
	tw_decoded_free(d);
}
END_TEST

/* Three requests written before any reply is read: replies in order. */
START_TEST(pipelined)
{
	tw_block *pat = pattern_block(20000);
	const tw_payload *pl;
	const uint8_t *p;
	size_t n;
	tw_decoded *d;
	send_req(req_bin("echo", "first", 5));
	send_req(req_op("identity"));
	send_req(req_oob("echo", &(tw_slice){pat, 9, 20000}));
	d = reply(0);
	ck_assert_int_eq(tw_decoded_root(d)->type, MSGPACK_OBJECT_BIN);
	ck_assert_mem_eq(tw_decoded_root(d)->via.bin.ptr, "first", 5);
	tw_decoded_free(d);
	d = reply(1);
	check_str(tw_msgpack_map_get(tw_decoded_root(d), "type"),
		  peer_is_scheduler ? "Scheduler" : "Server");
	tw_decoded_free(d);
	d = reply(2);
	get_bytes(d, tw_decoded_root(d), &p, &n, &pl);
	check_pattern(p, n, 20000, 9);
	tw_decoded_free(d);
	ck_assert_uint_eq(cli->nmsgs, 3);
	tw_block_free(pat);
}
END_TEST

/* {"op": "close"}: "OK", then an orderly end of the comm. */
START_TEST(close_op)
{
	tw_decoded *d = call(req_op("close"));
	check_str(tw_decoded_root(d), "OK");
	tw_decoded_free(d);
	ck_assert(tu_wait_flag(&loop, &cli->closed, DU_WAIT_MS));
	ck_assert_msg(cli->close_err == 0, "close: %s: %s", tw_strerror(cli->close_err),
		      cli->last_error);
	ck_assert_uint_eq(cli->nmsgs, 1);
}
END_TEST

/* Server only: echo_oob replies out of band; 70 MiB comes back as two
 * shards (64 MiB + 6 MiB) that land adjacent and merge without a copy. */
START_TEST(reply_oob)
{
	size_t n = echo_sizes[_i], got;
	unsigned seed = (unsigned)(_i * 31 % 251);
	tw_block *pat = pattern_block(n);
	const tw_payload *pl;
	const uint8_t *p;
	tw_stats before, after;
	tw_decoded *d;
	char why[256] = "";
	tw_msg *m;
	send_req(req_oob("echo_oob", &(tw_slice){pat, seed, n}));
	m = du_client_msg(cli, 0, DU_WAIT_MS);
	ck_assert_msg(m != NULL, "no reply: %s", cli->last_error);
	tw_stats_global(&before, sizeof(before));
	ck_assert_msg(tw_decode(m, NULL, &d, why, sizeof(why)) == 0, "decode: %s", why);
	tw_stats_global(&after, sizeof(after));
	get_bytes(d, tw_decoded_root(d), &p, &got, &pl);
	ck_assert_ptr_nonnull(pl);
	check_pattern(p, got, n, seed);
	ck_assert_uint_eq(sub_frames(pl), n > SHARD ? 2 : 1);
	if (n > SHARD && peer_codec == NULL) {
		ck_assert_uint_gt(after.merges_zero_copy, before.merges_zero_copy);
		ck_assert_uint_eq(after.merges_copied, before.merges_copied);
		ck_assert_uint_eq(after.payload_bytes_copied, before.payload_bytes_copied);
	}
	tw_decoded_free(d);
	tw_block_free(pat);
}
END_TEST

/* Codec cases: what taskwire sends is compressed, and comes back right. */

static const size_t codec_sizes[] = {20000, BIG};

/* The request carries its payload compressed with the negotiated codec. */
static void check_request_compressed(const tw_msg *req, size_t n)
{
	char why[256] = "", codec[16];
	tw_decoded *d;
	const tw_payload *pl;
	ck_assert_msg(tw_decode(req, NULL, &d, why, sizeof(why)) == 0, "decode: %s", why);
	ck_assert_uint_eq(tw_decoded_npayloads(d), 1);
	pl = tw_decoded_payload_at(d, 0);
	sub_codec(pl, 0, codec, sizeof(codec));
	ck_assert_str_eq(codec, peer_codec);
	ck_assert_uint_lt(tw_msg_frame(req, 2)->len, n / 2);
	ck_assert_uint_eq(pl->frames[0].len, n);
	tw_decoded_free(d);
}

START_TEST(codec_echo)
{
	size_t n = codec_sizes[_i], got;
	tw_block *pat = pattern_block(n);
	const tw_payload *pl;
	const uint8_t *p;
	tw_decoded *d;
	tw_msg *req = req_oob("echo", &(tw_slice){pat, 5, n});
	ck_assert_str_eq(cli->compression, peer_codec);
	check_request_compressed(req, n);
	d = call(req);
	get_bytes(d, tw_decoded_root(d), &p, &got, &pl);
	check_pattern(p, got, n, 5);
	if (peer_is_scheduler) /* it echoes our compressed frame as it got it */
		ck_assert_ptr_nonnull(pl);
	if (pl != NULL) {
		char codec[16];
		sub_codec(pl, 0, codec, sizeof(codec));
		ck_assert_str_eq(codec, peer_codec);
	}
	tw_decoded_free(d);
	tw_block_free(pat);
}
END_TEST

/* Server only: Python compresses the sub-frames of its reply. */
START_TEST(codec_reply_oob)
{
	size_t n = codec_sizes[_i];
	const tw_payload *pl;
	tw_decoded *d = call_oob("echo_oob", n, 3, &pl);
	ck_assert_ptr_nonnull(pl);
	ck_assert_uint_eq(sub_frames(pl), n > SHARD ? 2 : 1);
	for (uint32_t j = 0; j < sub_frames(pl); j++) {
		char codec[16];
		sub_codec(pl, j, codec, sizeof(codec));
		ck_assert_str_eq(codec, peer_codec);
	}
	tw_decoded_free(d);
}
END_TEST

/* python_client: a Python comm client against a taskwire echo server. */

struct echo_srv {
	struct tu *loop;
	struct du_srv srv;
	size_t closed;
	int write_failures, decode_failures;
	char why[256];
	size_t msgs;
	/* the 70 MiB message, decoded on arrival */
	int big_seen;
	size_t big_nframes, big_len, big_subs;
	long long big_diff;
	char big_codec[16];
	uint64_t zero_copy, copied, bytes_copied; /* stats deltas of its decode */
};

/* The message with the 70 MiB payload: record how it decoded. */
static void srv_check_big(struct echo_srv *s, const tw_payload *pl)
{
	s->big_seen++;
	s->big_nframes = pl->nframes;
	s->big_subs = (size_t)sub_frames(pl);
	sub_codec(pl, 0, s->big_codec, sizeof(s->big_codec));
	s->big_len = pl->frames[0].len;
	s->big_diff = ts_check(tw_slice_data(&pl->frames[0]), pl->frames[0].len, 0);
}

/* Decode every message, with the stats deltas of each decode. */
static void srv_decode(struct echo_srv *s, const tw_msg *m)
{
	tw_stats before, after;
	const tw_payload *pl;
	tw_decoded *d;
	int rv;
	tw_stats_global(&before, sizeof(before));
	rv = tw_decode(m, NULL, &d, s->why, sizeof(s->why));
	tw_stats_global(&after, sizeof(after));
	if (rv != 0) {
		s->decode_failures++;
		return;
	}
	pl = tw_decoded_payload(d, tw_msgpack_map_get(tw_decoded_root(d), "data"));
	if (pl != NULL && pl->nframes >= 1 && pl->frames[0].len == BIG) {
		s->zero_copy = after.merges_zero_copy - before.merges_zero_copy;
		s->copied = after.merges_copied - before.merges_copied;
		s->bytes_copied = after.payload_bytes_copied - before.payload_bytes_copied;
		srv_check_big(s, pl);
	}
	tw_decoded_free(d);
}

static void srv_recv(tw_comm *comm, tw_msg *m, void *arg)
{
	struct echo_srv *s = arg;
	s->msgs++;
	srv_decode(s, m);
	tw_msg_hold(m);
	if (tw_comm_write(comm, m) != 0) {
		tw_msg_free(m);
		s->write_failures++;
	}
}

static void srv_close(tw_comm *comm, int err, void *arg)
{
	struct echo_srv *s = arg;
	(void)comm;
	if (err != 0)
		snprintf(s->why, sizeof(s->why), "comm ended: %s", tw_strerror(err));
	s->closed++;
}

static int proc_exited(void *arg)
{
	return ts_proc_wait_exit(arg, NULL, 0);
}

static void run_python_client(const char *codec)
{
	struct echo_srv s = {.loop = &loop, .big_diff = -2};
	struct ts_proc py;
	char script[4096], env_codec[64], tail[1024];
	char *argv[] = {TS_PYTHON, script, s.srv.addr, NULL};
	char *env[] = {"PYTHONNOUSERSITE=1", codec != NULL ? env_codec : NULL, NULL};
	int ok;
	ts_script("dask_client.py", script, sizeof(script));
	snprintf(env_codec, sizeof(env_codec), "DASK_DISTRIBUTED__COMM__COMPRESSION=%s",
		 codec != NULL ? codec : "");
	tu_init(&loop);
	if (codec != NULL)
		ck_assert_int_eq(tw_context_set_compression(loop.ctx, codec), 0);
	du_srv_start(&s.srv, loop.ctx, "tcp://127.0.0.1:0", srv_recv, srv_close, &s);
	ck_assert_int_eq(ts_spawn(&py, argv, env), 0);
	ok = tu_run_until(&loop, proc_exited, &py, 2 * DU_WAIT_MS);
	ts_proc_log_tail(&py, tail, sizeof(tail));
	ts_proc_stop(&py);
	ck_assert_msg(ok, "the Python client did not finish: %s", tail);
	ck_assert_msg(WIFEXITED(py.status) && WEXITSTATUS(py.status) == 0,
		      "the Python client failed (status %d): %s", py.status, tail);
	ck_assert_int_eq(s.srv.hs_failures, 0);
	ck_assert_msg(s.decode_failures == 0, "decode: %s", s.why);
	ck_assert_int_eq(s.write_failures, 0);
	ck_assert_uint_eq(s.msgs, 7);
	/* the 70 MiB payload arrived as 2 shards, merged into 1 frame */
	ck_assert_int_eq(s.big_seen, 1);
	ck_assert_uint_eq(s.big_subs, 2);
	ck_assert_uint_eq(s.big_nframes, 1);
	ck_assert_uint_eq(s.big_len, BIG);
	ck_assert_int_eq(s.big_diff, -1);
	ck_assert_str_eq(s.big_codec, codec != NULL ? codec : "");
	if (codec == NULL) {
		ck_assert_uint_eq(s.zero_copy, 1);
		ck_assert_uint_eq(s.copied, 0);
		ck_assert_uint_eq(s.bytes_copied, 0);
	}
	du_srv_stop(&s.srv);
	tu_fini(&loop);
}

START_TEST(python_client_plain)
{
	run_python_client(NULL);
}
END_TEST

START_TEST(python_client_zstd)
{
	run_python_client("zstd");
}
END_TEST

START_TEST(python_client_lz4)
{
	run_python_client("lz4");
}
END_TEST

/* tw_pool with TW_CALL_ACK_OK against Worker.get_data's exchange
 * (dask_server.py get_data): three calls in turn on the pool's one comm.
 * The "OK" acknowledgement must reach the peer after each OK reply and
 * never after another reply ("busy"): the peer reads its next message as
 * the acknowledgement, so without it the next call's request is taken
 * for it and that call fails (AssertionError, TW_EREMOTE). */
struct pool_call {
	int done, err;
	tw_decoded *reply;
	char why[256];
};

static void on_pool_reply(tw_call *call, int err, tw_decoded *reply, void *arg)
{
	struct pool_call *pc = arg;
	pc->done = 1;
	pc->err = err;
	pc->reply = reply;
	snprintf(pc->why, sizeof(pc->why), "%s", tw_call_error(call));
}

static tw_msg *get_data_req(const char *key)
{
	tw_builder *b;
	tw_msg *m;
	msgpack_packer *pk;
	pk = ts_builder_map(&b, 4);
	pack_str(pk, "op");
	pack_str(pk, "get_data");
	pack_str(pk, "keys");
	msgpack_pack_array(pk, 1);
	pack_str(pk, key);
	pack_str(pk, "who");
	msgpack_pack_nil(pk);
	pack_str(pk, "max_connections");
	msgpack_pack_false(pk);
	ck_assert_int_eq(tw_builder_finish(b, &m), 0);
	tw_builder_free(b);
	return m;
}

static void pool_get_data(tw_pool *p, const char *key, const char *status)
{
	struct pool_call pc = {0};
	const msgpack_object *root, *data;
	ck_assert_int_eq(tw_pool_call_flags(p, peer_addr, get_data_req(key), DU_WAIT_MS,
					    TW_CALL_ACK_OK, on_pool_reply, &pc, NULL),
			 0);
	ck_assert_msg(tu_wait_flag(&loop, &pc.done, DU_WAIT_MS), "no reply to get_data %s", key);
	ck_assert_msg(pc.err == 0, "get_data %s: %s: %s", key, tw_strerror(pc.err), pc.why);
	root = tw_decoded_root(pc.reply);
	check_str(tw_msgpack_map_get(root, "status"), status);
	if (strcmp(status, "OK") == 0) {
		const uint8_t *b;
		size_t n;
		const tw_payload *pl;
		char want[64];
		data = tw_msgpack_map_get(root, "data");
		ck_assert(data != NULL && data->type == MSGPACK_OBJECT_MAP &&
			  data->via.map.size == 1);
		check_str(&data->via.map.ptr[0].key, key);
		get_bytes(pc.reply, &data->via.map.ptr[0].val, &b, &n, &pl);
		snprintf(want, sizeof(want), "%s%s", key, key);
		ck_assert_uint_eq(n, strlen(want));
		ck_assert(memcmp(b, want, n) == 0);
	}
	tw_decoded_free(pc.reply);
	ck_assert_uint_eq(tw_pool_open_comms(p, peer_addr), 1);
}

START_TEST(pool_get_data_ack)
{
	tw_pool *p;
	ck_assert_int_eq(tw_pool_new(loop.ctx, &p), 0);
	ck_assert_int_eq(tw_pool_set_limit(p, 1), 0);
	pool_get_data(p, "x", "OK");
	pool_get_data(p, "y-busy", "busy");
	pool_get_data(p, "z", "OK");
	pool_get_data(p, "w", "OK");
	tw_pool_free(p);
}
END_TEST

/* Suite. */

static TCase *peer_tcase(const char *name, void (*start)(void))
{
	TCase *tc = tcase_create(name);
	tcase_set_timeout(tc, 180);
	tcase_add_unchecked_fixture(tc, start, stop_peer);
	tcase_add_checked_fixture(tc, open_client, close_client);
	return tc;
}

static void add_common(TCase *tc)
{
	ts_add(tc, TS_TESTS(handshake_and_identity, echo_inline_bin));
	ts_add_loop(tc, 4, TS_TESTS(echo_oob));
	ts_add(tc, TS_TESTS(error_reply, unknown_op, pipelined, close_op));
}

static void add_codec(TCase *tc, int server)
{
	ts_add(tc, TS_TESTS(handshake_and_identity));
	ts_add_loop(tc, 2, TS_TESTS(codec_echo));
	if (server)
		tcase_add_loop_test(tc, codec_reply_oob, 0, 2);
}

/* The peers that negotiate a codec, in their TCases' order. */
static const struct {
	const char *name;
	void (*start)(void);
	int server; /* add_codec's server */
} codec_peers[] = {
	{"scheduler_zstd", start_scheduler_zstd, 0},
	{"scheduler_lz4", start_scheduler_lz4, 0},
	{"server_zstd", start_server_zstd, 1},
	{"server_lz4", start_server_lz4, 1},
};

static Suite *dask_suite(void)
{
	Suite *s = suite_create("dask");
	TCase *tc;
	tc = peer_tcase("scheduler", start_scheduler);
	add_common(tc);
	suite_add_tcase(s, tc);
	tc = peer_tcase("server", start_server);
	add_common(tc);
	ts_add_loop(tc, 4, TS_TESTS(reply_oob));
	ts_add(tc, TS_TESTS(pool_get_data_ack));
	suite_add_tcase(s, tc);
	for (size_t i = 0; i < sizeof(codec_peers) / sizeof(codec_peers[0]); i++) {
		tc = peer_tcase(codec_peers[i].name, codec_peers[i].start);
		add_codec(tc, codec_peers[i].server);
		suite_add_tcase(s, tc);
	}
	tc = tcase_create("python_client");
	tcase_set_timeout(tc, 180);
	ts_add(tc, TS_TESTS(python_client_plain, python_client_zstd, python_client_lz4));
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return ts_run(dask_suite(), TS_NO_SIGPIPE);
}
