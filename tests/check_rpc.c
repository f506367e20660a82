/* SPDX-License-Identifier: BSD-3-Clause */
/* RPC layer tests (docs/design.md, Handshake and server; RPC client and
 * streams): tw_server ops, replies,
 * errors and deferred replies; tw_pool calls, timeouts, limits, idle
 * comms and teardown; tw_rpc_call_sync; streams and the batched sender;
 * interop with Debian's python3-distributed both ways (Python's rpc
 * against a taskwire server over tcp, tls and ws; examples/
 * tw-scheduler-probe against `dask scheduler` over tcp and ws).
 * TW_TEST_QUICK=1 (valgrind runs) shrinks the large payloads. TLS
 * certificates are made at start by scripts/make-test-certs.sh. */
#include <signal.h>
#include <stdlib.h>

#include <check.h>

#include "tests/check_rpc.h"
#include "tests/support/tls.h"
#include "tests/support/suite.h"

int main(void)
{
	return ts_main("rpc", TS_CERTS | TS_NO_SIGPIPE,
		       TS_CASES(rpc_server_tcase(), rpc_timeout_tcase(), rpc_pool_tcase(),
				rpc_sync_tcase(), rpc_stream_tcase(), rpc_dask_tcase()));
}
