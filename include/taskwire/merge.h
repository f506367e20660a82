/* SPDX-License-Identifier: BSD-3-Clause */
/* taskwire: merging sub-frames into one logical frame.
 *
 * A sender may split one logical frame into several sub-frames (Dask splits
 * payloads into 64 MiB shards on tcp/tls, 8 MiB on ws). The receiver
 * rebuilds the logical frame (docs/design.md, Messages). */
#ifndef TASKWIRE_MERGE_H
#define TASKWIRE_MERGE_H

#include <stddef.h>

#include <taskwire/buf.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The library is built with hidden visibility; the API is exported. */
#pragma GCC visibility push(default)

/* tw_merge: make one slice *out with the bytes of parts[0..n-1] in order.
 * When every part views the same block and each starts where the previous
 * ends, *out is a view over them (no copy; stats merges_zero_copy);
 * otherwise one new block of the summed size holds a copy (one allocation,
 * one copy; stats merges_copied and payload_bytes_copied). On success the
 * caller owns one reference on out->block (NULL when the result is empty)
 * and still owns its parts. n may be 0 (empty result).
 * Any thread.
 * Returns 0, or:
 *   TW_EINVAL  out is NULL, or parts is NULL with n > 0
 *   TW_ENOMEM  out of memory for the copy */
int tw_merge(const tw_slice *parts, size_t n, tw_slice *out);

#pragma GCC visibility pop

#ifdef __cplusplus
}
#endif
#endif
