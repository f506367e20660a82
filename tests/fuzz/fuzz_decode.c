/* SPDX-License-Identifier: BSD-3-Clause */
/* Fuzz target: tw_decode (protocol/decode.c and, under it, the msgpack
 * check, placeholders, zstd/lz4 and merge).
 *
 * The input is a message: byte 0 holds the frame count n in bits 0-6 and,
 * in bit 7, "one block": the frames are then adjacent slices of one block
 * (as a comm places the shards of a split payload, so merges are views),
 * else each frame has a block of its own. Then n little-endian u16 frame
 * lengths, then the frames' bytes; a length or frame cut short by the end
 * of the input is cut there. The message is decoded with a 1 MiB limit.
 *
 * Invariants (a broken one aborts): a failure is TW_EPROTO, TW_ENOTSUP or
 * TW_ETOOBIG with a detail and no result (no TW_ENOMEM: nothing here is
 * big enough to run out of memory, so it would be a misreported bad
 * input); on success every payload frame lies inside its block, is read in
 * full, and a decompressed one is at most the limit; after freeing, no
 * block is left alive.
 *
 * Built by `CC=clang ./configure --enable-fuzzers && make` (see
 * tests/Makefile.inc); replayed over tests/fuzz/corpus/decode by
 * check_fuzz_decode_replay under `make check`; seeds written by
 * tests/fuzz/make_decode_corpus.py. */
#include <stdlib.h>
#include <string.h>

#include <taskwire/error.h>
#include <taskwire/serial.h>
#include <taskwire/stats.h>

#include "tests/fuzz/fuzz.h"

#define LIMIT ((uint64_t)1 << 20)

static void check(int ok)
{
	if (!ok)
		abort();
}

/* Frames of the input as slices of `store` (one block) or copies. */
static tw_msg *make_msg(const uint8_t *data, size_t size)
{
	size_t n = size > 0 ? data[0] & 0x7f : 0, off = 1 + 2 * n, at;
	int one_block = size > 0 && (data[0] & 0x80);
	tw_block *store = NULL;
	tw_msg *m;
	if (tw_msg_new(&m) != 0)
		abort();
	if (off > size)
		off = size;
	if (one_block) {
		check(tw_block_new(size - off, &store) == 0);
		memcpy(tw_block_data(store), data + off, size - off);
	}
	at = off;
	for (size_t i = 0; i < n; i++) {
		size_t len =
			1 + 2 * i + 1 < size ? data[1 + 2 * i] | (size_t)data[2 + 2 * i] << 8 : 0;
		if (len > size - at)
			len = size - at;
		if (one_block)
			check(tw_msg_append(m, &(tw_slice){len ? store : NULL, at - off, len}) ==
			      0);
		else
			check(tw_msg_append_copy(m, data + at, len) == 0);
		at += len;
	}
	tw_block_free(store);
	return m;
}

/* Read every byte of a frame (out-of-bounds views show up under ASan). */
static unsigned touch(const tw_slice *f)
{
	const uint8_t *p = tw_slice_data(f);
	unsigned sum = 0;
	if (f->block == NULL) {
		check(f->len == 0);
		return 0;
	}
	check(f->offset <= tw_block_size(f->block) &&
	      f->len <= tw_block_size(f->block) - f->offset);
	for (size_t i = 0; i < f->len; i++)
		sum += p[i];
	return sum;
}

static int in_msg(const tw_msg *m, const tw_block *b)
{
	for (size_t i = 0; i < tw_msg_nframes(m); i++)
		if (tw_msg_frame(m, i)->block == b)
			return 1;
	return 0;
}

static void check_decoded(const tw_msg *m, const tw_decoded *d)
{
	volatile unsigned sum = 0;
	check(tw_decoded_root(d) != NULL);
	for (size_t i = 0; i < tw_decoded_npayloads(d); i++) {
		const tw_payload *pl = tw_decoded_payload_at(d, i);
		check(pl != NULL && pl->serializer != NULL && pl->sub_header != NULL);
		check(pl->index >= 1 && pl->index < tw_msg_nframes(m));
		check(pl->nframes < tw_msg_nframes(m));
		for (size_t j = 0; j < pl->nframes; j++) {
			sum += touch(&pl->frames[j]);
			if (pl->frames[j].block != NULL && !in_msg(m, pl->frames[j].block))
				check(pl->frames[j].len <= LIMIT ||
				      pl->frames[j].len <= tw_msg_bytes(m));
		}
	}
	check(tw_decoded_payload_at(d, tw_decoded_npayloads(d)) == NULL);
	(void)sum;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	tw_decode_limits lim = {LIMIT};
	char why[256] = "";
	tw_decoded *d = NULL;
	tw_stats before, after;
	tw_msg *m;
	int rv;
	tw_stats_global(&before, sizeof(before));
	m = make_msg(data, size);
	rv = tw_decode(m, &lim, &d, why, sizeof(why));
	if (rv == 0) {
		check(d != NULL);
		check_decoded(m, d);
	} else {
		check(rv == TW_EPROTO || rv == TW_ENOTSUP || rv == TW_ETOOBIG);
		check(d == NULL && why[0] != '\0');
	}
	tw_decoded_free(d);
	tw_msg_free(m);
	tw_stats_global(&after, sizeof(after));
	check(after.blocks_live == before.blocks_live);
	return 0;
}
