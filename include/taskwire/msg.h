/* SPDX-License-Identifier: BSD-3-Clause */
/* taskwire: a message as a list of frames.
 *
 * The unit that comms carry: N >= 1 frames, each a slice of a refcounted
 * block (docs/design.md, Blocks, slices, messages). A message is itself refcounted: the
 * creator owns one reference; tw_msg_hold adds one; tw_msg_free drops one.
 * A message must not be changed after it was written to a comm or while
 * another thread holds it.
 * Threads: any; the reference count is atomic, so tw_msg_hold and
 * tw_msg_free may run on different threads, while tw_msg_append* runs on
 * one thread at a time, before the message is shared. A message holding
 * relay frames is freed on its source comm's loop thread (relay.h). */
#ifndef TASKWIRE_MSG_H
#define TASKWIRE_MSG_H

#include <stddef.h>
#include <stdint.h>

#include <taskwire/buf.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The library is built with hidden visibility; the API is exported. */
#pragma GCC visibility push(default)

typedef struct tw_msg tw_msg;

/* tw_msg_new: an empty message (0 frames) owned by the caller.
 * Returns 0 and sets *out, or:
 *   TW_EINVAL  out is NULL
 *   TW_ENOMEM  out of memory */
int tw_msg_new(tw_msg **out);

/* tw_msg_hold: add a reference, returns m. tw_msg_free: drop one; the last
 * drops the frames' block references. tw_msg_free accepts NULL. */
tw_msg *tw_msg_hold(tw_msg *m);
void tw_msg_free(tw_msg *m);

/* tw_msg_append: add `frame` (a slice; len may be 0) as the last frame.
 * The message takes its own reference on frame->block; the caller keeps
 * its own.
 * Returns 0, or:
 *   TW_EINVAL  m or frame is NULL, or the slice lies outside its block
 *   TW_ENOMEM  out of memory */
int tw_msg_append(tw_msg *m, const tw_slice *frame);

/* tw_msg_append_copy: add a frame holding a copy of `len` bytes at `data`
 * (data may be NULL when len is 0).
 * Returns 0, or:
 *   TW_EINVAL  m is NULL, or data is NULL with len > 0
 *   TW_ENOMEM  out of memory */
int tw_msg_append_copy(tw_msg *m, const void *data, size_t len);

/* tw_msg_append_ref: add a frame that references caller memory without a
 * copy; `release(data, arg)` runs once when no message needs it any more
 * (after it was written, when the message is freed).
 * Returns 0, or:
 *   TW_EINVAL  m is NULL, or data is NULL with len > 0
 *   TW_ENOMEM  out of memory (release is then not called) */
int tw_msg_append_ref(tw_msg *m, const void *data, size_t len,
		      void (*release)(void *data, void *arg), void *arg);

/* tw_msg_nframes: number of frames. tw_msg_frame: frame i (borrowed, valid
 * while the message lives), or NULL when i >= nframes. */
size_t tw_msg_nframes(const tw_msg *m);
const tw_slice *tw_msg_frame(const tw_msg *m, size_t i);

/* tw_msg_bytes: sum of frame lengths, in bytes. */
uint64_t tw_msg_bytes(const tw_msg *m);

#pragma GCC visibility pop

#ifdef __cplusplus
}
#endif
#endif
