/* SPDX-License-Identifier: BSD-3-Clause */
/* Unmapping large mappings off the caller's thread. */
#ifndef TW_CORE_RECLAIM_H
#define TW_CORE_RECLAIM_H

#include <stddef.h>
#include <stdint.h>

/* Mappings with at least this many bytes in use go to the reclaimer:
 * munmap frees every resident page before it returns (about 0.12 ms per
 * MiB on these machines), so this is about half a millisecond. */
#define TW__RECLAIM_MIN_BYTES ((size_t)4 << 20)

/* tw__unmap: munmap(p, len), on the reclaimer thread when `used` (the
 * bytes that may be resident) reaches TW__RECLAIM_MIN_BYTES, else at
 * once. Any thread; cannot fail (without memory for the queue, or
 * without a thread, it unmaps at once). The pages stay mapped until the
 * reclaimer gets to them: tw__reclaim_wait waits for that. */
void tw__unmap(void *p, size_t len, size_t used);
/* Wait until every mapping handed to the reclaimer so far is unmapped
 * (tests, tw_block_cache_set_limit). Any thread but the reclaimer's. */
void tw__reclaim_wait(void);
/* Bytes handed to the reclaimer and not unmapped yet (they are still
 * resident). Any thread. */
uint64_t tw__reclaim_pending(void);

#endif
