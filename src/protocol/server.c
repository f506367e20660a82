/* SPDX-License-Identifier: BSD-3-Clause */
/* Servers that answer ops (include/taskwire/server.h), after Dask's
 * distributed.core.Server.handle_comm. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <taskwire/error.h>
#include <taskwire/handshake.h>
#include <taskwire/offload.h>
#include <taskwire/server.h>
#include <taskwire/stream.h>

#include "protocol/builder.h"
#include "protocol/decode.h"
#include "protocol/optable.h"
#include "protocol/pcomm.h"
#include "transport/upper.h"

/* One served comm. */
struct sconn {
	struct sconn *prev, *next;
	tw_server *srv;
	struct shard *sh; /* its loop's */
	tw_comm *comm;
	tw_request *busy; /* the request being handled */
	tw_msg *pending;  /* a reply the write queue refused, sent on drain */
	int close_after;  /* close once `pending` is written (close:true) */
	int stream;       /* after connection_stream: one-way maps */
	int closing;      /* close-stream came, or we dropped it: serve nothing more */
	int in_batch;     /* a stream batch is being dispatched to handlers */
	int gone;         /* conn_free ran during it: free after it */
};

struct tw_request {
	struct sconn *conn; /* NULL once the comm went away */
	tw_decoded *d;
	char *op;
	int reply, close;
	int keep;      /* tw_request_keep_stream: a stream after the reply */
	tw_builder *b; /* &b_mem once the reply is begun */
	tw_builder b_mem;
}; /* in d's memory, op too: freed with d */

/* The server's part on one loop (tw_context_set_loop_threads): only
 * that loop's thread touches it. */
struct shard {
	struct sconn conns; /* list head: served comms, and comms in their handshake */
	int depth;          /* stream batches being dispatched */
};

struct tw_server {
	tw_context *ctx;
	struct tw__optable ops;
	tw_stream_ops sops; /* stream ops */
	tw_listener **ls;
	size_t nls;
	struct shard *shards; /* one per loop of ctx */
	unsigned nshards;
	_Atomic int dying;     /* tw_server_free ran inside a batch of loop 0: free when it ends */
	struct tw__call later; /* tw_server_free on another loop: done on loop 0 */
	char id[64];
};

static void op_identity(tw_request *r, void *arg)
{
	tw_server *s = arg;
	tw_builder *b = tw_request_reply_builder(r);
	if (b != NULL) {
		msgpack_pack_map(tw_builder_packer(b), 2);
		tw_msgpack_pack_str(tw_builder_packer(b), "type");
		tw_msgpack_pack_str(tw_builder_packer(b), "taskwire");
		tw_msgpack_pack_str(tw_builder_packer(b), "id");
		tw_msgpack_pack_str(tw_builder_packer(b), s->id);
	}
	tw_request_reply(r);
}

static void op_echo(tw_request *r, void *arg)
{
	const msgpack_object *data = tw_request_arg(r, "data");
	tw_builder *b = tw_request_reply_builder(r);
	(void)arg;
	if (b != NULL && data != NULL)
		tw_builder_pack_object(b, tw_request_decoded(r), data);
	tw_request_reply(r);
}

int tw_server_add_op(tw_server *s, const char *name, tw_op_fn fn, void *arg)
{
	return s == NULL ? TW_EINVAL : tw__optable_add(&s->ops, name, (void (*)(void))fn, arg);
}

int tw_server_add_stream_op(tw_server *s, const char *name, tw_stream_fn fn, void *arg)
{
	return s == NULL ? TW_EINVAL : tw_stream_ops_add(&s->sops, name, fn, arg);
}

int tw_server_new(tw_context *ctx, tw_server **out)
{
	tw_server *s;
	if (ctx == NULL || out == NULL)
		return TW_EINVAL;
	if ((s = calloc(1, sizeof(*s))) == NULL)
		return TW_ENOMEM;
	s->ctx = ctx;
	s->nshards = tw_context_loop_count(ctx);
	if ((s->shards = calloc(s->nshards, sizeof(*s->shards))) == NULL) {
		free(s);
		return TW_ENOMEM;
	}
	for (unsigned i = 0; i < s->nshards; i++)
		s->shards[i].conns.next = s->shards[i].conns.prev = &s->shards[i].conns;
	snprintf(s->id, sizeof(s->id), "taskwire-%ld-%p", (long)getpid(), (void *)s);
	if (tw_server_add_op(s, "identity", op_identity, s) != 0 ||
	    tw_server_add_op(s, "echo", op_echo, s) != 0) {
		tw_server_free(s);
		return TW_ENOMEM;
	}
	*out = s;
	return 0;
}

static void request_free(tw_request *r)
{
	if (r->b != NULL)
		tw__builder_fini(r->b);
	tw_decoded_free(r->d); /* and r with it */
}

/* Forget a comm: its unanswered request is orphaned, not freed. Inside a
 * stream batch (a handler aborted the comm, or freed the server) the
 * memory stays until the batch loop sees `gone`. */
static void conn_free(struct sconn *sc)
{
	if (sc->busy != NULL)
		sc->busy->conn = NULL;
	sc->prev->next = sc->next;
	sc->next->prev = sc->prev;
	tw_msg_free(sc->pending);
	tw_comm_free(sc->comm);
	if (sc->in_batch)
		sc->gone = 1;
	else
		free(sc);
}

static void drop(struct sconn *sc, int err, const char *why)
{
	sc->closing = 1; /* messages owed before the end are not served */
	tw__comm_seterr(sc->comm, "%s", why);
	tw__comm_fail(sc->comm, err); /* replies already queued go out first */
}

static void server_destroy(tw_server *s);

/* Stop a batch: a handler freed the server, or the comm went. */
static int batch_stop(void *arg)
{
	struct sconn *sc = arg;
	return atomic_load_explicit(&sc->srv->dying, memory_order_relaxed) || sc->gone;
}

/* A stream message: a map or an array of maps, no replies (Dask's
 * Server.handle_stream). A handler may free the server: the batch stops
 * there, and the server goes after it. At close-stream, maps after it, in
 * this batch or already received, are dropped: tw_comm_close still
 * delivers what arrived before. */
static void stream_message(struct sconn *sc, tw_decoded *d)
{
	tw_server *s = sc->srv;
	struct shard *sh = sc->sh;
	int rv;
	sh->depth++;
	sc->in_batch = 1;
	rv = tw__stream_dispatch(&s->sops.t, sc->comm, d, batch_stop, sc);
	sc->in_batch = 0;
	tw_decoded_free(d);
	if (sc->gone)
		free(sc);
	else if (rv == 1) {
		sc->closing = 1;
		tw_comm_close(sc->comm);
	} else if (rv == TW_EPROTO)
		drop(sc, TW_EPROTO, "stream message is not a map or a list of maps");
	if (--sh->depth == 0 && sh == &s->shards[0] && atomic_load(&s->dying))
		server_destroy(s);
}

/* `reply` and `close` are read as Python's truth: Dask's handle_comm tests
 * `if reply:`, so 0, nil, "" and empty containers are false. */
static void set_flag(int *flag, const msgpack_object *v)
{
	switch (v->type) {
	case MSGPACK_OBJECT_NIL: *flag = 0; break;
	case MSGPACK_OBJECT_BOOLEAN: *flag = v->via.boolean; break;
	case MSGPACK_OBJECT_POSITIVE_INTEGER:
	case MSGPACK_OBJECT_NEGATIVE_INTEGER: *flag = v->via.u64 != 0; break;
	case MSGPACK_OBJECT_FLOAT32:
	case MSGPACK_OBJECT_FLOAT64: *flag = v->via.f64 != 0.0; break;
	case MSGPACK_OBJECT_STR: *flag = v->via.str.size != 0; break;
	case MSGPACK_OBJECT_BIN: *flag = v->via.bin.size != 0; break;
	case MSGPACK_OBJECT_ARRAY: *flag = v->via.array.size != 0; break;
	case MSGPACK_OBJECT_MAP: *flag = v->via.map.size != 0; break;
	default: *flag = 1; break; /* ext: an object, true */
	}
}

/* The request's op (a str), `reply` (default true) and `close` (default
 * false), read in one pass over the map. */
static int make_request(struct sconn *sc, tw_decoded *d, const msgpack_object *op, tw_request **out)
{
	const msgpack_object *root = tw_decoded_root(d);
	size_t n = op->via.str.size;
	tw_request *r = tw__decoded_alloc(d, sizeof(*r));
	char *name = tw__decoded_alloc(d, n + 1);
	if (r == NULL || name == NULL)
		return TW_ENOMEM; /* what was taken goes with d */
	memset(r, 0, sizeof(*r));
	r->op = name;
	memcpy(r->op, op->via.str.ptr, n);
	r->op[n] = '\0';
	r->conn = sc;
	r->d = d;
	r->reply = 1;
	for (uint32_t i = 0; i < root->via.map.size; i++) {
		const msgpack_object_kv *kv = &root->via.map.ptr[i];
		if (tw_msgpack_str_eq(&kv->key, "reply"))
			set_flag(&r->reply, &kv->val);
		else if (tw_msgpack_str_eq(&kv->key, "close"))
			set_flag(&r->close, &kv->val);
	}
	*out = r;
	return 0;
}

/* A request arrived (decoded, on the offload pool when large): serve it;
 * delivery pauses until it is answered. */
static void on_decoded(tw_comm *comm, tw_decoded *d, int err, const char *detail, void *arg)
{
	struct sconn *sc = arg;
	const msgpack_object *op;
	const struct tw__op *h;
	tw_request *r;
	int rv;
	if (sc->closing) {
		tw_decoded_free(d);
		return;
	}
	if (err != 0) {
		drop(sc, err, detail);
		return;
	}
	if (sc->stream) {
		stream_message(sc, d);
		return;
	}
	op = tw_msgpack_map_get(tw_decoded_root(d), "op");
	if (tw_decoded_root(d)->type != MSGPACK_OBJECT_MAP || op == NULL ||
	    op->type != MSGPACK_OBJECT_STR) {
		tw_decoded_free(d);
		drop(sc, TW_EPROTO, "request is not a map with a str `op`");
		return;
	}
	if ((rv = make_request(sc, d, op, &r)) != 0) {
		tw_decoded_free(d);
		drop(sc, rv, "out of memory");
		return;
	}
	/* compared as msgpack strs: "close\0x" is not "close" */
	if (tw_msgpack_str_eq(op, "connection_stream")) {
		sc->stream = 1; /* no reply: from now on, one-way maps */
		request_free(r);
		return;
	}
	sc->busy = r;
	tw_comm_pause(comm);
	if (tw_msgpack_str_eq(op, "close")) {
		r->close = 1;
		if (r->reply)
			tw_msgpack_pack_str(tw_builder_packer(tw_request_reply_builder(r)), "OK");
		tw_request_reply(r);
		return;
	}
	if ((h = tw__optable_find(&sc->srv->ops, op)) == NULL) {
		tw_request_reply(r); /* unknown op: nil, as Dask does */
		return;
	}
	((tw_op_fn)h->fn)(r, h->arg);
}

static void resume(struct sconn *sc)
{
	if (sc->busy == NULL && sc->pending == NULL)
		tw_comm_resume(sc->comm);
}

static int queue_reply(struct sconn *sc, tw_msg *m);
static int refused_reply(struct sconn *sc, int why);

/* The queue drained: the reply it refused goes now. Refused again for
 * another reason than a full queue, it is handled as a reply refused at
 * once (send_reply): the caller gets "reply not sent: ...", or the comm
 * ends when even that cannot be queued; never parked for ever with the
 * comm paused. */
static void on_drain(tw_comm *comm, void *arg)
{
	struct sconn *sc = arg;
	tw_msg *m = sc->pending;
	int rv;
	if (m != NULL) {
		sc->pending = NULL;
		if ((rv = queue_reply(sc, m)) != 0 && rv != TW_ECLOSED && refused_reply(sc, rv))
			return;
		if (sc->pending == NULL && sc->close_after) {
			tw_comm_close(comm);
			return;
		}
	}
	resume(sc);
}

static void on_close(tw_comm *comm, int err, void *arg)
{
	(void)comm;
	(void)err;
	conn_free(arg);
}

static void on_handshake(tw_comm *comm, int err, const tw_handshake_info *info, void *arg)
{
	struct sconn *sc = arg;
	(void)info;
	if (err != 0 ||
	    tw_comm_set_decoded_callbacks(comm, on_decoded, on_close, on_drain, sc) != 0)
		conn_free(sc);
}

/* The comm joins the server's list at once, so that tw_server_free frees
 * it even in the middle of its handshake. */
static void on_accept(tw_listener *l, tw_comm *comm, void *arg)
{
	tw_server *s = arg;
	unsigned loop = tw_context_loop_index(tw_comm_context(comm)); /* this thread's */
	struct sconn *sc = loop < s->nshards ? calloc(1, sizeof(*sc)) : NULL;
	struct tw__pcomm *p = NULL;
	struct shard *sh;
	(void)l;
	if (sc == NULL || (p = tw__pcomm_get(comm)) == NULL) {
		free(sc);
		tw_comm_free(comm);
		return;
	}
	sh = &s->shards[loop];
	sc->srv = s;
	sc->sh = sh;
	sc->comm = comm;
	p->served = 1; /* never dispatched by anyone else */
	sc->next = sh->conns.next;
	sc->prev = &sh->conns;
	sh->conns.next->prev = sc;
	sh->conns.next = sc;
	if (tw_comm_handshake(comm, TW_HANDSHAKE_LISTENER, on_handshake, sc) != 0)
		conn_free(sc);
}

int tw_server_listen(tw_server *s, const char *uri)
{
	tw_listener **ls, *l;
	int rv;
	if (s == NULL || tw_context_loop_count(s->ctx) != s->nshards)
		return TW_EINVAL; /* loops set after tw_server_new: no shard for them */
	if ((ls = realloc(s->ls, (s->nls + 1) * sizeof(*ls))) == NULL)
		return TW_ENOMEM;
	s->ls = ls;
	if ((rv = tw_listener_new(s->ctx, uri, on_accept, s, &l)) != 0)
		return rv;
	s->ls[s->nls++] = l;
	return 0;
}

int tw_server_address(const tw_server *s, size_t i, char *buf, size_t len)
{
	if (s == NULL || i >= s->nls)
		return TW_ERANGE;
	return tw_listener_address(s->ls[i], buf, len);
}

static void server_free_later(void *arg)
{
	tw_server_free(arg);
}

void tw_server_free(tw_server *s)
{
	tw_context *self;
	if (s == NULL)
		return;
	self = tw__ctx_current();
	if (s->nshards > 1 && self != NULL && self->main == s->ctx) {
		/* on another loop's thread: loop 0 frees the server, after
		 * this callback (that loop's part waits its turn there) */
		s->later.fn = server_free_later;
		s->later.arg = s;
		s->later.owned = 0;
		tw__context_post(s->ctx, &s->later);
		return;
	}
	if (s->shards[0].depth > 0) { /* inside a stream batch: when it ends */
		atomic_store(&s->dying, 1);
		return;
	}
	server_destroy(s);
}

/* On the shard's loop: its comms go. */
static void shard_free(void *arg)
{
	struct shard *sh = arg;
	while (sh->conns.next != &sh->conns)
		conn_free(sh->conns.next);
}

/* On loop 0. The listeners go first; each other loop then runs the
 * accepts already handed to it, then its shard_free (its queue is in
 * order), while this thread waits. */
static void server_destroy(tw_server *s)
{
	for (size_t i = 0; i < s->nls; i++)
		tw_listener_free(s->ls[i]);
	if (s->nshards == 1) /* one loop: this thread's, as before loops */
		shard_free(&s->shards[0]);
	else
		for (unsigned i = s->nshards; i-- > 0;)
			tw__ctx_run_wait(tw_context_loop(s->ctx, i), shard_free, &s->shards[i]);
	tw__optable_fini(&s->ops);
	tw__optable_fini(&s->sops.t);
	free(s->shards);
	free(s->ls);
	free(s);
}

const char *tw_request_op(const tw_request *r)
{
	return r->op;
}

const msgpack_object *tw_request_arg(const tw_request *r, const char *key)
{
	return tw_msgpack_map_get(tw_decoded_root(r->d), key);
}

const tw_decoded *tw_request_decoded(const tw_request *r)
{
	return r->d;
}

int tw_request_wants_reply(const tw_request *r)
{
	return r->reply;
}

tw_comm *tw_request_comm(const tw_request *r)
{
	return r != NULL && r->conn != NULL ? r->conn->comm : NULL;
}

int tw_request_peer_address(const tw_request *r, char *buf, size_t len)
{
	tw_comm *c = tw_request_comm(r);
	return c == NULL ? TW_ECLOSED : tw_comm_peer_address(c, buf, len);
}

int tw_request_keep_stream(tw_request *r, tw_comm **out)
{
	struct sconn *sc = r != NULL ? r->conn : NULL;
	if (r == NULL || out == NULL || r->keep)
		return TW_EINVAL;
	if (sc == NULL || sc->closing ||
	    (tw__comm_state(sc->comm) & (TW__COMM_ENDED | TW__COMM_CLOSING)))
		return TW_ECLOSED;
	r->keep = 1;
	tw_comm_hold(sc->comm);
	*out = sc->comm;
	return 0;
}

tw_builder *tw_request_reply_builder(tw_request *r)
{
	const char *codec = r->conn != NULL ? tw_comm_compression(r->conn->comm) : NULL;
	if (r->b == NULL && tw__builder_init(&r->b_mem, codec) == 0)
		r->b = &r->b_mem;
	return r->b;
}

/* {"status": "uncaught-error", ...}: what Python's rpc raises as an
 * Exception (Dask's distributed/core.py error_message; docs/design.md,
 * Handshake and server). */
static void pack_error(msgpack_packer *pk, const char *e, const char *tb)
{
	msgpack_pack_map(pk, 5);
	tw_msgpack_pack_str(pk, "status");
	tw_msgpack_pack_str(pk, "uncaught-error");
	tw_msgpack_pack_str(pk, "exception");
	tw_msgpack_pack_str(pk, e);
	tw_msgpack_pack_str(pk, "traceback");
	msgpack_pack_nil(pk);
	tw_msgpack_pack_str(pk, "exception_text");
	tw_msgpack_pack_str(pk, e);
	tw_msgpack_pack_str(pk, "traceback_text");
	tw_msgpack_pack_str(pk, tb);
}

/* Queue m; TW_EAGAIN parks it until the drain callback. */
static int queue_reply(struct sconn *sc, tw_msg *m)
{
	int rv = tw_comm_write(sc->comm, m);
	if (rv == TW_EAGAIN) {
		sc->pending = m;
		rv = 0;
	} else if (rv != 0) {
		tw_msg_free(m);
	}
	return rv;
}

/* The comm refused a reply (more frames than its limit): the caller gets
 * an error reply saying so at once, not silence until its timeout. When
 * even that fails the comm ends, which fails the call, and sc is gone:
 * returns 1 then. */
static int refused_reply(struct sconn *sc, int why)
{
	char text[128];
	tw_builder b;
	tw_msg *m = NULL;
	snprintf(text, sizeof(text), "reply not sent: %s", tw_strerror(why));
	if (tw__builder_init(&b, tw_comm_compression(sc->comm)) == 0) {
		pack_error(tw_builder_packer(&b), text, "");
		if (tw_builder_finish(&b, &m) != 0)
			m = NULL;
		tw__builder_fini(&b);
	}
	if (m != NULL && queue_reply(sc, m) == 0)
		return 0;
	drop(sc, why, text);
	return 1;
}

/* Send the finished reply; close or read on. */
static int send_reply(struct sconn *sc, tw_request *r, tw_msg *m)
{
	int rv = 0;
	sc->busy = NULL;
	if (m != NULL && (rv = queue_reply(sc, m)) != 0 && rv != TW_ECLOSED &&
	    refused_reply(sc, rv))
		return rv;
	if (r->close && sc->pending != NULL)
		sc->close_after = 1; /* the reply first: on_drain closes */
	else if (r->close)
		tw_comm_close(sc->comm);
	else
		resume(sc);
	return rv;
}

int tw_request_reply(tw_request *r)
{
	struct sconn *sc = r->conn;
	tw_msg *m = NULL;
	int rv = 0;
	if (sc == NULL) {
		request_free(r);
		return TW_ECLOSED;
	}
	if (r->keep) {
		/* Dask's add_worker and add_client write their one message
		 * on a reply:false request's comm, then read it as a stream */
		sc->stream = 1;
		r->close = 0;
	}
	if (r->reply || (r->keep && r->b != NULL && !tw__builder_empty(r->b))) {
		if (tw_request_reply_builder(r) == NULL)
			rv = TW_ENOMEM;
		else if (tw__builder_empty(r->b))
			msgpack_pack_nil(tw_builder_packer(r->b));
		if (rv == 0)
			rv = tw_builder_finish(r->b, &m);
	}
	if (rv != 0) {
		sc->busy = NULL;
		request_free(r);
		drop(sc, rv, "out of memory for a reply");
		return rv;
	}
	rv = send_reply(sc, r, m);
	request_free(r);
	return rv;
}

int tw_request_reply_error(tw_request *r, const char *exception_text, const char *traceback_text)
{
	tw_builder *b;
	const char *e = exception_text != NULL ? exception_text : "";
	if (r->b != NULL && !tw__builder_empty(r->b)) {
		/* the error replaces a reply the handler had begun to pack */
		tw__builder_fini(r->b);
		r->b = NULL;
	}
	if ((b = tw_request_reply_builder(r)) == NULL)
		return tw_request_reply(r); /* reports the same error */
	pack_error(tw_builder_packer(b), e, traceback_text != NULL ? traceback_text : "");
	return tw_request_reply(r);
}
