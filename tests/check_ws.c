/* SPDX-License-Identifier: BSD-3-Clause */
/* ws:// and wss:// integration tests on loopback (DESIGN.md, Wire
 * protocol: WebSocket; bug cases BH-23..BH-38 and the Autobahn groups of
 * bug-cases.md), with independent peers: raw sockets speaking bytes
 * from the bug cases, Python `websockets` (Debian's 10.4) and real Dask
 * (python3-distributed) over ws and wss. Certificates are made at start
 * by $TW_TOP_SRCDIR/scripts/make-test-certs.sh into a temporary
 * directory. TW_TEST_QUICK=1 (valgrind runs) shrinks the large messages
 * and leaves out the Python peers. */
#include <signal.h>
#include <stdlib.h>

#include <check.h>

#include "tests/check_ws.h"
#include "tests/tls_util.h"

int main(void)
{
	Suite *s = suite_create("ws");
	SRunner *sr;
	int failed;
	signal(SIGPIPE, SIG_IGN); /* raw TLS clients write to closed sockets */
	ts_certs_make();
	suite_add_tcase(s, ws_echo_tcase());
	suite_add_tcase(s, ws_wire_tcase());
	suite_add_tcase(s, ws_upgrade_tcase());
	if (!ts_quick()) {
		suite_add_tcase(s, ws_peers_tcase());
		suite_add_tcase(s, ws_dask_tcase());
	}
	sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	ts_certs_remove();
	return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
