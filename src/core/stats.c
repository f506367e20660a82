/* SPDX-License-Identifier: BSD-3-Clause */
/* Process-wide counters and snapshots (include/taskwire/stats.h). */
#include <string.h>

#include "core/stats.h"

struct tw__stats tw__global_stats;

#define LOAD(f) all.f = atomic_load_explicit(&st->f, memory_order_relaxed)

void tw__stats_snapshot(const struct tw__stats *st, tw_stats *out, size_t size)
{
	tw_stats all;
	size_t n = size < sizeof(all) ? size : sizeof(all);
	LOAD(msgs_sent);
	LOAD(msgs_received);
	LOAD(bytes_sent);
	LOAD(bytes_received);
	LOAD(payload_bytes_copied);
	LOAD(blocks_allocated);
	LOAD(block_bytes_allocated);
	LOAD(blocks_live);
	LOAD(block_bytes_live);
	LOAD(block_cache_hits);
	LOAD(merges_zero_copy);
	LOAD(merges_copied);
	LOAD(write_bytes_gathered);
	if (out == NULL)
		return;
	memcpy(out, &all, n);
	memset((char *)out + n, 0, size - n); /* fields this library lacks */
}

void tw_stats_global_sized(tw_stats *out, size_t size)
{
	tw__stats_snapshot(&tw__global_stats, out, size);
}

void(tw_stats_global)(tw_stats *out)
{
	tw__stats_snapshot(&tw__global_stats, out, TW__STATS_V1_BYTES);
}
