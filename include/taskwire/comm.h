/* SPDX-License-Identifier: BSD-3-Clause */
/* taskwire: comms (connections that carry messages) and listeners.
 *
 * Addresses are URIs: `tcp://host:port`, `tcp://[::1]:port`; port 0 asks
 * for an ephemeral port (read it back with tw_listener_address). The same
 * calls take `tls://`, `ws://` and `wss://` URIs (tls and wss need the
 * context's TLS configuration: taskwire/tls.h).
 *
 * Threads: every function here must be called on the loop thread of the
 * comm's context, and every callback runs on that thread.
 * Lifetime: the application owns each comm it is handed and frees it with
 * tw_comm_free (from inside a callback of that comm too: the free is then
 * deferred until the callback returns). After the close callback has run,
 * no other callback of the comm runs. Others may keep a comm they were
 * lent (a server's comm in an op or stream handler) with tw_comm_hold: the
 * memory then stays until the last tw_comm_release, though the comm may
 * have ended (tw_comm_watch_end says when). Every comm goes with its
 * context (tw_context_free), held or not. */
#ifndef TASKWIRE_COMM_H
#define TASKWIRE_COMM_H

#include <stddef.h>
#include <stdint.h>

#include <taskwire/context.h>
#include <taskwire/msg.h>
#include <taskwire/stats.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The library is built with hidden visibility; the API is exported. */
#pragma GCC visibility push(default)

typedef struct tw_comm tw_comm;
typedef struct tw_listener tw_listener;

/* A received message, borrowed for the duration of the call: keep it with
 * tw_msg_hold. */
typedef void (*tw_recv_cb)(tw_comm *comm, tw_msg *msg, void *arg);
/* The comm ended: err is 0 for an orderly end (the peer closed between
 * messages with nothing of ours queued, or tw_comm_close delivered
 * everything: see there), else the reason (TW_ETRUNCATED, TW_ETOOBIG,
 * TW_EIO, TW_ETIMEDOUT ...; details in tw_comm_last_error). err is never
 * 0 while bytes we queued were not delivered: a comm that ends with any
 * queued (the peer closed or reset, a write failed, the close linger ran
 * out) ends with an error, TW_ECLOSED when the peer's orderly end is the
 * only reason, and tw_comm_last_error ends with "N bytes not delivered".
 * Runs exactly once per comm that had callbacks set, unless the
 * application freed the comm first. By then the socket is closed, queued
 * writes and any message cut short are released; the comm itself (its
 * stats, tw_comm_last_error) lives until tw_comm_free. */
typedef void (*tw_close_cb)(tw_comm *comm, int err, void *arg);
/* The write queue became empty: every queued message was handed to the
 * kernel. */
typedef void (*tw_drain_cb)(tw_comm *comm, void *arg);
/* tw_comm_connect finished: on success err is 0 and comm is the new comm,
 * owned by the application; on failure comm is NULL,
 * tw_context_last_error gives the reason, and err is one of:
 *   TW_ECONNREFUSED  nothing listens at the address
 *   TW_ETIMEDOUT     the connect timeout ran out (resolving, connect, TLS
 *                    handshake or WebSocket upgrade)
 *   TW_EADDR         the host name does not resolve
 *   TW_EIO           the system refused (socket, connect, a reset)
 *   TW_ETLS          the TLS handshake or a certificate check failed
 *   TW_EPROTO        the WebSocket upgrade was refused
 *   TW_EINVAL        tls:// or wss:// with no TLS configuration
 * Under TLS 1.3 a server refuses a client certificate after the client
 * finished its handshake: the client then learns it from TW_ETLS on its
 * first read. */
typedef void (*tw_connect_cb)(tw_comm *comm, int err, void *arg);
/* A listener accepted `comm`, owned by the application from now on.
 * With several loop threads (tw_context_set_loop_threads) it runs on the
 * thread of the loop the comm was handed to (tw_comm_context(comm)), and
 * `l` is that loop's stand-in for the listener: use it for
 * tw_listener_address only, and free the listener you got from tw_listener_new,
 * on loop 0. */
typedef void (*tw_accept_cb)(tw_listener *l, tw_comm *comm, void *arg);

/* tw_listener_new: listen on `uri` (a numeric host, or a name resolved
 * synchronously). accept_cb runs for each new comm. A ws:// or wss://
 * URI may name no path but `/` (the only one served, as by Dask's ws
 * listener; an upgrade request for another gets 404). Loop thread.
 * Returns 0 and sets *out, or:
 *   TW_EINVAL      ctx, accept_cb or out NULL; tls:// or wss:// on a context
 *                  with no TLS configuration or one without a certificate
 *   TW_EADDR       a malformed URI, a host that does not resolve, a ws path
 *                  other than `/`
 *   TW_ESCHEME     an unknown scheme
 *   TW_EADDRINUSE  the address is taken
 *   TW_EIO         the system refused (socket, bind, listen)
 *   TW_ENOMEM      out of memory */
int tw_listener_new(tw_context *ctx, const char *uri, tw_accept_cb accept_cb, void *arg,
		    tw_listener **out);
/* With several loop threads, a listener accepts on loop 0 and hands each
 * socket to the next loop in turn (round robin, loop 0 included), where
 * its comm is made (its TLS handshake or ws upgrade too) and accept_cb
 * (or the error callback) runs. tw_listener_free stops accepting at once;
 * sockets already handed to another loop still get their callback there,
 * before anything that loop runs from a tw_context_call made after the
 * free: post one to each loop (tw_context_loop) to know that the last
 * callback has run before freeing what they use. */

/* tw_listener_address: the bound address as a URI, e.g.
 * "tcp://127.0.0.1:40123", written NUL-terminated into buf of `len` bytes.
 * Returns 0, or:
 *   TW_ERANGE  buf is NULL or too small */
int tw_listener_address(const tw_listener *l, char *buf, size_t len);

/* tw_accept_error_cb: a connection that listener l accepted failed before
 * it became a comm, so accept_cb never saw it: its TLS handshake (a
 * client refused for a missing or unknown certificate, with OpenSSL's
 * reason and the certificate check's), its ws upgrade, or their timeouts.
 * err is one of:
 *   TW_ETLS       the TLS handshake or the client's certificate failed
 *   TW_ETIMEDOUT  the TLS handshake or ws upgrade took too long
 *   TW_EPROTO     a bad ws upgrade request
 *   TW_ECLOSED    the client closed first
 *   TW_EIO        the socket failed (a reset)
 *   TW_ENOMEM     out of memory
 * peer: the client's address as a URI ("tls://127.0.0.1:51234", kept from
 * accept, so it is there even for a client that reset at once); why: the
 * reason in words (also in tw_context_last_error). Both strings are valid
 * during the call only. Runs on the loop thread; the listener may be
 * freed inside it. */
typedef void (*tw_accept_error_cb)(tw_listener *l, int err, const char *peer, const char *why,
				   void *arg);

/* tw_listener_set_error_cb: run cb(l, err, peer, why, arg) for each
 * accepted connection that fails before it becomes a comm (NULL: none, the
 * default), so an operator can see why clients (workers) fail to join.
 * Loop thread.
 * Returns 0, or:
 *   TW_EINVAL  l is NULL */
int tw_listener_set_error_cb(tw_listener *l, tw_accept_error_cb cb, void *arg);

/* tw_listener_free: stop listening and free. Comms already accepted live
 * on. Accepts NULL. */
void tw_listener_free(tw_listener *l);

/* tw_comm_connect: connect to `uri`; cb runs once with the result, on the loop
 * thread, never before tw_comm_connect returns. A host name is resolved
 * without blocking the loop (tw_context_set_dns_base), and each address it
 * resolves to is tried in turn; one that does not resolve fails the
 * connect with TW_EADDR. The connect, resolving included, fails with
 * TW_ETIMEDOUT after the context's connect timeout. ws:// and wss://
 * connectors request path `/`, and refuse a URI naming another. Loop
 * thread.
 * Returns 0 (cb will run), or (cb never runs):
 *   TW_EINVAL   ctx or cb NULL; tls:// or wss:// on a context with no TLS
 *               configuration
 *   TW_EADDR    a malformed URI, or a ws path other than `/`
 *   TW_ESCHEME  an unknown scheme
 *   TW_ENOMEM   out of memory */
int tw_comm_connect(tw_context *ctx, const char *uri, tw_connect_cb cb, void *arg);

/* tw_comm_set_callbacks: set the receive, close and drain callbacks (drain
 * may be NULL) and start reading. Messages that arrived before are kept by
 * the kernel until then. Call once per comm.
 * Returns 0, or:
 *   TW_EINVAL   comm, recv_cb or close_cb NULL, or callbacks already set
 *   TW_ECLOSED  the comm has ended
 *   TW_EIO      the loop refused the comm's events */
int tw_comm_set_callbacks(tw_comm *comm, tw_recv_cb recv_cb, tw_close_cb close_cb,
			  tw_drain_cb drain_cb, void *arg);

/* tw_comm_write: queue `msg` (N >= 1 frames) for sending. On success the
 * comm takes the caller's reference to msg (hold one first to keep using
 * it); on error the caller still owns it. Frames are written straight from
 * their blocks with scatter-gather writes, never copied.
 * Returns 0, or:
 *   TW_EAGAIN   the queue already holds the high-water mark of bytes, or
 *               the context's write budget is spent and this comm still
 *               has bytes queued (tw_context_set_write_budget_bytes):
 *               wait for the drain callback (never returned on a comm
 *               with nothing queued)
 *   TW_EINVAL   comm or msg NULL, or msg has no frames
 *   TW_ETOOBIG  more frames than the limit (tw_context_set_max_frames)
 *   TW_ECLOSED  the comm is closed or closing
 *   TW_ENOMEM   out of memory */
int tw_comm_write(tw_comm *comm, tw_msg *msg);

/* tw_comm_pause / tw_comm_resume: stop and restart delivering messages;
 * while paused nothing more is read, so the kernel's buffers fill and the
 * peer's writes block (read-side backpressure). Messages already received
 * but not delivered stay queued. Idempotent.
 * Nothing watches the socket while paused: the peer's end (EOF, a reset,
 * a ws close frame) is seen, and the close callback runs, only after
 * tw_comm_resume, and a ws close frame is answered then (user19b,
 * session 19: a paused comm whose peer reset never ended). To bound a
 * pause, set a receive deadline (tw_comm_set_recv_deadline_ms): it ends
 * the comm with TW_ETIMEDOUT, whatever became of the peer.
 * Thread: the loop thread of the comm's context. */
void tw_comm_pause(tw_comm *comm);
void tw_comm_resume(tw_comm *comm);

/* tw_comm_queued_bytes: bytes queued and not yet written to the kernel. */
uint64_t tw_comm_queued_bytes(const tw_comm *comm);

/* tw_comm_close: orderly close, the same contract on tcp, tls, ws and
 * wss. Messages stop being delivered (input is read and dropped); later
 * writes return TW_ECLOSED; everything queued is written; then our end
 * goes out (tcp: FIN; tls: close_notify, then FIN; ws and wss: a close
 * frame 1000, RFC 6455 section 5.5.1) and the close waits for the peer's
 * (EOF, or its close frame). The close callback then runs once:
 * - err 0: delivered. Every byte queued was written, and the peer's TCP
 *   acknowledged all of it (the kernel's send queue is empty, SIOCOUTQ),
 *   or over ws/wss the peer answered our close frame, which it reads only
 *   after every frame before it. Delivered means in the peer's kernel (or
 *   read by a ws peer), not processed by its application: only a reply
 *   says that. A peer that acknowledged everything but sends no end is
 *   waited for at most min(linger, 2 s); the close then ends with err 0.
 * - TW_ETIMEDOUT: no byte moved (none written, none newly acknowledged)
 *   for the close linger (tw_context_set_close_linger_ms, default 5 s):
 *   the peer stopped reading. The connection is reset (SO_LINGER 0) and
 *   tw_comm_last_error says "close gave up after T ms with no progress: N
 *   bytes not delivered (Q queued, K unacknowledged by the peer's TCP)".
 *   A slow reader that keeps taking bytes is waited for by the linger,
 *   but not past the TCP timeout (tw_context_set_tcp_timeout_ms, 30 s):
 *   while its receive window stays too small for our next segment,
 *   Linux counts the time as bytes left unsent (TCP_USER_TIMEOUT,
 *   tcp(7)) and resets the connection, closing or not; the comm ends
 *   with TW_ETIMEDOUT, "write failed: Connection timed out; N bytes not
 *   delivered". A reader taking 30 KB/s through a 16 KiB receive buffer
 *   was reset at 31 s; one taking 300 KB/s was still moving after 45 s
 *   (breaker17 b17-13). Dask's peers do the same: distributed.comm.tcp
 *   sets TCP_USER_TIMEOUT to distributed.comm.timeouts.tcp, 30 s
 *   (distributed/comm/tcp.py, set_tcp_timeout). To wait for slower
 *   readers, raise the TCP timeout (0 leaves the kernel's default: see
 *   tw_context_set_tcp_timeout_ms for what that bounds).
 * - another error (the peer reset, a write failed, the peer's close frame
 *   came first with data still queued: TW_ECLOSED or the code its close
 *   names): tw_comm_last_error ends with "N bytes not delivered".
 * N counts bytes as framed on the wire (preludes, WebSocket headers; over
 * tls the kernel's part counts TLS records), our end marker included.
 * Idempotent. tw_comm_abort: drop the queue and close at once; the close
 * callback runs with TW_ECANCELED. */
void tw_comm_close(tw_comm *comm);
void tw_comm_abort(tw_comm *comm);

/* tw_comm_set_recv_deadline_ms: liveness for a peer that owes us
 * messages (a worker's heartbeats, a reply due): from now on the next
 * complete message must arrive within ms milliseconds of this call or of
 * the message before it; each message delivered starts the time again.
 * Past it the comm ends with TW_ETIMEDOUT (the close callback runs, end
 * watches see it) and tw_comm_last_error says "no message from <peer
 * address> within <ms> ms (the receive deadline)". This catches a peer
 * whose kernel still acknowledges (stopped with SIGSTOP, a hung process),
 * which the TCP timeout never does. ms 0 turns it off (the default).
 * Time the comm spends paused counts (the peer's messages wait in our
 * socket then): pause only when no message is due. Loop thread. Dask's
 * equivalent is the scheduler's worker-ttl check of heartbeats
 * (distributed/scheduler.py, Scheduler.check_worker_ttl).
 * Returns 0, or:
 *   TW_EINVAL   comm is NULL
 *   TW_ECLOSED  the comm has ended
 *   TW_ENOMEM   out of memory (its timer) */
int tw_comm_set_recv_deadline_ms(tw_comm *comm, uint32_t ms);

/* tw_comm_free: abort if still open (no close callback then; watchers of
 * tw_comm_watch_end see TW_ECANCELED), stop every callback the owner set,
 * and drop the owner's reference: the memory goes with the last reference
 * (tw_comm_release). Queued messages are released at once. Call it once,
 * as the comm's owner (whoever was handed it by tw_comm_connect, tw_listener_new's
 * accept callback, or a server that serves it). Accepts NULL. */
void tw_comm_free(tw_comm *comm);

/* tw_comm_hold: take one more reference to comm, so that the pointer stays
 * valid after its owner frees it (a server frees each served comm when it
 * ends). tw_comm_release: drop one; the memory goes with the last.
 * A comm that ended but is still held answers: tw_comm_write returns
 * TW_ECLOSED; tw_comm_peer_address and tw_comm_local_address give the
 * addresses it had while up; tw_comm_last_error, tw_comm_stats and
 * tw_comm_queued_bytes (0) answer; tw_comm_pause, tw_comm_resume,
 * tw_comm_close and tw_comm_abort do nothing. No callback set by its owner
 * runs any more.
 * Ownership: each hold is one reference, released by exactly one
 * tw_comm_release (tw_comm_release(NULL) does nothing). Context
 * teardown (tw_context_free) frees the comm whatever its references.
 * Thread: the loop thread of the comm's context.
 * Source: the rule a Dask scheduler lives by: it keeps each worker's comm
 * (Scheduler.stream_comms) after the handler that got it returned. */
void tw_comm_hold(tw_comm *comm);
void tw_comm_release(tw_comm *comm);

/* The end of a comm: err 0 when it ended in order (the peer closed between
 * messages, or tw_comm_close finished), else the reason (TW_ECLOSED,
 * TW_ETRUNCATED, TW_ETIMEDOUT, TW_ECANCELED for tw_comm_abort or
 * tw_comm_free ...; the text in tw_comm_last_error). comm is valid during
 * the call; keep it longer with tw_comm_hold. */
typedef void (*tw_comm_ended_fn)(tw_comm *comm, int err, void *arg);
typedef struct tw_comm_watch tw_comm_watch;

/* tw_comm_watch_end: run fn(comm, err, arg) once when comm ends, after
 * its owner's close callback (and after the messages it still delivers:
 * a server's stream handlers have seen the last map), on the loop thread,
 * never inside this call; when comm has already ended, on the next loop
 * pass. The watch holds a reference to comm until fn has returned (or
 * tw_comm_unwatch), so comm is valid in fn even after its owner freed it.
 * out (may be NULL) receives a handle for tw_comm_unwatch, valid until fn
 * has started running. Any number of watches per comm; they run in the
 * order they were set. Watches still set when the context is freed never
 * run.
 * Thread: the loop thread of the comm's context.
 * Returns 0, or:
 *   TW_EINVAL  comm or fn is NULL
 *   TW_ENOMEM  out of memory (fn never runs)
 * Source: Dask's Scheduler.handle_worker / add_client, whose `finally`
 * removes the worker or client when its stream comm ends. */
int tw_comm_watch_end(tw_comm *comm, tw_comm_ended_fn fn, void *arg, tw_comm_watch **out);

/* tw_comm_unwatch: cancel a watch whose fn has not started, and drop the
 * reference it held (which may free the comm when its owner already let
 * it go). Called from inside the watch's own fn it does nothing (the
 * watch is freed when fn returns). Accepts NULL. Loop thread. */
void tw_comm_unwatch(tw_comm_watch *w);

/* tw_comm_stats: this comm's message and byte counters into *out, a
 * tw_stats of `size` bytes (sizeof(*out); other fields zero: see
 * taskwire/stats.h for why the size). Loop thread. */
void tw_comm_stats(const tw_comm *comm, tw_stats *out, size_t size);

/* tw_comm_last_error: text of the last error on this comm (OS error, the
 * offending value), "" if none: at most 511 bytes (a longer text is cut
 * there), NUL-terminated, owned by the comm. Valid until the comm is
 * freed. Loop thread. */
const char *tw_comm_last_error(const tw_comm *comm);

/* tw_comm_context: the context of the loop the comm lives on (with
 * several loop threads, tw_context_loop of its main context; else the
 * context it was made on). Make what must run beside the comm (a pool, a
 * batched sender's comm's timers, tw_context_call) on it. Valid as long as
 * the comm. Any thread. */
tw_context *tw_comm_context(const tw_comm *comm);

/* tw_comm_peer_address / tw_comm_local_address: addresses as URIs, written
 * into buf of len bytes.
 * Returns 0, or:
 *   TW_ERANGE  buf is NULL or too small */
int tw_comm_peer_address(const tw_comm *comm, char *buf, size_t len);
int tw_comm_local_address(const tw_comm *comm, char *buf, size_t len);

#pragma GCC visibility pop

#ifdef __cplusplus
}
#endif
#endif
