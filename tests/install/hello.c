/* SPDX-License-Identifier: BSD-3-Clause */
/* Built by tests/check_install.sh against an installed taskwire, with
 * nothing but `pkg-config --cflags --libs taskwire`: one echo over tcp on
 * 127.0.0.1 through the public API, and a Dask message round trip. */
#include <stdio.h>
#include <string.h>

#include <event2/event.h>

#include <taskwire/taskwire.h>

static int got;

static void on_recv(tw_comm *comm, tw_msg *msg, void *arg)
{
	const tw_slice *f = tw_msg_frame(msg, 0);
	(void)arg;
	if (tw_msg_nframes(msg) == 1 && f->len == 5 && memcmp(tw_slice_data(f), "hello", 5) == 0)
		got = 1;
	tw_comm_close(comm);
}

static void on_close(tw_comm *comm, int err, void *arg)
{
	(void)err;
	tw_comm_free(comm);
	if (arg != NULL)
		event_base_loopbreak(arg);
}

static void on_srv_recv(tw_comm *comm, tw_msg *msg, void *arg)
{
	(void)arg;
	if (tw_comm_write(comm, tw_msg_hold(msg)) != 0)
		tw_msg_free(msg);
}

static void on_accept(tw_listener *l, tw_comm *comm, void *arg)
{
	(void)l;
	(void)arg;
	tw_comm_set_callbacks(comm, on_srv_recv, on_close, NULL, NULL);
}

static void on_connect(tw_comm *comm, int err, void *arg)
{
	tw_msg *m;
	if (err != 0) {
		event_base_loopbreak(arg);
		return;
	}
	tw_comm_set_callbacks(comm, on_recv, on_close, NULL, arg);
	tw_msg_new(&m);
	tw_msg_append_copy(m, "hello", 5);
	if (tw_comm_write(comm, m) != 0)
		tw_msg_free(m);
}

static int dask_round_trip(void)
{
	tw_builder *b;
	tw_msg *m;
	tw_decoded *d;
	int ok;
	if (tw_builder_new(NULL, &b) != 0)
		return 0;
	msgpack_pack_map(tw_builder_packer(b), 1);
	msgpack_pack_str(tw_builder_packer(b), 2);
	msgpack_pack_str_body(tw_builder_packer(b), "op", 2);
	msgpack_pack_str(tw_builder_packer(b), 4);
	msgpack_pack_str_body(tw_builder_packer(b), "ping", 4);
	if (tw_builder_finish(b, &m) != 0 || tw_decode(m, NULL, &d, NULL, 0) != 0)
		return 0;
	ok = tw_msgpack_str_eq(tw_msgpack_map_get(tw_decoded_root(d), "op"), "ping");
	tw_decoded_free(d);
	tw_msg_free(m);
	tw_builder_free(b);
	return ok;
}

int main(void)
{
	struct event_base *base = event_base_new();
	tw_context *ctx;
	tw_listener *l;
	char addr[128];
	if (base == NULL || tw_context_new(base, &ctx) != 0 ||
	    tw_listener_new(ctx, "tcp://127.0.0.1:0", on_accept, NULL, &l) != 0 ||
	    tw_listener_address(l, addr, sizeof(addr)) != 0 ||
	    tw_comm_connect(ctx, addr, on_connect, base) != 0)
		return 1;
	event_base_dispatch(base);
	tw_listener_free(l);
	tw_context_free(ctx);
	event_base_free(base);
	if (!got || !dask_round_trip()) {
		fprintf(stderr, "hello: echo %s, dask message %s\n", got ? "ok" : "FAILED",
			dask_round_trip() ? "ok" : "FAILED");
		return 1;
	}
	printf("hello: echo over %s ok, dask message ok\n", addr);
	return 0;
}
