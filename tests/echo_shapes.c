/* SPDX-License-Identifier: BSD-3-Clause */
/* Echo shapes shared by the stream transport suites (echo_shapes.h). */
#include <check.h>

#include "tests/echo_shapes.h"

#define MiB ((size_t)1 << 20)

void es_empty_frames(struct tu_peer *cli)
{
	size_t lens[] = {0}, empties[] = {0, 0, 0};
	tu_echo_check(cli, lens, 1, 0, TU_WAIT_MS);
	ck_assert_uint_eq(tw_msg_frame(cli->msgs[0], 0)->len, 0);
	tu_echo_check(cli, empties, 3, 1, TU_WAIT_MS);
	ck_assert_uint_eq(tw_msg_nframes(cli->msgs[1]), 3);
}

void es_one_byte(struct tu_peer *cli)
{
	size_t lens[] = {1};
	tu_echo_check(cli, lens, 1, 5, TU_WAIT_MS);
	ck_assert_uint_eq(tw_slice_data(tw_msg_frame(cli->msgs[0], 0))[0], ts_pattern_byte(0, 5));
}

static size_t varied(size_t i, const size_t edges[10])
{
	return i % 10 == 9 ? edges[(i / 10) % 10] : (i * 7919) % 5000;
}

void es_1000_frames(struct tu_peer *cli, const size_t edges[10])
{
	size_t lens[1000];
	for (size_t i = 0; i < 1000; i++)
		lens[i] = varied(i, edges);
	tu_echo_check(cli, lens, 1000, 11, TU_WAIT_MS);
}

void es_1000_pipelined(struct tu *h, struct tu_peer *cli, const size_t edges[10])
{
	static size_t lens[1000][2];
	for (size_t i = 0; i < 1000; i++) {
		lens[i][0] = varied(i, edges);
		lens[i][1] = i % 3;
		ck_assert_int_eq(tw_comm_write(cli->comm, ts_msg_pattern(lens[i], 2, (unsigned)i)),
				 0);
	}
	ck_assert(tu_wait_count(h, &cli->nmsgs, 1000, TU_WAIT_MS));
	for (size_t i = 0; i < 1000; i++)
		ck_assert_msg(ts_msg_matches(cli->msgs[i], lens[i], 2, (unsigned)i), "message %zu",
			      i);
	ck_assert_int_eq(cli->closed, 0);
}

void es_one_frame(struct tu_peer *cli, size_t len, int ms)
{
	size_t lens[] = {len};
	tu_echo_check(cli, lens, 1, 3, ms);
}

void es_mixed(struct tu_peer *cli, size_t edge)
{
	size_t lens[] = {0, 1, 70000, 5, 3 * MiB, 0, edge, edge + 1, 100, 17 * MiB + 3, 2};
	tu_echo_check(cli, lens, sizeof(lens) / sizeof(lens[0]), 21, TU_WAIT_MS);
	tu_echo_check(cli, lens + 4, 2, 22, TU_WAIT_MS); /* small right behind large */
}
