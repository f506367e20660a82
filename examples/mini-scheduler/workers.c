/* SPDX-License-Identifier: BSD-3-Clause */
/* The worker registry: Dask's Scheduler.add_worker (register-worker: a
 * reply on the same comm, which then stays the worker's stream:
 * tw_request_keep_stream), heartbeat_worker, remove_worker, and the
 * workers' part of identity (WorkerState.identity). A worker leaves when
 * its stream ends (tw_comm_watch_end), when it unregisters, or when its
 * heartbeats stop for the worker TTL (Dask's
 * distributed.scheduler.worker-ttl, checked by main.c); its calls then
 * fail at once (tw_pool_fail_address). */
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

/* The packed name of a register-worker request into sb (Dask: the
 * address when it has no name). */
static void pack_name(msgpack_sbuffer *sb, const msgpack_object *req)
{
	const msgpack_object *name = tw_msgpack_map_get(req, "name");
	msgpack_packer pk;
	msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
	if (name == NULL || name->type == MSGPACK_OBJECT_NIL)
		name = tw_msgpack_map_get(req, "address");
	msgpack_pack_object(&pk, *name);
}

/* w's packed name: the first pair of its identity fields, after "name". */
static int name_is(const struct worker *w, const char *packed, size_t len)
{
	return w->name_end - 5 == len && memcmp(w->ident.data + 5, packed, len) == 0;
}

struct worker *worker_named(const msgpack_object *o)
{
	msgpack_sbuffer sb;
	msgpack_packer pk;
	struct worker *w = S.workers;
	msgpack_sbuffer_init(&sb);
	msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
	msgpack_pack_object(&pk, *o);
	while (w != NULL && !name_is(w, sb.data, sb.size))
		w = w->next;
	msgpack_sbuffer_destroy(&sb);
	return w;
}

/* The worker a request's `address` names, coerced as Dask's
 * heartbeat_worker and remove_worker do; NULL when none. */
static struct worker *worker_at(const msgpack_object *address)
{
	char addr[512];
	struct exc e;
	if (address == NULL || coerce_address(address, addr, sizeof(addr), &e) != 0)
		return NULL;
	return worker_find(addr, strlen(addr));
}

static void pack_status_reply(msgpack_packer *pk, int with_plugins)
{
	msgpack_pack_map(pk, with_plugins ? 4 : 3);
	tw_msgpack_pack_str(pk, "status");
	tw_msgpack_pack_str(pk, "OK");
	tw_msgpack_pack_str(pk, "time");
	msgpack_pack_double(pk, now_wall());
	tw_msgpack_pack_str(pk, "heartbeat-interval");
	msgpack_pack_double(pk, heartbeat_interval(S.nworkers));
	if (with_plugins) {
		tw_msgpack_pack_str(pk, "worker-plugins");
		msgpack_pack_map(pk, 0);
	}
}

/* Dask's add_worker refuses with {"status": "error", ...} on the comm,
 * then closes it. */
static void refuse_worker(tw_request *r, tw_comm *comm, const char *text)
{
	msgpack_packer *pk = reply_packer(r);
	say("register-worker refused: %s\n", text);
	msgpack_pack_map(pk, 3);
	tw_msgpack_pack_str(pk, "status");
	tw_msgpack_pack_str(pk, "error");
	tw_msgpack_pack_str(pk, "message");
	tw_msgpack_pack_str(pk, text);
	tw_msgpack_pack_str(pk, "time");
	msgpack_pack_double(pk, now_wall());
	reply_send(r);
	tw_comm_close(comm);
	tw_comm_release(comm);
}

/* Dask's handle_worker `finally: remove_worker`: its stream ended. */
static void on_worker_end(tw_comm *comm, int err, void *arg)
{
	struct worker *w = arg;
	char why[300];
	w->watch = NULL; /* it ran: never unwatch it */
	snprintf(why, sizeof(why), "its stream ended: %s%s%s", err ? tw_strerror(err) : "closed",
		 *tw_comm_last_error(comm) ? ": " : "", tw_comm_last_error(comm));
	worker_remove(w, TW_ECLOSED, why, 0);
}

/* The fields of register-worker that identity shows, kept as map pairs
 * (metadata only: no payload rides in them). */
static void keep_ident(struct worker *w, const msgpack_object *req)
{
	static const char *const keys[] = {"name",         "resources", "local_directory",
					   "memory_limit", "services",  "nanny"};
	const msgpack_object *extra = tw_msgpack_map_get(req, "extra");
	msgpack_packer pk;
	msgpack_sbuffer_init(&w->ident);
	msgpack_sbuffer_init(&w->metrics);
	msgpack_packer_init(&pk, &w->ident, msgpack_sbuffer_write);
	for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
		const msgpack_object *o = tw_msgpack_map_get(req, keys[i]);
		tw_msgpack_pack_str(&pk, keys[i]);
		if (i == 0)
			pack_name(&w->ident, req); /* keys[0]: "name" */
		else if (o != NULL)
			msgpack_pack_object(&pk, *o);
		else
			msgpack_pack_nil(&pk);
		if (w->nident++ == 0)
			w->name_end = w->ident.size;
	}
	for (uint32_t i = 0; extra && extra->type == MSGPACK_OBJECT_MAP && i < extra->via.map.size;
	     i++) {
		msgpack_pack_object(&pk, extra->via.map.ptr[i].key);
		msgpack_pack_object(&pk, extra->via.map.ptr[i].val);
		w->nident++;
	}
	if ((extra = tw_msgpack_map_get(req, "metrics")) != NULL) {
		msgpack_packer_init(&pk, &w->metrics, msgpack_sbuffer_write);
		msgpack_pack_object(&pk, *extra);
	}
}

/* Dask's add_worker: "name taken, <name>" when a worker has it. */
static int name_taken(const msgpack_object *req, char *text, size_t len)
{
	msgpack_sbuffer sb;
	const char *s = "?";
	size_t n = 1;
	int taken = 0;
	msgpack_sbuffer_init(&sb);
	pack_name(&sb, req);
	for (struct worker *w = S.workers; w != NULL && !taken; w = w->next)
		taken = name_is(w, sb.data, sb.size);
	msgpack_sbuffer_destroy(&sb);
	if (taken) {
		obj_str(tw_msgpack_map_get(req, "name"), &s, &n);
		snprintf(text, len, "name taken, %.*s", (int)(n > 200 ? 200 : n), s);
	}
	return taken;
}

/* Dask's Scheduler.add_worker: the reply goes on the same comm (although
 * the request says reply: false), which then stays the worker's stream
 * (handle_worker). */
void op_register_worker(tw_request *r, void *arg)
{
	const msgpack_object *req = tw_decoded_root(tw_request_decoded(r));
	const msgpack_object *nthreads = tw_msgpack_map_get(req, "nthreads");
	const msgpack_object *nbytes = tw_msgpack_map_get(req, "nbytes");
	const msgpack_object *address = tw_msgpack_map_get(req, "address");
	const char *status = "running";
	size_t alen = 0, slen = 7;
	struct worker *w, **tail;
	tw_comm *comm;
	char text[400], addr[512];
	struct exc e;
	(void)arg;
	if (tw_request_keep_stream(r, &comm) != 0) { /* it left */
		reply_send(r);
		return;
	}
	if (address == NULL || address->type != MSGPACK_OBJECT_STR || nthreads == NULL ||
	    nthreads->type != MSGPACK_OBJECT_POSITIVE_INTEGER) {
		refuse_worker(r, comm, "register-worker needs address and nthreads");
		return;
	}
	/* Dask's add_worker: coerce_address(address) */
	if (coerce_address(address, addr, sizeof(addr), &e) != 0 || (alen = strlen(addr)) >= 256) {
		snprintf(text, sizeof(text), "register-worker: bad address: %s: %.300s", e.type,
			 e.text);
		refuse_worker(r, comm, alen >= 256 ? "register-worker: address too long" : text);
		return;
	}
	if (worker_find(addr, alen) != NULL) {
		snprintf(text, sizeof(text), "Worker already exists %.*s", (int)alen, addr);
		refuse_worker(r, comm, text);
		return;
	}
	if (name_taken(req, text, sizeof(text))) {
		refuse_worker(r, comm, text);
		return;
	}
	if (nbytes != NULL && nbytes->type == MSGPACK_OBJECT_MAP && nbytes->via.map.size > 0) {
		snprintf(text, sizeof(text),
			 "Worker %.*s connected with %u key(s) in memory! Worker reconnection is "
			 "not supported.",
			 (int)alen, addr, nbytes->via.map.size);
		refuse_worker(r, comm, text);
		return;
	}
	obj_str(tw_msgpack_map_get(req, "status"), &status, &slen);
	if ((w = calloc(1, sizeof(*w))) == NULL || (w->address = strndup(addr, alen)) == NULL ||
	    tw_batched_new(comm, 5, &w->out) != 0 || /* Dask: BatchedSend(interval="5ms") */
	    tw_comm_watch_end(comm, on_worker_end, w, &w->watch) != 0) {
		fputs("tw-mini-scheduler: out of memory\n", stderr);
		exit(1);
	}
	w->comm = comm;
	snprintf(w->status, sizeof(w->status), "%.*s", (int)slen, status);
	w->nthreads = (int64_t)nthreads->via.u64;
	w->last_seen = now_mono();
	keep_ident(w, req);
	for (tail = &S.workers; *tail != NULL; tail = &(*tail)->next)
		;
	*tail = w;
	S.nworkers++;
	say("register worker %s (%lld threads, %s)\n", w->address, (long long)w->nthreads,
	    w->status);
	pack_status_reply(reply_packer(r), 1);
	reply_send(r);
}

void op_heartbeat_worker(tw_request *r, void *arg)
{
	const msgpack_object *metrics = tw_request_arg(r, "metrics");
	struct worker *w = worker_at(tw_request_arg(r, "address"));
	msgpack_packer *pk = reply_packer(r);
	(void)arg;
	if (w == NULL) {
		/* The worker then shuts down, as with Dask. */
		msgpack_pack_map(pk, 1);
		tw_msgpack_pack_str(pk, "status");
		tw_msgpack_pack_str(pk, "missing");
	} else {
		w->last_seen = now_mono();
		if (metrics != NULL) { /* for identity */
			msgpack_packer mp;
			w->metrics.size = 0;
			msgpack_packer_init(&mp, &w->metrics, msgpack_sbuffer_write);
			msgpack_pack_object(&mp, *metrics);
		}
		pack_status_reply(pk, 0);
	}
	reply_send(r);
}

void op_unregister(tw_request *r, void *arg)
{
	struct worker *w = worker_at(tw_request_arg(r, "address"));
	(void)arg;
	if (w != NULL)
		worker_remove(w, TW_ECLOSED, "it unregistered", 0);
	tw_msgpack_pack_str(reply_packer(r), "OK");
	reply_send(r);
}

/* Dask's handle_worker stream handlers this scheduler needs; keep-alive,
 * log-event and the task ops are skipped (no handler). */
void worker_stream_op(tw_comm *comm, const tw_decoded *d, const msgpack_object *msg, void *arg)
{
	const msgpack_object *op = tw_msgpack_map_get(msg, "op");
	struct worker *w = S.workers;
	const char *s;
	size_t n;
	(void)d;
	(void)arg;
	while (w != NULL && w->comm != comm) /* the comm a worker's stream came on */
		w = w->next;
	if (w == NULL)
		return;
	if (tw_msgpack_str_eq(op, "worker-status-change")) {
		if (obj_str(tw_msgpack_map_get(msg, "status"), &s, &n) == 0)
			snprintf(w->status, sizeof(w->status), "%.*s", (int)n, s);
	} else if (tw_msgpack_str_eq(op, "add-keys")) {
		const msgpack_object *keys = tw_msgpack_map_get(msg, "keys");
		if (keys != NULL && keys->type == MSGPACK_OBJECT_ARRAY)
			for (uint32_t i = 0; i < keys->via.array.size; i++)
				if (obj_str(&keys->via.array.ptr[i], &s, &n) == 0)
					keys_add_holder(s, n, w, 0);
	}
}

/* Unlinked first, so nothing that runs from here (failed calls' callbacks
 * inside tw_pool_fail_address) finds it. */
void worker_remove(struct worker *w, int err, const char *why, int close)
{
	struct worker **p = &S.workers;
	char text[512];
	while (*p != w)
		p = &(*p)->next;
	*p = w->next;
	S.nworkers--;
	snprintf(text, sizeof(text), "worker %s was removed: %s", w->address, why);
	say("%s\n", text);
	tw_pool_fail_address(S.pool, w->address, err, text);
	keys_worker_gone(w);
	if (w->watch != NULL)
		tw_comm_unwatch(w->watch);
	if (close) /* Dask: the worker closes itself on this */
		stream_send_op(w->out, "close", "reason", "scheduler-remove-worker", 23);
	tw_batched_free(w->out); /* flushes */
	if (close)
		tw_comm_close(w->comm); /* what is queued goes first */
	else
		tw_comm_abort(w->comm); /* a no-op once it ended */
	tw_comm_release(w->comm);
	msgpack_sbuffer_destroy(&w->ident);
	msgpack_sbuffer_destroy(&w->metrics);
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
			worker_remove(w, TW_ETIMEDOUT, why, 0);
		}
	}
}

/* Dask's WorkerState.identity(). */
static void pack_worker_identity(msgpack_packer *pk, const struct worker *w)
{
	const char *host = strstr(w->address, "://");
	const char *end;
	host = host ? host + 3 : w->address;
	if ((end = strrchr(host, ':')) == NULL)
		end = host + strlen(host);
	if (*host == '[' && end > host + 1 && end[-1] == ']') /* [::1]:port */
		host++, end--;
	msgpack_pack_map(pk, 7 + w->nident);
	tw_msgpack_pack_str(pk, "type");
	tw_msgpack_pack_str(pk, "Worker");
	tw_msgpack_pack_str(pk, "id");
	/* the name's value: the first pair kept, after its key "name" */
	pk->callback(pk->data, w->ident.data + 5, w->name_end - 5);
	tw_msgpack_pack_str(pk, "host");
	pack_strn(pk, host, (size_t)(end - host));
	tw_msgpack_pack_str(pk, "nthreads");
	msgpack_pack_int64(pk, w->nthreads);
	tw_msgpack_pack_str(pk, "last_seen");
	msgpack_pack_double(pk, now_wall() - (now_mono() - w->last_seen));
	tw_msgpack_pack_str(pk, "metrics");
	if (w->metrics.size > 0)
		pk->callback(pk->data, w->metrics.data, w->metrics.size);
	else
		msgpack_pack_nil(pk);
	tw_msgpack_pack_str(pk, "status");
	tw_msgpack_pack_str(pk, w->status);
	pk->callback(pk->data, w->ident.data, w->ident.size);
}

/* Dask's Scheduler.identity(): what client.scheduler_info() shows. */
void op_identity(tw_request *r, void *arg)
{
	msgpack_packer *pk = reply_packer(r);
	char id[64];
	(void)arg;
	snprintf(id, sizeof(id), "tw-mini-scheduler-%ld", (long)getpid());
	msgpack_pack_map(pk, 6);
	tw_msgpack_pack_str(pk, "type");
	tw_msgpack_pack_str(pk, "Scheduler");
	tw_msgpack_pack_str(pk, "id");
	tw_msgpack_pack_str(pk, id);
	tw_msgpack_pack_str(pk, "address");
	tw_msgpack_pack_str(pk, S.address);
	tw_msgpack_pack_str(pk, "services");
	msgpack_pack_map(pk, 0);
	tw_msgpack_pack_str(pk, "started");
	msgpack_pack_double(pk, S.started);
	tw_msgpack_pack_str(pk, "workers");
	msgpack_pack_map(pk, (uint32_t)S.nworkers);
	for (struct worker *w = S.workers; w != NULL; w = w->next) {
		tw_msgpack_pack_str(pk, w->address);
		pack_worker_identity(pk, w);
	}
	reply_send(r);
}
