/* SPDX-License-Identifier: BSD-3-Clause */
/* Dask messages: tw_builder -> tw_decode round trips, bad input, and the
 * zstd inputs that lie about their size or are empty (the decoder never
 * allocates past what the frame may hold: docs/design.md, Messages), all
 * without sockets; then the bad inputs again over loopback comms
 * (TCase over_comm): a server that decodes each message aborts the comm
 * that sent a bad one, and its other comms keep working. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <check.h>
#include <zstd.h>
#ifdef TW_HAVE_LZ4
#include <lz4.h>
#endif

#include "tests/support/dask.h"
#include "tests/support/suite.h"
#include "tests/support/pack.h"

#define KB 1000

/* Building frames by hand. */

static tw_msg *new_msg(void)
{
	tw_msg *m;
	ck_assert_int_eq(tw_msg_new(&m), 0);
	return m;
}

static void append(tw_msg *m, const void *p, size_t n)
{
	ck_assert_int_eq(tw_msg_append_copy(m, p, n), 0);
}

/* Frame 0: {"op": "echo", "data": {key: k}}. */
static void frame0_holder(tw_msg *m, const char *key, uint64_t k)
{
	struct ts_pack f;
	msgpack_packer *pk = ts_pack_start(&f);
	msgpack_pack_map(pk, 2);
	tw_msgpack_pack_str(pk, "op");
	tw_msgpack_pack_str(pk, "echo");
	tw_msgpack_pack_str(pk, "data");
	msgpack_pack_map(pk, 1);
	tw_msgpack_pack_str(pk, key);
	msgpack_pack_uint64(pk, k);
	ts_pack_append(&f, m);
}

static void frame0_one(tw_msg *m)
{
	frame0_holder(m, "__Serialized__", 1);
}

/* A sub-header: serializer "dask", num-sub-frames, a compression entry per
 * sub-frame (codecs NULL: no key; codecs[i] NULL: nil), and with split set
 * one logical frame made of all the sub-frames. */
static void sub_header(tw_msg *m, uint64_t num, const char *const *codecs, int split)
{
	struct ts_pack f;
	msgpack_packer *pk = ts_pack_start(&f);
	msgpack_pack_map(pk, 2 + (codecs != NULL) + 2 * (split != 0));
	tw_msgpack_pack_str(pk, "serializer");
	tw_msgpack_pack_str(pk, "dask");
	tw_msgpack_pack_str(pk, "num-sub-frames");
	msgpack_pack_uint64(pk, num);
	if (codecs != NULL) {
		tw_msgpack_pack_str(pk, "compression");
		msgpack_pack_array(pk, num);
		for (uint64_t i = 0; i < num; i++) {
			if (codecs[i] != NULL)
				tw_msgpack_pack_str(pk, codecs[i]);
			else
				msgpack_pack_nil(pk);
		}
	}
	if (split) {
		tw_msgpack_pack_str(pk, "split-num-sub-frames");
		msgpack_pack_array(pk, 1);
		msgpack_pack_uint64(pk, num);
		tw_msgpack_pack_str(pk, "split-offsets");
		msgpack_pack_array(pk, 1);
		msgpack_pack_uint64(pk, 0);
	}
	ts_pack_append(&f, m);
}

/* frame 0, a sub-header naming `codec` (NULL: nil) and one frame. */
static tw_msg *msg_with(const char *codec, const void *frame, size_t len)
{
	const char *codecs[1] = {codec};
	tw_msg *m = new_msg();
	frame0_one(m);
	sub_header(m, 1, codecs, 0);
	append(m, frame, len);
	return m;
}

static tw_block *pattern_block(size_t n, unsigned seed)
{
	tw_block *b;
	ck_assert_int_eq(tw_block_new(n, &b), 0);
	ts_fill(tw_block_data(b), n, seed);
	return b;
}

static void check_pattern(const tw_slice *s, size_t n, unsigned seed)
{
	long long at;
	ck_assert_uint_eq(s->len, n);
	at = n > 0 ? ts_check(tw_slice_data(s), n, seed) : -1;
	ck_assert_msg(at == -1, "byte %lld of %zu differs", at, n);
}

/* "28 b5 2f fd ..." -> bytes; returns the count. */
static size_t unhex(const char *s, uint8_t *out)
{
	size_t n = 0;
	unsigned v;
	while (*s != '\0') {
		if (*s == ' ') {
			s++;
			continue;
		}
		ck_assert_int_eq(sscanf(s, "%2x", &v), 1);
		out[n++] = (uint8_t)v;
		s += 2;
	}
	return n;
}

/* Compressed frames. */

static uint8_t *zstd_of(const void *p, size_t n, size_t *len)
{
	size_t cap = ZSTD_compressBound(n);
	uint8_t *z = malloc(cap);
	ck_assert_ptr_nonnull(z);
	*len = ZSTD_compress(z, cap, p, n, 3);
	ck_assert(!ZSTD_isError(*len));
	return z;
}

/* A single-segment zstd frame declaring `declared` bytes (8-byte content
 * size field) with one raw block of content[0..n). */
static uint8_t *zstd_raw(const void *content, size_t n, uint64_t declared, size_t *len)
{
	uint8_t *z = malloc(4 + 1 + 8 + 3 + n);
	uint32_t bh = (uint32_t)(n << 3) | 1; /* raw block, last */
	ck_assert_ptr_nonnull(z);
	memcpy(z, "\x28\xb5\x2f\xfd\xe0", 5);
	for (int i = 0; i < 8; i++)
		z[5 + i] = (uint8_t)(declared >> (8 * i));
	z[13] = (uint8_t)bh;
	z[14] = (uint8_t)(bh >> 8);
	z[15] = (uint8_t)(bh >> 16);
	if (n > 0)
		memcpy(z + 16, content, n);
	*len = 16 + n;
	return z;
}

#ifdef TW_HAVE_LZ4
/* Dask's lz4: u32 LE size prefix (here `prefix`, whatever the data) and a
 * raw LZ4 block. */
static uint8_t *lz4_of(const void *p, size_t n, uint32_t prefix, size_t *len)
{
	int cap = LZ4_compressBound((int)n);
	uint8_t *z = malloc(4 + (size_t)cap);
	int got;
	ck_assert_ptr_nonnull(z);
	for (int i = 0; i < 4; i++)
		z[i] = (uint8_t)(prefix >> (8 * i));
	got = LZ4_compress_default(p, (char *)z + 4, (int)n, cap);
	ck_assert_int_gt(got, 0);
	*len = 4 + (size_t)got;
	return z;
}
#endif

/* Decoding. */

static tw_decoded *decode_ok(const tw_msg *m)
{
	char why[256] = "";
	tw_decoded *d = NULL;
	int rv = tw_decode(m, NULL, &d, why, sizeof(why));
	ck_assert_msg(rv == 0, "decode: %s: %s", tw_strerror(rv), why);
	return d;
}

static const tw_payload *data_payload(const tw_decoded *d)
{
	const tw_payload *pl =
		tw_decoded_payload(d, tw_msgpack_map_get(tw_decoded_root(d), "data"));
	ck_assert_ptr_nonnull(pl);
	return pl;
}

/* The codec named for sub-frame 0 of pl ("" for nil). */
static void codec0(const tw_payload *pl, char *buf, size_t len)
{
	const msgpack_object *c = tw_msgpack_map_get(pl->sub_header, "compression");
	ck_assert(c != NULL && c->type == MSGPACK_OBJECT_ARRAY && c->via.array.size >= 1);
	c = &c->via.array.ptr[0];
	buf[0] = '\0';
	if (c->type == MSGPACK_OBJECT_STR)
		snprintf(buf, len, "%.*s", (int)c->via.str.size, c->via.str.ptr);
	else
		ck_assert_int_eq(c->type, MSGPACK_OBJECT_NIL);
}

/* A message carrying `data` as bytes, built with `codec`. */
static tw_msg *build_bytes(const char *codec, const tw_slice *data)
{
	tw_builder *b;
	tw_msg *m;
	ck_assert_int_eq(tw_builder_new(codec, &b), 0);
	msgpack_pack_map(tw_builder_packer(b), 2);
	tw_msgpack_pack_str(tw_builder_packer(b), "op");
	tw_msgpack_pack_str(tw_builder_packer(b), "echo");
	tw_msgpack_pack_str(tw_builder_packer(b), "data");
	ck_assert_int_eq(tw_builder_pack_bytes(b, data), 0);
	ck_assert_int_eq(tw_builder_finish(b, &m), 0);
	tw_builder_free(b);
	return m;
}

static const char *const codecs[] = {
	"zstd",
#ifdef TW_HAVE_LZ4
	"lz4",
#endif
};
#define NCODECS ((int)(sizeof(codecs) / sizeof(codecs[0])))

/* Round trips. */

START_TEST(rt_bytes)
{
	tw_block *pat = pattern_block(1000, 4);
	tw_msg *m = build_bytes(NULL, &(tw_slice){pat, 0, 1000});
	tw_decoded *d = decode_ok(m);
	const tw_payload *pl = data_payload(d);
	const msgpack_object *ts;
	ck_assert_uint_eq(tw_msg_nframes(m), 3);
	ck_assert(tw_msgpack_str_eq(tw_msgpack_map_get(tw_decoded_root(d), "op"), "echo"));
	ck_assert_int_eq(pl->kind, TW_PAYLOAD_SERIALIZED);
	ck_assert_uint_eq(pl->index, 1);
	ck_assert_str_eq(pl->serializer, "dask");
	ck_assert(tw_msgpack_str_eq(tw_msgpack_map_get(pl->sub_header, "type"), "bytes"));
	ts = tw_msgpack_map_get(pl->sub_header, "type-serialized");
	ck_assert(ts != NULL && ts->type == MSGPACK_OBJECT_BIN && ts->via.bin.size == 33);
	ck_assert_mem_eq(ts->via.bin.ptr, "\x80\x05\x95\x16", 4);
	ck_assert_uint_eq(pl->nframes, 1);
	check_pattern(&pl->frames[0], 1000, 4);
	ck_assert_ptr_eq(pl->frames[0].block, pat); /* referenced, never copied */
	tw_decoded_free(d);
	tw_msg_free(m);
	tw_block_free(pat);
}
END_TEST

START_TEST(rt_msgpack)
{
	struct ts_pack v;
	msgpack_packer *pk = ts_pack_start(&v);
	tw_builder *b;
	tw_msg *m;
	tw_decoded *d;
	const tw_payload *pl;
	msgpack_pack_array(pk, 3);
	msgpack_pack_int(pk, 1);
	tw_msgpack_pack_str(pk, "two");
	msgpack_pack_map(pk, 1);
	tw_msgpack_pack_str(pk, "k");
	msgpack_pack_nil(pk);
	ts_builder_map(&b, 1);
	tw_msgpack_pack_str(tw_builder_packer(b), "data");
	ck_assert_int_eq(tw_builder_pack_msgpack(b, v.sb.data, v.sb.size), 0);
	ck_assert_int_eq(tw_builder_finish(b, &m), 0);
	tw_builder_free(b);
	d = decode_ok(m);
	pl = data_payload(d);
	ck_assert_str_eq(pl->serializer, "msgpack");
	ck_assert_uint_eq(pl->nframes, 1);
	ck_assert_uint_eq(pl->frames[0].len, v.sb.size);
	ck_assert_mem_eq(tw_slice_data(&pl->frames[0]), v.sb.data, v.sb.size);
	msgpack_sbuffer_destroy(&v.sb);
	tw_decoded_free(d);
	tw_msg_free(m);
}
END_TEST

/* {"a": [P1, {"b": P3}], "c": {"d": M5}, "e": [P7]}: payload groups in
 * the order packed, each found from its placeholder. */
START_TEST(rt_nested)
{
	tw_block *pat = pattern_block(20000, 1);
	msgpack_packer *pk;
	const msgpack_object *root, *a, *holders[4];
	tw_builder *b;
	tw_msg *m;
	tw_decoded *d;
	pk = ts_builder_map(&b, 3);
	tw_msgpack_pack_str(pk, "a");
	msgpack_pack_array(pk, 2);
	ck_assert_int_eq(tw_builder_pack_bytes(b, &(tw_slice){pat, 0, 3}), 0);
	msgpack_pack_map(pk, 1);
	tw_msgpack_pack_str(pk, "b");
	ck_assert_int_eq(tw_builder_pack_bytes(b, &(tw_slice){pat, 0, 20000}), 0);
	tw_msgpack_pack_str(pk, "c");
	msgpack_pack_map(pk, 1);
	tw_msgpack_pack_str(pk, "d");
	ck_assert_int_eq(tw_builder_pack_msgpack(b, "\x93\x01\x02\x03", 4), 0);
	tw_msgpack_pack_str(pk, "e");
	msgpack_pack_array(pk, 1);
	ck_assert_int_eq(tw_builder_pack_bytes(b, &(tw_slice){NULL, 0, 0}), 0);
	ck_assert_int_eq(tw_builder_finish(b, &m), 0);
	tw_builder_free(b);
	ck_assert_uint_eq(tw_msg_nframes(m), 9);
	d = decode_ok(m);
	root = tw_decoded_root(d);
	a = tw_msgpack_map_get(root, "a");
	holders[0] = &a->via.array.ptr[0];
	holders[1] = tw_msgpack_map_get(&a->via.array.ptr[1], "b");
	holders[2] = tw_msgpack_map_get(tw_msgpack_map_get(root, "c"), "d");
	holders[3] = &tw_msgpack_map_get(root, "e")->via.array.ptr[0];
	ck_assert_uint_eq(tw_decoded_npayloads(d), 4);
	for (size_t i = 0; i < 4; i++) {
		ck_assert_ptr_eq(tw_decoded_payload(d, holders[i]), tw_decoded_payload_at(d, i));
		ck_assert_uint_eq(tw_decoded_payload_at(d, i)->index, 1 + 2 * i);
		ck_assert_uint_eq(tw_decoded_payload_at(d, i)->nframes, 1);
	}
	ck_assert_ptr_null(tw_decoded_payload(d, root));
	check_pattern(&tw_decoded_payload_at(d, 0)->frames[0], 3, 1);
	check_pattern(&tw_decoded_payload_at(d, 1)->frames[0], 20000, 1);
	ck_assert_mem_eq(tw_slice_data(&tw_decoded_payload_at(d, 2)->frames[0]), "\x93\x01\x02\x03",
			 4);
	ck_assert_str_eq(tw_decoded_payload_at(d, 2)->serializer, "msgpack");
	ck_assert_uint_eq(tw_decoded_payload_at(d, 3)->frames[0].len, 0);
	tw_decoded_free(d);
	tw_msg_free(m);
	tw_block_free(pat);
}
END_TEST

/* Zero-length payloads, with and without a codec: never compressed. */
START_TEST(rt_zero_length)
{
	const char *codec = _i == 0 ? NULL : codecs[_i - 1];
	tw_msg *m = build_bytes(codec, &(tw_slice){NULL, 0, 0});
	tw_decoded *d = decode_ok(m);
	const tw_payload *pl = data_payload(d);
	char c[16];
	ck_assert_uint_eq(tw_msg_frame(m, 2)->len, 0);
	ck_assert_uint_eq(pl->nframes, 1);
	ck_assert_uint_eq(pl->frames[0].len, 0);
	codec0(pl, c, sizeof(c));
	ck_assert_str_eq(c, "");
	tw_decoded_free(d);
	tw_msg_free(m);
}
END_TEST

/* 100 KB of compressible bytes: compressed on the wire, decoded back. */
START_TEST(rt_compressed)
{
	tw_block *pat = pattern_block(100 * KB, 8);
	tw_msg *m = build_bytes(codecs[_i], &(tw_slice){pat, 0, 100 * KB});
	tw_decoded *d;
	const tw_payload *pl;
	char c[16];
	ck_assert_uint_lt(tw_msg_frame(m, 2)->len, 100 * KB * 9 / 10);
	d = decode_ok(m);
	pl = data_payload(d);
	codec0(pl, c, sizeof(c));
	ck_assert_str_eq(c, codecs[_i]);
	check_pattern(&pl->frames[0], 100 * KB, 8);
	ck_assert_ptr_ne(pl->frames[0].block, pat);
	tw_decoded_free(d);
	tw_msg_free(m);
	tw_block_free(pat);
}
END_TEST

/* 1 MiB of zeros: the highest ratio either codec reaches. */
START_TEST(rt_compressed_zeros)
{
	tw_block *z;
	tw_msg *m;
	tw_decoded *d;
	const tw_payload *pl;
	ck_assert_int_eq(tw_block_new(1 << 20, &z), 0);
	memset(tw_block_data(z), 0, 1 << 20);
	m = build_bytes(codecs[_i], &(tw_slice){z, 0, 1 << 20});
	ck_assert_uint_lt(tw_msg_frame(m, 2)->len, 1 << 14);
	d = decode_ok(m);
	pl = data_payload(d);
	ck_assert_uint_eq(pl->frames[0].len, 1 << 20);
	ck_assert_mem_eq(tw_slice_data(&pl->frames[0]), tw_block_data(z), 1 << 20);
	tw_decoded_free(d);
	tw_msg_free(m);
	tw_block_free(z);
}
END_TEST

/* Random bytes do not compress: sent as they are, referenced. */
START_TEST(rt_incompressible)
{
	tw_block *r;
	uint64_t seed = 42;
	tw_msg *m;
	tw_decoded *d;
	const tw_payload *pl;
	char c[16];
	ck_assert_int_eq(tw_block_new(100 * KB, &r), 0);
	for (size_t i = 0; i < 100 * KB; i += 8) {
		uint64_t z = (seed += UINT64_C(0x9e3779b97f4a7c15));
		z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
		z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
		memcpy(tw_block_data(r) + i, &z, 8);
	}
	m = build_bytes(codecs[_i], &(tw_slice){r, 0, 100 * KB});
	ck_assert_ptr_eq(tw_msg_frame(m, 2)->block, r);
	ck_assert_uint_eq(tw_msg_frame(m, 2)->len, 100 * KB);
	d = decode_ok(m);
	pl = data_payload(d);
	codec0(pl, c, sizeof(c));
	ck_assert_str_eq(c, "");
	ck_assert_ptr_eq(pl->frames[0].block, r);
	tw_decoded_free(d);
	tw_msg_free(m);
	tw_block_free(r);
}
END_TEST

/* Frames below 10,000 bytes stay uncompressed; from 10,000 they do not. */
START_TEST(rt_threshold)
{
	tw_block *pat = pattern_block(10000, 0);
	for (size_t n = 9999; n <= 10000; n++) {
		tw_msg *m = build_bytes(codecs[_i], &(tw_slice){pat, 0, n});
		tw_decoded *d = decode_ok(m);
		const tw_payload *pl = data_payload(d);
		char c[16];
		codec0(pl, c, sizeof(c));
		ck_assert_str_eq(c, n < 10000 ? "" : codecs[_i]);
		check_pattern(&pl->frames[0], n, 0);
		tw_decoded_free(d);
		tw_msg_free(m);
	}
	tw_block_free(pat);
}
END_TEST

/* A payload split into three sub-frames, as Python splits shards. */
static tw_msg *split_msg(tw_block *const blocks[3], const size_t offs[3], const size_t lens[3])
{
	const char *none[3] = {NULL, NULL, NULL};
	tw_msg *m = new_msg();
	frame0_one(m);
	sub_header(m, 3, none, 1);
	for (int i = 0; i < 3; i++)
		ck_assert_int_eq(tw_msg_append(m, &(tw_slice){blocks[i], offs[i], lens[i]}), 0);
	return m;
}

/* Adjacent sub-frames of one block: one view, no copy. */
START_TEST(rt_split_adjacent)
{
	tw_block *pat = pattern_block(350, 2);
	tw_block *blocks[3] = {pat, pat, pat};
	size_t offs[3] = {0, 100, 300}, lens[3] = {100, 200, 50};
	tw_msg *m = split_msg(blocks, offs, lens);
	tw_stats before, after;
	tw_decoded *d;
	const tw_payload *pl;
	tw_stats_global(&before, sizeof(before));
	d = decode_ok(m);
	tw_stats_global(&after, sizeof(after));
	pl = data_payload(d);
	ck_assert_uint_eq(pl->nframes, 1);
	check_pattern(&pl->frames[0], 350, 2);
	ck_assert_ptr_eq(pl->frames[0].block, pat);
	ck_assert_uint_eq(after.merges_zero_copy - before.merges_zero_copy, 1);
	ck_assert_uint_eq(after.merges_copied, before.merges_copied);
	ck_assert_uint_eq(after.payload_bytes_copied, before.payload_bytes_copied);
	tw_decoded_free(d);
	tw_msg_free(m);
	tw_block_free(pat);
}
END_TEST

/* Sub-frames in separate blocks: one copy. */
START_TEST(rt_split_copied)
{
	tw_block *pat = pattern_block(350, 2), *other;
	tw_block *blocks[3];
	size_t offs[3] = {0, 0, 300}, lens[3] = {100, 200, 50};
	tw_msg *m;
	tw_stats before, after;
	tw_decoded *d;
	const tw_payload *pl;
	ck_assert_int_eq(tw_block_new(200, &other), 0);
	memcpy(tw_block_data(other), tw_block_data(pat) + 100, 200);
	blocks[0] = pat, blocks[1] = other, blocks[2] = pat;
	m = split_msg(blocks, offs, lens);
	tw_stats_global(&before, sizeof(before));
	d = decode_ok(m);
	tw_stats_global(&after, sizeof(after));
	pl = data_payload(d);
	ck_assert_uint_eq(pl->nframes, 1);
	check_pattern(&pl->frames[0], 350, 2);
	ck_assert_uint_eq(after.merges_copied - before.merges_copied, 1);
	ck_assert_uint_eq(after.payload_bytes_copied - before.payload_bytes_copied, 350);
	tw_decoded_free(d);
	tw_msg_free(m);
	tw_block_free(other);
	tw_block_free(pat);
}
END_TEST

/* Split sub-frames, one compressed with zstd, one plain. */
START_TEST(rt_split_compressed)
{
	const char *mixed[2] = {"zstd", NULL};
	tw_block *pat = pattern_block(25000, 6);
	size_t zlen;
	uint8_t *z = zstd_of(tw_block_data(pat), 20000, &zlen);
	tw_msg *m = new_msg();
	tw_decoded *d;
	const tw_payload *pl;
	frame0_one(m);
	sub_header(m, 2, mixed, 1);
	append(m, z, zlen);
	append(m, tw_block_data(pat) + 20000, 5000);
	d = decode_ok(m);
	pl = data_payload(d);
	ck_assert_uint_eq(pl->nframes, 1);
	check_pattern(&pl->frames[0], 25000, 6);
	tw_decoded_free(d);
	tw_msg_free(m);
	tw_block_free(pat);
	free(z);
}
END_TEST

/* A message {"data": {"__Pickled__": 1}} whose group is a pickle
 * (b"\x80\x05N") with nsub sub-frames, which the caller appends. */
static tw_msg *pickled_msg(unsigned nsub)
{
	struct ts_pack f;
	msgpack_packer *pk;
	tw_msg *m = new_msg();
	frame0_holder(m, "__Pickled__", 1);
	pk = ts_pack_start(&f);
	msgpack_pack_map(pk, 2);
	tw_msgpack_pack_str(pk, "pickled-obj");
	msgpack_pack_bin(pk, 3);
	msgpack_pack_bin_body(pk, "\x80\x05N", 3);
	tw_msgpack_pack_str(pk, "num-sub-frames");
	msgpack_pack_uint8(pk, (uint8_t)nsub);
	ts_pack_append(&f, m);
	return m;
}

/* {"__Pickled__": 1}: the same shape, kind PICKLED. */
START_TEST(rt_pickled)
{
	tw_msg *m = pickled_msg(1);
	tw_decoded *d;
	const tw_payload *pl;
	append(m, "0123456789", 10);
	d = decode_ok(m);
	pl = data_payload(d);
	ck_assert_int_eq(pl->kind, TW_PAYLOAD_PICKLED);
	ck_assert_str_eq(pl->serializer, "");
	ck_assert_uint_eq(pl->nframes, 1);
	ck_assert_mem_eq(tw_slice_data(&pl->frames[0]), "0123456789", 10);
	tw_decoded_free(d);
	tw_msg_free(m);
}
END_TEST

/* A group with no sub-frames (a pickle without buffers): no frames. */
START_TEST(rt_no_sub_frames)
{
	tw_msg *m = pickled_msg(0);
	tw_decoded *d;
	const tw_payload *pl;
	d = decode_ok(m);
	pl = data_payload(d);
	ck_assert_int_eq(pl->kind, TW_PAYLOAD_PICKLED);
	ck_assert_uint_eq(pl->nframes, 0);
	tw_decoded_free(d);
	tw_msg_free(m);
}
END_TEST

/* Duplicate keys: the last counts, as in the dict Python's msgpack makes,
 * for tw_msgpack_map_get and for placeholders alike: {"op": "x", "data": {
 * "__Serialized__": 9, "__Serialized__": 1}, "op": "echo"} is an echo of
 * frame 1's group (9 would be out of range). */
START_TEST(duplicate_keys_last_wins)
{
	struct ts_pack f;
	msgpack_packer *pk = ts_pack_start(&f);
	tw_msg *m = new_msg();
	tw_decoded *d;
	const tw_payload *pl;
	msgpack_pack_map(pk, 3);
	tw_msgpack_pack_str(pk, "op");
	tw_msgpack_pack_str(pk, "x");
	tw_msgpack_pack_str(pk, "data");
	msgpack_pack_map(pk, 2);
	tw_msgpack_pack_str(pk, "__Serialized__");
	msgpack_pack_uint64(pk, 9);
	tw_msgpack_pack_str(pk, "__Serialized__");
	msgpack_pack_uint64(pk, 1);
	tw_msgpack_pack_str(pk, "op");
	tw_msgpack_pack_str(pk, "echo");
	ts_pack_append(&f, m);
	sub_header(m, 1, NULL, 0);
	append(m, "abc", 3);
	d = decode_ok(m);
	ck_assert(tw_msgpack_str_eq(tw_msgpack_map_get(tw_decoded_root(d), "op"), "echo"));
	pl = data_payload(d);
	ck_assert_uint_eq(pl->nframes, 1);
	ck_assert_uint_eq(pl->frames[0].len, 3);
	ck_assert_int_eq(memcmp(tw_slice_data(&pl->frames[0]), "abc", 3), 0);
	tw_decoded_free(d);
	tw_msg_free(m);
}
END_TEST

/* Bad input: each case is a message, the code and words of its detail. */

struct bad {
	const char *name;
	int err;
	const char *why; /* a substring of the detail */
	void (*make)(tw_msg *m);
	uint64_t limit; /* tw_decode_limits.max_message_bytes; 0: default */
	int no_alloc;   /* no block may be allocated while decoding */
	/* make NULL: the message is one frame of these bytes */
	const char *frame0;
	size_t frame0_len;
};

static void bad_empty(tw_msg *m)
{
	append(m, NULL, 0);
}

static void bad_index(tw_msg *m)
{
	frame0_holder(m, "__Serialized__", 3);
	sub_header(m, 1, NULL, 0);
	append(m, "abc", 3);
}

/* {"data": {"__Serialized__": "1"}} */
static void bad_index_type(tw_msg *m)
{
	struct ts_pack f;
	msgpack_packer *pk = ts_pack_start(&f);
	msgpack_pack_map(pk, 1);
	tw_msgpack_pack_str(pk, "data");
	msgpack_pack_map(pk, 1);
	tw_msgpack_pack_str(pk, "__Serialized__");
	tw_msgpack_pack_str(pk, "1");
	ts_pack_append(&f, m);
}

static void bad_num_sub_frames(tw_msg *m)
{
	frame0_one(m);
	sub_header(m, 3, NULL, 0);
	append(m, "abc", 3);
}

static void bad_num_sub_frames_huge(tw_msg *m)
{
	frame0_one(m);
	sub_header(m, UINT64_MAX, NULL, 0);
	append(m, "abc", 3);
}

static void bad_sub_not_map(tw_msg *m)
{
	frame0_one(m);
	append(m, "\x92\x01\x02", 3);
	append(m, "abc", 3);
}

static void bad_sub_msgpack(tw_msg *m)
{
	frame0_one(m);
	append(m, "\xc1", 1);
	append(m, "abc", 3);
}

static void bad_sub_no_num(tw_msg *m)
{
	struct ts_pack f;
	msgpack_packer *pk = ts_pack_start(&f);
	frame0_one(m);
	msgpack_pack_map(pk, 1);
	tw_msgpack_pack_str(pk, "serializer");
	tw_msgpack_pack_str(pk, "dask");
	ts_pack_append(&f, m);
	append(m, "abc", 3);
}

/* {"num-sub-frames": 1, "compression": ["zstd", nil]} */
static void bad_compression_len(tw_msg *m)
{
	struct ts_pack f;
	msgpack_packer *pk = ts_pack_start(&f);
	frame0_one(m);
	msgpack_pack_map(pk, 2);
	tw_msgpack_pack_str(pk, "num-sub-frames");
	msgpack_pack_uint8(pk, 1);
	tw_msgpack_pack_str(pk, "compression");
	msgpack_pack_array(pk, 2);
	tw_msgpack_pack_str(pk, "zstd");
	msgpack_pack_nil(pk);
	ts_pack_append(&f, m);
	append(m, "abc", 3);
}

/* {"num-sub-frames": 1, "split-num-sub-frames": [2], "split-offsets": [0]} */
static void bad_split_range(tw_msg *m)
{
	struct ts_pack f;
	msgpack_packer *pk = ts_pack_start(&f);
	frame0_one(m);
	msgpack_pack_map(pk, 3);
	tw_msgpack_pack_str(pk, "num-sub-frames");
	msgpack_pack_uint8(pk, 1);
	tw_msgpack_pack_str(pk, "split-num-sub-frames");
	msgpack_pack_array(pk, 1);
	msgpack_pack_uint8(pk, 2);
	tw_msgpack_pack_str(pk, "split-offsets");
	msgpack_pack_array(pk, 1);
	msgpack_pack_uint8(pk, 0);
	ts_pack_append(&f, m);
	append(m, "abc", 3);
}

static void bad_codec(tw_msg *m)
{
	const char *c[1] = {"brotli"};
	frame0_one(m);
	sub_header(m, 1, c, 0);
	append(m, "abc", 3);
}

/* {"num-sub-frames": 1, "compression": [5]} */
static void bad_codec_type(tw_msg *m)
{
	struct ts_pack f;
	msgpack_packer *pk = ts_pack_start(&f);
	frame0_one(m);
	msgpack_pack_map(pk, 2);
	tw_msgpack_pack_str(pk, "num-sub-frames");
	msgpack_pack_uint8(pk, 1);
	tw_msgpack_pack_str(pk, "compression");
	msgpack_pack_array(pk, 1);
	msgpack_pack_uint8(pk, 5);
	ts_pack_append(&f, m);
	append(m, "abc", 3);
}

/* Copy frames of src into m, then free src. */
static void take_frames(tw_msg *m, tw_msg *src)
{
	for (size_t i = 0; i < tw_msg_nframes(src); i++)
		ck_assert_int_eq(tw_msg_append(m, tw_msg_frame(src, i)), 0);
	tw_msg_free(src);
}

#ifdef TW_HAVE_LZ4
/* lz4 whose prefix is `prefix` over 1,000 pattern bytes. */
static void lz4_case(tw_msg *m, uint32_t prefix)
{
	uint8_t plain[1000];
	size_t len;
	uint8_t *z;
	ts_fill(plain, sizeof(plain), 0);
	z = lz4_of(plain, sizeof(plain), prefix, &len);
	take_frames(m, msg_with("lz4", z, len));
	free(z);
}

static void bad_lz4_more(tw_msg *m)
{
	lz4_case(m, 2000);
}

static void bad_lz4_less(tw_msg *m)
{
	lz4_case(m, 500);
}

static void bad_lz4_huge(tw_msg *m)
{
	lz4_case(m, UINT32_MAX);
}

static void bad_lz4_short(tw_msg *m)
{
	take_frames(m, msg_with("lz4", "\x01\x00\x00", 3));
}
#endif

static void zstd_raw_case(tw_msg *m, size_t n, uint64_t declared)
{
	uint8_t plain[1000];
	size_t len;
	uint8_t *z;
	ts_fill(plain, sizeof(plain), 0);
	z = zstd_raw(plain, n, declared, &len);
	take_frames(m, msg_with("zstd", z, len));
	free(z);
}

static void bad_zstd_more(tw_msg *m)
{
	zstd_raw_case(m, 1000, 2000);
}

static void bad_zstd_less(tw_msg *m)
{
	zstd_raw_case(m, 1000, 500);
}

static void bad_zstd_4gib(tw_msg *m)
{
	zstd_raw_case(m, 1, UINT64_C(4) << 30);
}

static void bad_zstd_5gib(tw_msg *m)
{
	zstd_raw_case(m, 1, UINT64_C(5) << 30);
}

static void bad_zstd_truncated(tw_msg *m)
{
	uint8_t plain[20000];
	size_t len;
	uint8_t *z;
	ts_fill(plain, sizeof(plain), 0);
	z = zstd_of(plain, sizeof(plain), &len);
	take_frames(m, msg_with("zstd", z, len - 5));
	free(z);
}

static void bad_zstd_limit(tw_msg *m)
{
	uint8_t plain[100000];
	size_t len;
	uint8_t *z;
	ts_fill(plain, sizeof(plain), 0);
	z = zstd_of(plain, sizeof(plain), &len);
	take_frames(m, msg_with("zstd", z, len));
	free(z);
}

static void bad_zstd_garbage(tw_msg *m)
{
	take_frames(m, msg_with("zstd", "not zstd at all", 15));
}

/* msgpack headers that declare more than the frame holds. */
/* 33 nested arrays: deeper than msgpack-c unpacks. */
static void bad_nesting(tw_msg *m)
{
	uint8_t b[34];
	memset(b, 0x91, 33);
	b[33] = 0x01;
	append(m, b, sizeof(b));
}

static void bad_no_frames(tw_msg *m)
{
	(void)m;
}

/* An array of 100,000 nils: 100 KB that msgpack-c unpacks into 2.4 MB. */
static void nils_frame(tw_msg *m)
{
	static uint8_t b[5 + 100000];
	b[0] = 0xdd;
	b[1] = 0x00, b[2] = 0x01, b[3] = 0x86, b[4] = 0xa0;
	memset(b + 5, 0xc0, 100000);
	append(m, b, sizeof(b));
}

static const struct bad bad_cases[] = {
	{"empty frame 0", TW_EPROTO, "empty", bad_empty, 0, 1, NULL, 0},
	/* a map of 2 with 1 entry */
	{"truncated frame 0", TW_EPROTO, "truncated", NULL, 0, 1, "\x82\xa2op\xa1x", 6},
	{"trailing bytes", TW_EPROTO, "trailing", NULL, 0, 1, "\x81\xa2op\xa1x\xc0", 7},
	{"invalid UTF-8", TW_EPROTO, "UTF-8", NULL, 0, 1, "\x81\xa2op\xa2\xc3\x28", 7},
	{"placeholder past the last frame", TW_EPROTO, "past the last frame", bad_index, 0, 1, NULL,
	 0},
	{"placeholder not an int", TW_EPROTO, "not a frame index", bad_index_type, 0, 1, NULL, 0},
	{"num-sub-frames overflow", TW_EPROTO, "overflows", bad_num_sub_frames, 0, 1, NULL, 0},
	{"num-sub-frames 2^64-1", TW_EPROTO, "overflows", bad_num_sub_frames_huge, 0, 1, NULL, 0},
	{"sub-header not a map", TW_EPROTO, "not a map", bad_sub_not_map, 0, 1, NULL, 0},
	{"sub-header not msgpack", TW_EPROTO, "frame 1", bad_sub_msgpack, 0, 1, NULL, 0},
	{"sub-header without num-sub-frames", TW_EPROTO, "num-sub-frames", bad_sub_no_num, 0, 1,
	 NULL, 0},
	{"compression list too long", TW_EPROTO, "compression", bad_compression_len, 0, 1, NULL, 0},
	{"split past the sub-frames", TW_EPROTO, "split", bad_split_range, 0, 1, NULL, 0},
	{"unknown codec", TW_ENOTSUP, "unknown codec brotli", bad_codec, 0, 1, NULL, 0},
	{"codec not a str", TW_ENOTSUP, "unknown codec", bad_codec_type, 0, 1, NULL, 0},
#ifdef TW_HAVE_LZ4
	{"lz4 prefix above its data", TW_EPROTO, "frame 2", bad_lz4_more, 0, 0, NULL, 0},
	{"lz4 prefix below its data", TW_EPROTO, "frame 2", bad_lz4_less, 0, 0, NULL, 0},
	/* at the limit, which frame 0 and the sub-header used a little of */
	{"lz4 prefix 4 GiB", TW_ETOOBIG, "limit", bad_lz4_huge, 0, 1, NULL, 0},
	{"lz4 shorter than its prefix", TW_EPROTO, "frame 2", bad_lz4_short, 0, 1, NULL, 0},
#endif
	{"zstd size above its data", TW_EPROTO, "frame 2", bad_zstd_more, 0, 1, NULL, 0},
	{"zstd size below its data", TW_EPROTO, "frame 2", bad_zstd_less, 0, 1, NULL, 0},
	{"zstd declares 4 GiB, 1 MiB limit", TW_ETOOBIG, "limit", bad_zstd_4gib, 1 << 20, 1, NULL,
	 0},
	{"zstd declares 5 GiB, default limit", TW_ETOOBIG, "limit", bad_zstd_5gib, 0, 1, NULL, 0},
	{"zstd truncated", TW_EPROTO, "frame 2", bad_zstd_truncated, 0, 1, NULL, 0},
	{"zstd above the limit", TW_ETOOBIG, "limit", bad_zstd_limit, 50000, 1, NULL, 0},
	{"zstd garbage", TW_EPROTO, "frame 2", bad_zstd_garbage, 0, 1, NULL, 0},
	{"array of 2^32-1 in 10 bytes", TW_EPROTO, "larger than its frame", NULL, 0, 1,
	 "\xdd\xff\xff\xff\xff\x01\x02\x03\x04\x05", 10},
	{"map of 2^32-1 in 10 bytes", TW_EPROTO, "larger than its frame", NULL, 0, 1,
	 "\xdf\xff\xff\xff\xff\x01\x02\x03\x04\x05", 10},
	{"str of 2^32-1 in 10 bytes", TW_EPROTO, "truncated", NULL, 0, 1,
	 "\xdb\xff\xff\xff\xff\x61\x62\x63\x64\x65", 10},
	{"bin of 2^32-1 in 10 bytes", TW_EPROTO, "truncated", NULL, 0, 1,
	 "\xc6\xff\xff\xff\xff\x61\x62\x63\x64\x65", 10},
	{"33 nested arrays", TW_EPROTO, "nesting", bad_nesting, 0, 1, NULL, 0},
	{"byte 0xc1", TW_EPROTO, "0xc1", NULL, 0, 1, "\xc1", 1},
	{"no frames", TW_EPROTO, "no frames", bad_no_frames, 0, 1, NULL, 0},
	{"frame 0 unpacking past a 1 MiB limit", TW_ETOOBIG, "unpacks into 100000 objects",
	 nils_frame, 1 << 20, 1, NULL, 0},
};
#define NBAD ((int)(sizeof(bad_cases) / sizeof(bad_cases[0])))

static tw_msg *make_bad(const struct bad *c)
{
	tw_msg *m = new_msg();
	if (c->make != NULL)
		c->make(m);
	else
		append(m, c->frame0, c->frame0_len);
	return m;
}

/* Decode a bad message: its code, a detail, and with no_alloc no block
 * allocated (nothing sized from a declared length). */
START_TEST(bad_input)
{
	const struct bad *c = &bad_cases[_i];
	tw_decode_limits lim = {c->limit};
	char why[256] = "";
	tw_decoded *d = NULL;
	tw_msg *m = make_bad(c);
	tw_stats before, after;
	int rv;
	tw_stats_global(&before, sizeof(before));
	rv = tw_decode(m, &lim, &d, why, sizeof(why));
	tw_stats_global(&after, sizeof(after));
	ck_assert_msg(rv == c->err, "%s: got %s (%s), want %s", c->name, tw_strerror(rv), why,
		      tw_strerror(c->err));
	ck_assert_ptr_null(d);
	ck_assert_msg(strstr(why, c->why) != NULL, "%s: detail \"%s\" lacks \"%s\"", c->name, why,
		      c->why);
	if (c->no_alloc)
		ck_assert_msg(after.block_bytes_allocated == before.block_bytes_allocated,
			      "%s: %llu block bytes allocated", c->name,
			      (unsigned long long)(after.block_bytes_allocated -
						   before.block_bytes_allocated));
	ck_assert_uint_eq(after.block_bytes_live, before.block_bytes_live);
	tw_msg_free(m);
}
END_TEST

/* The same 100,000 nils fit a 4 MiB limit: unpacked objects are charged
 * to the limit, not refused. */
START_TEST(nils_within_limit)
{
	tw_decode_limits lim = {4 << 20};
	tw_decoded *d = NULL;
	tw_msg *m = new_msg();
	nils_frame(m);
	ck_assert_int_eq(tw_decode(m, &lim, &d, NULL, 0), 0);
	ck_assert_int_eq(tw_decoded_root(d)->type, MSGPACK_OBJECT_ARRAY);
	ck_assert_uint_eq(tw_decoded_root(d)->via.array.size, 100000);
	ck_assert_int_eq(tw_decoded_root(d)->via.array.ptr[99999].type, MSGPACK_OBJECT_NIL);
	tw_decoded_free(d);
	tw_msg_free(m);
}
END_TEST

/* 32 nested arrays are the most msgpack-c unpacks: accepted. */
START_TEST(nesting_32)
{
	uint8_t b[33];
	tw_msg *m = new_msg();
	tw_decoded *d;
	const msgpack_object *o;
	memset(b, 0x91, 32);
	b[32] = 0x07;
	append(m, b, sizeof(b));
	d = decode_ok(m);
	o = tw_decoded_root(d);
	for (int i = 0; i < 32; i++) {
		ck_assert_int_eq(o->type, MSGPACK_OBJECT_ARRAY);
		o = &o->via.array.ptr[0];
	}
	ck_assert_uint_eq(o->via.u64, 7);
	tw_decoded_free(d);
	tw_msg_free(m);
}
END_TEST

/* zstd inputs that claim more than they hold (31a-c) or hold nothing
 * (32a-d; RFC 8878 section 3.1.1) through tw_decode, in hand-built messages
 * whose sub-header names "zstd" for every sub-frame. */

#define BH31A     "28 b5 2f fd e0 00 00 40 06 00 00 00 00 09 00 00 41"
#define BH31B     "28 b5 2f fd e0 00 00 00 00 00 01 00 00 09 00 00 41"
#define BH31C     "28 b5 2f fd 00 a8 03 00 10 00"
#define BH32A     "28 b5 2f fd 04 58 29 00 00 68 65 6c 6c 6f a3 6d 9f 88"
#define BH32B     "28 b5 2f fd 20 00 01 00 00"
#define BH32B_SUM "28 b5 2f fd 24 00 01 00 00 99 e9 d8 51"

/* A message of `count` zstd sub-frames, each the bytes of `hex`; split
 * makes them one logical frame, else one logical frame each. */
static tw_msg *zstd_msg(const char *hex, size_t count, int split)
{
	const char **zs = malloc(count * sizeof(*zs));
	uint8_t z[64];
	size_t n = unhex(hex, z);
	tw_msg *m = new_msg();
	ck_assert_ptr_nonnull(zs);
	for (size_t i = 0; i < count; i++)
		zs[i] = "zstd";
	frame0_one(m);
	sub_header(m, count, zs, split);
	for (size_t i = 0; i < count; i++)
		append(m, z, n);
	free(zs);
	return m;
}

/* Decode; expect err; no block allocated. */
static void zstd_rejected(tw_msg *m, int err)
{
	char why[256] = "";
	tw_decoded *d = NULL;
	tw_stats before, after;
	int rv;
	tw_stats_global(&before, sizeof(before));
	rv = tw_decode(m, NULL, &d, why, sizeof(why));
	tw_stats_global(&after, sizeof(after));
	ck_assert_msg(rv == err, "got %s (%s), want %s", tw_strerror(rv), why, tw_strerror(err));
	ck_assert_ptr_null(d);
	ck_assert(strstr(why, "frame 2") != NULL);
	ck_assert_uint_eq(after.block_bytes_allocated, before.block_bytes_allocated);
	tw_msg_free(m);
}

/* (a) 1,000 frames that each claim 100 MiB and carry 1 byte: corrupt,
 * found before any 100 MiB allocation; as 1,000 logical frames or as one. */
START_TEST(bh31a_claims_100mib)
{
	zstd_rejected(zstd_msg(BH31A, 1000, _i), TW_EPROTO);
}
END_TEST

/* (b) a frame claiming 1 TiB: above the limit. */
START_TEST(bh31b_claims_1tib)
{
	zstd_rejected(zstd_msg(BH31B, 1, 0), TW_ETOOBIG);
}
END_TEST

/* (c) a 2 GiB window (streaming frame, RLE block): above windowLog 27. */
START_TEST(bh31c_window_2gib)
{
	zstd_rejected(zstd_msg(BH31C, 1, 0), TW_ETOOBIG);
}
END_TEST

static const tw_payload *decoded_one(const tw_msg *m, tw_decoded **d)
{
	const tw_payload *pl;
	*d = decode_ok(m);
	pl = data_payload(*d);
	ck_assert_uint_eq(pl->nframes, 1);
	return pl;
}

/* (a) a streaming frame without a content size decodes to "hello", into a
 * block no larger than its blocks say. */
START_TEST(bh32a_no_content_size)
{
	tw_msg *m = zstd_msg(BH32A, 1, 0);
	tw_decoded *d;
	const tw_payload *pl = decoded_one(m, &d);
	ck_assert_uint_eq(pl->frames[0].len, 5);
	ck_assert_mem_eq(tw_slice_data(&pl->frames[0]), "hello", 5);
	ck_assert_uint_eq(tw_block_size(pl->frames[0].block), 5);
	tw_decoded_free(d);
	tw_msg_free(m);
}
END_TEST

/* (b) empty frames, with and without a checksum: 0 bytes. */
START_TEST(bh32b_empty_frames)
{
	tw_msg *m = zstd_msg(_i == 0 ? BH32B : BH32B_SUM, 1, 0);
	tw_decoded *d;
	const tw_payload *pl = decoded_one(m, &d);
	ck_assert_uint_eq(pl->frames[0].len, 0);
	tw_decoded_free(d);
	tw_msg_free(m);
}
END_TEST

/* (c) a zero-length sub-frame flagged as zstd: 0 bytes. */
START_TEST(bh32c_zero_length)
{
	tw_msg *m = zstd_msg("", 1, 0);
	tw_decoded *d;
	const tw_payload *pl = decoded_one(m, &d);
	ck_assert_uint_eq(tw_msg_frame(m, 2)->len, 0);
	ck_assert_uint_eq(pl->frames[0].len, 0);
	tw_decoded_free(d);
	tw_msg_free(m);
}
END_TEST

/* (d) two zstd frames in one sub-frame: both decoded, in order. First a
 * streaming frame and a sized one, then two sized ones. */
START_TEST(bh32d_two_frames)
{
	uint8_t buf[256];
	size_t n = _i == 0 ? unhex(BH32A, buf) : 0, zlen;
	uint8_t *z = zstd_of("world", 5, &zlen);
	tw_msg *m;
	tw_decoded *d;
	const tw_payload *pl;
	if (_i == 1) {
		uint8_t *h = zstd_of("hello", 5, &n);
		memcpy(buf, h, n);
		free(h);
	}
	memcpy(buf + n, z, zlen);
	m = msg_with("zstd", buf, n + zlen);
	pl = decoded_one(m, &d);
	ck_assert_uint_eq(pl->frames[0].len, 10);
	ck_assert_mem_eq(tw_slice_data(&pl->frames[0]), "helloworld", 10);
	tw_decoded_free(d);
	tw_msg_free(m);
	free(z);
}
END_TEST

/* over_comm: a server that decodes each message it gets, echoes the good
 * ones and aborts the comm of a bad one. */

struct dec_srv {
	struct du_srv srv;
	int decode_err; /* the last decode error */
	char why[256];
	int aborted; /* comms closed with TW_ECANCELED */
	int other_closes;
};

static void dec_recv(tw_comm *comm, tw_msg *m, void *arg)
{
	struct dec_srv *s = arg;
	tw_decoded *d;
	int rv = tw_decode(m, NULL, &d, s->why, sizeof(s->why));
	if (rv != 0) {
		s->decode_err = rv;
		tw_comm_abort(comm);
		return;
	}
	tw_decoded_free(d);
	tw_msg_hold(m);
	if (tw_comm_write(comm, m) != 0)
		tw_msg_free(m);
}

static void dec_close(tw_comm *comm, int err, void *arg)
{
	struct dec_srv *s = arg;
	(void)comm;
	if (err == TW_ECANCELED)
		s->aborted++;
	else
		s->other_closes++;
}

/* A good request on cli, and its echo. */
static void echo_ok(struct du_client *cli, size_t k)
{
	tw_block *pat = pattern_block(3000, (unsigned)k);
	tw_msg *m = build_bytes(NULL, &(tw_slice){pat, 0, 3000}), *got;
	tw_decoded *d;
	ck_assert_int_eq(du_client_write(cli, m), 0);
	got = du_client_msg(cli, k, DU_WAIT_MS);
	ck_assert_msg(got != NULL, "no echo %zu: %s", k, cli->last_error);
	d = decode_ok(got);
	check_pattern(&data_payload(d)->frames[0], 3000, (unsigned)k);
	tw_decoded_free(d);
	tw_block_free(pat);
}

/* A raw peer: read the server's handshake, send ours, then `bad`. */
static int raw_send_bad(struct tu *l, const char *addr, const tw_msg *bad)
{
	tw_msg *theirs = NULL, *ours = new_msg();
	struct ts_pack hs;
	msgpack_packer *pk = ts_pack_start(&hs);
	uint8_t *wire;
	size_t len;
	int fd = ts_raw_connect(addr), eof;
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(du_raw_recv_msg(l, fd, &theirs, DU_WAIT_MS), 0);
	tw_msg_free(theirs);
	ts_pack_handshake_info(pk, 0);
	ts_pack_append(&hs, ours);
	wire = du_encode(ours, &len);
	ck_assert_uint_eq(tu_raw_send(l, fd, wire, len), len);
	free(wire);
	tw_msg_free(ours);
	wire = du_encode(bad, &len);
	tu_raw_send(l, fd, wire, len); /* the server may close before the end */
	free(wire);
	eof = du_raw_wait_eof(l, fd, DU_WAIT_MS);
	close(fd);
	return eof;
}

START_TEST(bad_over_comm)
{
	const struct bad *c = &bad_cases[_i];
	struct dec_srv s = {0};
	struct tu l;
	struct du_client *cli;
	tw_msg *bad = make_bad(c);
	if (c->limit != 0 || tw_msg_nframes(bad) == 0) { /* decode limits only; no wire form */
		tw_msg_free(bad);
		return;
	}
	tu_init(&l);
	du_srv_start(&s.srv, l.ctx, "tcp://127.0.0.1:0", dec_recv, dec_close, &s);
	ck_assert_int_eq(du_client_open(&l, s.srv.addr, &cli), 0);
	echo_ok(cli, 0);
	ck_assert_msg(raw_send_bad(&l, s.srv.addr, bad), "%s: no EOF for the bad peer", c->name);
	ck_assert_msg(s.decode_err == c->err, "%s: server saw %s (%s)", c->name,
		      tw_strerror(s.decode_err), s.why);
	ck_assert_int_eq(s.aborted, 1);
	echo_ok(cli, 1);
	ck_assert_int_eq(cli->closed, 0);
	ck_assert_int_eq(s.other_closes, 0);
	du_client_free(cli);
	du_srv_stop(&s.srv);
	tu_fini(&l);
	tw_msg_free(bad);
}
END_TEST

/* Forwarding (tw_builder_pack_object): a group that came uncompressed and
 * unsplit goes on as it came, its sub-header and frame by reference; groups
 * with byte-identical sub-headers share one unpacked sub-header; a
 * compressed group is re-packed (its logical frame is new). */
static tw_msg *forward(const tw_decoded *d)
{
	tw_builder *b;
	tw_msg *out;
	ts_builder_map(&b, 1);
	tw_msgpack_pack_str(tw_builder_packer(b), "data");
	ck_assert_int_eq(
		tw_builder_pack_object(b, d, tw_msgpack_map_get(tw_decoded_root(d), "data")), 0);
	ck_assert_int_eq(tw_builder_finish(b, &out), 0);
	tw_builder_free(b);
	return out;
}

START_TEST(forward_as_it_came)
{
	tw_block *pat = pattern_block(3000, 9);
	tw_builder *b;
	tw_msg *m, *fw;
	tw_decoded *d, *d2;
	const msgpack_object *arr;
	ts_builder_map(&b, 1);
	tw_msgpack_pack_str(tw_builder_packer(b), "data");
	msgpack_pack_array(tw_builder_packer(b), 3);
	for (int i = 0; i < 3; i++)
		ck_assert_int_eq(tw_builder_pack_bytes(b, &(tw_slice){pat, 1000 * (size_t)i, 1000}),
				 0);
	ck_assert_int_eq(tw_builder_finish(b, &m), 0);
	tw_builder_free(b);
	d = decode_ok(m);
	ck_assert_uint_eq(tw_decoded_npayloads(d), 3);
	ck_assert_ptr_eq(tw_decoded_payload_at(d, 0)->sub_header,
			 tw_decoded_payload_at(d, 2)->sub_header);
	ck_assert_str_eq(tw_decoded_payload_at(d, 1)->serializer, "dask");
	fw = forward(d);
	ck_assert_uint_eq(tw_msg_nframes(fw), 7);
	for (size_t i = 1; i < 7; i++) { /* sub-headers and frames, by reference */
		ck_assert_ptr_eq(tw_msg_frame(fw, i)->block, tw_msg_frame(m, i)->block);
		ck_assert_uint_eq(tw_msg_frame(fw, i)->offset, tw_msg_frame(m, i)->offset);
		ck_assert_uint_eq(tw_msg_frame(fw, i)->len, tw_msg_frame(m, i)->len);
	}
	d2 = decode_ok(fw);
	arr = tw_msgpack_map_get(tw_decoded_root(d2), "data");
	ck_assert(arr != NULL && arr->type == MSGPACK_OBJECT_ARRAY && arr->via.array.size == 3);
	for (uint32_t i = 0; i < 3; i++) {
		const tw_payload *pl = tw_decoded_payload(d2, &arr->via.array.ptr[i]);
		ck_assert_ptr_nonnull(pl);
		ck_assert(tw_msgpack_str_eq(tw_msgpack_map_get(pl->sub_header, "type"), "bytes"));
		ck_assert_uint_eq(pl->nframes, 1);
		ck_assert_mem_eq(tw_slice_data(&pl->frames[0]), tw_block_data(pat) + 1000 * i,
				 1000);
	}
	tw_decoded_free(d2);
	tw_msg_free(fw);
	tw_decoded_free(d);
	tw_msg_free(m);
	tw_block_free(pat);
}
END_TEST

START_TEST(forward_compressed_repacked)
{
	tw_block *pat = pattern_block(100 * KB, 8);
	tw_msg *m = build_bytes(codecs[_i], &(tw_slice){pat, 0, 100 * KB}), *fw;
	tw_decoded *d = decode_ok(m), *d2;
	char c[16];
	fw = forward(d);
	ck_assert_uint_eq(tw_msg_nframes(fw), 3);
	ck_assert_ptr_ne(tw_msg_frame(fw, 1)->block, tw_msg_frame(m, 1)->block);
	ck_assert_uint_eq(tw_msg_frame(fw, 2)->len, 100 * KB); /* sent decompressed */
	d2 = decode_ok(fw);
	codec0(data_payload(d2), c, sizeof(c));
	ck_assert_str_eq(c, "");
	check_pattern(&data_payload(d2)->frames[0], 100 * KB, 8);
	tw_decoded_free(d2);
	tw_msg_free(fw);
	tw_decoded_free(d);
	tw_msg_free(m);
	tw_block_free(pat);
}
END_TEST

int main(void)
{
	TCase *rt = ts_tcase("roundtrip", 0, TS_TESTS(rt_bytes, rt_msgpack, rt_nested));
	TCase *bad = ts_tcase("bad_input", 0, NULL), *zstd = ts_tcase("zstd_cases", 0, NULL);
	TCase *comm = ts_tcase("over_comm", 0, NULL);
	ts_add_loop(rt, 1 + NCODECS, TS_TESTS(rt_zero_length));
	ts_add_loop(rt, NCODECS,
		    TS_TESTS(rt_compressed, rt_compressed_zeros, rt_incompressible, rt_threshold));
	ts_add(rt, TS_TESTS(rt_split_adjacent, rt_split_copied, rt_split_compressed, rt_pickled,
			    rt_no_sub_frames, forward_as_it_came));
	ts_add_loop(rt, NCODECS, TS_TESTS(forward_compressed_repacked));
	ts_add(rt, TS_TESTS(duplicate_keys_last_wins, nesting_32, nils_within_limit));
	ts_add_loop(bad, NBAD, TS_TESTS(bad_input));
	ts_add_loop(zstd, 2, TS_TESTS(bh31a_claims_100mib));
	ts_add(zstd, TS_TESTS(bh31b_claims_1tib, bh31c_window_2gib, bh32a_no_content_size));
	ts_add_loop(zstd, 2, TS_TESTS(bh32b_empty_frames));
	ts_add(zstd, TS_TESTS(bh32c_zero_length));
	ts_add_loop(zstd, 2, TS_TESTS(bh32d_two_frames));
	ts_add_loop(comm, NBAD, TS_TESTS(bad_over_comm));
	return ts_main("serial", TS_NO_SIGPIPE, TS_CASES(rt, bad, zstd, comm));
}
