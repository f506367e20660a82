/* SPDX-License-Identifier: BSD-3-Clause */
/* Internal block helpers. */
#ifndef TW_CORE_BLOCK_H
#define TW_CORE_BLOCK_H

#include <taskwire/buf.h>

/* Blocks of at least this size are mapped pages of their own. */
#define TW__MAP_MIN_BYTES ((size_t)256 << 10)

/* tw__slice: a slice over [off, off+len) of b, without a reference. */
static inline tw_slice tw__slice(tw_block *b, size_t off, size_t len)
{
	tw_slice s = {b, off, len};
	return s;
}

/* A draft is the data of a heap block not yet made: tw__block_draft
 * allocates room for cap bytes (NULL when out of memory), _grow moves it
 * to cap bytes like realloc (NULL and the draft untouched on failure),
 * _free drops it, and tw__block_seal turns the first `size` bytes into a
 * block with one reference, the caller's (the draft is consumed). */
uint8_t *tw__block_draft(size_t cap);
uint8_t *tw__block_draft_grow(uint8_t *data, size_t cap);
void tw__block_draft_free(uint8_t *data);
tw_block *tw__block_seal(uint8_t *data, size_t size);

/* Receiving blocks: memory follows the bytes that arrive, not the size a
 * peer declared (docs/design.md, Receive path (tcp)), under every overcommit
 * policy and RLIMIT_DATA.
 *
 * tw__block_new_lazy: as tw_block_new, but a block of more than
 * TW__COMMIT_MIN_BYTES is mapped and starts as address space only.
 * tw__block_reserve: a
 * mapped block of `capacity` bytes of address space for a message of
 * unknown size (a fragmented WebSocket message); tw__block_trim then sets
 * its size to what was used (<= capacity) and returns the rest. Only the
 * owner of the single reference may trim, before sharing it.
 *
 * tw__block_commit: before writing *len bytes at off (off no further than
 * the bytes already written), make them usable; on return *len may be
 * smaller (write that much, then ask again), never 0 when it was not.
 * Returns 1 when it committed more memory (one step: a caller filling
 * several places in one read stops there, so one read commits at most
 * one step ahead of the bytes), 0 when none was needed, or TW_ENOMEM
 * when the system refuses the memory. A no-op (0) for blocks made
 * otherwise. Both ENOMEM cases fail a message, never the process. */
#define TW__COMMIT_MIN_BYTES ((size_t)64 << 10)
/* tw__block_commit also has the pages of a large block faulted in ahead
 * of the writer, off the caller's thread (tw__prefault), and cuts *len so
 * that the caller itself writes to few pages not faulted in yet
 * (tw__pass_cold). tw__block_warm_ahead: the bytes so prefaulted and not
 * written yet, in all blocks (resident memory the receive budgets
 * count). Any thread. */
uint64_t tw__block_warm_ahead(void);
int tw__block_new_lazy(size_t size, tw_block **out);
int tw__block_reserve(size_t capacity, tw_block **out);
int tw__block_commit(tw_block *b, size_t off, size_t *len);
void tw__block_trim(tw_block *b, size_t size);

/* tw__block_sole: whether the caller holds b's only reference, so that
 * it may write over b's bytes (reuse a receive buffer) with no one else
 * seeing them change. */
int tw__block_sole(const tw_block *b);

/* tw__block_wrap_arg: the `arg` of a block made by tw_block_wrap with
 * this `release` function, or NULL for any other block: how the relay
 * (transport/relay.h) knows its frames from ordinary ones. */
void *tw__block_wrap_arg(const tw_block *b, void (*release)(void *data, void *arg));

/* tw__block_overhead: bytes a block costs beyond its data (its header and
 * the allocator's), for counting what queued messages hold. */
size_t tw__block_overhead(void);

/* A receive budget's room in the cache: what its reservations and write
 * queues leave of its limit (`bytes`: written by the budget's loop
 * thread, read by any). While watched (tw__block_cache_watch), a
 * released block goes to the cache only within the least room of all
 * watchers, less the bytes the reclaimer has still to unmap and those
 * prefaulted ahead (as the budgets count them), so the bound holds at the
 * moment a block goes in, on whatever thread frees it, not only at the
 * budget's next look. Any thread. */
struct tw__cache_room {
	struct tw__cache_room *next, *prev; /* watchers, while watched */
	_Atomic uint64_t bytes;
};
void tw__block_cache_watch(struct tw__cache_room *r);
/* Stop watching; a room never watched (zeroed) is left alone. */
void tw__block_cache_unwatch(struct tw__cache_room *r);

/* Release every cached mapping (context teardown, tests). */
void tw__block_cache_drain(void);
/* The bytes the cache of large blocks holds now (no lock: a look that
 * costs a load); trim it to at most `keep` bytes (oldest first). Any
 * thread. The receive budgets count the
 * cache with their reservations and trim it to make room. */
size_t tw__block_cache_bytes(void);
void tw__block_cache_trim(size_t keep);
/* on 1: one more budget is tight, and while any is, released blocks are
 * not cached (they go back to the system); on 0: one less. */
void tw__block_cache_bypass(int on);

#endif
