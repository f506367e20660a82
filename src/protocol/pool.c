/* SPDX-License-Identifier: BSD-3-Clause */
/* Calls to remote ops over pooled comms (include/taskwire/rpc.h). */
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>

#include <taskwire/error.h>
#include <taskwire/handshake.h>
#include <taskwire/offload.h>
#include <taskwire/rpc.h>

#include "core/timer.h"
#include "protocol/pcomm.h"
#include "protocol/pool.h"
#include "transport/upper.h"

/* How often idle comms past their age or count are closed. */
#define SWEEP_MS 1000

struct dest;

/* One pooled comm; connecting until `comm` is set. */
struct pcomm {
	struct tw__node node; /* tracked by the context while connecting */
	struct pcomm *next;
	struct dest *dest; /* NULL once the pool is gone */
	tw_comm *comm;
	tw_call *busy;
	struct timeval idle_since;
	int served; /* answered a call: not a peer that speaks first */
	/* Set while its last reply is relayed (TW__COMM_RELAYING): the comm
	 * takes no call until the relay is over (relay_over). */
	struct tw__watch relay_watch;
};

/* An address's comms and calls. Freed by on_kick or on_sweep once it has
 * neither (gone()), so a pool whose workers come and go stays small. */
struct dest {
	struct dest *next, **pprev; /* the pool's list, most recently called first */
	tw_pool *pool;
	char uri[256];
	struct pcomm *comms;
	size_t open; /* comms, connecting ones included */
	size_t connecting;
	tw_call *wait_head, **wait_tail;
	size_t nwaiting;
	tw_call *sleeping;      /* idempotent calls waiting to be retried */
	struct dest *kick_next; /* on the pool's kick list */
	int kicked;
	char why[TW__WHY_BYTES]; /* why its last connect failed */
};

struct tw_call {
	tw_call *next, **pprev;     /* waiting list */
	tw_call *dl_prev, *dl_next; /* the pool's deadlines, soonest first */
	uint64_t deadline_ms;       /* tw__mono_ms; 0: no timeout */
	uint32_t timeout_ms;
	struct dest *dest;
	struct pcomm *pc; /* the comm carrying it, once sent */
	tw_msg *req;      /* until written */
	tw_reply_cb cb;
	void *arg;
	int waiting;
	int doomed; /* failing with its address (connect_failed) */
	int ack_ok; /* TW_CALL_ACK_OK */
	/* Retries (TW_CALL_IDEMPOTENT): the request kept for the next try,
	 * the tries made, and the backoff between them. */
	tw_msg *orig;
	unsigned retries;
	int sleeping;
	tw_call *sl_next, **sl_pprev;
	struct event *retry_ev;
	char why[TW__WHY_BYTES]; /* tw_call_error */
};

struct tw_pool {
	tw_context *ctx;
	struct dest *dests;
	size_t limit, max_idle;
	uint32_t idle_timeout_ms;
	struct tw__timer sweep;    /* every SWEEP_MS: idle comms, empty addresses */
	struct event *kick;        /* dispatch from the loop */
	struct dest *kick_head;    /* the addresses it dispatches */
	struct tw__timer deadline; /* the soonest call deadline (or a later one) */
	tw_call *dl_head, *dl_tail;
	int closing;
	unsigned retry_count; /* tw_pool_set_retry */
	uint32_t retry_min_ms, retry_max_ms;
	int no_retry;    /* failing an address: nothing is retried */
	uint64_t jitter; /* xorshift state */
};

static void fail(tw_call *c, int err);

static void vsay(char *why, const char *fmt, va_list ap)
{
	vsnprintf(why, TW__WHY_BYTES, fmt, ap);
}

/* Why c failed (tw_call_error), or why d's connect did. */
__attribute__((format(printf, 2, 3))) static void say(tw_call *c, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsay(c->why, fmt, ap);
	va_end(ap);
}

__attribute__((format(printf, 2, 3))) static void say_dest(struct dest *d, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsay(d->why, fmt, ap);
	va_end(ap);
}

/* Where a call stood when its time ran out. */
static const char *stage(const tw_call *c)
{
	const struct dest *d = c->dest;
	if (c->pc != NULL)
		return "the request was sent and no reply came";
	if (d->open >= d->pool->limit)
		return "every comm the pool allows to the address was busy";
	for (const struct pcomm *pc = d->comms; pc != NULL; pc = pc->next)
		if (pc->comm != NULL && pc->node.next != NULL)
			return "still in the Dask handshake";
	return d->connecting > 0 ? "still connecting" : "waiting for a comm";
}

/* Call timeouts: one timer per pool, armed for the soonest deadline, and
 * the calls' deadlines in a list, soonest first. Calls with one timeout
 * (the usual case) append in O(1) and a reply only unlinks: no timer is
 * touched per call (a libevent timer per call cost each small RPC an add
 * and a delete). A timer that fires for a call already answered re-arms
 * for the next deadline. */
static void dl_arm(tw_pool *p)
{
	uint64_t armed = p->deadline.at_ms;
	if (p->dl_head != NULL && (armed == 0 || armed > p->dl_head->deadline_ms))
		tw__timer_arm(&p->deadline, p->dl_head->deadline_ms);
}

static void dl_insert(tw_pool *p, tw_call *c)
{
	tw_call *at = p->dl_tail;
	while (at != NULL && at->deadline_ms > c->deadline_ms)
		at = at->dl_prev;
	c->dl_prev = at;
	c->dl_next = at != NULL ? at->dl_next : p->dl_head;
	if (c->dl_next != NULL)
		c->dl_next->dl_prev = c;
	else
		p->dl_tail = c;
	if (at != NULL)
		at->dl_next = c;
	else
		p->dl_head = c;
	dl_arm(p);
}

static void dl_remove(tw_pool *p, tw_call *c)
{
	if (c->deadline_ms == 0)
		return;
	if (c->dl_prev != NULL)
		c->dl_prev->dl_next = c->dl_next;
	else
		p->dl_head = c->dl_next;
	if (c->dl_next != NULL)
		c->dl_next->dl_prev = c->dl_prev;
	else
		p->dl_tail = c->dl_prev;
	c->deadline_ms = 0;
}

static void on_deadline(void *arg)
{
	tw_pool *p = arg;
	uint64_t now = tw__mono_ms();
	while (p->dl_head != NULL && p->dl_head->deadline_ms <= now) {
		tw_call *c = p->dl_head;
		say(c, "no reply from %s within %u ms: %s", c->dest->uri, (unsigned)c->timeout_ms,
		    stage(c));
		fail(c, TW_ETIMEDOUT);
	}
	dl_arm(p);
}

static void dispatch(struct dest *d);
static void drop_unasked(struct pcomm *pc);

/* Nothing left: no comm (idle, carrying a call, or connecting) and no
 * waiting call (every call is one or the other). */
static int gone(const struct dest *d)
{
	return d->comms == NULL && d->wait_head == NULL && d->sleeping == NULL;
}

static void unlink_dest(struct dest *d)
{
	if ((*d->pprev = d->next) != NULL)
		d->next->pprev = d->pprev;
}

static void link_dest(tw_pool *p, struct dest *d)
{
	if ((d->next = p->dests) != NULL)
		d->next->pprev = &d->next;
	d->pprev = &p->dests;
	p->dests = d;
}

/* Dispatch d from the loop (on_kick). */
static void kick(struct dest *d)
{
	tw_pool *p = d->pool;
	if (!d->kicked) {
		d->kicked = 1;
		d->kick_next = p->kick_head;
		p->kick_head = d;
	}
	event_active(p->kick, EV_TIMEOUT, 0);
}

/* d may have nothing left: on_kick frees it from the loop, not here,
 * where the callers' frames still use it (a callback may even have
 * called its address again). */
static void maybe_gone(struct dest *d)
{
	if (gone(d) && !d->pool->closing)
		kick(d);
}

/* Failures worth another try of an idempotent call, as Dask's
 * retry_operation retries OSError (connection refused, reset, closed,
 * timed out), never a remote error or a refusal that will repeat. */
static int retryable(int err)
{
	return err == TW_ECONNREFUSED || err == TW_ECLOSED || err == TW_EIO ||
	       err == TW_ETIMEDOUT || err == TW_EHANDSHAKE || err == TW_ETRUNCATED;
}

static int sleep_call(tw_call *c);

static void finish(tw_call *c, int err, tw_decoded *reply)
{
	tw_pool *p = c->dest->pool;
	dl_remove(p, c);
	tw_msg_free(c->req);
	c->req = NULL;
	if (c->orig != NULL && err != 0 && retryable(err) && c->retries < p->retry_count &&
	    !p->closing && !p->no_retry && sleep_call(c) == 0)
		return;
	if (c->retries > 0 && err != 0) { /* say how hard it tried */
		size_t n = strlen(c->why);
		snprintf(c->why + n, sizeof(c->why) - n, " (after %u retr%s)", c->retries,
			 c->retries == 1 ? "y" : "ies");
	}
	tw_msg_free(c->orig);
	tw__event_free(c->retry_ev);
	c->cb(c, err, reply, c->arg);
	free(c);
}

static void unwait(tw_call *c)
{
	if ((*c->pprev = c->next) != NULL)
		c->next->pprev = c->pprev;
	else
		c->dest->wait_tail = c->pprev;
	c->dest->nwaiting--;
	c->waiting = 0;
}

/* Forget a comm (aborting it); it may be inside its own callback. */
static void drop_comm(struct pcomm *pc)
{
	struct dest *d = pc->dest;
	struct pcomm **pp = &d->comms;
	while (*pp != pc)
		pp = &(*pp)->next;
	*pp = pc->next;
	d->open--;
	tw__comm_unwatch(&pc->relay_watch);
	tw_comm_free(pc->comm);
	free(pc);
}

static void unsleep(tw_call *c)
{
	if ((*c->sl_pprev = c->sl_next) != NULL)
		c->sl_next->sl_pprev = c->sl_pprev;
	c->sleeping = 0;
	event_del(c->retry_ev);
}

/* A call fails: if its request went out, its comm can never be reused. */
static void fail(tw_call *c, int err)
{
	struct dest *d = c->dest;
	if (c->sleeping)
		unsleep(c);
	if (c->waiting)
		unwait(c);
	if (c->pc != NULL) {
		c->pc->busy = NULL;
		drop_comm(c->pc);
	}
	finish(c, err, NULL);
	dispatch(d);
	maybe_gone(d);
}

void tw_call_cancel(tw_call *c)
{
	say(c, "call to %s canceled", c->dest->uri);
	fail(c, TW_ECANCELED);
}

const char *tw_call_error(const tw_call *c)
{
	return c->why;
}

/* An uncaught-error reply: the remote exception's text, when a str. */
static void say_remote(tw_call *c, const tw_decoded *reply)
{
	const msgpack_object *t = tw_msgpack_map_get(tw_decoded_root(reply), "exception_text");
	if (t != NULL && t->type == MSGPACK_OBJECT_STR)
		say(c, "%s's handler failed: %.*s", c->dest->uri, (int)t->via.str.size,
		    t->via.str.ptr);
	else
		say(c, "%s's handler failed", c->dest->uri);
}

static int is_error_reply(const tw_decoded *reply)
{
	return tw_msgpack_str_eq(tw_msgpack_map_get(tw_decoded_root(reply), "status"),
				 "uncaught-error");
}

/* TW_CALL_ACK_OK: "OK" back on the comm after an OK reply, queued before
 * the comm can carry another call (Dask's get_data_from_worker). */
static int write_ack(tw_comm *comm, const tw_decoded *reply)
{
	tw_builder *b;
	tw_msg *m;
	int rv;
	if (!tw_msgpack_str_eq(tw_msgpack_map_get(tw_decoded_root(reply), "status"), "OK"))
		return 0;
	if ((rv = tw_builder_new(NULL, &b)) != 0)
		return rv;
	if ((rv = tw_msgpack_pack_str(tw_builder_packer(b), "OK")) == 0)
		rv = tw_builder_finish(b, &m);
	tw_builder_free(b);
	if (rv == 0 && (rv = tw__comm_write_unbudgeted(comm, m)) != 0)
		tw_msg_free(m);
	return rv;
}

/* pc's reply is relayed no more: it may carry the next call (a waiting
 * one is dispatched from the loop, outside the comm's read). */
static void relay_over(struct tw__watch *w)
{
	struct pcomm *pc = (struct pcomm *)((char *)w - offsetof(struct pcomm, relay_watch));
	tw__comm_unwatch(w);
	event_base_gettimeofday_cached(pc->dest->pool->ctx->base, &pc->idle_since);
	kick(pc->dest);
}

static void relay_gone(struct tw__watch *w)
{
	(void)w; /* the comm went with its context: drop_comm unwatches nothing */
}

static void on_reply(tw_comm *comm, tw_decoded *reply, int err, const char *detail, void *arg)
{
	struct pcomm *pc = arg;
	tw_call *c = pc->busy;
	struct dest *d = pc->dest;
	if (c == NULL) { /* a message nobody asked for */
		tw_decoded_free(reply);
		drop_unasked(pc);
		dispatch(d);
		maybe_gone(d);
		return;
	}
	pc->busy = NULL;
	pc->served = 1;
	c->pc = NULL;
	/* the loop's cached time: idle ages are counted in seconds */
	event_base_gettimeofday_cached(d->pool->ctx->base, &pc->idle_since);
	if (err != 0) {
		say(c, "bad reply from %s: %s", d->uri, detail != NULL ? detail : tw_strerror(err));
		drop_comm(pc);
		pc = NULL;
	} else if (is_error_reply(reply)) {
		say_remote(c, reply);
		err = TW_EREMOTE;
	} else if (c->ack_ok && write_ack(comm, reply) != 0) {
		drop_comm(pc); /* the peer would wait for the "OK" forever */
		pc = NULL;
	}
	if (pc != NULL && (tw__comm_state(comm) & TW__COMM_RELAYING)) {
		/* the reply's tail is still in the socket, and a request written
		 * now would wait behind it for the relay's slowest destination
		 * (a client that stopped reading): the comm is not idle until
		 * the relay is over (Dask's scheduler reads get_data's value
		 * before the comm goes back to its pool) */
		pc->relay_watch.relayed = relay_over;
		pc->relay_watch.gone = relay_gone;
		tw__comm_watch(comm, &pc->relay_watch);
	}
	finish(c, err, reply);
	dispatch(d);
	maybe_gone(d);
}

static void on_close(tw_comm *comm, int err, void *arg)
{
	struct pcomm *pc = arg;
	tw_call *c = pc->busy;
	struct dest *d = pc->dest;
	if (c != NULL)
		say(c, "the comm to %s ended before the reply: %s", d->uri,
		    err != 0 ? tw_comm_last_error(comm) : "the peer closed it");
	pc->busy = NULL;
	drop_comm(pc);
	if (c != NULL) {
		c->pc = NULL;
		finish(c, err != 0 ? err : TW_ECLOSED, NULL);
	}
	dispatch(d);
	maybe_gone(d);
}

/* c, waiting, fails with err and the address's last error text. */
static void fail_one(struct dest *d, tw_call *c, int err)
{
	unwait(c);
	memcpy(c->why, d->why, sizeof(c->why));
	finish(c, err, NULL);
}

/* Fail every call waiting for the address, with err: failing one must
 * not start a connect for the next (that made one connect attempt, and
 * one connect timeout, per waiting call in turn). Calls their callbacks
 * make are dispatched from the loop (the kick). */
static void fail_waiting(struct dest *d, int err)
{
	tw_call *c;
	for (c = d->wait_head; c != NULL; c = c->next)
		c->doomed = 1;
	while ((c = d->wait_head) != NULL && c->doomed)
		fail_one(d, c, err);
}

/* The connect (or its handshake) failed: the oldest waiting call fails
 * with it, as in Dask, where each caller's own connect raises to it
 * (distributed/core.py, ConnectionPool.connect); every waiting call when
 * no other comm of the address can take them. Failing calls only when
 * none was left let connects that fail at staggered times (a ws upgrade
 * answered after 0.5-1.5 s, a 1 s connect timeout) keep one in flight
 * for ever, the sweep starting another: no call without a timeout of its
 * own ever ended (breaker18 b18-4, session 16). */
static void connect_failed(struct dest *d, int err)
{
	if (d->comms == NULL && d->connecting == 0)
		fail_waiting(d, err);
	else if (d->wait_head != NULL)
		fail_one(d, d->wait_head, err);
}

/* Drop a comm that received a message nobody asked for. If it never
 * answered a call, the peer at this address speaks first: the calls
 * waiting for it fail, whatever other comms it has (connecting to it
 * again for them only met the same, thousands of times a second). */
static void drop_unasked(struct pcomm *pc)
{
	struct dest *d = pc->dest;
	int speaks_first = !pc->served;
	drop_comm(pc);
	if (speaks_first) {
		say_dest(d, "the peer at %s sent a message before any request: not a Dask server",
			 d->uri);
		fail_waiting(d, TW_EPROTO);
	}
}

static void pc_forget(struct pcomm *pc, int err)
{
	struct dest *d = pc->dest;
	tw__ctx_untrack(&pc->node);
	if (d == NULL) { /* the pool went away meanwhile */
		tw_comm_free(pc->comm);
		free(pc);
		return;
	}
	d->connecting--;
	if (err != 0) {
		drop_comm(pc);
		connect_failed(d, err);
		maybe_gone(d);
	}
}

static void on_handshake(tw_comm *comm, int err, const tw_handshake_info *info, void *arg)
{
	struct pcomm *pc = arg;
	struct dest *d = pc->dest;
	const struct tw__pcomm *hp = tw__pcomm_find(comm);
	(void)info;
	if (err == 0 && d != NULL &&
	    tw_comm_set_decoded_callbacks(comm, on_reply, on_close, NULL, pc) != 0)
		err = TW_ENOMEM;
	/* the connect timeout ended it: the call's connect timed out
	 * (TW_ETIMEDOUT, as a TLS handshake or ws upgrade it ends); any
	 * other failure is the handshake's */
	if (err == TW_ETIMEDOUT && hp != NULL && hp->hs_by_connect)
		err = TW_ETIMEDOUT;
	else if (err != 0 && err != TW_ENOMEM)
		err = err == TW_ETLS ? TW_ETLS : TW_EHANDSHAKE;
	if (err != 0 && d != NULL)
		say_dest(d, "Dask handshake with %s failed: %s", d->uri,
			 err == TW_ENOMEM ? tw_strerror(err) : tw_comm_last_error(comm));
	evutil_gettimeofday(&pc->idle_since, NULL);
	pc_forget(pc, err);
	if (err == 0 && d != NULL)
		dispatch(d);
}

static void on_connect(tw_comm *comm, int err, void *arg)
{
	struct pcomm *pc = arg;
	pc->comm = comm;
	if (err == 0 && pc->dest != NULL &&
	    (err = tw_comm_handshake(comm, TW_HANDSHAKE_CONNECTOR, on_handshake, pc)) == 0)
		return;
	if (pc->dest != NULL)
		say_dest(pc->dest, "%s",
			 comm == NULL ? tw_context_last_error(pc->dest->pool->ctx)
				      : tw_strerror(err));
	pc_forget(pc, err != 0 ? err : TW_ECANCELED);
}

/* The context is freed while pc connects: the context aborts the comm
 * itself, so only pc goes (pools should be freed before their context). */
static void kill_pc(struct tw__node *n)
{
	struct pcomm *pc = (struct pcomm *)n;
	if (pc->dest != NULL) {
		struct pcomm **pp = &pc->dest->comms;
		while (*pp != pc)
			pp = &(*pp)->next;
		*pp = pc->next;
		pc->dest->open--;
		pc->dest->connecting--;
	}
	free(pc);
}

/* A comm still connecting (TCP, TLS handshake, ws upgrade) or in the
 * Dask handshake is closed at once, its callbacks never run: it used to
 * stay open until the stage's own clock ended it (issue 17: 10 s). */
static void abort_connecting(struct pcomm *pc)
{
	tw__ctx_untrack(&pc->node);
	if (pc->comm != NULL)
		tw_comm_free(pc->comm); /* the handshake's state goes with it */
	else
		tw__connect_cancel(pc->dest->pool->ctx, pc);
	free(pc);
}

static int connect_one(struct dest *d)
{
	struct pcomm *pc = calloc(1, sizeof(*pc));
	int rv;
	if (pc == NULL)
		return TW_ENOMEM;
	pc->dest = d;
	pc->next = d->comms;
	d->comms = pc;
	d->open++;
	d->connecting++;
	tw__ctx_track(d->pool->ctx, &pc->node, kill_pc);
	if ((rv = tw_comm_connect(d->pool->ctx, d->uri, on_connect, pc)) != 0) {
		say_dest(d, "%s", tw_context_last_error(d->pool->ctx)); /* tw_comm_connect's */
		tw__ctx_untrack(&pc->node);
		d->connecting--;
		drop_comm(pc);
	}
	return rv;
}

/* Connected, handshaken, not serving a call and not relaying its last
 * reply (a call written meanwhile waits for the relay's end). */
static int unbusy(const struct pcomm *pc)
{
	return pc->node.next == NULL && pc->comm != NULL && pc->busy == NULL &&
	       (tw__comm_state(pc->comm) & (TW__COMM_HAS_CALLBACKS | TW__COMM_RELAYING)) ==
		       TW__COMM_HAS_CALLBACKS;
}

/* A comm ready for a call. Not one that already took in bytes of a next
 * message (a peer answering twice, say): a request written now would take
 * them for its reply. dispatch drops it (drop_stale). */
static struct pcomm *idle_comm(struct dest *d)
{
	for (struct pcomm *pc = d->comms; pc != NULL; pc = pc->next)
		if (unbusy(pc) && !tw__comm_rx_pending(pc->comm))
			return pc;
	return NULL;
}

/* Idle comms that took in bytes nobody asked for (see idle_comm) are
 * dropped, not left holding a place under the limit while their peer
 * says nothing more. */
static void drop_stale(struct dest *d)
{
	for (struct pcomm *pc = d->comms, *next; pc != NULL; pc = next) {
		next = pc->next;
		if (unbusy(pc) && tw__comm_rx_pending(pc->comm))
			drop_unasked(pc);
	}
}

/* Give waiting calls to idle comms; connect more while under the limit. */
static void dispatch(struct dest *d)
{
	struct pcomm *pc;
	int rv;
	if (d == NULL || d->pool->closing)
		return;
	drop_stale(d);
	while (d->wait_head != NULL && (pc = idle_comm(d)) != NULL) {
		tw_call *c = d->wait_head;
		unwait(c);
		c->pc = pc;
		pc->busy = c;
		if ((rv = tw__comm_write_unbudgeted(pc->comm, c->req)) != 0) {
			say(c, "the request to %s could not be written: %s", d->uri,
			    tw_strerror(rv));
			fail(c, rv);
			return;
		}
		c->req = NULL;
	}
	while (d->wait_head != NULL && d->open < d->pool->limit && d->connecting < d->nwaiting) {
		if ((rv = connect_one(d)) != 0) {
			connect_failed(d, rv);
			return;
		}
	}
}

/* Back off, then try again: delay_min * 2^i, at most delay_max, plus up
 * to 10% jitter (distributed.utils_comm.retry). */
static void on_retry(evutil_socket_t fd, short what, void *arg)
{
	tw_call *c = arg;
	struct dest *d = c->dest;
	(void)fd;
	(void)what;
	unsleep(c);
	c->req = tw_msg_hold(c->orig);
	c->doomed = 0;
	c->waiting = 1;
	c->next = NULL;
	c->pprev = d->wait_tail;
	*d->wait_tail = c;
	d->wait_tail = &c->next;
	d->nwaiting++;
	if (c->timeout_ms > 0) { /* each try has the call's timeout, as in Dask */
		c->deadline_ms = tw__mono_ms() + c->timeout_ms + 1;
		dl_insert(d->pool, c);
	}
	kick(d);
}

/* 0: c sleeps until its next try; -1: no memory for the timer. */
static int sleep_call(tw_call *c)
{
	struct dest *d = c->dest;
	tw_pool *p = d->pool;
	uint64_t ms = p->retry_min_ms;
	struct timeval tv;
	for (unsigned i = 0; i < c->retries && ms < p->retry_max_ms; i++)
		ms *= 2;
	if (ms > p->retry_max_ms)
		ms = p->retry_max_ms;
	p->jitter ^= p->jitter << 13, p->jitter ^= p->jitter >> 7, p->jitter ^= p->jitter << 17;
	ms += ms * (p->jitter % 1000) / 10000;
	if (c->retry_ev == NULL && (c->retry_ev = evtimer_new(p->ctx->base, on_retry, c)) == NULL)
		return -1;
	c->retries++;
	c->sleeping = 1;
	c->sl_next = d->sleeping;
	c->sl_pprev = &d->sleeping;
	if (d->sleeping != NULL)
		d->sleeping->sl_pprev = &c->sl_next;
	d->sleeping = c;
	tv.tv_sec = (time_t)(ms / 1000);
	tv.tv_usec = (suseconds_t)(ms % 1000) * 1000;
	evtimer_add(c->retry_ev, &tv);
	return 0;
}

static struct dest *find_dest(tw_pool *p, const char *uri)
{
	struct dest *d;
	for (d = p->dests; d != NULL; d = d->next)
		if (strcmp(d->uri, uri) == 0) {
			unlink_dest(d); /* to the front: calls come in runs */
			link_dest(p, d);
			return d;
		}
	if (strlen(uri) >= sizeof(d->uri) || (d = calloc(1, sizeof(*d))) == NULL)
		return NULL;
	snprintf(d->uri, sizeof(d->uri), "%s", uri);
	d->pool = p;
	d->wait_tail = &d->wait_head;
	link_dest(p, d);
	return d;
}

int tw_pool_call(tw_pool *p, const char *uri, tw_msg *request, uint32_t timeout_ms, tw_reply_cb cb,
		 void *arg, tw_call **out)
{
	return tw_pool_call_flags(p, uri, request, timeout_ms, 0, cb, arg, out);
}

int tw_pool_call_flags(tw_pool *p, const char *uri, tw_msg *request, uint32_t timeout_ms,
		       unsigned flags, tw_reply_cb cb, void *arg, tw_call **out)
{
	struct pcomm *pc;
	struct dest *d;
	tw_call *c;
	if (p == NULL || uri == NULL || request == NULL || cb == NULL ||
	    tw_msg_nframes(request) == 0 || strlen(uri) >= sizeof(d->uri) ||
	    (flags & ~(unsigned)(TW_CALL_IDEMPOTENT | TW_CALL_ACK_OK)) != 0)
		return TW_EINVAL;
	if (p->closing) /* from a callback that tw_pool_free runs */
		return TW_ECLOSED;
	/* zeroed up to the error text, which only a failure writes: small
	 * RPCs do not pay for clearing 256 bytes each */
	if ((c = malloc(sizeof(*c))) == NULL)
		return TW_ENOMEM;
	memset(c, 0, offsetof(tw_call, why));
	c->why[0] = '\0';
	if ((d = find_dest(p, uri)) == NULL) { /* never an empty dest left behind */
		free(c);
		return TW_ENOMEM;
	}
	c->dest = d;
	c->req = request;
	if (flags & TW_CALL_IDEMPOTENT)
		c->orig = tw_msg_hold(request);
	c->ack_ok = (flags & TW_CALL_ACK_OK) != 0;
	c->cb = cb;
	c->arg = arg;
	c->waiting = 1;
	c->pprev = d->wait_tail;
	*d->wait_tail = c;
	d->wait_tail = &c->next;
	d->nwaiting++;
	if (timeout_ms > 0) {
		c->timeout_ms = timeout_ms;
		/* + 1: tw__mono_ms truncates to the millisecond, and the
		 * deadline timer fires at a whole one: without it a call
		 * could fail up to 1 ms before timeout_ms have passed */
		c->deadline_ms = tw__mono_ms() + timeout_ms + 1;
		dl_insert(p, c);
	}
	if (out != NULL)
		*out = c;
	/* Nobody ahead and an idle comm: send now (tw_comm_write runs no
	 * callback). Otherwise dispatch from the loop, so no callback runs
	 * inside this call; only the addresses that got calls (a scheduler
	 * calls many workers). */
	if (d->wait_head == c && (pc = idle_comm(d)) != NULL &&
	    tw__comm_write_unbudgeted(pc->comm, request) == 0) {
		unwait(c);
		c->req = NULL;
		c->pc = pc;
		pc->busy = c;
		return 0;
	}
	kick(d);
	return 0;
}

static void on_kick(evutil_socket_t fd, short what, void *arg)
{
	tw_pool *p = arg;
	(void)fd;
	(void)what;
	while (p->kick_head != NULL) {
		struct dest *d = p->kick_head;
		p->kick_head = d->kick_next;
		d->kicked = 0;
		dispatch(d);
		/* Kicked again (a callback called the address, or a call of it
		 * failed): the next pass decides. */
		if (!d->kicked && gone(d)) {
			unlink_dest(d);
			free(d);
		}
	}
}

static void on_sweep(void *arg)
{
	tw_pool *p = arg;
	struct timeval now, age;
	tw__timer_arm(&p->sweep, tw__mono_ms() + SWEEP_MS);
	evutil_gettimeofday(&now, NULL);
	for (struct dest *d = p->dests, *dnext; d != NULL; d = dnext) {
		struct pcomm *pc = d->comms, *next;
		size_t idle = 0;
		dnext = d->next;
		for (; pc != NULL; pc = next) {
			next = pc->next;
			/* a comm whose reply is still being relayed is not idle:
			 * freeing it would cut the message its frames went into */
			if (pc->node.next != NULL || pc->comm == NULL || pc->busy != NULL ||
			    (tw__comm_state(pc->comm) & TW__COMM_RELAYING))
				continue;
			evutil_timersub(&now, &pc->idle_since, &age);
			if (++idle > p->max_idle ||
			    (uint64_t)age.tv_sec * 1000 + (uint64_t)age.tv_usec / 1000 >=
				    p->idle_timeout_ms)
				drop_comm(pc);
		}
		dispatch(d);                 /* calls waiting for a place a dropped comm held */
		if (gone(d) && !d->kicked) { /* a kicked one is on_kick's */
			unlink_dest(d);
			free(d);
		}
	}
}

int tw_pool_new(tw_context *ctx, tw_pool **out)
{
	tw_pool *p;
	int rv = TW_ENOMEM;
	if (ctx == NULL || out == NULL)
		return TW_EINVAL;
	if ((p = calloc(1, sizeof(*p))) == NULL)
		return TW_ENOMEM;
	p->ctx = ctx;
	p->limit = TW_DEFAULT_POOL_LIMIT;
	p->max_idle = TW_DEFAULT_POOL_MAX_IDLE;
	p->idle_timeout_ms = TW_DEFAULT_POOL_IDLE_TIMEOUT_MS;
	p->retry_count = TW_DEFAULT_POOL_RETRY_COUNT;
	p->retry_min_ms = TW_DEFAULT_POOL_RETRY_DELAY_MIN_MS;
	p->retry_max_ms = TW_DEFAULT_POOL_RETRY_DELAY_MAX_MS;
	p->jitter = tw__mono_ms() | 1;
	if ((p->kick = event_new(ctx->base, -1, 0, on_kick, p)) == NULL ||
	    (rv = tw__timer_init(&p->sweep, ctx->base, on_sweep, p)) != 0 ||
	    (rv = tw__timer_init(&p->deadline, ctx->base, on_deadline, p)) != 0) {
		tw__timer_fini(&p->sweep);
		tw__event_free(p->kick);
		free(p);
		return rv;
	}
	tw__timer_arm(&p->sweep, tw__mono_ms() + SWEEP_MS);
	*out = p;
	return 0;
}

int tw_pool_set_limit(tw_pool *p, size_t n)
{
	if (p == NULL || n == 0)
		return TW_EINVAL;
	p->limit = n;
	return 0;
}

int tw_pool_set_retry(tw_pool *p, unsigned count, uint32_t delay_min_ms, uint32_t delay_max_ms)
{
	if (p == NULL || delay_min_ms == 0 || delay_max_ms < delay_min_ms)
		return TW_EINVAL;
	p->retry_count = count;
	p->retry_min_ms = delay_min_ms;
	p->retry_max_ms = delay_max_ms;
	return 0;
}

int tw_pool_set_idle(tw_pool *p, size_t max_idle, uint32_t idle_timeout_ms)
{
	if (p == NULL)
		return TW_EINVAL;
	p->max_idle = max_idle;
	p->idle_timeout_ms = idle_timeout_ms;
	return 0;
}

size_t tw_pool_open_comms(const tw_pool *p, const char *uri)
{
	for (const struct dest *d = p->dests; d != NULL; d = d->next)
		if (strcmp(d->uri, uri) == 0)
			return d->open;
	return 0;
}

size_t tw__pool_ndests(const tw_pool *p)
{
	size_t n = 0;
	for (const struct dest *d = p->dests; d != NULL; d = d->next)
		n++;
	return n;
}

/* The first call of d in flight, or NULL. */
static tw_call *busy_call(const struct dest *d)
{
	for (const struct pcomm *pc = d->comms; pc != NULL; pc = pc->next)
		if (pc->busy != NULL)
			return pc->busy;
	return NULL;
}

int tw_pool_fail_address(tw_pool *p, const char *uri, int err, const char *why)
{
	struct dest *d;
	struct pcomm *pc, **pp;
	tw_call *c;
	if (p == NULL || uri == NULL || err >= 0 || p->closing)
		return TW_EINVAL;
	for (d = p->dests; d != NULL && strcmp(d->uri, uri) != 0; d = d->next)
		;
	if (d == NULL)
		return 0;
	say_dest(d, "%s: %s", uri, why != NULL ? why : tw_strerror(err));
	p->no_retry = 1;
	/* comms that carry no call first, with no callback: a callback below
	 * that calls uri again must not get one of them */
	for (pp = &d->comms; (pc = *pp) != NULL;) {
		if (pc->busy != NULL) {
			pp = &pc->next;
		} else if (pc->node.next != NULL) { /* connecting, or in its handshake */
			*pp = pc->next;
			d->open--;
			d->connecting--;
			abort_connecting(pc);
		} else {
			drop_comm(pc);
		}
	}
	/* then the calls; rescanning after each callback, which may cancel
	 * another call or call the address again */
	while ((c = busy_call(d)) != NULL) {
		struct pcomm *cp = c->pc;
		memcpy(c->why, d->why, sizeof(c->why));
		cp->busy = NULL;
		c->pc = NULL;
		drop_comm(cp);
		finish(c, err, NULL);
	}
	fail_waiting(d, err);
	while ((c = d->sleeping) != NULL) {
		memcpy(c->why, d->why, sizeof(c->why));
		fail(c, err);
	}
	p->no_retry = 0;
	if (d->wait_head != NULL) /* calls made by the callbacks: new comms */
		kick(d);
	maybe_gone(d);
	return 0;
}

size_t tw__pool_nsleeping(const tw_pool *p)
{
	size_t n = 0;
	for (const struct dest *d = p->dests; d != NULL; d = d->next)
		for (const tw_call *c = d->sleeping; c != NULL; c = c->sl_next)
			n++;
	return n;
}

void tw_pool_free(tw_pool *p)
{
	if (p == NULL)
		return;
	p->closing = 1;
	while (p->dests != NULL) {
		struct dest *d = p->dests;
		while (d->wait_head != NULL) {
			say(d->wait_head, "call to %s canceled: the pool was freed", d->uri);
			fail(d->wait_head, TW_ECANCELED);
		}
		while (d->sleeping != NULL) {
			say(d->sleeping, "call to %s canceled: the pool was freed", d->uri);
			fail(d->sleeping, TW_ECANCELED);
		}
		while (d->comms != NULL) {
			struct pcomm *pc = d->comms;
			if (pc->busy != NULL) {
				say(pc->busy, "call to %s canceled: the pool was freed", d->uri);
				fail(pc->busy, TW_ECANCELED);
				continue;
			}
			if (pc->node.next != NULL) { /* connecting, or in its handshake */
				d->comms = pc->next;
				abort_connecting(pc);
				continue;
			}
			drop_comm(pc);
		}
		unlink_dest(d);
		free(d);
	}
	/* after the callbacks: one may still touch the pool (tw_pool_call
	 * refuses while closing) */
	tw__timer_fini(&p->sweep);
	event_free(p->kick);
	tw__timer_fini(&p->deadline);
	free(p);
}

struct sync {
	pthread_mutex_t lock;
	pthread_cond_t cv;
	tw_context *ctx;
	const char *uri;
	tw_msg *req;
	uint32_t timeout_ms;
	tw_pool *pool;
	int done, err;
	tw_decoded *reply;
};

static void sync_done(tw_call *c, int err, tw_decoded *reply, void *arg)
{
	struct sync *s = arg;
	if (err != 0) /* on the loop thread, where the context's error is written */
		tw__ctx_seterr(s->ctx, "%s", c != NULL ? tw_call_error(c) : tw_strerror(err));
	pthread_mutex_lock(&s->lock);
	s->err = err;
	s->reply = reply;
	s->done = 1;
	pthread_cond_signal(&s->cv);
	pthread_mutex_unlock(&s->lock);
}

/* On the loop thread: start the call (or record why it could not start:
 * the request is freed then, as tw_rpc_call_sync takes it in every case). */
static void sync_start(void *arg)
{
	struct sync *s = arg;
	int rv = tw_pool_new(s->ctx, &s->pool);
	if (rv == 0)
		rv = tw_pool_call(s->pool, s->uri, s->req, s->timeout_ms, sync_done, s, NULL);
	if (rv != 0) {
		tw_msg_free(s->req);
		sync_done(NULL, rv, NULL, s);
	}
}

static void sync_stop(void *arg)
{
	struct sync *s = arg;
	tw_pool_free(s->pool);
	pthread_mutex_lock(&s->lock);
	s->pool = NULL;
	pthread_cond_signal(&s->cv);
	pthread_mutex_unlock(&s->lock);
}

int tw_rpc_call_sync(tw_context *ctx, const char *uri, tw_msg *request, uint32_t timeout_ms,
		     tw_decoded **reply)
{
	struct sync s;
	if (reply != NULL)
		*reply = NULL;
	if (ctx == NULL || uri == NULL || request == NULL || reply == NULL) {
		tw_msg_free(request); /* taken in every case */
		return TW_EINVAL;
	}
	memset(&s, 0, sizeof(s));
	pthread_mutex_init(&s.lock, NULL);
	pthread_cond_init(&s.cv, NULL);
	s.ctx = ctx;
	s.uri = uri;
	s.req = request;
	s.timeout_ms = timeout_ms;
	if (ctx->has_thread) {
		pthread_mutex_lock(&s.lock);
		if (tw_context_call(ctx, sync_start, &s) != 0) {
			pthread_mutex_unlock(&s.lock);
			pthread_cond_destroy(&s.cv);
			pthread_mutex_destroy(&s.lock);
			tw_msg_free(request);
			return TW_ENOMEM;
		}
		while (!s.done)
			pthread_cond_wait(&s.cv, &s.lock);
		pthread_mutex_unlock(&s.lock);
		tw_context_call(ctx, sync_stop, &s);
		pthread_mutex_lock(&s.lock);
		while (s.pool != NULL)
			pthread_cond_wait(&s.cv, &s.lock);
		pthread_mutex_unlock(&s.lock);
	} else {
		sync_start(&s);
		while (!s.done)
			event_base_loop(ctx->base, EVLOOP_ONCE);
		tw_pool_free(s.pool);
	}
	pthread_cond_destroy(&s.cv);
	pthread_mutex_destroy(&s.lock);
	*reply = s.reply;
	return s.err;
}
