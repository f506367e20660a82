/* SPDX-License-Identifier: BSD-3-Clause */
/* What OpenSSL holds, by allocation site (bench only, issue 20). */
#ifndef TW_BENCH_OPENSSL_SITES_H
#define TW_BENCH_OPENSSL_SITES_H

#include <stddef.h>
#include <stdio.h>

/* Count OpenSSL's allocations by the source line that made them
 * (CRYPTO_set_mem_functions): call before anything uses OpenSSL. Each
 * allocation then carries a 16-byte header, which the process's heap and
 * RSS include. 0, or -1 when OpenSSL already allocated. */
int tw_bench_sites_start(void);

/* To f: OpenSSL's live bytes and allocations added since the last call,
 * divided by n (per comm), the top `top` sites by bytes; the first call
 * only takes the baseline (nothing printed). No-op unless started. */
void tw_bench_sites_report(FILE *f, const char *who, size_t n, size_t top);

#endif
