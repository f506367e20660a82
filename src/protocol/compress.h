/* SPDX-License-Identifier: BSD-3-Clause */
/* Per-frame compression as Dask does it (docs/design.md, Messages; Dask's
 * distributed/protocol/compression.py): "zstd" is a standard zstd frame
 * (content size in its header); "lz4" is a u32 little-endian uncompressed size followed by a raw
 * LZ4 block. Never applied to frame 0 or sub-headers. */
#ifndef TW_PROTOCOL_COMPRESS_H
#define TW_PROTOCOL_COMPRESS_H

#include <stddef.h>
#include <stdint.h>

#include <taskwire/buf.h>

enum tw__codec { TW__CODEC_NONE = 0, TW__CODEC_ZSTD, TW__CODEC_LZ4 };

/* Frames outside [MIN, MAX] bytes are sent uncompressed; a result is kept
 * only when it is at most 90% of the input. */
#define TW__COMPRESS_MIN_BYTES 10000
#define TW__COMPRESS_MAX_BYTES (UINT64_C(1) << 31)

/* tw__codec_parse: the codec named by `name` (n bytes, not
 * NUL-terminated). Returns 0 and sets *out, or TW_ENOTSUP for a name we do
 * not know or did not build (lz4 without liblz4). */
int tw__codec_parse(const char *name, size_t n, enum tw__codec *out);
const char *tw__codec_name(enum tw__codec c);

/* tw__decompressed_size: the size `in` (n bytes) decompresses to, as its
 * headers declare: the zstd content sizes of every frame in it, or the lz4
 * prefix. A zstd frame without a content size gives the bound of its
 * blocks. Fails with TW_ETOOBIG when that is above max_bytes, TW_EPROTO when
 * the input is corrupt or too short. Nothing is allocated. */
int tw__decompressed_size(enum tw__codec c, const uint8_t *in, size_t n, uint64_t max_bytes,
			  uint64_t *out);

/* tw__decompress: decompress `in` into dst (dst_len bytes, the size
 * tw__decompressed_size gave); *out_len gets the bytes produced, which must
 * equal dst_len when the size was declared. Returns 0 or TW_EPROTO (corrupt
 * input, or output that differs from the declared size). */
int tw__decompress(enum tw__codec c, const uint8_t *in, size_t n, uint8_t *dst, size_t dst_len,
		   size_t *out_len);

/* tw__compress: compress `in` (n bytes) when the rules above allow it.
 * Returns 0 with *out a new slice the caller owns (one reference), or 0
 * with out->block NULL when the frame is left uncompressed; TW_ENOMEM. */
int tw__compress(enum tw__codec c, const uint8_t *in, size_t n, tw_slice *out);

#endif
