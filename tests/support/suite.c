/* SPDX-License-Identifier: BSD-3-Clause */
/* Running a suite program (tests/support/suite.h). */
#include <ctype.h>
#include <signal.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "tests/support/certs.h"
#include "tests/support/suite.h"

int ts_run(Suite *s, unsigned flags)
{
	SRunner *sr = srunner_create(s);
	int failed;
	if (flags & TS_NO_SIGPIPE)
		signal(SIGPIPE, SIG_IGN);
	if (flags & TS_CERTS)
		ts_certs_make();
	srunner_run_all(sr, CK_ENV); /* CK_VERBOSITY=verbose lists every test */
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	if (flags & TS_CERTS)
		ts_certs_remove();
	return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}

TCase *ts_tcase(const char *name, int timeout_s, const TTest *const tests[])
{
	TCase *tc = tcase_create(name);
	if (timeout_s > 0)
		tcase_set_timeout(tc, timeout_s);
	if (tests != NULL)
		ts_add(tc, tests);
	return tc;
}

/* 1 unless TW_TEST_ONLY is set and does not name t. */
static int wanted(const TTest *t)
{
	const char *only = getenv("TW_TEST_ONLY"), *p;
	size_t n = strlen(t->name);
	if (only == NULL || *only == '\0')
		return 1;
	for (p = only; (p = strstr(p, t->name)) != NULL; p += n)
		if ((p == only || isspace((unsigned char)p[-1])) &&
		    (p[n] == '\0' || isspace((unsigned char)p[n])))
			return 1;
	return 0;
}

void ts_add(TCase *tc, const TTest *const tests[])
{
	for (size_t i = 0; tests[i] != NULL; i++)
		if (wanted(tests[i]))
			tcase_add_test(tc, tests[i]);
}

void ts_add_loop(TCase *tc, int n, const TTest *const tests[])
{
	for (size_t i = 0; tests[i] != NULL; i++)
		if (wanted(tests[i]))
			tcase_add_loop_test(tc, tests[i], 0, n);
}

int ts_main(const char *name, unsigned flags, TCase *const cases[])
{
	Suite *s = suite_create(name);
	for (size_t i = 0; cases[i] != NULL; i++)
		suite_add_tcase(s, cases[i]);
	return ts_run(s, flags);
}

int ts_main_one(const char *name, int timeout_s, unsigned flags, const TTest *const tests[])
{
	return ts_main(name, flags, TS_CASES(ts_tcase(name, timeout_s, tests)));
}
