/* SPDX-License-Identifier: BSD-3-Clause */
/* The test byte pattern (tests/support/pattern.h): copied from a table
 * of whole periods, so filling and checking gigabytes stays cheap. */
#include <string.h>

#include <check.h>

#include "tests/support/pattern.h"

#define CHUNK ((size_t)TS_PERIOD * 256)

/* One period of offset room, then CHUNK bytes: table + (seed % period)
 * starts the pattern of seed. */
static const uint8_t *table(void)
{
	static uint8_t t[TS_PERIOD + CHUNK];
	static int ready;
	if (!ready) {
		for (size_t k = 0; k < sizeof(t); k++)
			t[k] = ts_pattern_byte(k, 0);
		ready = 1;
	}
	return t;
}

void ts_fill(uint8_t *p, size_t n, unsigned seed)
{
	const uint8_t *t = table() + seed % TS_PERIOD;
	for (size_t i = 0; i < n; i += CHUNK)
		memcpy(p + i, t, n - i < CHUNK ? n - i : CHUNK);
}

long long ts_check(const uint8_t *p, size_t n, unsigned seed)
{
	const uint8_t *t = table() + seed % TS_PERIOD;
	for (size_t i = 0; i < n; i += CHUNK) {
		size_t k = n - i < CHUNK ? n - i : CHUNK;
		if (memcmp(p + i, t, k) == 0)
			continue;
		for (size_t j = 0; j < k; j++)
			if (p[i + j] != t[j])
				return (long long)(i + j);
	}
	return -1;
}

tw_msg *ts_msg_pattern(const size_t *lens, size_t nf, unsigned seed)
{
	tw_msg *m;
	ck_assert_int_eq(tw_msg_new(&m), 0);
	for (size_t i = 0; i < nf; i++) {
		tw_slice s = lens[i] > 0 ? ts_pattern_slice(lens[i], seed + (unsigned)i)
					 : (tw_slice){NULL, 0, 0};
		ck_assert_int_eq(tw_msg_append(m, &s), 0);
		tw_block_free(s.block);
	}
	return m;
}

int ts_msg_matches(const tw_msg *m, const size_t *lens, size_t nf, unsigned seed)
{
	if (tw_msg_nframes(m) != nf)
		return 0;
	for (size_t i = 0; i < nf; i++) {
		const tw_slice *f = tw_msg_frame(m, i);
		if (f->len != lens[i])
			return 0;
		if (f->len > 0 && ts_check(tw_slice_data(f), f->len, seed + (unsigned)i) != -1)
			return 0;
	}
	return 1;
}

tw_slice ts_pattern_slice(size_t n, unsigned seed)
{
	tw_slice s = {NULL, 0, n};
	ck_assert_int_eq(tw_block_new(n, &s.block), 0);
	ts_fill(tw_block_data(s.block), n, seed);
	return s;
}
