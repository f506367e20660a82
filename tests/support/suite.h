/* SPDX-License-Identifier: BSD-3-Clause */
/* Running a suite program: every tests/check_*.c main ends in ts_run, so
 * the runner's settings (CK_VERBOSITY, CK_RUN_CASE, CK_RUN_SUITE from the
 * environment) and the process-wide setup are the same in every suite.
 * TW_TEST_ONLY="name1 name2" (START_TEST names, separated by white space) keeps
 * only those tests among the ones ts_tcase, ts_add and ts_add_loop add
 * (tests/netns-check.sh runs chosen cases across a link). Unset or empty:
 * all. */
#ifndef TW_TESTS_SUPPORT_SUITE_H
#define TW_TESTS_SUPPORT_SUITE_H

#include <check.h>

enum ts_run_flags {
	/* Make the test certificates before the tests (ts_certs_make, in
	 * the parent, before Check forks) and remove them after. */
	TS_CERTS = 1 << 0,
	/* Ignore SIGPIPE: raw peers and proxies write to sockets that the
	 * code under test closed. Without it SIGPIPE keeps its default
	 * action, which shows that the library itself never raises it. */
	TS_NO_SIGPIPE = 1 << 1,
};

/* Run every test of s (freed here) with `flags` (enum ts_run_flags).
 * Returns the exit status for the test driver: EXIT_SUCCESS when no test
 * failed. */
int ts_run(Suite *s, unsigned flags);

/* A NULL-terminated array of tests (START_TEST names), for the calls
 * below: TS_TESTS(a, b, c). */
#define TS_TESTS(...) ((const TTest *const[]){__VA_ARGS__, NULL})
/* A NULL-terminated array of TCases, for ts_main. */
#define TS_CASES(...) ((TCase *const[]){__VA_ARGS__, NULL})

/* A TCase called name holding the tests of tests[] (NULL-terminated, or
 * tests NULL for none yet), in that order. timeout_s > 0 sets its
 * timeout (tcase_set_timeout); 0 leaves Check's default
 * (CK_DEFAULT_TIMEOUT, 120 s under make check). */
TCase *ts_tcase(const char *name, int timeout_s, const TTest *const tests[]);
/* Add the tests of tests[] to tc, in order. */
void ts_add(TCase *tc, const TTest *const tests[]);
/* Add the tests of tests[] to tc, in order, each as a loop test run once
 * for every _i in [0, n). */
void ts_add_loop(TCase *tc, int n, const TTest *const tests[]);
/* A suite called name of the TCases of cases[] (NULL-terminated, in that
 * order), run with ts_run: a suite's whole main is
 * `return ts_main("x", flags, TS_CASES(ts_tcase(...), ...));`. */
int ts_main(const char *name, unsigned flags, TCase *const cases[]);
/* ts_main of one TCase with the suite's name: ts_tcase(name, timeout_s,
 * tests). */
int ts_main_one(const char *name, int timeout_s, unsigned flags, const TTest *const tests[]);

#endif
