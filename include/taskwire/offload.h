/* SPDX-License-Identifier: BSD-3-Clause */
/* taskwire: decoding received messages off the loop thread.
 *
 * Decompressing, merging and parsing a 256 MiB message takes long enough
 * to stall every other comm of the loop (Dask issues #1214, #7589). With
 * decoded delivery, each message is decoded (tw_decode) on the loop thread
 * when it is small, or on a worker of the context's offload pool when its
 * decode cost reaches the threshold: its frames' bytes, frame 0 and each
 * sub-header counted 24 times (unpacking makes a 24-byte object per value,
 * and a value may take one byte), plus the decompressed size each
 * compressed frame declares (relay frames count nothing: they are
 * forwarded, not decoded); either way the result reaches
 * the application on the loop thread, in the order the messages arrived on
 * that comm. Different comms never wait for each other. */
#ifndef TASKWIRE_OFFLOAD_H
#define TASKWIRE_OFFLOAD_H

#include <taskwire/comm.h>
#include <taskwire/limits.h>
#include <taskwire/serial.h>

#ifdef __cplusplus
extern "C" {
#endif

#pragma GCC visibility push(default)

/* Messages of at least TW_DEFAULT_OFFLOAD_THRESHOLD_BYTES (limits.h) are
 * decoded on the pool by default. */
/* A threshold that no message reaches: offload off. */
#define TW_OFFLOAD_NEVER UINT64_MAX

/* tw_context_set_offload_threads: worker threads of the pool, started on
 * first use (default: the number of online CPUs minus one, at least 1, so
 * the loop keeps a core and large decodes still run in parallel with it),
 * named "tw-offload" (top -H, gdb, /proc/PID/task/TID/comm).
 * Call before the pool starts: it starts with the first message decoded
 * on it (one at or above the threshold; smaller ones are decoded on the
 * loop and start nothing). Loop thread.
 * Returns 0, or:
 *   TW_EINVAL  ctx NULL, threads 0, or the pool already started
 *   TW_ENOMEM  out of memory (the pool's settings live with the pool)
 * Source: Dask decodes large messages on one offload thread
 * ("Dask-Offload", distributed/utils.py offload); more threads here, so
 * that large messages of different comms decode in parallel. */
int tw_context_set_offload_threads(tw_context *ctx, unsigned threads);

/* tw_context_set_offload_threshold_bytes: messages whose decode cost
 * (above) is `bytes` or more are decoded on the pool; 0 offloads every message,
 * TW_OFFLOAD_NEVER none. Default 10 MiB. Loop thread.
 * Returns 0, or:
 *   TW_EINVAL  ctx is NULL
 *   TW_ENOMEM  out of memory (the pool's settings live with the pool)
 * Source: Dask's distributed.comm.offload, 10MiB (distributed/comm/utils.py
 * offloads messages larger than it; here: at least it). */
int tw_context_set_offload_threshold_bytes(tw_context *ctx, uint64_t bytes);

/* A decoded message: on success err is 0 and the callee owns d (free it
 * with tw_decoded_free, now or later); on a decode error d is NULL, err is
 * the tw_decode code and detail says why; the comm stays open (close it if
 * the protocol says so). Runs on the loop thread, never after the comm's
 * close callback and never after tw_comm_free. */
typedef void (*tw_decoded_cb)(tw_comm *comm, tw_decoded *d, int err, const char *detail, void *arg);

/* tw_comm_set_decoded_callbacks: like tw_comm_set_callbacks, but messages
 * arrive decoded, large ones decoded on the offload pool, in order. While
 * 8 or more messages of the comm wait for delivery, reading pauses. When
 * the comm ends (the peer closed, an error, or tw_comm_close), messages
 * received before are delivered first, then the close callback runs; after
 * tw_comm_abort or tw_comm_free, or while the comm is paused, they are
 * dropped. Loop thread.
 * Returns 0, or:
 *   TW_EINVAL   comm, decoded_cb or close_cb NULL, or callbacks already set
 *   TW_ECLOSED  the comm has ended
 *   TW_ENOMEM   out of memory
 *   TW_EIO      the loop refused the comm's events */
int tw_comm_set_decoded_callbacks(tw_comm *comm, tw_decoded_cb decoded_cb, tw_close_cb close_cb,
				  tw_drain_cb drain_cb, void *arg);

#pragma GCC visibility pop

#ifdef __cplusplus
}
#endif
#endif
