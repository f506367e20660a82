/* Per-frame zstd and lz4 (protocol/compress.h), on libzstd and liblz4. */
#include <endian.h>
#include <string.h>

/* ZSTD_findDecompressedSize and ZSTD_decompressBound are in the advanced
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

static int zstd_size(const uint8_t *in, size_t n, uint64_t max_bytes, uint64_t *out)
{
	unsigned long long sz = ZSTD_findDecompressedSize(in, n);
	if (sz == ZSTD_CONTENTSIZE_ERROR)
		return TW_EPROTO;
	if (sz == ZSTD_CONTENTSIZE_UNKNOWN) {
		/* A streaming frame: its blocks bound the output (BH-32). */
		sz = ZSTD_decompressBound(in, n);
		if (sz == ZSTD_CONTENTSIZE_ERROR)
			return TW_EPROTO;
	}
	if (sz > max_bytes)
		return TW_ETOOBIG;
	*out = sz;
	return 0;
}

int tw__decompressed_size(enum tw__codec c, const uint8_t *in, size_t n, uint64_t max_bytes,
			  uint64_t *out)
{
	uint32_t v;
	switch (c) {
	case TW__CODEC_ZSTD:
		return zstd_size(in, n, max_bytes, out);
	case TW__CODEC_LZ4:
		if (n < 4)
			return TW_EPROTO;
		memcpy(&v, in, 4);
		*out = le32toh(v);
		return *out > max_bytes ? TW_ETOOBIG : 0;
	default:
		*out = n;
		return n > max_bytes ? TW_ETOOBIG : 0;
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
		/* A NULL destination is fine for an empty result (BH-32). */
		r = ZSTD_decompress(dst_len ? dst : NULL, dst_len, in, n);
		if (ZSTD_isError(r) || (r != dst_len && zstd_declares_size(in, n)))
			return TW_EPROTO;
		*out_len = r;
		return 0;
#ifdef TW_HAVE_LZ4
	case TW__CODEC_LZ4: {
		int got;
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
	default:
		return TW_EPROTO;
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
