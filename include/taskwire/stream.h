/* SPDX-License-Identifier: BSD-3-Clause */
/* taskwire: streams: comms that carry one-way messages in batches
 * (docs/design.md, RPC client and streams; Dask's Server.handle_stream and
 * BatchedSend).
 *
 * After {"op": "connection_stream", "reply": false} a server comm is a
 * stream: each message is a map, or an array of maps, and each map goes
 * to the stream handler of its `op`, with no reply; {"op":
 * "close-stream"} ends it. An op handler makes its request's comm such
 * a stream with tw_request_keep_stream (taskwire/server.h), as Dask's
 * scheduler does at register-worker. A batched sender coalesces the maps written
 * within one interval into one array message. */
#ifndef TASKWIRE_STREAM_H
#define TASKWIRE_STREAM_H

#include <taskwire/comm.h>
#include <taskwire/limits.h>
#include <taskwire/serial.h>
#include <taskwire/server.h>

#ifdef __cplusplus
extern "C" {
#endif

#pragma GCC visibility push(default)

/* A stream message: `msg` is one map of the decoded message d (both valid
 * during the call). `comm` is lent for the call: the server frees its
 * reference when the comm ends; keep it longer with tw_comm_hold (and
 * tw_comm_watch_end to learn when it ends), then tw_comm_release. */
typedef void (*tw_stream_fn)(tw_comm *comm, const tw_decoded *d, const msgpack_object *msg,
			     void *arg);

/* tw_server_add_stream_op: register the handler of stream op `name`.
 * Maps with an unknown op are skipped. Loop thread.
 * Returns 0, or:
 *   TW_EINVAL  s, name or fn is NULL
 *   TW_ENOMEM  out of memory */
int tw_server_add_stream_op(tw_server *s, const char *name, tw_stream_fn fn, void *arg);

/* Stream op tables usable on any comm: the connecting side of a stream (a
 * worker reading its scheduler stream, a client its report stream)
 * dispatches by op as a server does. */
typedef struct tw_stream_ops tw_stream_ops;

/* tw_stream_ops_new: an empty table into *out (free with
 * tw_stream_ops_free). Any thread (no context involved).
 * Returns 0, or:
 *   TW_EINVAL  out is NULL
 *   TW_ENOMEM  out of memory
 * Source: Dask's Worker.stream_handlers / Client._stream_handlers. */
int tw_stream_ops_new(tw_stream_ops **out);

/* tw_stream_ops_add: register (or replace) the handler of stream op
 * `name` (NUL-terminated, copied). Maps whose op has no handler are
 * skipped (Dask's handle_stream would raise KeyError and end the
 * stream). On the loop thread of the comms that dispatch through t, from
 * their handlers too.
 * Returns 0, or:
 *   TW_EINVAL  t, name or fn is NULL
 *   TW_ENOMEM  out of memory */
int tw_stream_ops_add(tw_stream_ops *t, const char *name, tw_stream_fn fn, void *arg);

/* tw_stream_ops_free: free the table; no comm may dispatch through it any
 * more (their ended callbacks ran, or they were freed). Accepts NULL. */
void tw_stream_ops_free(tw_stream_ops *t);

/* tw_comm_dispatch_stream: from now on each message of comm, a map or an
 * array of maps, goes to t's handlers by `op` (handler(comm, d, map,
 * arg), d and map valid during the call), in order, with no replies; maps
 * with an unknown op are skipped; a map {"op": "close-stream"} ends the
 * stream: the maps after it are dropped and comm is closed
 * (tw_comm_close). A message that is not a map or an array, or that cannot
 * be decoded, ends comm with TW_EPROTO (or the decode error).
 * comm: after its handshake (tw_comm_handshake), with no callbacks set or
 * with decoded callbacks (tw_comm_set_decoded_callbacks); from inside its
 * decoded callback too: a worker reads its register-worker reply, then
 * switches, and the messages already received behind the reply are
 * dispatched by op. The comm's previous decoded, close and drain
 * callbacks are replaced (a tw_batched sender has its own drain callback).
 * ended(comm, err, arg) then runs once, as the close callback would (err
 * 0: an orderly end, close-stream included; else the reason, text in
 * tw_comm_last_error), unless the owner frees comm first. The caller
 * keeps owning comm (tw_comm_free, from ended too). t is borrowed: it
 * must outlive the dispatching (until ended ran or comm was freed).
 * Thread: the loop thread of comm's context; handlers and ended run
 * there.
 * Returns 0, or:
 *   TW_EINVAL   comm, t or ended is NULL, comm has raw callbacks
 *               (tw_comm_set_callbacks), or it dispatches already
 *               (a tw_server's comm too, e.g. tw_request_keep_stream's:
 *               its maps go to the server's stream ops, and the server
 *               owns it)
 *   TW_ECLOSED  comm ended or is closing
 *   TW_ENOMEM   out of memory
 * Source: Dask's Server.handle_stream, which the worker runs on its
 * scheduler comm (Worker.handle_scheduler) right after
 * _register_with_scheduler read the reply on that comm. */
int tw_comm_dispatch_stream(tw_comm *comm, const tw_stream_ops *t, tw_comm_ended_fn ended,
			    void *arg);

typedef struct tw_batched tw_batched;

/* tw_batched_new: a batched sender on comm (after its handshake: payloads
 * are compressed as it negotiated; which the caller keeps
 * owning, or a tw_server does for its stream comms). The sender may
 * outlive its comm: once the comm is freed, sends return TW_ECLOSED (and
 * a refused sender's drain callback runs); free the sender in any case.
 * When the comm is closed (tw_comm_close, or its server at close-stream),
 * the queued maps are written first, and later sends return TW_ECLOSED.
 * The sender sets none of the comm's callbacks: they stay its owner's.
 * interval_ms 0 means the default (TW_DEFAULT_BATCH_INTERVAL_MS, 2 ms).
 * Loop thread.
 * Returns 0 and sets *out, or:
 *   TW_EINVAL  comm or out is NULL, or the comm's codec cannot be used
 *   TW_ENOMEM  out of memory */
int tw_batched_new(tw_comm *comm, uint32_t interval_ms, tw_batched **out);

/* tw_batched_send: queue one msgpack map (`packed`, len bytes, copied; it
 * must not hold out-of-band placeholders) for the next batch. Loop thread.
 * Returns 0, or:
 *   TW_EINVAL   b or packed NULL, not one well-formed msgpack map, or a
 *               map is open (tw_batched_begin)
 *   TW_ECLOSED  the comm ended, is closing, or was freed
 *   TW_EAGAIN   the queued batch and the comm's write queue would pass the
 *               comm's write high-water mark (tw_context_set_write_hwm_bytes;
 *               one map alone is always taken): send again from the
 *               sender's drain callback (tw_batched_set_drain_cb)
 *   TW_ENOMEM   out of memory */
int tw_batched_send(tw_batched *b, const void *packed, size_t len);

/* tw_batched_begin: a builder positioned to pack exactly ONE map into the
 * next batch, with its payloads out of band: pack the map with
 * tw_builder_packer, and where a payload goes call tw_builder_pack_bytes
 * (the frame is referenced, not copied, unless the comm compresses it),
 * tw_builder_pack_object (a value of a received message, its payloads
 * referenced) or tw_builder_pack_msgpack. Then tw_batched_commit (or
 * tw_batched_abandon). The batch leaves as one message: frame 0 the array
 * of maps, then each map's payload groups, in the order committed, so the
 * peer (Dask's comm.read with deserialization) gets each payload in its
 * map, in order with the plain maps of tw_batched_send.
 * Ownership: the sender owns the builder: never tw_builder_finish or
 * tw_builder_free it. It is valid until commit or abandon, which must
 * come before returning to the loop (a flush while a map is open waits).
 * Thread: the loop thread. Returns NULL when b is NULL or a map is
 * already open.
 * Source: Dask's BatchedSend, whose batches carry serialized payloads
 * (task specs, data) in order with the rest (batched.py _background_send
 * writes the list with comm.write, which splits them out as frames). */
tw_builder *tw_batched_begin(tw_batched *b);

/* tw_batched_commit: queue the map packed since tw_batched_begin. On any
 * error the map and its payload references are dropped (nothing was
 * queued) and the batch is as before begin.
 * Returns 0, or:
 *   TW_EINVAL   no map open, or what was packed is not exactly one
 *               well-formed msgpack map
 *   TW_ECLOSED  the comm ended, is closing, or was freed
 *   TW_EAGAIN   the batch and the comm's write queue would pass the write
 *               high-water mark, as tw_batched_send (one map alone always
 *               goes): pack it again from the drain callback
 *   TW_ETOOBIG  the batch would hold more frames than the comm's limit
 *               (tw_context_set_max_frames): flush, then commit again
 *   TW_ENOMEM   out of memory while packing
 * Thread: the loop thread. */
int tw_batched_commit(tw_batched *b);

/* tw_batched_abandon: drop the map open since tw_batched_begin (and the
 * references its payloads took). No-op when none is open or b is NULL.
 * Loop thread. */
void tw_batched_abandon(tw_batched *b);

/* Called once after tw_batched_send returned TW_EAGAIN, when the batch
 * and the comm's write queue are empty (all handed to the kernel, as for
 * the comm's drain callback), or the comm ended (sends then return
 * TW_ECLOSED). It may send, or free the sender. */
typedef void (*tw_batched_drain_fn)(tw_batched *b, void *arg);

/* tw_batched_set_drain_cb: set (fn NULL: clear) the drain callback. The
 * sender checks for room at each interval while it waits, so this works
 * on comms whose own drain callback belongs to someone else (a tw_server's
 * stream comms). Loop thread. */
void tw_batched_set_drain_cb(tw_batched *b, tw_batched_drain_fn fn, void *arg);

/* tw_batched_flush: write what is queued now, as one array message (with
 * the payload frames of its maps). Loop thread.
 * Returns 0, or:
 *   TW_EINVAL   a map is open (tw_batched_begin)
 *   TW_ECLOSED  the comm ended, is closing, or was freed
 *   TW_ENOMEM   out of memory
 *   (any code) of tw_comm_write's list, with the same cause (the batch is
 *              kept on TW_EAGAIN and retried at the next interval) */
int tw_batched_flush(tw_batched *b);

/* tw_batched_free: flush what is queued, then free. Accepts NULL. Loop
 * thread. */
void tw_batched_free(tw_batched *b);

#pragma GCC visibility pop

#ifdef __cplusplus
}
#endif
#endif
