/* SPDX-License-Identifier: BSD-3-Clause */
/* Unit tests: the stream framing prelude codec (transport/stream_codec.c):
 * encode and decode back, every rejection with its own code before the
 * lengths array is allocated, sticky errors, and decoding fed one byte at
 * a time and at random split points. */
#include <check.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <taskwire/error.h>

#include "tests/unit.h"
#include "tests/support/suite.h"
#include "transport/stream_codec.h"

#define MAX_BYTES  ((uint64_t)1 << 20)
#define MAX_FRAMES 1024

/* Feed p one byte at a time through want/advance; returns the first
 * non-zero code and the bytes consumed up to and including it. */
static int feed_bytewise(struct tw__sdec *d, const uint8_t *p, size_t n, size_t *used)
{
	int rv = 0;
	for (*used = 0; *used < n && rv == 0; (*used)++) {
		uint8_t *dst;
		size_t want;
		tw__sdec_want(d, &dst, &want);
		REQUIRE(dst != NULL);
		REQUIRE(want >= 1);
		*dst = p[*used];
		rv = tw__sdec_advance(d, 1);
	}
	return rv;
}

START_TEST(encode_bytes)
{
	/* total = 8 + 8 * 3 + 5, N = 3, lengths 2, 0, 3 */
	static const char *hex = "2500000000000000 0300000000000000 0200000000000000"
				 "0000000000000000 0300000000000000";
	tw_slice f[3] = {{NULL, 0, 2}, {NULL, 0, 0}, {NULL, 0, 3}};
	uint8_t out[40], expect[40];
	ck_assert_uint_eq(hex_bytes(hex, expect, sizeof(expect)), 40);
	ck_assert_uint_eq(tw__stream_prelude_bytes(3), 40);
	ck_assert_uint_eq(tw__stream_prelude_bytes(1), TW__STREAM_MIN_WIRE);
	tw__stream_encode_prelude(f, 3, out);
	ck_assert_mem_eq(out, expect, sizeof(expect));
}
END_TEST

/* Encode a prelude, then decode it back with bytes of the frames after it:
 * the decoder stops at the prelude's end. */
START_TEST(roundtrip)
{
	size_t lens[] = {2, 0, 3, 70000, 1};
	struct wire w;
	struct tw__sdec d;
	size_t used;
	wire_make(&w, lens, 5);
	tw__sdec_init(&d, MAX_BYTES, MAX_FRAMES);
	ck_assert_int_eq(tw__sdec_feed(&d, w.bytes, w.len, &used), 1);
	ck_assert_uint_eq(used, w.prelude);
	ck_assert_int_eq(d.state, SDEC_DONE);
	ck_assert_uint_eq(d.total, w.len - 8);
	ck_assert_uint_eq(d.n, 5);
	for (size_t i = 0; i < 5; i++)
		ck_assert_uint_eq(d.lens[i], lens[i]);
	ck_assert_uint_eq(tw__sdec_payload(&d), 70006);
	/* Done is sticky too: nothing more is consumed. */
	ck_assert_int_eq(tw__sdec_feed(&d, w.bytes, 8, &used), 1);
	ck_assert_uint_eq(used, 0);
	ck_assert_int_eq(tw__sdec_advance(&d, 0), 1);
	/* reset: the next prelude decodes the same way. */
	tw__sdec_reset(&d);
	ck_assert_int_eq(d.state, SDEC_TOTAL);
	ck_assert_uint_eq(d.max_message_bytes, MAX_BYTES);
	ck_assert_uint_eq(d.max_frames, MAX_FRAMES);
	ck_assert_int_eq(feed_bytewise(&d, w.bytes, w.len, &used), 1);
	ck_assert_uint_eq(used, w.prelude);
	ck_assert_uint_eq(d.lens[3], 70000);
	tw__sdec_fini(&d);
	wire_free(&w);
}
END_TEST

/* The limits themselves are accepted. */
START_TEST(limits_inclusive)
{
	struct tw__sdec d;
	uint8_t p[24], *buf;
	size_t used;
	put_le64(p, MAX_BYTES);
	put_le64(p + 8, 1);
	put_le64(p + 16, MAX_BYTES - 16);
	tw__sdec_init(&d, MAX_BYTES, MAX_FRAMES);
	ck_assert_int_eq(tw__sdec_feed(&d, p, 24, &used), 1);
	ck_assert_uint_eq(d.lens[0], MAX_BYTES - 16);
	tw__sdec_fini(&d);
	/* N = max_frames empty frames. */
	buf = calloc(MAX_FRAMES + 2, 8);
	ck_assert_ptr_nonnull(buf);
	put_le64(buf, 8 + 8 * (uint64_t)MAX_FRAMES);
	put_le64(buf + 8, MAX_FRAMES);
	tw__sdec_init(&d, MAX_BYTES, MAX_FRAMES);
	ck_assert_int_eq(tw__sdec_feed(&d, buf, 8 * (MAX_FRAMES + 2), &used), 1);
	ck_assert_uint_eq(d.n, MAX_FRAMES);
	ck_assert_uint_eq(tw__sdec_payload(&d), 0);
	tw__sdec_fini(&d);
	free(buf);
}
END_TEST

/* A bad prelude: its u64 words, the code, how many bytes are consumed up
 * to the error, and whether the lengths array may exist by then. */
struct bad {
	const char *name;
	uint64_t w[5];
	size_t nw;
	int code;
	size_t used;
	int lens_allocated;
};

#define GIB  (UINT64_C(1) << 30)
#define WRAP UINT64_C(0xfffffffffffffff0)

static const struct bad bads[] = {
	{"N = 0", {8, 0}, 2, TW_ENOFRAMES, 16, 0},
	{"N = 0, room for 1", {16, 0, 0}, 3, TW_ENOFRAMES, 16, 0},
	{"N > max_frames", {8 + 8 * 1025, 1025}, 2, TW_ETOOMANY, 16, 0},
	{"N huge", {MAX_BYTES, UINT64_MAX}, 2, TW_ETOOMANY, 16, 0},
	/* Past the message limit: f0 ff ff ff ff ff ff ff, and a legal-looking 1 GiB frame */
	{"total f0ff..ff", {WRAP}, 1, TW_ETOOBIG, 8, 0},
	{"1 GiB frame", {16 + GIB, 1, GIB}, 3, TW_ETOOBIG, 8, 0},
	{"total = max + 1", {MAX_BYTES + 1}, 1, TW_ETOOBIG, 8, 0},
	{"total < 8", {7}, 1, TW_ELENGTH, 8, 0},
	{"total too small for N", {16, 2}, 2, TW_ELENGTH, 16, 0},
	{"total 8 for N = 1", {8, 1}, 2, TW_ELENGTH, 16, 0},
	/* 0x20 + 0xff..f0 wraps to 16, exactly the room total leaves */
	{"length sum wraps", {8 + 16 + 16, 2, 0x20, WRAP}, 4, TW_ELENGTH, 24, 1},
	/* 8 + (2^64 - 1) + 9 wraps to 16 */
	{"length sum wraps late", {8 + 24 + 16, 3, 8, UINT64_MAX, 9}, 5, TW_ELENGTH, 32, 1},
	{"sum below total", {8 + 16 + 10, 2, 3, 4}, 4, TW_ELENGTH, 32, 1},
	{"sum above total", {8 + 16 + 10, 2, 6, 5}, 4, TW_ELENGTH, 32, 1},
	{"single length too long", {8 + 8 + 4, 1, 5}, 3, TW_ELENGTH, 24, 1},
};
#define N_BAD ((int)(sizeof(bads) / sizeof(bads[0])))

/* The bytes of a bad prelude. */
static size_t bad_bytes(const struct bad *c, uint8_t *out)
{
	for (size_t i = 0; i < c->nw; i++)
		put_le64(out + 8 * i, c->w[i]);
	return 8 * c->nw;
}

/* want_used: where the error is seen (a whole feed takes all the lengths
 * in one piece, so it sees a bad length only at their end). */
static void check_rejected(struct tw__sdec *d, const struct bad *c, int rv, size_t used,
			   size_t want_used)
{
	ck_assert_msg(rv == c->code, "%s: got %d, want %d", c->name, rv, c->code);
	ck_assert_msg(used == want_used, "%s: used %zu, want %zu", c->name, used, want_used);
	ck_assert_int_eq(d->state, SDEC_ERROR);
	ck_assert_int_eq(d->err, c->code);
	if (!c->lens_allocated)
		ck_assert_msg(d->lens == NULL, "%s: allocated before rejecting", c->name);
}

/* Sticky: more bytes, more advances and wants change nothing. */
static void check_sticky(struct tw__sdec *d, int code)
{
	static const uint8_t more[24] = {24, 0, 0, 0, 0, 0, 0, 0, 1};
	uint8_t *dst;
	size_t used = 99, want = 99;
	ck_assert_int_eq(tw__sdec_feed(d, more, sizeof(more), &used), code);
	ck_assert_uint_eq(used, 0);
	ck_assert_int_eq(tw__sdec_advance(d, 0), code);
	tw__sdec_want(d, &dst, &want);
	ck_assert_uint_eq(want, 0);
	ck_assert_int_eq(d->err, code);
}

/* Bad case i fed whole (what a decoder that allocated the lengths array
 * consumed counts too) or byte by byte: rejected with its code, sticky. */
static void rejects(int i, int bytewise)
{
	const struct bad *c = &bads[i];
	uint8_t p[40];
	size_t len = bad_bytes(c, p), used;
	struct tw__sdec d;
	int rv;
	tw__sdec_init(&d, MAX_BYTES, MAX_FRAMES);
	if (bytewise)
		rv = feed_bytewise(&d, p, len, &used);
	else
		rv = tw__sdec_feed(&d, p, len, &used);
	check_rejected(&d, c, rv, used, !bytewise && c->lens_allocated ? len : c->used);
	check_sticky(&d, c->code);
	tw__sdec_fini(&d);
}

START_TEST(rejects_whole)
{
	rejects(_i, 0);
}
END_TEST

START_TEST(rejects_bytewise)
{
	rejects(_i, 1);
}
END_TEST

/* A random valid prelude: up to 60 frames, mostly small lengths, within
 * MAX_BYTES. */
static size_t random_lens(uint64_t *seed, size_t *lens)
{
	size_t n = rnd_range(seed, 1, 60);
	for (size_t i = 0; i < n; i++)
		lens[i] = rnd_range(seed, 0, 3) == 0 ? rnd_range(seed, 0, 15000)
						     : rnd_range(seed, 0, 9);
	return n;
}

/* Decode the prelude of w in random pieces (each 1..max_piece bytes). */
static void decode_split(const struct wire *w, uint64_t *seed, size_t max_piece)
{
	struct tw__sdec d;
	size_t off = 0, used;
	int rv = 0;
	tw__sdec_init(&d, MAX_BYTES, MAX_FRAMES);
	while (rv == 0) {
		size_t piece = rnd_range(seed, 1, max_piece);
		REQUIRE(off < w->prelude);
		if (piece > w->len - off)
			piece = w->len - off;
		rv = tw__sdec_feed(&d, w->bytes + off, piece, &used);
		REQUIRE(rv >= 0);
		REQUIRE(rv == 1 || used == piece);
		off += used;
	}
	ck_assert_uint_eq(off, w->prelude);
	ck_assert_uint_eq(d.n, w->n);
	ck_assert_uint_eq(d.total, w->len - 8);
	for (size_t i = 0; i < w->n; i++)
		REQUIRE(d.lens[i] == w->lens[i]);
	tw__sdec_fini(&d);
}

START_TEST(random_splits)
{
	uint64_t seed = 0x5eed0001;
	size_t lens[60];
	for (int iter = 0; iter < 2000; iter++) {
		struct wire w;
		size_t n = random_lens(&seed, lens);
		wire_make(&w, lens, n);
		decode_split(&w, &seed, iter % 2 ? 7 : 200);
		wire_free(&w);
	}
}
END_TEST

START_TEST(bytewise_valid)
{
	uint64_t seed = 0x5eed0002;
	size_t lens[60], used;
	for (int iter = 0; iter < 200; iter++) {
		struct tw__sdec d;
		struct wire w;
		size_t n = random_lens(&seed, lens);
		wire_make(&w, lens, n);
		tw__sdec_init(&d, MAX_BYTES, MAX_FRAMES);
		ck_assert_int_eq(feed_bytewise(&d, w.bytes, w.len, &used), 1);
		ck_assert_uint_eq(used, w.prelude);
		for (size_t i = 0; i < n; i++)
			REQUIRE(d.lens[i] == lens[i]);
		tw__sdec_fini(&d);
		wire_free(&w);
	}
}
END_TEST

int main(void)
{
	TCase *bad = ts_tcase("rejects", 0, NULL);
	ts_add_loop(bad, N_BAD, TS_TESTS(rejects_whole, rejects_bytewise));
	return ts_main("stream_codec", 0,
		       TS_CASES(ts_tcase("prelude", 0,
					 TS_TESTS(encode_bytes, roundtrip, limits_inclusive,
						  random_splits, bytewise_valid)),
				bad));
}
