/* SPDX-License-Identifier: BSD-3-Clause */
/* Stream op tables on any comm (include/taskwire/stream.h): the
 * connecting side of a stream dispatches by op as a server does (Dask's
 * Worker.handle_scheduler and Client._handle_report read their stream
 * with the same handle_stream loop as the scheduler). */
#include <stdlib.h>

#include <taskwire/error.h>
#include <taskwire/stream.h>

#include "protocol/delivery.h"
#include "protocol/optable.h"
#include "protocol/pcomm.h"
#include "transport/upper.h"

int tw_stream_ops_new(tw_stream_ops **out)
{
	if (out == NULL)
		return TW_EINVAL;
	return (*out = calloc(1, sizeof(**out))) != NULL ? 0 : TW_ENOMEM;
}

int tw_stream_ops_add(tw_stream_ops *t, const char *name, tw_stream_fn fn, void *arg)
{
	return t == NULL ? TW_EINVAL : tw__optable_add(&t->t, name, (void (*)(void))fn, arg);
}

void tw_stream_ops_free(tw_stream_ops *t)
{
	if (t == NULL)
		return;
	tw__optable_fini(&t->t);
	free(t);
}

/* One comm's dispatch: freed with the comm (it may be freed from any
 * callback, or without its close ever running). */
struct dispatch {
	const tw_stream_ops *t;
	tw_comm_ended_fn ended;
	void *arg;
	struct tw__watch watch;
};

static void dispatch_gone(struct tw__watch *w)
{
	free((struct dispatch *)((char *)w - offsetof(struct dispatch, watch)));
}

/* A handler closed, aborted or freed the comm: the batch ends. */
static int comm_stops(void *arg)
{
	tw_comm *c = arg;
	return (tw__comm_state(c) & (TW__COMM_ENDED | TW__COMM_CLOSING | TW__COMM_OWNER_GONE)) != 0;
}

/* A tw_server's comm: its stream ops are the server's. */
static int served(const tw_comm *comm)
{
	const struct tw__pcomm *p = tw__pcomm_find(comm);
	return p != NULL && p->served;
}

static void on_decoded(tw_comm *comm, tw_decoded *d, int err, const char *detail, void *arg)
{
	struct dispatch *ds = arg;
	int rv;
	if (err != 0) { /* a stream with a message lost is broken */
		tw__comm_seterr(comm, "%s", detail != NULL ? detail : tw_strerror(err));
		tw__comm_end(comm, err);
		return;
	}
	if (tw__comm_state(comm) &
	    TW__COMM_CLOSING) { /* after close-stream: what came behind is dropped */
		tw_decoded_free(d);
		return;
	}
	rv = tw__stream_dispatch(&ds->t->t, comm, d, comm_stops, comm);
	tw_decoded_free(d);
	if (rv == 1) {
		tw_comm_close(comm);
	} else if (rv == TW_EPROTO) {
		tw__comm_seterr(comm, "stream message is not a map or a list of maps");
		tw__comm_end(comm, TW_EPROTO);
	}
}

static void on_close(tw_comm *comm, int err, void *arg)
{
	struct dispatch *ds = arg;
	ds->ended(comm, err, ds->arg);
}

int tw_comm_dispatch_stream(tw_comm *comm, const tw_stream_ops *t, tw_comm_ended_fn ended,
			    void *arg)
{
	struct dispatch *ds;
	tw_decoded_cb cur = comm != NULL ? tw__deliver_cb(comm) : NULL;
	int has_cb = comm != NULL && (tw__comm_state(comm) & TW__COMM_HAS_CALLBACKS);
	int rv;
	if (comm == NULL || t == NULL || ended == NULL)
		return TW_EINVAL;
	if (tw__comm_state(comm) & (TW__COMM_ENDED | TW__COMM_CLOSING))
		return TW_ECLOSED;
	/* raw callbacks (nothing decodes for us), or dispatching already: a
	 * tw_server's comm (a kept stream) goes to the server's stream ops */
	if (served(comm) || (has_cb && (cur == NULL || cur == on_decoded)))
		return TW_EINVAL;
	if ((ds = calloc(1, sizeof(*ds))) == NULL)
		return TW_ENOMEM;
	ds->t = t;
	ds->ended = ended;
	ds->arg = arg;
	if (!has_cb)
		rv = tw_comm_set_decoded_callbacks(comm, on_decoded, on_close, NULL, ds);
	else
		rv = tw__deliver_rebind(comm, on_decoded, on_close, ds);
	if (rv != 0) {
		free(ds);
		return rv;
	}
	ds->watch.gone = dispatch_gone;
	tw__comm_watch(comm, &ds->watch);
	return 0;
}
