/* SPDX-License-Identifier: BSD-3-Clause */
/* Accepted comms (Dask's Server.handle_comm and handle_stream): the
 * handshake, then requests served one at a time; register-worker and
 * register-client turn the comm into that peer's stream, whose messages
 * (a map or an array of maps) go to the stream ops by `op`. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "examples/mini-scheduler/sched.h"

static struct conn *open_conns;

void conn_abort_all(void)
{
	struct conn *c = open_conns, *next;
	for (; c != NULL; c = next) {
		next = c->next;
		tw_comm_abort(c->comm); /* on_close unlinks it */
	}
}

void conn_release(struct conn *c)
{
	if (c != NULL && --c->refs == 0)
		free(c);
}

tw_builder *builder_new(void)
{
	tw_builder *b;
	if (tw_builder_new(NULL, &b) != 0) {
		fputs("tw-mini-scheduler: out of memory\n", stderr);
		exit(1);
	}
	return b;
}

int obj_str(const msgpack_object *o, const char **s, size_t *n)
{
	if (o == NULL)
		return -1;
	if (o->type == MSGPACK_OBJECT_STR) {
		*s = o->via.str.ptr;
		*n = o->via.str.size;
		return 0;
	}
	if (o->type == MSGPACK_OBJECT_BIN) {
		*s = o->via.bin.ptr;
		*n = o->via.bin.size;
		return 0;
	}
	return -1;
}

static void write_msg(struct conn *c, tw_builder *b)
{
	tw_msg *m;
	int rv = tw_builder_finish(b, &m);
	tw_builder_free(b);
	if (rv == 0 && (rv = tw_comm_write(c->comm, m)) != 0)
		tw_msg_free(m);
	if (rv != 0) {
		say("%s: reply not sent: %s\n", c->peer, tw_strerror(rv));
		tw_comm_abort(c->comm);
	}
}

/* The comm was paused while a deferred reply was due (Dask's comms carry
 * one request at a time; this keeps a pipelining peer in order too). */
void reply_send(struct conn *c, tw_builder *b)
{
	if (c->comm != NULL && !c->no_reply)
		write_msg(c, b);
	else
		tw_builder_free(b);
	if (c->comm != NULL && c->paused) {
		c->paused = 0;
		tw_comm_resume(c->comm);
	}
}

/* Dask's error reply (core.py error_message): Python's rpc raises it. */
void reply_error(struct conn *c, const char *text)
{
	tw_builder *b = builder_new();
	msgpack_packer *pk = tw_builder_packer(b);
	msgpack_pack_map(pk, 5);
	tw_pack_str(pk, "status");
	tw_pack_str(pk, "uncaught-error");
	tw_pack_str(pk, "exception");
	tw_pack_str(pk, text);
	tw_pack_str(pk, "traceback");
	msgpack_pack_nil(pk);
	tw_pack_str(pk, "exception_text");
	tw_pack_str(pk, text);
	tw_pack_str(pk, "traceback_text");
	tw_pack_str(pk, "");
	reply_send(c, b);
}

void stream_send(tw_batched *out, const msgpack_sbuffer *sb)
{
	int rv = out ? tw_batched_send(out, sb->data, sb->size) : TW_ECLOSED;
	/* TW_EAGAIN: one map is always taken, and the scheduler sends few. */
	if (rv != 0 && rv != TW_ECLOSED)
		say("stream message not sent: %s\n", tw_strerror(rv));
}

static int truthy(const msgpack_object *o)
{
	if (o == NULL)
		return 1; /* absent: the default, true */
	switch (o->type) {
	case MSGPACK_OBJECT_NIL: return 0;
	case MSGPACK_OBJECT_BOOLEAN: return o->via.boolean;
	case MSGPACK_OBJECT_POSITIVE_INTEGER: return o->via.u64 != 0;
	default: return 1;
	}
}

/* One request. Returns 1 when its reply comes later. */
static int serve(struct conn *c, tw_decoded **dp, const msgpack_object *req)
{
	const msgpack_object *op = tw_map_get(req, "op");
	c->no_reply = !truthy(tw_map_get(req, "reply"));
	if (tw_obj_str_eq(op, "identity"))
		return op_identity(c);
	if (tw_obj_str_eq(op, "heartbeat_worker"))
		return op_heartbeat_worker(c, dp, req);
	if (tw_obj_str_eq(op, "register-worker"))
		return op_register_worker(c, dp, req);
	if (tw_obj_str_eq(op, "register-client"))
		return op_register_client(c, req);
	if (tw_obj_str_eq(op, "scatter"))
		return op_scatter(c, *dp, req);
	if (tw_obj_str_eq(op, "gather"))
		return op_gather(c, req);
	if (tw_obj_str_eq(op, "who_has"))
		return op_who_has(c, req);
	if (tw_obj_str_eq(op, "ncores"))
		return op_ncores(c, req, 0);
	if (tw_obj_str_eq(op, "ncores_running"))
		return op_ncores(c, req, 1);
	if (tw_obj_str_eq(op, "unregister"))
		return op_unregister(c, req);
	if (tw_obj_str_eq(op, "close")) {
		tw_comm_close(c->comm);
		return 0;
	}
	{
		char text[160];
		const char *s = "";
		size_t n = 0;
		obj_str(op, &s, &n);
		snprintf(text, sizeof(text), "tw-mini-scheduler has no op '%.*s'",
			 (int)(n > 80 ? 80 : n), s);
		say("%s: %s\n", c->peer, text);
		reply_error(c, text);
	}
	return 0;
}

static void stream_map(struct conn *c, const msgpack_object *m)
{
	const msgpack_object *op = tw_map_get(m, "op");
	if (tw_obj_str_eq(op, "close-stream"))
		tw_comm_close(c->comm);
	else if (c->mode == CONN_WORKER && c->worker != NULL)
		worker_stream_op(c->worker, m);
	else if (c->mode == CONN_CLIENT && c->client != NULL)
		client_stream_op(c->client, m);
}

static void on_decoded(tw_comm *comm, tw_decoded *d, int err, const char *detail, void *arg)
{
	struct conn *c = arg;
	const msgpack_object *root;
	if (err != 0) {
		say("%s: undecodable message: %s: %s\n", c->peer, tw_strerror(err), detail);
		tw_comm_abort(comm);
		return;
	}
	root = tw_decoded_root(d);
	c->refs++; /* an abort below ends the comm at once */
	if (c->mode == CONN_REQUESTS) {
		if (root->type != MSGPACK_OBJECT_MAP || tw_map_get(root, "op") == NULL) {
			say("%s: a request that is not a map with op\n", c->peer);
			tw_comm_abort(comm);
		} else if (serve(c, &d, root) == 1 && c->comm != NULL) {
			c->paused = 1;
			tw_comm_pause(comm);
		}
	} else if (root->type == MSGPACK_OBJECT_ARRAY) {
		for (uint32_t i = 0; i < root->via.array.size && c->comm != NULL; i++)
			stream_map(c, &root->via.array.ptr[i]);
	} else if (root->type == MSGPACK_OBJECT_MAP) {
		stream_map(c, root);
	}
	tw_decoded_free(d);
	conn_release(c);
}

static void on_close(tw_comm *comm, int err, void *arg)
{
	struct conn *c = arg;
	char why[300];
	snprintf(why, sizeof(why), "its stream ended: %s%s%s", err ? tw_strerror(err) : "closed",
		 *tw_comm_last_error(comm) ? ": " : "", tw_comm_last_error(comm));
	tw_comm_free(comm);
	c->comm = NULL;
	if (c->prev != NULL)
		c->prev->next = c->next;
	else
		open_conns = c->next;
	if (c->next != NULL)
		c->next->prev = c->prev;
	if (c->worker != NULL)
		worker_remove(c->worker, why);
	if (c->client != NULL)
		client_remove(c->client);
	conn_release(c);
}

static void on_handshake(tw_comm *comm, int err, const tw_handshake_info *info, void *arg)
{
	struct conn *c;
	(void)info;
	(void)arg;
	if (err != 0) {
		say("handshake failed: %s: %s\n", tw_strerror(err), tw_comm_last_error(comm));
		tw_comm_free(comm);
		return;
	}
	if ((c = calloc(1, sizeof(*c))) == NULL) {
		tw_comm_free(comm);
		return;
	}
	c->comm = comm;
	c->refs = 1;
	c->mode = CONN_REQUESTS;
	if (tw_comm_peer_address(comm, c->peer, sizeof(c->peer)) != 0)
		strcpy(c->peer, "?");
	if (tw_comm_set_decoded_callbacks(comm, on_decoded, on_close, NULL, c) != 0) {
		free(c);
		tw_comm_free(comm);
		return;
	}
	c->next = open_conns;
	if (open_conns != NULL)
		open_conns->prev = c;
	open_conns = c;
}

void conn_accept(tw_listener *l, tw_comm *comm, void *arg)
{
	(void)l;
	(void)arg;
	if (tw_comm_handshake(comm, 1, on_handshake, NULL) != 0)
		tw_comm_free(comm);
}
