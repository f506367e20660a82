/* SPDX-License-Identifier: BSD-3-Clause */
/* taskwire: refcounted blocks and the slices that view them.
 *
 * A block is a contiguous byte buffer with an atomic reference count. A
 * slice (block, offset, len) views part of a block; frames are slices. A
 * slice does not own a reference by itself: whoever stores a slice (a
 * message, the application) holds one reference on its block.
 *
 * Blocks of at least 256 KiB are mapped pages of their own (released to the
 * OS, or to a bounded cache, when the last reference goes), so a large frame
 * never shares memory with a small one. All functions here may be called
 * from any thread. */
#ifndef TASKWIRE_BUF_H
#define TASKWIRE_BUF_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The library is built with hidden visibility; the API is exported. */
#pragma GCC visibility push(default)

typedef struct tw_block tw_block;

typedef struct tw_slice {
	tw_block *block; /* NULL only for an empty slice */
	size_t offset;   /* bytes from the block's start */
	size_t len;      /* bytes */
} tw_slice;

/* tw_block_new: allocate a block of `size` bytes (0 is allowed), contents
 * undefined, with one reference owned by the caller (drop it with
 * tw_block_free). Any thread.
 * Returns 0 and sets *out, or:
 *   TW_EINVAL  out is NULL
 *   TW_ENOMEM  out of memory (or of address space for a mapped block) */
int tw_block_new(size_t size, tw_block **out);

/* tw_block_wrap: make a block over caller memory `data` of `size` bytes,
 * without copying it (zero-copy send of application buffers). When the last
 * reference goes, `release(data, arg)` runs once, on the thread that dropped
 * it; release may be NULL. The caller owns the one returned reference.
 * Any thread.
 * Returns 0 and sets *out, or:
 *   TW_EINVAL  out is NULL, or data is NULL with size > 0
 *   TW_ENOMEM  out of memory (release is then not called) */
int tw_block_wrap(void *data, size_t size, void (*release)(void *data, void *arg), void *arg,
		  tw_block **out);

/* tw_block_hold: add one reference; returns `b`. b must not be NULL. */
tw_block *tw_block_hold(tw_block *b);

/* tw_block_free: drop one reference; the block is released when the last
 * reference goes. Accepts NULL. A mapped block with 4 MiB or more in use
 * that does not go to the cache is unmapped by the library's reclaimer
 * thread ("tw-reclaim", started with the first such unmap, alive as long
 * as the process), not by the caller: munmap of 2 GiB took 0.25 s on the
 * loop thread and served no comm meanwhile (issue 17). Its pages stay
 * resident, and count in the receive budgets, until the reclaimer gets to
 * them. */
void tw_block_free(tw_block *b);

/* tw_block_data / tw_block_size: the block's bytes and their count. */
uint8_t *tw_block_data(const tw_block *b);
size_t tw_block_size(const tw_block *b);

/* tw_slice_data: pointer to the first byte of `s` (NULL for an empty slice
 * with no block). */
uint8_t *tw_slice_data(const tw_slice *s);

/* tw_block_cache_set_limit: bytes of released large blocks kept for reuse
 * (process-wide; default 256 MiB; 0 disables the cache). Every call
 * empties the cache and returns once its memory, and every unmap handed
 * to the reclaimer before (tw_block_free), is back to the system: it may
 * wait for gigabytes to be unmapped, so avoid calling it on a loop thread
 * while large messages are being freed. Reusing mapped pages avoids
 * first-touch page faults, which cost more than a memcpy on these
 * machines (docs/design.md, Blocks, slices, messages). */
void tw_block_cache_set_limit(size_t bytes);

#pragma GCC visibility pop

#ifdef __cplusplus
}
#endif
#endif
