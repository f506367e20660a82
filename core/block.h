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

/* tw__block_reserve: a block of `capacity` bytes of address space whose
 * pages are committed only as they are written (receiving a message of
 * unknown size, e.g. a fragmented WebSocket message); tw__block_trim then
 * sets its size to what was used (<= capacity) and returns the rest. Only
 * the owner of the single reference may trim, before sharing it. */
/* A draft is the data of a heap block not yet made: tw__block_draft
 * allocates room for cap bytes (NULL when out of memory), _grow moves it
 * to cap bytes like realloc (NULL and the draft untouched on failure),
 * _free drops it, and tw__block_seal turns the first `size` bytes into a
 * block with one reference, the caller's (the draft is consumed). */
uint8_t *tw__block_draft(size_t cap);
uint8_t *tw__block_draft_grow(uint8_t *data, size_t cap);
void tw__block_draft_free(uint8_t *data);
tw_block *tw__block_seal(uint8_t *data, size_t size);

int tw__block_reserve(size_t capacity, tw_block **out);
void tw__block_trim(tw_block *b, size_t size);

/* Release every cached mapping (context teardown, tests). */
void tw__block_cache_drain(void);

#endif
