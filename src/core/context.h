/* SPDX-License-Identifier: BSD-3-Clause */
/* Internal context: limits, the loop, and the objects to tear down. */
#ifndef TW_CORE_CONTEXT_H
#define TW_CORE_CONTEXT_H

#include <pthread.h>
#include <stdint.h>

#include <taskwire/context.h>
#include <taskwire/error.h>

#include "core/budget.h"
#include "core/limits.h"

struct event;

/* An object the context frees at teardown (comms, listeners, connects). */
struct tw__node {
	struct tw__node *prev, *next;
	void (*kill)(struct tw__node *n); /* free without callbacks */
	/* The arg of the tw_comm_connect whose callback this object will run (a
	 * connect, a client's TLS handshake or ws upgrade), else NULL:
	 * tw__connect_cancel finds the stage a connect is in by it. */
	void *connect_arg;
};

/* A call to run on the loop thread; embed one to post without allocating. */
struct tw__call {
	struct tw__call *next;
	void (*fn)(void *arg);
	void *arg;
	int owned; /* freed after running (tw_context_call) */
};

/* Context extensions: what a layer above core keeps per context (the TLS
 * configuration, the resolver, the offload pool) sits in a slot found by
 * its ops, so core never names it. */
struct tw__ext_ops {
	/* Teardown begins, before the context's comms and listeners are
	 * killed: take no more work. Loop thread, or NULL. */
	void (*stop)(void *state);
	/* The context is freed (after its loops, before the calls still
	 * queued run): drop state. */
	void (*release)(void *state);
	/* The state a new loop thread's context starts with
	 * (tw_context_set_loop_threads; nloops loops in all): a reference of
	 * its own, or NULL; hold NULL: a loop starts without. Main loop
	 * thread. */
	void *(*hold)(void *state, unsigned nloops);
	/* Hand the main context's state (held again) to a loop with each comm
	 * accepted for it (tw__loop_conf), replacing the loop's, so that a
	 * later setter reaches the loops (the TLS configuration). */
	int per_comm;
};

#define TW__EXT_SLOTS 6

struct tw__ext {
	const struct tw__ext_ops *ops; /* NULL: a free slot */
	void *state;
};

/* ctx's state for ops, or NULL. */
void *tw__ctx_ext(const tw_context *ctx, const struct tw__ext_ops *ops);
/* Make state ctx's for ops (NULL: none); the state it had is released
 * first, unless it is the same. Returns 0, or TW_ENOMEM when every slot
 * is taken by other kinds (then the caller still owns state): a
 * programmer's error, asserted, since there are fewer kinds than
 * TW__EXT_SLOTS (dns, offload, tls, the relay's pipes, the TLS
 * handshakes waiting for a pass). */
int tw__ctx_set_ext(tw_context *ctx, const struct tw__ext_ops *ops, void *state);

/* tw__context_post: run c->fn(c->arg) on the loop thread; any thread;
 * cannot fail. The caller owns c (unless owned is set) and must keep it
 * until fn runs. */
void tw__context_post(tw_context *ctx, struct tw__call *c);

struct tw_context {
	struct event_base *base;
	int own_base;
	pthread_t thread;
	int has_thread;
	struct event *call_ev; /* watches wake_fd */
	int wake_fd;           /* eventfd that other threads write to */
	pthread_mutex_t lock;  /* guards calls */
	struct tw__call *calls, **calls_tail;
	struct tw__limits limits;
	int max_frames_set;      /* tw_context_set_max_frames ran: frames no longer follow bytes */
	struct tw__node objects; /* list head; loop thread only */
	char error[512];         /* last connect/accept failure; loop thread */
	unsigned error_seq;      /* counts writes of error (tw__ctx_seterr) */
	/* The layers' state (tw__ctx_ext). */
	struct tw__ext ext[TW__EXT_SLOTS];
	/* Across comms (core/budget.h): bytes of messages being received,
	 * bytes queued for writing. */
	struct tw__budget rbudget;
	struct tw__wbudget wbudget;
	struct event *rbudget_ev; /* a 1 ms look again while the reclaimer holds bytes */
	struct event *pass_ev;    /* rbudget.stuck: 100 ms with no bytes back, then a pass */
	uint64_t pass_progress, pass_pending;
	uint64_t written, pass_written; /* bytes written: all, and at the interval's start */
	/* Releases waiting for a pass with time (core/reap.h): a FIFO
	 * (reap_tail NULL: not set up yet), run by reap_ev. */
	struct tw__reap *reap_head, **reap_tail;
	struct event *reap_ev;
	/* Bytes of the messages in all write queues, each counted until it
	 * is written whole and freed (wbudget.used falls as bytes go out,
	 * while the message's memory stays until its last byte): what the
	 * receive budget counts with its reservations (rbudget.also). */
	uint64_t wq_held;
	/* The memory limit (tw_context_set_memory_limit_bytes; rbudget.hard)
	 * and its look (mem_ev: every pass interval while what is reserved
	 * and queued passes it). mem_cut, set by the first comm made
	 * (transport/overload.c), ends the comms whose peers take none of
	 * their queued bytes; mem_looks counts the looks, so that a comm
	 * knows whether it was seen at the last one. */
	uint64_t mem_limit;
	struct event *mem_ev;
	uint64_t mem_looks;
	void (*mem_cut)(tw_context *ctx);
	/* Looks of the relay stall watches (transport/stream_comm.c) that
	 * found a destination holding its source up with its peer's TCP
	 * having acknowledged nothing since the watch's last look: the
	 * watch's own progress, which tests wait on (check_relay). */
	uint64_t relay_still_looks;
	/* Tells every comm of the context that the pause limit changed
	 * (tw__comm_ops.pause_limit_set), set by the first comm made
	 * (transport/comm.c); NULL while there is none. */
	void (*pause_limit_set)(tw_context *ctx);
	/* Loop threads (core/loops.c, tw_context_set_loop_threads): loops[i]
	 * for i >= 1 is a context of its own with its own loop thread;
	 * loops[0] is this one. On those, `main` is this context and `index`
	 * their place; loops and next_loop are the main loop thread's. */
	tw_context **loops;
	unsigned nloops; /* 0 or 1: the one loop */
	unsigned index;
	tw_context *main;
	unsigned next_loop; /* round robin of accepted comms */
};

/* event_free that accepts NULL (libevent's does not), as every _free
 * here does. */
void tw__event_free(struct event *ev);

/* The body of a limit's setter: TW_EINVAL when ctx is NULL or the value
 * is outside its range (valid is false), else the limit takes v and 0.
 *   return TW__SET_LIMIT(ctx, close_linger_ms, ms, ms > 0); */
#define TW__SET_LIMIT(ctx, field, v, valid)                                                        \
	((ctx) == NULL || !(valid) ? TW_EINVAL : ((ctx)->limits.field = (v), 0))

/* A message of n bytes entered a write queue (held), or left it written
 * or dropped and freed (unheld: waiters of the receive budget may fit
 * now). Loop thread. */
void tw__ctx_write_held(tw_context *ctx, uint64_t n);
void tw__ctx_write_unheld(tw_context *ctx, uint64_t n);
/* Bytes reserved by the receive budget and held by the write queues:
 * what the memory limit bounds. Loop thread. */
uint64_t tw__ctx_held(const tw_context *ctx);

/* What a loop copies from the main context with each comm handed to it
 * (tw__loop_conf_take on the main loop thread, tw__loop_conf_apply on the
 * loop's): the limits, and a reference to each per_comm extension's
 * state. */
struct tw__loop_conf {
	struct tw__limits limits;
	struct tw__ext ext[TW__EXT_SLOTS];
};
void tw__loop_conf_take(tw_context *main, struct tw__loop_conf *conf);
void tw__loop_conf_apply(tw_context *loop, struct tw__loop_conf *conf);
/* The loop the next accepted comm goes to (round robin); ctx itself when
 * it has one loop. Main loop thread. */
tw_context *tw__ctx_next_loop(tw_context *ctx);
/* Run fn(arg) on loop's thread and wait for it to return (at once when
 * called on that thread, or when the loop has no thread of its own).
 * Not on the hot path: teardown. */
void tw__ctx_run_wait(tw_context *loop, void (*fn)(void *arg), void *arg);
/* The context whose loop thread this is (a thread the library started),
 * or NULL. */
tw_context *tw__ctx_current(void);
/* Free the loops other than the main one (tw_context_free). */
void tw__loops_free(tw_context *ctx);
/* tw_context_free of any context, a loop's too. */
void tw__ctx_free(tw_context *ctx);

/* Bytes queued for writing on a comm of ctx (tw__wbudget_add), and bytes
 * that left the queues (written or dropped). Loop thread. */
static inline void tw__ctx_write_queued(tw_context *ctx, uint64_t n)
{
	tw__wbudget_add(&ctx->wbudget, n);
}
void tw__ctx_write_gone(tw_context *ctx, uint64_t n);

void tw__ctx_track(tw_context *ctx, struct tw__node *n, void (*kill)(struct tw__node *));
void tw__ctx_untrack(struct tw__node *n);
/* Why the last connect or accept failed (tw_context_last_error). */
void tw__ctx_seterr(tw_context *ctx, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
