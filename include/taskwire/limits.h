/* SPDX-License-Identifier: BSD-3-Clause */
/* taskwire: the default of every limit, in one place. Each is changed by
 * the setter named beside it (documented in that setter's header: units,
 * range, thread); the headers that declare the setters include this one.
 * Source of the Dask values: distributed/distributed.yaml (2022.12.1). */
#ifndef TASKWIRE_LIMITS_H
#define TASKWIRE_LIMITS_H

#include <stddef.h>
#include <stdint.h>

/* Received messages (tw_context_set_max_message_bytes,
 * tw_context_set_max_frames, context.h). The frame bound follows the byte
 * limit (TW_MAX_FRAMES_FOR): a received frame costs about 32 bytes of
 * bookkeeping (its length and its slice), so frames up to bytes / 32 keep
 * that within the message limit; a Dask frame averages far more than 32
 * bytes on the wire (8 of length, and every out-of-band value brings a
 * sub-header of about 100), so no real Dask message comes near it (a
 * gather of 100,000 values is 200,001 frames). */
#define TW_MAX_FRAMES_FOR(bytes)     ((bytes) / 32)
#define TW_DEFAULT_MAX_MESSAGE_BYTES (UINT64_C(4) << 30) /* 4 GiB */
#define TW_DEFAULT_MAX_FRAMES        TW_MAX_FRAMES_FOR(TW_DEFAULT_MAX_MESSAGE_BYTES)
/* Frames up to this size share one block (tw_context_set_small_frame_bytes). */
#define TW_DEFAULT_SMALL_FRAME_BYTES ((size_t)64 << 10) /* 64 KiB */
/* A comm's write queue (tw_context_set_write_hwm_bytes). */
#define TW_DEFAULT_WRITE_HWM_BYTES ((size_t)64 << 20) /* 64 MiB */

/* Time (context.h: tw_context_set_connect_timeout_ms,
 * tw_context_set_tcp_timeout_ms, tw_context_set_close_linger_ms,
 * tw_context_set_min_receive_rate). */
#define TW_DEFAULT_CONNECT_TIMEOUT_MS   10000
#define TW_DEFAULT_TCP_TIMEOUT_MS       30000 /* Dask's distributed.comm.timeouts.tcp */
#define TW_DEFAULT_CLOSE_LINGER_MS      5000
#define TW_DEFAULT_MIN_RECEIVE_RATE     1024 /* bytes/s */
#define TW_DEFAULT_MIN_RECEIVE_GRACE_MS 60000
/* How long a message holding receive budget may stand still while the
 * budget is overdrawn (tw_context_set_receive_budget_pause_ms): below the
 * 30 s TCP timeout of the peers that wait meanwhile. */
#define TW_DEFAULT_RECEIVE_BUDGET_PAUSE_MS 20000

/* WebSocket (context.h: tw_context_set_ws_shard_bytes,
 * tw_context_set_ws_max_fragments, tw_context_set_ws_min_ping_interval_ms,
 * tw_context_set_ws_ping_strikes). */
#define TW_DEFAULT_WS_SHARD_BYTES          ((size_t)8 << 20) /* 8 MiB, as Dask */
#define TW_DEFAULT_WS_MAX_FRAGMENTS        4096
#define TW_DEFAULT_WS_MIN_PING_INTERVAL_MS 1000
#define TW_DEFAULT_WS_PING_STRIKES         2

/* Handshakes: the Dask handshake (handshake.h,
 * tw_context_set_handshake_timeout_ms; also the ws upgrade's bound) and
 * TLS's (tls.h, tw_context_set_tls_handshake_timeout_ms). */
#define TW_DEFAULT_HANDSHAKE_TIMEOUT_MS     10000
#define TW_DEFAULT_TLS_HANDSHAKE_TIMEOUT_MS 10000

/* Messages of at least this many bytes (sum of frames) are decoded on the
 * offload pool (offload.h, tw_context_set_offload_threshold_bytes; Dask
 * offloads above 10 MiB too, distributed.comm.offload). */
#define TW_DEFAULT_OFFLOAD_THRESHOLD_BYTES ((uint64_t)10 << 20)

/* The rpc pool (rpc.h: tw_pool_set_limit, tw_pool_set_idle,
 * tw_pool_set_retry). Retries of idempotent calls, as Dask's
 * distributed.comm.retry (count 0, delay min 1 s, max 20 s). */
#define TW_DEFAULT_POOL_LIMIT              512 /* open comms per address (Dask: 512 in all) */
#define TW_DEFAULT_POOL_MAX_IDLE           16  /* idle comms kept per address */
#define TW_DEFAULT_POOL_IDLE_TIMEOUT_MS    60000
#define TW_DEFAULT_POOL_RETRY_COUNT        0
#define TW_DEFAULT_POOL_RETRY_DELAY_MIN_MS 1000
#define TW_DEFAULT_POOL_RETRY_DELAY_MAX_MS 20000

/* A batched sender's interval (stream.h, tw_batched_new). */
#define TW_DEFAULT_BATCH_INTERVAL_MS 2 /* Dask's BatchedSend: 2 ms */

#endif
