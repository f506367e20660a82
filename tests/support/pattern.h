/* SPDX-License-Identifier: BSD-3-Clause */
/* The one byte pattern of the test suites, the same the Python peers in
 * tests/interop write and check: byte i of a buffer with seed s is
 * (i + s) mod 251. 251 is prime and not a power of two, so a frame
 * shifted, cut or swapped with another shows as a mismatch. */
#ifndef TW_TESTS_SUPPORT_PATTERN_H
#define TW_TESTS_SUPPORT_PATTERN_H

#include <stddef.h>
#include <stdint.h>

#include <taskwire/taskwire.h>

#define TS_PERIOD 251

/* Byte i of the pattern with seed s. */
static inline uint8_t ts_pattern_byte(size_t i, unsigned seed)
{
	return (uint8_t)((i + seed) % TS_PERIOD);
}

/* Fill p[0..n) with the pattern of seed. */
void ts_fill(uint8_t *p, size_t n, unsigned seed);
/* The first offset of p[0..n) that differs from the pattern of seed, or
 * -1 when all n bytes match. */
long long ts_check(const uint8_t *p, size_t n, unsigned seed);

/* A message of nf frames with lengths lens[i], frame i filled with seed
 * seed + i. Asserts on failure. */
tw_msg *ts_msg_pattern(const size_t *lens, size_t nf, unsigned seed);
/* 1 when m has nf frames of lengths lens filled with seed + i. */
int ts_msg_matches(const tw_msg *m, const size_t *lens, size_t nf, unsigned seed);
/* A block of n pattern bytes (seed), as a slice the caller owns. */
tw_slice ts_pattern_slice(size_t n, unsigned seed);

#endif
