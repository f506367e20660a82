/* SPDX-License-Identifier: BSD-3-Clause */
/* Echo over tls:// with mutual TLS: the TCP shapes, stats, and a frame
 * larger than 2^31 bytes (BH-01: OpenSSL takes int lengths, so SSL_read
 * and SSL_write must get pieces of at most INT_MAX). */
#include <malloc.h>
#include <stdlib.h>
#include <string.h>

#include <check.h>
#include <openssl/err.h>

#include "tests/check_tls.h"
#include "tests/echo_shapes.h"
#include "tests/support/tls.h"

#define MiB ((size_t)1 << 20)
#define GiB ((size_t)1 << 30)

/* Sizes around the placement thresholds and the TLS record size (16 KiB). */
static const size_t edges[10] = {0, 1, 16383, 16384, 16385, 65535, 65536, 65537, 262144, 7};

START_TEST(echo_empty_frame)
{
	struct tu h;
	es_empty_frames(tt_setup_echo(&h));
	tt_fini(&h);
}
END_TEST

START_TEST(echo_one_byte)
{
	struct tu h;
	es_one_byte(tt_setup_echo(&h));
	tt_fini(&h);
}
END_TEST

START_TEST(echo_1000_frames_one_message)
{
	struct tu h;
	es_1000_frames(tt_setup_echo(&h), edges);
	tt_fini(&h);
}
END_TEST

START_TEST(echo_1000_messages_pipelined)
{
	struct tu h;
	struct tu_peer *cli = tt_setup_echo(&h);
	es_1000_pipelined(&h, cli, edges);
	tt_fini(&h);
}
END_TEST

START_TEST(echo_64mib_frame)
{
	struct tu h;
	es_one_frame(tt_setup_echo(&h), ts_quick() ? 8 * MiB : 64 * MiB, 60000);
	tt_fini(&h);
}
END_TEST

START_TEST(echo_mixed_frames)
{
	struct tu h;
	es_mixed(tt_setup_echo(&h), 16384);
	tt_fini(&h);
}
END_TEST

/* Stats: a large message built from references crosses TLS both ways
 * without a single payload byte copied in user space. */
static int released;
static void count_release(void *data, void *arg)
{
	(void)data;
	(void)arg;
	released++;
}

START_TEST(no_copy_on_receive)
{
	struct tu h;
	struct tu_peer *cli = tt_setup_echo(&h), *srv;
	size_t big_len = ts_quick() ? 8 * MiB : 64 * MiB, lens[] = {100, big_len};
	uint8_t *head = malloc(100), *big = malloc(big_len);
	uint64_t wire = 8 * 4 + 100 + big_len;
	tw_stats g0, g1, cs;
	tw_msg *m;
	ts_fill(head, 100, 7);
	ts_fill(big, big_len, 8);
	tu_echo_check(cli, lens, 2, 7, TU_WAIT_MS); /* warm up: blocks cached, comm up */
	srv = tu_server_peer(&h, 0);
	tw_stats_global(&g0, sizeof(g0));
	ck_assert_int_eq(tw_msg_new(&m), 0);
	ck_assert_int_eq(tw_msg_append_ref(m, head, 100, count_release, NULL), 0);
	ck_assert_int_eq(tw_msg_append_ref(m, big, big_len, count_release, NULL), 0);
	ck_assert_int_eq(tw_comm_write(cli->comm, m), 0);
	ck_assert(tu_wait_count(&h, &cli->nmsgs, 2, 60000));
	tw_stats_global(&g1, sizeof(g1));
	ck_assert_msg(ts_msg_matches(cli->msgs[1], lens, 2, 7), "echo differs");
	ck_assert_uint_eq(g1.payload_bytes_copied - g0.payload_bytes_copied, 0);
	ck_assert_uint_eq(g1.msgs_received - g0.msgs_received, 2);
	ck_assert_uint_eq(g1.bytes_received - g0.bytes_received, 2 * wire);
	ck_assert_uint_eq(g1.bytes_sent - g0.bytes_sent, 2 * wire);
	ck_assert_int_eq(released, 2);
	tw_comm_stats(srv->comm, &cs, sizeof(cs));
	ck_assert_uint_eq(cs.msgs_received, 2);
	ck_assert_uint_eq(cs.bytes_received, 2 * wire);
	ck_assert_uint_eq(cs.payload_bytes_copied, 0);
	tt_fini(&h);
	free(head);
	free(big);
}
END_TEST

/* OpenSSL's error queue is per thread and shared with the application:
 * SSL_get_error misreads a plain "would block" as a failure when an
 * unrelated error is left in it. The comms must not depend on the
 * application keeping it empty. */
static void leave_openssl_error(struct tu_peer *p, tw_msg *m)
{
	(void)p;
	(void)m;
	ERR_raise_data(ERR_LIB_USER, 1, "left behind by the application");
}

START_TEST(stale_openssl_errors)
{
	struct tu h;
	struct tu_peer *cli = tt_setup_echo(&h), *srv;
	size_t lens[] = {5 * MiB, 10};
	tt_canary(cli, 0);
	srv = tu_server_peer(&h, 0);
	srv->on_recv = leave_openssl_error;
	cli->on_recv = leave_openssl_error;
	for (unsigned i = 0; i < 5; i++) {
		ERR_raise_data(ERR_LIB_USER, 2, "left behind before a write");
		tu_echo_check(cli, lens, 2, i, TU_WAIT_MS);
	}
	ck_assert_int_eq(cli->closed, 0);
	ck_assert_int_eq(srv->closed, 0);
	ERR_clear_error();
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

/* An idle TLS comm holds no record buffers (issue 20): OpenSSL gives
 * back its read and write buffers (about 17 KiB each per SSL) once a
 * message is through (SSL_MODE_RELEASE_BUFFERS). 32 more comm pairs,
 * each after one echo, added 118 KiB of heap per pair with them, 55 KiB
 * without (bench/idle-bench.sh has the figures per comm). */
START_TEST(idle_comms_hold_no_record_buffers)
{
	enum { PAIRS = 32 };
	struct tu h;
	struct tu_peer *cli = tt_setup_echo(&h), *more[PAIRS];
	size_t lens[] = {100};
	char why[512] = "";
	uint64_t before, per_pair;
	tu_echo_check(cli, lens, 1, 1, TU_WAIT_MS); /* warm up */
	before = heap_in_use();
	for (int i = 0; i < PAIRS; i++) {
		int rv = tt_connect(&h, h.ctx, h.addr, &more[i], why, sizeof(why));
		ck_assert_msg(rv == 0, "tls connect: %s: %s", tw_strerror(rv), why);
		more[i]->keep = 1;
		tu_echo_check(more[i], lens, 1, (unsigned)i, TU_WAIT_MS);
	}
	per_pair = (heap_in_use() - before) / PAIRS;
	if (before != 0) /* else no malloc count here (valgrind, ASan) */
		ck_assert_msg(per_pair < 80 * 1024, "an idle comm pair holds %llu bytes of heap",
			      (unsigned long long)per_pair);
	tt_fini(&h);
}
END_TEST

TCase *tls_echo_tcase(void)
{
	TCase *tc = tcase_create("echo");
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, echo_empty_frame);
	tcase_add_test(tc, echo_one_byte);
	tcase_add_test(tc, echo_1000_frames_one_message);
	tcase_add_test(tc, echo_1000_messages_pipelined);
	tcase_add_test(tc, echo_64mib_frame);
	tcase_add_test(tc, echo_mixed_frames);
	tcase_add_test(tc, no_copy_on_receive);
	tcase_add_test(tc, stale_openssl_errors);
	tcase_add_test(tc, idle_comms_hold_no_record_buffers);
	return tc;
}

/* BH-01 over TLS, out and back: (a) one frame of 3 GiB + 5 bytes (more
 * than 2^31, not a multiple of the record size); (b) three frames of
 * 1 GiB + 1 byte each (each under 2^31, the message over). The SHA-256 of
 * each frame as the server received it and as it came back equals the
 * sender's. The sender's buffers are freed by their release callbacks
 * once written, which keeps the peak near twice the message. */
#define MAX_BIG_FRAMES 3

struct big_run {
	size_t nf, len;
	uint8_t want[MAX_BIG_FRAMES][32], at_server[MAX_BIG_FRAMES][32],
		at_client[MAX_BIG_FRAMES][32];
	int server_done, client_done, release_ran;
};
static struct big_run run;

static void free_sent(void *data, void *arg)
{
	(void)arg;
	free(data);
	run.release_ran++;
}

static void hash_frames(struct tu_peer *p, tw_msg *m)
{
	int server = p->echo;
	ck_assert_uint_eq(tw_msg_nframes(m), run.nf);
	for (size_t i = 0; i < run.nf; i++) {
		const tw_slice *f = tw_msg_frame(m, i);
		ck_assert_uint_eq(f->len, run.len);
		tt_sha256(tw_slice_data(f), f->len, server ? run.at_server[i] : run.at_client[i]);
	}
	if (server)
		run.server_done = 1;
	else
		run.client_done = 1;
}

static void big_echo(size_t nf, size_t len)
{
	struct tu h;
	struct tu_peer *cli = tt_setup_echo(&h), *srv;
	tw_msg *m;
	memset(&run, 0, sizeof(run));
	run.nf = nf;
	run.len = len;
	tt_canary(cli, 1); /* the server peer exists now */
	cli->keep = 0;
	cli->on_recv = hash_frames;
	srv = tu_server_peer(&h, 0);
	srv->on_recv = hash_frames;
	ck_assert_int_eq(tw_msg_new(&m), 0);
	for (size_t i = 0; i < nf; i++) {
		uint8_t *buf = malloc(len);
		ck_assert_ptr_nonnull(buf);
		ts_fill(buf, len, 9 + (unsigned)i);
		tt_sha256(buf, len, run.want[i]);
		ck_assert_int_eq(tw_msg_append_ref(m, buf, len, free_sent, NULL), 0);
	}
	ck_assert_int_eq(tw_comm_write(cli->comm, m), 0);
	ck_assert_msg(tu_wait_flag(&h, &run.client_done, 240000), "no echo (closed %d: %s)",
		      cli->closed, cli->last_error);
	ck_assert_int_eq(run.server_done, 1);
	ck_assert_int_eq(run.release_ran, (int)nf);
	for (size_t i = 0; i < nf; i++) {
		ck_assert_msg(memcmp(run.at_server[i], run.want[i], 32) == 0,
			      "frame %zu: server's SHA-256 differs", i);
		ck_assert_msg(memcmp(run.at_client[i], run.want[i], 32) == 0,
			      "frame %zu: echo's SHA-256 differs", i);
	}
	ck_assert_int_eq(cli->closed, 0);
	ck_assert_int_eq(srv->closed, 0);
	tt_fini(&h);
}

START_TEST(echo_3gib_frame)
{
	big_echo(1, (size_t)3 * GiB + 5);
}
END_TEST

START_TEST(echo_three_1gib_frames)
{
	big_echo(3, GiB + 1);
}
END_TEST

TCase *tls_big_tcase(void)
{
	TCase *tc = tcase_create("big");
	tcase_set_timeout(tc, ts_data_timeout_s(600)); /* 6 GiB through TLS each */
	tcase_add_test(tc, echo_3gib_frame);
	tcase_add_test(tc, echo_three_1gib_frames);
	return tc;
}
