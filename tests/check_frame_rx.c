/* SPDX-License-Identifier: BSD-3-Clause */
/* Unit tests: the stream frame receiver (transport/frame_rx.c). Whole
 * messages fed one byte at a time, at random split points and through
 * want/advance with few iovecs; where frames land (slab, own blocks, the
 * placement hook); back-to-back messages; preludes declaring more than
 * the message limit rejected before
 * anything is allocated. */
#include <check.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <taskwire/error.h>
#include <taskwire/merge.h>
#include <taskwire/msg.h>

#include "core/context.h"
#include "tests/unit.h"
#include "tests/support/suite.h"
#include "transport/frame_rx.h"

#define KIB      ((size_t)1 << 10)
#define MIB      ((size_t)1 << 20)
#define MAX_MSGS 8

static struct tw__limits limits(size_t small_frame_bytes)
{
	struct tw__limits l = {0};
	l.max_message_bytes = 64 * MIB;
	l.max_frames = 65536;
	l.small_frame_bytes = small_frame_bytes;
	return l;
}

/* Feed p[0..len) in pieces of 1..max_piece bytes (1 when seed is NULL),
 * as a socket would deliver them; collect the completed messages. */
static size_t recv_stream(struct tw__rx *rx, const uint8_t *p, size_t len, uint64_t *seed,
			  size_t max_piece, tw_msg **out)
{
	size_t off = 0, got = 0;
	while (off < len) {
		size_t end = off + (seed != NULL ? rnd_range(seed, 1, max_piece) : 1);
		if (end > len)
			end = len;
		while (off < end) {
			size_t used;
			int rv = tw__rx_feed(rx, p + off, end - off, &used);
			REQUIRE(rv >= 0);
			off += used;
			if (rv == 1) {
				REQUIRE(got < MAX_MSGS);
				out[got++] = tw__rx_take(rx);
				REQUIRE(out[got - 1] != NULL);
			} else {
				REQUIRE(off == end);
			}
		}
	}
	return got;
}

/* Receive the one message of w with the given limits and split. */
static tw_msg *recv_one(const struct tw__limits *l, const struct wire *w, uint64_t *seed,
			size_t max_piece)
{
	struct tw__rx rx;
	tw_msg *m[MAX_MSGS];
	tw__rx_init(&rx, l);
	ck_assert_uint_eq(recv_stream(&rx, w->bytes, w->len, seed, max_piece, m), 1);
	ck_assert(tw__rx_idle(&rx));
	tw__rx_fini(&rx);
	return m[0];
}

/* Message shapes; returns the frame count. */
static size_t shape(int k, size_t *lens)
{
	switch (k) {
	case 0: lens[0] = 0; return 1;
	case 1: lens[0] = 1; return 1;
	case 2:
		for (size_t i = 0; i < 1000; i++)
			lens[i] = i % 13 == 0 ? 0 : i % 50;
		return 1000;
	case 3: lens[0] = 10, lens[1] = 300 * KIB, lens[2] = 0, lens[3] = 70 * KIB; return 4;
	case 4: lens[0] = 100000; return 1;
	case 5: lens[0] = 64 * KIB - 8; return 1; /* total - 8 = small_frame_bytes */
	case 6: lens[0] = 64 * KIB - 7; return 1; /* one byte past it */
	default:
		lens[0] = 3, lens[1] = 64 * KIB, lens[2] = 64 * KIB + 1, lens[3] = 0, lens[4] = 17;
		return 5;
	}
}
#define N_SHAPES 8

/* Loop index -> shape and small_frame_bytes (default, or 16 so that
 * almost every message takes the large path). */
static void loop_case(int i, struct wire *w, struct tw__limits *l)
{
	static size_t lens[1000];
	size_t n = shape(i % N_SHAPES, lens);
	*l = limits(i < N_SHAPES ? TW_DEFAULT_SMALL_FRAME_BYTES : 16);
	wire_make(w, lens, n);
}

START_TEST(bytewise)
{
	struct tw__limits l;
	struct wire w;
	tw_stats before = stats_now(), st;
	tw_msg *m;
	loop_case(_i, &w, &l);
	m = recv_one(&l, &w, NULL, 1);
	wire_check_msg(m, &w);
	st = stats_now();
	ck_assert_uint_eq(st.payload_bytes_copied, before.payload_bytes_copied);
	tw_msg_free(m);
	st = stats_now();
	ck_assert_uint_eq(st.blocks_live, before.blocks_live);
	ck_assert_uint_eq(st.block_bytes_live, before.block_bytes_live);
	wire_free(&w);
}
END_TEST

START_TEST(random_splits)
{
	uint64_t seed = 0x5eed0100 + (uint64_t)_i;
	static const size_t max_piece[] = {3, 64, 5000, 1 << 20};
	struct tw__limits l;
	struct wire w;
	loop_case(_i, &w, &l);
	for (int iter = 0; iter < 40; iter++) {
		tw_msg *m = recv_one(&l, &w, &seed, max_piece[iter % 4]);
		wire_check_msg(m, &w);
		tw_msg_free(m);
	}
	wire_free(&w);
}
END_TEST

/* Like a readv: at most `max_iov` iovecs per want, and a random count of
 * bytes that may stop in the middle of any of them. */
static tw_msg *recv_readv(struct tw__rx *rx, const struct wire *w, uint64_t *seed)
{
	size_t off = 0;
	int rv = 0;
	while (rv == 0) {
		struct iovec iov[4];
		int k = tw__rx_want(rx, iov, (int)rnd_range(seed, 1, 4));
		size_t room = 0, n, moved = 0;
		REQUIRE(k >= 1);
		for (int i = 0; i < k; i++) {
			REQUIRE(iov[i].iov_len > 0);
			room += iov[i].iov_len;
		}
		n = rnd_range(seed, 1, room < w->len - off ? room : w->len - off);
		for (int i = 0; i < k && moved < n; i++) {
			size_t c = iov[i].iov_len < n - moved ? iov[i].iov_len : n - moved;
			memcpy(iov[i].iov_base, w->bytes + off + moved, c);
			moved += c;
		}
		off += n;
		rv = tw__rx_advance(rx, n);
		REQUIRE(rv >= 0);
	}
	ck_assert_uint_eq(off, w->len);
	return tw__rx_take(rx);
}

START_TEST(want_advance)
{
	uint64_t seed = 0x5eed0200 + (uint64_t)_i;
	struct tw__limits l;
	struct tw__rx rx;
	struct wire w;
	loop_case(_i, &w, &l);
	tw__rx_init(&rx, &l);
	rx.gulp_max = _i % 3 ? 4096 : 0; /* with and without read-ahead */
	for (int iter = 0; iter < 20; iter++) {
		tw_msg *m = recv_readv(&rx, &w, &seed);
		wire_check_msg(m, &w);
		tw_msg_free(m);
	}
	tw__rx_fini(&rx);
	wire_free(&w);
}
END_TEST

/* A message of at most small_frame_bytes after (total, N) is one block:
 * lengths, then the frames. */
START_TEST(placement_small_message)
{
	size_t lens[] = {10, 20, 30};
	struct tw__limits l = limits(TW_DEFAULT_SMALL_FRAME_BYTES);
	struct wire w;
	tw_block *b;
	tw_msg *m;
	wire_make(&w, lens, 3);
	m = recv_one(&l, &w, NULL, 1);
	wire_check_msg(m, &w);
	b = tw_msg_frame(m, 0)->block;
	ck_assert_ptr_nonnull(b);
	ck_assert_uint_eq(tw_block_size(b), 24 + 60);
	for (size_t i = 0; i < 3; i++) {
		ck_assert_ptr_eq(tw_msg_frame(m, i)->block, b);
		ck_assert_uint_eq(tw_msg_frame(m, i)->offset, w.offsets[i] - 16);
	}
	tw_msg_free(m);
	wire_free(&w);
}
END_TEST

/* The one-block path takes messages up to small_frame_bytes after (total,
 * N) inclusive: the frame then follows its length in the block. One byte
 * more and the frame gets a slab of its own size. */
START_TEST(placement_small_boundary)
{
	size_t at[] = {64 * KIB - 8}, past[] = {64 * KIB - 7};
	struct tw__limits l = limits(TW_DEFAULT_SMALL_FRAME_BYTES);
	struct wire w;
	tw_msg *m;
	wire_make(&w, at, 1);
	m = recv_one(&l, &w, NULL, 1);
	wire_check_msg(m, &w);
	ck_assert_uint_eq(tw_msg_frame(m, 0)->offset, 8);
	ck_assert_uint_eq(tw_block_size(tw_msg_frame(m, 0)->block), 64 * KIB);
	tw_msg_free(m);
	wire_free(&w);
	wire_make(&w, past, 1);
	m = recv_one(&l, &w, NULL, 1);
	wire_check_msg(m, &w);
	ck_assert_uint_eq(tw_msg_frame(m, 0)->offset, 0);
	ck_assert_uint_eq(tw_block_size(tw_msg_frame(m, 0)->block), 64 * KIB - 7);
	tw_msg_free(m);
	wire_free(&w);
}
END_TEST

/* A large message: small frames share one slab of their summed size, each
 * frame above small_frame_bytes has an exact-size block of its own, and an
 * empty frame has no block. */
START_TEST(placement_large_message)
{
	size_t lens[] = {100, 200, 70000, 300, 0, 80000, 5};
	struct tw__limits l = limits(TW_DEFAULT_SMALL_FRAME_BYTES);
	tw_stats before = stats_now(), st;
	struct wire w;
	const tw_slice *f[7];
	tw_msg *m;
	wire_make(&w, lens, 7);
	m = recv_one(&l, &w, NULL, 1);
	wire_check_msg(m, &w);
	for (size_t i = 0; i < 7; i++)
		f[i] = tw_msg_frame(m, i);
	ck_assert_ptr_nonnull(f[0]->block);
	ck_assert_ptr_eq(f[1]->block, f[0]->block);
	ck_assert_ptr_eq(f[3]->block, f[0]->block);
	ck_assert_ptr_eq(f[6]->block, f[0]->block);
	ck_assert_uint_eq(tw_block_size(f[0]->block), 605);
	ck_assert_uint_eq(f[0]->offset, 0);
	ck_assert_uint_eq(f[1]->offset, 100);
	ck_assert_uint_eq(f[3]->offset, 300);
	ck_assert_uint_eq(f[6]->offset, 600);
	ck_assert_ptr_null(f[4]->block);
	ck_assert_ptr_nonnull(f[2]->block);
	ck_assert_ptr_nonnull(f[5]->block);
	ck_assert_ptr_ne(f[2]->block, f[0]->block);
	ck_assert_ptr_ne(f[5]->block, f[0]->block);
	ck_assert_ptr_ne(f[5]->block, f[2]->block);
	ck_assert_uint_eq(tw_block_size(f[2]->block), 70000);
	ck_assert_uint_eq(tw_block_size(f[5]->block), 80000);
	ck_assert_uint_eq(f[2]->offset, 0);
	ck_assert_uint_eq(f[5]->offset, 0);
	st = stats_now();
	ck_assert_uint_eq(st.blocks_allocated, before.blocks_allocated + 3);
	ck_assert_uint_eq(st.block_bytes_allocated, before.block_bytes_allocated + 605 + 150000);
	tw_msg_free(m);
	wire_free(&w);
}
END_TEST

/* The brief's mixed shape and the small_frame_bytes boundary (<= shares). */
START_TEST(placement_mixed)
{
	size_t lens[] = {10, 300 * KIB, 0, 70 * KIB, 64 * KIB, 64 * KIB + 1, 1};
	struct tw__limits l = limits(TW_DEFAULT_SMALL_FRAME_BYTES);
	struct wire w;
	const tw_slice *f[7];
	tw_msg *m;
	wire_make(&w, lens, 7);
	m = recv_one(&l, &w, NULL, 1);
	wire_check_msg(m, &w);
	for (size_t i = 0; i < 7; i++)
		f[i] = tw_msg_frame(m, i);
	ck_assert_ptr_eq(f[4]->block, f[0]->block);
	ck_assert_ptr_eq(f[6]->block, f[0]->block);
	ck_assert_uint_eq(tw_block_size(f[0]->block), 10 + 64 * KIB + 1);
	ck_assert_ptr_null(f[2]->block);
	ck_assert_uint_eq(tw_block_size(f[1]->block), 300 * KIB);
	ck_assert_uint_eq(tw_block_size(f[3]->block), 70 * KIB);
	ck_assert_uint_eq(tw_block_size(f[5]->block), 64 * KIB + 1);
	ck_assert_ptr_ne(f[1]->block, f[0]->block);
	ck_assert_ptr_ne(f[3]->block, f[0]->block);
	ck_assert_ptr_ne(f[5]->block, f[0]->block);
	ck_assert_ptr_ne(f[3]->block, f[1]->block);
	ck_assert_ptr_ne(f[5]->block, f[3]->block);
	tw_msg_free(m);
	wire_free(&w);
}
END_TEST

/* A kept small frame does not pin the large ones: they are freed with the
 * message's last reference to them. */
START_TEST(placement_no_pinning)
{
	size_t lens[] = {10, 300 * KIB, 70 * KIB};
	struct tw__limits l = limits(TW_DEFAULT_SMALL_FRAME_BYTES);
	struct wire w;
	tw_stats before = stats_now(), st;
	tw_block *small;
	tw_msg *m;
	wire_make(&w, lens, 3);
	m = recv_one(&l, &w, NULL, 1);
	small = tw_block_hold(tw_msg_frame(m, 0)->block);
	tw_msg_free(m);
	st = stats_now();
	ck_assert_uint_eq(st.blocks_live, before.blocks_live + 1);
	ck_assert_uint_eq(st.block_bytes_live, before.block_bytes_live + 10);
	tw_block_free(small);
	wire_free(&w);
}
END_TEST

/* Placement hook: records each call and checks that frames 0..i-1 are
 * complete when frame i is placed. */
struct hook {
	const struct wire *w;
	size_t calls, at[16];
	size_t span_at; /* return span at this index */
	int span;       /* span to return there (or an error code) */
};

static int hook_fn(void *arg, const tw_msg *msg, const uint64_t *lens, size_t n, size_t i)
{
	struct hook *h = arg;
	ck_assert_uint_lt(h->calls, 16);
	h->at[h->calls++] = i;
	ck_assert_uint_eq(n, h->w->n);
	ck_assert_uint_eq(tw_msg_nframes(msg), i);
	for (size_t k = 0; k < n; k++)
		REQUIRE(lens[k] == h->w->lens[k]);
	for (size_t k = 0; k < i; k++) {
		const tw_slice *f = tw_msg_frame(msg, k);
		const uint8_t *want = h->w->bytes + h->w->offsets[k];
		REQUIRE(f->len == h->w->lens[k]);
		if (f->len > 0)
			REQUIRE(memcmp(tw_slice_data(f), want, f->len) == 0);
	}
	return i == h->span_at ? h->span : 0;
}

static tw_msg *recv_hooked(struct hook *h, uint64_t *seed, size_t max_piece)
{
	struct tw__limits l = limits(TW_DEFAULT_SMALL_FRAME_BYTES);
	struct tw__rx rx;
	tw_msg *m[MAX_MSGS];
	tw__rx_init(&rx, &l);
	tw__rx_set_place(&rx, hook_fn, h);
	ck_assert_uint_eq(recv_stream(&rx, h->w->bytes, h->w->len, seed, max_piece, m), 1);
	tw__rx_fini(&rx);
	return m[0];
}

/* Shards 1..3 of a payload land adjacent in one block, so merging them is
 * a view; the small frames around them keep the default slab. */
static void check_span(uint64_t *seed, size_t max_piece)
{
	size_t lens[] = {10, 100000, 100000, 100000, 20};
	struct wire w;
	struct hook h = {&w, 0, {0}, 1, 3};
	const tw_slice *f[5];
	tw_slice merged, parts[3];
	tw_stats before;
	tw_msg *m;
	wire_make(&w, lens, 5);
	m = recv_hooked(&h, seed, max_piece);
	wire_check_msg(m, &w);
	ck_assert_uint_eq(h.calls, 2); /* frame 4 is small: never asked */
	ck_assert_uint_eq(h.at[0], 0);
	ck_assert_uint_eq(h.at[1], 1);
	for (size_t i = 0; i < 5; i++)
		f[i] = tw_msg_frame(m, i);
	ck_assert_ptr_eq(f[2]->block, f[1]->block);
	ck_assert_ptr_eq(f[3]->block, f[1]->block);
	ck_assert_uint_eq(tw_block_size(f[1]->block), 300000);
	ck_assert_uint_eq(f[1]->offset, 0);
	ck_assert_uint_eq(f[2]->offset, 100000);
	ck_assert_uint_eq(f[3]->offset, 200000);
	ck_assert_ptr_eq(f[4]->block, f[0]->block);
	ck_assert_ptr_ne(f[1]->block, f[0]->block);
	for (size_t i = 0; i < 3; i++)
		parts[i] = *f[i + 1];
	before = stats_now();
	ck_assert_int_eq(tw_merge(parts, 3, &merged), 0);
	ck_assert_ptr_eq(tw_slice_data(&merged), tw_slice_data(f[1]));
	ck_assert_uint_eq(merged.len, 300000);
	ck_assert_uint_eq(stats_now().merges_zero_copy, before.merges_zero_copy + 1);
	tw_block_free(merged.block);
	tw_msg_free(m);
	wire_free(&w);
}

START_TEST(hook_span)
{
	uint64_t seed = 0x5eed0300;
	check_span(NULL, 1);
	for (int iter = 0; iter < 30; iter++)
		check_span(&seed, iter % 2 ? 100 : 70000);
}
END_TEST

/* The hook may put the whole message in one block; it is never asked
 * about a small message (that is one block already). */
START_TEST(hook_whole_and_small)
{
	size_t big[] = {0, 70000, 3, 0}, small[] = {10, 20};
	struct wire w;
	struct hook h = {&w, 0, {0}, 0, 4};
	tw_msg *m;
	wire_make(&w, big, 4);
	m = recv_hooked(&h, NULL, 1);
	wire_check_msg(m, &w);
	ck_assert_uint_eq(h.calls, 1);
	ck_assert_ptr_eq(tw_msg_frame(m, 1)->block, tw_msg_frame(m, 0)->block);
	ck_assert_ptr_eq(tw_msg_frame(m, 2)->block, tw_msg_frame(m, 0)->block);
	ck_assert_ptr_eq(tw_msg_frame(m, 3)->block, tw_msg_frame(m, 0)->block);
	ck_assert_uint_eq(tw_block_size(tw_msg_frame(m, 0)->block), 70003);
	ck_assert_uint_eq(tw_msg_frame(m, 2)->offset, 70000);
	tw_msg_free(m);
	wire_free(&w);
	wire_make(&w, small, 2);
	h = (struct hook){&w, 0, {0}, 0, 2};
	m = recv_hooked(&h, NULL, 1);
	wire_check_msg(m, &w);
	ck_assert_uint_eq(h.calls, 0);
	tw_msg_free(m);
	wire_free(&w);
}
END_TEST

/* A hook error (or a span past the last frame) fails the message with a
 * sticky code, and the receiver frees what it had placed. */
static void check_hook_fails(size_t span_at, int span, int code)
{
	size_t lens[] = {10, 100000, 100000, 20};
	tw_stats before = stats_now(), st;
	struct tw__limits l = limits(TW_DEFAULT_SMALL_FRAME_BYTES);
	struct wire w;
	struct hook h = {&w, 0, {0}, span_at, span};
	struct tw__rx rx;
	struct iovec iov[2];
	size_t used;
	wire_make(&w, lens, 4);
	tw__rx_init(&rx, &l);
	tw__rx_set_place(&rx, hook_fn, &h);
	ck_assert_int_eq(tw__rx_feed(&rx, w.bytes, w.len, &used), code);
	ck_assert_uint_lt(used, w.len);
	ck_assert_uint_eq(h.at[h.calls - 1], span_at);
	ck_assert_int_eq(tw__rx_feed(&rx, w.bytes, w.len, &used), code);
	ck_assert_uint_eq(used, 0);
	ck_assert_int_eq(tw__rx_want(&rx, iov, 2), code);
	ck_assert_int_eq(tw__rx_advance(&rx, 0), code);
	ck_assert_ptr_null(tw__rx_take(&rx));
	tw__rx_fini(&rx);
	st = stats_now();
	ck_assert_uint_eq(st.blocks_live, before.blocks_live);
	wire_free(&w);
}

START_TEST(hook_errors)
{
	check_hook_fails(1, TW_EPROTO, TW_EPROTO);
	check_hook_fails(0, TW_ENOMEM, TW_ENOMEM);
	check_hook_fails(2, TW_ETOOBIG, TW_ETOOBIG);
	check_hook_fails(2, 3, TW_EPROTO); /* frames 2..4 of 4 */
}
END_TEST

/* The hook is never asked about a small frame, so a span it would give
 * there changes nothing: frame 3 (20 bytes) lands in the slab, and the
 * small frames are read in one readv with the large one before them. */
START_TEST(hook_small_never_asked)
{
	size_t lens[] = {10, 100000, 100000, 20};
	struct wire w;
	struct hook h = {&w, 0, {0}, 3, 2};
	tw_msg *m;
	wire_make(&w, lens, 4);
	m = recv_hooked(&h, NULL, 1);
	wire_check_msg(m, &w);
	ck_assert_uint_eq(h.calls, 3);
	ck_assert_uint_eq(h.at[2], 2);
	ck_assert_ptr_eq(tw_msg_frame(m, 3)->block, tw_msg_frame(m, 0)->block);
	tw_msg_free(m);
	wire_free(&w);
}
END_TEST

/* Two messages in one buffer: a feed stops after the first; take it and
 * feed the rest. */
START_TEST(back_to_back)
{
	size_t a_lens[] = {3, 0, 5}, b_lens[] = {100000, 1}, c_lens[] = {0};
	struct tw__limits l = limits(TW_DEFAULT_SMALL_FRAME_BYTES);
	struct wire a, b, c;
	struct tw__rx rx;
	uint8_t *buf;
	size_t used, len;
	tw_msg *m;
	wire_make(&a, a_lens, 3);
	wire_make(&b, b_lens, 2);
	wire_make(&c, c_lens, 1);
	len = a.len + b.len + c.len;
	buf = malloc(len);
	memcpy(buf, a.bytes, a.len);
	memcpy(buf + a.len, b.bytes, b.len);
	memcpy(buf + a.len + b.len, c.bytes, c.len);
	tw__rx_init(&rx, &l);
	ck_assert_int_eq(tw__rx_feed(&rx, buf, len, &used), 1);
	ck_assert_uint_eq(used, a.len);
	ck_assert(!tw__rx_idle(&rx));
	m = tw__rx_take(&rx);
	wire_check_msg(m, &a);
	tw_msg_free(m);
	ck_assert(tw__rx_idle(&rx));
	ck_assert_int_eq(tw__rx_feed(&rx, buf + a.len, len - a.len, &used), 1);
	ck_assert_uint_eq(used, b.len);
	m = tw__rx_take(&rx);
	wire_check_msg(m, &b);
	tw_msg_free(m);
	ck_assert_int_eq(tw__rx_feed(&rx, buf + a.len + b.len, c.len, &used), 1);
	ck_assert_uint_eq(used, c.len);
	m = tw__rx_take(&rx);
	wire_check_msg(m, &c);
	tw_msg_free(m);
	ck_assert(tw__rx_idle(&rx));
	tw__rx_fini(&rx);
	free(buf);
	wire_free(&a);
	wire_free(&b);
	wire_free(&c);
}
END_TEST

/* Read p[0..len) through want/advance as a socket holding all of it would:
 * each read takes 1..room bytes (all that fits when seed is NULL), and
 * read-ahead bytes are replayed before the next read. Counts the reads. */
static size_t recv_gulping(struct tw__rx *rx, const uint8_t *p, size_t len, uint64_t *seed,
			   tw_msg **out, size_t max_out, size_t *reads)
{
	size_t off = 0, got = 0;
	while (off < len || tw__rx_pending(rx)) {
		int rv;
		if (tw__rx_pending(rx)) {
			rv = tw__rx_replay(rx);
		} else {
			struct iovec iov[16];
			int k = tw__rx_want(rx, iov, 16);
			size_t room = 0, n, moved = 0;
			REQUIRE(k >= 1);
			for (int i = 0; i < k; i++)
				room += iov[i].iov_len;
			n = room < len - off ? room : len - off;
			if (seed != NULL)
				n = rnd_range(seed, 1, n);
			for (int i = 0; i < k && moved < n; i++) {
				size_t c = iov[i].iov_len < n - moved ? iov[i].iov_len : n - moved;
				memcpy(iov[i].iov_base, p + off + moved, c);
				moved += c;
			}
			off += n;
			(*reads)++;
			rv = tw__rx_advance(rx, n);
		}
		REQUIRE(rv >= 0);
		if (rv == 1) {
			REQUIRE(got < max_out);
			out[got++] = tw__rx_take(rx);
		}
	}
	return got;
}

/* Request/response traffic: after two small messages, each next one
 * arrives in one read (head and body), its frames slices of the
 * read-ahead block, nothing copied. */
START_TEST(gulp_one_read)
{
	size_t lens[] = {28};
	struct tw__limits l = limits(TW_DEFAULT_SMALL_FRAME_BYTES);
	tw_stats before = stats_now();
	struct tw__rx rx;
	struct wire w;
	wire_make(&w, lens, 1);
	tw__rx_init(&rx, &l);
	rx.gulp_max = 4096;
	for (int i = 0; i < 10; i++) {
		size_t reads = 0;
		tw_msg *m;
		ck_assert_uint_eq(recv_gulping(&rx, w.bytes, w.len, NULL, &m, 1, &reads), 1);
		wire_check_msg(m, &w);
		ck_assert_uint_eq(reads, i < 2 ? 2 : 1);
		if (i >= 2) /* sliced from the read-ahead block: head + 64 */
			ck_assert_uint_eq(tw_block_size(tw_msg_frame(m, 0)->block), 16 + 64);
		ck_assert(tw__rx_idle(&rx));
		tw_msg_free(m);
	}
	ck_assert_uint_eq(stats_now().payload_bytes_copied, before.payload_bytes_copied);
	tw__rx_fini(&rx);
	wire_free(&w);
}
END_TEST

/* Request/response traffic frees each message before the next comes:
 * the read-ahead block comes back and is read into again (no allocation
 * per message); a message still held keeps its block, so its bytes never
 * change under it, and the next read goes into a new block. */
START_TEST(gulp_block_reused_when_free)
{
	size_t lens[] = {28};
	struct tw__limits l = limits(TW_DEFAULT_SMALL_FRAME_BYTES);
	tw_stats before = stats_now();
	tw_block *last = NULL;
	tw_msg *held = NULL, *m;
	struct tw__rx rx;
	struct wire w[8];
	tw__rx_init(&rx, &l);
	rx.gulp_max = 4096;
	for (int i = 0; i < 8; i++) {
		size_t reads = 0;
		const tw_slice *f;
		wire_make(&w[i], lens, 1);
		memset(w[i].bytes + 24, 'a' + i, 28);
		ck_assert_uint_eq(recv_gulping(&rx, w[i].bytes, w[i].len, NULL, &m, 1, &reads), 1);
		wire_check_msg(m, &w[i]);
		f = tw_msg_frame(m, 0);
		if (i == 4) /* held while 5 comes: 5 cannot use its block */
			ck_assert_ptr_eq(f->block, last);
		else if (i == 5)
			ck_assert_ptr_ne(f->block, last);
		else if (i == 3 || i >= 6) /* the block that came back */
			ck_assert_ptr_eq(f->block, last);
		last = f->block;
		if (i == 4)
			held = m;
		else
			tw_msg_free(m);
		if (i == 5) { /* the held message's bytes are its own still */
			wire_check_msg(held, &w[4]);
			tw_msg_free(held);
		}
	}
	ck_assert_uint_eq(stats_now().payload_bytes_copied, before.payload_bytes_copied);
	tw__rx_fini(&rx);
	ck_assert_uint_eq(stats_now().blocks_live, before.blocks_live);
	for (int i = 0; i < 8; i++)
		wire_free(&w[i]);
}
END_TEST

/* A large message after a run of small ones: the read-ahead took the
 * start of it; only those bytes are copied out (bounded by the read-ahead
 * size), its large frame still gets an exact-size block of its own. */
START_TEST(gulp_mispredict_large)
{
	size_t small[] = {28}, large[] = {10, 300 * KIB};
	struct tw__limits l = limits(TW_DEFAULT_SMALL_FRAME_BYTES);
	struct tw__rx rx;
	struct wire s, b;
	tw_stats before;
	size_t reads = 0;
	tw_msg *m;
	wire_make(&s, small, 1);
	wire_make(&b, large, 2);
	tw__rx_init(&rx, &l);
	rx.gulp_max = 4096;
	for (int i = 0; i < 3; i++) {
		ck_assert_uint_eq(recv_gulping(&rx, s.bytes, s.len, NULL, &m, 1, &reads), 1);
		tw_msg_free(m);
	}
	before = stats_now();
	ck_assert_uint_eq(recv_gulping(&rx, b.bytes, b.len, NULL, &m, 1, &reads), 1);
	wire_check_msg(m, &b);
	ck_assert_uint_le(stats_now().payload_bytes_copied - before.payload_bytes_copied, 64);
	ck_assert_uint_eq(tw_block_size(tw_msg_frame(m, 1)->block), 300 * KIB);
	ck_assert_uint_eq(tw_msg_frame(m, 1)->offset, 0);
	tw_msg_free(m);
	/* after a large message the next head is read alone again */
	reads = 0;
	ck_assert_uint_eq(recv_gulping(&rx, s.bytes, s.len, NULL, &m, 1, &reads), 1);
	ck_assert_uint_eq(reads, 2);
	wire_check_msg(m, &s);
	tw_msg_free(m);
	ck_assert(tw__rx_idle(&rx));
	tw__rx_fini(&rx);
	wire_free(&s);
	wire_free(&b);
}
END_TEST

/* Every shape, mixed in one stream, read in random pieces that cross
 * message boundaries (read-ahead holding whole messages, parts of the
 * next, or the start of a large one): each message arrives intact, in
 * order, and what is copied stays within the read-ahead bound. */
START_TEST(gulp_stream_random)
{
	static size_t lens[1000];
	struct tw__limits l = limits(TW_DEFAULT_SMALL_FRAME_BYTES);
	uint64_t seed = 0x6a1b0000 + (uint64_t)_i;
	struct wire w[24];
	tw_msg *m[24];
	size_t len = 0, off = 0, reads = 0, got;
	uint8_t *buf;
	struct tw__rx rx;
	tw_stats before = stats_now();
	for (size_t i = 0; i < 24; i++) {
		/* mostly small (1, 0-byte, 28-byte), now and then another shape */
		size_t n, k = rnd_range(&seed, 0, 9);
		if (k < 7) {
			lens[0] = k < 3 ? 28 : k < 5 ? 1 : rnd_range(&seed, 0, 3000);
			n = 1;
		} else {
			n = shape((int)rnd_range(&seed, 0, N_SHAPES - 1), lens);
		}
		wire_make(&w[i], lens, n);
		len += w[i].len;
	}
	buf = malloc(len);
	for (size_t i = 0; i < 24; i++) {
		memcpy(buf + off, w[i].bytes, w[i].len);
		off += w[i].len;
	}
	tw__rx_init(&rx, &l);
	rx.gulp_max = 4096;
	rx.gulp_pipe_max = _i % 4 >= 2 ? 16384 : 0; /* a pipelined stream's growth too */
	got = recv_gulping(&rx, buf, len, _i % 2 ? &seed : NULL, m, 24, &reads);
	ck_assert_uint_eq(got, 24);
	for (size_t i = 0; i < 24; i++) {
		wire_check_msg(m[i], &w[i]);
		tw_msg_free(m[i]);
		wire_free(&w[i]);
	}
	ck_assert(tw__rx_idle(&rx));
	ck_assert_uint_le(stats_now().payload_bytes_copied - before.payload_bytes_copied,
			  24 * (rx.gulp_pipe_max ? rx.gulp_pipe_max : 4096));
	tw__rx_fini(&rx);
	free(buf);
}
END_TEST

/* One read from a socket that holds p[0..len): all that fits in the
 * iovecs of a want (read-ahead included). Returns advance's result. */
static int gulp_read(struct tw__rx *rx, const uint8_t *p, size_t len, size_t *used)
{
	struct iovec iov[16];
	int k = tw__rx_want(rx, iov, 16);
	size_t moved = 0;
	REQUIRE(k >= 1);
	for (int i = 0; i < k && moved < len; i++) {
		size_t c = iov[i].iov_len < len - moved ? iov[i].iov_len : len - moved;
		memcpy(iov[i].iov_base, p + moved, c);
		moved += c;
	}
	*used = moved;
	return tw__rx_advance(rx, moved);
}

/* A run of three one-frame messages of frame_len bytes, each read on its
 * own (request / response): read-ahead is on afterwards, of their body
 * size (8 + frame_len) rounded up to 64 bytes. */
static void gulp_warm_up(struct tw__rx *rx, size_t frame_len)
{
	size_t lens[] = {frame_len}, reads = 0;
	struct wire w;
	wire_make(&w, lens, 1);
	for (int i = 0; i < 3; i++) {
		tw_msg *m;
		ck_assert_uint_eq(recv_gulping(rx, w.bytes, w.len, NULL, &m, 1, &reads), 1);
		tw_msg_free(m);
	}
	ck_assert_uint_eq(rx->gulp_size, (8 + frame_len + 63) / 64 * 64);
	wire_free(&w);
}

/* A pipelined stream (issue 20): reads that fill the read-ahead double
 * it up to gulp_pipe_max, so N messages of 100 B take about N / 130
 * reads once grown; every message is a slice of a read-ahead block, and
 * what is copied is at most the part of one message per read (moved to
 * the next block's start). With each message freed as it comes (a
 * one-way stream), the block comes back and is read into again: a
 * pipelined stream's blocks are all of the largest size, so one serves
 * every read. Both ways, a 300 KiB
 * frame after the stream gets its own block, with at most gulp_pipe_max
 * bytes of it copied. */
START_TEST(gulp_pipelined)
{
	enum { N = 2000 };
	size_t lens[] = {100}, big[] = {10, 300 * KIB}, reads = 0, got = 0, off = 0, k = 0;
	int free_each = _i;
	struct tw__limits l = limits(TW_DEFAULT_SMALL_FRAME_BYTES);
	static tw_msg *m[N + 1];
	struct wire w, b;
	uint8_t *buf;
	struct tw__rx rx;
	tw_stats before, mid;
	wire_make(&w, lens, 1);
	wire_make(&b, big, 2);
	buf = malloc(N * w.len + b.len);
	for (size_t i = 0; i < N; i++) {
		memcpy(buf + i * w.len, w.bytes, w.len);
		buf[i * w.len + 24] = (uint8_t)i; /* each message's first byte: its number */
	}
	memcpy(buf + N * w.len, b.bytes, b.len);
	tw__rx_init(&rx, &l);
	rx.gulp_max = 4096;
	rx.gulp_pipe_max = 16384;
	gulp_warm_up(&rx, 100);
	before = stats_now();
	while (got < N) { /* as recv_gulping, but freeing each message at once when free_each */
		size_t used;
		int rv;
		if (tw__rx_pending(&rx)) {
			rv = tw__rx_replay(&rx);
		} else {
			rv = gulp_read(&rx, buf + off, N * w.len - off, &used);
			off += used;
			reads++;
		}
		ck_assert_int_ge(rv, 0);
		if (rv == 1) {
			tw_msg *t = tw__rx_take(&rx);
			const tw_slice *f = tw_msg_frame(t, 0);
			ck_assert_uint_eq(tw_msg_nframes(t), 1);
			ck_assert_uint_eq(f->len, 100);
			ck_assert_uint_eq(tw_slice_data(f)[0], (uint8_t)got);
			ck_assert_uint_ge(tw_block_size(f->block), 16 + 128);
			ck_assert_int_eq(tw__rx_check_head(&rx), 0);
			if (free_each)
				tw_msg_free(t);
			else
				m[k++] = t;
			got++;
		}
	}
	ck_assert_uint_eq(off, N * w.len);
	mid = stats_now();
	/* 144, 320, 640, ... 10240 bytes, then 16 KiB reads: 248,000 bytes */
	ck_assert_uint_le(reads, 8 + N * w.len / 16000);
	ck_assert_uint_le(mid.payload_bytes_copied - before.payload_bytes_copied, reads * w.len);
	if (free_each) /* one 16 KiB block (the first read went into the warm-up's
			* block), read into again and again */
		ck_assert_uint_eq(mid.blocks_allocated - before.blocks_allocated, 1);
	else
		ck_assert_uint_le(mid.blocks_allocated - before.blocks_allocated, reads);
	/* the large message after it: own block, bounded copy */
	ck_assert_uint_eq(recv_gulping(&rx, b.bytes, b.len, NULL, &m[k], 1, &reads), 1);
	wire_check_msg(m[k], &b);
	ck_assert_uint_eq(tw_block_size(tw_msg_frame(m[k], 1)->block), 300 * KIB);
	ck_assert_uint_eq(tw_msg_frame(m[k], 1)->offset, 0);
	ck_assert_uint_le(stats_now().payload_bytes_copied - mid.payload_bytes_copied, 16384);
	k++;
	ck_assert(tw__rx_idle(&rx));
	tw__rx_fini(&rx);
	for (size_t i = 0; i < k; i++)
		tw_msg_free(m[i]);
	ck_assert_uint_le(stats_now().blocks_live, before.blocks_live);
	free(buf);
	wire_free(&w);
	wire_free(&b);
}
END_TEST

/* Messages sliced from the read-ahead block outlive the receiver and one
 * another (ASan and valgrind watch the block): after 100-byte messages
 * (read-ahead 128 bytes), six 1-byte messages (25 bytes each) come in one
 * write; the read of the first head takes 128 bytes more: its body and
 * the next four whole (slices of that block), and the sixth's head and 3
 * bytes of its body (copied into a block of its own). */
START_TEST(gulp_slices_outlive_rx)
{
	size_t lens[] = {1};
	struct tw__limits l = limits(TW_DEFAULT_SMALL_FRAME_BYTES);
	tw_stats before = stats_now();
	struct wire w[6];
	uint8_t buf[6 * 25];
	size_t off = 0, used, got = 0;
	tw_msg *m[6];
	struct tw__rx rx;
	int rv;
	for (unsigned i = 0; i < 6; i++) {
		wire_make(&w[i], lens, 1);
		w[i].bytes[24] = (uint8_t)('a' + i);
		memcpy(buf + off, w[i].bytes, w[i].len);
		off += w[i].len;
	}
	ck_assert_uint_eq(off, sizeof(buf));
	tw__rx_init(&rx, &l);
	rx.gulp_max = 4096;
	gulp_warm_up(&rx, 100);
	off = 0;
	rv = gulp_read(&rx, buf, sizeof(buf), &used);
	ck_assert_uint_eq(used, 16 + 128);
	off += used;
	while (got < 6) {
		if (rv == 1) {
			m[got++] = tw__rx_take(&rx);
			ck_assert_int_eq(tw__rx_check_head(&rx), 0);
			rv = 0;
			continue;
		}
		if (tw__rx_pending(&rx)) {
			rv = tw__rx_replay(&rx);
		} else {
			REQUIRE(off < sizeof(buf));
			rv = gulp_read(&rx, buf + off, sizeof(buf) - off, &used);
			off += used;
		}
		ck_assert_int_ge(rv, 0);
	}
	ck_assert_uint_eq(off, sizeof(buf));
	ck_assert(tw__rx_idle(&rx));
	/* the first five are slices of one block; the sixth is not */
	for (int i = 1; i < 5; i++)
		ck_assert_ptr_eq(tw_msg_frame(m[i], 0)->block, tw_msg_frame(m[0], 0)->block);
	ck_assert_uint_eq(tw_block_size(tw_msg_frame(m[0], 0)->block), 16 + 128);
	ck_assert_ptr_ne(tw_msg_frame(m[5], 0)->block, tw_msg_frame(m[0], 0)->block);
	ck_assert_uint_eq(tw_block_size(tw_msg_frame(m[5], 0)->block), 9);
	ck_assert_uint_eq(stats_now().payload_bytes_copied - before.payload_bytes_copied, 3);
	tw__rx_fini(&rx);
	/* freed in an order that leaves the shared block to a middle one */
	for (int i = 5; i >= 0; i--) {
		if (i == 2)
			continue;
		wire_check_msg(m[i], &w[i]);
		ck_assert_uint_eq(tw_slice_data(tw_msg_frame(m[i], 0))[0], 'a' + i);
		tw_msg_free(m[i]);
	}
	wire_check_msg(m[2], &w[2]);
	tw_msg_free(m[2]);
	ck_assert_uint_eq(stats_now().blocks_live, before.blocks_live);
	for (int i = 0; i < 6; i++)
		wire_free(&w[i]);
}
END_TEST

/* The receiver is dropped (the comm closed) with read-ahead bytes
 * pending: right after the read, after part of them went into a small
 * body, after part into a large message's frames. Nothing is left. */
START_TEST(gulp_fini_with_carry)
{
	size_t small[] = {1}, mid[] = {100}, large[] = {3, 70000};
	struct tw__limits l = limits(TW_DEFAULT_SMALL_FRAME_BYTES);
	tw_stats before = stats_now();
	struct wire a, b, c;
	uint8_t buf[256];
	size_t used;
	struct tw__rx rx;
	wire_make(&a, small, 1);
	wire_make(&b, mid, 1);
	wire_make(&c, large, 2);
	for (int stage = 0; stage < 3; stage++) {
		size_t len = 0;
		tw__rx_init(&rx, &l);
		rx.gulp_max = 4096;
		gulp_warm_up(&rx, 28);
		memcpy(buf, a.bytes, a.len);
		len = a.len;
		if (stage < 2) {
			memcpy(buf + len, b.bytes, 60);
			len += 60;
		} else {
			memcpy(buf + len, c.bytes, 60);
			len += 60;
		}
		ck_assert_int_eq(gulp_read(&rx, buf, len, &used), 1);
		ck_assert_uint_eq(used, 16 + 64);
		ck_assert(tw__rx_pending(&rx));
		tw_msg_free(tw__rx_take(&rx));
		if (stage > 0) {
			ck_assert_int_eq(tw__rx_replay(&rx), 0);
			ck_assert(!tw__rx_pending(&rx));
			ck_assert(!tw__rx_idle(&rx));
			ck_assert_int_eq(rx.phase, stage == 1 ? RX_SMALL : RX_FRAMES);
		}
		tw__rx_fini(&rx);
		ck_assert_uint_eq(stats_now().blocks_live, before.blocks_live);
	}
	wire_free(&a);
	wire_free(&b);
	wire_free(&c);
}
END_TEST

/* A bad head inside the read-ahead bytes, right after a good message:
 * the good one is delivered, then the error is the head's own, sticky,
 * and nothing is pending or leaked. */
START_TEST(gulp_bad_head_in_carry)
{
	static const uint64_t heads[][2] = {
		{16, 0}, {UINT64_C(1) << 40, 1}, {8 + 8 * 70000, 70000}, {7, 1}};
	static const int codes[] = {TW_ENOFRAMES, TW_ETOOBIG, TW_ETOOMANY, TW_ELENGTH};
	size_t small[] = {1};
	struct tw__limits l = limits(TW_DEFAULT_SMALL_FRAME_BYTES);
	tw_stats before = stats_now();
	struct wire a;
	wire_make(&a, small, 1);
	for (int i = 0; i < 4; i++) {
		struct tw__rx rx;
		struct iovec iov[4];
		uint8_t buf[64] = {0};
		size_t used;
		tw_msg *m;
		memcpy(buf, a.bytes, a.len);
		memcpy(buf + a.len, heads[i], 16);
		tw__rx_init(&rx, &l);
		rx.gulp_max = 4096;
		gulp_warm_up(&rx, 28);
		ck_assert_int_eq(gulp_read(&rx, buf, a.len + 16 + 10, &used), 1);
		m = tw__rx_take(&rx);
		wire_check_msg(m, &a);
		tw_msg_free(m);
		ck_assert_int_eq(tw__rx_check_head(&rx), 0);
		ck_assert(tw__rx_pending(&rx));
		ck_assert_int_eq(tw__rx_replay(&rx), codes[i]);
		ck_assert(!tw__rx_pending(&rx));
		ck_assert_int_eq(tw__rx_replay(&rx), codes[i]);
		ck_assert_int_eq(tw__rx_check_head(&rx), codes[i]);
		ck_assert_int_eq(tw__rx_want(&rx, iov, 4), codes[i]);
		ck_assert_int_eq(tw__rx_advance(&rx, 0), codes[i]);
		ck_assert_ptr_null(tw__rx_take(&rx));
		tw__rx_fini(&rx);
		ck_assert_uint_eq(stats_now().blocks_live, before.blocks_live);
	}
	wire_free(&a);
}
END_TEST

/* The same three messages as one stream in random pieces. */
START_TEST(stream_random_splits)
{
	size_t a_lens[] = {3, 0, 5}, b_lens[] = {100000, 1}, c_lens[] = {0};
	struct tw__limits l = limits(16);
	uint64_t seed = 0x5eed0400;
	struct wire a, b, c;
	uint8_t *buf;
	size_t len;
	wire_make(&a, a_lens, 3);
	wire_make(&b, b_lens, 2);
	wire_make(&c, c_lens, 1);
	len = a.len + b.len + c.len;
	buf = malloc(len);
	memcpy(buf, a.bytes, a.len);
	memcpy(buf + a.len, b.bytes, b.len);
	memcpy(buf + a.len + b.len, c.bytes, c.len);
	for (int iter = 0; iter < 50; iter++) {
		struct tw__rx rx;
		tw_msg *m[MAX_MSGS];
		tw__rx_init(&rx, &l);
		ck_assert_uint_eq(recv_stream(&rx, buf, len, &seed, iter % 2 ? 40 : 20000, m), 3);
		wire_check_msg(m[0], &a);
		wire_check_msg(m[1], &b);
		wire_check_msg(m[2], &c);
		for (int i = 0; i < 3; i++)
			tw_msg_free(m[i]);
		tw__rx_fini(&rx);
	}
	free(buf);
	wire_free(&a);
	wire_free(&b);
	wire_free(&c);
}
END_TEST

/* A message cut short: nothing is delivered and fini frees what was
 * placed. */
START_TEST(truncated)
{
	size_t lens[] = {10, 300 * KIB, 70 * KIB};
	struct tw__limits l = limits(TW_DEFAULT_SMALL_FRAME_BYTES);
	tw_stats before = stats_now();
	struct wire w;
	struct tw__rx rx;
	size_t used;
	wire_make(&w, lens, 3);
	tw__rx_init(&rx, &l);
	ck_assert_int_eq(tw__rx_feed(&rx, w.bytes, w.len - 1, &used), 0);
	ck_assert_uint_eq(used, w.len - 1);
	ck_assert(!tw__rx_idle(&rx));
	ck_assert_ptr_null(tw__rx_take(&rx));
	tw__rx_fini(&rx);
	ck_assert_uint_eq(stats_now().blocks_live, before.blocks_live);
	wire_free(&w);
}
END_TEST

/* The message limit (docs/design.md, Limits and defaults): a peer-declared length is checked
 * against the limit (64 MiB here) as soon as its 8 bytes are in, before anything is allocated; the
 * envelope forms without `total` read as a total that is too small. The other bad heads are refused
 * before allocating too. */
struct bad_head {
	const char *name;
	const char *hex;
	int code;
	size_t used; /* bytes consumed when the error is seen */
};

static const struct bad_head bad_heads[] = {
	{"dask-tcp total f0ff..ff, then silence", "f0ffffffffffffff", TW_ETOOBIG, 8},
	{"envelope n=1, len 0x7fff..ff", "0100000000000000 ffffffffffffff7f", TW_ELENGTH, 8},
	{"dask-tcp form of it", "0f00000000000080 0100000000000000 ffffffffffffff7f", TW_ETOOBIG,
	 8},
	{"envelope n=1, 1 GiB frame", "0100000000000000 0000004000000000", TW_ELENGTH, 8},
	{"dask-tcp 1 GiB frame", "1000004000000000 0100000000000000 0000004000000000", TW_ETOOBIG,
	 8},
	{"1 GiB total alone", "0000004000000000", TW_ETOOBIG, 8},
	{"total at the limit, 1 GiB frame", "0000000400000000 0100000000000000 0000004000000000",
	 TW_ELENGTH, 24},
	{"N = 0", "0800000000000000 0000000000000000", TW_ENOFRAMES, 16},
	{"N above max_frames", "1000080000000000 0100010000000000", TW_ETOOMANY, 16},
	{"total too small for N", "1000000000000000 0200000000000000", TW_ELENGTH, 16},
};
#define N_BAD_HEADS (sizeof(bad_heads) / sizeof(bad_heads[0]))

/* Feed c in pieces of `piece` bytes; one byte at a time, the error must
 * come right at byte c->used. */
static void check_bad_head(const struct bad_head *c, size_t piece)
{
	struct tw__limits l = limits(TW_DEFAULT_SMALL_FRAME_BYTES);
	tw_stats before = stats_now(), st;
	struct tw__rx rx;
	uint8_t bytes[24];
	size_t len = hex_bytes(c->hex, bytes, sizeof(bytes)), off = 0, used;
	int rv = 0;
	tw__rx_init(&rx, &l);
	while (rv == 0 && off < len) {
		size_t k = piece < len - off ? piece : len - off;
		rv = tw__rx_feed(&rx, bytes + off, k, &used);
		off += used;
	}
	ck_assert_msg(rv == c->code, "%s: got %d, want %d", c->name, rv, c->code);
	if (piece == 1)
		ck_assert_msg(off == c->used, "%s: error after %zu bytes, want %zu", c->name, off,
			      c->used);
	ck_assert_ptr_null(rx.body);
	ck_assert_ptr_null(rx.msg);
	st = stats_now();
	ck_assert_uint_eq(st.blocks_allocated, before.blocks_allocated);
	ck_assert_uint_eq(st.block_bytes_allocated, before.block_bytes_allocated);
	ck_assert_int_eq(tw__rx_feed(&rx, bytes, len, &used), c->code);
	ck_assert_uint_eq(used, 0);
	tw__rx_fini(&rx);
}

START_TEST(bad_head_rejected)
{
	check_bad_head(&bad_heads[_i], 1);
	check_bad_head(&bad_heads[_i], 5);
	check_bad_head(&bad_heads[_i], 24);
}
END_TEST

int main(void)
{
	TCase *feed = ts_tcase("feed", 0, NULL), *stream = ts_tcase("stream", 0, NULL);
	ts_add_loop(feed, 2 * N_SHAPES, TS_TESTS(bytewise, random_splits, want_advance));
	ts_add(stream, TS_TESTS(back_to_back, stream_random_splits, truncated, gulp_one_read,
				gulp_block_reused_when_free, gulp_mispredict_large));
	ts_add_loop(stream, 40, TS_TESTS(gulp_stream_random));
	ts_add_loop(stream, 2, TS_TESTS(gulp_pipelined));
	ts_add(stream,
	       TS_TESTS(gulp_slices_outlive_rx, gulp_fini_with_carry, gulp_bad_head_in_carry));
	ts_add_loop(stream, (int)N_BAD_HEADS, TS_TESTS(bad_head_rejected));
	return ts_main("frame_rx", 0,
		       TS_CASES(feed,
				ts_tcase("placement", 0,
					 TS_TESTS(placement_small_message, placement_small_boundary,
						  placement_large_message, placement_mixed,
						  placement_no_pinning)),
				ts_tcase("hook", 0,
					 TS_TESTS(hook_span, hook_whole_and_small, hook_errors,
						  hook_small_never_asked)),
				stream));
}
