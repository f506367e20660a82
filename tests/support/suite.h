/* SPDX-License-Identifier: BSD-3-Clause */
/* Running a suite program: every tests/check_*.c main ends in ts_run, so
 * the runner's settings (CK_VERBOSITY, CK_RUN_CASE, CK_RUN_SUITE from the
 * environment) and the process-wide setup are the same in every suite. */
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

#endif
