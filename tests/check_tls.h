/* SPDX-License-Identifier: BSD-3-Clause */
/* The test cases of check_tls, by source file. */
#ifndef TW_TESTS_CHECK_TLS_H
#define TW_TESTS_CHECK_TLS_H

#include <check.h>

TCase *tls_echo_tcase(void);   /* tests/check_tls_echo.c */
TCase *tls_big_tcase(void);    /* tests/check_tls_echo.c: 3 GiB */
TCase *tls_reject_tcase(void); /* tests/check_tls_reject.c */
TCase *tls_config_tcase(void); /* tests/check_tls_reject.c */
TCase *tls_close_tcase(void);  /* tests/check_tls_close.c */
TCase *tls_dask_tcase(void);   /* tests/check_tls_dask.c */
TCase *tls_storm_tcase(void);  /* tests/check_tls_storm.c */

#endif
