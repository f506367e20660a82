/* SPDX-License-Identifier: BSD-3-Clause */
/* Decoded delivery (include/taskwire/offload.h): each received message is
 * decoded inline or on the offload pool, and delivered in arrival order. */
#include <stdlib.h>
#include <string.h>

#include <taskwire/error.h>
#include <taskwire/offload.h>

#include "protocol/decode.h"
#include "protocol/delivery.h"
#include "protocol/offload.h"
#include "protocol/pcomm.h"

/* Reading pauses while this many messages of a comm wait for delivery. */
#define MAX_WAITING 8

struct tw__deliver_q;

struct item {
	struct item *next;
	struct tw__deliver_q *q;
	tw_msg *msg;
	tw_decoded *d;
	int err;
	int done;     /* decoded; loop thread only */
	int on_stack; /* on_recv's own: delivered before it returns */
	uint64_t max_bytes;
	struct tw__job job;
	char detail[200];
};

/* Per comm. Touched only on the loop thread; items in a worker keep it
 * alive through refs after the comm is gone. */
struct tw__deliver_q {
	tw_comm *comm; /* NULL once the comm is gone */
	int refs;      /* the comm's, plus one per item in a worker */
	struct item *head, **tail;
	unsigned n;
	int paused; /* we stopped reading */
	/* The comm ended with messages still owed: the close callback waits
	 * until they are delivered. */
	int close_pending;
	int close_err;
	tw_decoded_cb cb;
	tw_close_cb close_cb;
	tw_drain_cb drain_cb;
	void *arg;
};

static void item_free(struct item *it)
{
	tw_msg_free(it->msg);
	tw_decoded_free(it->d);
	if (!it->on_stack)
		free(it);
}

static void queue_unref(struct tw__deliver_q *q)
{
	if (--q->refs > 0)
		return;
	while (q->head != NULL) {
		struct item *it = q->head;
		q->head = it->next;
		item_free(it);
	}
	free(q);
}

static void decode(struct item *it)
{
	tw_decode_limits lim = {it->max_bytes};
	it->err = tw_decode(it->msg, &lim, &it->d, it->detail, sizeof(it->detail));
	tw_msg_free(it->msg); /* frames now live in the decoded message */
	it->msg = NULL;
}

static int app_paused(const tw_comm *comm)
{
	return (tw__comm_state(comm) & TW__COMM_APP_PAUSED) != 0;
}

static int may_read(const struct tw__deliver_q *q)
{
	return !app_paused(q->comm) && q->n < MAX_WAITING;
}

static void deliver_one(tw_comm *comm, void *arg)
{
	struct item *it = arg;
	struct tw__deliver_q *q = it->q;
	tw_decoded *d = it->d;
	it->d = NULL;
	q->cb(comm, d, it->err, it->err ? it->detail : NULL, q->arg);
}

/* The comm is there (not freed), not paused by the application, and
 * open or owing messages received before it ended. */
static int can_deliver(const struct tw__deliver_q *q)
{
	return q->comm != NULL && !app_paused(q->comm) &&
	       (!(tw__comm_state(q->comm) & TW__COMM_ENDED) || q->close_pending);
}

static void run_close(tw_comm *comm, void *arg)
{
	struct tw__deliver_q *q = arg;
	q->close_cb(comm, q->close_err, q->arg);
}

/* Deliver the decoded messages at the head, in order; then run a pending
 * close callback once nothing is owed, or at once when the application
 * paused the ended comm (tw_comm_resume cannot restart an ended comm, so
 * the rest is dropped). */
static void deliver(struct tw__deliver_q *q)
{
	q->refs++; /* a callback may free the comm, and with it its ref */
	while (can_deliver(q) && q->head != NULL && q->head->done) {
		struct item *it = q->head;
		if ((q->head = it->next) == NULL)
			q->tail = &q->head;
		q->n--;
		tw__comm_call(q->comm, deliver_one, it);
		item_free(it);
	}
	/* A fail deferred for them runs now; not while the application has
	 * the comm paused: it still owes a reply (a server's waits for its
	 * queue to drain), which the fail would shut out. */
	if (q->comm != NULL && q->head == NULL && !app_paused(q->comm))
		tw__comm_delivered(q->comm);
	if (q->comm != NULL && q->close_pending && (q->head == NULL || app_paused(q->comm))) {
		q->close_pending = 0;
		tw__comm_call(q->comm, run_close, q);
		if (q->comm != NULL) /* else its owner freed it, which told */
			tw__comm_end_known(q->comm);
	} else if (q->paused && q->comm != NULL && !(tw__comm_state(q->comm) & TW__COMM_ENDED) &&
		   may_read(q)) {
		q->paused = 0;
		(void)tw__comm_start(q->comm);
	}
	queue_unref(q);
}

static void pause_if_full(struct tw__deliver_q *q)
{
	if (!may_read(q) && !q->paused) {
		q->paused = 1;
		tw__comm_pause_reading(q->comm);
	}
}

static void job_run(struct tw__job *job)
{
	decode((struct item *)((char *)job - offsetof(struct item, job)));
}

static void job_done(struct tw__job *job)
{
	struct item *it = (struct item *)((char *)job - offsetof(struct item, job));
	struct tw__deliver_q *q = it->q;
	if (job->canceled) {
		it->err = TW_ECANCELED;
		strcpy(it->detail, "offload pool stopped");
	}
	it->done = 1;
	if (q->comm != NULL)
		deliver(q);
	queue_unref(q);
}

/* Nothing waits and the message is cheap to decode: decode and deliver
 * it now, with no allocation for the item (the common small RPC). The
 * item leaves the queue before its callback runs, so nothing can keep a
 * pointer to it after this returns. */
static void deliver_now(struct tw__deliver_q *q, tw_msg *msg)
{
	struct item it;
	it.next = NULL;
	it.q = q;
	it.msg = tw_msg_hold(msg);
	it.d = NULL;
	it.on_stack = 1;
	it.max_bytes = tw__comm_limits(q->comm)->max_message_bytes;
	decode(&it);
	it.done = 1;
	*q->tail = &it;
	q->tail = &it.next;
	q->n++;
	deliver(q);
}

static void on_recv(tw_comm *comm, tw_msg *msg, void *arg)
{
	struct tw__deliver_q *q = arg;
	struct item *it;
	uint64_t threshold = tw__offload_threshold(tw_comm_context(comm));
	uint64_t cost = tw__decode_cost(msg, threshold);
	if (q->head == NULL && can_deliver(q) && cost < threshold) {
		deliver_now(q, msg);
		return;
	}
	if ((it = calloc(1, sizeof(*it))) == NULL) {
		tw__comm_seterr(comm, "out of memory queueing a message");
		tw__comm_end(comm, TW_ENOMEM);
		return;
	}
	it->q = q;
	it->msg = tw_msg_hold(msg);
	it->max_bytes = tw__comm_limits(comm)->max_message_bytes;
	*q->tail = it;
	q->tail = &it->next;
	q->n++;
	if (cost >= threshold) {
		it->job.run = job_run;
		it->job.done = job_done;
		q->refs++;
		if (tw__offload_submit(tw_comm_context(comm), &it->job) == 0) {
			pause_if_full(q);
			return;
		}
		q->refs--; /* no pool: decode here */
	}
	decode(it);
	it->done = 1;
	pause_if_full(q);
	deliver(q);
}

/* The comm ended. As with tw_comm_set_callbacks, the messages received
 * before are delivered first (some may still be in the pool), then the
 * close callback runs. After tw_comm_abort (TW_ECANCELED), or while the
 * application has the comm paused, they are dropped and the close
 * callback runs now. Nothing is delivered after it (the comm ended). */
static void on_close(tw_comm *comm, int err, void *arg)
{
	struct tw__deliver_q *q = arg;
	if (err == TW_ECANCELED || app_paused(comm)) {
		q->close_cb(comm, err, q->arg);
		return;
	}
	q->close_pending = 1;
	q->close_err = err;
	tw__comm_end_owed(comm); /* the end watches wait for the close callback */
	deliver(q);
}

static void on_drain(tw_comm *comm, void *arg)
{
	struct tw__deliver_q *q = arg;
	if (q->drain_cb != NULL)
		q->drain_cb(comm, q->arg);
}

/* Messages received and not yet delivered (the one being delivered has
 * left the queue). */
int tw__deliver_backlog(const struct tw__deliver_q *q)
{
	return q->head != NULL;
}

void tw__deliver_resume(struct tw__deliver_q *q)
{
	q->paused = 1; /* tw_comm_pause stopped reading */
	deliver(q);
}

/* The comm is being freed, or its owner freed it: forget it; workers
 * still holding items keep the queue until their results come back. */
void tw__deliver_detach(struct tw__deliver_q *q)
{
	q->comm = NULL;
	queue_unref(q);
}

int tw_comm_set_decoded_callbacks(tw_comm *comm, tw_decoded_cb decoded_cb, tw_close_cb close_cb,
				  tw_drain_cb drain_cb, void *arg)
{
	struct tw__deliver_q *q;
	struct tw__pcomm *p;
	int rv;
	if (comm == NULL || decoded_cb == NULL || close_cb == NULL ||
	    (tw__comm_state(comm) & TW__COMM_HAS_CALLBACKS))
		return TW_EINVAL;
	if ((p = tw__pcomm_get(comm)) == NULL || (q = calloc(1, sizeof(*q))) == NULL)
		return TW_ENOMEM;
	q->comm = comm;
	q->refs = 1;
	q->tail = &q->head;
	q->cb = decoded_cb;
	q->close_cb = close_cb;
	q->drain_cb = drain_cb;
	q->arg = arg;
	p->deliver = q;
	rv = tw_comm_set_callbacks(comm, on_recv, on_close, on_drain, q);
	if (rv != 0) {
		p->deliver = NULL;
		free(q);
	}
	return rv;
}

tw_decoded_cb tw__deliver_cb(const tw_comm *comm)
{
	const struct tw__pcomm *p = tw__pcomm_find(comm);
	return p != NULL && p->deliver != NULL ? p->deliver->cb : NULL;
}

int tw__deliver_rebind(tw_comm *comm, tw_decoded_cb cb, tw_close_cb close_cb, void *arg)
{
	struct tw__deliver_q *q;
	if (tw__deliver_cb(comm) == NULL)
		return TW_EINVAL;
	q = tw__pcomm_find(comm)->deliver;
	q->cb = cb;
	q->close_cb = close_cb;
	q->drain_cb = NULL;
	q->arg = arg;
	return 0;
}
