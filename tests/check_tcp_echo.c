/* SPDX-License-Identifier: BSD-3-Clause */
/* What only tcp has of echo: a 1 GiB frame, 200 clients at once, small
 * pieces gathered (the shapes every transport carries are in
 * tests/check_conformance.c). */
#include <stdlib.h>

#include <check.h>

#include "tests/check_tcp.h"
#include "tests/support/harness.h"
#include "tests/support/suite.h"

#define MiB ((size_t)1 << 20)
#define GiB ((size_t)1 << 30)

/* 1 GiB in one frame, out and back, every byte compared with the pattern
 * (64 MiB with TW_TEST_QUICK). */
START_TEST(echo_1gib_frame)
{
	struct tu h;
	struct tu_peer *cli = tu_setup_echo(&h);
	size_t lens[] = {ts_quick() ? 64 * MiB : GiB};
	tu_echo_check(cli, lens, 1, 0, 60000);
	tu_fini(&h);
}
END_TEST

/* 200 clients connect at once, each echoes its own message. */
#define NCLIENTS 200
START_TEST(many_clients)
{
	struct tu h;
	static struct tu_peer *cli[NCLIENTS];
	static int err[NCLIENTS];
	size_t lens[NCLIENTS][2];
	tu_init(&h);
	ck_assert_int_eq(tu_listen(&h, "tcp://127.0.0.1:0"), 0);
	for (int i = 0; i < NCLIENTS; i++)
		ck_assert_int_eq(tu_connect_async(&h, h.addr, &cli[i], &err[i]), 0);
	for (int i = 0; i < NCLIENTS; i++) {
		ck_assert_msg(tu_wait_connected(&h, &err[i], TU_WAIT_MS), "client %d hung", i);
		ck_assert_msg(err[i] == 0, "client %d: %s", i, tw_strerror(err[i]));
	}
	for (int i = 0; i < NCLIENTS; i++) {
		tw_msg *m;
		lens[i][0] = (size_t)i * 37 % 5000 + 1;
		lens[i][1] = (size_t)i * 1000;
		m = ts_msg_pattern(lens[i], 2, (unsigned)i);
		cli[i]->keep = 1;
		ck_assert_int_eq(tw_comm_write(cli[i]->comm, m), 0);
	}
	for (int i = 0; i < NCLIENTS; i++) {
		ck_assert_msg(tu_wait_count(&h, &cli[i]->nmsgs, 1, TU_WAIT_MS), "client %d", i);
		ck_assert_msg(ts_msg_matches(cli[i]->msgs[0], lens[i], 2, (unsigned)i), "client %d",
			      i);
	}
	ck_assert_uint_eq(h.nsrv, NCLIENTS);
	for (int i = 0; i < NCLIENTS; i++)
		ck_assert_int_eq(h.srv[i]->closed, 0);
	tu_fini(&h);
}
END_TEST

static uint8_t small_buf[100];

/* Small pieces leave as one buffer: a small message's prelude and frames
 * are gathered (write_bytes_gathered, not payload_bytes_copied), and of a
 * large message only the prelude and small frame 0 are; the large frame
 * never is. Each message is echoed before the next, so each side makes
 * exactly one write of it. */
START_TEST(gather_small_pieces)
{
	struct tu h;
	struct tu_peer *cli = tu_setup_echo(&h);
	size_t big_len = MiB;
	uint8_t *big = malloc(big_len);
	uint64_t want = 0;
	tw_stats g0, g1;
	ts_fill(small_buf, sizeof(small_buf), 1);
	ts_fill(big, big_len, 2);
	tw_stats_global(&g0, sizeof(g0));
	for (size_t i = 0; i <= 10; i++) {
		size_t lens[] = {sizeof(small_buf) - i, big_len};
		size_t nf = i < 10 ? 1 : 2;
		tw_msg *m;
		ck_assert_int_eq(tw_msg_new(&m), 0);
		ck_assert_int_eq(tw_msg_append_ref(m, small_buf, lens[0], NULL, NULL), 0);
		if (nf == 2)
			ck_assert_int_eq(tw_msg_append_ref(m, big, big_len, NULL, NULL), 0);
		ck_assert_int_eq(tw_comm_write(cli->comm, m), 0);
		ck_assert(tu_wait_count(&h, &cli->nmsgs, i + 1, TU_WAIT_MS));
		ck_assert_msg(ts_msg_matches(cli->msgs[i], lens, nf, 1), "message %zu", i);
		want += 2 * (8 * (nf + 2) + lens[0]); /* sent by the client, then by the echo */
	}
	tw_stats_global(&g1, sizeof(g1));
	ck_assert_uint_eq(g1.write_bytes_gathered - g0.write_bytes_gathered, want);
	/* copied: only what each side read ahead of the large message (the
	 * small ones before it started a run), at most 4 KiB a side */
	ck_assert_uint_le(g1.payload_bytes_copied - g0.payload_bytes_copied, 2 * 4096);
	tu_fini(&h);
	free(big);
}
END_TEST

TCase *tcp_echo_tcase(void)
{
	return ts_tcase("echo", 120, TS_TESTS(echo_1gib_frame, many_clients, gather_small_pieces));
}
