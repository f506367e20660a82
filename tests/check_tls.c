/* SPDX-License-Identifier: BSD-3-Clause */
/* tls:// integration tests on loopback (docs/design.md, TLS: frames over
 * 2^31 bytes, junk and plain TCP refused, partial writes, no leaks), with real Dask peers over TLS,
 * and a storm of handshakes bounded per loop pass (wss too).
 * Certificates are made at start into a temporary directory by
 * $TW_TOP_SRCDIR/scripts/make-test-certs.sh. TW_TEST_QUICK=1 (valgrind
 * runs) leaves out the 3 GiB case and shrinks the loops. */
#include <stdlib.h>

#include <check.h>

#include "tests/check_tls.h"
#include "tests/support/tls.h"
#include "tests/support/suite.h"

int main(void)
{
	Suite *s = suite_create("tls");
	suite_add_tcase(s, tls_echo_tcase());
	if (!ts_quick())
		suite_add_tcase(s, tls_big_tcase());
	suite_add_tcase(s, tls_reject_tcase());
	suite_add_tcase(s, tls_config_tcase());
	suite_add_tcase(s, tls_close_tcase());
	suite_add_tcase(s, tls_dask_tcase());
	suite_add_tcase(s, tls_storm_tcase());
	return ts_run(s, TS_CERTS);
}
