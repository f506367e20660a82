/* SPDX-License-Identifier: BSD-3-Clause */
/* Interop with real Dask (Debian's python3-distributed) over TLS, mutual
 * TLS with the test certificates, host names unchecked (Dask-compatible):
 * a taskwire client against `dask scheduler --protocol tls`, and a Python
 * Dask client against a taskwire echo listener. Every process started is
 * stopped, also when an assertion fails (the fixture's teardown and an
 * atexit handler). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include <check.h>

#include "tests/check_tls.h"
#include "tests/support/tls.h"
#include "tests/support/suite.h"

#define MiB      ((size_t)1 << 20)
#define START_MS 60000
#define ECHO_MS  120000

static void dask_mode(tw_context *ctx)
{
	tw_tls_config *cfg = tt_config("ca.pem", "cert.pem", "key.pem");
	tw_tls_config_set_verify_hostname(cfg, false);
	ck_assert_int_eq(tw_context_set_tls(ctx, cfg), 0);
	tw_tls_config_free(cfg);
}

static void start_scheduler(struct tu *h, struct ts_proc *sched, char *addr, size_t len)
{
	char ca[320], cert[320], key[320], tail[2048];
	snprintf(ca, sizeof(ca), "%s", ts_cert("ca.pem"));
	snprintf(cert, sizeof(cert), "%s", ts_cert("cert.pem"));
	snprintf(key, sizeof(key), "%s", ts_cert("key.pem"));
	/* clang-format off */
	char *argv[] = {TS_PYTHON, "-m", "distributed.cli.dask_scheduler", "--protocol", "tls",
			"--host", "127.0.0.1", "--port", "0", "--dashboard-address", "127.0.0.1:0",
			"--no-show", "--tls-ca-file", ca, "--tls-cert", cert, "--tls-key", key, NULL};
	/* clang-format on */
	ck_assert_int_eq(ts_spawn(sched, argv, NULL), 0);
	ck_assert_msg(ts_proc_wait_log(sched, h->base, "Scheduler at:", addr, len, START_MS),
		      "scheduler did not start: %s", ts_proc_log_tail(sched, tail, sizeof(tail)));
	ck_assert_msg(strncmp(addr, "tls://127.0.0.1:", 16) == 0, "address %s", addr);
}

/* A taskwire client: Dask handshake, identity, echo of 100 MiB. */
START_TEST(taskwire_client_to_dask_scheduler)
{
	struct tu h;
	static struct ts_proc sched;
	struct tu_peer *p;
	size_t size = ts_quick() ? 8 * MiB : 100 * MiB;
	char addr[128];
	tw_block *data;
	tu_init(&h);
	dask_mode(h.ctx);
	start_scheduler(&h, &sched, addr, sizeof(addr));
	p = tt_dask_client(&h, addr);
	tt_assert_scheduler(&h, p, ECHO_MS);
	ck_assert_int_eq(tw_block_new(size, &data), 0);
	ts_fill(tw_block_data(data), size, 77);
	tt_assert_echo(&h, p, data, 0, size, ECHO_MS);
	tw_block_free(data);
	ck_assert_int_eq(p->closed, 0);
	ts_proc_stop(&sched);
	tt_fini(&h);
}
END_TEST

/* A Python Dask client (distributed.comm.connect, Security) against a
 * taskwire tls listener that does the handshake and echoes. */
START_TEST(dask_client_to_taskwire_server)
{
	struct tu h;
	static struct ts_proc py;
	const char *top = getenv("TW_TOP_SRCDIR");
	char addr[128], script[512], ca[320], cert[320], key[320], tail[2048];
	struct tu_peer *sp;
	int failed = 0;
	tt_init(&h);
	dask_mode(h.ctx);
	tt_listen(&h, h.ctx, "tls://127.0.0.1:0", 1, &failed, addr, sizeof(addr));
	snprintf(script, sizeof(script), "%s/tests/tls_dask_peer.py", top ? top : ".");
	snprintf(ca, sizeof(ca), "%s", ts_cert("ca.pem"));
	snprintf(cert, sizeof(cert), "%s", ts_cert("cert.pem"));
	snprintf(key, sizeof(key), "%s", ts_cert("key.pem"));
	char *argv[] = {TS_PYTHON, script, addr, ca, cert, key, NULL};
	ck_assert_int_eq(ts_spawn(&py, argv, NULL), 0);
	ck_assert_msg(ts_proc_wait_exit(&py, h.base, ECHO_MS), "client still running: %s",
		      ts_proc_log_tail(&py, tail, sizeof(tail)));
	ck_assert_msg(WIFEXITED(py.status) && WEXITSTATUS(py.status) == 0, "client failed: %s",
		      ts_proc_log_tail(&py, tail, sizeof(tail)));
	ck_assert_msg(strstr(ts_proc_log_tail(&py, tail, sizeof(tail)), "OK 5") != NULL, "%s",
		      tail);
	ck_assert_int_eq(failed, 0);
	ck_assert_uint_eq(h.nsrv, 1);
	sp = h.srv[0];
	ck_assert_uint_eq(sp->nmsgs, 5);
	ck_assert(tu_wait_flag(&h, &sp->closed, ECHO_MS));
	ck_assert_msg(sp->close_err == 0, "%s", sp->last_error);
	ts_proc_stop(&py);
	tt_fini(&h);
}
END_TEST

static void stop_children(void)
{
	ts_proc_stop_all();
}

TCase *tls_dask_tcase(void)
{
	TCase *tc = ts_tcase("dask", 300, NULL);
	tcase_add_checked_fixture(tc, NULL, stop_children);
	ts_add(tc, TS_TESTS(taskwire_client_to_dask_scheduler, dask_client_to_taskwire_server));
	return tc;
}
