/* SPDX-License-Identifier: BSD-3-Clause */
/* Helpers shared by the unit suites: a seeded PRNG, wire messages built
 * from frame lengths, little-endian words. Header-only; the suites' main
 * is tests/support/suite.h's ts_run. */
#ifndef TW_TESTS_UNIT_H
#define TW_TESTS_UNIT_H

#include <check.h>
#include <endian.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <taskwire/buf.h>
#include <taskwire/msg.h>
#include <taskwire/stats.h>

#include "transport/stream_codec.h"

/* An assertion for hot loops: a passing ck_assert records a checkpoint
 * (a write to Check's log file in fork mode), which made byte-at-a-time
 * tests take tens of seconds. */
#define REQUIRE(expr)                                                                              \
	do {                                                                                       \
		if (!(expr))                                                                       \
			ck_abort_msg("Assertion '%s' failed", #expr);                              \
	} while (0)

/* splitmix64: reproducible random numbers from a seed. */
static inline uint64_t rnd_next(uint64_t *s)
{
	uint64_t z = (*s += UINT64_C(0x9e3779b97f4a7c15));
	z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
	z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
	return z ^ (z >> 31);
}

/* A number in [lo, hi]. */
static inline size_t rnd_range(uint64_t *s, size_t lo, size_t hi)
{
	return lo + (size_t)(rnd_next(s) % (uint64_t)(hi - lo + 1));
}

/* Byte j of frame i in every generated message. */
static inline uint8_t pattern(size_t i, size_t j)
{
	return (uint8_t)((i * 31 + j) % 251);
}

static inline void put_le64(uint8_t *p, uint64_t v)
{
	v = htole64(v);
	memcpy(p, &v, 8);
}

/* A message on the wire: prelude, then the frames filled with pattern(). */
struct wire {
	uint8_t *bytes;
	size_t len;      /* whole message */
	size_t prelude;  /* bytes before frame 0 */
	size_t n;        /* frames */
	size_t *offsets; /* where frame i starts in bytes */
	size_t *lens;
};

static inline void wire_make(struct wire *w, const size_t *lens, size_t n)
{
	tw_slice *f = calloc(n, sizeof(*f));
	size_t off;
	ck_assert_ptr_nonnull(f);
	w->n = n;
	w->prelude = tw__stream_prelude_bytes(n);
	w->len = w->prelude;
	for (size_t i = 0; i < n; i++) {
		f[i].len = lens[i];
		w->len += lens[i];
	}
	w->bytes = malloc(w->len);
	w->offsets = malloc(n * sizeof(size_t));
	w->lens = malloc(n * sizeof(size_t));
	ck_assert(w->bytes != NULL && w->offsets != NULL && w->lens != NULL);
	tw__stream_encode_prelude(f, n, w->bytes);
	off = w->prelude;
	for (size_t i = 0; i < n; i++) {
		w->offsets[i] = off;
		w->lens[i] = lens[i];
		for (size_t j = 0; j < lens[i]; j++)
			w->bytes[off + j] = pattern(i, j);
		off += lens[i];
	}
	free(f);
}

/* The frames of m are those of w, byte for byte. */
static inline void wire_check_msg(const tw_msg *m, const struct wire *w)
{
	ck_assert_uint_eq(tw_msg_nframes(m), w->n);
	for (size_t i = 0; i < w->n; i++) {
		const tw_slice *f = tw_msg_frame(m, i);
		REQUIRE(f->len == w->lens[i]);
		if (f->len > 0)
			REQUIRE(memcmp(tw_slice_data(f), w->bytes + w->offsets[i], f->len) == 0);
	}
}

static inline void wire_free(struct wire *w)
{
	free(w->bytes);
	free(w->offsets);
	free(w->lens);
	memset(w, 0, sizeof(*w));
}

/* Bytes from hex digits (spaces allowed: "82 03 61 62 63")
 * into out of cap bytes; returns the count. */
static inline size_t hex_bytes(const char *hex, uint8_t *out, size_t cap)
{
	size_t n = 0;
	for (const char *p = hex; *p != '\0'; p++) {
		unsigned v;
		if (*p == ' ')
			continue;
		ck_assert(n < 2 * cap && sscanf(p, "%1x", &v) == 1);
		out[n / 2] = (uint8_t)(n % 2 ? (out[n / 2] << 4) | v : v);
		n++;
	}
	ck_assert(n % 2 == 0);
	return n / 2;
}

static inline tw_stats stats_now(void)
{
	tw_stats st;
	tw_stats_global(&st, sizeof(st));
	return st;
}

#endif
