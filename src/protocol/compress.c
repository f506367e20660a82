/* SPDX-License-Identifier: BSD-3-Clause */
/* Per-frame zstd and lz4 (protocol/compress.h), on libzstd and liblz4. */
#include <endian.h>
#include <string.h>

/* ZSTD_getFrameHeader and ZSTD_findDecompressedSize are in the advanced
 * API, exported by the shared libzstd since 1.4. */
#define ZSTD_STATIC_LINKING_ONLY
#include <zstd.h>
#ifdef TW_HAVE_LZ4
#include <lz4.h>
#endif

#include <taskwire/error.h>

#include "protocol/compress.h"

/* Dask's default zstd level (distributed.comm.zstd.level). */
#define ZSTD_LEVEL 3

int tw__codec_parse(const char *name, size_t n, enum tw__codec *out)
{
	if (n == 4 && memcmp(name, "zstd", 4) == 0) {
		*out = TW__CODEC_ZSTD;
		return 0;
	}
#ifdef TW_HAVE_LZ4
	if (n == 3 && memcmp(name, "lz4", 3) == 0) {
		*out = TW__CODEC_LZ4;
		return 0;
	}
#endif
	return TW_ENOTSUP;
}

const char *tw__codec_name(enum tw__codec c)
{
	switch (c) {
	case TW__CODEC_ZSTD: return "zstd";
	case TW__CODEC_LZ4: return "lz4";
	default: return NULL;
	}
}

/* Windows above 2^27 (zstd's own default decoder limit; RFC 8878 section
 * 3.1.1.1.2 asks decoders for 8 MB) are refused. */
#define ZSTD_WINDOW_MAX ((uint64_t)1 << 27)
/* lz4 never expands one input byte into more than 255 output bytes. */
#define LZ4_MAX_RATIO 255

/* What the blocks of the zstd frame at in[off..n) (header already read
 * into h) can decompress to: a raw or RLE block its exact size, a
 * compressed one at most the block maximum (RFC 8878, 3.1.1.2). Sets *end
 * past the frame. Nothing is decompressed. Unlike ZSTD_decompressBound,
 * this also bounds frames that declare a content size, so a header that
 * claims more than its blocks hold is refused before allocating. */
static int zstd_blocks(const uint8_t *in, size_t n, size_t off, const ZSTD_frameHeader *h,
		       uint64_t *bound, size_t *end)
{
	int last = 0;
	*bound = 0;
	while (!last) {
		uint32_t bh, size;
		if (n - off < 3)
			return TW_EPROTO;
		bh = in[off] | (uint32_t)in[off + 1] << 8 | (uint32_t)in[off + 2] << 16;
		off += 3;
		last = bh & 1;
		size = bh >> 3;
		if (size > h->blockSizeMax)
			return TW_EPROTO; /* Block_Maximum_Size bounds every block */
		switch ((bh >> 1) & 3) {
		case 0: /* raw */
			if (n - off < size)
				return TW_EPROTO;
			*bound += size;
			off += size;
			break;
		case 1: /* RLE: one byte repeated size times */
			if (n - off < 1)
				return TW_EPROTO;
			*bound += size;
			off += 1;
			break;
		case 2: /* compressed */
			if (n - off < size)
				return TW_EPROTO;
			*bound += h->blockSizeMax;
			off += size;
			break;
		default: return TW_EPROTO;
		}
	}
	if (h->checksumFlag && n - off < 4)
		return TW_EPROTO;
	*end = off + (h->checksumFlag ? 4 : 0);
	return 0;
}

/* The size one zstd frame at in[0..n) decompresses to: its declared
 * content size, which its blocks must be able to produce, or else the bound
 * of its blocks (a streaming frame: RFC 8878 section 3.1.1.1.4 lets a
 * frame omit its content size). Sets *used to the frame's
 * length. Sizes from the header are checked against max_bytes and the
 * blocks before anything is allocated. */
static int zstd_frame_size(const uint8_t *in, size_t n, uint64_t max_bytes, uint64_t *out,
			   size_t *used)
{
	ZSTD_frameHeader h;
	uint64_t bound;
	size_t r = ZSTD_getFrameHeader(&h, in, n);
	int rv;
	if (ZSTD_isError(r) || r > 0)
		return TW_EPROTO;
	if (h.frameType == ZSTD_skippableFrame) {
		*used = ZSTD_findFrameCompressedSize(in, n);
		*out = 0;
		return ZSTD_isError(*used) ? TW_EPROTO : 0;
	}
	if (h.frameContentSize != ZSTD_CONTENTSIZE_UNKNOWN && h.frameContentSize > max_bytes)
		return TW_ETOOBIG;
	/* a window descriptor (no Single_Segment_Flag in the descriptor byte) */
	if ((in[4] & 0x20) == 0 && h.windowSize > ZSTD_WINDOW_MAX)
		return TW_ETOOBIG;
	if ((rv = zstd_blocks(in, n, h.headerSize, &h, &bound, used)) != 0)
		return rv;
	if (h.frameContentSize == ZSTD_CONTENTSIZE_UNKNOWN)
		*out = bound;
	else if (h.frameContentSize > bound)
		return TW_EPROTO; /* more than its blocks can hold: a lie */
	else
		*out = h.frameContentSize;
	return *out > max_bytes ? TW_ETOOBIG : 0;
}

/* Every frame of `in` (several may follow each other: RFC 8878 section 3.1). */
static int zstd_size(const uint8_t *in, size_t n, uint64_t max_bytes, uint64_t *out)
{
	uint64_t total = 0, size;
	size_t used;
	int rv;
	while (n > 0) {
		if ((rv = zstd_frame_size(in, n, max_bytes - total, &size, &used)) != 0)
			return rv;
		total += size;
		in += used;
		n -= used;
	}
	*out = total;
	return 0;
}

static int lz4_size(const uint8_t *in, size_t n, uint64_t max_bytes, uint64_t *out)
{
	uint32_t v;
	*out = 0;
	if (n == 0)
		return 0; /* nothing, as zstd's empty input */
	if (n < 4)
		return TW_EPROTO;
	memcpy(&v, in, 4);
	*out = le32toh(v);
	if (*out > max_bytes)
		return TW_ETOOBIG;
	if (*out > (uint64_t)INT32_MAX)
		return TW_EPROTO; /* past what an lz4 block can hold */
	/* a prefix its block cannot reach is a lie: refuse it before allocating */
	return *out > (uint64_t)(n - 4) * LZ4_MAX_RATIO ? TW_EPROTO : 0;
}

int tw__decompressed_size(enum tw__codec c, const uint8_t *in, size_t n, uint64_t max_bytes,
			  uint64_t *out)
{
	switch (c) {
	case TW__CODEC_ZSTD: return zstd_size(in, n, max_bytes, out);
	case TW__CODEC_LZ4: return lz4_size(in, n, max_bytes, out);
	default: *out = n; return n > max_bytes ? TW_ETOOBIG : 0;
	}
}

static int zstd_declares_size(const uint8_t *in, size_t n)
{
	return ZSTD_findDecompressedSize(in, n) != ZSTD_CONTENTSIZE_UNKNOWN;
}

int tw__decompress(enum tw__codec c, const uint8_t *in, size_t n, uint8_t *dst, size_t dst_len,
		   size_t *out_len)
{
	size_t r;
	switch (c) {
	case TW__CODEC_ZSTD:
		/* A NULL destination is fine for an empty result. */
		r = ZSTD_decompress(dst_len ? dst : NULL, dst_len, in, n);
		if (ZSTD_isError(r) || (r != dst_len && zstd_declares_size(in, n)))
			return TW_EPROTO;
		*out_len = r;
		return 0;
#ifdef TW_HAVE_LZ4
	case TW__CODEC_LZ4: {
		int got;
		if (n == 0 && dst_len == 0) {
			*out_len = 0;
			return 0;
		}
		if (n < 4 || n - 4 > (size_t)INT32_MAX || dst_len > (size_t)INT32_MAX)
			return TW_EPROTO;
		got = LZ4_decompress_safe((const char *)in + 4, (char *)dst, (int)(n - 4),
					  (int)dst_len);
		if (got < 0 || (size_t)got != dst_len)
			return TW_EPROTO;
		*out_len = dst_len;
		return 0;
	}
#endif
	default: return TW_EPROTO;
	}
}

/* Keep a result only when it saves at least 10%. */
static int worth_it(size_t in, size_t out)
{
	return (uint64_t)out * 10 <= (uint64_t)in * 9;
}

int tw__compress(enum tw__codec c, const uint8_t *in, size_t n, tw_slice *out)
{
	tw_block *b;
	size_t len = 0, bound;
	*out = (tw_slice){NULL, 0, 0};
	if (n < TW__COMPRESS_MIN_BYTES || n > TW__COMPRESS_MAX_BYTES)
		return 0;
	if (c == TW__CODEC_ZSTD)
		bound = ZSTD_compressBound(n);
#ifdef TW_HAVE_LZ4
	else if (c == TW__CODEC_LZ4 && n <= LZ4_MAX_INPUT_SIZE)
		bound = 4 + (size_t)LZ4_compressBound((int)n);
#endif
	else
		return 0;
	if (tw_block_new(bound, &b) != 0)
		return TW_ENOMEM;
	if (c == TW__CODEC_ZSTD) {
		len = ZSTD_compress(tw_block_data(b), bound, in, n, ZSTD_LEVEL);
		if (ZSTD_isError(len))
			len = n;
	}
#ifdef TW_HAVE_LZ4
	else {
		uint32_t v = htole32((uint32_t)n);
		int got = LZ4_compress_default((const char *)in, (char *)tw_block_data(b) + 4,
					       (int)n, (int)(bound - 4));
		memcpy(tw_block_data(b), &v, 4);
		len = got > 0 ? 4 + (size_t)got : n;
	}
#endif
	if (!worth_it(n, len)) {
		tw_block_free(b);
		return 0;
	}
	*out = (tw_slice){b, 0, len};
	return 0;
}
