/* SPDX-License-Identifier: BSD-3-Clause */
/* taskwire: statistics.
 *
 * Counters kept as atomics, so any thread may read them while the loop and
 * worker threads update them. Process-wide counters cover every context;
 * per-comm counters (tw_comm_stats) fill the message and byte fields only. */
#ifndef TASKWIRE_STATS_H
#define TASKWIRE_STATS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The library is built with hidden visibility; the API is exported. */
#pragma GCC visibility push(default)

typedef struct tw_stats {
	uint64_t msgs_sent;      /* messages fully written to the kernel */
	uint64_t msgs_received;  /* messages fully received */
	uint64_t bytes_sent;     /* wire bytes written (preludes included) */
	uint64_t bytes_received; /* wire bytes read (preludes included) */
	/* frame bytes memcpy'd into another block in user space (merges,
	 * read-ahead mispredictions, tw_msg_append_copy, ...); not the
	 * small writes counted in write_bytes_gathered */
	uint64_t payload_bytes_copied;
	uint64_t blocks_allocated; /* blocks ever allocated (not wrapped) */
	uint64_t block_bytes_allocated;
	uint64_t blocks_live;      /* blocks currently alive */
	uint64_t block_bytes_live; /* bytes in live blocks */
	uint64_t block_cache_hits; /* large blocks served from the cache */
	uint64_t merges_zero_copy; /* tw_merge results that are views */
	uint64_t merges_copied;    /* tw_merge results that needed a copy */
	/* bytes of small pieces (preludes, WebSocket headers, frames; at
	 * most 4 KiB per write) copied into one buffer before a send or a
	 * TLS record */
	uint64_t write_bytes_gathered;
} tw_stats;

/* tw_stats only ever grows at its end, and the functions that fill it take
 * its size as the caller was compiled (pass sizeof(*out)): a program built
 * against an older header gets the fields it knows, one built against a
 * newer header gets zeros in the fields this library lacks, and neither is
 * written past its struct. */

/* tw_stats_global: copy the process-wide counters into *out, a tw_stats of
 * `size` bytes (sizeof(*out)); out NULL does nothing. Any thread. */
void tw_stats_global(tw_stats *out, size_t size);

#pragma GCC visibility pop

#ifdef __cplusplus
}
#endif
#endif
