/* SPDX-License-Identifier: BSD-3-Clause */
/* taskwire: the Dask comm handshake (docs/design.md, Handshake and server; Dask's
 * distributed/comm/core.py handshake_info and handshake_configuration).
 *
 * Right after the transport is up each side sends one message whose frame
 * 0 is {"compression": str|nil|false, "python": [3, 11, 2],
 * "pickle-protocol": 5}. The listener writes first; the connector reads
 * first, then writes. Negotiated: pickle-protocol = min(local, remote);
 * compression = the local codec if both sides named the same one, else
 * none. A receiver still decodes whatever codec each frame names. */
#ifndef TASKWIRE_HANDSHAKE_H
#define TASKWIRE_HANDSHAKE_H

#include <taskwire/comm.h>
#include <taskwire/limits.h>

#ifdef __cplusplus
extern "C" {
#endif

#pragma GCC visibility push(default)

#define TW_PICKLE_PROTOCOL 5

typedef struct tw_handshake_info {
	const char *compression;      /* negotiated codec this side sends with, or NULL */
	int pickle_protocol;          /* min(local, remote) */
	const char *peer_compression; /* what the peer offered, or NULL */
} tw_handshake_info;

/* The handshake finished: on success err is 0 and info (valid during the
 * call) says what was negotiated; set the comm's callbacks now (or later:
 * reading pauses until tw_comm_set_callbacks). On failure the comm is
 * closed (free it), info is NULL, and err is one of:
 *   TW_EPROTO     the peer's handshake is not a map, lacks `compression`
 *                 or `pickle-protocol`, or is not a message taskwire can
 *                 decode
 *   TW_ETIMEDOUT  no handshake within the context's handshake timeout, or,
 *                 on a connector's comm from tw_comm_connect, within what
 *                 the connect timeout had left (context.h,
 *                 tw_context_set_connect_timeout_ms); tw_comm_last_error
 *                 names the clock and says what came
 *   TW_ECLOSED    the peer closed
 *   (any code)    the comm's error (TW_EIO, TW_ETLS ...)
 * Runs on the loop thread. */
typedef void (*tw_handshake_cb)(tw_comm *comm, int err, const tw_handshake_info *info, void *arg);

/* Which end of the comm this side is: the listener's end writes its
 * handshake first, the connector's reads first (Dask's
 * distributed/comm/core.py, Listener.on_connection and connect). */
enum tw_handshake_side {
	TW_HANDSHAKE_CONNECTOR = 0, /* a comm from tw_comm_connect */
	TW_HANDSHAKE_LISTENER = 1   /* a comm from a listener's accept callback */
};

/* tw_comm_handshake: run the handshake on a fresh comm (no callbacks set
 * yet) as `side`. Offers the context's compression
 * (tw_context_set_compression) and gives up after its handshake timeout,
 * or sooner, as the connector on a comm from tw_comm_connect, when the
 * connect timeout runs out (what it had left when the connect's callback
 * ran; Dask's connect() in distributed/comm/core.py does the same).
 * After success the comm also places the shards of split payloads
 * adjacently (so tw_decode merges them without a copy) and
 * tw_comm_compression tells the negotiated codec. Loop thread.
 * Returns 0 (cb runs exactly once), or:
 *   TW_EINVAL  comm or cb NULL, side not a tw_handshake_side, callbacks
 *              already set, or a handshake already run or running on comm
 *   TW_ECLOSED the comm has ended
 *   TW_ENOMEM  out of memory
 *   TW_EIO     the loop refused the comm's events or timer
 * On an error cb never runs and the comm is as it was: free it. */
int tw_comm_handshake(tw_comm *comm, enum tw_handshake_side side, tw_handshake_cb cb, void *arg);

/* tw_comm_compression: the negotiated codec name ("zstd", "lz4") to pass
 * to tw_builder_new, or NULL for none or before the handshake. Loop
 * thread. */
const char *tw_comm_compression(const tw_comm *comm);

/* tw_context_set_compression: the codec this side offers in handshakes:
 * "zstd", "lz4" or NULL (default: none). Loop thread.
 * Returns 0, or:
 *   TW_EINVAL   ctx is NULL
 *   TW_ENOTSUP  an unknown codec, or one this build lacks (lz4) */
int tw_context_set_compression(tw_context *ctx, const char *codec);

/* tw_context_set_handshake_timeout_ms: bound on the whole handshake, in
 * milliseconds (default 10,000): the only bound on a comm a listener
 * accepted; a connector's also ends at the connect timeout, the sooner
 * winning (tw_context_set_connect_timeout_ms). Also the ws upgrade's
 * bound. Loop thread.
 * Returns 0, or:
 *   TW_EINVAL  ctx NULL or ms 0 */
int tw_context_set_handshake_timeout_ms(tw_context *ctx, uint32_t ms);

#pragma GCC visibility pop

#ifdef __cplusplus
}
#endif
#endif
