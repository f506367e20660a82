/* SPDX-License-Identifier: BSD-3-Clause */
/* tw-mini-scheduler: the state shared by its files.
 *
 * One loop thread runs everything. Concepts, one file each:
 *   main.c     arguments, the context, the tw_server and its ops, the
 *              tw_pool that calls workers, the worker TTL check, shutdown
 *   reply.c    small helpers for requests, replies and streams
 *   table.c    a string-keyed hash table
 *   workers.c  the worker registry (Scheduler.add_worker, handle_worker,
 *              heartbeat_worker, remove_worker, identity)
 *   data.c     keys and clients: scatter, gather, who_has, ncores,
 *              register-client and the client stream ops
 *   addr.c     addresses as Dask's coerce_address reads them, host
 *              names resolved (evdns) before the op runs */
#ifndef TW_MINI_SCHEDULER_H
#define TW_MINI_SCHEDULER_H

#include <stddef.h>
#include <stdint.h>

#include <msgpack.h>

#include <taskwire/taskwire.h>

struct event_base;
struct evdns_base;

/* table.c: name -> pointer; names are copied. */
struct tslot;
struct table {
	struct tslot *slots;
	size_t nslots, n;
};
void *table_get(const struct table *t, const char *name, size_t len);
int table_put(struct table *t, const char *name, size_t len, void *val); /* 0 or -1 (OOM) */
void *table_del(struct table *t, const char *name, size_t len);
/* Calls fn on every entry; an entry for which fn returns 1 is removed. */
void table_filter(struct table *t, int (*fn)(void *val, void *arg), void *arg);
void table_fini(struct table *t);

struct worker {
	struct worker *next;
	char *address;
	tw_comm *comm;        /* its stream (tw_request_keep_stream), held */
	tw_comm_watch *watch; /* its end; NULL once run */
	tw_batched *out;      /* to the worker's stream (free-keys) */
	/* identity fields of its register-worker request, packed as map
	 * pairs, and its last heartbeat's metrics (packed). */
	msgpack_sbuffer ident;
	uint32_t nident;
	size_t name_end; /* where the first pair, "name", ends in ident */
	msgpack_sbuffer metrics;
	int64_t nthreads;
	char status[32];
	double last_seen; /* monotonic seconds of its last heartbeat */
	void *tmp;        /* scratch for one pass of data.c */
};

struct client {
	struct client *next;
	char *id;
	tw_comm *comm; /* its stream, held */
	tw_comm_watch *watch;
	tw_batched *out;
};

struct sched {
	tw_context *ctx;
	struct event_base *base;
	tw_server *server;
	tw_pool *pool;          /* calls to workers: update_data, get_data */
	struct evdns_base *dns; /* host names (addr.c), the context's too */
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

/* An exception Dask's scheduler raises, for the client to raise
 * (reply_exc): type, a Python builtin ("KeyError", "ValueError", ...) or
 * "socket.gaierror"; its arguments: (errnum, text) for gaierror, else
 * (text). */
struct exc {
	const char *type;
	int errnum;
	char text[512];
};

/* reply.c */
/* The packer of r's reply (exits on out-of-memory). */
msgpack_packer *reply_packer(tw_request *r);
tw_builder *reply_builder(tw_request *r);
/* Send r's reply (as packed) and free r; a requester gone is no error. */
void reply_send(tw_request *r);
/* Dask's error reply (core.py error_message): Python's rpc raises it. */
void reply_error(tw_request *r, const char *text);
/* The same error reply with the exception a Dask scheduler would raise:
 * Python's builtin `type` (e.g. "TimeoutError") with the one argument
 * `text`, pickled as core.py error_message sends it, so that the rpc
 * raises type(text), not Exception(text). type: ASCII; text: UTF-8 (in
 * exception_text, repr(e), it is quoted as Python does but not escaped).
 * Frees r. */
void reply_exception(tw_request *r, const char *type, const char *text);
/* The same for any struct exc (socket.gaierror too). Frees r. */
void reply_exc(tw_request *r, const struct exc *e);
/* A builder for a request to a worker (no compression: forwarded
 * payloads go as they came), its map begun: "op": op, "reply": true, and
 * room for nargs more pairs, which the caller packs. Exits on
 * out-of-memory. */
tw_builder *request_new(const char *op, uint32_t nargs);
tw_msg *builder_done(tw_builder *b);
/* Pack one map (from sb) into a stream's batch. */
void stream_send(tw_batched *out, const msgpack_sbuffer *sb);
/* {"op": op, field: value (a str of n bytes)} into a stream's batch. */
void stream_send_op(tw_batched *out, const char *op, const char *field, const char *value,
		    size_t n);
/* A str or bin as a NUL-less string view: 0, or -1 when o is neither. */
int obj_str(const msgpack_object *o, const char **s, size_t *n);
void pack_strn(msgpack_packer *pk, const char *s, size_t n);

/* workers.c */
void op_register_worker(tw_request *r, void *arg);
void op_heartbeat_worker(tw_request *r, void *arg);
void op_unregister(tw_request *r, void *arg);
void op_identity(tw_request *r, void *arg);
void worker_stream_op(tw_comm *comm, const tw_decoded *d, const msgpack_object *msg, void *arg);
/* Remove w (Dask's remove_worker): its calls fail with err and why, its
 * keys go, its stream is aborted; with close (Dask's close=True, which
 * Scheduler.gather passes) it is sent {"op": "close", "reason":
 * "scheduler-remove-worker"} first and closed in order, and the worker
 * shuts itself down. */
void worker_remove(struct worker *w, int err, const char *why, int close);
/* The worker registered with this address (as coerce_address makes it). */
struct worker *worker_find(const char *addr, size_t len);
/* The worker whose name is o (Dask's Scheduler.aliases), or NULL. */
struct worker *worker_named(const msgpack_object *o);
void workers_check_ttl(void);

/* addr.c */
/* Dask's Scheduler.coerce_address(o) into out: a worker's name gives its
 * address; a (host, port) tuple (a msgpack array) is unparsed first; a
 * str is resolve_address'd: the scheme before the last "://" ("tcp" when
 * none), host:port or [v6]:port, the port as Python's int() reads it, the
 * host as ensure_ip makes it (IPv4 first, then IPv6; "" is localhost;
 * names from the answers op_resolving looked up). 0, or -1 with the
 * exception Dask's code raises in *e:
 *   TypeError        not a str or a (host, port) tuple
 *   ValueError       "missing port number in address '...'", "invalid
 *                    address ...", "unknown address scheme ...", "invalid
 *                    literal for int() with base 10: ..."
 *   socket.gaierror  a name that did not resolve (glibc's code and text) */
int coerce_address(const msgpack_object *o, char *out, size_t len, struct exc *e);
/* A `workers=` argument coerced: any (it was None or absent: every
 * worker), or the n addresses. */
struct addrs {
	char **v;
	size_t n;
	int any;
};
/* A `workers=` argument as Dask reads it: iterated as Python iterates it
 * (a list's items; a str's characters, so "tcp://..." is 't', 'c', ...: a
 * ValueError; a dict's keys; bytes' ints), coerce_address of every entry,
 * then (must_exist: Scheduler.scatter's self.workers[w]; 0: get_ncores,
 * which skips unknown ones) a KeyError(address) for the first that no
 * registered worker has. 0 and *out (addrs_free it), or -1 and *e. */
int workers_arg(const msgpack_object *arg, int must_exist, struct addrs *out, struct exc *e);
int addrs_has(const struct addrs *a, const char *address);
void addrs_free(struct addrs *a);
/* An op whose request holds addresses (`workers`, the lists of `who_has`,
 * `address`): op_resolving(r, &resolving_op) looks up the host names in
 * them first (never blocking the loop), then runs fn with the answers. */
struct resolving_op {
	tw_op_fn fn;
	void *arg;
};
void op_resolving(tw_request *r, void *arg);
/* The answers the running op reads; names_keep: the op keeps them past
 * its return (a scatter waiting for a worker), to names_use again and
 * names_free. */
struct names;
struct names *names_keep(void);
void names_use(struct names *nm);
void names_free(struct names *nm);
/* At shutdown: requests still resolving are answered with an error and
 * their lookups canceled (evdns reports that from the loop: run it once
 * more before evdns_base_free). */
void resolving_stop(void);

/* data.c */
void op_register_client(tw_request *r, void *arg);
/* scatter: with no running worker it waits for one (Dask's scatter
 * polls every 0.1 s up to the request's timeout); scatters_stop answers
 * the waiting ones at shutdown. */
void op_scatter(tw_request *r, void *arg);
void scatters_stop(void);
void op_update_data(tw_request *r, void *arg);
void op_gather(tw_request *r, void *arg);
/* At shutdown: stop watching the comms that got gathers' replies (an end
 * with an error is logged: the memory limit's TW_ENOMEM). */
void requesters_stop(void);
void op_who_has(tw_request *r, void *arg);
void op_ncores(tw_request *r, void *arg); /* arg non-NULL: running workers only */
void client_stream_op(tw_comm *comm, const tw_decoded *d, const msgpack_object *msg, void *arg);
void client_remove(struct client *cl);
/* w is leaving: drop it from every key; keys left with no holder are
 * lost and their clients told (cancelled-key), as Dask's remove_worker. */
void keys_worker_gone(struct worker *w);
void keys_add_holder(const char *k, size_t klen, struct worker *w, uint64_t nbytes);

#endif
