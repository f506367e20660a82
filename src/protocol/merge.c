/* SPDX-License-Identifier: BSD-3-Clause */
/* Merging sub-frames into one logical frame (include/taskwire/merge.h;
 * docs/design.md, Messages): a view when the parts are adjacent in one
 * block, else one allocation and one copy. */
#include <string.h>

#include <taskwire/error.h>
#include <taskwire/merge.h>

#include "core/stats.h"

static int adjacent(const tw_slice *parts, size_t n)
{
	for (size_t i = 1; i < n; i++) {
		if (parts[i].block != parts[0].block ||
		    parts[i].offset != parts[i - 1].offset + parts[i - 1].len)
			return 0;
	}
	return parts[0].block != NULL;
}

int tw_merge(const tw_slice *parts, size_t n, tw_slice *out)
{
	size_t total = 0, off = 0;
	tw_block *b;
	if (out == NULL || (parts == NULL && n > 0))
		return TW_EINVAL;
	for (size_t i = 0; i < n; i++)
		total += parts[i].len;
	/* An empty result has no block, so it pins none (merge.h). */
	if (total == 0) {
		*out = (tw_slice){NULL, 0, 0};
		return 0;
	}
	if (adjacent(parts, n)) {
		*out = (tw_slice){tw_block_hold(parts[0].block), parts[0].offset, total};
		TW__ADD(&tw__global_stats, merges_zero_copy, 1);
		return 0;
	}
	if (tw_block_new(total, &b) != 0)
		return TW_ENOMEM;
	for (size_t i = 0; i < n; i++) {
		if (parts[i].len > 0)
			memcpy(tw_block_data(b) + off, tw_slice_data(&parts[i]), parts[i].len);
		off += parts[i].len;
	}
	TW__ADD(&tw__global_stats, merges_copied, 1);
	TW__ADD(&tw__global_stats, payload_bytes_copied, total);
	*out = (tw_slice){b, 0, total};
	return 0;
}
