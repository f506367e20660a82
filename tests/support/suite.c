/* SPDX-License-Identifier: BSD-3-Clause */
/* Running a suite program (tests/support/suite.h). */
#include <signal.h>
#include <stdlib.h>

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
