/* SPDX-License-Identifier: BSD-3-Clause */
/* The test cases of check_rpc, by source file. */
#ifndef TW_TESTS_CHECK_RPC_H
#define TW_TESTS_CHECK_RPC_H

#include <check.h>

TCase *rpc_server_tcase(void);  /* tests/check_rpc_server.c: ops in-process */
TCase *rpc_timeout_tcase(void); /* tests/check_rpc_pool.c: timeouts, errors */
TCase *rpc_pool_tcase(void);    /* tests/check_rpc_pool.c: limits, idle, free */
TCase *rpc_sync_tcase(void);    /* tests/check_rpc_sync.c: tw_rpc_call_sync */
TCase *rpc_stream_tcase(void);  /* tests/check_rpc_stream.c */
TCase *rpc_dask_tcase(void);    /* tests/check_rpc_dask.c: real Dask peers */

#endif
