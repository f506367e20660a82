/* SPDX-License-Identifier: BSD-3-Clause */
/* TCP integration tests on loopback: real sockets, one process playing
 * both sides on one event_base (and one test on a context's own loop
 * thread). TW_TEST_QUICK=1 shrinks the 1 GiB tests to 64 MiB (for
 * valgrind). SIGPIPE keeps its default action: a write to a closed peer
 * must never raise it. */
#include <stdlib.h>

#include <check.h>

#include "tests/check_tcp.h"
#include "tests/support/suite.h"

int main(void)
{
	return ts_main("tcp", 0,
		       TS_CASES(tcp_echo_tcase(), tcp_errors_tcase(), tcp_flow_tcase(),
				tcp_budget_tcase()));
}
