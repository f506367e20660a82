/* SPDX-License-Identifier: BSD-3-Clause */
/* Decoded delivery with the offload pool (include/taskwire/offload.h,
 * docs/design.md, Offload: the event loop never blocks on payload work):
 * order per comm, comms that do not wait for each other, the thread
 * callbacks run on, and the threshold. Loopback comms on one process; a
 * large message is a 64 MiB zstd payload (2 MiB with TW_TEST_QUICK=1, with
 * the threshold lowered to 1 MiB), built once in main. Where a test must
 * know that a message sits in the pool, a gate job holds the pool's only
 * worker (tests/support/offload.h); nothing asserts on time. */
#include <stdlib.h>

#include <check.h>

#include "core/context.h"
#include "protocol/offload.h"
#include "tests/check_offload.h"
#include "tests/support/offload.h"
#include "tests/support/suite.h"

/* A large message then a 10-byte one: the small one is decoded at once,
 * inline, but waits for the large one, which is held in the pool. */
START_TEST(order_large_then_small)
{
	struct ox o;
	struct ox_job *gate = ox_setup_gated(&o, 1);
	ox_send(&o, 0, ox_large(0, NULL));
	ox_send(&o, 0, ox_small(1, NULL));
	ox_wait_received(&o, 0, 2);
	ck_assert_uint_eq(o.rx[0].n, 0); /* the small one waits */
	ox_open(gate);
	ox_wait_delivered(&o, 0, 2);
	ck_assert_msg(ox_rx_is(&o.rx[0], 0, 0), "first: seq %llu err %d ok %d",
		      (unsigned long long)o.rx[0].got[0].seq, o.rx[0].got[0].err,
		      o.rx[0].got[0].ok);
	ck_assert_uint_eq(o.rx[0].got[0].bytes, ox_large_bytes());
	ck_assert(ox_rx_is(&o.rx[0], 1, 1));
	ck_assert_uint_eq(o.rx[0].got[1].bytes, OX_SMALL_BYTES);
	ox_teardown_gated(&o, gate);
}
END_TEST

/* L S S L S, then more small ones than the comm lets wait (reading pauses
 * at 8), then L S: every message in order, byte for byte, with the pool's
 * default size and real decode times. */
static const char order_kinds[] = "LSSLSSSSSSSSSSSSSLS";

START_TEST(order_interleaved)
{
	struct ox o;
	size_t n = sizeof(order_kinds) - 1;
	ox_setup(&o, 1, 0);
	for (size_t i = 0; i < n; i++)
		ox_send(&o, 0, order_kinds[i] == 'L' ? ox_large(i, NULL) : ox_small(i, NULL));
	ox_wait_delivered(&o, 0, n);
	for (size_t i = 0; i < n; i++) {
		size_t want = order_kinds[i] == 'L' ? ox_large_bytes() : OX_SMALL_BYTES;
		ck_assert_msg(ox_rx_is(&o.rx[0], i, i), "message %zu: seq %llu err %d ok %d", i,
			      (unsigned long long)o.rx[0].got[i].seq, o.rx[0].got[i].err,
			      o.rx[0].got[i].ok);
		ck_assert_uint_eq(o.rx[0].got[i].bytes, want);
	}
	ck_assert_uint_eq(o.rx[0].n, n);
	ck_assert_int_eq(o.rx[0].closed, 0);
	ox_teardown(&o);
}
END_TEST

/* Comm X's large message sits in the pool; comm Y's small one, sent after
 * X's arrived, is delivered first. */
START_TEST(comms_do_not_wait)
{
	struct ox o;
	struct ox_job *gate = ox_setup_gated(&o, 2);
	ox_send(&o, 0, ox_large(0, NULL));
	ox_wait_received(&o, 0, 1);
	ox_send(&o, 1, ox_small(1, NULL));
	ox_wait_delivered(&o, 1, 1);
	ck_assert_uint_eq(o.rx[0].n, 0);
	ox_open(gate);
	ox_wait_delivered(&o, 0, 1);
	ck_assert(ox_rx_is(&o.rx[0], 0, 0));
	ck_assert(ox_rx_is(&o.rx[1], 0, 1));
	ck_assert_uint_lt(o.rx[1].got[0].order, o.rx[0].got[0].order);
	ox_teardown_gated(&o, gate);
}
END_TEST

/* Message i of L S L S. */
static tw_msg *lsls(size_t i)
{
	return i % 2 == 0 ? ox_large(i, NULL) : ox_small(i, NULL);
}

/* Two comms, each receiving L S L S with two workers: decoded callbacks,
 * close callbacks and pool results all run on the test's thread, which
 * runs the loop. */
START_TEST(callbacks_on_loop_thread_own_base)
{
	struct ox o;
	struct ox_job *marker;
	ox_setup(&o, 2, 2);
	for (size_t i = 0; i < 4; i++)
		for (size_t c = 0; c < 2; c++)
			ox_send(&o, c, lsls(i));
	marker = ox_marker(o.h.ctx);
	for (size_t c = 0; c < 2; c++) {
		ox_wait_delivered(&o, c, 4);
		for (size_t i = 0; i < 4; i++)
			ck_assert_msg(ox_rx_is(&o.rx[c], i, i), "comm %zu message %zu", c, i);
	}
	ox_wait_job(&o.h, marker);
	tw_comm_close(o.cli[1]->comm);
	ck_assert(tu_wait_flag(&o.h, &o.rx[1].closed, TU_WAIT_MS));
	ck_assert_uint_eq(o.rx[0].off_thread + o.rx[1].off_thread, 0);
	ck_assert_int_eq(marker->done_off_thread, 0);
	ox_teardown(&o);
	ox_job_free(marker);
}
END_TEST

static void thr_send(struct ox_thr *t, void *arg)
{
	(void)arg;
	for (size_t i = 0; i < 4; i++)
		for (size_t c = 0; c < t->ncli; c++)
			ck_assert_int_eq(tw_comm_write(t->cli[c], lsls(i)), 0);
}

/* Read the loop's state from the loop thread. */
static void thr_snapshot(struct ox_thr *t, void *arg)
{
	memcpy(arg, t->rx, sizeof(t->rx));
}

/* The same on a context with its own loop thread, driven through
 * tw_context_call: every callback runs on that thread. */
START_TEST(callbacks_on_loop_thread_own_thread)
{
	static struct ox_thr t;
	static struct ox_rx rx[OX_MAX_COMMS];
	ox_thr_start(&t, 2, 2);
	ck_assert(!pthread_equal(t.loop, pthread_self()));
	ox_thr_call(&t, thr_send, NULL);
	ck_assert_msg(ox_thr_wait_delivered(&t, 8), "not delivered");
	ox_thr_call(&t, thr_snapshot, rx);
	for (size_t c = 0; c < 2; c++) {
		ck_assert_uint_eq(rx[c].n, 4);
		for (size_t i = 0; i < 4; i++)
			ck_assert_msg(ox_rx_is(&rx[c], i, i), "comm %zu message %zu", c, i);
		ck_assert_uint_eq(rx[c].off_thread, 0);
		ck_assert_int_eq(rx[c].closed, 0);
	}
	ox_thr_stop(&t);
}
END_TEST

/* Threshold 0: even 10-byte messages go through the pool (held there by
 * the gate), and still arrive in order. */
START_TEST(threshold_zero_offloads_small)
{
	struct ox o;
	struct ox_job *gate = ox_setup_gated(&o, 1);
	ck_assert_int_eq(tw_context_set_offload_threshold_bytes(o.h.ctx, 0), 0);
	for (size_t i = 0; i < 5; i++)
		ox_send(&o, 0, ox_small(i, NULL));
	ox_wait_received(&o, 0, 5);
	ck_assert_uint_eq(o.rx[0].n, 0);
	ox_open(gate);
	ox_send(&o, 0, ox_large(5, NULL));
	for (size_t i = 6; i < 20; i++)
		ox_send(&o, 0, ox_small(i, NULL));
	ox_wait_delivered(&o, 0, 20);
	for (size_t i = 0; i < 20; i++)
		ck_assert_msg(ox_rx_is(&o.rx[0], i, i), "message %zu", i);
	ox_teardown_gated(&o, gate);
}
END_TEST

/* Threshold 0 starts the pool on the first message, tiny as it is. */
START_TEST(threshold_zero_starts_pool)
{
	struct ox o;
	size_t before;
	ox_setup(&o, 1, 2);
	ck_assert_int_eq(tw_context_set_offload_threshold_bytes(o.h.ctx, 0), 0);
	before = ox_nthreads();
	ck_assert_int_eq(tw__offload_started(o.h.ctx), 0);
	ox_send(&o, 0, ox_small(0, NULL));
	ox_wait_delivered(&o, 0, 1);
	ck_assert(ox_rx_is(&o.rx[0], 0, 0));
	ck_assert_uint_eq(ox_nthreads(), before + 2);
	ox_teardown(&o);
}
END_TEST

/* TW_OFFLOAD_NEVER: large messages too are decoded inline, in order, and
 * no pool thread ever starts. */
START_TEST(threshold_never)
{
	struct ox o;
	size_t before;
	ox_setup(&o, 1, 0);
	ck_assert_int_eq(tw_context_set_offload_threshold_bytes(o.h.ctx, TW_OFFLOAD_NEVER), 0);
	before = ox_nthreads();
	ox_send(&o, 0, ox_large(0, NULL));
	ox_send(&o, 0, ox_small(1, NULL));
	ox_send(&o, 0, ox_large(2, NULL));
	ox_wait_delivered(&o, 0, 3);
	for (size_t i = 0; i < 3; i++)
		ck_assert_msg(ox_rx_is(&o.rx[0], i, i), "message %zu", i);
	ck_assert_uint_eq(ox_nthreads(), before);
	ck_assert_int_eq(tw__offload_started(o.h.ctx), 0);
	ox_teardown(&o);
}
END_TEST

TCase *offload_order_tcase(void)
{
	return ts_tcase("order", 120,
			TS_TESTS(order_large_then_small, order_interleaved, comms_do_not_wait,
				 callbacks_on_loop_thread_own_base,
				 callbacks_on_loop_thread_own_thread, threshold_zero_offloads_small,
				 threshold_zero_starts_pool, threshold_never));
}

int main(void)
{
	Suite *s = suite_create("offload");
	ox_init();
	suite_add_tcase(s, offload_order_tcase());
	suite_add_tcase(s, offload_life_tcase());
	suite_add_tcase(s, offload_life_other_tcase());
	return ts_run(s, 0);
}
