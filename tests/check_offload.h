/* SPDX-License-Identifier: BSD-3-Clause */
/* The test cases of check_offload, one constructor per source file. */
#ifndef TW_TESTS_CHECK_OFFLOAD_H
#define TW_TESTS_CHECK_OFFLOAD_H

#include <check.h>

TCase *offload_order_tcase(void); /* tests/check_offload.c: order, threads, thresholds */
/* tests/check_offload_life.c: close, free, pause in the pool ("life");
 * decoding, context free, errors, server ("life-other") */
TCase *offload_life_tcase(void);
TCase *offload_life_other_tcase(void);

#endif
