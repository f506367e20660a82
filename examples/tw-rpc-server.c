/* SPDX-License-Identifier: BSD-3-Clause */
/* tw-rpc-server: a taskwire server with a few ops, callable from Python's
 * distributed.core.rpc and from taskwire clients.
 *
 *   tw-rpc-server tcp://127.0.0.1:8786 [more URIs]
 *
 * Ops: identity, echo(data) (built in); sum(data): the sum of `data` read
 * as little-endian float64 values (out-of-band or inline bytes); slow(delay):
 * replies "done" after `delay` seconds without blocking other comms (a
 * deferred reply); nbytes(data): the length of `data`; fail(): replies
 * with an uncaught-error. */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>

#include <taskwire/taskwire.h>

#include "examples/common.h"

/* The bytes of argument `key`: an out-of-band payload or inline bin. */
static int arg_bytes(tw_request *r, const char *key, const uint8_t **p, size_t *n)
{
	return tw_decoded_bytes(tw_request_decoded(r), tw_request_arg(r, key), p, n);
}

static void op_sum(tw_request *r, void *arg)
{
	const uint8_t *p;
	size_t n;
	double sum = 0, v;
	tw_builder *b;
	(void)arg;
	if (arg_bytes(r, "data", &p, &n) != 0 || n % 8 != 0) {
		tw_request_reply_error(r, "sum: `data` must be bytes of float64 values", NULL);
		return;
	}
	for (size_t i = 0; i < n; i += 8) {
		memcpy(&v, p + i, 8);
		sum += v;
	}
	if ((b = tw_request_reply_builder(r)) != NULL)
		msgpack_pack_double(tw_builder_packer(b), sum);
	tw_request_reply(r);
}

struct slow {
	tw_request *req;
	struct event *ev;
};

static void slow_done(evutil_socket_t fd, short what, void *arg)
{
	struct slow *s = arg;
	tw_builder *b = tw_request_reply_builder(s->req);
	(void)fd;
	(void)what;
	if (b != NULL) {
		tw_msgpack_pack_str(tw_builder_packer(b), "done");
	}
	tw_request_reply(s->req);
	event_free(s->ev);
	free(s);
}

static void op_slow(tw_request *r, void *arg)
{
	const msgpack_object *d = tw_request_arg(r, "delay");
	double delay = 1.0;
	struct slow *s = calloc(1, sizeof(*s));
	struct timeval tv;
	if (d != NULL && d->type == MSGPACK_OBJECT_FLOAT64)
		delay = d->via.f64;
	else if (d != NULL && d->type == MSGPACK_OBJECT_POSITIVE_INTEGER)
		delay = (double)d->via.u64;
	if (s == NULL || !(delay >= 0 && delay < 3600)) {
		free(s);
		tw_request_reply_error(r, "slow: `delay` must be 0 to 3600 seconds", NULL);
		return;
	}
	s->req = r;
	s->ev = evtimer_new(arg, slow_done, s);
	tv.tv_sec = (time_t)delay;
	tv.tv_usec = (suseconds_t)((delay - floor(delay)) * 1e6);
	evtimer_add(s->ev, &tv);
}

static void op_nbytes(tw_request *r, void *arg)
{
	const uint8_t *p;
	size_t n;
	tw_builder *b;
	(void)arg;
	if (arg_bytes(r, "data", &p, &n) != 0) {
		tw_request_reply_error(r, "nbytes: `data` must be bytes", NULL);
		return;
	}
	if ((b = tw_request_reply_builder(r)) != NULL)
		msgpack_pack_uint64(tw_builder_packer(b), n);
	tw_request_reply(r);
}

static void op_fail(tw_request *r, void *arg)
{
	(void)arg;
	tw_request_reply_error(r, "fail: this op always fails", "tw-rpc-server op_fail");
}

int main(int argc, char **argv)
{
	struct event_base *base;
	tw_context *ctx;
	tw_server *srv;
	char addr[128];
	const char *offload = getenv("TW_OFFLOAD_THRESHOLD");
	if (argc < 2 || strcmp(argv[1], "--help") == 0) {
		fprintf(argc < 2 ? stderr : stdout,
			"usage: tw-rpc-server URI [URI ...]\n"
			"  Serve these ops on each URI (tcp:// or ws://: no TLS options; port 0\n"
			"  picks a free port); prints each bound address:\n"
			"    identity, echo(data), sum(data: bytes of little-endian float64s),\n"
			"    slow(delay: seconds, replies \"done\"), nbytes(data: bytes), fail()\n"
			"  TW_OFFLOAD_THRESHOLD=BYTES|off in the environment sets the offload "
			"threshold.\n");
		return argc < 2 ? 2 : 0;
	}
	signal(SIGPIPE, SIG_IGN);
	if ((base = event_base_new()) == NULL || tw_context_new(base, &ctx) != 0 ||
	    tw_server_new(ctx, &srv) != 0)
		return 1;
	if (offload != NULL)
		tw_context_set_offload_threshold_bytes(ctx, strcmp(offload, "off") == 0
								    ? TW_OFFLOAD_NEVER
								    : strtoull(offload, NULL, 10));
	tw_server_add_op(srv, "sum", op_sum, NULL);
	tw_server_add_op(srv, "slow", op_slow, base);
	tw_server_add_op(srv, "fail", op_fail, NULL);
	tw_server_add_op(srv, "nbytes", op_nbytes, NULL);
	for (int i = 1; i < argc; i++) {
		int rv = tw_server_listen(srv, argv[i]);
		if (rv != 0) {
			fprintf(stderr, "tw-rpc-server: cannot listen on %s: %s\n", argv[i],
				tw_strerror(rv));
			return 1;
		}
		tw_server_address(srv, (size_t)i - 1, addr, sizeof(addr));
		printf("listening on %s\n", addr);
	}
	fflush(stdout);
	tw_ex_run_until_signal(base);
	tw_server_free(srv);
	tw_context_free(ctx);
	event_base_free(base);
	return 0;
}
