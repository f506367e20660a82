/* SPDX-License-Identifier: BSD-3-Clause */
/* Calls to workers (Dask's rpc(worker).update_data, get_data_from_worker)
 * on comms of our own, one call at a time per comm, kept for the next call
 * when done. Our own comms rather than a tw_pool: Dask's get_data wants
 * "OK" written back on the comm that carried its reply before it serves
 * that comm again, and a removed worker's calls must fail at once. A link
 * whose worker went away is an orphan: it frees itself when its pending
 * connect or handshake reports. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>

#include "examples/mini-scheduler/sched.h"

struct wcall {
	tw_msg *req;
	int ack_ok;
	wcall_fn fn;
	void *arg;
	int err; /* for a failure reported from the loop */
	char why[400];
};

struct wlink {
	struct wlink *next;
	struct worker *w; /* NULL: an orphan */
	tw_comm *comm;    /* NULL while connecting */
	int ready;        /* handshake done, callbacks set */
	struct wcall *call;
};

static void report_failure(evutil_socket_t fd, short what, void *arg)
{
	struct wcall *call = arg;
	(void)fd;
	(void)what;
	call->fn(call->err, call->why, NULL, call->arg);
	tw_msg_free(call->req);
	free(call);
}

/* Fail the call from the loop, never from inside the caller. */
static void fail_later(struct wcall *call, int err, const char *fmt, const char *a, const char *b)
{
	struct timeval now = {0, 0};
	call->err = err ? err : TW_ECLOSED;
	snprintf(call->why, sizeof(call->why), fmt, a, b);
	if (event_base_once(S.base, -1, EV_TIMEOUT, report_failure, call, &now) != 0)
		abort(); /* out of memory in libevent */
}

static void unlink_link(struct wlink *l)
{
	struct wlink **p = &l->w->links;
	while (*p != l)
		p = &(*p)->next;
	*p = l->next;
}

/* The link failed before or during a call: fail the call, drop the link. */
static void link_failed(struct wlink *l, int err, const char *why)
{
	struct wcall *call = l->call;
	char addr[256];
	snprintf(addr, sizeof(addr), "%s", l->w ? l->w->address : "a removed worker");
	if (l->w != NULL)
		unlink_link(l);
	if (l->comm != NULL)
		tw_comm_free(l->comm);
	free(l);
	if (call != NULL)
		fail_later(call, err, "call to %s failed: %s", addr, why);
}

static void send_call(struct wlink *l)
{
	int rv = tw_comm_write(l->comm, l->call->req);
	if (rv == 0)
		l->call->req = NULL; /* the comm has it */
	else
		link_failed(l, rv, tw_strerror(rv));
}

static void write_ok(tw_comm *comm)
{
	tw_builder *b = builder_new();
	tw_msg *m;
	tw_pack_str(tw_builder_packer(b), "OK");
	if (tw_builder_finish(b, &m) == 0 && tw_comm_write(comm, m) != 0)
		tw_msg_free(m);
	tw_builder_free(b);
}

static void on_reply(tw_comm *comm, tw_decoded *d, int err, const char *detail, void *arg)
{
	struct wlink *l = arg;
	struct wcall *call = l->call;
	if (call == NULL || err != 0) { /* a message nobody asked for, or garbage */
		tw_decoded_free(d);
		tw_comm_abort(comm); /* on_close fails the call */
		(void)detail;
		return;
	}
	if (call->ack_ok && tw_obj_str_eq(tw_map_get(tw_decoded_root(d), "status"), "OK"))
		write_ok(comm);
	l->call = NULL; /* idle: the next call to this worker reuses it */
	call->fn(0, NULL, d, call->arg);
	free(call);
}

static void on_close(tw_comm *comm, int err, void *arg)
{
	struct wlink *l = arg;
	char why[300];
	snprintf(why, sizeof(why), "%s%s%s", err ? tw_strerror(err) : "the worker closed the comm",
		 *tw_comm_last_error(comm) ? ": " : "", tw_comm_last_error(comm));
	link_failed(l, err ? err : TW_ECLOSED, why);
}

static void on_handshake(tw_comm *comm, int err, const tw_handshake_info *info, void *arg)
{
	struct wlink *l = arg;
	int rv;
	(void)info;
	if (l->w == NULL) { /* orphan */
		tw_comm_free(comm);
		free(l);
		return;
	}
	if (err != 0)
		return link_failed(l, err, tw_comm_last_error(comm));
	if ((rv = tw_comm_set_decoded_callbacks(comm, on_reply, on_close, NULL, l)) != 0)
		return link_failed(l, rv, tw_strerror(rv));
	l->ready = 1;
	send_call(l);
}

static void on_connect(tw_comm *comm, int err, void *arg)
{
	struct wlink *l = arg;
	int rv;
	if (l->w == NULL) { /* orphan */
		tw_comm_free(comm);
		free(l);
		return;
	}
	if (err != 0)
		return link_failed(l, err, tw_context_last_error(S.ctx));
	l->comm = comm;
	if ((rv = tw_comm_handshake(comm, 0, on_handshake, l)) != 0)
		link_failed(l, rv, tw_strerror(rv));
}

void wcall(struct worker *w, tw_msg *req, int ack_ok, wcall_fn fn, void *arg)
{
	struct wcall *call = calloc(1, sizeof(*call));
	struct wlink *l;
	int rv;
	if (call == NULL)
		abort();
	call->req = req;
	call->ack_ok = ack_ok;
	call->fn = fn;
	call->arg = arg;
	for (l = w->links; l != NULL; l = l->next)
		if (l->ready && l->call == NULL) {
			l->call = call;
			return send_call(l);
		}
	if ((l = calloc(1, sizeof(*l))) == NULL)
		abort();
	l->w = w;
	l->call = call;
	l->next = w->links;
	w->links = l;
	if ((rv = tw_connect(S.ctx, w->address, on_connect, l)) != 0)
		link_failed(l, rv, tw_context_last_error(S.ctx));
}

void wcall_fail_all(struct worker *w, const char *why)
{
	struct wlink *l = w->links, *next;
	w->links = NULL;
	for (; l != NULL; l = next) {
		next = l->next;
		l->w = NULL;
		if (l->call != NULL)
			fail_later(l->call, TW_ECLOSED, "%s%s", why, "");
		l->call = NULL;
		if (l->ready) {
			tw_comm_free(l->comm);
			free(l);
		} else if (l->comm != NULL) {
			tw_comm_abort(l->comm); /* its handshake callback frees it */
		}
		/* still connecting: on_connect frees it */
	}
}
