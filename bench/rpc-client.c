/* SPDX-License-Identifier: BSD-3-Clause */
/* rpc-client: taskwire's side of bench/rpc-bench.sh: COUNT sequential
 * calls of op echo with a 10-byte payload through a tw_pool (one pooled
 * comm), against tw-rpc-server.
 *
 *   rpc-client URI COUNT   prints "taskwire: N round trips/s, p50 X us, p99 Y us"
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>

#include <taskwire/taskwire.h>

#include "examples/common.h"

struct bench {
	struct event_base *base;
	tw_pool *pool;
	const char *uri;
	long count, done;
	double *lat, t;
	int failed;
};

static void next(struct bench *b);

static void on_reply(tw_call *c, int err, tw_decoded *reply, void *arg)
{
	struct bench *b = arg;
	const msgpack_object *o = reply != NULL ? tw_decoded_root(reply) : NULL;
	(void)c;
	if (err != 0 || o->type != MSGPACK_OBJECT_BIN || o->via.bin.size != 10) {
		b->failed = 1;
		event_base_loopbreak(b->base);
	} else {
		b->lat[b->done++] = (tw_ex_now() - b->t) * 1e6;
		next(b);
	}
	tw_decoded_free(reply);
}

static void next(struct bench *b)
{
	tw_msg *m;
	if (b->done == b->count) {
		event_base_loopbreak(b->base);
		return;
	}
	m = tw_ex_small_echo();
	b->t = tw_ex_now();
	if (m == NULL || tw_pool_call(b->pool, b->uri, m, 10000, on_reply, b, NULL) != 0) {
		tw_msg_free(m);
		b->failed = 1;
		event_base_loopbreak(b->base);
	}
}

static int cmp(const void *x, const void *y)
{
	double a = *(const double *)x, c = *(const double *)y;
	return a < c ? -1 : a > c;
}

int main(int argc, char **argv)
{
	struct bench b;
	tw_context *ctx;
	double t0, secs;
	if (argc != 3) {
		fprintf(stderr, "usage: rpc-client URI COUNT\n");
		return 2;
	}
	memset(&b, 0, sizeof(b));
	b.uri = argv[1];
	b.count = atol(argv[2]);
	b.lat = malloc((size_t)b.count * sizeof(double));
	b.base = event_base_new();
	if (b.lat == NULL || tw_context_new(b.base, &ctx) != 0 || tw_pool_new(ctx, &b.pool) != 0)
		return 1;
	t0 = tw_ex_now();
	next(&b);
	event_base_dispatch(b.base);
	secs = tw_ex_now() - t0;
	tw_pool_free(b.pool);
	tw_context_free(ctx);
	event_base_free(b.base);
	if (b.failed || b.done == 0)
		return 1;
	qsort(b.lat, (size_t)b.done, sizeof(double), cmp);
	printf("taskwire: %.0f round trips/s, p50 %.1f us, p99 %.1f us\n", (double)b.done / secs,
	       b.lat[b.done / 2], b.lat[b.done * 99 / 100]);
	free(b.lat);
	return 0;
}
