/* SPDX-License-Identifier: BSD-3-Clause */
/* Releases a loop leaves to its later passes (issue 17, the mass close).
 *
 * A comm's end releases its socket and its I/O layer: for tls, SSL_free
 * (15-30 us: the records' buffers, the session, the peer's certificate)
 * and close(2) (4-10 us; on loopback the peer's TCP runs in the closing
 * thread) were 60-85% of the loop's time per comm when 500 comms ended
 * at once (bench/handshake-storm --close, an LD_PRELOAD timer around
 * each call): one pass of 15-26 ms of loop CPU, in which no other comm
 * was served. A release runs at once while the loop's pass has time,
 * and the pass's first always (core/pass.h, tw__pass_release: a comm
 * ending alone is released at once); else it waits in its context's
 * queue, which later passes run for as long as they have time, at least
 * one release each, in the order queued. The context's teardown runs
 * every release still queued (tw__reap_all). A closing stream comm's end
 * (TLS close_notify, then FIN: 15-20 us) and a ws comm's close frame wait
 * in the same queue (stream_comm.c, ws_send.c), cancelled if the comm
 * stops first; a failing ws comm's close frame is written with its
 * socket's release (sock_comm.h, parting). A socket comm's events wait with its socket, and its
 * memory once it is freed (transport/sock_comm.c, sock_park): the read
 * event's epoll_ctl was half of tw_comm_free's time. */
#ifndef TW_CORE_REAP_H
#define TW_CORE_REAP_H

#include <taskwire/context.h>

/* A release (or other costly step of an end) waiting in a queue; fn
 * does it (and frees r when r is its own). pprev is NULL while r is not
 * queued. */
struct tw__reap {
	struct tw__reap *next, **pprev;
	void (*fn)(struct tw__reap *r);
};

/* 1 when a release may run now (tw__pass_release, counted); 0 when it
 * must wait (tw__reap_later). Loop thread. */
int tw__reap_now(tw_context *ctx);
/* Queue r on ctx: r->fn(r) runs on a later pass (or at teardown).
 * Returns 0, or TW_ENOMEM when the queue's timer could not be made (then
 * nothing was queued: the caller releases at once). Loop thread. */
int tw__reap_later(tw_context *ctx, struct tw__reap *r);
/* The step r stands for (fn) at once or later: 1 when it waits in ctx's
 * queue (queued now by tw__reap_now's 0, or before), 0 when the caller
 * is to do it now (also when it could not be queued). Loop thread. */
int tw__reap_defer(tw_context *ctx, struct tw__reap *r, void (*fn)(struct tw__reap *r));
/* Take r out of ctx's queue, if it is there (its owner goes first); the
 * queue's timer stops when nothing is left, and a pass of it that finds
 * the queue empty runs nothing. Loop thread. */
void tw__reap_cancel(tw_context *ctx, struct tw__reap *r);
/* Run every release queued on ctx, now (teardown: the loop has stopped,
 * or this is its thread). */
void tw__reap_all(tw_context *ctx);

#endif
