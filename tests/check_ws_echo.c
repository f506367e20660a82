/* SPDX-License-Identifier: BSD-3-Clause */
/* What only ws:// and wss:// have of echo (each test is a loop test: _i =
 * 0 ws, 1 wss, mutual TLS with the test certificates; the shapes every
 * transport carries, with the bytes on the wire, are in
 * tests/check_conformance.c): the receive budget with 1 MiB fragments, a
 * small shard size (fragments on the wire), and orderly close. */
#include <stdlib.h>
#include <string.h>

#include <check.h>

#include "tests/check_ws.h"
#include "tests/support/tran.h"
#include "tests/support/ws.h"
#include "tests/support/suite.h"

#define MiB ((size_t)1 << 20)

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
	ts_tran_echo_wire(_i ? TS_WSS : TS_WS, cli, srv, lens, sizeof(lens) / sizeof(lens[0]), 33,
			  1000);
	ck_assert_uint_eq(tw_block_size(tw_msg_frame(cli->msgs[0], 9)->block), MiB + 17);
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

TCase *ws_echo_tcase(void)
{
	TCase *tc = ts_tcase("echo", 120, NULL);
	ts_add_loop(tc, 2,
		    TS_TESTS(echo_through_receive_budget, echo_small_shard, orderly_close,
			     orderly_close_by_server));
	return tc;
}
