/* SPDX-License-Identifier: BSD-3-Clause */
/* Unit tests: merging sub-frames (protocol/merge.c; docs/design.md,
 * Messages). Adjacent slices of one block become a view, anything else one
 * copy; both outcomes are counted. */
#include <check.h>
#include <stdint.h>
#include <string.h>

#include <taskwire/error.h>
#include <taskwire/merge.h>

#include "core/block.h"
#include "tests/unit.h"
#include "tests/support/suite.h"

/* A block of `size` bytes holding pattern(0, j). */
static tw_block *filled(size_t size)
{
	tw_block *b;
	ck_assert_int_eq(tw_block_new(size, &b), 0);
	for (size_t j = 0; j < size; j++)
		tw_block_data(b)[j] = pattern(0, j);
	return b;
}

struct delta {
	uint64_t zero_copy, copied, bytes_copied;
};

static struct delta since(const tw_stats *before)
{
	tw_stats st = stats_now();
	struct delta d = {st.merges_zero_copy - before->merges_zero_copy,
			  st.merges_copied - before->merges_copied,
			  st.payload_bytes_copied - before->payload_bytes_copied};
	return d;
}

/* out holds the bytes of parts in order. */
static void check_bytes(const tw_slice *out, const tw_slice *parts, size_t n)
{
	size_t off = 0;
	for (size_t i = 0; i < n; i++) {
		if (parts[i].len > 0)
			REQUIRE(memcmp(tw_slice_data(out) + off, tw_slice_data(&parts[i]),
				       parts[i].len) == 0);
		off += parts[i].len;
	}
	ck_assert_uint_eq(out->len, off);
}

START_TEST(adjacent_is_view)
{
	tw_block *b = filled(100);
	tw_slice parts[] = {tw__slice(b, 10, 20), tw__slice(b, 30, 30), tw__slice(b, 60, 5)};
	tw_stats before = stats_now();
	struct delta d;
	tw_slice out;
	ck_assert_int_eq(tw_merge(parts, 3, &out), 0);
	d = since(&before);
	ck_assert_ptr_eq(out.block, b);
	ck_assert_uint_eq(out.offset, 10);
	ck_assert_uint_eq(out.len, 55);
	ck_assert_ptr_eq(tw_slice_data(&out), tw_slice_data(&parts[0]));
	ck_assert_uint_eq(d.zero_copy, 1);
	ck_assert_uint_eq(d.copied, 0);
	ck_assert_uint_eq(d.bytes_copied, 0);
	tw_block_free(out.block);
	tw_block_free(b);
}
END_TEST

/* The view holds its own reference: the parts' block outlives the
 * caller's reference. */
struct released {
	int calls;
};

static void on_release(void *data, void *arg)
{
	(void)data;
	((struct released *)arg)->calls++;
}

START_TEST(view_holds_block)
{
	uint8_t mem[64];
	struct released r = {0};
	tw_block *b;
	tw_slice parts[2], out;
	memset(mem, 7, sizeof(mem));
	ck_assert_int_eq(tw_block_wrap(mem, sizeof(mem), on_release, &r, &b), 0);
	parts[0] = tw__slice(b, 0, 32);
	parts[1] = tw__slice(b, 32, 32);
	ck_assert_int_eq(tw_merge(parts, 2, &out), 0);
	ck_assert_ptr_eq(tw_slice_data(&out), mem);
	tw_block_free(b);
	ck_assert_int_eq(r.calls, 0);
	ck_assert_uint_eq(tw_slice_data(&out)[63], 7);
	tw_block_free(out.block);
	ck_assert_int_eq(r.calls, 1);
}
END_TEST

/* An empty part where the previous one ends keeps the parts adjacent. */
START_TEST(adjacent_with_empty_part)
{
	tw_block *b = filled(100);
	tw_slice parts[] = {tw__slice(b, 0, 20), tw__slice(b, 20, 0), tw__slice(b, 20, 80)};
	tw_stats before = stats_now();
	tw_slice out;
	ck_assert_int_eq(tw_merge(parts, 3, &out), 0);
	ck_assert_ptr_eq(tw_slice_data(&out), tw_block_data(b));
	ck_assert_uint_eq(out.len, 100);
	ck_assert_uint_eq(since(&before).zero_copy, 1);
	tw_block_free(out.block);
	tw_block_free(b);
}
END_TEST

static void check_copied(const tw_slice *parts, size_t n, size_t total)
{
	tw_stats before = stats_now();
	struct delta d;
	tw_slice out;
	ck_assert_int_eq(tw_merge(parts, n, &out), 0);
	d = since(&before);
	ck_assert_ptr_nonnull(out.block);
	for (size_t i = 0; i < n; i++)
		ck_assert_ptr_ne(out.block, parts[i].block);
	ck_assert_uint_eq(out.offset, 0);
	ck_assert_uint_eq(tw_block_size(out.block), total);
	check_bytes(&out, parts, n);
	ck_assert_uint_eq(d.zero_copy, 0);
	ck_assert_uint_eq(d.copied, 1);
	ck_assert_uint_eq(d.bytes_copied, total);
	tw_block_free(out.block);
}

START_TEST(gap_is_copy)
{
	tw_block *b = filled(100);
	tw_slice gap[] = {tw__slice(b, 0, 10), tw__slice(b, 20, 10)};
	tw_slice reversed[] = {tw__slice(b, 50, 25), tw__slice(b, 25, 25)};
	tw_slice overlap[] = {tw__slice(b, 0, 30), tw__slice(b, 20, 30)};
	check_copied(gap, 2, 20);
	check_copied(reversed, 2, 50);
	check_copied(overlap, 2, 60);
	tw_block_free(b);
}
END_TEST

START_TEST(cross_block_is_copy)
{
	tw_block *a = filled(50), *b = filled(300000), *c = filled(10);
	tw_slice parts[] = {tw__slice(a, 0, 50), tw__slice(b, 0, 300000), tw__slice(c, 3, 7)};
	tw_slice two[] = {tw__slice(a, 40, 10), tw__slice(c, 0, 10)};
	/* Offsets that line up, in different blocks. */
	tw_slice lined_up[] = {tw__slice(c, 0, 4), tw__slice(a, 4, 46)};
	check_copied(parts, 3, 300057);
	check_copied(two, 2, 20);
	check_copied(lined_up, 2, 50);
	tw_block_free(a);
	tw_block_free(b);
	tw_block_free(c);
}
END_TEST

START_TEST(no_parts)
{
	tw_stats before = stats_now();
	struct delta d;
	tw_slice out = {NULL, 1, 1};
	ck_assert_int_eq(tw_merge(NULL, 0, &out), 0);
	ck_assert_ptr_null(out.block);
	ck_assert_uint_eq(out.offset, 0);
	ck_assert_uint_eq(out.len, 0);
	d = since(&before);
	ck_assert_uint_eq(d.zero_copy + d.copied + d.bytes_copied, 0);
}
END_TEST

START_TEST(single_part)
{
	tw_block *b = filled(40);
	tw_slice part = tw__slice(b, 5, 10), out;
	tw_stats before = stats_now();
	ck_assert_int_eq(tw_merge(&part, 1, &out), 0);
	ck_assert_ptr_eq(out.block, b);
	ck_assert_uint_eq(out.offset, 5);
	ck_assert_uint_eq(out.len, 10);
	ck_assert_ptr_eq(tw_slice_data(&out), tw_block_data(b) + 5);
	ck_assert_uint_eq(since(&before).zero_copy, 1);
	ck_assert_uint_eq(since(&before).bytes_copied, 0);
	tw_block_free(out.block);
	tw_block_free(b);
}
END_TEST

/* An empty result has no block (merge.h), whatever the parts view, so it
 * pins nothing; nothing is copied. */
START_TEST(empty_result)
{
	tw_block *b = filled(10), *c = filled(10);
	tw_slice same[] = {tw__slice(b, 4, 0), tw__slice(b, 4, 0)};
	tw_slice apart[] = {tw__slice(b, 4, 0), tw__slice(c, 0, 0)};
	tw_slice none[] = {{NULL, 0, 0}, {NULL, 0, 0}};
	tw_slice *cases[] = {same, apart, none};
	tw_stats before = stats_now();
	for (size_t i = 0; i < 3; i++) {
		tw_slice out;
		ck_assert_int_eq(tw_merge(cases[i], 2, &out), 0);
		ck_assert_ptr_null(out.block);
		ck_assert_uint_eq(out.len, 0);
	}
	ck_assert_uint_eq(since(&before).bytes_copied, 0);
	ck_assert_uint_eq(since(&before).copied, 0);
	tw_block_free(b);
	tw_block_free(c);
}
END_TEST

START_TEST(bad_args)
{
	tw_block *b = filled(4);
	tw_slice part = tw__slice(b, 0, 4), out;
	ck_assert_int_eq(tw_merge(&part, 1, NULL), TW_EINVAL);
	ck_assert_int_eq(tw_merge(NULL, 2, &out), TW_EINVAL);
	tw_block_free(b);
}
END_TEST

int main(void)
{
	return ts_main_one("merge", 0, 0,
			   TS_TESTS(adjacent_is_view, view_holds_block, adjacent_with_empty_part,
				    gap_is_copy, cross_block_is_copy, no_parts, single_part,
				    empty_result, bad_args));
}
