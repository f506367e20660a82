/* SPDX-License-Identifier: BSD-3-Clause */
/* taskwire: servers that answer ops (docs/design.md, Handshake and server; Dask's
 * distributed.core.Server.handle_comm).
 *
 * A request is a map with `op` (str) and arguments; `reply` (default
 * true) false means no reply; `close` true closes the comm after replying
 * (both read as Python's truth, as Dask does: 0, nil, "" and empty
 * containers are false).
 * The server runs the op's handler, which replies at once or later
 * (deferred) with exactly one call of tw_request_reply or
 * tw_request_reply_error. Requests of one comm are served one at a time,
 * in order (the next is read after the reply). Built in: `identity`
 * -> {"type": "taskwire", "id": ...}, `echo(data)` -> data, `close` ->
 * "OK" then close; an unknown op replies nil; a message that is not a map,
 * has no str `op`, or cannot be decoded drops the comm. All functions run
 * on the context's loop thread; handlers run there too.
 *
 * Several loop threads (tw_context_set_loop_threads, called before
 * tw_server_new): the server's listeners hand each accepted comm to a
 * loop in turn, and every handler (op and stream) runs on the thread of
 * its request's comm (tw_comm_context(tw_request_comm(req)) is that
 * loop), so handlers of different comms run at the same time: whatever
 * state they share must be thread-safe (a lock, atomics, or a
 * tw_context_call to the loop that owns it). A request and its comm are
 * used on that thread only: reply there (a deferred reply too, e.g. from
 * a timer or pool made on tw_comm_context of the comm). Add ops and
 * listen before requests come; tw_server_new, tw_server_listen and
 * tw_server_free run on loop 0's thread. Handlers must not block waiting
 * for loop 0 (tw_server_free waits for the other loops). */
#ifndef TASKWIRE_SERVER_H
#define TASKWIRE_SERVER_H

#include <taskwire/comm.h>
#include <taskwire/serial.h>

#ifdef __cplusplus
extern "C" {
#endif

#pragma GCC visibility push(default)

typedef struct tw_server tw_server;
typedef struct tw_request tw_request;

/* An op handler; `req` stays valid until it is replied to. The comm it
 * came on (tw_request_comm) is lent until then; keep it with tw_comm_hold
 * or tw_request_keep_stream. */
typedef void (*tw_op_fn)(tw_request *req, void *arg);

/* tw_server_new: a server on ctx with the built-in ops. Loop thread.
 * Returns 0 and sets *out, or:
 *   TW_EINVAL  ctx or out is NULL
 *   TW_ENOMEM  out of memory */
int tw_server_new(tw_context *ctx, tw_server **out);

/* tw_server_add_op: register (or replace: identity and echo too) the
 * handler of op `name` (copied). `close` and `connection_stream` are the
 * server's own and are never dispatched to a handler. Loop thread.
 * Returns 0, or:
 *   TW_EINVAL  s, name or fn is NULL
 *   TW_ENOMEM  out of memory */
int tw_server_add_op(tw_server *s, const char *name, tw_op_fn fn, void *arg);

/* tw_server_listen: listen on uri as well (any transport); the comms it
 * accepts do the handshake, then serve requests. Loop thread.
 * Returns 0, or:
 *   TW_EINVAL  s NULL, or the context got its loop threads after
 *              tw_server_new
 *   (any code) of tw_listener_new's list, with the same cause */
int tw_server_listen(tw_server *s, const char *uri);

/* tw_server_address: the bound URI of the i-th listen, into buf of len
 * bytes.
 * Returns 0, or:
 *   TW_ERANGE  buf NULL or too small, s NULL, or no i-th listener */
int tw_server_address(const tw_server *s, size_t i, char *buf, size_t len);

/* tw_server_free: stop listening and abort every comm, those still in
 * their handshake too. Requests still unanswered stay valid until their
 * handlers reply (the reply is then dropped). May be called from any
 * handler: from a stream handler, the rest of that batch is not
 * dispatched and the server goes when the batch ends. With several loop
 * threads, called on loop 0's thread it frees each loop's comms on that
 * loop (after the accepts already handed to it) and waits for them; called
 * from a handler on another loop it is posted to loop 0 and the server
 * goes from there, soon after (requests keep being served until then).
 * Accepts NULL. */
void tw_server_free(tw_server *s);

/* The request: its op, its argument `key` (NULL when absent), the whole
 * decoded message (payloads through tw_decoded_payload), and whether the
 * caller wants a reply (1 or 0, not a taskwire error code). Valid until
 * the reply. */
const char *tw_request_op(const tw_request *r);
const msgpack_object *tw_request_arg(const tw_request *r, const char *key);
const tw_decoded *tw_request_decoded(const tw_request *r);
int tw_request_wants_reply(const tw_request *r);

/* tw_request_comm: the comm the request came on, lent until the reply
 * (the server frees its reference when the comm ends: keep it with
 * tw_comm_hold or tw_request_keep_stream). NULL when the comm went away
 * (a deferred reply's peer closed) or r is NULL. Loop thread.
 * Source: Dask's handlers take `comm` as their first argument
 * (Server.handle_comm passes it to every handler that names it). */
tw_comm *tw_request_comm(const tw_request *r);

/* tw_request_peer_address: the address of the peer that sent r, as a URI
 * ("tcp://127.0.0.1:40123"), NUL-terminated into buf of len bytes.
 * Loop thread.
 * Returns 0, or:
 *   TW_ERANGE   buf too small (or NULL)
 *   TW_ECLOSED  the comm went away
 * Source: Dask's comm.peer_address (Scheduler.add_client logs it). */
int tw_request_peer_address(const tw_request *r, char *buf, size_t len);

/* tw_request_keep_stream: take the request's comm over, as Dask's
 * scheduler does at register-worker and register-client: once the reply
 * has been written, the comm serves no more requests and is one of the
 * server's streams (as after connection_stream): each message, a map or
 * an array of maps, goes to the server's stream ops
 * (tw_server_add_stream_op) with this comm, until close-stream or its
 * end. Call before tw_request_reply (or tw_request_reply_error).
 * The rule for the reply of a kept request: what the handler packed into
 * tw_request_reply_builder is written even when the request said
 * reply:false (Dask's register-worker and register-client do, and their
 * peers read exactly that one message: {"status": "OK", ...}, or
 * [{"op": "stream-start"}]); when nothing was packed, nil is written if
 * the request wanted a reply and nothing otherwise. A `close` flag of a
 * kept request is ignored. To refuse, reply (an error, say), then
 * tw_comm_close and tw_comm_release the comm.
 * out: receives the comm with a reference HELD for the caller: it stays
 * valid after the comm ended, until the caller's tw_comm_release; the
 * server still owns the comm (callbacks, free at its end). Watch its end
 * with tw_comm_watch_end (Dask's handle_worker then removes the worker).
 * Loop thread, inside the op handler or before a deferred reply.
 * Returns 0, or:
 *   TW_EINVAL   r or out NULL, or the comm is already kept
 *   TW_ECLOSED  the comm went away or is closing (nothing is held)
 * Source: Dask's Scheduler.add_worker (comm.write(msg), then
 * handle_worker -> handle_stream on the same comm) and
 * Scheduler.add_client (bcomm = BatchedSend on the comm, then
 * [{"op": "stream-start"}], then handle_stream). */
int tw_request_keep_stream(tw_request *r, tw_comm **out);

/* tw_request_reply_builder: the builder for the reply, made on first use
 * with the comm's negotiated compression; pack exactly one value (with
 * tw_builder_pack_object to return a part of the request with its
 * payloads). The request owns it: never tw_builder_free or
 * tw_builder_finish it; tw_request_reply sends it. NULL when it cannot
 * be made. */
tw_builder *tw_request_reply_builder(tw_request *r);

/* tw_request_reply: send the packed value (nil when nothing was packed),
 * unless the caller asked for no reply (a kept request: see
 * tw_request_keep_stream), then read the next request (or
 * close the comm when the request said `close`). Frees r in every case.
 * A reply the comm's queue cannot take yet (its write high-water mark or
 * the context's write budget: TW_EAGAIN) waits for the comm's drain, the
 * comm reading nothing meanwhile, and 0 is returned; refused then for
 * another reason (TW_EINVAL: a relay frame the comm cannot write,
 * include/taskwire/relay.h; TW_ENOMEM), it is replaced by the
 * uncaught-error reply "reply not sent: ..." as for TW_ETOOBIG below, and
 * when even that cannot be queued the comm ends with that error.
 * Loop thread.
 * Returns 0, or:
 *   TW_ECLOSED  the comm went away: the reply is dropped
 *   TW_ENOMEM   out of memory: the reply is dropped and the comm closed
 *   TW_ETOOBIG  the reply has more frames than the comm's limit
 *               (tw_context_set_max_frames): the caller got an
 *               uncaught-error reply "reply not sent: ..." instead, at
 *               once, and the comm serves on */
int tw_request_reply(tw_request *r);

/* tw_request_reply_error: reply {"status": "uncaught-error", "exception":
 * exception_text, "traceback": nil, "exception_text": ...,
 * "traceback_text": ...} (texts may be NULL: ""), which Python's rpc raises
 * as an Exception; whatever was already packed is discarded. Frees r.
 * Loop thread.
 * Returns 0, or:
 *   (any code) of tw_request_reply's list, with the same cause */
int tw_request_reply_error(tw_request *r, const char *exception_text, const char *traceback_text);

#pragma GCC visibility pop

#ifdef __cplusplus
}
#endif
#endif
