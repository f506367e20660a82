/* SPDX-License-Identifier: BSD-3-Clause */
/* tw-mini-scheduler: the state shared by its files.
 *
 * One loop thread runs everything. Concepts, one file each:
 *   main.c     arguments, the context and listener, the worker TTL check
 *   conn.c     accepted comms: handshake, requests (one at a time, as
 *              Dask's Server.handle_comm), streams (Server.handle_stream)
 *   table.c    a string-keyed hash table
 *   workers.c  the worker registry (Scheduler.add_worker, heartbeat_worker,
 *              remove_worker, identity)
 *   wcall.c    calls to workers on comms of our own (Dask's rpc to a worker;
 *              get_data's "OK" acknowledgement)
 *   data.c     keys and clients: scatter, gather, who_has, ncores,
 *              register-client and the client stream ops */
#ifndef TW_MINI_SCHEDULER_H
#define TW_MINI_SCHEDULER_H

#include <stddef.h>
#include <stdint.h>

#include <msgpack.h>

#include <taskwire/taskwire.h>

struct event_base;

/* table.c: name -> pointer; names are copied. */
struct tentry;
struct table {
	struct tentry **buckets;
	size_t nbuckets, n;
};
void *table_get(const struct table *t, const char *name, size_t len);
int table_put(struct table *t, const char *name, size_t len, void *val); /* 0 or -1 (OOM) */
void *table_del(struct table *t, const char *name, size_t len);
/* Calls fn on every entry; an entry for which fn returns 1 is removed. */
void table_filter(struct table *t, int (*fn)(void *val, void *arg), void *arg);
void table_fini(struct table *t);

/* An accepted comm: first requests, then maybe a worker's or a client's
 * stream. Counted: a pending scatter or gather holds its requester. */
enum conn_mode { CONN_REQUESTS, CONN_WORKER, CONN_CLIENT };
struct worker;
struct client;
struct conn {
	struct conn *prev, *next; /* open comms, for shutdown */
	tw_comm *comm;            /* NULL once ended */
	int refs;
	enum conn_mode mode;
	int no_reply; /* the request being served said reply: false */
	int paused;   /* reading stopped until the deferred reply */
	struct worker *worker;
	struct client *client;
	char peer[128];
};

struct worker {
	struct worker *next;
	char *address;
	struct conn *stream;
	tw_batched *out;  /* to the worker's stream (free-keys) */
	tw_decoded *reg;  /* its register-worker request: identity fields */
	tw_decoded *beat; /* its last heartbeat_worker request: metrics */
	int64_t nthreads;
	char status[32];
	double last_seen; /* monotonic seconds of its last heartbeat */
	struct wlink *links;
	void *tmp; /* scratch for one pass of data.c */
};

struct client {
	struct client *next;
	char *id;
	struct conn *stream;
	tw_batched *out;
};

struct sched {
	tw_context *ctx;
	struct event_base *base;
	char address[256];
	double started; /* wall clock */
	double worker_ttl;
	struct worker *workers;
	size_t nworkers;
	struct client *clients;
	struct table keys;
};
extern struct sched S;

double now_wall(void);
double now_mono(void);
/* A log line on stderr, stamped with the wall clock (HH:MM:SS.mmm UTC). */
void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* conn.c */
void conn_accept(tw_listener *l, tw_comm *comm, void *arg);
void conn_release(struct conn *c);
/* Abort every accepted comm (their close callbacks run: the scheduler
 * stops). */
void conn_abort_all(void);
/* A builder for a reply or request (no compression: forwarded payloads
 * are sent as they are). Exits on out-of-memory. */
tw_builder *builder_new(void);
/* Send b's message as c's reply (dropped when the request said reply:
 * false, or c ended) and serve c's next request. Takes b. */
void reply_send(struct conn *c, tw_builder *b);
void reply_error(struct conn *c, const char *text);
/* Pack one map (from sb) into a stream's batch. */
void stream_send(tw_batched *out, const msgpack_sbuffer *sb);
/* The argument `key` of a request as a NUL-less string view. */
int obj_str(const msgpack_object *o, const char **s, size_t *n);

/* workers.c */
int op_register_worker(struct conn *c, tw_decoded **dp, const msgpack_object *req);
int op_heartbeat_worker(struct conn *c, tw_decoded **dp, const msgpack_object *req);
int op_unregister(struct conn *c, const msgpack_object *req);
int op_identity(struct conn *c);
void worker_stream_op(struct worker *w, const msgpack_object *msg);
void worker_remove(struct worker *w, const char *why);
struct worker *worker_find(const char *addr, size_t len);
void workers_check_ttl(void);

/* wcall.c: one request to a worker on a comm of our own, reused after.
 * fn gets err 0 and the reply (owned: tw_decoded_free), or an error and
 * a text. ack_ok: write "OK" after an OK reply (Dask's get_data). fn
 * never runs inside wcall(). */
typedef void (*wcall_fn)(int err, const char *why, tw_decoded *reply, void *arg);
void wcall(struct worker *w, tw_msg *req, int ack_ok, wcall_fn fn, void *arg);
/* Fail every call to w with why, close its comms. */
void wcall_fail_all(struct worker *w, const char *why);

/* data.c */
int op_register_client(struct conn *c, const msgpack_object *req);
int op_scatter(struct conn *c, tw_decoded *d, const msgpack_object *req);
int op_gather(struct conn *c, const msgpack_object *req);
int op_who_has(struct conn *c, const msgpack_object *req);
int op_ncores(struct conn *c, const msgpack_object *req, int running_only);
void client_stream_op(struct client *cl, const msgpack_object *msg);
void client_remove(struct client *cl);
/* w is leaving: drop it from every key; keys left with no holder are
 * lost and their clients told (cancelled-key), as Dask's remove_worker. */
void keys_worker_gone(struct worker *w);
void keys_add_holder(const char *k, size_t klen, struct worker *w, uint64_t nbytes);

#endif
