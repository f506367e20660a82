/* SPDX-License-Identifier: BSD-3-Clause */
/* The test cases of check_tcp, one constructor per source file. */
#ifndef TW_TESTS_CHECK_TCP_H
#define TW_TESTS_CHECK_TCP_H

#include <check.h>

TCase *tcp_echo_tcase(void);   /* tests/check_tcp_echo.c */
TCase *tcp_errors_tcase(void); /* tests/check_tcp_errors.c */
TCase *tcp_flow_tcase(void);   /* tests/check_tcp_flow.c */
TCase *tcp_budget_tcase(void); /* tests/check_tcp_budget.c */

#endif
