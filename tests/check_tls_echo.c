/* SPDX-License-Identifier: BSD-3-Clause */
/* What only tls has of echo (mutual TLS; the shapes every transport
 * carries are in tests/check_conformance.c): an OpenSSL error queue left
 * dirty by the application, and frames larger than 2^31 bytes (OpenSSL takes int lengths, so
 * SSL_read and SSL_write must get pieces of at most INT_MAX). */
#include <stdlib.h>
#include <string.h>

#include <check.h>
#include <openssl/err.h>

#include "tests/check_tls.h"
#include "tests/support/tls.h"
#include "tests/support/suite.h"

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

TCase *tls_echo_tcase(void)
{
	return ts_tcase("echo", 120, TS_TESTS(stale_openssl_errors));
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
