/* SPDX-License-Identifier: BSD-3-Clause */
/* The worker registry: Dask's Scheduler.add_worker (register-worker: a
 * reply on the same comm, which then stays the worker's stream),
 * heartbeat_worker, remove_worker, and the workers' part of identity
 * (WorkerState.identity). A worker leaves when its stream ends, when it
 * unregisters, or when its heartbeats stop for the worker TTL (Dask's
 * distributed.scheduler.worker-ttl, checked by main.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "examples/mini-scheduler/sched.h"

/* Dask's heartbeat_interval(n), seconds. */
static double heartbeat_interval(size_t n)
{
	if (n <= 10)
		return 0.5;
	if (n < 50)
		return 1;
	if (n < 200)
		return 2;
	return (double)n / 200 + 1;
}

struct worker *worker_find(const char *addr, size_t len)
{
	for (struct worker *w = S.workers; w != NULL; w = w->next)
		if (strlen(w->address) == len && memcmp(w->address, addr, len) == 0)
			return w;
	return NULL;
}

static void pack_status_reply(tw_builder *b, int with_plugins)
{
	msgpack_packer *pk = tw_builder_packer(b);
	msgpack_pack_map(pk, with_plugins ? 4 : 3);
	tw_pack_str(pk, "status");
	tw_pack_str(pk, "OK");
	tw_pack_str(pk, "time");
	msgpack_pack_double(pk, now_wall());
	tw_pack_str(pk, "heartbeat-interval");
	msgpack_pack_double(pk, heartbeat_interval(S.nworkers));
	if (with_plugins) {
		tw_pack_str(pk, "worker-plugins");
		msgpack_pack_map(pk, 0);
	}
}

static void reply_register_error(struct conn *c, const char *text)
{
	tw_builder *b = builder_new();
	msgpack_packer *pk = tw_builder_packer(b);
	say("register-worker refused: %s\n", text);
	msgpack_pack_map(pk, 3);
	tw_pack_str(pk, "status");
	tw_pack_str(pk, "error");
	tw_pack_str(pk, "message");
	tw_pack_str(pk, text);
	tw_pack_str(pk, "time");
	msgpack_pack_double(pk, now_wall());
	reply_send(c, b);
}

int op_register_worker(struct conn *c, tw_decoded **dp, const msgpack_object *req)
{
	const msgpack_object *nthreads = tw_map_get(req, "nthreads");
	const msgpack_object *nbytes = tw_map_get(req, "nbytes");
	const char *addr, *status = "running";
	size_t alen, slen = 7;
	struct worker *w, **tail;
	char text[400];
	/* Dask writes this reply although the request says reply: false. */
	c->no_reply = 0;
	if (obj_str(tw_map_get(req, "address"), &addr, &alen) != 0 || alen >= 256 ||
	    nthreads == NULL || nthreads->type != MSGPACK_OBJECT_POSITIVE_INTEGER) {
		reply_register_error(c, "register-worker needs address and nthreads");
		return 0;
	}
	if (worker_find(addr, alen) != NULL) {
		snprintf(text, sizeof(text), "Worker already exists %.*s", (int)alen, addr);
		reply_register_error(c, text);
		return 0;
	}
	if (nbytes != NULL && nbytes->type == MSGPACK_OBJECT_MAP && nbytes->via.map.size > 0) {
		snprintf(text, sizeof(text),
			 "Worker %.*s connected with %u key(s) in memory! Worker reconnection is "
			 "not supported.",
			 (int)alen, addr, nbytes->via.map.size);
		reply_register_error(c, text);
		return 0;
	}
	obj_str(tw_map_get(req, "status"), &status, &slen);
	if ((w = calloc(1, sizeof(*w))) == NULL || (w->address = strndup(addr, alen)) == NULL ||
	    tw_batched_new(c->comm, 5, &w->out) != 0) { /* Dask: BatchedSend(interval="5ms") */
		if (w != NULL)
			free(w->address);
		free(w);
		reply_error(c, "out of memory");
		return 0;
	}
	snprintf(w->status, sizeof(w->status), "%.*s", (int)slen, status);
	w->nthreads = (int64_t)nthreads->via.u64;
	w->last_seen = now_mono();
	w->reg = *dp; /* kept for identity: no copy of its fields */
	*dp = NULL;
	w->stream = c;
	c->refs++;
	c->mode = CONN_WORKER;
	c->worker = w;
	for (tail = &S.workers; *tail != NULL; tail = &(*tail)->next)
		;
	*tail = w;
	S.nworkers++;
	say("register worker %s (%lld threads, %s)\n", w->address, (long long)w->nthreads,
	    w->status);
	{
		tw_builder *b = builder_new();
		pack_status_reply(b, 1);
		reply_send(c, b);
	}
	return 0;
}

int op_heartbeat_worker(struct conn *c, tw_decoded **dp, const msgpack_object *req)
{
	const char *addr;
	size_t alen;
	struct worker *w = NULL;
	tw_builder *b = builder_new();
	if (obj_str(tw_map_get(req, "address"), &addr, &alen) == 0)
		w = worker_find(addr, alen);
	if (w == NULL) {
		/* The worker then shuts down, as with Dask. */
		msgpack_packer *pk = tw_builder_packer(b);
		msgpack_pack_map(pk, 1);
		tw_pack_str(pk, "status");
		tw_pack_str(pk, "missing");
	} else {
		w->last_seen = now_mono();
		tw_decoded_free(w->beat);
		w->beat = *dp; /* its metrics, for identity */
		*dp = NULL;
		pack_status_reply(b, 0);
	}
	reply_send(c, b);
	return 0;
}

int op_unregister(struct conn *c, const msgpack_object *req)
{
	const char *addr;
	size_t alen;
	struct worker *w = NULL;
	tw_builder *b = builder_new();
	if (obj_str(tw_map_get(req, "address"), &addr, &alen) == 0)
		w = worker_find(addr, alen);
	if (w != NULL)
		worker_remove(w, "it unregistered");
	tw_pack_str(tw_builder_packer(b), "OK");
	reply_send(c, b);
	return 0;
}

void worker_stream_op(struct worker *w, const msgpack_object *msg)
{
	const msgpack_object *op = tw_map_get(msg, "op");
	const char *s;
	size_t n;
	if (tw_obj_str_eq(op, "worker-status-change")) {
		if (obj_str(tw_map_get(msg, "status"), &s, &n) == 0)
			snprintf(w->status, sizeof(w->status), "%.*s", (int)n, s);
	} else if (tw_obj_str_eq(op, "add-keys")) {
		const msgpack_object *keys = tw_map_get(msg, "keys");
		if (keys != NULL && keys->type == MSGPACK_OBJECT_ARRAY)
			for (uint32_t i = 0; i < keys->via.array.size; i++)
				if (obj_str(&keys->via.array.ptr[i], &s, &n) == 0)
					keys_add_holder(s, n, w, 0);
	}
	/* keep-alive, log-event and the task ops: nothing to do here. */
}

void worker_remove(struct worker *w, const char *why)
{
	struct worker **p = &S.workers;
	struct conn *c = w->stream;
	char text[512];
	while (*p != w)
		p = &(*p)->next;
	*p = w->next;
	S.nworkers--;
	snprintf(text, sizeof(text), "worker %s was removed: %s", w->address, why);
	say("%s\n", text);
	wcall_fail_all(w, text);
	keys_worker_gone(w);
	tw_batched_free(w->out);
	if (c != NULL) {
		c->worker = NULL;
		if (c->comm != NULL)
			tw_comm_abort(c->comm);
		conn_release(c);
	}
	tw_decoded_free(w->reg);
	tw_decoded_free(w->beat);
	free(w->address);
	free(w);
}

void workers_check_ttl(void)
{
	double now = now_mono();
	struct worker *w = S.workers, *next;
	char why[128];
	for (; w != NULL; w = next) {
		next = w->next;
		if (now - w->last_seen > S.worker_ttl) {
			snprintf(why, sizeof(why), "no heartbeat for %.1f s (worker TTL %g s)",
				 now - w->last_seen, S.worker_ttl);
			worker_remove(w, why);
		}
	}
}

/* A value of the worker's register (or heartbeat) message, or nil. */
static void pack_field(tw_builder *b, const tw_decoded *d, const char *key)
{
	const msgpack_object *o = d ? tw_map_get(tw_decoded_root(d), key) : NULL;
	if (o == NULL || tw_builder_pack_object(b, d, o) != 0)
		msgpack_pack_nil(tw_builder_packer(b));
}

/* Dask's WorkerState.identity(). */
static void pack_worker_identity(tw_builder *b, const struct worker *w)
{
	msgpack_packer *pk = tw_builder_packer(b);
	const msgpack_object *extra = tw_map_get(tw_decoded_root(w->reg), "extra");
	uint32_t nextra = extra && extra->type == MSGPACK_OBJECT_MAP ? extra->via.map.size : 0;
	const char *host = strstr(w->address, "://");
	const char *end;
	host = host ? host + 3 : w->address;
	if ((end = strrchr(host, ':')) == NULL)
		end = host + strlen(host);
	if (*host == '[' && end > host + 1 && end[-1] == ']') /* [::1]:port */
		host++, end--;
	msgpack_pack_map(pk, 13 + nextra);
	tw_pack_str(pk, "type");
	tw_pack_str(pk, "Worker");
	tw_pack_str(pk, "id");
	pack_field(b, w->reg, "name");
	tw_pack_str(pk, "host");
	msgpack_pack_str(pk, (size_t)(end - host));
	msgpack_pack_str_body(pk, host, (size_t)(end - host));
	tw_pack_str(pk, "resources");
	pack_field(b, w->reg, "resources");
	tw_pack_str(pk, "local_directory");
	pack_field(b, w->reg, "local_directory");
	tw_pack_str(pk, "name");
	pack_field(b, w->reg, "name");
	tw_pack_str(pk, "nthreads");
	msgpack_pack_int64(pk, w->nthreads);
	tw_pack_str(pk, "memory_limit");
	pack_field(b, w->reg, "memory_limit");
	tw_pack_str(pk, "last_seen");
	msgpack_pack_double(pk, now_wall() - (now_mono() - w->last_seen));
	tw_pack_str(pk, "services");
	pack_field(b, w->reg, "services");
	tw_pack_str(pk, "metrics");
	pack_field(b, w->beat ? w->beat : w->reg, "metrics");
	tw_pack_str(pk, "status");
	tw_pack_str(pk, w->status);
	tw_pack_str(pk, "nanny");
	pack_field(b, w->reg, "nanny");
	for (uint32_t i = 0; i < nextra; i++) {
		msgpack_pack_object(pk, extra->via.map.ptr[i].key);
		if (tw_builder_pack_object(b, w->reg, &extra->via.map.ptr[i].val) != 0)
			msgpack_pack_nil(pk);
	}
}

/* Dask's Scheduler.identity(): what client.scheduler_info() shows. */
int op_identity(struct conn *c)
{
	tw_builder *b = builder_new();
	msgpack_packer *pk = tw_builder_packer(b);
	char id[64];
	snprintf(id, sizeof(id), "tw-mini-scheduler-%ld", (long)getpid());
	msgpack_pack_map(pk, 6);
	tw_pack_str(pk, "type");
	tw_pack_str(pk, "Scheduler");
	tw_pack_str(pk, "id");
	tw_pack_str(pk, id);
	tw_pack_str(pk, "address");
	tw_pack_str(pk, S.address);
	tw_pack_str(pk, "services");
	msgpack_pack_map(pk, 0);
	tw_pack_str(pk, "started");
	msgpack_pack_double(pk, S.started);
	tw_pack_str(pk, "workers");
	msgpack_pack_map(pk, (uint32_t)S.nworkers);
	for (struct worker *w = S.workers; w != NULL; w = w->next) {
		tw_pack_str(pk, w->address);
		pack_worker_identity(b, w);
	}
	reply_send(c, b);
	return 0;
}
