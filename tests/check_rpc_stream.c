/* SPDX-License-Identifier: BSD-3-Clause */
/* Streams: connection_stream to a tw_server with the stream op "item"
 * (tests/support/rpc.c checks each map's fields), batches of 1 and of 1,000
 * maps from tw_batched_send, maps after close-stream not dispatched,
 * tw_batched_free flushing what is queued, single maps and bad stream
 * messages. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <check.h>

#include "tests/check_rpc.h"
#include "tests/support/rpc.h"
#include "tests/support/suite.h"
#include "transport/comm_impl.h"

static tw_msg *stream_start(void)
{
	tw_builder *b = rq_begin("connection_stream", 1);
	rq_bool(b, "reply", 0);
	return rq_end(b);
}

/* A raw comm turned into a stream, with a batched sender on it. */
static void open_stream(struct rf *f, struct rw *w, uint32_t interval_ms, tw_batched **b)
{
	ck_assert_int_eq(rw_open(&f->h, f->h.ctx, f->s.addr, w), 0);
	rw_send(w, stream_start());
	ck_assert_int_eq(tw_batched_new(w->comm, interval_ms, b), 0);
}

static uint64_t sent(const struct rw *w)
{
	tw_stats st;
	tw_comm_stats(w->comm, &st, sizeof(st));
	return st.msgs_sent;
}

START_TEST(stream_batches)
{
	static const uint8_t close_stream[] = {0x81, 0xa2, 'o', 'p', 0xac, 'c', 'l', 'o', 's',
					       'e',  '-',  's', 't', 'r',  'e', 'a', 'm'};
	struct rf f;
	struct rw w;
	tw_batched *b;
	uint64_t before;
	rf_init(&f);
	open_stream(&f, &w, 0, &b);
	ru_send_item(b, "item", 0);
	ck_assert(tu_wait_count(&f.h, &f.s.items, 1, TU_WAIT_MS));
	ck_assert_uint_eq(f.s.item_msgs, 1);
	ck_assert_uint_eq(f.s.last_batch, 1);
	before = sent(&w);
	for (int64_t i = 1; i <= 1000; i++)
		ru_send_item(b, "item", i);
	ck_assert(tu_wait_count(&f.h, &f.s.items, 1001, TU_WAIT_MS));
	ck_assert_uint_eq(f.s.item_msgs, 2);
	ck_assert_uint_eq(f.s.last_batch, 1000);
	ck_assert_uint_eq(sent(&w) - before, 1);
	ck_assert_uint_eq(f.s.item_errors, 0);
	/* unknown ops are skipped; maps after close-stream are not run */
	ru_send_item(b, "item", 1001);
	ru_send_item(b, "no-such-stream-op", 5);
	ck_assert_int_eq(tw_batched_send(b, close_stream, sizeof(close_stream)), 0);
	ru_send_item(b, "item", 1002);
	ck_assert(tu_wait_flag(&f.h, &w.closed, TU_WAIT_MS));
	ck_assert_int_eq(w.close_err, 0);
	ck_assert_uint_eq(f.s.items, 1002);
	ck_assert_uint_eq(f.s.item_errors, 0);
	ck_assert_uint_eq(f.s.last_batch, 4);
	ck_assert_uint_eq(w.n, 0); /* no replies on a stream */
	ck_assert_int_eq(tw_batched_send(b, close_stream, sizeof(close_stream)), TW_ECLOSED);
	tw_batched_free(b);
	rw_free(&w);
	rf_fini(&f);
}
END_TEST

/* tw_batched_free before the interval ends: what is queued goes out. */
START_TEST(stream_free_flushes)
{
	struct rf f;
	struct rw w;
	tw_batched *b;
	rf_init(&f);
	open_stream(&f, &w, 60000, &b);
	for (int64_t i = 0; i < 5; i++)
		ru_send_item(b, "item", i);
	tu_run_for(&f.h, 50);
	ck_assert_uint_eq(f.s.items, 0); /* the interval is a minute */
	tw_batched_free(b);
	ck_assert(tu_wait_count(&f.h, &f.s.items, 5, TU_WAIT_MS));
	ck_assert_uint_eq(f.s.item_msgs, 1);
	ck_assert_uint_eq(f.s.last_batch, 5);
	ck_assert_uint_eq(f.s.item_errors, 0);
	/* an explicit flush, then an empty one */
	ck_assert_int_eq(tw_batched_new(w.comm, 60000, &b), 0);
	ru_send_item(b, "item", 5);
	ck_assert_int_eq(tw_batched_flush(b), 0);
	ck_assert_int_eq(tw_batched_flush(b), 0);
	ck_assert(tu_wait_count(&f.h, &f.s.items, 6, TU_WAIT_MS));
	ck_assert_uint_eq(f.s.item_msgs, 2);
	ck_assert_int_eq(tw_batched_send(b, "\xc1", 1), TW_EINVAL);
	ck_assert_int_eq(tw_batched_send(b, "\x81\xa1", 2), TW_EINVAL);
	tw_batched_free(b);
	ck_assert_int_eq(w.closed, 0);
	rw_free(&w);
	rf_fini(&f);
}
END_TEST

/* A comm being closed takes no more maps: the send says so, rather than
 * take a map that no flush could write. The maps queued before the close
 * go out first, as tw_batched_free would send them. */
START_TEST(stream_send_after_close)
{
	static const uint8_t map[] = {0x81, 0xa2, 'o', 'p', 0xa4, 'i', 't', 'e', 'm'};
	struct rf f;
	struct rw w;
	tw_batched *b;
	rf_init(&f);
	open_stream(&f, &w, 60000, &b);
	ru_send_item(b, "item", 0);
	tw_comm_close(w.comm);
	ck_assert_int_eq(tw_batched_send(b, map, sizeof(map)), TW_ECLOSED);
	ck_assert(tu_wait_flag(&f.h, &w.closed, TU_WAIT_MS));
	tw_batched_free(b);
	ck_assert_int_eq(w.close_err, 0);
	ck_assert(tu_wait_count(&f.h, &f.s.items, 1, TU_WAIT_MS));
	ck_assert_uint_eq(f.s.item_errors, 0);
	ck_assert_uint_eq(f.s.last_batch, 1);
	rw_free(&w);
	rf_fini(&f);
}
END_TEST

/* The peer half-closes (FIN) while our write queue still holds bytes:
 * the comm takes no more writes but sends what it owes, and a batched
 * sender's queued maps go out with it; later sends return TW_ECLOSED. */
START_TEST(stream_peer_half_closes)
{
	static const uint8_t marked[] = {0x81, 0xa2, 'o', 'p', 0xa9, 'l', 'a',
					 's',  't',  '-', 'm', 'a',  'p', '!'};
	struct tu h;
	struct tu_peer *cli;
	char uri[64];
	int lfd = ts_raw_listen("tcp", 1, 0, uri, sizeof(uri)), fd;
	size_t big = (size_t)8 << 20, got = 0, cap = big + 4096;
	uint8_t *in = malloc(cap);
	tw_batched *b;
	ssize_t n;
	tu_init(&h);
	ck_assert_int_eq(tu_connect(&h, uri, &cli), 0);
	ck_assert_int_ge(fd = accept(lfd, NULL, NULL), 0);
	/* more than the sockets hold: the write queue stays non-empty */
	ck_assert_int_eq(tw_comm_write(cli->comm, ts_msg_pattern(&big, 1, 3)), 0);
	ck_assert_int_eq(tw_batched_new(cli->comm, 60000, &b), 0);
	ck_assert_int_eq(tw_batched_send(b, marked, sizeof(marked)), 0);
	tu_run_for(&h, 50);
	ck_assert_uint_gt(tw_comm_queued_bytes(cli->comm), 0);
	shutdown(fd, SHUT_WR);
	ck_assert(tu_wait_flag(&h, &cli->comm->closing, TU_WAIT_MS)); /* it saw the FIN */
	ck_assert_int_eq(tw_batched_send(b, marked, sizeof(marked)), TW_ECLOSED);
	/* everything owed arrives, the batch last; then our FIN */
	for (;;) {
		tu_run_for(&h, 1);
		n = recv(fd, in + got, cap - got, MSG_DONTWAIT);
		if (n == 0)
			break;
		if (n > 0)
			got += (size_t)n;
		ck_assert_uint_lt(got, cap);
	}
	ck_assert_uint_gt(got, big);
	ck_assert_ptr_nonnull(memmem(in + big, got - big, marked, sizeof(marked)));
	tw_batched_free(b);
	close(fd);
	close(lfd);
	free(in);
	tu_fini(&h);
}
END_TEST

/* tw_batched_free while the comm's write queue is above its high-water
 * mark: the queued maps still go out (nothing dropped silently), though a
 * new one is told to wait (TW_EAGAIN). */
START_TEST(stream_free_above_hwm)
{
	struct rf f;
	struct rw w;
	tw_batched *b;
	tw_builder *pad;
	size_t n = 8u << 20;
	uint8_t *zeros = calloc(1, n);
	int rv;
	rf_init(&f);
	ck_assert_int_eq(tw_context_set_write_hwm_bytes(f.h.ctx, 1 << 20), 0);
	open_stream(&f, &w, 60000, &b);
	for (int64_t i = 0; i < 3; i++) /* queued in the batch, under the mark */
		ru_send_item(b, "item", i);
	pad = rq_begin("pad", 1); /* an op with no stream handler: skipped */
	rq_bin(pad, "data", zeros, n);
	free(zeros);
	tw_msg *m = rq_end(pad);
	while ((rv = tw_comm_write(w.comm, m)) == TW_EAGAIN)
		tu_run_for(&f.h, 5);
	ck_assert_int_eq(rv, 0);
	ck_assert_uint_gt(tw_comm_queued_bytes(w.comm), 1 << 20);
	/* now above it: a further map is told to wait */
	{
		static const uint8_t map[] = {0x81, 0xa2, 'o', 'p', 0xa4, 'i', 't', 'e', 'm'};
		ck_assert_int_eq(tw_batched_send(b, map, sizeof(map)), TW_EAGAIN);
	}
	tw_batched_free(b);
	ck_assert(tu_wait_count(&f.h, &f.s.items, 3, TU_WAIT_MS));
	ck_assert_uint_eq(f.s.item_errors, 0);
	ck_assert_int_eq(w.closed, 0);
	rw_free(&w);
	rf_fini(&f);
}
END_TEST

/* A single map (not in an array) is a stream message too; one that is
 * neither a map nor an array of maps drops the comm. */
START_TEST(stream_single_map_and_bad)
{
	static const uint8_t item0[] = {0x83, 0xa2, 'o',  'p', 0xa4, 'i', 't', 'e',  'm', 0xa1,
					'i',  0x00, 0xa4, 'n', 'a',  'm', 'e', 0xa2, 'm', '0'};
	static const uint8_t no_op[] = {0x81, 0xa1, 'x', 0x01};
	static const uint8_t number[] = {0x07};
	struct rf f;
	struct rw w;
	rf_init_rw(&f, &w);
	rw_send(&w, stream_start());
	rw_send(&w, rq_raw(no_op, sizeof(no_op)));
	rw_send(&w, rq_raw(item0, sizeof(item0)));
	ck_assert(tu_wait_count(&f.h, &f.s.items, 1, TU_WAIT_MS));
	ck_assert_uint_eq(f.s.last_batch, 1);
	ck_assert_uint_eq(f.s.item_errors, 0);
	rw_send(&w, rq_raw(number, sizeof(number)));
	ck_assert(tu_wait_flag(&f.h, &w.closed, TU_WAIT_MS));
	ck_assert_uint_eq(w.n, 0);
	ck_assert_uint_eq(f.s.items, 1);
	rw_free(&w);
	rf_fini(&f);
}
END_TEST

/* The server's side of a stream answers over its own comm (as Dask's
 * scheduler does to workers): a batched sender on it is told to wait at
 * the high-water mark, and its drain callback, not the comm's (which is
 * the server's), says when to send again. */
struct flood {
	tw_batched *b;
	size_t sent, refused, drained;
	int rv_in_drain;
	uint32_t interval_ms;
};

static uint8_t flood_map[8 + (64 << 10)]; /* {"x": bin of 64 KiB} */

static int flood_send(struct flood *fl)
{
	int rv = tw_batched_send(fl->b, flood_map, sizeof(flood_map));
	fl->sent += rv == 0;
	return rv;
}

static void flood_drain(tw_batched *b, void *arg)
{
	struct flood *fl = arg;
	ck_assert_ptr_eq(b, fl->b);
	fl->drained++;
	fl->rv_in_drain = flood_send(fl);
}

static void flood_op(tw_comm *c, const tw_decoded *d, const msgpack_object *m, void *arg)
{
	struct flood *fl = arg;
	int rv;
	(void)d, (void)m;
	ck_assert_int_eq(tw_batched_new(c, fl->interval_ms, &fl->b), 0);
	tw_batched_set_drain_cb(fl->b, flood_drain, fl);
	while ((rv = flood_send(fl)) == 0 && fl->sent < 1000)
		;
	ck_assert_int_eq(rv, TW_EAGAIN);
	fl->refused++;
}

static size_t maps_received(const struct rw *w)
{
	size_t n = 0;
	for (size_t i = 0; i < w->n; i++)
		n += tw_decoded_root(w->msgs[i])->via.array.size;
	return n;
}

/* A server with stream op "flood" (a 1 MiB write high-water mark) and a
 * client stream that asks for the flood. */
static void flood_start(struct rf *f, struct rw *w, struct flood *fl)
{
	static const uint8_t flood[] = {0x81, 0xa2, 'o', 'p', 0xa5, 'f', 'l', 'o', 'o', 'd'};
	flood_map[0] = 0x81;
	flood_map[1] = 0xa1;
	flood_map[2] = 'x';
	flood_map[3] = 0xc6; /* bin 32, big-endian length 0x00010000 */
	flood_map[5] = 0x01;
	rf_init(f);
	ck_assert_int_eq(tw_context_set_write_hwm_bytes(f->h.ctx, 1 << 20), 0);
	ck_assert_int_eq(tw_server_add_stream_op(f->s.srv, "flood", flood_op, fl), 0);
	ck_assert_int_eq(rw_open(&f->h, f->h.ctx, f->s.addr, w), 0);
	rw_send(w, stream_start());
	rw_send(w, rq_raw(flood, sizeof(flood)));
}

START_TEST(stream_server_side_drain)
{
	struct flood fl = {.interval_ms = 1};
	struct rf f;
	struct rw w;
	flood_start(&f, &w, &fl);
	ck_assert(tu_wait_count(&f.h, &fl.drained, 1, TU_WAIT_MS));
	ck_assert_uint_eq(fl.refused, 1);
	ck_assert_uint_lt(fl.sent, 1000); /* told to wait near 1 MiB, not at 64 MiB */
	ck_assert_int_eq(fl.rv_in_drain, 0);
	while (maps_received(&w) < fl.sent && w.n < RW_MAX_MSGS && !w.closed)
		rw_msg(&w, w.n);
	ck_assert_uint_eq(maps_received(&w), fl.sent);
	ck_assert_uint_eq(fl.drained, 1); /* once per refusal */
	tw_batched_free(fl.b);
	ck_assert_int_eq(w.closed, 0);
	rw_free(&w);
	rf_fini(&f);
}
END_TEST

/* The server frees its stream comm when the peer goes: a sender waiting
 * to send on it is told (its drain callback, sends say TW_ECLOSED) and
 * outlives it (it read the freed comm at its next interval). */
START_TEST(stream_sender_outlives_comm)
{
	struct flood fl = {.interval_ms = 60000}; /* no interval passes */
	struct rf f;
	struct rw w;
	flood_start(&f, &w, &fl);
	ck_assert(tu_wait_count(&f.h, &fl.refused, 1, TU_WAIT_MS));
	rw_free(&w); /* the peer goes; the server frees its comm */
	ck_assert(tu_wait_count(&f.h, &fl.drained, 1, TU_WAIT_MS));
	ck_assert_int_eq(fl.rv_in_drain, TW_ECLOSED);
	ck_assert_int_eq(tw_batched_flush(fl.b), TW_ECLOSED);
	tu_run_for(&f.h, 20);
	ck_assert_uint_eq(fl.drained, 1);
	tw_batched_free(fl.b);
	rf_fini(&f);
}
END_TEST

TCase *rpc_stream_tcase(void)
{
	return ts_tcase("stream", 60,
			TS_TESTS(stream_batches, stream_free_flushes, stream_send_after_close,
				 stream_peer_half_closes, stream_free_above_hwm,
				 stream_single_map_and_bad, stream_server_side_drain,
				 stream_sender_outlives_comm));
}
