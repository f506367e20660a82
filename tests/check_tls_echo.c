/* SPDX-License-Identifier: BSD-3-Clause */
/* What only tls has of echo (mutual TLS; the shapes every transport
 * carries are in tests/check_conformance.c): an OpenSSL error queue left
 * dirty by the application, and frames larger than 2^31 bytes (OpenSSL takes int lengths, so
 * SSL_read and SSL_write must get pieces of at most INT_MAX). */
#include <stdlib.h>
#include <string.h>

#include <check.h>
#include <event2/event.h>
#include <openssl/err.h>

#include "tests/check_tls.h"
#include "tests/support/pattern.h"
#include "tests/support/tls.h"
#include "tests/support/suite.h"
#include "tests/support/ws.h"

#define MiB ((size_t)1 << 20)
#define GiB ((size_t)1 << 30)

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

/* Drippers over TLS (breaker b4, session 13, as check_tcp's
 * receive_budget_small_drippers_do_not_hold_the_pass): TD_N raw TLS peers
 * each declare a 1 MiB message, send half of it as fast as the server
 * reads (what the socket takes, each tick), then drip 64 bytes a tick
 * (6.4 KB/s: their rest would take 80 s) inside TLS records; they fill the
 * 2 MiB receive budget and have fewer bytes to come than an honest 3 MiB
 * message from a taskwire client, which must still be echoed whole and
 * byte-identical while they drip (drippers count as furthest from done
 * once seen moving less than 64 KiB per 100 ms). None is cut or
 * delivered. The tick paces the peers; no assertion depends on it, and
 * the watchdog is the honest comm's own bytes. */
#define TD_N     4
#define TD_TICK  10 /* ms */
#define TD_BURST (MiB / 2)

static uint64_t tls_received(const struct tu_peer *p)
{
	tw_stats st;
	tw_comm_stats(p->comm, &st, sizeof(st));
	return st.bytes_received;
}

static int tls_drippers_hold(void *arg)
{
	const struct wu_drip *d = arg;
	uint64_t n = 0;
	for (int i = 0; i < d->n; i++)
		n += tls_received(d->sp[i]);
	return n >= TD_N * (uint64_t)TD_BURST;
}

START_TEST(drippers_do_not_hold_the_pass)
{
	struct tu h;
	struct wu_drip d;
	struct tu_peer *cli, *srv;
	size_t lens[] = {3 * MiB};
	char uri[sizeof(h.addr)];
	uint64_t used;
	memset(&d, 0, sizeof(d));
	tt_init(&h);
	h.sopts.echo = 1;
	ck_assert_int_eq(tw_context_set_receive_budget_bytes(h.ctx, 2 * MiB), 0);
	ck_assert_int_eq(tu_listen(&h, "tls://127.0.0.1:0"), 0);
	ck_assert(strncmp(h.addr, "tls://", 6) == 0);
	memcpy(uri, "wss", 3); /* wu_raw_connect: TLS alone, no upgrade */
	memcpy(uri + 3, h.addr + 3, sizeof(h.addr) - 3);
	wu_drip_stream(&d, MiB, TD_BURST, 21);
	wu_drip_start(&h, &d, uri, TD_N, TD_TICK);
	ck_assert_msg(tu_run_until(&h, tls_drippers_hold, &d, TU_WAIT_MS),
		      "the drippers never filled the budget");
	ck_assert_int_eq(tw_context_receive_budget_bytes(h.ctx, NULL, &used), 0);
	ck_assert_uint_ge(used, 2 * MiB - TD_BURST); /* full, but for a dripper's step */
	ck_assert_int_eq(tu_connect(&h, h.addr, &cli), 0);
	cli->keep = 1;
	ck_assert_ptr_nonnull(srv = tu_server_peer(&h, TD_N));
	ck_assert_int_eq(tw_comm_write(cli->comm, ts_msg_pattern(lens, 1, 23)), 0);
	wu_wait_msg_moving(&h, cli, srv, TU_WAIT_MS);
	ck_assert(ts_msg_matches(cli->msgs[0], lens, 1, 23));
	ck_assert_int_eq(cli->closed, 0);
	for (int i = 0; i < TD_N; i++) { /* none cut, none delivered */
		ck_assert_int_eq(d.sp[i]->closed, 0);
		ck_assert_uint_eq(d.sp[i]->nmsgs, 0);
	}
	wu_drip_stop(&d);
	tt_fini(&h);
}
END_TEST

TCase *tls_echo_tcase(void)
{
	return ts_tcase("echo", 120, TS_TESTS(stale_openssl_errors, drippers_do_not_hold_the_pass));
}

/* Frames over 2^31 bytes over TLS, out and back: (a) one frame of 3 GiB + 5 bytes (more
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
	ts_add(tc, TS_TESTS(echo_3gib_frame, echo_three_1gib_frames));
	return tc;
}
