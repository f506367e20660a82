/* SPDX-License-Identifier: BSD-3-Clause */
/* A storm of TLS handshakes does not hold the loop (issue 17, breaker17
 * b17-6: 200 clients connecting at once made one pass of 433 ms). A
 * handshake step (one SSL_do_handshake: an RSA signature is 1-2 ms) starts
 * only while the loop's pass has time, and the pass's first step always
 * does (core/pass.h, tw__pass_step); a step that waits is run on a later
 * pass by the loop itself, whatever its socket shows. Here every pass's
 * time is spent from its start (tw__pass_spend), as on a loaded machine:
 * each pass of the test's loop starts one step (so no two handshakes end
 * in one pass), and every handshake still ends, its comm echoing. */
#include <stdio.h>

#include <check.h>

#include "core/pass.h"
#include "tests/check_tls.h"
#include "tests/support/suite.h"
#include "tests/support/tls.h"
#include "tests/support/tran.h"

#define STORM (ts_quick() ? 8 : 32)

struct storm {
	struct tu h;
	struct tu_peer *cli[32];
	int err[32];
};

/* Handshakes ended so far: the server's (accepted comms) and the
 * clients' (connect callbacks, failed or not). */
static size_t ended(const struct storm *s)
{
	size_t n = s->h.nsrv;
	for (int i = 0; i < STORM; i++)
		n += s->err[i] != 1;
	return n;
}

/* tls: one pass ends at most one handshake, either side. wss: the
 * upgrade after each TLS handshake is no step, so only the end counts. */
START_TEST(storm_one_step_per_pass)
{
	int t = _i == 0 ? TS_TLS : TS_WSS;
	struct storm s;
	size_t done = 0, want = 2 * (size_t)STORM;
	long long deadline;
	ts_tran_init(&s.h, t);
	/* under valgrind, 128 steps one a pass take longer than 10 s */
	tw_context_set_connect_timeout_ms(s.h.ctx, 600000);
	tw_context_set_tls_handshake_timeout_ms(s.h.ctx, 600000);
	ts_tran_listen(&s.h, t);
	tw__pass_spend(1);
	for (int i = 0; i < STORM; i++)
		ck_assert_int_eq(tu_connect_async(&s.h, s.h.addr, &s.cli[i], &s.err[i]), 0);
	deadline = ts_now_ms() + TU_WAIT_MS;
	while (done < want) {
		size_t now;
		ck_assert_msg(ts_now_ms() < deadline, "%s: %zu of %zu handshakes ended, then none",
			      ts_tran_scheme(t), done, want);
		event_base_loop(s.h.base, EVLOOP_ONCE);
		now = ended(&s);
		if (t == TS_TLS)
			ck_assert_msg(now - done <= 1, "%zu handshakes ended in one pass",
				      now - done);
		if (now != done)
			deadline = ts_now_ms() + TU_WAIT_MS;
		done = now;
	}
	tw__pass_spend(0);
	ck_assert_uint_eq(s.h.nsrv, (size_t)STORM);
	for (int i = 0; i < STORM; i++) {
		ck_assert_msg(s.err[i] == 0, "connect %d: %s", i, tw_strerror(s.err[i]));
		s.cli[i]->keep = 1;
		tt_canary(s.cli[i], (unsigned)i);
	}
	tt_fini(&s.h);
}
END_TEST

TCase *tls_storm_tcase(void)
{
	TCase *tc = ts_tcase("storm", 120, NULL);
	ts_add_loop(tc, 2, TS_TESTS(storm_one_step_per_pass));
	return tc;
}
