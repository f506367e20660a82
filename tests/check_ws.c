/* SPDX-License-Identifier: BSD-3-Clause */
/* ws:// and wss:// integration tests on loopback (docs/design.md,
 * WebSocket; RFC 6455 and the Autobahn testsuite groups), with
 * independent peers: raw sockets speaking hand-written frames, Python `websockets` (Debian's 10.4)
 * and real Dask (python3-distributed) over ws and wss. Certificates are made at start by
 * $TW_TOP_SRCDIR/scripts/make-test-certs.sh into a temporary directory. TW_TEST_QUICK=1 (valgrind
 * runs) shrinks the large messages and leaves out the Python peers. */
#include <signal.h>
#include <stdlib.h>

#include <check.h>

#include "tests/check_ws.h"
#include "tests/support/tls.h"
#include "tests/support/suite.h"

int main(void)
{
	Suite *s = suite_create("ws");
	suite_add_tcase(s, ws_echo_tcase());
	suite_add_tcase(s, ws_wire_tcase());
	suite_add_tcase(s, ws_upgrade_tcase());
	if (!ts_quick()) {
		suite_add_tcase(s, ws_peers_tcase());
		suite_add_tcase(s, ws_dask_tcase());
	}
	return ts_run(s, TS_CERTS | TS_NO_SIGPIPE); /* raw TLS clients write to closed sockets */
}
