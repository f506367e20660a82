/* SPDX-License-Identifier: BSD-3-Clause */
/* Placement of received frames for Dask messages: the shards of one split
 * payload land adjacent in one block, so tw_decode merges them with no
 * copy, while unrelated frames keep blocks of their own (docs/design.md,
 * Messages; Dask's serialize_and_split). Plugs into the transport's
 * placement hook (transport/frame_rx.h): frame 0 and every sub-header
 * arrive before the frames they describe. */
#ifndef TW_PROTOCOL_PLACEMENT_H
#define TW_PROTOCOL_PLACEMENT_H

#include <stddef.h>
#include <stdint.h>

#include <taskwire/msg.h>

struct tw__dask_place {
	uint32_t *span; /* per frame: frames to read into one block from it */
	size_t n;
	uint64_t *subs;     /* sub-header frame indices, ascending */
	size_t nsubs, next; /* next sub-header to read once it is complete */
	int planned;        /* frame 0 read for this message */
	size_t parsed;      /* sub-header bytes parsed for this message */
};

/* The hook (a tw__place_fn): hints only, never an error; tw_decode checks
 * everything again. */
int tw__dask_place(void *arg, const tw_msg *msg, const uint64_t *lens, size_t n, size_t i);
void tw__dask_place_reset(struct tw__dask_place *p);
void tw__dask_place_free(void *p); /* reset and free; accepts NULL */

#endif
