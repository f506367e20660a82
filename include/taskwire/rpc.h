/* SPDX-License-Identifier: BSD-3-Clause */
/* taskwire: calling ops on remote servers (docs/design.md, RPC client and streams;
 * Dask's distributed.core.rpc and ConnectionPool).
 *
 * A pool keeps comms per address: a call takes an idle comm of its
 * address, or connects a new one (Dask handshake included) while the
 * address has fewer than the limit open, or waits for one. One request at
 * a time per comm; replies come back decoded (large ones decoded on the
 * offload pool). A comm whose call timed out or was canceled is aborted,
 * never reused, so a late reply is never taken for another call's. An
 * address with no comms left (idle ones close after the idle age) and no
 * calls is forgotten, so a pool whose workers come and go stays small.
 * All functions run on the context's loop thread, except
 * tw_rpc_call_sync. */
#ifndef TASKWIRE_RPC_H
#define TASKWIRE_RPC_H

#include <taskwire/comm.h>
#include <taskwire/limits.h>
#include <taskwire/serial.h>

#ifdef __cplusplus
extern "C" {
#endif

#pragma GCC visibility push(default)

typedef struct tw_pool tw_pool;
typedef struct tw_call tw_call;

/* The pool's defaults (TW_DEFAULT_POOL_*): taskwire/limits.h. */

/* The call finished. err is 0 with the reply (the callback owns it: free
 * it with tw_decoded_free; an op the server does not know replies nil,
 * as Dask's do), or:
 *   TW_EREMOTE       the server replied with an uncaught-error map: reply
 *                    holds it, owned the same way (read `exception_text`
 *                    and `traceback_text`)
 * or, with reply NULL:
 *   TW_ETIMEDOUT     no reply within the call's timeout, or the connect
 *                    timeout ran out before the comm was usable (TCP,
 *                    TLS, ws upgrade or the Dask handshake: context.h,
 *                    tw_context_set_connect_timeout_ms)
 *   TW_ECANCELED     tw_call_cancel, or tw_pool_free
 *   TW_ECONNREFUSED  nothing listens at the address
 *   TW_EHANDSHAKE    the peer did not complete the Dask handshake (a bad
 *                    one, or none within the handshake timeout when that
 *                    ended sooner than the connect timeout)
 *   TW_ETLS          the TLS handshake failed
 *   TW_ECLOSED       the comm ended during the call (the peer closed)
 *   TW_EIO           the comm failed during the call
 *   TW_ETRUNCATED    the peer closed in the middle of the reply
 *   TW_EPROTO        a new comm's peer sent a message before any request
 *                    (not a Dask server; the pool does not reconnect to it
 *                    for the waiting calls), or the reply did not decode
 *   TW_ENOTSUP       the reply uses a codec this build lacks
 *   TW_ETOOBIG       the reply is over the context's message limits
 *   TW_EADDR         a malformed address, or a host that does not resolve
 *   TW_ESCHEME       an unknown scheme
 *   TW_EINVAL        a tls:// or wss:// address on a context with no TLS
 *                    configuration
 *   TW_ENOMEM        out of memory
 *   (any code)       the err given to tw_pool_fail_address
 * tw_call_error(call) says why in words. Runs once, on the loop thread,
 * never from inside tw_pool_call. It may call tw_pool_call again (not
 * tw_pool_free: to stop after the last reply, break the loop and free the
 * pool after it). */
typedef void (*tw_reply_cb)(tw_call *call, int err, tw_decoded *reply, void *arg);

/* tw_pool_new: a pool on ctx; it holds two timerfds (its call deadlines
 * and idle sweep) until tw_pool_free. Loop thread.
 * Returns 0 and sets *out, or:
 *   TW_EINVAL  ctx or out is NULL
 *   TW_ENOMEM  out of memory
 *   TW_EIO     the system gave no timerfd (out of descriptors) */
int tw_pool_new(tw_context *ctx, tw_pool **out);

/* tw_pool_set_limit: comms open (or connecting) per address, at least 1
 * (default 512). A comm whose last reply is still being relayed (its
 * payload's frames forwarded from its socket: include/taskwire/relay.h)
 * counts and takes no call until that relay is over; a call meanwhile
 * goes on another comm, or waits for one. tw_pool_set_idle: idle comms kept per address (default
 * 16) and how long one may stay idle, ms (default 60,000). Loop thread.
 * Return 0, or:
 *   TW_EINVAL  p NULL, or comms_per_address 0 (tw_pool_set_limit) */
int tw_pool_set_limit(tw_pool *p, size_t comms_per_address);
int tw_pool_set_idle(tw_pool *p, size_t max_idle_per_address, uint32_t idle_timeout_ms);

/* tw_pool_call: send `request` (a message whose frame 0 is a map with
 * `op`, e.g. from tw_builder) to the server at uri, and call cb with the
 * reply within timeout_ms milliseconds (0: no timeout). A call waits for
 * an idle comm or a new one; each connect (with its Dask handshake) that
 * fails fails the oldest waiting call with its error, as each caller's
 * own connect does in Dask (distributed/core.py ConnectionPool.connect),
 * so with no timeout a call still ends by the connect timeout
 * (tw_context_set_connect_timeout_ms). The pool takes the
 * request on success; on error the caller keeps it. *out (may be NULL) is
 * a handle for tw_call_cancel, valid until cb runs. Loop thread.
 * Returns 0 (cb will run exactly once), or (cb never runs):
 *   TW_EINVAL   p, uri, request or cb NULL, a request with no frames, or
 *               a URI of 256 bytes or more
 *   TW_ECLOSED  called from a callback that tw_pool_free runs
 *   TW_ENOMEM   out of memory */
int tw_pool_call(tw_pool *p, const char *uri, tw_msg *request, uint32_t timeout_ms, tw_reply_cb cb,
		 void *arg, tw_call **out);

/* Flags of tw_pool_call_flags, or-ed. TW_CALL_IDEMPOTENT: the request may be
 * sent again (it reads, or its effect does not add up), so a try that
 * fails for the connection's sake is retried (tw_pool_set_retry).
 * TW_CALL_ACK_OK: when the reply is a map whose "status" is the str
 * "OK", the pool writes the message "OK" (one frame, the msgpack str) on
 * the call's comm before the reply callback runs and before the comm
 * carries another call; other replies get no acknowledgement. A Dask
 * worker's get_data waits for it before it serves that comm again
 * (distributed/worker.py Worker.get_data: `response = await comm.read();
 * assert response == "OK"`; utils_comm.py get_data_from_worker writes
 * it). If the acknowledgement cannot be queued, the comm is dropped (never
 * reused) and the call still gets its reply. */
enum tw_call_flag { TW_CALL_IDEMPOTENT = 1 << 0, TW_CALL_ACK_OK = 1 << 1 };

/* tw_pool_call_flags: tw_pool_call with flags: 0, or tw_call_flag values
 * or-ed (see above for each).
 * An idempotent call that fails with TW_ECONNREFUSED, TW_ECLOSED,
 * TW_EIO, TW_ETIMEDOUT, TW_EHANDSHAKE or TW_ETRUNCATED is tried again,
 * up to the pool's retry count, after a backoff of delay_min * 2^i ms
 * (i: retries so far) capped at delay_max, plus up to 10% jitter; each
 * try has timeout_ms of its own. Only the last failure reaches cb, its
 * tw_call_error ending "(after N retries)". Never retried: remote errors,
 * TW_ECANCELED, TLS refusals, bad replies, tw_pool_fail_address. The pool
 * keeps a reference to request until cb runs. Dask: retry_operation
 * (distributed/utils_comm.py), which retries OSError the same way.
 * Loop thread.
 * Returns 0 (cb will run exactly once), or (cb never runs):
 *   TW_EINVAL   as tw_pool_call, or an unknown flag
 *   TW_ECLOSED  called from a callback that tw_pool_free runs
 *   TW_ENOMEM   out of memory */
int tw_pool_call_flags(tw_pool *p, const char *uri, tw_msg *request, uint32_t timeout_ms,
		       unsigned flags, tw_reply_cb cb, void *arg, tw_call **out);

/* tw_pool_set_retry: retries of idempotent calls: count (default 0, as
 * Dask's distributed.comm.retry.count: none), delay_min_ms (default
 * 1,000) and delay_max_ms (default 20,000), from the next failure on.
 * Loop thread.
 * Returns 0, or:
 *   TW_EINVAL  p NULL, delay_min_ms 0, or delay_max_ms below it */
int tw_pool_set_retry(tw_pool *p, unsigned count, uint32_t delay_min_ms, uint32_t delay_max_ms);

/* tw_call_cancel: cb runs now with TW_ECANCELED; the call's comm, if its
 * request was sent, is aborted. */
void tw_call_cancel(tw_call *call);

/* tw_call_error: why the call failed, in words for logs: the address and
 * the cause, e.g. "connect to 10.0.0.5:8786: Connection refused", "no
 * reply from tcp://10.0.0.5:8786 within 500 ms: the request was sent and
 * no reply came", "tcp://10.0.0.5:8786's handler failed: <the remote
 * exception_text>" (TW_EREMOTE). At most 255 bytes, truncated; "" when
 * err is 0. Valid only inside the call's tw_reply_cb (the call is freed
 * when it returns); loop thread. */
const char *tw_call_error(const tw_call *call);

/* tw_pool_open_comms: comms open or connecting to uri (for tests and
 * monitoring). */
size_t tw_pool_open_comms(const tw_pool *p, const char *uri);

/* tw_pool_fail_address: what a scheduler does when it removes a worker
 * (a heartbeat overdue, its stream ended): every call to uri, in flight or
 * waiting, fails now with err (callbacks run inside this call), each with
 * tw_call_error "<uri>: <why>" (why NULL: tw_strerror(err)); every comm to
 * uri, idle, busy, connecting or in its handshake, is closed at once.
 * Calls that the callbacks make to uri get new comms. uri: as given to
 * tw_pool_call; an address the pool does not know is no error. err: a
 * negative TW_E* code (TW_ETIMEDOUT, TW_ECLOSED ...). Loop thread, not
 * from inside tw_pool_free. Dask: the scheduler's remove_worker, after
 * which calls to the worker fail (distributed/scheduler.py).
 * Returns 0, or:
 *   TW_EINVAL  p or uri NULL, err not negative, or the pool is being freed */
int tw_pool_fail_address(tw_pool *p, const char *uri, int err, const char *why);

/* tw_pool_free: cancel every call (callbacks run with TW_ECANCELED),
 * abort every comm, free. Comms still connecting, in their TLS handshake,
 * ws upgrade or Dask handshake are aborted too: when it returns, none
 * reads, writes or calls back any more. Their sockets (and TLS states)
 * are released at once while the loop's pass has time for it (always the
 * pass's first; every one when called outside the loop's callbacks), the
 * rest on the loop's next passes, a share on each, so that a mass close
 * is not one long pass (src/core/reap.h: 500 tls comms ended in one callback
 * made a pass of 15-26 ms), or by tw_context_free: a peer may see its
 * connection close after tw_pool_free returned (50 wss comms in their
 * Dask handshake, freed from a timer callback: 10-39 still open when it
 * returned, all closed within 100 ms of the loop running). Free pools
 * before their context; not from inside one of the pool's reply
 * callbacks. Accepts NULL. */
void tw_pool_free(tw_pool *p);

/* tw_rpc_call_sync: a blocking call for simple programs: runs the
 * context's loop until the reply comes (ctx must be on a base that is not
 * being dispatched, on the calling thread), or, for a context with its own
 * loop thread, waits for it. *reply is the reply when the result is 0 or
 * TW_EREMOTE, freed by the caller (tw_decoded_free), and NULL otherwise.
 * On an error, tw_context_last_error(ctx) holds the call's tw_call_error
 * text (on a context with its own loop thread, until that thread records
 * another failure). The request is taken in every case: it is freed on
 * every error, TW_EINVAL included, so the caller never frees it.
 * Returns 0, or:
 *   TW_EINVAL  ctx, uri, request or reply NULL, a request with no frames,
 *              or a URI of 256 bytes or more
 *   (any code) of tw_reply_cb's list above, with the same cause */
int tw_rpc_call_sync(tw_context *ctx, const char *uri, tw_msg *request, uint32_t timeout_ms,
		     tw_decoded **reply);

#pragma GCC visibility pop

#ifdef __cplusplus
}
#endif
#endif
