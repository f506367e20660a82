/* SPDX-License-Identifier: BSD-3-Clause */
/* Contexts with several loop threads (tw_context_set_loop_threads): a
 * listener spreads accepted comms over every loop, each comm's callbacks
 * always run on its own loop's thread, a tw_server answers on the thread
 * of the request's comm, a tw_pool on one loop calls it, and teardown
 * (tw_server_free, tw_context_free) with comms open on every loop is
 * clean (valgrind, ASan, TSan: scripts/tsan-check.sh runs this suite).
 * Waits are on progress under a lock, never on time. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <check.h>

#include <taskwire/taskwire.h>

#include "core/pass.h"
#include "tests/support/pack.h"
#include "tests/support/tls.h"
#include "tests/support/suite.h"

#define MAXLOOPS 4
#define MAXCOMMS 64

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;

/* Wait (no time bound: Check's timeout bounds the test) until *v >= want. */
static void wait_for(const int *v, int want)
{
	pthread_mutex_lock(&mu);
	while (*v < want)
		pthread_cond_wait(&cv, &mu);
	pthread_mutex_unlock(&mu);
}

/* Wait until *a + *b >= want: successes and failures both end a wait. */
static void wait_for_sum(const int *a, const int *b, int want)
{
	pthread_mutex_lock(&mu);
	while (*a + *b < want)
		pthread_cond_wait(&cv, &mu);
	pthread_mutex_unlock(&mu);
}

/* Counters the loops write are read under the lock. */
static int get(const int *v)
{
	int n;
	pthread_mutex_lock(&mu);
	n = *v;
	pthread_mutex_unlock(&mu);
	return n;
}

/* An unsigned counter through get (C11 6.5p7: an object may be read
 * through the signed type that corresponds to its own). */
static unsigned getu(const unsigned *v)
{
	return (unsigned)get((const int *)v);
}

static void bump(int *v)
{
	pthread_mutex_lock(&mu);
	(*v)++;
	pthread_cond_broadcast(&cv);
	pthread_mutex_unlock(&mu);
}

/* Run fn(arg) on ctx's loop thread and wait for it. */
struct onloop {
	void (*fn)(void *arg);
	void *arg;
	int done;
};

static void onloop_run(void *arg)
{
	struct onloop *o = arg;
	o->fn(o->arg);
	bump(&o->done);
}

static void on_loop(tw_context *ctx, void (*fn)(void *arg), void *arg)
{
	struct onloop o = {fn, arg, 0};
	ck_assert_int_eq(tw_context_call(ctx, onloop_run, &o), 0);
	wait_for(&o.done, 1);
}

/* The thread of each loop of a context, as a call posted there sees it. */
struct threads {
	pthread_t t[MAXLOOPS];
};

static void record_self(void *arg)
{
	*(pthread_t *)arg = pthread_self();
}

static void loop_threads(tw_context *ctx, struct threads *th)
{
	unsigned n = tw_context_loop_count(ctx);
	ck_assert_uint_le(n, MAXLOOPS);
	for (unsigned i = 0; i < n; i++)
		on_loop(tw_context_loop(ctx, i), record_self, &th->t[i]);
	for (unsigned i = 0; i < n; i++)
		for (unsigned j = i + 1; j < n; j++)
			ck_assert(!pthread_equal(th->t[i], th->t[j]));
}

/* Asserts (on any thread) collected here and checked by the test: a
 * failed ck_assert on a loop thread would not stop the test cleanly. */
static int wrong_thread;

/* Is this the thread of the loop comm lives on? */
static void check_thread(const struct threads *th, tw_comm *comm)
{
	unsigned i = tw_context_loop_index(tw_comm_context(comm));
	if (i >= MAXLOOPS || !pthread_equal(pthread_self(), th->t[i]))
		bump(&wrong_thread);
}

static tw_msg *request(const char *op)
{
	tw_builder *b;
	tw_msg *m = NULL;
	ts_builder_map(&b, 1);
	tw_msgpack_pack_str(tw_builder_packer(b), "op");
	tw_msgpack_pack_str(tw_builder_packer(b), op);
	ck_assert_int_eq(tw_builder_finish(b, &m), 0);
	tw_builder_free(b);
	return m;
}

/* Deadlines are not under test here: a dozen TLS handshakes at once under
 * valgrind on a loaded machine outlast the 10 s defaults. Set before the
 * loops, which copy the context's settings. */
static void no_deadlines(tw_context *ctx)
{
	ck_assert_int_eq(tw_context_set_connect_timeout_ms(ctx, 600000), 0);
	ck_assert_int_eq(tw_context_set_tls_handshake_timeout_ms(ctx, 600000), 0);
	ck_assert_int_eq(tw_context_set_handshake_timeout_ms(ctx, 600000), 0);
}

static void accept_free(tw_listener *l, tw_comm *comm, void *arg)
{
	(void)l;
	(void)arg;
	tw_comm_free(comm);
}

START_TEST(loop_threads_rules)
{
	tw_context *ctx, *one;
	tw_listener *l;
	tw_server *srv;
	ck_assert_int_eq(tw_context_new(NULL, &ctx), 0);
	ck_assert_uint_eq(tw_context_loop_count(ctx), 1);
	ck_assert_ptr_eq(tw_context_loop(ctx, 0), ctx);
	ck_assert_ptr_null(tw_context_loop(ctx, 1));
	ck_assert_int_eq(tw_context_set_loop_threads(ctx, 0), TW_EINVAL);
	ck_assert_int_eq(tw_context_set_loop_threads(ctx, 1025), TW_EINVAL);
	ck_assert_int_eq(tw_context_set_loop_threads(NULL, 2), TW_EINVAL);
	ck_assert_int_eq(tw_context_set_loop_threads(ctx, 1), 0); /* the default: nothing */
	ck_assert_uint_eq(tw_context_loop_count(ctx), 1);
	ck_assert_int_eq(tw_context_set_loop_threads(ctx, 3), 0);
	ck_assert_uint_eq(tw_context_loop_count(ctx), 3);
	ck_assert_int_eq(tw_context_set_loop_threads(ctx, 2), TW_EINVAL); /* once */
	for (unsigned i = 0; i < 3; i++) {
		tw_context *li = tw_context_loop(ctx, i);
		ck_assert_ptr_nonnull(li);
		ck_assert_uint_eq(tw_context_loop_index(li), i);
		ck_assert_uint_eq(tw_context_loop_count(li), 3);
		ck_assert_ptr_eq(tw_context_loop(li, 0), ctx);
	}
	ck_assert_ptr_null(tw_context_loop(ctx, 3));
	ck_assert_int_eq(tw_context_set_loop_threads(tw_context_loop(ctx, 1), 2), TW_EINVAL);
	tw_context_free(tw_context_loop(ctx, 1)); /* ignored: the main context owns it */
	tw_context_free(ctx);
	/* loops must come before the first listener (it would stay on loop 0) */
	ck_assert_int_eq(tw_context_new(NULL, &one), 0);
	ck_assert_int_eq(tw_listener_new(one, "tcp://127.0.0.1:0", accept_free, NULL, &l), 0);
	ck_assert_int_eq(tw_context_set_loop_threads(one, 2), TW_EINVAL);
	tw_context_free(one);
	/* a server made before the loops has no place for their comms */
	ck_assert_int_eq(tw_context_new(NULL, &one), 0);
	ck_assert_int_eq(tw_server_new(one, &srv), 0);
	ck_assert_int_eq(tw_context_set_loop_threads(one, 2), 0);
	ck_assert_int_eq(tw_server_listen(srv, "tcp://127.0.0.1:0"), TW_EINVAL);
	tw_server_free(srv);
	tw_context_free(one);
}
END_TEST

/* --- a server spread over 3 loops, called by a pool on loop 1 of a
 * client context with 2 loops --- */

static struct threads srv_th, cli_th;
static unsigned comms_per_loop[MAXLOOPS];

/* op "where": the index of the loop that serves this comm; checks that
 * the handler runs on it and that a comm never changes loop. */
static struct {
	tw_comm *comm;
	pthread_t t;
} seen[MAXCOMMS];
static int nseen;

#define NCALLS 24

/* Each round's NCALLS requests are held until all of them have arrived, so
 * they are in flight at once and each needs a comm of its own (a pool
 * gives a waiting call to whichever comm turns idle first: replying at
 * once let a slow machine serve 24 calls over 5 comms). */
static struct {
	tw_request *r;
	tw_context *loop;
} held[NCALLS];
static int nheld;

static void reply_held(void *arg)
{
	tw_request_reply(arg);
}

/* Called under mu: the last request of a round releases them all, each
 * on its own comm's loop (a deferred reply is sent from that thread). */
static void hold(tw_request *r, tw_context *loop)
{
	held[nheld].r = r;
	held[nheld++].loop = loop;
	if (nheld < NCALLS)
		return;
	for (int i = 0; i < NCALLS; i++)
		if (tw_context_call(held[i].loop, reply_held, held[i].r) != 0)
			wrong_thread++; /* counted: the test asserts it stays 0 */
	nheld = 0;
}

static void op_where(tw_request *r, void *arg)
{
	tw_comm *comm = tw_request_comm(r);
	unsigned loop = tw_context_loop_index(tw_comm_context(comm));
	int i;
	(void)arg;
	check_thread(&srv_th, comm);
	pthread_mutex_lock(&mu);
	for (i = 0; i < nseen && seen[i].comm != comm; i++)
		;
	if (i == nseen && nseen < MAXCOMMS) {
		seen[nseen].comm = comm;
		seen[nseen++].t = pthread_self();
		comms_per_loop[loop]++;
	} else if (i < nseen && !pthread_equal(seen[i].t, pthread_self()))
		wrong_thread++;
	msgpack_pack_unsigned_int(tw_builder_packer(tw_request_reply_builder(r)), loop);
	hold(r, tw_comm_context(comm));
	pthread_mutex_unlock(&mu);
}

struct client {
	tw_context *loop; /* the pool's */
	tw_pool *pool;
	char addr[128];
	int replies, errors;
	unsigned got_loop[MAXLOOPS];
};

static void on_reply(tw_call *call, int err, tw_decoded *reply, void *arg)
{
	struct client *c = arg;
	const msgpack_object *o = reply != NULL ? tw_decoded_root(reply) : NULL;
	(void)call;
	if (!pthread_equal(pthread_self(), cli_th.t[tw_context_loop_index(c->loop)]))
		bump(&wrong_thread);
	if (err != 0 || o == NULL || o->type != MSGPACK_OBJECT_POSITIVE_INTEGER ||
	    o->via.u64 >= MAXLOOPS) {
		fprintf(stderr, "call failed: %s: %s\n", tw_strerror(err), tw_call_error(call));
		bump(&c->errors);
	} else {
		pthread_mutex_lock(&mu);
		c->got_loop[o->via.u64]++;
		pthread_mutex_unlock(&mu);
	}
	tw_decoded_free(reply);
	bump(&c->replies);
}

/* On the pool's loop: NCALLS calls at once, so each takes a comm of its own. */
static void start_calls(void *arg)
{
	struct client *c = arg;
	for (int i = 0; i < NCALLS; i++) {
		tw_msg *m = request("where");
		if (tw_pool_call(c->pool, c->addr, m, 30000, on_reply, c, NULL) != 0) {
			tw_msg_free(m);
			bump(&c->errors);
			bump(&c->replies);
		}
	}
}

static void make_pool(void *arg)
{
	struct client *c = arg;
	if (tw_pool_new(c->loop, &c->pool) != 0)
		c->pool = NULL;
	/* keep every comm of a round idle for the next (default: 16) */
	else if (tw_pool_set_idle(c->pool, NCALLS, 600000) != 0)
		bump(&c->errors);
}

static void free_pool(void *arg)
{
	struct client *c = arg;
	tw_pool_free(c->pool);
	c->pool = NULL;
}

struct srv {
	tw_context *ctx;
	tw_server *s;
	char addr[128];
	int rv;
};

static void srv_start(void *arg)
{
	struct srv *v = arg;
	v->rv = tw_server_new(v->ctx, &v->s);
	if (v->rv == 0)
		v->rv = tw_server_add_op(v->s, "where", op_where, NULL);
	if (v->rv == 0)
		v->rv = tw_server_listen(v->s, "tcp://127.0.0.1:0");
	if (v->rv == 0)
		v->rv = tw_server_address(v->s, 0, v->addr, sizeof(v->addr));
}

static void srv_free(void *arg)
{
	struct srv *v = arg;
	tw_server_free(v->s);
	v->s = NULL;
}

START_TEST(server_across_loops)
{
	struct srv v = {0};
	struct client c = {0};
	tw_context *cctx;
	memset(comms_per_loop, 0, sizeof(comms_per_loop));
	nseen = 0;
	nheld = 0;
	wrong_thread = 0;
	ck_assert_int_eq(tw_context_new(NULL, &v.ctx), 0);
	ck_assert_int_eq(tw_context_set_loop_threads(v.ctx, 3), 0);
	loop_threads(v.ctx, &srv_th);
	on_loop(v.ctx, srv_start, &v);
	ck_assert_int_eq(v.rv, 0);

	ck_assert_int_eq(tw_context_new(NULL, &cctx), 0);
	no_deadlines(cctx);
	ck_assert_int_eq(tw_context_set_loop_threads(cctx, 2), 0);
	loop_threads(cctx, &cli_th);
	c.loop = tw_context_loop(cctx, 1);
	strcpy(c.addr, v.addr);
	on_loop(c.loop, make_pool, &c);
	ck_assert_ptr_nonnull(c.pool);

	/* three rounds over the same comms: each stays on its loop */
	for (int round = 1; round <= 3; round++) {
		ck_assert_int_eq(tw_context_call(c.loop, start_calls, &c), 0);
		wait_for(&c.replies, round * NCALLS);
	}
	ck_assert_int_eq(get(&c.errors), 0);
	ck_assert_int_eq(get(&wrong_thread), 0);
	ck_assert_int_eq(get(&nseen), NCALLS);
	for (unsigned i = 0; i < 3; i++) {
		/* round robin: every loop got its third of the comms */
		ck_assert_uint_eq(getu(&comms_per_loop[i]), NCALLS / 3);
		ck_assert_uint_gt(getu(&c.got_loop[i]), 0);
	}

	/* the server goes first, with the pool's comms open on every loop */
	on_loop(v.ctx, srv_free, &v);
	on_loop(c.loop, free_pool, &c);
	tw_context_free(cctx);
	tw_context_free(v.ctx);
}
END_TEST

/* --- raw comms: a listener's accept callback and every callback of a
 * comm on its own loop; tw_context_free with comms open everywhere --- */

#define NRAW 12

static int accepted, echoed, raw_closed, connect_failed;
static unsigned accepted_on[MAXLOOPS];

static void srv_recv(tw_comm *comm, tw_msg *msg, void *arg)
{
	(void)arg;
	check_thread(&srv_th, comm);
	if (tw_comm_write(comm, tw_msg_hold(msg)) != 0)
		tw_msg_free(msg);
}

static void any_close(tw_comm *comm, int err, void *arg)
{
	(void)err;
	check_thread(arg, comm);
	bump(&raw_closed);
	tw_comm_free(comm);
}

static void srv_accept(tw_listener *l, tw_comm *comm, void *arg)
{
	(void)l;
	(void)arg;
	check_thread(&srv_th, comm);
	pthread_mutex_lock(&mu);
	accepted_on[tw_context_loop_index(tw_comm_context(comm))]++;
	pthread_mutex_unlock(&mu);
	if (tw_comm_set_callbacks(comm, srv_recv, any_close, NULL, &srv_th) != 0)
		tw_comm_free(comm);
	bump(&accepted);
}

static void cli_recv(tw_comm *comm, tw_msg *msg, void *arg)
{
	(void)arg;
	(void)msg; /* borrowed */
	check_thread(&cli_th, comm);
	bump(&echoed);
}

static void cli_connected(tw_comm *comm, int err, void *arg)
{
	tw_msg *m;
	(void)arg;
	if (err != 0 || tw_comm_set_callbacks(comm, cli_recv, any_close, NULL, &cli_th) != 0) {
		fprintf(stderr, "connect failed: %s\n", tw_strerror(err));
		bump(&connect_failed); /* the test waits for it, then asserts 0 */
		if (comm != NULL)
			tw_comm_free(comm);
		return;
	}
	check_thread(&cli_th, comm);
	m = request("hello");
	if (tw_comm_write(comm, m) != 0)
		tw_msg_free(m);
}

struct raw {
	tw_context *ctx;
	tw_listener *l;
	char uri[64];
	char addr[128];
	int rv;
};

static void raw_listen(void *arg)
{
	struct raw *r = arg;
	r->rv = tw_listener_new(r->ctx, r->uri, srv_accept, NULL, &r->l);
	if (r->rv == 0)
		r->rv = tw_listener_address(r->l, r->addr, sizeof(r->addr));
}

static char raw_addr[128];

static void raw_connect(void *arg)
{
	tw_context *loop = arg;
	if (tw_comm_connect(loop, raw_addr, cli_connected, NULL) != 0)
		bump(&wrong_thread);
}

/* Over every transport: the TLS handshake and the ws upgrade run on the
 * comm's loop. The server's TLS configuration is set after its loops
 * (each accepted comm carries it to its loop), the client's before (its
 * loops copy it then). */
static const char *const schemes[] = {"tcp", "tls", "ws", "wss"};

START_TEST(free_with_comms_on_every_loop)
{
	struct raw r = {0};
	tw_context *cctx;
	const char *scheme = schemes[_i];
	int tls = strcmp(scheme, "tls") == 0 || strcmp(scheme, "wss") == 0;
	accepted = echoed = raw_closed = connect_failed = wrong_thread = 0; /* no loop runs yet */
	memset(accepted_on, 0, sizeof(accepted_on));
	snprintf(r.uri, sizeof(r.uri), "%s://127.0.0.1:0", scheme);
	ck_assert_int_eq(tw_context_new(NULL, &r.ctx), 0);
	no_deadlines(r.ctx);
	ck_assert_int_eq(tw_context_set_loop_threads(r.ctx, 2), 0);
	if (tls)
		tt_use_tls(r.ctx, "ca.pem", "cert.pem", "key.pem");
	loop_threads(r.ctx, &srv_th);
	on_loop(r.ctx, raw_listen, &r);
	ck_assert_int_eq(r.rv, 0);
	strcpy(raw_addr, r.addr);
	ck_assert_int_eq(tw_context_new(NULL, &cctx), 0);
	if (tls)
		tt_use_tls(cctx, "ca.pem", "cert.pem", "key.pem");
	no_deadlines(cctx);
	ck_assert_int_eq(tw_context_set_loop_threads(cctx, 2), 0);
	loop_threads(cctx, &cli_th);
	for (int i = 0; i < NRAW; i++) /* connect from both client loops */
		ck_assert_int_eq(tw_context_call(tw_context_loop(cctx, i % 2), raw_connect,
						 tw_context_loop(cctx, i % 2)),
				 0);
	wait_for_sum(&echoed, &connect_failed, NRAW);
	ck_assert_int_eq(get(&connect_failed), 0);
	ck_assert_int_eq(get(&echoed), NRAW);
	ck_assert_int_eq(get(&accepted), NRAW);
	ck_assert_uint_eq(getu(&accepted_on[0]), NRAW / 2);
	ck_assert_uint_eq(getu(&accepted_on[1]), NRAW / 2);
	ck_assert_int_eq(get(&wrong_thread), 0);
	ck_assert_int_eq(get(&raw_closed), 0);
	/* every comm still open, on both loops of both contexts */
	tw_context_free(r.ctx);
	tw_context_free(cctx);
	ck_assert_int_eq(get(&wrong_thread), 0);
}
END_TEST

/* --- a loop whose comm always has bytes to read still polls: a pass ends
 * after a bounded number of callbacks, so the call queue (and timers, new
 * sockets) is served while a peer keeps a comm busy --- */

#define FED_TOTAL 2000
#define FED_MARK  100

static tw_comm *fed_srv;
static int fed_got, fed_called, fed_at_mark, fed_queued;

static void fed_mark(void *arg)
{
	(void)arg;
	pthread_mutex_lock(&mu);
	fed_at_mark = fed_got;
	fed_called = 1;
	pthread_cond_broadcast(&cv);
	pthread_mutex_unlock(&mu);
}

static void fed_srv_recv(tw_comm *comm, tw_msg *msg, void *arg)
{
	(void)msg; /* borrowed */
	(void)arg;
	bump(&fed_got);
	/* posted from the loop itself: it runs only once the loop polls */
	if (get(&fed_got) == FED_MARK &&
	    tw_context_call(tw_comm_context(comm), fed_mark, NULL) != 0)
		bump(&wrong_thread);
}

static void fed_accept(tw_listener *l, tw_comm *comm, void *arg)
{
	(void)l;
	(void)arg;
	if (tw_comm_set_callbacks(comm, fed_srv_recv, any_close, NULL, &srv_th) != 0) {
		tw_comm_free(comm);
		return;
	}
	tw_comm_pause(comm); /* until every message waits in the socket */
	pthread_mutex_lock(&mu);
	fed_srv = comm;
	pthread_cond_broadcast(&cv);
	pthread_mutex_unlock(&mu);
}

static void fed_listen(void *arg)
{
	struct raw *r = arg;
	r->rv = tw_listener_new(r->ctx, r->uri, fed_accept, NULL, &r->l);
	if (r->rv == 0)
		r->rv = tw_listener_address(r->l, r->addr, sizeof(r->addr));
}

static tw_comm *fed_cli;

static void fed_cli_connected(tw_comm *comm, int err, void *arg)
{
	(void)arg;
	if (err != 0 || tw_comm_set_callbacks(comm, cli_recv, any_close, NULL, &cli_th) != 0) {
		bump(&connect_failed);
		if (comm != NULL)
			tw_comm_free(comm);
		return;
	}
	for (int i = 0; i < FED_TOTAL; i++) {
		tw_msg *m = request("fed");
		if (tw_comm_write(comm, m) != 0)
			tw_msg_free(m);
	}
	pthread_mutex_lock(&mu);
	fed_cli = comm;
	pthread_cond_broadcast(&cv);
	pthread_mutex_unlock(&mu);
}

static void fed_connect(void *arg)
{
	if (tw_comm_connect(arg, raw_addr, fed_cli_connected, NULL) != 0)
		bump(&connect_failed);
}

static void fed_look(void *arg)
{
	(void)arg;
	pthread_mutex_lock(&mu);
	fed_queued = fed_cli != NULL && tw_comm_queued_bytes(fed_cli) == 0;
	pthread_mutex_unlock(&mu);
}

static void fed_resume(void *arg)
{
	(void)arg;
	tw_comm_resume(fed_srv);
}

START_TEST(fed_loop_still_polls)
{
	struct raw r = {0};
	tw_context *cctx;
	raw_closed = connect_failed = wrong_thread = 0;
	fed_got = fed_called = fed_queued = 0;
	fed_at_mark = -1;
	fed_srv = fed_cli = NULL;
	snprintf(r.uri, sizeof(r.uri), "tcp://127.0.0.1:0");
	ck_assert_int_eq(tw_context_new(NULL, &r.ctx), 0);
	loop_threads(r.ctx, &srv_th);
	on_loop(r.ctx, fed_listen, &r);
	ck_assert_int_eq(r.rv, 0);
	strcpy(raw_addr, r.addr);
	ck_assert_int_eq(tw_context_new(NULL, &cctx), 0);
	loop_threads(cctx, &cli_th);
	ck_assert_int_eq(tw_context_call(cctx, fed_connect, cctx), 0);
	pthread_mutex_lock(&mu);
	while ((fed_cli == NULL || fed_srv == NULL) && connect_failed == 0)
		pthread_cond_wait(&cv, &mu);
	pthread_mutex_unlock(&mu);
	ck_assert_int_eq(get(&connect_failed), 0);
	while (!get(&fed_queued)) /* every message left the client */
		on_loop(cctx, fed_look, NULL);
	/* each read ends on its allowance, as under load, so the messages
	 * read ahead are handled from the loop (event_active) in turn */
	tw__pass_cap(64);
	on_loop(r.ctx, fed_resume, NULL);
	wait_for(&fed_got, FED_TOTAL);
	wait_for(&fed_called, 1);
	tw__pass_cap(0);
	/* the call ran while messages were still coming in, not after */
	ck_assert_int_ge(get(&fed_at_mark), FED_MARK);
	ck_assert_int_lt(get(&fed_at_mark), FED_TOTAL);
	ck_assert_int_eq(get(&wrong_thread), 0);
	ck_assert_int_eq(get(&raw_closed), 0);
	tw_context_free(r.ctx);
	tw_context_free(cctx);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("loops");
	TCase *tc = tcase_create("loops");
	SRunner *sr;
	int failed;
	tcase_set_timeout(tc, 120);
	tcase_add_unchecked_fixture(tc, ts_certs_make, ts_certs_remove);
	ts_add(tc, TS_TESTS(loop_threads_rules, server_across_loops, fed_loop_still_polls));
	ts_add_loop(tc, 4, TS_TESTS(free_with_comms_on_every_loop));
	suite_add_tcase(s, tc);
	sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
