/* SPDX-License-Identifier: BSD-3-Clause */
/* Reading the process's own sizes from /proc/self/status. Header-only. */
#ifndef TW_TESTS_PROC_STATUS_H
#define TW_TESTS_PROC_STATUS_H

#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* A size line of /proc/self/status, in bytes: "VmRSS" (resident),
 * "VmData" (writable private mappings: what RLIMIT_DATA and strict
 * overcommit charge). */
static inline uint64_t status_bytes(const char *field)
{
	FILE *f = fopen("/proc/self/status", "r");
	char line[256];
	unsigned long long kb = 0;
	size_t n = strlen(field);
	ck_assert_ptr_nonnull(f);
	while (fgets(line, sizeof(line), f) != NULL)
		if (strncmp(line, field, n) == 0 && line[n] == ':' &&
		    sscanf(line + n + 1, "%llu kB", &kb) == 1)
			break;
	fclose(f);
	return (uint64_t)kb * 1024;
}

/* How many bytes of [p, p + len) are mapped writable, from
 * /proc/self/maps: what a block has committed, exactly, and unlike
 * VmData unaffected by other memory of the process (or of valgrind). */
static inline size_t writable_bytes(const void *p, size_t len)
{
	FILE *f = fopen("/proc/self/maps", "r");
	uintptr_t lo = (uintptr_t)p, hi = lo + len, a, b;
	char perms[8], line[512];
	size_t n = 0;
	ck_assert_ptr_nonnull(f);
	while (fgets(line, sizeof(line), f) != NULL) {
		if (sscanf(line, "%lx-%lx %7s", &a, &b, perms) != 3 || perms[1] != 'w')
			continue;
		if (a < lo)
			a = lo;
		if (b > hi)
			b = hi;
		if (a < b)
			n += b - a;
	}
	fclose(f);
	return n;
}

#endif
