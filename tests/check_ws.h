/* SPDX-License-Identifier: BSD-3-Clause */
/* The test cases of check_ws, by source file. */
#ifndef TW_TESTS_CHECK_WS_H
#define TW_TESTS_CHECK_WS_H

#include <check.h>

TCase *ws_echo_tcase(void);    /* tests/check_ws_echo.c */
TCase *ws_wire_tcase(void);    /* tests/check_ws_bad.c: good and bad frames */
TCase *ws_upgrade_tcase(void); /* tests/check_ws_bad.c: bad upgrades, bad servers */
TCase *ws_peers_tcase(void);   /* tests/check_ws_peers.c: Python websockets */
TCase *ws_dask_tcase(void);    /* tests/check_ws_peers.c: real Dask over ws, wss */

#endif
