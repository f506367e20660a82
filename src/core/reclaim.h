/* SPDX-License-Identifier: BSD-3-Clause */
/* Unmapping large mappings, and faulting in pages ahead of a writer, off
 * the caller's thread. */
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
/* tw__prefault: fault in [p, p + len) writable (MADV_POPULATE_WRITE) on
 * the reclaimer thread, so that the loop writing there later does not
 * take the page faults (a fresh page costs a fault, zeroing and, in a
 * VM, the host's fault: 25 ms of loop CPU for 7 MB in budget-bench).
 * Bytes already there are kept. Jobs run in order with the unmaps, so a
 * range prefaulted and then handed to tw__unmap is unmapped after its
 * prefault. Any thread; best effort (without memory or a thread it does
 * nothing and the writer faults the pages in itself). */
uint32_t tw__prefault(void *p, size_t len);
/* tw__prefault returns the prefault's number (0 when it was not queued),
 * and tw__prefault_done(n) says whether prefault n and every one queued
 * before it are done (pages faulted in, unless the range went away or
 * the system refused the memory: then the writer takes the faults).
 * Lets a writer know its window is in without asking the kernel
 * (mincore). Any thread. */
int tw__prefault_done(uint32_t seq);
/* Wait until every mapping handed to the reclaimer so far is unmapped
 * (tests, tw_block_cache_set_limit), and every prefault done. Any thread but the reclaimer's. */
void tw__reclaim_wait(void);
/* Bytes handed to the reclaimer and not unmapped yet (they are still
 * resident). Any thread. */
uint64_t tw__reclaim_pending(void);

#endif
