/* SPDX-License-Identifier: BSD-3-Clause */
/* Echo over ws:// and wss:// (each test is a loop test: _i = 0 ws, 1 wss,
 * mutual TLS with the test certificates): the message shapes, the bytes
 * on the wire (count message, one WebSocket message per frame, fragments
 * of at most the shard size, minimal length forms, masking only from the
 * client), zero-copy receive of a server's referenced frames, and orderly
 * close. */
#include <malloc.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include <check.h>

#include "tests/check_ws.h"
#include "tests/support/ws.h"

#define MiB ((size_t)1 << 20)

/* Wire bytes of one WebSocket frame header (RFC 6455 section 5.2). */
static uint64_t hdr(uint64_t len, int masked)
{
	return (len <= 125 ? 2 : len <= 0xffff ? 4 : 10) + (masked ? 4 : 0);
}

/* Wire bytes of one taskwire message: the count, then each frame as one
 * WebSocket message in fragments of at most shard bytes. */
static uint64_t wire_bytes(const size_t *lens, size_t nf, size_t shard, int masked)
{
	uint64_t n = hdr(8, masked) + 8;
	for (size_t i = 0; i < nf; i++) {
		size_t left = lens[i];
		if (left == 0)
			n += hdr(0, masked);
		while (left > 0) {
			size_t k = left < shard ? left : shard;
			n += hdr(k, masked) + k;
			left -= k;
		}
	}
	return n;
}

static tw_stats comm_stats(tw_comm *c)
{
	tw_stats st;
	tw_comm_stats(c, &st, sizeof(st));
	return st;
}

/* Echo one pattern message and check the bytes each side put on the wire. */
static void echo_wire(struct tu_peer *cli, struct tu_peer *srv, const size_t *lens, size_t nf,
		      unsigned seed, size_t shard)
{
	tw_stats c0 = comm_stats(cli->comm), s0 = comm_stats(srv->comm), c1, s1;
	tu_echo_check(cli, lens, nf, seed, WU_WAIT_MS);
	c1 = comm_stats(cli->comm);
	s1 = comm_stats(srv->comm);
	ck_assert_uint_eq(c1.bytes_sent - c0.bytes_sent, wire_bytes(lens, nf, shard, 1));
	ck_assert_uint_eq(s1.bytes_received - s0.bytes_received, wire_bytes(lens, nf, shard, 1));
	ck_assert_uint_eq(s1.bytes_sent - s0.bytes_sent, wire_bytes(lens, nf, shard, 0));
	ck_assert_uint_eq(c1.bytes_received - c0.bytes_received, wire_bytes(lens, nf, shard, 0));
	ck_assert_uint_eq(c1.msgs_received - c0.msgs_received, 1);
}

START_TEST(echo_empty_and_one_byte)
{
	struct tu h;
	struct tu_peer *cli = wu_setup_echo(&h, wu_scheme(_i)), *srv = tu_server_peer(&h, 0);
	size_t empty[] = {0}, one[] = {1}, empties[] = {0, 0, 0};
	echo_wire(cli, srv, empty, 1, 0, TW_DEFAULT_WS_SHARD_BYTES);
	ck_assert_uint_eq(tw_msg_nframes(cli->msgs[0]), 1);
	ck_assert_uint_eq(tw_msg_frame(cli->msgs[0], 0)->len, 0);
	echo_wire(cli, srv, one, 1, 5, TW_DEFAULT_WS_SHARD_BYTES);
	ck_assert_uint_eq(tw_slice_data(tw_msg_frame(cli->msgs[1], 0))[0], ts_pattern_byte(0, 5));
	echo_wire(cli, srv, empties, 3, 9, TW_DEFAULT_WS_SHARD_BYTES);
	ck_assert_uint_eq(tw_msg_nframes(cli->msgs[2]), 3);
	ck_assert_uint_eq(srv->nmsgs, 3);
	ck_assert_int_eq(cli->closed + srv->closed, 0);
	tt_fini(&h);
}
END_TEST

static size_t varied(size_t i)
{
	static const size_t edge[] = {0, 1, 125, 126, 127, 65535, 65536, 65537, 300000, 7};
	if (i % 10 == 9)
		return edge[(i / 10) % 10];
	return (i * 7919) % 3000;
}

START_TEST(echo_1000_frames_one_message)
{
	struct tu h;
	struct tu_peer *cli = wu_setup_echo(&h, wu_scheme(_i)), *srv = tu_server_peer(&h, 0);
	static size_t lens[1000];
	for (size_t i = 0; i < 1000; i++)
		lens[i] = varied(i);
	echo_wire(cli, srv, lens, 1000, 11, TW_DEFAULT_WS_SHARD_BYTES);
	ck_assert_uint_eq(tw_msg_nframes(cli->msgs[0]), 1000);
	tt_fini(&h);
}
END_TEST

/* 1,000 messages in flight at once: all arrive, in order, intact. */
START_TEST(echo_1000_messages_pipelined)
{
	struct tu h;
	struct tu_peer *cli = wu_setup_echo(&h, wu_scheme(_i)), *srv = tu_server_peer(&h, 0);
	static size_t lens[1000][2];
	for (size_t i = 0; i < 1000; i++) {
		lens[i][0] = varied(i);
		lens[i][1] = i % 3;
		ck_assert_int_eq(tw_comm_write(cli->comm, ts_msg_pattern(lens[i], 2, (unsigned)i)),
				 0);
	}
	ck_assert_msg(tu_wait_count(&h, &cli->nmsgs, 1000, WU_WAIT_MS),
		      "%zu echoes; server got %zu messages, closed %d: %s", cli->nmsgs, srv->nmsgs,
		      srv->closed, srv->last_error);
	for (size_t i = 0; i < 1000; i++)
		ck_assert_msg(ts_msg_matches(cli->msgs[i], lens[i], 2, (unsigned)i), "message %zu",
			      i);
	ck_assert_uint_eq(srv->nmsgs, 1000);
	ck_assert_int_eq(cli->closed + srv->closed, 0);
	tt_fini(&h);
}
END_TEST

/* 64 MiB (8 MiB with TW_TEST_QUICK) in one frame: 8 fragments of 8 MiB
 * each way, reassembled into one frame in one block of its exact size. */
START_TEST(echo_64mib)
{
	struct tu h;
	struct tu_peer *cli = wu_setup_echo(&h, wu_scheme(_i)), *srv = tu_server_peer(&h, 0);
	size_t lens[] = {ts_quick() ? 8 * MiB + 1 : 64 * MiB};
	const tw_slice *f;
	echo_wire(cli, srv, lens, 1, 3, TW_DEFAULT_WS_SHARD_BYTES);
	f = tw_msg_frame(cli->msgs[0], 0);
	ck_assert_uint_eq(f->offset, 0);
	ck_assert_uint_eq(tw_block_size(f->block), lens[0]);
	tt_fini(&h);
}
END_TEST

/* The receive budget over ws and wss (include/taskwire/context.h): six
 * clients send two-frame messages of 3 MiB and 2 MiB at once, in 1 MiB
 * fragments, through a 4 MiB budget shared by the server's and the
 * clients' comms. Frames reserve as they start, comms pause and resume,
 * and every echo comes back intact (nothing dropped, no deadlock). */
START_TEST(echo_through_receive_budget)
{
	enum { N = 6 };
	struct tu h;
	struct tu_peer *cli[N];
	char uri[64];
	size_t lens[] = {3 * MiB, 2 * MiB + 1};
	uint64_t used;
	wu_init(&h, wu_scheme(_i));
	h.sopts.echo = 1;
	ck_assert_int_eq(tw_context_set_receive_budget_bytes(h.ctx, 4 * MiB), 0);
	ck_assert_int_eq(tw_context_set_ws_shard_bytes(h.ctx, MiB), 0);
	snprintf(uri, sizeof(uri), "%s://127.0.0.1:0", wu_scheme(_i));
	ck_assert_int_eq(tu_listen(&h, uri), 0);
	for (int i = 0; i < N; i++) {
		ck_assert_int_eq(tu_connect(&h, h.addr, &cli[i]), 0);
		cli[i]->keep = 1;
	}
	for (int i = 0; i < N; i++)
		ck_assert_int_eq(tw_comm_write(cli[i]->comm, ts_msg_pattern(lens, 2, (unsigned)i)),
				 0);
	for (int i = 0; i < N; i++) {
		ck_assert(tu_wait_count(&h, &cli[i]->nmsgs, 1, WU_WAIT_MS));
		ck_assert(ts_msg_matches(cli[i]->msgs[0], lens, 2, (unsigned)i));
		ck_assert_int_eq(cli[i]->closed, 0);
	}
	ck_assert_int_eq(tw_context_receive_budget_bytes(h.ctx, NULL, &used), 0);
	ck_assert_uint_eq(used, 0);
	tt_fini(&h);
}
END_TEST

/* Sizes at every length-form boundary (BH-25) and at the shard size, in
 * one message; echo_wire checks the minimal header of each fragment. */
START_TEST(echo_mixed_sizes)
{
	struct tu h;
	struct tu_peer *cli = wu_setup_echo(&h, wu_scheme(_i)), *srv = tu_server_peer(&h, 0);
	size_t lens[] = {0,     1,           125,          126,    127,         32767,
			 32768, 65535,       65536,        65537,  8 * MiB - 1, 8 * MiB,
			 3,     8 * MiB + 1, 16 * MiB + 5, 2 * MiB};
	size_t n = ts_quick() ? 13 : sizeof(lens) / sizeof(lens[0]);
	echo_wire(cli, srv, lens, n, 21, TW_DEFAULT_WS_SHARD_BYTES);
	tt_fini(&h);
}
END_TEST

/* A 1,000-byte shard: frames go out in many fragments (the byte count on
 * the wire proves it) and come back whole. */
START_TEST(echo_small_shard)
{
	struct tu h;
	struct tu_peer *cli, *srv;
	size_t lens[] = {0, 1, 999, 1000, 1001, 2000, 2001, 300000, 3, MiB + 17};
	char uri[64];
	wu_init(&h, wu_scheme(_i));
	ck_assert_int_eq(tw_context_set_ws_shard_bytes(h.ctx, 1000), 0);
	snprintf(uri, sizeof(uri), "%s://127.0.0.1:0", wu_scheme(_i));
	ck_assert_int_eq(tu_listen(&h, uri), 0);
	ck_assert_int_eq(tu_connect(&h, h.addr, &cli), 0);
	cli->keep = 1;
	srv = tu_server_peer(&h, 0);
	echo_wire(cli, srv, lens, sizeof(lens) / sizeof(lens[0]), 33, 1000);
	ck_assert_uint_eq(tw_block_size(tw_msg_frame(cli->msgs[0], 9)->block), MiB + 17);
	tt_fini(&h);
}
END_TEST

static int released;

static void on_release(void *data, void *arg)
{
	munmap(data, (size_t)arg);
	released++;
}

/* A server writes a large referenced frame (tw_msg_append_ref): no byte
 * is copied in user space, on the server's send path nor on the client's
 * receive path; the reference is released once, after the write. */
START_TEST(server_send_is_zero_copy)
{
	struct tu h;
	struct tu_peer *cli = wu_setup_echo(&h, wu_scheme(_i)), *srv = tu_server_peer(&h, 0);
	size_t size = ts_quick() ? 8 * MiB + 3 : 64 * MiB + 3, lens[] = {size};
	uint8_t *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	tw_stats before, after;
	tw_msg *m;
	ck_assert(p != MAP_FAILED);
	ts_fill(p, size, 4);
	srv->echo = 0;
	released = 0;
	ck_assert_int_eq(tw_msg_new(&m), 0);
	ck_assert_int_eq(tw_msg_append_ref(m, p, size, on_release, (void *)size), 0);
	before = wu_stats();
	ck_assert_int_eq(tw_comm_write(srv->comm, m), 0);
	ck_assert(tu_wait_count(&h, &cli->nmsgs, 1, WU_WAIT_MS));
	after = wu_stats();
	ck_assert_uint_eq(after.payload_bytes_copied - before.payload_bytes_copied, 0);
	ck_assert_uint_eq(after.merges_copied - before.merges_copied, 0);
	ck_assert(ts_msg_matches(cli->msgs[0], lens, 1, 4));
	ck_assert(tu_wait_flag(&h, &released, WU_WAIT_MS));
	ck_assert_int_eq(released, 1);
	tt_fini(&h);
}
END_TEST

/* tw_comm_close on the client: close 1000 both ways, the client's comm
 * ends with 0; the server's view of the client's close is a clean one,
 * except that the server's echo of the last message may still be queued
 * when the client's close frame arrives (same read): the server answers
 * the close at once and its comm ends with TW_ECLOSED and the bytes of
 * the echo not delivered (the client, closing, reads no more messages),
 * never 0 with them missing. */
START_TEST(orderly_close)
{
	struct tu h;
	struct tu_peer *cli = wu_setup_echo(&h, wu_scheme(_i)), *srv = tu_server_peer(&h, 0);
	size_t lens[] = {100, 70000};
	tu_echo_check(cli, lens, 2, 1, WU_WAIT_MS);
	ck_assert_int_eq(tw_comm_write(cli->comm, ts_msg_pattern(lens, 2, 2)), 0);
	tw_comm_close(cli->comm);
	ck_assert(tu_wait_flag(&h, &cli->closed, WU_WAIT_MS));
	ck_assert(tu_wait_flag(&h, &srv->closed, WU_WAIT_MS));
	ck_assert_msg(cli->close_err == 0, "%s", cli->last_error);
	ck_assert_msg(srv->close_err == 0 || (srv->close_err == TW_ECLOSED &&
					      strstr(srv->last_error, "not delivered") != NULL),
		      "%s", srv->last_error);
	ck_assert_uint_eq(srv->nmsgs, 2); /* the message queued before the close went out */
	tt_fini(&h);
}
END_TEST

/* The server closes: the same from the other side. */
START_TEST(orderly_close_by_server)
{
	struct tu h;
	struct tu_peer *cli = wu_setup_echo(&h, wu_scheme(_i)), *srv = tu_server_peer(&h, 0);
	size_t lens[] = {5};
	tu_echo_check(cli, lens, 1, 1, WU_WAIT_MS);
	tw_comm_close(srv->comm);
	ck_assert(tu_wait_flag(&h, &cli->closed, WU_WAIT_MS));
	ck_assert(tu_wait_flag(&h, &srv->closed, WU_WAIT_MS));
	ck_assert_msg(cli->close_err == 0, "%s", cli->last_error);
	ck_assert_msg(srv->close_err == 0, "%s", srv->last_error);
	tt_fini(&h);
}
END_TEST

/* A server's small messages leave in one write each: every wire byte
 * (WebSocket headers, prelude, frames) is gathered into one buffer, and
 * the client receives them intact. */
START_TEST(server_small_writes_gathered)
{
	static uint8_t small[64];
	struct tu h;
	struct tu_peer *cli = wu_setup_echo(&h, wu_scheme(_i)), *srv = tu_server_peer(&h, 0);
	tw_stats before, after, s0, s1;
	ts_fill(small, sizeof(small), 5);
	srv->echo = 0;
	before = wu_stats();
	tw_comm_stats(srv->comm, &s0, sizeof(s0));
	for (size_t i = 0; i < 5; i++) {
		size_t lens[] = {10 + i};
		tw_msg *m;
		ck_assert_int_eq(tw_msg_new(&m), 0);
		ck_assert_int_eq(tw_msg_append_ref(m, small, lens[0], NULL, NULL), 0);
		ck_assert_int_eq(tw_comm_write(srv->comm, m), 0);
		ck_assert(tu_wait_count(&h, &cli->nmsgs, i + 1, WU_WAIT_MS));
		ck_assert(ts_msg_matches(cli->msgs[i], lens, 1, 5));
	}
	after = wu_stats();
	tw_comm_stats(srv->comm, &s1, sizeof(s1));
	ck_assert_uint_gt(s1.bytes_sent - s0.bytes_sent, 0);
	ck_assert_uint_eq(after.write_bytes_gathered - before.write_bytes_gathered,
			  s1.bytes_sent - s0.bytes_sent);
	tt_fini(&h);
}
END_TEST

/* Heap in use (malloc's count); 0 under valgrind or ASan, whose
 * allocators glibc's count does not see. */
static uint64_t heap_in_use(void)
{
	struct mallinfo2 mi = mallinfo2();
	return (uint64_t)mi.uordblks + (uint64_t)mi.hblkhd;
}

/* An idle comm keeps no buffers (issue 20): a client's 64 KiB masking
 * buffer is there only while it writes, what only the upgrade needs
 * goes after it, and TLS releases its record buffers. 16 more comm
 * pairs, each after one echo: ws took 73.6 KiB of heap per pair before,
 * 6.6 KiB after; wss 186 KiB before, 55 KiB after. */
START_TEST(idle_comms_keep_no_buffers)
{
	enum { PAIRS = 16 };
	struct tu h;
	struct tu_peer *cli = wu_setup_echo(&h, wu_scheme(_i)), *more[PAIRS];
	size_t lens[] = {100};
	uint64_t before, per_pair, bound = _i == 0 ? 24 * 1024 : 80 * 1024;
	tu_echo_check(cli, lens, 1, 1, WU_WAIT_MS); /* warm up */
	before = heap_in_use();
	for (int i = 0; i < PAIRS; i++) {
		int rv = tu_connect(&h, h.addr, &more[i]);
		ck_assert_msg(rv == 0, "connect %s: %s: %s", h.addr, tw_strerror(rv),
			      tw_context_last_error(h.ctx));
		more[i]->keep = 1;
		tu_echo_check(more[i], lens, 1, (unsigned)i, WU_WAIT_MS);
	}
	per_pair = (heap_in_use() - before) / PAIRS;
	if (before != 0) /* else no malloc count here (valgrind, ASan) */
		ck_assert_msg(per_pair < bound, "an idle %s comm pair holds %llu bytes of heap",
			      wu_scheme(_i), (unsigned long long)per_pair);
	tt_fini(&h);
}
END_TEST

TCase *ws_echo_tcase(void)
{
	TCase *tc = tcase_create("echo");
	tcase_set_timeout(tc, 120);
	tcase_add_loop_test(tc, echo_empty_and_one_byte, 0, 2);
	tcase_add_loop_test(tc, echo_1000_frames_one_message, 0, 2);
	tcase_add_loop_test(tc, echo_1000_messages_pipelined, 0, 2);
	tcase_add_loop_test(tc, echo_64mib, 0, 2);
	tcase_add_loop_test(tc, echo_through_receive_budget, 0, 2);
	tcase_add_loop_test(tc, echo_mixed_sizes, 0, 2);
	tcase_add_loop_test(tc, echo_small_shard, 0, 2);
	tcase_add_loop_test(tc, server_send_is_zero_copy, 0, 2);
	tcase_add_loop_test(tc, server_small_writes_gathered, 0, 2);
	tcase_add_loop_test(tc, orderly_close, 0, 2);
	tcase_add_loop_test(tc, orderly_close_by_server, 0, 2);
	tcase_add_loop_test(tc, idle_comms_keep_no_buffers, 0, 2);
	return tc;
}
