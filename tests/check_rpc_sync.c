/* SPDX-License-Identifier: BSD-3-Clause */
/* tw_rpc_call_sync on a context with the caller's own base (the call runs
 * the loop, which also serves the in-process server) and on a context
 * with its own loop thread (the caller waits; several threads at once). */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include <check.h>

#include "tests/check_rpc.h"
#include "tests/support/rpc.h"
#include "tests/support/suite.h"

/* *reply starts as a pointer no call may leave there: every error must
 * set it NULL (a caller's tw_decoded_free of it then does nothing). */
static int sync_call(tw_context *ctx, const char *uri, tw_msg *req, uint32_t ms, tw_decoded **reply)
{
	static char poison;
	*reply = (tw_decoded *)(void *)&poison;
	return tw_rpc_call_sync(ctx, uri, req, ms, reply);
}

/* The request is taken whatever the error: refused ones are freed too
 * (the caller freeing one after TW_EINVAL was a use-after-free). Counted
 * when no other thread allocates (`own_base`); under valgrind and ASan a
 * leak or a double free shows either way. */
static void refused_requests_are_freed(tw_context *ctx, const char *addr, int own_base)
{
	char long_uri[300];
	tw_decoded *d;
	tw_msg *empty;
	tw_stats before, after;
	memset(long_uri, 'a', sizeof(long_uri) - 1);
	memcpy(long_uri, "tcp://", 6);
	long_uri[sizeof(long_uri) - 1] = '\0';
	ck_assert_int_eq(tw_msg_new(&empty), 0);
	tw_stats_global(&before, sizeof(before));
	ck_assert_int_eq(sync_call(ctx, long_uri, rq_op("identity"), 10000, &d), TW_EINVAL);
	ck_assert_ptr_null(d);
	ck_assert_int_eq(sync_call(ctx, addr, empty, 10000, &d), TW_EINVAL);
	ck_assert_ptr_null(d);
	ck_assert_int_eq(sync_call(NULL, addr, rq_op("identity"), 10000, &d), TW_EINVAL);
	ck_assert_ptr_null(d);
	tw_stats_global(&after, sizeof(after));
	/* the requests' blocks were allocated, and all of them freed */
	ck_assert_uint_gt(after.blocks_allocated, before.blocks_allocated);
	if (own_base)
		ck_assert_uint_eq(after.blocks_live, before.blocks_live);
}

/* The checks shared by both kinds of context. */
static void sync_checks(tw_context *ctx, const char *addr, int own_base)
{
	tw_decoded *d;
	char refused[64];
	ck_assert_int_eq(sync_call(ctx, addr, rq_op("identity"), 10000, &d), 0);
	ck_assert(tw_msgpack_str_eq(tw_msgpack_map_get(tw_decoded_root(d), "type"), "taskwire"));
	tw_decoded_free(d);
	ck_assert_int_eq(sync_call(ctx, addr, rq_echo_str("sync"), 10000, &d), 0);
	ck_assert(tw_msgpack_str_eq(tw_decoded_root(d), "sync"));
	tw_decoded_free(d);
	ck_assert_int_eq(sync_call(ctx, addr, rq_slow(0.05), 10000, &d), 0);
	ck_assert(tw_msgpack_str_eq(tw_decoded_root(d), "done"));
	tw_decoded_free(d);
	ck_assert_int_eq(sync_call(ctx, addr, rq_op("fail"), 10000, &d), TW_EREMOTE);
	ck_assert_ptr_nonnull(d);
	ck_assert(tw_msgpack_str_eq(tw_msgpack_map_get(tw_decoded_root(d), "exception_text"),
				    "fail: this op always fails"));
	tw_decoded_free(d);
	ck_assert_int_eq(sync_call(ctx, addr, rq_slow(1.0), 100, &d), TW_ETIMEDOUT);
	ck_assert_ptr_null(d);
	/* the call's own reason, on the context */
	ck_assert_ptr_nonnull(strstr(tw_context_last_error(ctx),
				     "within 100 ms: the request was sent and no reply came"));
	ru_refused_uri(refused, sizeof(refused));
	ck_assert_int_eq(sync_call(ctx, refused, rq_op("identity"), 10000, &d), TW_ECONNREFUSED);
	ck_assert_ptr_null(d);
	ck_assert_ptr_nonnull(strstr(tw_context_last_error(ctx), "Connection refused"));
	refused_requests_are_freed(ctx, addr, own_base);
}

START_TEST(sync_own_base)
{
	struct tu h;
	struct rs s;
	tu_init(&h);
	rs_start(&s, h.ctx, h.base, "tcp://127.0.0.1:0");
	sync_checks(h.ctx, s.addr, 1);
	rs_stop(&s);
	tu_fini(&h);
}
END_TEST

/* A server on a context with its own loop thread, set up and torn down
 * on that thread. */
struct tsrv {
	tw_context *ctx;
	struct rs s;
	pthread_mutex_t lock;
	pthread_cond_t cv;
	int done;
};

static void tsrv_signal(struct tsrv *t)
{
	pthread_mutex_lock(&t->lock);
	t->done = 1;
	pthread_cond_signal(&t->cv);
	pthread_mutex_unlock(&t->lock);
}

static void tsrv_wait(struct tsrv *t)
{
	pthread_mutex_lock(&t->lock);
	while (!t->done)
		pthread_cond_wait(&t->cv, &t->lock);
	t->done = 0;
	pthread_mutex_unlock(&t->lock);
}

static void tsrv_start(void *arg)
{
	struct tsrv *t = arg;
	rs_start(&t->s, t->ctx, tw_context_base(t->ctx), "tcp://127.0.0.1:0");
	tsrv_signal(t);
}

static void tsrv_stop(void *arg)
{
	struct tsrv *t = arg;
	rs_stop(&t->s);
	tsrv_signal(t);
}

#define NTHREADS 4
#define NCALLS   10

struct caller {
	tw_context *ctx;
	const char *addr;
	int k, ok;
};

static void *caller_run(void *arg)
{
	struct caller *c = arg;
	for (int i = 0; i < NCALLS; i++) {
		char want[32];
		tw_decoded *d = NULL;
		snprintf(want, sizeof(want), "thread %d call %d", c->k, i);
		if (sync_call(c->ctx, c->addr, rq_echo_str(want), 10000, &d) == 0 &&
		    tw_msgpack_str_eq(tw_decoded_root(d), want))
			c->ok++;
		tw_decoded_free(d);
	}
	return NULL;
}

START_TEST(sync_own_thread)
{
	static struct tsrv t;
	struct caller c[NTHREADS];
	pthread_t th[NTHREADS];
	memset(&t, 0, sizeof(t));
	pthread_mutex_init(&t.lock, NULL);
	pthread_cond_init(&t.cv, NULL);
	ck_assert_int_eq(tw_context_new(NULL, &t.ctx), 0);
	ck_assert_int_eq(tw_context_call(t.ctx, tsrv_start, &t), 0);
	tsrv_wait(&t);
	sync_checks(t.ctx, t.s.addr, 0);
	for (int k = 0; k < NTHREADS; k++) {
		c[k] = (struct caller){t.ctx, t.s.addr, k, 0};
		ck_assert_int_eq(pthread_create(&th[k], NULL, caller_run, &c[k]), 0);
	}
	for (int k = 0; k < NTHREADS; k++) {
		pthread_join(th[k], NULL);
		ck_assert_int_eq(c[k].ok, NCALLS);
	}
	ck_assert_int_eq(tw_context_call(t.ctx, tsrv_stop, &t), 0);
	tsrv_wait(&t);
	tw_context_free(t.ctx);
	pthread_cond_destroy(&t.cv);
	pthread_mutex_destroy(&t.lock);
}
END_TEST

TCase *rpc_sync_tcase(void)
{
	return ts_tcase("sync", 60, TS_TESTS(sync_own_base, sync_own_thread));
}
