/* SPDX-License-Identifier: BSD-3-Clause */
/* tw_decode, the decode-cost estimate and the Dask placement hook against
 * inputs from an attack on them: zstd frames whose declared or bounded
 * size is a lie, a sub-header of 32 Mi nils, overlapping groups that made
 * the cost estimate quadratic, msgpack nesting at the limit, empty zstd
 * and lz4 sub-frames, and 10,000 tiny sub-frames merged. Messages are
 * built in memory (no sockets): the code under test is sans-I/O. With
 * TU_VERBOSE set, each test prints what it measured. */
#include <check.h>
#include <msgpack.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <taskwire/buf.h>
#include <taskwire/error.h>
#include <taskwire/msg.h>
#include <taskwire/serial.h>

#include "protocol/decode.h"
#include "protocol/placeholder.h"
#include "protocol/placement.h"

#include "tests/support/suite.h"
#include "tests/support/pack.h"

#define SAY(...)                                                                                   \
	do {                                                                                       \
		if (getenv("TU_VERBOSE") != NULL)                                                  \
			fprintf(stderr, __VA_ARGS__);                                              \
	} while (0)

/* --- helpers ----------------------------------------------------------- */

static long status_kb(const char *key)
{
	FILE *f = fopen("/proc/self/status", "r");
	char line[256];
	long v = -1;
	size_t n = strlen(key);
	if (f == NULL)
		return -1;
	while (fgets(line, sizeof(line), f) != NULL)
		if (strncmp(line, key, n) == 0 && line[n] == ':')
			v = atol(line + n + 1);
	fclose(f);
	return v;
}

static double now_s(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* frame 0 = {"__Serialized__": k} */
static void add_placeholder0(tw_msg *m, uint64_t k)
{
	struct ts_pack f;
	msgpack_packer *pk = ts_pack_start(&f);
	msgpack_pack_map(pk, 1);
	tw_msgpack_pack_str(pk, "__Serialized__");
	msgpack_pack_uint64(pk, k);
	ts_pack_append(&f, m);
}

/* sub-header {"serializer":"dask","num-sub-frames":num,"compression":[codec]*num} */
static void add_subheader(tw_msg *m, uint64_t num, const char *codec)
{
	struct ts_pack f;
	msgpack_packer *pk = ts_pack_start(&f);
	msgpack_pack_map(pk, 3);
	tw_msgpack_pack_str(pk, "serializer");
	tw_msgpack_pack_str(pk, "dask");
	tw_msgpack_pack_str(pk, "num-sub-frames");
	msgpack_pack_uint64(pk, num);
	tw_msgpack_pack_str(pk, "compression");
	msgpack_pack_array(pk, num);
	for (uint64_t i = 0; i < num; i++) {
		if (codec == NULL)
			msgpack_pack_nil(pk);
		else
			tw_msgpack_pack_str(pk, codec);
	}
	ts_pack_append(&f, m);
}

/* --- 1. zstd: a lying frame ----------------------------------------------
 * A streaming zstd frame (no content size, 128 KiB window) made of N
 * compressed blocks that each hold 2 bytes (no literals, no sequences:
 * each decodes to 0 bytes). zstd_blocks() bounds every compressed block by
 * blockSizeMax = 128 KiB (a compressed block of a few bytes can expand to
 * that: RLE literals), so inflate() maps N * 128 KiB, 26,000 times the
 * input, while zstd runs; the frame is valid and decodes to 0 bytes. The
 * mapping must not stay pinned by the 0-byte payload (it did: 4 GiB for
 * 160 KiB of input). */
static size_t lying_zstd(uint8_t *buf, size_t nblocks, int with_fcs, uint64_t fcs)
{
	size_t o = 0;
	buf[o++] = 0x28, buf[o++] = 0xb5, buf[o++] = 0x2f, buf[o++] = 0xfd;
	if (with_fcs) {
		buf[o++] = 0xc0; /* FCS 8 bytes, window descriptor present */
		buf[o++] = 0x38; /* window 128 KiB */
		for (int i = 0; i < 8; i++)
			buf[o++] = (uint8_t)(fcs >> (8 * i));
	} else {
		buf[o++] = 0x00;
		buf[o++] = 0x38;
	}
	for (size_t b = 0; b < nblocks; b++) {
		uint32_t bh = (2u << 3) | (2u << 1) | (b + 1 == nblocks ? 1u : 0u);
		buf[o++] = (uint8_t)bh, buf[o++] = (uint8_t)(bh >> 8),
		buf[o++] = (uint8_t)(bh >> 16);
		buf[o++] = 0x00; /* raw literals, size 0 */
		buf[o++] = 0x00; /* 0 sequences */
	}
	return o;
}

/* A message whose one payload is a lying zstd frame of nblocks empty
 * blocks (with a declared content size fcs when with_fcs); *zl gets the
 * frame's size. */
static tw_msg *lying_zstd_msg(size_t nblocks, int with_fcs, uint64_t fcs, size_t *zl)
{
	uint8_t *z = malloc(32 + 5 * nblocks);
	tw_msg *m;
	ck_assert_ptr_nonnull(z);
	*zl = lying_zstd(z, nblocks, with_fcs, fcs);
	ck_assert_int_eq(tw_msg_new(&m), 0);
	add_placeholder0(m, 1);
	add_subheader(m, 1, "zstd");
	ck_assert_int_eq(tw_msg_append_copy(m, z, *zl), 0);
	free(z);
	return m;
}

/* tw_decode of m, and how much the /proc/self/status size field (VmSize,
 * VmPeak) grew over it, in KiB. */
static int decode_grew(const tw_msg *m, tw_decoded **d, char *why, size_t cap, const char *field,
		       long *grew_kb)
{
	long vm0 = status_kb(field);
	int rv = tw_decode(m, NULL, d, why, cap);
	*grew_kb = status_kb(field) - vm0;
	return rv;
}

START_TEST(zstd_streaming_lie_allocates_bound)
{
	size_t zl;
	tw_msg *m = lying_zstd_msg(32767, 0, 0, &zl); /* 32767 * 128 KiB: just under 4 GiB */
	const tw_payload *pl;
	tw_decoded *d = NULL;
	char why[256] = "";
	long grew; /* KiB */
	int rv = decode_grew(m, &d, why, sizeof(why), "VmSize", &grew);
	ck_assert_msg(rv == 0, "rv %d (%s)", rv, why); /* a valid frame of 0 bytes */
	pl = tw_decoded_payload_at(d, 0);
	ck_assert_uint_eq(pl->nframes, 1);
	ck_assert_uint_eq(pl->frames[0].len, 0);
	/* The bound was mapped while zstd ran (a frame this size can expand
	 * that much); what it did not fill is returned at once, not pinned by
	 * the 0-byte payload for the message's life. */
	SAY("zstd lie: input %zu bytes, VmSize after decode %+ld MiB\n", zl, grew / 1024);
	ck_assert_msg(grew < 64 * 1024, "VmSize +%ld MiB after decode", grew / 1024);
	ck_assert_uint_le(pl->frames[0].block != NULL ? tw_block_size(pl->frames[0].block) : 0,
			  4096);
	tw_decoded_free(d);
	tw_msg_free(m);
}
END_TEST

/* Same with a declared content size of 1 GiB: zstd_blocks accepts it
 * (8192 compressed blocks can hold 1 GiB), so 1 GiB is mapped while zstd
 * runs (a zstd frame claiming 100 MiB, 40 KiB of input), then the message is refused
 * and the mapping released. */
START_TEST(zstd_declared_lie_allocates)
{
	size_t zl;
	tw_msg *m = lying_zstd_msg(8192, 1, (uint64_t)1 << 30, &zl);
	tw_decoded *d = NULL;
	char why[256] = "";
	long grew; /* KiB */
	int rv = decode_grew(m, &d, why, sizeof(why), "VmPeak", &grew);
	SAY("zstd declared lie: input %zu bytes, rv %d (%s), VmPeak +%ld MiB\n", zl, rv, why,
	    grew / 1024);
	tw_decoded_free(d);
	tw_msg_free(m);
	/* refused: its blocks produce nothing of the declared 1 GiB */
	ck_assert_int_eq(rv, TW_EPROTO);
}
END_TEST

/* --- 2. placement hook: sub-header unpacked with no element budget -------
 * tw__dask_place -> read_sub -> unpack() (placement.c:19-30) runs
 * tw__mp_check with elems == NULL and msgpack_unpack on the whole
 * sub-header, on the loop thread, with no limit: a sub-header of N one-byte
 * nils costs N * 24 bytes of msgpack objects. 32 MiB received ->
 * ~770 MiB resident. */
START_TEST(placement_subheader_nil_bomb)
{
	size_t n = (size_t)32 << 20;
	uint8_t *sub = malloc(n);
	struct tw__dask_place p;
	tw_msg *m;
	long hwm0, hwm1;
	double t0, t1;
	/* array32 of n - 5 nils */
	sub[0] = 0xdd;
	sub[1] = (uint8_t)((n - 5) >> 24), sub[2] = (uint8_t)((n - 5) >> 16);
	sub[3] = (uint8_t)((n - 5) >> 8), sub[4] = (uint8_t)(n - 5);
	memset(sub + 5, 0xc0, n - 5);
	memset(&p, 0, sizeof(p));
	ck_assert_int_eq(tw_msg_new(&m), 0);
	add_placeholder0(m, 1);
	ck_assert_int_eq(tw_msg_append_copy(m, sub, n), 0);
	free(sub);
	hwm0 = status_kb("VmHWM");
	t0 = now_s();
	tw__dask_place(&p, m, NULL, 3, 0);
	tw__dask_place(&p, m, NULL, 3, 1);
	tw__dask_place(&p, m, NULL, 3, 2); /* frames 0 and 1 complete: reads sub-header 1 */
	t1 = now_s();
	hwm1 = status_kb("VmHWM");
	SAY("placement: 32 MiB sub-header -> VmHWM +%ld MiB, %.2f s on the loop\n",
	    (hwm1 - hwm0) / 1024, t1 - t0);
	tw__dask_place_reset(&p);
	tw_msg_free(m);
	ck_assert_msg(hwm1 - hwm0 < 128 * 1024, "VmHWM grew by %ld MiB", (hwm1 - hwm0) / 1024);
}
END_TEST

/* --- 3. decode cost: quadratic on the loop thread -------------------------
 * tw__decode_cost runs on the loop for every message (delivery.c on_recv).
 * cost_of_group only marks the sub-header frame as used, not its
 * sub-frames, so G groups whose num-sub-frames overlap each walk ~n frames
 * and calloc a codec array of num entries: O(G * n) work for an O(G + n)
 * message. (tw_decode itself fails such a message at once.) Frames here:
 * 65,535 (the default limit), 20,000 groups; frame 0 ~ 380 KB, far below
 * the 10 MiB offload threshold once weighted. */
START_TEST(decode_cost_quadratic)
{
	size_t nframes = 65535, groups = 20000;
	msgpack_sbuffer sb;
	msgpack_packer pk;
	tw_msg *m;
	double t0, t1;
	uint64_t cost;
	msgpack_sbuffer_init(&sb);
	msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
	msgpack_pack_array(&pk, groups);
	for (size_t g = 0; g < groups; g++) {
		msgpack_pack_map(&pk, 1);
		tw_msgpack_pack_str(&pk, "__Serialized__");
		msgpack_pack_uint64(&pk, 1 + g);
	}
	ck_assert_int_eq(tw_msg_new(&m), 0);
	ck_assert_int_eq(tw_msg_append_copy(m, sb.data, sb.size), 0);
	SAY("cost: frame 0 is %zu bytes\n", sb.size);
	msgpack_sbuffer_destroy(&sb);
	for (size_t k = 1; k < nframes; k++) {
		if (k <= groups) {
			/* {"num-sub-frames": nframes - k - 1} */
			msgpack_sbuffer_init(&sb);
			msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
			msgpack_pack_map(&pk, 1);
			tw_msgpack_pack_str(&pk, "num-sub-frames");
			msgpack_pack_uint64(&pk, nframes - k - 1);
			ck_assert_int_eq(tw_msg_append_copy(m, sb.data, sb.size), 0);
			msgpack_sbuffer_destroy(&sb);
		} else {
			ck_assert_int_eq(tw_msg_append_copy(m, "x", 1), 0);
		}
	}
	t0 = now_s();
	cost = tw__decode_cost(m, (uint64_t)10 << 20);
	t1 = now_s();
	SAY("cost: %zu frames, %llu bytes, cost %llu, %.2f s on the loop\n", nframes,
	    (unsigned long long)tw_msg_bytes(m), (unsigned long long)cost, t1 - t0);
	{
		tw_decoded *d = NULL;
		char why[256] = "";
		ck_assert_int_eq(tw_decode(m, NULL, &d, why, sizeof(why)), TW_EPROTO);
		ck_assert_msg(strstr(why, "claimed by two payload groups") != NULL, "%s", why);
	}
	/* no timing assertion (timing belongs in benchmarks): the quadratic
	 * estimate took 2.5 s here, minutes under valgrind, past the suite's
	 * timeout */
	tw_msg_free(m);
}
END_TEST

/* --- 4. nesting: mpcheck and msgpack-c agree on the depth limit ----------- */
static int decode_nested(int depth, char *why, size_t why_len)
{
	uint8_t buf[128];
	tw_msg *m;
	tw_decoded *d = NULL;
	int rv;
	for (int i = 0; i < depth; i++)
		buf[i] = 0x91; /* fixarray of 1 */
	buf[depth] = 0x01;
	ck_assert_int_eq(tw_msg_new(&m), 0);
	ck_assert_int_eq(tw_msg_append_copy(m, buf, (size_t)depth + 1), 0);
	why[0] = '\0';
	rv = tw_decode(m, NULL, &d, why, why_len);
	tw_decoded_free(d);
	tw_msg_free(m);
	return rv;
}

START_TEST(nesting_limit_error)
{
	char why[256];
	for (int depth = 30; depth <= 34; depth++) {
		int rv = decode_nested(depth, why, sizeof(why));
		SAY("nesting %d: rv %d %s\n", depth, rv, why);
		ck_assert_msg(rv == 0 || rv == TW_EPROTO, "depth %d: rv %d (%s)", depth, rv, why);
	}
}
END_TEST

/* --- 5. edge cases that must hold ----------------------------------------- */
static int decode_groups(const uint8_t *const *frames, const size_t *lens, size_t n,
			 const char *const *codecs, size_t nsub, tw_decoded **d, char *why)
{
	tw_msg *m;
	int rv;
	struct ts_pack f;
	msgpack_packer *pk;
	ck_assert_int_eq(tw_msg_new(&m), 0);
	add_placeholder0(m, 1);
	pk = ts_pack_start(&f);
	msgpack_pack_map(pk, 4);
	tw_msgpack_pack_str(pk, "num-sub-frames");
	msgpack_pack_uint64(pk, nsub);
	tw_msgpack_pack_str(pk, "compression");
	msgpack_pack_array(pk, nsub);
	for (size_t i = 0; i < nsub; i++) {
		if (codecs[i] == NULL)
			msgpack_pack_nil(pk);
		else
			tw_msgpack_pack_str(pk, codecs[i]);
	}
	tw_msgpack_pack_str(pk, "split-num-sub-frames");
	msgpack_pack_array(pk, 1);
	msgpack_pack_uint64(pk, nsub);
	tw_msgpack_pack_str(pk, "split-offsets");
	msgpack_pack_array(pk, 1);
	msgpack_pack_uint64(pk, 0);
	ts_pack_append(&f, m);
	for (size_t i = 0; i < n; i++)
		ck_assert_int_eq(tw_msg_append_copy(m, frames[i], lens[i]), 0);
	why[0] = '\0';
	rv = tw_decode(m, NULL, d, why, 256);
	tw_msg_free(m);
	return rv;
}

START_TEST(empty_mixes)
{
	static const uint8_t zempty[] = {0x28, 0xb5, 0x2f, 0xfd, 0x20, 0x00, 0x01, 0x00, 0x00};
	const uint8_t *fr[3] = {zempty, (const uint8_t *)"", (const uint8_t *)""};
	size_t lens[3] = {sizeof(zempty), 0, 0};
	const char *codecs[3] = {"zstd", NULL, "zstd"};
	char why[256];
	tw_decoded *d = NULL;
	int rv = decode_groups(fr, lens, 3, codecs, 3, &d, why);
	SAY("empty mix: rv %d %s\n", rv, why);
	ck_assert_int_eq(rv, 0);
	ck_assert_uint_eq(tw_decoded_payload_at(d, 0)->frames[0].len, 0);
	tw_decoded_free(d);
}
END_TEST

/* Frame 0 skips the placeholder walk when its bytes hold no "__": a key
 * sent as str8 (0xd9, as a non-canonical packer may) is still found, and a
 * near miss is plain data. */
START_TEST(placeholder_prefilter)
{
	static const uint8_t str8_key[] = {0x81, 0xd9, 0x0e, '_', '_', 'S', 'e', 'r', 'i',
					   'a',  'l',  'i',  'z', 'e', 'd', '_', '_', 0x01};
	static const uint8_t near_miss[] = {0x81, 0xac, '_', 'S', 'e', 'r', 'i', 'a',
					    'l',  'i',  'z', 'e', 'd', '_', 0x01};
	tw_decoded *d;
	tw_msg *m;
	ck_assert(tw__may_hold_placeholders(str8_key, sizeof(str8_key)));
	ck_assert(!tw__may_hold_placeholders(near_miss, sizeof(near_miss)));
	ck_assert(!tw__may_hold_placeholders((const uint8_t *)"a_b_", 4));
	ck_assert(tw__may_hold_placeholders((const uint8_t *)"ab__", 4));
	ck_assert(!tw__may_hold_placeholders((const uint8_t *)"_", 1));
	ck_assert(!tw__may_hold_placeholders(NULL, 0));
	ck_assert_int_eq(tw_msg_new(&m), 0);
	ck_assert_int_eq(tw_msg_append_copy(m, str8_key, sizeof(str8_key)), 0);
	add_subheader(m, 1, NULL);
	ck_assert_int_eq(tw_msg_append_copy(m, "xyz", 3), 0);
	ck_assert_int_eq(tw_decode(m, NULL, &d, NULL, 0), 0);
	ck_assert_uint_eq(tw_decoded_npayloads(d), 1);
	ck_assert_uint_eq(tw_decoded_payload_at(d, 0)->frames[0].len, 3);
	tw_decoded_free(d);
	tw_msg_free(m);
	ck_assert_int_eq(tw_msg_new(&m), 0);
	ck_assert_int_eq(tw_msg_append_copy(m, near_miss, sizeof(near_miss)), 0);
	ck_assert_int_eq(tw_decode(m, NULL, &d, NULL, 0), 0);
	ck_assert_uint_eq(tw_decoded_npayloads(d), 0);
	ck_assert_uint_eq(tw_decoded_root(d)->via.map.size, 1);
	tw_decoded_free(d);
	tw_msg_free(m);
}
END_TEST

/* An empty input for lz4: a zero-length sub-frame flagged "lz4". */
START_TEST(lz4_zero_length)
{
	const uint8_t *fr[1] = {(const uint8_t *)""};
	size_t lens[1] = {0};
	const char *codecs[1] = {"lz4"};
	char why[256];
	tw_decoded *d = NULL;
	int rv = decode_groups(fr, lens, 1, codecs, 1, &d, why);
	SAY("lz4 zero length: rv %d %s\n", rv, why);
	tw_decoded_free(d);
	ck_assert_int_eq(rv, 0);
}
END_TEST

/* 10,000 tiny non-adjacent sub-frames merged: one copy, fast. */
START_TEST(merge_many_tiny)
{
	size_t n = 10000;
	const uint8_t **fr = malloc(n * sizeof(*fr));
	size_t *lens = malloc(n * sizeof(*lens));
	const char **codecs = calloc(n, sizeof(*codecs));
	char why[256];
	tw_decoded *d = NULL;
	double t0, t1;
	int rv;
	for (size_t i = 0; i < n; i++)
		fr[i] = (const uint8_t *)"ab", lens[i] = 2;
	t0 = now_s();
	rv = decode_groups(fr, lens, n, codecs, n, &d, why);
	t1 = now_s();
	SAY("merge 10000: rv %d %s %.3f s\n", rv, why, t1 - t0);
	ck_assert_int_eq(rv, 0);
	ck_assert_uint_eq(tw_decoded_payload_at(d, 0)->frames[0].len, 2 * n);
	tw_decoded_free(d);
	free(fr);
	free(lens);
	free(codecs);
}
END_TEST

int main(void)
{
	return ts_main("decode_bad", 0,
		       TS_CASES(ts_tcase(
			       "all", 120,
			       TS_TESTS(zstd_streaming_lie_allocates_bound,
					zstd_declared_lie_allocates, placement_subheader_nil_bomb,
					decode_cost_quadratic, nesting_limit_error, empty_mixes,
					placeholder_prefilter, lz4_zero_length, merge_many_tiny))));
}
