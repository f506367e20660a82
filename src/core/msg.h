/* SPDX-License-Identifier: BSD-3-Clause */
/* Internal message helpers. */
#ifndef TW_CORE_MSG_H
#define TW_CORE_MSG_H

#include <taskwire/msg.h>

/* tw__msg_reserve: make room for `n` frames in total, so appends up to n
 * cannot fail. Returns 0 or TW_ENOMEM. */
int tw__msg_reserve(tw_msg *m, size_t n);

/* tw__msg_append_owned: append a slice whose block reference the caller
 * hands over (no extra hold). Room must have been reserved. */
void tw__msg_append_owned(tw_msg *m, tw_slice frame);

/* tw__msg_truncate: release the frames from index n on (a batch rolls
 * back a map it refused). n <= tw_msg_nframes(m). */
void tw__msg_truncate(tw_msg *m, size_t n);

/* tw__msg_footprint: bytes the message's bookkeeping takes beyond its
 * frames' bytes: the message object, its frame array when not inline, a
 * block header per frame (an upper bound: frames may share a block). A
 * write queue counts it against its high-water mark (design.md). */
size_t tw__msg_footprint(const tw_msg *m);

/* tw__msg_frames: the frame array (n = tw_msg_nframes). */
const tw_slice *tw__msg_frames(const tw_msg *m);

#endif
