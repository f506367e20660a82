/* SPDX-License-Identifier: BSD-3-Clause */
/* Interop with Debian's python3-distributed, both ways:
 *   Python's distributed.core.rpc (tests/interop/rpc_client.py) calls the
 *   ops of examples/tw-rpc-server over tcp, and of the same ops served
 *   in-process over tls (mutual, distributed.security.Security), ws, and
 *   tcp with zstd agreed in the handshake;
 *   examples/tw-scheduler-probe against `dask scheduler` over tcp and ws.
 * Programs are found through TW_TOP_BUILDDIR, scripts through
 * TW_TOP_SRCDIR. Every process started here is stopped by the TCase's
 * teardown, also when a test fails. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include <check.h>

#include "tests/check_rpc.h"
#include "tests/support/dask.h"
#include "tests/support/rpc.h"
#include "tests/support/tls.h"
#include "tests/support/suite.h"

#define EXIT_MS 120000

static struct ts_proc server, client, sched;

static void stop_procs(void)
{
	ts_proc_stop(&client);
	ts_proc_stop(&server);
	ts_proc_stop(&sched);
}

static void program(const char *name, char *buf, size_t len)
{
	const char *top = getenv("TW_TOP_BUILDDIR");
	snprintf(buf, len, "%s/examples/%s", top != NULL ? top : ".", name);
}

/* The whole log holds `needle`. */
static int log_has(const struct ts_proc *p, const char *needle)
{
	static char buf[1 << 16];
	FILE *f = fopen(p->log, "r");
	size_t n;
	if (f == NULL)
		return 0;
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = '\0';
	return strstr(buf, needle) != NULL;
}

/* Wait for p to exit (driving h's loop when h is given) and check it
 * exited with 0 and printed `ok`. */
static void expect_success(struct tu *h, struct ts_proc *p, const char *ok)
{
	char tail[2048];
	/* restarts while the peer prints: under load its checks only slow */
	int done = ts_proc_wait_exit(p, h != NULL ? h->base : NULL, EXIT_MS);
	ck_assert_msg(done, "%s did not finish: %s", p->log,
		      ts_proc_log_tail(p, tail, sizeof(tail)));
	ck_assert_msg(WIFEXITED(p->status) && WEXITSTATUS(p->status) == 0 && log_has(p, ok),
		      "status %d: %s", p->status, ts_proc_log_tail(p, tail, sizeof(tail)));
}

/* rpc_client.py against addr; tls: with the test certificates; many: its
 * "echo many" check with that many out-of-band values (0: none). */
static void start_python(const char *addr, int tls, const char *codec, const char *many)
{
	char script[512], big[32], ca[320], cert[320], key[320], env_codec[64];
	char *env[] = {"PYTHONNOUSERSITE=1", env_codec, NULL};
	char *argv[] = {TS_PYTHON,
			script,
			(char *)addr,
			"--big",
			big,
			"--many",
			(char *)(many != NULL ? many : "0"),
			NULL,
			NULL,
			NULL,
			NULL,
			NULL};
	ts_script("rpc_client.py", script, sizeof(script));
	snprintf(big, sizeof(big), "%d", ts_quick() ? 2000000 : 20000000);
	snprintf(env_codec, sizeof(env_codec), "DASK_DISTRIBUTED__COMM__COMPRESSION=%s",
		 codec != NULL ? codec : "False");
	if (tls) {
		snprintf(ca, sizeof(ca), "%s", ts_cert("ca.pem"));
		snprintf(cert, sizeof(cert), "%s", ts_cert("cert.pem"));
		snprintf(key, sizeof(key), "%s", ts_cert("key.pem"));
		argv[7] = "--tls";
		argv[8] = ca;
		argv[9] = cert;
		argv[10] = key;
	}
	ck_assert_int_eq(ts_spawn(&client, argv, env), 0);
}

START_TEST(python_rpc_to_example_tcp)
{
	char prog[512], addr[128], tail[1024];
	char *argv[] = {prog, "tcp://127.0.0.1:0", NULL};
	program("tw-rpc-server", prog, sizeof(prog));
	ck_assert_int_eq(ts_spawn(&server, argv, NULL), 0);
	ck_assert_msg(
		ts_proc_wait_log(&server, NULL, "listening on", addr, sizeof(addr), TS_START_MS),
		"tw-rpc-server: %s", ts_proc_log_tail(&server, tail, sizeof(tail)));
	/* tw-rpc-server keeps every default: a gather-sized message of
	 * 100,000 out-of-band values (200,001 frames) passes (issue 16) */
	start_python(addr, 0, NULL, "100000");
	expect_success(NULL, &client, "ALL OK 14");
}
END_TEST

/* The test server in-process on uri (tls: mutual TLS on the context). */
static void python_to_inprocess(const char *uri, int tls, const char *codec)
{
	struct tu h;
	struct rs s;
	tu_init(&h);
	if (tls)
		tt_use_tls(h.ctx, "ca.pem", "cert.pem", "key.pem");
	if (codec != NULL)
		ck_assert_int_eq(tw_context_set_compression(h.ctx, codec), 0);
	rs_start(&s, h.ctx, h.base, uri);
	start_python(s.addr, tls, codec, NULL);
	expect_success(&h, &client, "ALL OK 13");
	rs_stop(&s);
	tu_fini(&h);
}

START_TEST(python_rpc_to_inprocess_tls)
{
	python_to_inprocess("tls://127.0.0.1:0", 1, NULL);
}
END_TEST

START_TEST(python_rpc_to_inprocess_ws)
{
	python_to_inprocess("ws://127.0.0.1:0", 0, NULL);
}
END_TEST

START_TEST(python_rpc_to_inprocess_zstd)
{
	python_to_inprocess("tcp://127.0.0.1:0", 0, "zstd");
}
END_TEST

/* examples/tw-scheduler-probe against `dask scheduler` (extra: the
 * protocol arguments). */
static void probe(char *const extra[], size_t nextra)
{
	char prog[512], addr[128], tail[2048];
	char *argv[16] = {TS_PYTHON, "-m",        "distributed.cli.dask_scheduler",
			  "--host",  "127.0.0.1", "--no-show"};
	char *pargv[] = {prog, addr, "--seconds", "1", NULL};
	char *env[] = {"PYTHONNOUSERSITE=1", NULL};
	static const char *const lines[] = {"identity: {\"type\"=>\"Scheduler\"",
					    "sent register-client as tw-scheduler-probe-",
					    "scheduler says: stream-start",
					    "sent heartbeat-client 2\n",
					    "sent close-client, close-stream\n",
					    "stream closed by the scheduler\n",
					    "\nprobe ok\n"};
	for (size_t i = 0; i < nextra; i++)
		argv[6 + i] = extra[i];
	ck_assert_int_eq(ts_spawn(&sched, argv, env), 0);
	ck_assert_msg(
		ts_proc_wait_log(&sched, NULL, "Scheduler at:", addr, sizeof(addr), TS_START_MS),
		"scheduler: %s", ts_proc_log_tail(&sched, tail, sizeof(tail)));
	program("tw-scheduler-probe", prog, sizeof(prog));
	ck_assert_int_eq(ts_spawn(&client, pargv, NULL), 0);
	expect_success(NULL, &client, "\nprobe ok\n");
	for (size_t i = 0; i < sizeof(lines) / sizeof(lines[0]); i++)
		ck_assert_msg(log_has(&client, lines[i]), "no \"%s\" in: %s", lines[i],
			      ts_proc_log_tail(&client, tail, sizeof(tail)));
}

START_TEST(probe_scheduler_tcp)
{
	char *extra[] = {"--port", "0", "--dashboard-address", "127.0.0.1:0"};
	probe(extra, 4);
}
END_TEST

START_TEST(probe_scheduler_ws)
{
	char port[16], dash[32];
	char *extra[] = {"--protocol", "ws", "--port", port, "--dashboard-address", dash};
	unsigned p = ts_free_port();
	snprintf(port, sizeof(port), "%u", p);
	snprintf(dash, sizeof(dash), "127.0.0.1:%u", p);
	probe(extra, 6);
}
END_TEST

/* A TLS client refused for a missing certificate leaves a line in
 * tw-echo-server's log, with its address and the reason (issue 17: none,
 * so an operator could not see why workers failed to join). */
START_TEST(echo_server_logs_refused_tls_client)
{
	struct tu h;
	tw_context *bad;
	char prog[512], addr[128], tail[1024], ca[320], cert[320], key[320], why[512];
	char *argv[] = {prog, "--tls-ca",          ca,  "--tls-cert", cert, "--tls-key",
			key,  "tls://127.0.0.1:0", NULL};
	int stage;
	program("tw-echo-server", prog, sizeof(prog));
	tu_init(&h);
	snprintf(ca, sizeof(ca), "%s", ts_cert("ca.pem"));
	snprintf(cert, sizeof(cert), "%s", ts_cert("cert.pem"));
	snprintf(key, sizeof(key), "%s", ts_cert("key.pem"));
	ck_assert_int_eq(ts_spawn(&server, argv, NULL), 0);
	ck_assert_msg(
		ts_proc_wait_log(&server, NULL, "listening on", addr, sizeof(addr), TS_START_MS),
		"tw-echo-server: %s", ts_proc_log_tail(&server, tail, sizeof(tail)));
	bad = tt_context(&h, "ca.pem", NULL, NULL); /* no client certificate */
	ck_assert_int_eq(tt_refused(&h, bad, addr, 1, DU_WAIT_MS, &stage, why, sizeof(why)),
			 TW_ETLS);
	ck_assert_msg(ts_proc_wait_log(&server, NULL, "refused before the handshake", tail,
				       sizeof(tail), DU_WAIT_MS),
		      "no line: %s", ts_proc_log_tail(&server, tail, sizeof(tail)));
	ck_assert_msg(log_has(&server, "peer did not return a certificate") &&
			      log_has(&server, "tls://127.0.0.1:"),
		      "%s", ts_proc_log_tail(&server, tail, sizeof(tail)));
	tt_fini(&h);
}
END_TEST

TCase *rpc_dask_tcase(void)
{
	TCase *tc = ts_tcase("dask", 180, NULL);
	tcase_add_checked_fixture(tc, NULL, stop_procs);
	ts_add(tc, TS_TESTS(python_rpc_to_example_tcp, echo_server_logs_refused_tls_client,
			    python_rpc_to_inprocess_tls, python_rpc_to_inprocess_ws,
			    python_rpc_to_inprocess_zstd, probe_scheduler_tcp, probe_scheduler_ws));
	return tc;
}
