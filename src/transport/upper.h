/* SPDX-License-Identifier: BSD-3-Clause */
/* The transport's contract with the layer above it (protocol/): what an
 * upper layer may call, and the one hook table through which the transport
 * calls it back. A comm's struct stays opaque up there (transport.h, which
 * includes this file, is for transport/ only); the upper layer keeps its
 * per-comm state behind tw__comm_set_upper and the transport never names
 * what that state is (decoded delivery, the handshake, placement). As nng's
 * pipe ops and nghttp2's callbacks: calls, not shared fields
 * (docs/design.md, Layers and files). Everything here runs on the comm's
 * loop thread. */
#ifndef TW_TRANSPORT_UPPER_H
#define TW_TRANSPORT_UPPER_H

#include <stddef.h>
#include <stdint.h>

#include <taskwire/comm.h>

#include "core/context.h"

/* tw__place_fn: decide where frame i (of n, lengths lens) lands, when
 * frames 0..i-1 of msg are complete (so frame 0 and any sub-header before
 * frame i can be read). Return 0 for the default placement, s >= 1 to read
 * frames i..i+s-1 into one new block of their summed size (adjacent, so a
 * merge of them is a view), or a negative TW_E* code to fail the message.
 * Asked about frame 0 (a new message) and about every frame larger than
 * small_frame_bytes not already grouped, never about a small frame: a
 * split payload's first shard is a full shard (Dask splits at 64 MiB, or
 * 8 MiB over ws), and small shards are adjacent in the slab anyway. */
typedef int (*tw__place_fn)(void *arg, const tw_msg *msg, const uint64_t *lens, size_t n, size_t i);

/* The upper layer's hooks on one comm, with its state `up`. A comm has at
 * most one upper layer; the transport calls it only through these. */
struct tw__upper_ops {
	/* The owner freed c (tw_comm_free): nothing of its may run any more.
	 * Or NULL. */
	void (*owner_gone)(tw_comm *c, void *up);
	/* c's memory goes (its last reference dropped, or its context torn
	 * down): free up. No callback of c may run from here. */
	void (*free)(void *up);
	/* tw_comm_resume on a comm the application had paused, callbacks
	 * set: the upper layer restarts reading (tw__comm_start) when it
	 * wants to. NULL: the transport starts reading at once. */
	void (*resume)(tw_comm *c, void *up);
	/* 1 when up holds received messages not yet delivered (so a request
	 * written now would have them arrive before its reply). Or NULL. */
	int (*backlog)(const tw_comm *c, const void *up);
};

/* Make (ops, up) c's upper layer; the one before, if any, is freed
 * (its ops->free) first. ops NULL: none. */
void tw__comm_set_upper(tw_comm *c, const struct tw__upper_ops *ops, void *up);
/* c's upper state when its upper layer is `ops`, else NULL. */
void *tw__comm_upper(const tw_comm *c, const struct tw__upper_ops *ops);

/* Reading, as the upper layer drives it (the application's own
 * tw_comm_pause is apart: see TW__COMM_APP_PAUSED). tw__comm_start
 * returns 0 or the transport's error; both are no-ops on an ended comm. */
int tw__comm_start(tw_comm *c);
void tw__comm_pause_reading(tw_comm *c);
/* Where the frames of each received message land (NULL: the default). */
void tw__comm_set_place(tw_comm *c, tw__place_fn fn, void *arg);

/* What the upper layer may know of a comm's state (tw__comm_state). */
enum tw__comm_state_bits {
	TW__COMM_ENDED = 1 << 0,         /* ended: no more callbacks */
	TW__COMM_CLOSING = 1 << 1,       /* takes no more writes (tw__comm_closing) */
	TW__COMM_OWNER_GONE = 1 << 2,    /* tw_comm_free ran */
	TW__COMM_APP_PAUSED = 1 << 3,    /* tw_comm_pause, not yet resumed */
	TW__COMM_HAS_CALLBACKS = 1 << 4, /* receive callbacks are set */
	TW__COMM_RELAYING = 1 << 5,      /* a relay of its input runs (relay.h) */
};
unsigned tw__comm_state(const tw_comm *c);
/* The limits c copied from its context when it was made; the upper layer
 * may lower or raise them for a stretch (a handshake's message bound). */
struct tw__limits *tw__comm_limits(tw_comm *c);
/* Bytes of c's write queue held in memory: tw_comm_queued_bytes less
 * those of relay frames, which wait in their source's socket (relay.h);
 * what the write high-water mark counts. */
uint64_t tw__comm_queued_held(const tw_comm *c);

/* Told when a comm is freed, by whoever freed it: a batched sender on a
 * server's stream comm, which the server frees when it closes; if
 * `closing` is set, when tw_comm_close is about to run (a last chance to
 * write); and, if `relayed` is set, when a relay of the comm's input
 * (transport/relay.h) is over and the comm reads again (TW__COMM_RELAYING
 * just cleared; a relay that fails ends the comm instead). `relayed` runs
 * from the comm's read event and may unwatch w, nothing more of c: a
 * pool's comm relaying a reply takes no call until then. */
struct tw__watch {
	struct tw__watch *next, **pprev;
	void (*gone)(struct tw__watch *w);
	void (*closing)(struct tw__watch *w);
	void (*relayed)(struct tw__watch *w);
};

/* Watch c until it is freed, or until tw__comm_unwatch. */
void tw__comm_watch(tw_comm *c, struct tw__watch *w);
void tw__comm_unwatch(struct tw__watch *w);
/* c takes no more writes from now on (tw_comm_close, or a transport's
 * own reason: a peer's half-close); watchers write their last first. */
void tw__comm_closing(tw_comm *c);

/* tw_comm_write without the write budget: the protocol's own messages
 * that nobody could retry (a handshake, a pool's request on an idle comm,
 * a batched sender's last batch). Same returns, without that TW_EAGAIN. */
int tw__comm_write_unbudgeted(tw_comm *c, tw_msg *m);
/* 1 when c holds received bytes or messages not yet delivered (read
 * ahead, in TLS, queued for decoding): a request written now would have
 * them arrive before its reply. */
int tw__comm_rx_pending(const tw_comm *c);

/* Run fn(c, arg) as a callback of c: a tw_comm_free inside is deferred.
 * Returns 1 when c may still be used, 0 when it ended or was freed. */
int tw__comm_call(tw_comm *c, void (*fn)(tw_comm *c, void *arg), void *arg);
/* Set callbacks for an internal user (the handshake) and start reading;
 * tw__comm_detach clears them and pauses reading, so the application can
 * then call tw_comm_set_callbacks. */
int tw__comm_attach(tw_comm *c, tw_recv_cb recv_cb, tw_close_cb close_cb, void *arg);
void tw__comm_detach(tw_comm *c);
/* On a comm from tw_comm_connect: what the connect timeout had left, in
 * ms (at least 1), when the comm was handed to the connect's callback; 0
 * on any other comm (accepted ones). A connector's Dask handshake ends
 * there if its own clock would end later (the connect timeout covers
 * every stage until a comm is usable, as Dask's connect() does). */
uint32_t tw__comm_connect_left_ms(const tw_comm *c);
/* End the comm with TW_ETIMEDOUT unless disarmed within ms milliseconds. */
int tw__comm_arm_timeout(tw_comm *c, uint32_t ms);
void tw__comm_disarm_timeout(tw_comm *c);

/* Bad input ends c with err, but replies already queued go out first
 * (design.md, Close): with nothing queued it ends at once, else it
 * closes as tw_comm_close does, reading no more, and ends with err. The
 * error text should be set first. */
void tw__comm_fail(tw_comm *c, int err);
/* Bad input (err) while the upper layer still holds received messages
 * to deliver (upper_ops->backlog): 1 when the fail is deferred until
 * they are delivered (the transport reads nothing meanwhile), 0 when
 * nothing is held (fail now). A request decoded on the offload pool and
 * bad input after it in one read: the comm ended at the bad input, the
 * request was served when its decode came back and its reply dropped
 * (evidence18 D1). */
int tw__comm_defer_fail(tw_comm *c, int err);
/* The upper layer delivered every message it held: a deferred fail runs
 * now (tw__comm_fail: the replies queued go out first). */
void tw__comm_delivered(tw_comm *c);
/* End the comm with err: release I/O, run the close callback once. The
 * caller must not touch c afterwards. A comm that was closing and ends
 * with an error gets the bytes it did not deliver added to its text. */
void tw__comm_end(tw_comm *c, int err);
/* Called from inside c's close callback: the owner's own close callback
 * runs later (messages received before the end are delivered first), so
 * the end watches wait for tw__comm_end_known. */
void tw__comm_end_owed(tw_comm *c);
/* The owner has been told that c ended (its close callback ran, or it
 * freed c): the end watches may run now. Idempotent. */
void tw__comm_end_known(tw_comm *c);
/* Record an error text on the comm (printf style). */
void tw__comm_seterr(tw_comm *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Abort the connect that tw_comm_connect(ctx, ..., cb, arg) started, in
 * whatever stage it is (TCP, TLS handshake, ws upgrade): its socket is
 * closed now and its callback never runs. Nothing when none is pending
 * (its callback has run). Loop thread. */
void tw__connect_cancel(tw_context *ctx, void *arg);

/* tw__mono_ms: CLOCK_MONOTONIC in milliseconds. Any thread. */
uint64_t tw__mono_ms(void);

#endif
