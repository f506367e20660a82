/* SPDX-License-Identifier: BSD-3-Clause */
/* tw_server in-process, called through a tw_pool or a raw client comm on
 * loopback: built-in and custom ops, inline and out-of-band echo (20 MiB,
 * decoded on the offload pool), deferred replies, reply=false, error
 * replies, unknown ops, close, in-order replies on one comm, malformed
 * requests, and a server freed with a handler in flight. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <check.h>

#include "core/context.h"
#include "protocol/offload.h"
#include "tests/check_rpc.h"
#include "tests/support/rpc.h"
#include "tests/support/tls.h"
#include "tests/support/suite.h"

#define MiB ((size_t)1 << 20)

static const msgpack_object *field(const struct rc *rc, const char *key)
{
	return tw_msgpack_map_get(tw_decoded_root(rc->reply), key);
}

START_TEST(server_identity)
{
	struct rf f;
	struct rc rc;
	const msgpack_object *id;
	rf_init(&f);
	ck_assert_int_eq(rc_call(&f.h, f.pool, f.s.addr, rq_op("identity"), 0, &rc), 0);
	ck_assert(tw_msgpack_str_eq(field(&rc, "type"), "taskwire"));
	id = field(&rc, "id");
	ck_assert(id != NULL && id->type == MSGPACK_OBJECT_STR);
	ck_assert(id->via.str.size > 9 && memcmp(id->via.str.ptr, "taskwire-", 9) == 0);
	ck_assert_uint_eq(tw_decoded_root(rc.reply)->via.map.size, 2);
	rc_clear(&rc);
	rf_fini(&f);
}
END_TEST

START_TEST(server_echo_inline)
{
	static const uint8_t data[] = {'t', 'w', 0x00, 0xff, 0x80, 'x'};
	struct rf f;
	struct rc rc;
	tw_builder *b;
	const msgpack_object *o;
	rf_init(&f);
	b = rq_begin("echo", 1);
	rq_bin(b, "data", data, sizeof(data));
	ck_assert_int_eq(rc_call(&f.h, f.pool, f.s.addr, rq_end(b), 0, &rc), 0);
	o = tw_decoded_root(rc.reply);
	ck_assert_int_eq(o->type, MSGPACK_OBJECT_BIN);
	ck_assert_uint_eq(o->via.bin.size, sizeof(data));
	ck_assert_mem_eq(o->via.bin.ptr, data, sizeof(data));
	ck_assert_uint_eq(tw_decoded_npayloads(rc.reply), 0);
	rc_clear(&rc);
	ck_assert_int_eq(rc_call(&f.h, f.pool, f.s.addr, rq_echo_str("héllo"), 0, &rc), 0);
	rc_assert_str(&rc, "héllo");
	rc_clear(&rc);
	/* echo without data: nil */
	ck_assert_int_eq(rc_call(&f.h, f.pool, f.s.addr, rq_op("echo"), 0, &rc), 0);
	ck_assert_int_eq(tw_decoded_root(rc.reply)->type, MSGPACK_OBJECT_NIL);
	rc_clear(&rc);
	ck_assert_uint_eq(tw_pool_open_comms(f.pool, f.s.addr), 1);
	rf_fini(&f);
}
END_TEST

/* Large frames 0 packed in block drafts (grown by doubling past the
 * 256 KiB mapped-block size and past 4 MiB): inline bin data of 300 KiB
 * and 5 MiB + 3 echoed, every byte compared; every block is freed once
 * the replies are (blocks_live back to where it was). */
START_TEST(server_echo_inline_large)
{
	static const size_t sizes[] = {300 << 10, (5 << 20) + 3};
	struct rf f;
	uint64_t live0;
	rf_init(&f);
	live0 = ts_blocks_live();
	for (size_t i = 0; i < 2; i++) {
		uint8_t *data = malloc(sizes[i]);
		struct rc rc;
		tw_builder *b;
		const msgpack_object *o;
		ck_assert_ptr_nonnull(data);
		ts_fill(data, sizes[i], (unsigned)i + 5);
		b = rq_begin("echo", 1);
		rq_bin(b, "data", data, sizes[i]);
		ck_assert_int_eq(rc_call(&f.h, f.pool, f.s.addr, rq_end(b), 0, &rc), 0);
		o = tw_decoded_root(rc.reply);
		ck_assert_int_eq(o->type, MSGPACK_OBJECT_BIN);
		ck_assert_uint_eq(o->via.bin.size, sizes[i]);
		ck_assert_int_eq(memcmp(o->via.bin.ptr, data, sizes[i]), 0);
		rc_clear(&rc);
		free(data);
	}
	ck_assert_uint_eq(ts_blocks_live(), live0);
	rf_fini(&f);
}
END_TEST

/* Echo n out-of-band bytes (pattern, seed) and check what comes back. */
static void echo_oob_at(struct rf *f, const char *addr, size_t n, unsigned seed)
{
	tw_slice data = ts_pattern_slice(n, seed);
	tw_builder *b = rq_begin("echo", 1);
	const tw_payload *pl;
	struct rc rc;
	rq_bytes(b, "data", &data);
	tw_block_free(data.block);
	ck_assert_int_eq(rc_call(&f->h, f->pool, addr, rq_end(b), 0, &rc), 0);
	pl = tw_decoded_payload(rc.reply, tw_decoded_root(rc.reply));
	ck_assert_ptr_nonnull(pl);
	ck_assert_str_eq(pl->serializer, "dask");
	ck_assert_uint_eq(pl->nframes, 1);
	ck_assert_uint_eq(pl->frames[0].len, n);
	ck_assert_int_eq(ts_check(tw_slice_data(&pl->frames[0]), n, seed), -1);
	rc_clear(&rc);
}

static void echo_oob(struct rf *f, size_t n, unsigned seed)
{
	echo_oob_at(f, f->s.addr, n, seed);
}

START_TEST(server_echo_oob)
{
	struct rf f;
	size_t big = ts_quick() ? 3 * MiB : 20 * MiB;
	rf_init(&f);
	ck_assert_int_eq(tw_context_set_offload_threshold_bytes(f.h.ctx, 2 * MiB), 0);
	echo_oob(&f, 0, 1);
	echo_oob(&f, 1000, 2);
	ck_assert_int_eq(tw__offload_started(f.h.ctx), 0); /* small: decoded on the loop */
	echo_oob(&f, big, 3);
	ck_assert_int_eq(tw__offload_started(f.h.ctx), 1); /* large: on the offload pool */
	echo_oob(&f, 1000, 4);
	rf_fini(&f);
}
END_TEST

/* A handler that replies later (from a timer) while another comm's
 * request is answered first. */
START_TEST(server_deferred_reply)
{
	struct rf f;
	struct rc a, b;
	rf_init(&f);
	rc_start(f.pool, f.s.addr, rq_op("later"), 0, &a);
	ck_assert(tu_run_until(&f.h, rs_held_one, &f.s, TU_WAIT_MS));
	ck_assert_int_eq(rc_call(&f.h, f.pool, f.s.addr, rq_echo_str("b"), 0, &b), 0);
	rc_assert_str(&b, "b");
	ck_assert_int_eq(a.done, 0);
	ck_assert_uint_eq(tw_pool_open_comms(f.pool, f.s.addr), 2);
	rs_release(&f.s, 0);
	ck_assert(rc_wait(&f.h, &a, TU_WAIT_MS));
	rc_assert_str(&a, "later");
	ck_assert_int_eq(f.s.last_reply_rv, 0);
	ck_assert_uint_lt(b.seq, a.seq);
	rc_clear(&a);
	rc_clear(&b);
	rf_fini(&f);
}
END_TEST

static tw_msg *count_req(int reply)
{
	tw_builder *b = rq_begin("count", 1);
	rq_bool(b, "reply", reply);
	return rq_end(b);
}

static tw_msg *echo_no_reply(const char *s)
{
	tw_builder *b = rq_begin("echo", 2);
	rq_str(b, "data", s);
	rq_bool(b, "reply", 0);
	return rq_end(b);
}

/* reply=false: nothing comes back, and the comm serves the next request. */
START_TEST(server_reply_false)
{
	struct rf f;
	struct rw w;
	rf_init_rw(&f, &w);
	rw_send(&w, count_req(0));
	rw_send(&w, echo_no_reply("silent"));
	rw_send(&w, rq_echo_str("first"));
	rw_assert_str(&w, 0, "first");
	ck_assert_uint_eq(f.s.counted, 1);
	ck_assert_int_eq(f.s.count_wanted_reply, 0);
	ck_assert_int_eq(f.s.last_reply_rv, 0);
	rw_send(&w, count_req(1));
	rw_assert_str(&w, 1, "counted");
	ck_assert_int_eq(f.s.count_wanted_reply, 1);
	rw_send(&w, rq_echo_str("last"));
	rw_assert_str(&w, 2, "last");
	ck_assert_uint_eq(w.n, 3);
	ck_assert_int_eq(w.closed, 0);
	rw_free(&w);
	rf_fini(&f);
}
END_TEST

START_TEST(server_error_reply)
{
	struct rf f;
	struct rc rc;
	rf_init(&f);
	ck_assert_int_eq(rc_call(&f.h, f.pool, f.s.addr, rq_op("fail"), 0, &rc), TW_EREMOTE);
	ck_assert_ptr_nonnull(rc.reply);
	ck_assert(tw_msgpack_str_eq(field(&rc, "status"), "uncaught-error"));
	ck_assert(tw_msgpack_str_eq(field(&rc, "exception_text"), "fail: this op always fails"));
	ck_assert(tw_msgpack_str_eq(field(&rc, "exception"), "fail: this op always fails"));
	ck_assert(tw_msgpack_str_eq(field(&rc, "traceback_text"), "support/rpc.c op_fail"));
	rc_assert_why(&rc, "'s handler failed: fail: this op always fails");
	ck_assert_int_eq(field(&rc, "traceback")->type, MSGPACK_OBJECT_NIL);
	rc_clear(&rc);
	/* sum of something that is not bytes: the handler's own error */
	ck_assert_int_eq(rc_call(&f.h, f.pool, f.s.addr, rq_op("sum"), 0, &rc), TW_EREMOTE);
	ck_assert(tw_msgpack_str_eq(field(&rc, "exception_text"),
				    "sum: `data` must be bytes of float64 values"));
	ck_assert(tw_msgpack_str_eq(field(&rc, "traceback_text"), ""));
	rc_clear(&rc);
	/* an error after part of a reply was packed: the error replaces it */
	ck_assert_int_eq(rc_call(&f.h, f.pool, f.s.addr, rq_op("fail_late"), 0, &rc), TW_EREMOTE);
	ck_assert(tw_msgpack_str_eq(field(&rc, "exception_text"), "fail_late: gave up halfway"));
	rc_clear(&rc);
	/* the comm is still good */
	rf_serves_on(&f, "ok");
	rf_fini(&f);
}
END_TEST

/* Replies with `n` payloads: 2 frames each, plus the header. */
static void op_payloads(tw_request *r, void *arg)
{
	tw_slice one = ts_pattern_slice(16, 7);
	tw_builder *b = tw_request_reply_builder(r);
	int n = *(const int *)arg;
	msgpack_pack_array(tw_builder_packer(b), (size_t)n);
	for (int i = 0; i < n; i++)
		ck_assert_int_eq(tw_builder_pack_bytes(b, &one), 0);
	tw_block_free(one.block);
	*(int *)arg = tw_request_reply(r);
}

/* A reply the server's comm refuses (more frames than its limit) answers
 * the caller at once with an error saying so, not at the call's timeout;
 * the comm serves on. */
START_TEST(server_reply_refused)
{
	struct rf f;
	struct rc rc;
	int n = 20;
	rf_init(&f);
	ck_assert_int_eq(tw_context_set_max_frames(f.h.ctx, 16), 0);
	ck_assert_int_eq(tw_server_add_op(f.s.srv, "payloads", op_payloads, &n), 0);
	ck_assert_int_eq(rc_call(&f.h, f.pool, f.s.addr, rq_op("payloads"), 5000, &rc), TW_EREMOTE);
	ck_assert_int_eq(n, TW_ETOOBIG);
	ck_assert(tw_msgpack_str_eq(field(&rc, "status"), "uncaught-error"));
	ck_assert(tw_msgpack_str_eq(field(&rc, "exception_text"),
				    "reply not sent: message larger than the limit"));
	rc_clear(&rc);
	n = 3; /* 7 frames: sent */
	ck_assert_int_eq(rc_call(&f.h, f.pool, f.s.addr, rq_op("payloads"), 5000, &rc), 0);
	ck_assert_int_eq(n, 0);
	ck_assert_int_eq(tw_decoded_root(rc.reply)->via.array.size, 3);
	rc_clear(&rc);
	rf_fini(&f);
}
END_TEST

START_TEST(server_unknown_op)
{
	struct rf f;
	struct rc rc;
	rf_init(&f);
	ck_assert_int_eq(rc_call(&f.h, f.pool, f.s.addr, rq_op("no-such-op"), 0, &rc), 0);
	ck_assert_int_eq(tw_decoded_root(rc.reply)->type, MSGPACK_OBJECT_NIL);
	rc_clear(&rc);
	rf_serves_on(&f, "after");
	rf_fini(&f);
}
END_TEST

/* An op whose reply is its own number (arg). */
static void op_number(tw_request *r, void *arg)
{
	msgpack_pack_uint64(tw_builder_packer(tw_request_reply_builder(r)), (uintptr_t)arg);
	tw_request_reply(r);
}

/* The reply to op `name`: its number, or -1 for nil (no such op). */
static int64_t number_of(struct rf *f, const char *name)
{
	struct rc rc;
	const msgpack_object *o;
	int64_t v;
	ck_assert_int_eq(rc_call(&f->h, f->pool, f->s.addr, rq_op(name), 0, &rc), 0);
	o = tw_decoded_root(rc.reply);
	ck_assert(o->type == MSGPACK_OBJECT_NIL || o->type == MSGPACK_OBJECT_POSITIVE_INTEGER);
	v = o->type == MSGPACK_OBJECT_NIL ? -1 : (int64_t)o->via.u64;
	rc_clear(&rc);
	return v;
}

/* Two hundred ops added in a scrambled order (as many as a scheduler
 * has), names that share prefixes and lengths: each request finds its
 * own; adding a name again replaces its handler; near misses are unknown. */
START_TEST(server_many_ops)
{
	struct rf f;
	char name[16];
	rf_init(&f);
	for (unsigned i = 0; i < 200; i++) {
		unsigned k = i * 7919 % 200; /* 7919 is prime: a permutation */
		snprintf(name, sizeof(name), "o%u", k);
		ck_assert_int_eq(tw_server_add_op(f.s.srv, name, op_number, (void *)(uintptr_t)k),
				 0);
	}
	for (unsigned k = 0; k < 200; k += 13) {
		snprintf(name, sizeof(name), "o%u", k);
		ck_assert_int_eq(number_of(&f, name), k);
	}
	ck_assert_int_eq(number_of(&f, "o199"), 199);
	ck_assert_int_eq(number_of(&f, "o200"), -1);
	ck_assert_int_eq(number_of(&f, "o"), -1);
	ck_assert_int_eq(number_of(&f, "o01"), -1);
	ck_assert_int_eq(tw_server_add_op(f.s.srv, "o57", op_number, (void *)(uintptr_t)1000), 0);
	ck_assert_int_eq(number_of(&f, "o57"), 1000);
	ck_assert_int_eq(number_of(&f, "o56"), 56);
	ck_assert_int_eq(number_of(&f, "o58"), 58);
	rf_fini(&f);
}
END_TEST

static tw_msg *echo_close(const char *s)
{
	tw_builder *b = rq_begin("echo", 2);
	rq_str(b, "data", s);
	rq_bool(b, "close", 1);
	return rq_end(b);
}

static int no_comms(void *arg)
{
	struct rf *f = arg;
	return tw_pool_open_comms(f->pool, f->s.addr) == 0;
}

/* close:true and the built-in close: reply, then the server closes. */
START_TEST(server_close)
{
	struct rf f;
	struct rw w;
	struct rc rc;
	rf_init_rw(&f, &w);
	rw_send(&w, echo_close("bye"));
	rw_assert_str(&w, 0, "bye");
	ck_assert(tu_wait_flag(&f.h, &w.closed, TU_WAIT_MS));
	ck_assert_int_eq(w.close_err, 0);
	ck_assert_uint_eq(w.n, 1);
	rw_free(&w);
	ck_assert_int_eq(rw_open(&f.h, f.h.ctx, f.s.addr, &w), 0);
	rw_send(&w, rq_op("close"));
	rw_assert_str(&w, 0, "OK");
	ck_assert(tu_wait_flag(&f.h, &w.closed, TU_WAIT_MS));
	ck_assert_int_eq(w.close_err, 0);
	ck_assert_uint_eq(w.n, 1);
	rw_free(&w);
	/* through the pool: the closed comm leaves the pool */
	ck_assert_int_eq(rc_call(&f.h, f.pool, f.s.addr, rq_op("close"), 0, &rc), 0);
	rc_assert_str(&rc, "OK");
	rc_clear(&rc);
	ck_assert(tu_run_until(&f.h, no_comms, &f, TU_WAIT_MS));
	rc_echo_ok(&f.h, f.pool, f.s.addr, "again", 0);
	rf_fini(&f);
}
END_TEST

/* Three requests written at once on one comm: replies in request order,
 * although the first is the slowest. */
START_TEST(server_in_order)
{
	struct rf f;
	struct rw w;
	rf_init_rw(&f, &w);
	rw_send(&w, rq_slow(0.05));
	rw_send(&w, rq_echo_str("second"));
	rw_send(&w, rq_op("later"));
	rw_send(&w, rq_echo_str("fourth"));
	rw_assert_str(&w, 0, "done");
	rw_assert_str(&w, 1, "second");
	ck_assert(tu_run_until(&f.h, rs_held_one, &f.s, TU_WAIT_MS));
	tu_run_for(&f.h, 50); /* "fourth" must wait for "later" */
	ck_assert_uint_eq(w.n, 2);
	rs_release(&f.s, 0);
	rw_assert_str(&w, 2, "later");
	rw_assert_str(&w, 3, "fourth");
	ck_assert_int_eq(w.closed, 0);
	rw_free(&w);
	rf_fini(&f);
}
END_TEST

/* A malformed request drops its comm (the client sees the end, no reply);
 * other comms keep working. */
static void bad_request(struct rf *f, const void *frame0, size_t n)
{
	struct rw w;
	struct rc rc;
	ck_assert_int_eq(rw_open(&f->h, f->h.ctx, f->s.addr, &w), 0);
	rw_send(&w, rq_raw(frame0, n));
	ck_assert_msg(tu_wait_flag(&f->h, &w.closed, TU_WAIT_MS), "comm not dropped");
	ck_assert_msg(w.close_err == 0 || w.close_err == TW_EIO, "close: %s",
		      tw_strerror(w.close_err));
	ck_assert_uint_eq(w.n, 0);
	rw_free(&w);
	ck_assert_int_eq(rc_call(&f->h, f->pool, f->s.addr, rq_echo_str("alive"), 0, &rc), 0);
	rc_assert_str(&rc, "alive");
	rc_clear(&rc);
}

START_TEST(server_bad_requests)
{
	static const uint8_t array[] = {0x92, 0x01, 0x02};                    /* [1, 2] */
	static const uint8_t no_op[] = {0x81, 0xa1, 'x', 0x01};               /* {"x": 1} */
	static const uint8_t int_op[] = {0x81, 0xa2, 'o', 'p', 0x05};         /* {"op": 5} */
	static const uint8_t str[] = {0xa2, 'h', 'i'};                        /* "hi" */
	static const uint8_t garbage[] = {0xc1};                              /* never used */
	static const uint8_t truncated[] = {0x82, 0xa2, 'o', 'p', 0xa4, 'e'}; /* cut */
	struct rf f;
	struct rc rc;
	rf_init(&f);
	ck_assert_int_eq(rc_call(&f.h, f.pool, f.s.addr, rq_echo_str("before"), 0, &rc), 0);
	rc_clear(&rc);
	bad_request(&f, array, sizeof(array));
	bad_request(&f, no_op, sizeof(no_op));
	bad_request(&f, int_op, sizeof(int_op));
	bad_request(&f, str, sizeof(str));
	bad_request(&f, garbage, sizeof(garbage));
	bad_request(&f, truncated, sizeof(truncated));
	ck_assert_uint_eq(tw_pool_open_comms(f.pool, f.s.addr), 1);
	rf_fini(&f);
}
END_TEST

/* The server is freed with handlers in flight: the callers fail with
 * TW_ECLOSED or TW_EIO; the orphaned requests' late replies are dropped
 * (tw_request_reply returns TW_ECLOSED; ASan/valgrind see no leak). */
START_TEST(server_free_in_flight)
{
	struct rf f;
	struct rc a, b;
	rf_init(&f);
	rc_start(f.pool, f.s.addr, rq_op("later"), 0, &a);
	rc_start(f.pool, f.s.addr, rq_slow(0.2), 0, &b);
	ck_assert(tu_run_until(&f.h, rs_held_one, &f.s, TU_WAIT_MS));
	ck_assert(tu_wait_count(&f.h, &f.s.slow_now, 1, TU_WAIT_MS));
	tw_server_free(f.s.srv);
	f.s.srv = NULL;
	ck_assert(rc_wait(&f.h, &a, TU_WAIT_MS));
	ck_assert(rc_wait(&f.h, &b, TU_WAIT_MS));
	ck_assert_msg(a.err == TW_ECLOSED || a.err == TW_EIO, "%s", tw_strerror(a.err));
	ck_assert_msg(b.err == TW_ECLOSED || b.err == TW_EIO, "%s", tw_strerror(b.err));
	rc_assert_why(&a, "ended before the reply: ");
	rc_assert_why(&b, "ended before the reply: ");
	ck_assert_uint_eq(tw_pool_open_comms(f.pool, f.s.addr), 0);
	/* the slow handler's timer fires and replies to its orphan */
	f.s.last_reply_rv = 1;
	ck_assert(tu_run_until(&f.h, rs_no_slow, &f.s, TU_WAIT_MS));
	ck_assert_int_eq(f.s.last_reply_rv, TW_ECLOSED);
	rf_fini(&f); /* replies to the held one: TW_ECLOSED */
}
END_TEST

static void my_identity(tw_request *r, void *arg)
{
	msgpack_pack_str(tw_builder_packer(tw_request_reply_builder(r)), 4);
	msgpack_pack_str_body(tw_builder_packer(tw_request_reply_builder(r)), arg, 4);
	tw_request_reply(r);
}

/* One server on tcp, ws and tls at once (mutual TLS on the context, which
 * also connects); a replaced built-in op. */
START_TEST(server_transports)
{
	const char *uris[] = {"tcp://127.0.0.1:0", "ws://127.0.0.1:0", "tls://127.0.0.1:0"};
	struct rf f;
	char addr[128];
	tu_init(&f.h);
	tt_use_tls(f.h.ctx, "ca.pem", "cert.pem", "key.pem");
	rs_start(&f.s, f.h.ctx, f.h.base, uris[0]);
	ck_assert_int_eq(tw_server_listen(f.s.srv, uris[1]), 0);
	ck_assert_int_eq(tw_server_listen(f.s.srv, uris[2]), 0);
	ck_assert_int_eq(tw_server_address(f.s.srv, 3, addr, sizeof(addr)), TW_ERANGE);
	ck_assert_int_eq(tw_server_address(f.s.srv, 1, addr, 8), TW_ERANGE);
	ck_assert_int_eq(tw_pool_new(f.h.ctx, &f.pool), 0);
	for (size_t i = 0; i < 3; i++) {
		ck_assert_int_eq(tw_server_address(f.s.srv, i, addr, sizeof(addr)), 0);
		ck_assert_int_eq(strncmp(addr, uris[i], 6), 0);
		echo_oob_at(&f, addr, 3 * MiB, (unsigned)i);
	}
	ck_assert_int_eq(tw_server_add_op(f.s.srv, "identity", my_identity, "mine"), 0);
	for (size_t i = 0; i < 3; i++) {
		struct rc rc;
		ck_assert_int_eq(tw_server_address(f.s.srv, i, addr, sizeof(addr)), 0);
		ck_assert_int_eq(rc_call(&f.h, f.pool, addr, rq_op("identity"), 0, &rc), 0);
		rc_assert_str(&rc, "mine");
		rc_clear(&rc);
	}
	ck_assert_int_eq(tw_server_add_op(f.s.srv, NULL, my_identity, NULL), TW_EINVAL);
	ck_assert_int_eq(tw_server_add_op(f.s.srv, "x", NULL, NULL), TW_EINVAL);
	rf_fini(&f);
}
END_TEST

/* Replies the write queue refuses (above the high-water mark) wait for
 * the drain, in order; with close:true, the comm closes after the
 * waiting reply went out, not before. */
START_TEST(server_reply_backpressure)
{
	struct rf f;
	struct rw w;
	tw_context *sctx;
	size_t n = ts_quick() ? 2 * MiB : 8 * MiB;
	tu_init(&f.h);
	ck_assert_int_eq(tw_context_new(f.h.base, &sctx), 0);
	ck_assert_int_eq(tw_context_set_write_hwm_bytes(sctx, 1), 0);
	rs_start(&f.s, sctx, f.h.base, "tcp://127.0.0.1:0");
	ck_assert_int_eq(tw_pool_new(f.h.ctx, &f.pool), 0);
	ck_assert_int_eq(rw_open(&f.h, f.h.ctx, f.s.addr, &w), 0);
	for (unsigned i = 0; i < 3; i++)
		rw_send(&w, rq_echo_pattern(n, i));
	rw_send(&w, echo_close("closing"));
	for (unsigned i = 0; i < 3; i++) {
		const tw_decoded *d = rw_msg(&w, i);
		ck_assert_msg(d != NULL, "reply %u missing", i);
		ru_assert_pattern(d, n, i);
	}
	ck_assert_msg(rw_msg(&w, 3) != NULL, "the reply to close:true was lost");
	rw_assert_str(&w, 3, "closing");
	ck_assert(tu_wait_flag(&f.h, &w.closed, TU_WAIT_MS));
	ck_assert_int_eq(w.close_err, 0);
	rw_free(&w);
	tw_pool_free(f.pool);
	rs_stop(&f.s);
	tw_context_free(sctx);
	tu_fini(&f.h);
}
END_TEST

/* A relay frame kept from one request, to be written on another comm. */
static tw_slice stashed;

/* `stash(data)`: keep data's frame, reply nil. With relay on over tcp,
 * data (1 MiB, out of band) is a relay frame: its bytes stay in the
 * sender's socket until a comm writes it (include/taskwire/relay.h). */
static void op_stash(tw_request *r, void *arg)
{
	const tw_payload *p = tw_decoded_payload(tw_request_decoded(r), tw_request_arg(r, "data"));
	(void)arg;
	ck_assert(p != NULL && p->nframes == 1);
	stashed = p->frames[0];
	tw_block_hold(stashed.block);
	tw_request_reply(r);
}

/* `twice`: reply with the stashed frame twice. A relay frame may be
 * written once: the comm refuses this reply with TW_EINVAL, but only
 * when it gets to it, not while the reply waits for the drain. */
static void op_twice(tw_request *r, void *arg)
{
	tw_builder *b = tw_request_reply_builder(r);
	(*(size_t *)arg)++;
	/* the reply before it is still queued: this one is parked */
	ck_assert_uint_gt(tw_comm_queued_bytes(tw_request_comm(r)), 0);
	msgpack_pack_array(tw_builder_packer(b), 2);
	ck_assert_int_eq(tw_builder_pack_bytes(b, &stashed), 0);
	ck_assert_int_eq(tw_builder_pack_bytes(b, &stashed), 0);
	tw_request_reply(r);
}

static int stashed_set(void *arg)
{
	(void)arg;
	return stashed.block != NULL;
}

/* A reply parked for the drain (its comm's queue above the high-water
 * mark) that the comm then refuses for another reason: the caller gets
 * the uncaught-error reply "reply not sent: ...", as for a reply refused
 * at once, and the comm serves on. Before, the reply stayed parked and
 * the comm paused for ever. */
START_TEST(server_parked_reply_refused)
{
	struct rf f;
	struct rw w, src;
	tw_context *sctx;
	tw_builder *b;
	tw_slice data = ts_pattern_slice(MiB, 7);
	const tw_decoded *d;
	size_t served = 0, big = 32 * MiB;
	uint8_t *bytes = malloc(big);
	ck_assert_ptr_nonnull(bytes);
	ts_fill(bytes, big, 3);
	tu_init(&f.h);
	ck_assert_int_eq(tw_context_new(f.h.base, &sctx), 0);
	ck_assert_int_eq(tw_context_set_write_hwm_bytes(sctx, 1), 0);
	ck_assert_int_eq(tw_context_set_relay_bytes(sctx, 64 << 10), 0);
	rs_start(&f.s, sctx, f.h.base, "tcp://127.0.0.1:0");
	ck_assert_int_eq(tw_server_add_op(f.s.srv, "stash", op_stash, NULL), 0);
	ck_assert_int_eq(tw_server_add_op(f.s.srv, "twice", op_twice, &served), 0);
	/* a relay frame from another comm (src) */
	ck_assert_int_eq(rw_open(&f.h, f.h.ctx, f.s.addr, &src), 0);
	b = rq_begin("stash", 1);
	rq_bytes(b, "data", &data);
	tw_block_free(data.block);
	rw_send(&src, rq_end(b));
	ck_assert(tu_run_until(&f.h, stashed_set, NULL, TU_WAIT_MS));
	/* w reads nothing until `twice` was served: the reply before it (32
	 * MiB inline, in frame 0, which is never relayed) fills the sockets
	 * and keeps bytes queued, so the reply to `twice` is parked */
	ck_assert_int_eq(rw_open(&f.h, f.h.ctx, f.s.addr, &w), 0);
	tw_comm_pause(w.comm);
	b = rq_begin("echo", 1);
	rq_bin(b, "data", bytes, big);
	rw_send(&w, rq_end(b));
	rw_send(&w, rq_op("twice"));
	ck_assert(tu_wait_count(&f.h, &served, 1, TU_WAIT_MS));
	tw_comm_resume(w.comm);
	ck_assert_ptr_nonnull(d = rw_msg(&w, 0));
	ck_assert_int_eq(tw_decoded_root(d)->type, MSGPACK_OBJECT_BIN);
	ck_assert_uint_eq(tw_decoded_root(d)->via.bin.size, big);
	ck_assert_int_eq(memcmp(tw_decoded_root(d)->via.bin.ptr, bytes, big), 0);
	d = rw_msg(&w, 1);
	ck_assert_msg(d != NULL, "the parked reply never came");
	ck_assert(tw_msgpack_str_eq(tw_msgpack_map_get(tw_decoded_root(d), "status"),
				    "uncaught-error"));
	ck_assert(tw_msgpack_str_eq(tw_msgpack_map_get(tw_decoded_root(d), "exception_text"),
				    "reply not sent: invalid argument"));
	rw_send(&w, rq_echo_str("after"));
	rw_assert_str(&w, 2, "after");
	/* the relay frame goes (drained), and src's reply with it */
	tw_block_free(stashed.block);
	stashed = (tw_slice){NULL, 0, 0};
	ck_assert_int_eq(tw_decoded_root(rw_msg(&src, 0))->type, MSGPACK_OBJECT_NIL);
	rw_free(&w);
	rw_free(&src);
	free(bytes);
	rs_stop(&f.s);
	tw_context_free(sctx);
	tu_fini(&f.h);
}
END_TEST

/* With relay on, a payload of at least the relay size stays in the
 * caller's socket; echoing it writes it back to its own source, whose
 * writes wait until it is consumed: refused (TW_EINVAL), so the caller
 * gets "reply not sent: invalid argument" at once, and the comm serves
 * on. Before, neither that reply nor any other came. */
START_TEST(server_echo_relayed_payload)
{
	struct rf f;
	struct rw w;
	tw_context *sctx;
	tw_builder *b;
	tw_slice data = ts_pattern_slice(MiB, 9);
	const tw_decoded *d;
	tu_init(&f.h);
	ck_assert_int_eq(tw_context_new(f.h.base, &sctx), 0);
	ck_assert_int_eq(tw_context_set_relay_bytes(sctx, 64 << 10), 0);
	rs_start(&f.s, sctx, f.h.base, "tcp://127.0.0.1:0");
	ck_assert_int_eq(rw_open(&f.h, f.h.ctx, f.s.addr, &w), 0);
	rw_send(&w, rq_echo_str("before"));
	b = rq_begin("echo", 1);
	rq_bytes(b, "data", &data);
	tw_block_free(data.block);
	rw_send(&w, rq_end(b));
	rw_send(&w, rq_echo_str("after"));
	rw_assert_str(&w, 0, "before");
	d = rw_msg(&w, 1);
	ck_assert_msg(d != NULL, "no reply to the relayed echo");
	ck_assert(tw_msgpack_str_eq(tw_msgpack_map_get(tw_decoded_root(d), "exception_text"),
				    "reply not sent: invalid argument"));
	rw_assert_str(&w, 2, "after");
	rw_free(&w);
	rs_stop(&f.s);
	tw_context_free(sctx);
	tu_fini(&f.h);
}
END_TEST

TCase *rpc_server_tcase(void)
{
	return ts_tcase("server", 60,
			TS_TESTS(server_identity, server_echo_inline, server_echo_inline_large,
				 server_echo_oob, server_deferred_reply, server_reply_false,
				 server_error_reply, server_reply_refused, server_unknown_op,
				 server_many_ops, server_close, server_in_order,
				 server_bad_requests, server_free_in_flight,
				 server_reply_backpressure, server_parked_reply_refused,
				 server_echo_relayed_payload, server_transports));
}
