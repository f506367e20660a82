/* SPDX-License-Identifier: BSD-3-Clause */
/* Internal counters. Every field is an atomic because the loop thread,
 * offload workers and application threads (dropping block references)
 * update a comm's concurrently, and tw_stats_global reads every
 * thread's; relaxed order is enough for counters. */
#ifndef TW_CORE_STATS_H
#define TW_CORE_STATS_H

#include <stdatomic.h>
#include <stdint.h>

#include <taskwire/stats.h>

struct tw__stats {
	_Atomic uint64_t msgs_sent, msgs_received, bytes_sent, bytes_received;
	_Atomic uint64_t payload_bytes_copied;
	_Atomic uint64_t blocks_allocated, block_bytes_allocated;
	_Atomic uint64_t blocks_live, block_bytes_live, block_cache_hits;
	_Atomic uint64_t merges_zero_copy, merges_copied;
	_Atomic uint64_t write_bytes_gathered;
};

/* The process-wide counters are one shard per thread (core/stats.c),
 * summed by tw_stats_global: tw__global_stats is this thread's shard, so
 * loops on several cores never add to the same cache line. */
extern _Thread_local struct tw__stats *tw__stats_mine __attribute__((tls_model("initial-exec")));
struct tw__stats *tw__stats_first(void);
static inline struct tw__stats *tw__stats_shard(void)
{
	struct tw__stats *s = tw__stats_mine;
	return s != NULL ? s : tw__stats_first();
}
#define tw__global_stats (*tw__stats_shard())

#define TW__ADD(st, field, n) atomic_fetch_add_explicit(&(st)->field, (n), memory_order_relaxed)
#define TW__SUB(st, field, n) atomic_fetch_sub_explicit(&(st)->field, (n), memory_order_relaxed)

/* Count in the global stats and, when `comm` is not NULL, in a comm's. */
#define TW__COUNT(comm_st, field, n)                                                               \
	do {                                                                                       \
		TW__ADD(&tw__global_stats, field, (n));                                            \
		if (comm_st)                                                                       \
			TW__ADD((comm_st), field, (n));                                            \
	} while (0)

/* Snapshot st into out, a tw_stats of `size` bytes as its caller was
 * compiled (include/taskwire/stats.h). */
void tw__stats_snapshot(const struct tw__stats *st, tw_stats *out, size_t size);

#endif
