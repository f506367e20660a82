/* SPDX-License-Identifier: BSD-3-Clause */
/* tw-scheduler-probe: talk to a real Dask scheduler the way a client does.
 *
 *   tw-scheduler-probe URI [--seconds N] [TLS options]
 *
 * Prints the scheduler's identity (op identity), opens a client stream
 * (op register-client), waits for stream-start, sends heartbeat-client
 * through a batched sender for N seconds (default 3), then closes the
 * stream cleanly (close-client, close-stream) and waits for the
 * scheduler to end it. Exits 0 when every step succeeded. */
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <event2/event.h>

#include <taskwire/taskwire.h>

#include "examples/common.h"

struct probe {
	struct event_base *base;
	tw_context *ctx;
	tw_comm *comm;
	tw_batched *batch;
	struct event *tick;
	int beats, max_beats, started, closing, failed, ended;
	char name[64];
};

static tw_msg *op_message(const char *op)
{
	tw_builder *b;
	tw_msg *m = NULL;
	if (tw_builder_new(NULL, &b) != 0)
		return NULL;
	msgpack_pack_map(tw_builder_packer(b), 1);
	tw_msgpack_pack_str(tw_builder_packer(b), "op");
	tw_msgpack_pack_str(tw_builder_packer(b), op);
	tw_builder_finish(b, &m);
	tw_builder_free(b);
	return m;
}

static void print_value(const msgpack_object *o)
{
	msgpack_object_print(stdout, *o);
	printf("\n");
}

static int identity(tw_context *ctx, const char *uri)
{
	tw_decoded *reply = NULL;
	int rv = tw_rpc_call_sync(ctx, uri, op_message("identity"), 10000, &reply);
	if (rv != 0) {
		fprintf(stderr, "tw-scheduler-probe: identity: %s: %s\n", tw_strerror(rv),
			tw_context_last_error(ctx));
		tw_decoded_free(reply);
		return -1;
	}
	printf("identity: ");
	print_value(tw_decoded_root(reply));
	tw_decoded_free(reply);
	return 0;
}

/* One map {"op": op, "client": name} to the batched sender. */
static void batch_op(struct probe *p, const char *op)
{
	tw_ex_batch_op(p->batch, op, "client", p->name, strlen(p->name));
}

static void on_tick(evutil_socket_t fd, short what, void *arg)
{
	struct probe *p = arg;
	(void)fd;
	(void)what;
	if (p->beats < p->max_beats) {
		batch_op(p, "heartbeat-client");
		printf("sent heartbeat-client %d\n", ++p->beats);
		return;
	}
	event_del(p->tick);
	batch_op(p, "close-client");
	batch_op(p, "close-stream");
	tw_batched_flush(p->batch);
	p->closing = 1;
	printf("sent close-client, close-stream\n");
}

/* Each message from the scheduler is a list of maps (its BatchedSend). */
static void on_stream(tw_comm *comm, tw_decoded *d, int err, const char *detail, void *arg)
{
	struct probe *p = arg;
	const msgpack_object *root;
	struct timeval half = {0, 500000};
	(void)comm;
	if (err != 0) {
		fprintf(stderr, "tw-scheduler-probe: bad message: %s\n", detail);
		p->failed = 1;
		return;
	}
	root = tw_decoded_root(d);
	for (uint32_t i = 0; root->type == MSGPACK_OBJECT_ARRAY && i < root->via.array.size; i++) {
		const msgpack_object *op = tw_msgpack_map_get(&root->via.array.ptr[i], "op");
		if (op == NULL)
			continue;
		printf("scheduler says: %.*s\n", (int)op->via.str.size, op->via.str.ptr);
		if (tw_msgpack_str_eq(op, "stream-start") && !p->started) {
			p->started = 1;
			event_add(p->tick, &half);
		}
	}
	tw_decoded_free(d);
}

static void on_close(tw_comm *comm, int err, void *arg)
{
	struct probe *p = arg;
	(void)comm;
	if (!p->closing || !p->started) {
		fprintf(stderr, "tw-scheduler-probe: stream ended early: %s: %s\n",
			tw_strerror(err), tw_comm_last_error(comm));
		p->failed = 1;
	} else {
		printf("stream closed by the scheduler\n");
	}
	p->ended = 1;
	event_base_loopbreak(p->base);
}

static void register_client(struct probe *p)
{
	tw_builder *b;
	msgpack_packer *pk;
	tw_msg *m;
	tw_builder_new(NULL, &b);
	pk = tw_builder_packer(b);
	msgpack_pack_map(pk, 4);
	tw_msgpack_pack_str(pk, "op");
	tw_msgpack_pack_str(pk, "register-client");
	tw_msgpack_pack_str(pk, "client");
	tw_msgpack_pack_str(pk, p->name);
	tw_msgpack_pack_str(pk, "versions");
	msgpack_pack_map(pk, 1);
	tw_msgpack_pack_str(pk, "packages");
	msgpack_pack_map(pk, 0);
	tw_msgpack_pack_str(pk, "reply");
	msgpack_pack_false(pk);
	tw_builder_finish(b, &m);
	tw_builder_free(b);
	if (tw_comm_write(p->comm, m) != 0) {
		tw_msg_free(m);
		p->failed = 1;
		event_base_loopbreak(p->base);
	}
}

static void on_handshake(tw_comm *comm, int err, const tw_handshake_info *info, void *arg)
{
	struct probe *p = arg;
	(void)info;
	if (err != 0 || tw_comm_set_decoded_callbacks(comm, on_stream, on_close, NULL, p) != 0 ||
	    tw_batched_new(comm, 0, &p->batch) != 0) {
		fprintf(stderr, "tw-scheduler-probe: handshake: %s\n", tw_strerror(err));
		p->failed = 1;
		p->comm = comm;
		event_base_loopbreak(p->base);
		return;
	}
	p->comm = comm;
	register_client(p);
	printf("sent register-client as %s\n", p->name);
}

static void on_connect(tw_comm *comm, int err, void *arg)
{
	struct probe *p = arg;
	if (err == 0 &&
	    (err = tw_comm_handshake(comm, TW_HANDSHAKE_CONNECTOR, on_handshake, p)) == 0)
		return;
	fprintf(stderr, "tw-scheduler-probe: connect: %s: %s\n", tw_strerror(err),
		tw_context_last_error(p->ctx));
	tw_ex_give_up(comm, &p->failed, p->base);
}

static void usage(FILE *f)
{
	fprintf(f, "usage: tw-scheduler-probe URI [--seconds N] [TLS options]\n" TW_EX_TLS_USAGE
		   "  Identity, then a client stream with heartbeats for N seconds (default 3),\n"
		   "  then a clean close, against a Dask scheduler at URI.\n");
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {{"seconds", required_argument, NULL, 's'},
					     {"help", no_argument, NULL, 'h'},
					     TW_EX_TLS_OPTIONS,
					     {NULL, 0, NULL, 0}};
	struct probe p;
	struct tw_ex_tls tls = {NULL, NULL, NULL};
	const char *uri;
	int o, seconds = 3;
	memset(&p, 0, sizeof(p));
	while ((o = getopt_long(argc, argv, "s:h", opts, NULL)) != -1) {
		switch (o) {
		case 's': seconds = atoi(optarg); break;
		case 'h': usage(stdout); return 0;
		default: tw_ex_other_option(&tls, o, optarg, usage);
		}
	}
	uri = tw_ex_uri_arg(argc, argv, usage);
	signal(SIGPIPE, SIG_IGN);
	p.max_beats = seconds * 2;
	snprintf(p.name, sizeof(p.name), "tw-scheduler-probe-%ld", (long)getpid());
	p.base = event_base_new();
	if (p.base == NULL || tw_context_new(p.base, &p.ctx) != 0)
		return 1;
	tw_ex_tls_setup(p.ctx, &tls);
	if (identity(p.ctx, uri) != 0)
		return 1;
	p.tick = event_new(p.base, -1, EV_PERSIST, on_tick, &p);
	if (tw_comm_connect(p.ctx, uri, on_connect, &p) != 0)
		return 1;
	event_base_dispatch(p.base);
	tw_batched_free(p.batch);
	tw_comm_free(p.comm);
	event_free(p.tick);
	tw_context_free(p.ctx);
	event_base_free(p.base);
	printf("%s\n", p.failed ? "probe FAILED" : "probe ok");
	return p.failed ? 1 : 0;
}
