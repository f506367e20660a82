/* SPDX-License-Identifier: BSD-3-Clause */
/* Keys and clients: Dask's Scheduler.scatter (scatter_to_workers:
 * update_data on workers, round robin by threads), gather
 * (gather_from_workers: get_data on workers; the pool writes the "OK"
 * after each reply, TW_CALL_ACK_OK), get_who_has, get_ncores, add_client
 * (the request's comm kept as the client's stream) and the client stream
 * ops. Payloads are never decoded here: tw_builder_pack_object forwards
 * the frames a request or reply brought, by reference. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>

#include "examples/mini-scheduler/sched.h"

struct key {
	struct worker **who; /* holders */
	uint32_t nwho, cwho;
	struct client **wants;
	uint32_t nwants, cwants;
	uint64_t nbytes;
	size_t len;
	char name[];
};

static int push(void *arrp, uint32_t *n, uint32_t *cap, void *p)
{
	void ***arr = arrp;
	for (uint32_t i = 0; i < *n; i++)
		if ((*arr)[i] == p)
			return 0;
	if (*n == *cap) {
		uint32_t c = *cap ? 2 * *cap : 2;
		void **a = realloc(*arr, c * sizeof(void *));
		if (a == NULL)
			abort();
		*arr = a;
		*cap = c;
	}
	(*arr)[(*n)++] = p;
	return 1;
}

static int drop(void **arr, uint32_t *n, void *p)
{
	for (uint32_t i = 0; i < *n; i++)
		if (arr[i] == p) {
			arr[i] = arr[--*n];
			return 1;
		}
	return 0;
}

static void key_free(struct key *k)
{
	free(k->who);
	free(k->wants);
	free(k);
}

static struct key *key_get_or_add(const char *name, size_t len)
{
	struct key *k = table_get(&S.keys, name, len);
	if (k != NULL)
		return k;
	if ((k = calloc(1, sizeof(*k) + len + 1)) == NULL)
		abort();
	k->len = len;
	memcpy(k->name, name, len);
	if (table_put(&S.keys, name, len, k) != 0)
		abort();
	return k;
}

void keys_add_holder(const char *name, size_t len, struct worker *w, uint64_t nbytes)
{
	struct key *k = key_get_or_add(name, len);
	push(&k->who, &k->nwho, &k->cwho, w);
	if (nbytes)
		k->nbytes = nbytes;
}

/* One {"op": op, "key": k} to a client's stream (Dask's report). */
static void report_key(struct client *cl, const char *op, const char *name, size_t len)
{
	stream_send_op(cl->out, op, "key", name, len);
}

/* free-keys to workers, gathered per worker in w->tmp (Dask's
 * transition to forgotten sends {"op": "free-keys", "keys": [...]}). */
struct freelist {
	msgpack_sbuffer names;
	uint32_t n;
};

static void free_add(struct worker *w, const struct key *k)
{
	struct freelist *f = w->tmp;
	msgpack_packer pk;
	if (f == NULL) {
		if ((f = w->tmp = calloc(1, sizeof(*f))) == NULL)
			abort();
		msgpack_sbuffer_init(&f->names);
	}
	msgpack_packer_init(&pk, &f->names, msgpack_sbuffer_write);
	pack_strn(&pk, k->name, k->len);
	f->n++;
}

static void free_flush(const char *stimulus)
{
	for (struct worker *w = S.workers; w != NULL; w = w->next) {
		struct freelist *f = w->tmp;
		msgpack_sbuffer sb;
		msgpack_packer pk;
		char id[96];
		if (f == NULL)
			continue;
		snprintf(id, sizeof(id), "%s-%.6f", stimulus, now_wall());
		msgpack_sbuffer_init(&sb);
		msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
		msgpack_pack_map(&pk, 3);
		tw_msgpack_pack_str(&pk, "op");
		tw_msgpack_pack_str(&pk, "free-keys");
		tw_msgpack_pack_str(&pk, "keys");
		msgpack_pack_array(&pk, f->n);
		msgpack_sbuffer_write(&sb, f->names.data, f->names.size);
		tw_msgpack_pack_str(&pk, "stimulus_id");
		tw_msgpack_pack_str(&pk, id);
		stream_send(w->out, &sb);
		msgpack_sbuffer_destroy(&sb);
		msgpack_sbuffer_destroy(&f->names);
		free(f);
		w->tmp = NULL;
	}
}

/* A key nobody wants any more is forgotten: its holders free it. */
static void key_forget(struct key *k)
{
	for (uint32_t i = 0; i < k->nwho; i++)
		free_add(k->who[i], k);
	key_free(k);
}

static void release_keys(struct client *cl, const msgpack_object *keys)
{
	const char *s;
	size_t n;
	if (keys == NULL || keys->type != MSGPACK_OBJECT_ARRAY)
		return;
	for (uint32_t i = 0; i < keys->via.array.size; i++) {
		struct key *k;
		if (obj_str(&keys->via.array.ptr[i], &s, &n) != 0 ||
		    (k = table_get(&S.keys, s, n)) == NULL)
			continue;
		if (drop((void **)k->wants, &k->nwants, cl) && k->nwants == 0) {
			table_del(&S.keys, s, n);
			key_forget(k);
		}
	}
	free_flush("client-releases-keys");
}

static int worker_gone_filter(void *val, void *arg)
{
	struct key *k = val;
	if (!drop((void **)k->who, &k->nwho, arg) || k->nwho > 0)
		return 0;
	/* Lost: Dask's remove_worker forgets pure data, and report_on_key
	 * tells the clients that wanted it. */
	for (uint32_t i = 0; i < k->nwants; i++)
		report_key(k->wants[i], "cancelled-key", k->name, k->len);
	key_free(k);
	return 1;
}

void keys_worker_gone(struct worker *w)
{
	table_filter(&S.keys, worker_gone_filter, w);
}

static int client_gone_filter(void *val, void *arg)
{
	struct key *k = val;
	if (!drop((void **)k->wants, &k->nwants, arg) || k->nwants > 0)
		return 0;
	key_forget(k);
	return 1;
}

void client_remove(struct client *cl)
{
	struct client **p = &S.clients;
	while (*p != cl)
		p = &(*p)->next;
	*p = cl->next;
	say("remove client %s\n", cl->id);
	table_filter(&S.keys, client_gone_filter, cl);
	free_flush("remove-client");
	if (cl->watch != NULL)
		tw_comm_unwatch(cl->watch);
	tw_batched_free(cl->out);
	tw_comm_release(cl->comm);
	free(cl->id);
	free(cl);
}

/* Dask's add_client `finally: remove_client`; an end with an error
 * (TW_ENOMEM: the memory limit ended it) is logged first. */
static void on_client_end(tw_comm *comm, int err, void *arg)
{
	struct client *cl = arg;
	if (err != 0)
		say("client %s: its stream ended: %s: %s\n", cl->id, tw_strerror(err),
		    tw_comm_last_error(comm));
	cl->watch = NULL; /* it ran: never unwatch it */
	client_remove(cl);
}

/* Dask's add_client: [{"op": "stream-start"}] on the same comm, which
 * then stays the client's stream (handle_stream). */
void op_register_client(tw_request *r, void *arg)
{
	const char *id;
	size_t n;
	struct client *cl;
	tw_comm *comm;
	msgpack_packer *pk;
	(void)arg;
	if (tw_request_keep_stream(r, &comm) != 0) { /* it left */
		reply_send(r);
		return;
	}
	if (obj_str(tw_request_arg(r, "client"), &id, &n) != 0) {
		reply_error(r, "register-client needs client");
		tw_comm_close(comm);
		tw_comm_release(comm);
		return;
	}
	if ((cl = calloc(1, sizeof(*cl))) == NULL || (cl->id = strndup(id, n)) == NULL ||
	    tw_batched_new(comm, 2, &cl->out) != 0 || /* Dask: BatchedSend(interval="2ms") */
	    tw_comm_watch_end(comm, on_client_end, cl, &cl->watch) != 0)
		abort();
	cl->comm = comm;
	cl->next = S.clients;
	S.clients = cl;
	say("register client %s\n", cl->id);
	pk = reply_packer(r);
	msgpack_pack_array(pk, 1);
	msgpack_pack_map(pk, 1);
	tw_msgpack_pack_str(pk, "op");
	tw_msgpack_pack_str(pk, "stream-start");
	reply_send(r);
}

/* Dask's client_desires_keys, for keys that exist (scattered data: in
 * memory, so reported at once, as report_on_key does; without it a
 * Future(key, client=other) never finished, user19); an unknown key is
 * reported cancelled. */
static void want_keys(struct client *cl, const msgpack_object *keys)
{
	const char *s;
	size_t n;
	struct key *k;
	if (keys == NULL || keys->type != MSGPACK_OBJECT_ARRAY)
		return;
	for (uint32_t i = 0; i < keys->via.array.size; i++) {
		if (obj_str(&keys->via.array.ptr[i], &s, &n) != 0)
			continue;
		if ((k = table_get(&S.keys, s, n)) != NULL) {
			push(&k->wants, &k->nwants, &k->cwants, cl);
			report_key(cl, "key-in-memory", s, n);
		} else {
			report_key(cl, "cancelled-key", s, n);
		}
	}
}

void client_stream_op(tw_comm *comm, const tw_decoded *d, const msgpack_object *msg, void *arg)
{
	const msgpack_object *op = tw_msgpack_map_get(msg, "op");
	struct client *cl = S.clients;
	(void)d;
	(void)arg;
	while (cl != NULL && cl->comm != comm) /* the comm a client's stream came on */
		cl = cl->next;
	if (cl == NULL)
		return;
	if (tw_msgpack_str_eq(op, "client-releases-keys")) {
		release_keys(cl, tw_msgpack_map_get(msg, "keys"));
	} else if (tw_msgpack_str_eq(op, "report-key")) {
		/* Dask's report_on_key: a key in memory, or one the scheduler
		 * does not know (lost with its worker): cancelled. */
		const char *s;
		size_t n;
		if (obj_str(tw_msgpack_map_get(msg, "key"), &s, &n) == 0)
			report_key(cl, table_get(&S.keys, s, n) ? "key-in-memory" : "cancelled-key",
				   s, n);
	} else if (tw_msgpack_str_eq(op, "client-desires-keys")) {
		want_keys(cl, tw_msgpack_map_get(msg, "keys"));
	}
	/* heartbeat-client, close-client: skipped (the stream's end
	 * removes the client). */
}

/* --- scatter --- */

/* Copies a worker fetches from the first holder (broadcast of relayed
 * payloads: Dask's scatter, then replicate, which asks each worker to
 * `gather` from the holders, so the scheduler never carries the copies). */
struct replica {
	struct scatter_op *op;
	char *address;         /* the worker that fetches */
	msgpack_sbuffer who;   /* who_has entries: {key: [holder]} */
	msgpack_sbuffer names; /* the keys, packed, to record the new holder */
	uint32_t n;
};

struct scatter_op {
	tw_request *r; /* replied when every part is done */
	int pending;
	int failed;
	char why[400];
	char *client;
	char peer[256];          /* the requester's address, for the log */
	uint64_t bytes, relayed; /* its payloads' bytes, those relayed */
	uint32_t nkeys;
	msgpack_sbuffer keys;  /* the reply: an array of the keys, in order */
	struct replica **reps; /* per worker of the scatter, or NULL */
	size_t nreps;
	int replicating;
};

static void replicate(struct scatter_op *op);
static void replica_free(struct replica *rp);

struct scatter_part {
	struct scatter_op *op;
	char *address;
};

static void scatter_done(struct scatter_op *op)
{
	if (!op->failed && op->reps != NULL && !op->replicating) {
		replicate(op); /* scatter_done again when the copies are made */
		return;
	}
	for (size_t j = 0; j < op->nreps; j++) /* a failed scatter copies nothing */
		if (op->reps[j] != NULL)
			replica_free(op->reps[j]);
	free(op->reps);
	if (op->failed) {
		/* A client cut in the middle of a relayed payload ends here too
		 * (the update_data it fed was cut short). */
		say("scatter from %s failed: %s (%u key(s), %.1f MiB of payloads, %.1f MiB "
		    "relayed): nothing recorded\n",
		    op->peer, op->why, op->nkeys, (double)op->bytes / (1 << 20),
		    (double)op->relayed / (1 << 20));
		reply_error(op->r, op->why);
	} else {
		msgpack_packer *pk = reply_packer(op->r);
		pk->callback(pk->data, op->keys.data, op->keys.size);
		reply_send(op->r);
	}
	msgpack_sbuffer_destroy(&op->keys);
	free(op->client);
	free(op);
}

static void scatter_part_done(struct scatter_part *part, int err, const char *why)
{
	struct scatter_op *op = part->op;
	if (err != 0 && !op->failed) {
		op->failed = 1;
		snprintf(op->why, sizeof(op->why), "scatter to %s failed: %s", part->address, why);
	}
	free(part->address);
	free(part);
	if (--op->pending == 0)
		scatter_done(op);
}

/* The worker holds the keys its update_data reply names (nbytes). */
static void on_update_data(tw_call *call, int err, tw_decoded *reply, void *arg)
{
	struct scatter_part *part = arg;
	struct scatter_op *op = part->op;
	struct worker *w = worker_find(part->address, strlen(part->address));
	const msgpack_object *nbytes =
		reply ? tw_msgpack_map_get(tw_decoded_root(reply), "nbytes") : NULL;
	struct client *cl = S.clients;
	const char *why = err ? tw_call_error(call) : NULL;
	if (err == 0 && (w == NULL || nbytes == NULL || nbytes->type != MSGPACK_OBJECT_MAP)) {
		err = TW_EPROTO;
		why = w ? "update_data replied without nbytes" : "the worker was removed";
	}
	while (cl != NULL && strcmp(cl->id, op->client) != 0)
		cl = cl->next;
	for (uint32_t i = 0; err == 0 && i < nbytes->via.map.size; i++) {
		const msgpack_object_kv *kv = &nbytes->via.map.ptr[i];
		const char *s;
		size_t n;
		struct key *k;
		if (obj_str(&kv->key, &s, &n) != 0)
			continue;
		k = key_get_or_add(s, n);
		push(&k->who, &k->nwho, &k->cwho, w);
		if (kv->val.type == MSGPACK_OBJECT_POSITIVE_INTEGER)
			k->nbytes = kv->val.via.u64;
		if (cl != NULL)
			push(&k->wants, &k->nwants, &k->cwants, cl);
	}
	tw_decoded_free(reply);
	scatter_part_done(part, err, why);
}

static void replica_free(struct replica *rp)
{
	msgpack_sbuffer_destroy(&rp->who);
	msgpack_sbuffer_destroy(&rp->names);
	free(rp->address);
	free(rp);
}

/* A worker's `gather` reply ({"status": "OK"} or "partial-fail"): it
 * holds the copies now (Dask's gather_on_worker; the worker stores them
 * with report=False, so the scheduler records them itself). */
static void on_replicated(tw_call *call, int err, tw_decoded *reply, void *arg)
{
	struct replica *rp = arg;
	struct scatter_op *op = rp->op;
	struct worker *w = worker_find(rp->address, strlen(rp->address));
	const msgpack_object *root = reply ? tw_decoded_root(reply) : NULL;
	if (err != 0 || w == NULL || !tw_msgpack_str_eq(tw_msgpack_map_get(root, "status"), "OK")) {
		say("replicate to %s failed: %s\n", rp->address,
		    err ? tw_call_error(call) : "the worker did not get every copy");
	} else {
		msgpack_unpacked k;
		size_t off = 0;
		msgpack_unpacked_init(&k);
		while (msgpack_unpack_next(&k, rp->names.data, rp->names.size, &off) ==
		       MSGPACK_UNPACK_SUCCESS) {
			const char *s;
			size_t n;
			if (obj_str(&k.data, &s, &n) == 0)
				keys_add_holder(s, n, w, 0);
		}
		msgpack_unpacked_destroy(&k);
	}
	tw_decoded_free(reply);
	replica_free(rp);
	if (--op->pending == 0)
		scatter_done(op);
}

static void replicate(struct scatter_op *op)
{
	op->replicating = 1;
	op->pending = 1; /* until every call is out */
	for (size_t j = 0; j < op->nreps; j++) {
		struct replica *rp = op->reps[j];
		tw_builder *b;
		msgpack_packer *pk;
		tw_msg *m;
		int rv;
		if (rp == NULL)
			continue;
		op->reps[j] = NULL;
		if (rp->n == 0) {
			replica_free(rp);
			continue;
		}
		b = request_new("gather", 1);
		pk = tw_builder_packer(b);
		tw_msgpack_pack_str(pk, "who_has");
		msgpack_pack_map(pk, rp->n);
		pk->callback(pk->data, rp->who.data, rp->who.size);
		op->pending++;
		m = builder_done(b);
		if ((rv = tw_pool_call(S.pool, rp->address, m, 0, on_replicated, rp, NULL)) != 0) {
			tw_msg_free(m);
			say("replicate to %s not sent: %s\n", rp->address, tw_strerror(rv));
			replica_free(rp);
			op->pending--;
		}
	}
	if (--op->pending == 0)
		scatter_done(op);
}

/* The bytes of d's payloads, and of those relayed (still in the
 * source's socket). */
static void payload_bytes(const tw_decoded *d, uint64_t *all, uint64_t *relayed)
{
	*all = *relayed = 0;
	for (size_t i = 0; i < tw_decoded_npayloads(d); i++) {
		const tw_payload *p = tw_decoded_payload_at(d, i);
		for (size_t j = 0; j < p->nframes; j++) {
			*all += p->frames[j].len;
			if (p->relay_sub_header != NULL)
				*relayed += p->frames[j].len;
		}
	}
}

/* Whether a payload of d is still in its source's socket (relay). */
static int has_relay(const tw_decoded *d)
{
	for (size_t i = 0; i < tw_decoded_npayloads(d); i++)
		if (tw_decoded_payload_at(d, i)->relay_sub_header != NULL)
			return 1;
	return 0;
}

/* Key kv->key to worker wl[to] as a copy fetched from wl[from]. */
static void add_replica(struct scatter_op *op, struct worker **wl, size_t to, size_t from,
			const msgpack_object *key)
{
	struct replica *rp = op->reps[to];
	msgpack_packer pk;
	if (rp == NULL) {
		if ((rp = op->reps[to] = calloc(1, sizeof(*rp))) == NULL ||
		    (rp->address = strdup(wl[to]->address)) == NULL)
			abort();
		rp->op = op;
		msgpack_sbuffer_init(&rp->who);
		msgpack_sbuffer_init(&rp->names);
	}
	msgpack_packer_init(&pk, &rp->who, msgpack_sbuffer_write);
	msgpack_pack_object(&pk, *key);
	msgpack_pack_array(&pk, 1);
	tw_msgpack_pack_str(&pk, wl[from]->address);
	msgpack_packer_init(&pk, &rp->names, msgpack_sbuffer_write);
	msgpack_pack_object(&pk, *key);
	rp->n++;
}

/* update_data's request header; the data map of n pairs follows. */
static tw_builder *update_data_begin(uint32_t n)
{
	tw_builder *b = request_new("update_data", 2);
	msgpack_packer *pk = tw_builder_packer(b);
	tw_msgpack_pack_str(pk, "report");
	msgpack_pack_false(pk);
	tw_msgpack_pack_str(pk, "data");
	msgpack_pack_map(pk, n);
	return b;
}

/* How many workers get each key: 1, or with broadcast (Dask's scatter
 * then replicate) all of them (true) or n of them. */
static size_t copies(const msgpack_object *broadcast, size_t nworkers)
{
	if (broadcast == NULL)
		return 1;
	if (broadcast->type == MSGPACK_OBJECT_BOOLEAN)
		return broadcast->via.boolean ? nworkers : 1;
	if (broadcast->type == MSGPACK_OBJECT_POSITIVE_INTEGER && broadcast->via.u64 > 0)
		return broadcast->via.u64 < nworkers ? (size_t)broadcast->via.u64 : nworkers;
	return 1;
}

/* Send the parts: one update_data per worker through the pool. */
static void scatter_send(struct scatter_op *op, struct worker **wl, tw_builder **builders,
			 size_t nw)
{
	op->pending = 1; /* until every call is out */
	for (size_t j = 0; j < nw; j++) {
		struct scatter_part *part;
		tw_msg *m;
		int rv;
		if (builders[j] == NULL)
			continue;
		m = builder_done(builders[j]);
		if ((part = calloc(1, sizeof(*part))) == NULL ||
		    (part->address = strdup(wl[j]->address)) == NULL)
			abort();
		part->op = op;
		op->pending++;
		rv = tw_pool_call(S.pool, part->address, m, 0, on_update_data, part, NULL);
		if (rv != 0) {
			tw_msg_free(m);
			scatter_part_done(part, rv, tw_strerror(rv));
		}
	}
	if (--op->pending == 0)
		scatter_done(op);
}

/* The index of the worker that round-robin slot `slot` falls on: the
 * first j with cum[j] > slot (cum: threads summed, increasing). */
static size_t slot_worker(const uint64_t *cum, size_t n, uint64_t slot)
{
	size_t lo = 0, hi = n - 1;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (cum[mid] > slot)
			hi = mid;
		else
			lo = mid + 1;
	}
	return lo;
}

/* Dask's scatter_to_workers: keys go round robin over the running
 * workers, each repeated by its threads (with broadcast, to the next
 * workers too); one update_data per worker, whose values are the
 * client's payloads, forwarded by reference (tw_builder_pack_object),
 * never decoded. Returns 1, with r untouched, when no running worker
 * (of `only`) is there; else 0 (r is answered when done). */
static int scatter_start(tw_request *r, const struct addrs *only)
{
	static uint64_t round_robin;
	const tw_decoded *d = tw_request_decoded(r);
	const msgpack_object *data = tw_request_arg(r, "data");
	struct worker **wl;
	uint64_t *cum, nslots = 0; /* cum[j]: threads of wl[0..j], summed */
	size_t nw = 0, ncopies, sent = 0;
	uint32_t *counts;
	tw_builder **builders;
	struct scatter_op *op;
	msgpack_packer kp;
	const char *client = "";
	size_t clen = 0;
	if ((wl = calloc(S.nworkers + 1, sizeof(*wl))) == NULL ||
	    (cum = calloc(S.nworkers + 1, sizeof(*cum))) == NULL)
		abort();
	/* Each worker repeated by its threads, as a count per worker, not a
	 * slot per thread: a worker may claim any nthreads (2**40 made the
	 * loop allocate a slot per thread and serve nobody). At most
	 * UINT32_MAX per worker, so the sum cannot wrap. */
	for (struct worker *w = S.workers; w != NULL; w = w->next) {
		uint64_t t = w->nthreads > 0 ? (uint64_t)w->nthreads : 1;
		if (strcmp(w->status, "running") != 0 || !addrs_has(only, w->address))
			continue;
		wl[nw] = w;
		nslots += t < UINT32_MAX ? t : UINT32_MAX;
		cum[nw++] = nslots;
	}
	if (nw == 0) {
		free(wl);
		free(cum);
		return 1;
	}
	ncopies = copies(tw_request_arg(r, "broadcast"), nw);
	if ((counts = calloc(nw, sizeof(*counts))) == NULL ||
	    (builders = calloc(nw, sizeof(*builders))) == NULL ||
	    (op = calloc(1, sizeof(*op))) == NULL)
		abort();
	/* Relayed payloads go out once (a relay frame is written once):
	 * the other copies are fetched by the workers from the first. */
	if (ncopies > 1 && has_relay(d)) {
		if ((op->reps = calloc(nw, sizeof(*op->reps))) == NULL)
			abort();
		op->nreps = nw;
		sent = 1;
	}
	/* Count per worker (index j in wl), then pack: key i goes to worker
	 * first(i) and the ncopies - 1 after it in wl. */
#define FIRST(i) slot_worker(cum, nw, (round_robin + (i)) % nslots)
	if (sent == 0)
		sent = ncopies;
	for (uint32_t i = 0; i < data->via.map.size; i++)
		for (size_t c = 0; c < sent; c++)
			counts[(FIRST(i) + c) % nw]++;
	for (size_t j = 0; j < nw; j++)
		if (counts[j] > 0)
			builders[j] = update_data_begin(counts[j]);
	msgpack_sbuffer_init(&op->keys);
	msgpack_packer_init(&kp, &op->keys, msgpack_sbuffer_write);
	msgpack_pack_array(&kp, data->via.map.size);
	for (uint32_t i = 0; i < data->via.map.size; i++) {
		const msgpack_object_kv *kv = &data->via.map.ptr[i];
		for (size_t c = 0; c < sent; c++) {
			tw_builder *b = builders[(FIRST(i) + c) % nw];
			msgpack_pack_object(tw_builder_packer(b), kv->key);
			if (tw_builder_pack_object(b, d, &kv->val) != 0)
				abort();
		}
		for (size_t c = sent; c < ncopies; c++)
			add_replica(op, wl, (FIRST(i) + c) % nw, FIRST(i), &kv->key);
		msgpack_pack_object(&kp, kv->key);
	}
#undef FIRST
	round_robin += data->via.map.size;
	payload_bytes(d, &op->bytes, &op->relayed);
	op->nkeys = data->via.map.size;
	if (tw_request_peer_address(r, op->peer, sizeof(op->peer)) != 0)
		snprintf(op->peer, sizeof(op->peer), "a client that left");
	obj_str(tw_request_arg(r, "client"), &client, &clen);
	op->client = strndup(client, clen);
	op->r = r;
	scatter_send(op, wl, builders, nw);
	free(cum);
	free(wl);
	free(counts);
	free(builders);
	return 0;
}

/* r's `workers` as Dask reads it (workers_arg): 0 and *out, or -1 when
 * it names a worker that is not there (must_exist) or no address at
 * all: then r is answered with the exception Dask's scheduler raises,
 * which the client raises. */
static int workers_of(tw_request *r, int must_exist, struct addrs *out)
{
	struct exc e;
	if (workers_arg(tw_request_arg(r, "workers"), must_exist, out, &e) == 0)
		return 0;
	say("%s(%s) to a request naming workers\n", e.type, e.text);
	reply_exc(r, &e);
	return -1;
}

/* A scatter that found no running worker waits for one, as Dask's
 * Scheduler.scatter does: it looks again every 0.1 s, and once more than
 * `timeout` seconds (the client's, which it passes; 2 by default) have
 * passed since the request came, fails with TimeoutError("No valid
 * workers found"). A libevent timer per waiting request: the loop serves
 * everything else meanwhile. A waiting request holds its payloads (a
 * relayed one holds its client's comm paused, as TCP holds a sender). */
struct scatter_wait {
	struct scatter_wait *next;
	tw_request *r;
	struct event *ev;
	double deadline;     /* monotonic seconds */
	struct names *names; /* the host names its request's `workers` had */
};
static struct scatter_wait *scatter_waits;

static void scatter_wait_free(struct scatter_wait *sw)
{
	struct scatter_wait **p = &scatter_waits;
	while (*p != sw)
		p = &(*p)->next;
	*p = sw->next;
	event_free(sw->ev);
	names_free(sw->names);
	free(sw);
}

static void on_scatter_wait(evutil_socket_t fd, short what, void *arg)
{
	static const struct timeval poll = {0, 100 * 1000}; /* Dask: asyncio.sleep(0.1) */
	struct scatter_wait *sw = arg;
	struct addrs only;
	int started;
	(void)fd;
	(void)what;
	names_use(sw->names);
	if (tw_request_comm(sw->r) == NULL) { /* its client left: drop it */
		reply_send(sw->r);
	} else if (workers_of(sw->r, 1, &only) != 0) { /* Dask coerces them on each look */
	} else {
		started = scatter_start(sw->r, &only) == 0;
		addrs_free(&only);
		if (!started && now_mono() <= sw->deadline) {
			event_add(sw->ev, &poll);
			names_use(NULL);
			return;
		}
		if (!started) {
			say("scatter: no valid workers found in its timeout\n");
			reply_exception(sw->r, "TimeoutError", "No valid workers found");
		}
	}
	names_use(NULL);
	scatter_wait_free(sw);
}

/* The request's `timeout` in seconds (an int or a float): Dask's default
 * is 2. */
static double scatter_timeout(const tw_request *r)
{
	const msgpack_object *t = tw_request_arg(r, "timeout");
	double v = 2;
	if (t != NULL && (t->type == MSGPACK_OBJECT_FLOAT64 || t->type == MSGPACK_OBJECT_FLOAT32))
		v = t->via.f64;
	else if (t != NULL && t->type == MSGPACK_OBJECT_POSITIVE_INTEGER)
		v = t->via.u64 < 1000000000 ? (double)t->via.u64 : 1e9;
	else if (t != NULL && t->type == MSGPACK_OBJECT_NEGATIVE_INTEGER)
		v = 0;
	return v;
}

void op_scatter(tw_request *r, void *arg)
{
	const msgpack_object *data = tw_request_arg(r, "data");
	struct scatter_wait *sw;
	struct addrs only;
	double timeout;
	int started;
	(void)arg;
	if (data == NULL || data->type != MSGPACK_OBJECT_MAP || data->via.map.size == 0) {
		reply_error(r, "scatter needs data (a map, not empty)");
		return;
	}
	if (workers_of(r, 1, &only) != 0)
		return;
	started = scatter_start(r, &only) == 0;
	addrs_free(&only);
	if (started)
		return;
	timeout = scatter_timeout(r);
	if ((sw = calloc(1, sizeof(*sw))) == NULL ||
	    (sw->ev = evtimer_new(S.base, on_scatter_wait, sw)) == NULL)
		abort();
	sw->r = r;
	sw->names = names_keep();
	sw->deadline = now_mono() + timeout;
	sw->next = scatter_waits;
	scatter_waits = sw;
	say("scatter: no running worker yet: waiting up to %.1f s\n", timeout);
	on_scatter_wait(-1, 0, sw); /* Dask looks at once, then every 0.1 s */
}

void scatters_stop(void)
{
	while (scatter_waits != NULL) {
		reply_error(scatter_waits->r, "the scheduler stopped");
		scatter_wait_free(scatter_waits);
	}
}

/* Dask's Scheduler.update_data: a client scattered to workers itself
 * (direct=True) and tells where its keys are. Replies nil. */
void op_update_data(tw_request *r, void *arg)
{
	const msgpack_object *who_has = tw_request_arg(r, "who_has");
	const msgpack_object *nbytes = tw_request_arg(r, "nbytes");
	const char *s;
	size_t n;
	struct client *cl = NULL;
	(void)arg;
	if (obj_str(tw_request_arg(r, "client"), &s, &n) == 0)
		for (cl = S.clients; cl != NULL && (strlen(cl->id) != n || memcmp(cl->id, s, n));
		     cl = cl->next)
			;
	for (uint32_t i = 0;
	     who_has && who_has->type == MSGPACK_OBJECT_MAP && i < who_has->via.map.size; i++) {
		const msgpack_object_kv *kv = &who_has->via.map.ptr[i];
		const msgpack_object *nb = NULL;
		char addr[512];
		struct key *k;
		int had;
		if (obj_str(&kv->key, &s, &n) != 0 || kv->val.type != MSGPACK_OBJECT_ARRAY)
			continue;
		had = table_get(&S.keys, s, n) != NULL;
		k = key_get_or_add(s, n);
		for (uint32_t j = 0; j < kv->val.via.array.size; j++) {
			struct worker *w = NULL;
			struct exc e;
			/* Dask: coerce_address of each */
			if (coerce_address(&kv->val.via.array.ptr[j], addr, sizeof(addr), &e) == 0)
				w = worker_find(addr, strlen(addr));
			if (w != NULL)
				push(&k->who, &k->nwho, &k->cwho, w);
		}
		/* nbytes lists the keys in who_has's order (both come from
		 * scatter_to_workers): no search, which would be quadratic */
		if (nbytes != NULL && nbytes->type == MSGPACK_OBJECT_MAP &&
		    i < nbytes->via.map.size &&
		    msgpack_object_equal(nbytes->via.map.ptr[i].key, kv->key))
			nb = &nbytes->via.map.ptr[i].val;
		if (nb != NULL && nb->type == MSGPACK_OBJECT_POSITIVE_INTEGER)
			k->nbytes = nb->via.u64;
		if (cl != NULL)
			push(&k->wants, &k->nwants, &k->cwants, cl);
		/* A new key no registered worker holds and no client wants
		 * would never be freed (nothing removes it): not kept. */
		if (!had && k->nwho == 0 && k->nwants == 0) {
			table_del(&S.keys, s, n);
			key_free(k);
		}
	}
	reply_send(r);
}

/* --- gather --- */

/* Dask's Scheduler.gather and gather_from_workers (utils_comm.py): each
 * key is asked of one of its holders (the first not found bad; Dask picks
 * one at random), one get_data per worker; a worker whose get_data failed
 * (Dask: OSError or ValueError) or that lacked a key it was asked for is
 * bad, and the keys it did not send are asked again of their other
 * holders, round after round, until each key came or has no holder left.
 * A key with none left is missing: the reply is {"status": "error",
 * "keys": {key: [its holders when the gather began]}}, and the workers
 * whose get_data failed are removed first (remove_worker(close=True)), so
 * keys only they held are lost (cancelled-key to their clients). When
 * every key came, a failed worker stays, as with Dask. */
enum { GK_WANTED, GK_GOT, GK_MISSING };

struct gkey {
	const msgpack_object *name; /* in the request, which outlives the op */
	char **holders;             /* addresses, when the gather began */
	uint32_t nholders;
	int state;
};

struct gather_op {
	tw_request *r;
	struct gkey *keys;
	uint32_t nkeys;
	int pending;
	struct table bad;             /* Dask's bad_addresses (values: the address) */
	struct table failed;          /* Dask's missing_workers: get_data failed */
	struct gather_reply *replies; /* get_data replies whose data goes out */
	size_t nreplies, creplies;
	uint32_t ndata;
};

struct gather_reply {
	tw_decoded *d;
	const char *address; /* the worker's: a holder string of op's keys */
};

struct gather_part {
	struct gather_op *op;
	const char *address; /* a holder string of one of op's keys */
	uint32_t *idx;       /* the op's keys asked of it */
	uint32_t n, cap;
};

static void mark(struct table *t, const char *address)
{
	if (table_get(t, address, strlen(address)) == NULL &&
	    table_put(t, address, strlen(address), (void *)address) != 0)
		abort();
}

/* Bytes of d's payload groups that are relayed (still in the worker's
 * socket). */
static uint64_t relay_bytes(const tw_decoded *d)
{
	uint64_t n = 0;
	for (size_t i = 0; i < tw_decoded_npayloads(d); i++) {
		const tw_payload *p = tw_decoded_payload_at(d, i);
		for (size_t j = 0; p->relay_sub_header != NULL && j < p->nframes; j++)
			n += p->frames[j].len;
	}
	return n;
}

/* A relayed get_data reply's end (tw_relay_watch_end; arg: the worker's
 * address, ours). Cut short by the worker (its bytes ended, or came below
 * the minimum rate) after our OK went out: the client's comm ended (its
 * message was cut short on the wire) and its gather fails with a closed
 * comm. Dask reads the value before replying, so there get_data fails
 * and Scheduler.gather removes the worker (remove_worker(close=True)):
 * so here too, or each gather of its keys would be cut again. */
static void on_relay_end(int err, const char *why, void *arg)
{
	char *address = arg;
	struct worker *w;
	if (err != 0 && err != TW_ECANCELED) /* TW_ECANCELED: we stop */
		say("gather: the relayed get_data reply of %s was cut short: %s\n", address, why);
	/* the worker's doing (not TW_ECLOSED: we closed its comm, removing it) */
	if (err == TW_ETRUNCATED || err == TW_EIO || err == TW_ETIMEDOUT) {
		if ((w = worker_find(address, strlen(address))) != NULL)
			worker_remove(w, TW_ECLOSED,
				      "its relayed get_data reply was cut short (as Dask's "
				      "Scheduler.gather does when get_data fails: "
				      "remove_worker(close=True))",
				      1);
	}
	free(address);
}

/* Watch the relay of reply's payloads (every relay frame of a reply is
 * one relay's): the first frame it accepts. */
static void watch_relay(const struct gather_reply *reply)
{
	for (size_t i = 0; i < tw_decoded_npayloads(reply->d); i++) {
		const tw_payload *p = tw_decoded_payload_at(reply->d, i);
		for (size_t j = 0; p->relay_sub_header != NULL && j < p->nframes; j++) {
			char *address = strdup(reply->address);
			int rv = address != NULL
					 ? tw_relay_watch_end(&p->frames[j], on_relay_end, address)
					 : TW_ENOMEM;
			if (rv == 0)
				return;
			free(address);
			if (rv != TW_EINVAL) /* TW_EINVAL: not a relay frame */
				abort();
		}
	}
}

/* A reply that relays payloads is logged as it goes out, and its relay
 * watched (on_relay_end). A worker that dies in the middle of one ends
 * the client's comm the same way; its removal reports the keys lost
 * (cancelled-key), as Dask's remove_worker does. */
static void log_relay(const struct gather_op *op)
{
	uint64_t n = 0;
	size_t from = 0;
	char peer[256] = "?";
	for (size_t i = 0; i < op->nreplies; i++) {
		uint64_t b = relay_bytes(op->replies[i].d);
		n += b;
		from += b > 0;
		if (b > 0)
			watch_relay(&op->replies[i]);
	}
	if (n == 0)
		return;
	tw_request_peer_address(op->r, peer, sizeof(peer));
	say("gather: %u keys to %s: relaying %.1f MiB from %zu worker(s)\n", op->ndata, peer,
	    (double)n / (1 << 20), from);
}

/* Dask's gather: "Remove suspicious workers from the scheduler and shut
 * them down" (remove_worker(address=..., close=True)). */
static int remove_failed(void *val, void *arg)
{
	const char *address = val;
	struct worker *w = worker_find(address, strlen(address));
	(void)arg;
	if (w != NULL)
		worker_remove(w, TW_ECLOSED,
			      "its get_data failed and a gather's keys are missing (Dask's "
			      "Scheduler.gather: remove_worker(close=True))",
			      1);
	return 0;
}

static void pack_missing(msgpack_packer *pk, const struct gather_op *op, uint32_t nmissing)
{
	msgpack_pack_map(pk, nmissing);
	for (uint32_t i = 0; i < op->nkeys; i++) {
		const struct gkey *k = &op->keys[i];
		if (k->state != GK_MISSING)
			continue;
		msgpack_pack_object(pk, *k->name);
		msgpack_pack_array(pk, k->nholders);
		for (uint32_t j = 0; j < k->nholders; j++)
			tw_msgpack_pack_str(pk, k->holders[j]);
	}
}

/* The comms that got a gather's reply, each watched once until it ends:
 * an end with an error is logged (a client that never reads its reply is
 * ended by the memory limit: TW_ENOMEM, "ended by the memory limit"). */
struct requester {
	struct requester *next;
	tw_comm *comm;
	tw_comm_watch *watch;
};
static struct requester *requesters;

static void on_requester_end(tw_comm *comm, int err, void *arg)
{
	struct requester **p = &requesters, *rq = arg;
	char peer[256] = "?";
	while (*p != rq)
		p = &(*p)->next;
	*p = rq->next;
	free(rq);
	tw_comm_peer_address(comm, peer, sizeof(peer));
	if (err != 0)
		say("comm from %s ended: %s: %s\n", peer, tw_strerror(err),
		    tw_comm_last_error(comm));
}

static void watch_requester(tw_request *r)
{
	tw_comm *comm = tw_request_comm(r);
	struct requester *rq = requesters;
	while (rq != NULL && rq->comm != comm)
		rq = rq->next;
	if (comm == NULL || rq != NULL)
		return;
	if ((rq = calloc(1, sizeof(*rq))) == NULL ||
	    tw_comm_watch_end(comm, on_requester_end, rq, &rq->watch) != 0)
		abort();
	rq->comm = comm;
	rq->next = requesters;
	requesters = rq;
}

void requesters_stop(void)
{
	while (requesters != NULL) {
		struct requester *rq = requesters;
		requesters = rq->next;
		tw_comm_unwatch(rq->watch);
		free(rq);
	}
}

static void gather_done(struct gather_op *op)
{
	tw_builder *b = reply_builder(op->r);
	msgpack_packer *pk = tw_builder_packer(b);
	uint32_t nmissing = 0;
	for (uint32_t i = 0; i < op->nkeys; i++)
		nmissing += op->keys[i].state == GK_MISSING;
	msgpack_pack_map(pk, 2);
	tw_msgpack_pack_str(pk, "status");
	if (nmissing > 0) {
		/* Dask: {"status": "error", "keys": missing}; the client then
		 * asks report-key and learns they are lost (cancelled-key). */
		say("gather: %u of %u key(s) missing; %zu worker(s) failed\n", nmissing, op->nkeys,
		    op->failed.n);
		table_filter(&op->failed, remove_failed, NULL);
		tw_msgpack_pack_str(pk, "error");
		tw_msgpack_pack_str(pk, "keys");
		pack_missing(pk, op, nmissing);
	} else {
		tw_msgpack_pack_str(pk, "OK");
		tw_msgpack_pack_str(pk, "data");
		msgpack_pack_map(pk, op->ndata);
		for (size_t i = 0; i < op->nreplies; i++) {
			const msgpack_object *data =
				tw_msgpack_map_get(tw_decoded_root(op->replies[i].d), "data");
			for (uint32_t j = 0; j < data->via.map.size; j++) {
				msgpack_pack_object(pk, data->via.map.ptr[j].key);
				if (tw_builder_pack_object(b, op->replies[i].d,
							   &data->via.map.ptr[j].val) != 0)
					abort();
			}
		}
		log_relay(op);
	}
	/* The sent message holds the payloads; the replies can go. */
	watch_requester(op->r);
	reply_send(op->r);
	for (size_t i = 0; i < op->nreplies; i++)
		tw_decoded_free(op->replies[i].d);
	free(op->replies);
	for (uint32_t i = 0; i < op->nkeys; i++) {
		for (uint32_t j = 0; j < op->keys[i].nholders; j++)
			free(op->keys[i].holders[j]);
		free(op->keys[i].holders);
	}
	free(op->keys);
	table_fini(&op->bad);
	table_fini(&op->failed);
	free(op);
}

/* The data map's keys, to find which asked keys a worker did not send. */
static int index_keys(struct table *t, const msgpack_object *map)
{
	for (uint32_t i = 0; i < map->via.map.size; i++) {
		const char *s;
		size_t n;
		if (obj_str(&map->via.map.ptr[i].key, &s, &n) == 0 && table_put(t, s, n, t) != 0)
			return -1;
	}
	return 0;
}

static void gather_round(struct gather_op *op);

static void round_done(struct gather_op *op)
{
	if (--op->pending == 0)
		gather_round(op); /* the next round, or the end */
}

static void gather_part_done(struct gather_part *part)
{
	struct gather_op *op = part->op;
	free(part->idx);
	free(part);
	round_done(op);
}

/* The keys of part that data (NULL: none) holds came; the worker is bad
 * if it lacked any. */
static void part_got(struct gather_part *part, const msgpack_object *data)
{
	struct gather_op *op = part->op;
	struct table sent = {0};
	int lacked = 0;
	if (data != NULL && index_keys(&sent, data) != 0)
		abort();
	for (uint32_t i = 0; i < part->n; i++) {
		struct gkey *k = &op->keys[part->idx[i]];
		const char *s;
		size_t n;
		if (data != NULL && obj_str(k->name, &s, &n) == 0 && table_get(&sent, s, n) != NULL)
			k->state = GK_GOT;
		else
			lacked = 1;
	}
	table_fini(&sent);
	if (lacked)
		mark(&op->bad, part->address);
}

/* A get_data reply (the pool wrote "OK" back after it: TW_CALL_ACK_OK). */
static void on_get_data(tw_call *call, int err, tw_decoded *reply, void *arg)
{
	struct gather_part *part = arg;
	struct gather_op *op = part->op;
	const msgpack_object *root = reply ? tw_decoded_root(reply) : NULL;
	const msgpack_object *data = tw_msgpack_map_get(root, "data");
	if (err != 0) {
		say("gather: %s\n", tw_call_error(call));
		mark(&op->failed, part->address);
	} else if (!tw_msgpack_str_eq(tw_msgpack_map_get(root, "status"), "OK") || data == NULL ||
		   data->type != MSGPACK_OBJECT_MAP) {
		say("gather: %s: get_data replied without status OK and data\n", part->address);
	}
	if (err != 0 || data == NULL || data->type != MSGPACK_OBJECT_MAP)
		data = NULL;
	part_got(part, data);
	if (data != NULL) {
		if (op->nreplies == op->creplies) {
			size_t c = op->creplies ? 2 * op->creplies : 4;
			struct gather_reply *a = realloc(op->replies, c * sizeof(*a));
			if (a == NULL)
				abort();
			op->replies = a;
			op->creplies = c;
		}
		op->ndata += data->via.map.size;
		op->replies[op->nreplies].d = reply;
		op->replies[op->nreplies++].address = part->address;
	} else {
		tw_decoded_free(reply);
	}
	gather_part_done(part);
}

/* get_data's request for the keys of part (Dask's get_data_from_worker). */
static tw_msg *get_data_request(const struct gather_part *part)
{
	tw_builder *b = request_new("get_data", 3);
	msgpack_packer *pk = tw_builder_packer(b);
	tw_msgpack_pack_str(pk, "keys");
	msgpack_pack_array(pk, part->n);
	for (uint32_t i = 0; i < part->n; i++)
		msgpack_pack_object(pk, *part->op->keys[part->idx[i]].name);
	tw_msgpack_pack_str(pk, "who");
	msgpack_pack_nil(pk);
	tw_msgpack_pack_str(pk, "max_connections");
	msgpack_pack_false(pk);
	return builder_done(b);
}

/* The part of the round for address (made on first use). */
static struct gather_part *round_part(struct gather_op *op, struct table *parts,
				      const char *address, struct gather_part **list, size_t *n)
{
	struct gather_part *part = table_get(parts, address, strlen(address));
	if (part != NULL)
		return part;
	if ((part = calloc(1, sizeof(*part))) == NULL ||
	    table_put(parts, address, strlen(address), part) != 0)
		abort();
	part->op = op;
	part->address = address;
	list[(*n)++] = part;
	return part;
}

/* One round: each wanted key to its first holder not bad, one get_data
 * per worker through the pool (which writes get_data's "OK"
 * acknowledgement); with no key left to ask, the reply. */
static void gather_round(struct gather_op *op)
{
	struct table parts = {0};
	struct gather_part **list;
	size_t nparts = 0;
	if ((list = calloc(op->nkeys + 1, sizeof(*list))) == NULL)
		abort();
	for (uint32_t i = 0; i < op->nkeys; i++) {
		struct gkey *k = &op->keys[i];
		struct gather_part *part;
		const char *address = NULL;
		if (k->state != GK_WANTED)
			continue;
		for (uint32_t j = 0; j < k->nholders && address == NULL; j++)
			if (table_get(&op->bad, k->holders[j], strlen(k->holders[j])) == NULL)
				address = k->holders[j];
		if (address == NULL) {
			k->state = GK_MISSING;
			continue;
		}
		part = round_part(op, &parts, address, list, &nparts);
		if (part->n == part->cap) {
			uint32_t c = part->cap ? 2 * part->cap : 4;
			uint32_t *a = realloc(part->idx, c * sizeof(*a));
			if (a == NULL)
				abort();
			part->idx = a;
			part->cap = c;
		}
		part->idx[part->n++] = i;
	}
	table_fini(&parts);
	if (nparts == 0) {
		free(list);
		gather_done(op);
		return;
	}
	op->pending = (int)nparts + 1; /* + 1 until every call is out */
	for (size_t i = 0; i < nparts; i++) {
		tw_msg *m = get_data_request(list[i]);
		int rv = tw_pool_call_flags(S.pool, list[i]->address, m, 0, TW_CALL_ACK_OK,
					    on_get_data, list[i], NULL);
		if (rv != 0) { /* Dask: connecting raised OSError */
			say("gather: get_data to %s not sent: %s\n", list[i]->address,
			    tw_strerror(rv));
			tw_msg_free(m);
			mark(&op->failed, list[i]->address);
			part_got(list[i], NULL);
			gather_part_done(list[i]);
		}
	}
	free(list);
	round_done(op); /* every call is out */
}

void op_gather(tw_request *r, void *arg)
{
	const msgpack_object *keys = tw_request_arg(r, "keys");
	struct gather_op *op;
	(void)arg;
	if (keys == NULL || keys->type != MSGPACK_OBJECT_ARRAY) {
		reply_error(r, "gather needs keys (a list)");
		return;
	}
	if ((op = calloc(1, sizeof(*op))) == NULL ||
	    (op->keys = calloc(keys->via.array.size + 1, sizeof(*op->keys))) == NULL)
		abort();
	op->r = r;
	op->nkeys = keys->via.array.size;
	for (uint32_t i = 0; i < op->nkeys; i++) {
		struct gkey *gk = &op->keys[i];
		struct key *k = NULL;
		const char *s;
		size_t n;
		gk->name = &keys->via.array.ptr[i];
		if (obj_str(gk->name, &s, &n) == 0)
			k = table_get(&S.keys, s, n);
		if (k == NULL || k->nwho == 0)
			continue; /* no holder: missing in the first round */
		if ((gk->holders = calloc(k->nwho, sizeof(*gk->holders))) == NULL)
			abort();
		for (uint32_t j = 0; j < k->nwho; j++)
			if ((gk->holders[gk->nholders++] = strdup(k->who[j]->address)) == NULL)
				abort();
	}
	gather_round(op);
}

/* Dask's get_who_has: {key: [addresses]} for the keys asked (all: nil). */
static void pack_who(msgpack_packer *pk, const struct key *k)
{
	msgpack_pack_array(pk, k ? k->nwho : 0);
	for (uint32_t i = 0; k && i < k->nwho; i++)
		tw_msgpack_pack_str(pk, k->who[i]->address);
}

static int pack_each_key(void *val, void *arg)
{
	struct key *k = val;
	pack_strn(arg, k->name, k->len);
	pack_who(arg, k);
	return 0;
}

void op_who_has(tw_request *r, void *arg)
{
	const msgpack_object *keys = tw_request_arg(r, "keys");
	msgpack_packer *pk = reply_packer(r);
	(void)arg;
	if (keys == NULL || keys->type != MSGPACK_OBJECT_ARRAY) {
		msgpack_pack_map(pk, (uint32_t)S.keys.n);
		table_filter(&S.keys, pack_each_key, pk);
	} else {
		msgpack_pack_map(pk, keys->via.array.size);
		for (uint32_t i = 0; i < keys->via.array.size; i++) {
			const char *s;
			size_t n;
			struct key *k = NULL;
			if (obj_str(&keys->via.array.ptr[i], &s, &n) == 0)
				k = table_get(&S.keys, s, n);
			msgpack_pack_object(pk, keys->via.array.ptr[i]);
			pack_who(pk, k);
		}
	}
	reply_send(r);
}

/* Dask's get_ncores / get_ncores_running: {address: nthreads}. */
void op_ncores(tw_request *r, void *arg)
{
	struct addrs only;
	msgpack_packer *pk;
	int running_only = arg != NULL;
	uint32_t n = 0;
	if (workers_of(r, 0, &only) != 0) /* Dask's get_ncores skips unknown addresses */
		return;
	pk = reply_packer(r);
	for (int pass = 0; pass < 2; pass++) {
		if (pass == 1)
			msgpack_pack_map(pk, n);
		for (struct worker *w = S.workers; w != NULL; w = w->next) {
			if ((running_only && strcmp(w->status, "running") != 0) ||
			    !addrs_has(&only, w->address))
				continue;
			if (pass == 0) {
				n++;
				continue;
			}
			tw_msgpack_pack_str(pk, w->address);
			msgpack_pack_int64(pk, w->nthreads);
		}
	}
	addrs_free(&only);
	reply_send(r);
}
