/* SPDX-License-Identifier: BSD-3-Clause */
/* Lifetimes around the offload pool: comms closed, aborted or freed, and
 * contexts freed, while their messages sit in a worker; decode errors in
 * a worker; tw_server with a large request in the pool. Run under
 * valgrind and ASan for the leaks and uses after free these would cause;
 * the assertions count callbacks. */
#include <stdlib.h>

#include <check.h>
#include <event2/event.h>

#include "tests/check_offload.h"
#include "tests/support/offload.h"
#include "tests/support/suite.h"

/* Comm 0 gets a large message held in the pool by a gate, and comm 1
 * stays open as a witness. A marker queued behind the message tells when
 * the pool handed the message's result back. */
struct held {
	struct ox o;
	struct ox_job *gate, *marker;
};

static void hold_large(struct held *t)
{
	t->gate = ox_setup_gated(&t->o, 2);
	ox_send(&t->o, 0, ox_large(0, NULL));
	ox_wait_received(&t->o, 0, 1);
	t->marker = ox_marker(t->o.h.ctx);
}

/* Let the pool finish: the message's result comes back, then the
 * marker's. The witness comm still delivers. */
static void release(struct held *t)
{
	ox_open(t->gate);
	ox_wait_job(&t->o.h, t->marker);
	ox_send(&t->o, 1, ox_small(7, NULL));
	ox_wait_delivered(&t->o, 1, 1);
	ck_assert(ox_rx_is(&t->o.rx[1], 0, 7));
	ck_assert_int_eq(t->marker->canceled, 0);
}

static void held_fini(struct held *t)
{
	ox_teardown(&t->o);
	ox_job_free(t->gate);
	ox_job_free(t->marker);
}

/* The end of a case whose message never arrives: release, nothing
 * delivered on comm 0, its close callback ran (closed 1) or not (0). */
static void release_none_delivered(struct held *t, int closed)
{
	release(t);
	ck_assert_uint_eq(t->o.rx[0].n, 0);
	ck_assert_int_eq(t->o.rx[0].closed, closed);
}

/* The end of a case that closes in order: release; comm 0's n messages
 * arrive, in order, then its close callback with 0, nothing after it. */
static void release_then_closed(struct held *t, size_t n)
{
	release(t);
	ck_assert(tu_wait_flag(&t->o.h, &t->o.rx[0].closed, TU_WAIT_MS));
	ck_assert_int_eq(t->o.rx[0].close_err, 0);
	ck_assert_uint_eq(t->o.rx[0].n, n);
	for (size_t i = 0; i < n; i++)
		ck_assert_msg(ox_rx_is(&t->o.rx[0], i, i), "message %zu", i);
	ck_assert_uint_lt(t->o.rx[0].got[n - 1].order, t->o.rx[0].close_order);
	ck_assert_uint_eq(t->o.rx[0].after_close, 0);
}

/* tw_comm_close of c (comm 0 or its client), until the client's side of
 * comm 0 has closed (the FIN went both ways). */
static void close_both_ways(struct held *t, tw_comm *c)
{
	tw_comm_close(c);
	ck_assert(tu_wait_flag(&t->o.h, &t->o.cli[0]->closed, TU_WAIT_MS));
}

/* tw_comm_free of comm 0, which the harness then forgets. */
static void free_comm0(struct ox *o)
{
	tw_comm_free(o->rx[0].comm);
	ox_forget(o, 0);
}

/* The cases of the "held" TCase share one fixture: hold_large before,
 * held_fini after (a checked fixture: in the test's own process). */
static struct held fx;

static void fx_setup(void)
{
	hold_large(&fx);
}

static void fx_teardown(void)
{
	held_fini(&fx);
}

/* tw_comm_abort: the close callback runs at once with TW_ECANCELED; the
 * message, decoded later, is never delivered. */
START_TEST(abort_while_in_pool)
{
	tw_comm_abort(fx.o.rx[0].comm);
	ck_assert_int_eq(fx.o.rx[0].closed, 1);
	ck_assert_int_eq(fx.o.rx[0].close_err, TW_ECANCELED);
	release_none_delivered(&fx, 1);
}
END_TEST

/* The same, freeing the comm inside its close callback. */
START_TEST(abort_free_in_close_while_in_pool)
{
	fx.o.rx[0].free_in_close = 1;
	tw_comm_abort(fx.o.rx[0].comm);
	ck_assert_ptr_null(fx.o.rx[0].comm);
	release_none_delivered(&fx, 1);
}
END_TEST

/* tw_comm_free: no callback of the comm ever runs again. */
START_TEST(free_while_in_pool)
{
	free_comm0(&fx.o);
	release_none_delivered(&fx, 0);
}
END_TEST

/* tw_comm_close (orderly): the message that arrived before is delivered,
 * then the close callback runs with 0; nothing after it. */
START_TEST(close_while_in_pool)
{
	close_both_ways(&fx, fx.o.rx[0].comm); /* our FIN arrived */
	release_then_closed(&fx, 1);
}
END_TEST

/* The peer sends L S S and closes in order: the three messages are
 * delivered, in order, before the close callback (err 0), as they would
 * be without the pool. */
START_TEST(peer_close_while_in_pool)
{
	ox_send(&fx.o, 0, ox_small(1, NULL));
	ox_send(&fx.o, 0, ox_small(2, NULL));
	close_both_ways(&fx, fx.o.cli[0]->comm);
	ck_assert_uint_eq(fx.o.rx[0].n, 0);
	release_then_closed(&fx, 3);
}
END_TEST

/* The comm is freed while the peer's close waits for a message in the
 * pool: no callback at all after the free. */
START_TEST(free_after_peer_close_while_in_pool)
{
	/* the client's close finishes after our end saw its FIN and ended */
	close_both_ways(&fx, fx.o.cli[0]->comm);
	free_comm0(&fx.o);
	release_none_delivered(&fx, 0);
}
END_TEST

/* tw_comm_pause while a message sits in the pool: its result comes back
 * but is held, with the small one queued behind it, until
 * tw_comm_resume; then everything arrives in order, the message read after
 * the resume last. */
START_TEST(pause_while_in_pool)
{
	ox_send(&fx.o, 0, ox_small(1, NULL));
	ox_wait_received(&fx.o, 0, 2);
	tw_comm_pause(fx.o.rx[0].comm);
	release(&fx);
	ck_assert_uint_eq(fx.o.rx[0].n, 0);
	ox_send(&fx.o, 0, ox_small(2, NULL));
	tw_comm_resume(fx.o.rx[0].comm);
	ox_wait_delivered(&fx.o, 0, 3);
	for (size_t i = 0; i < 3; i++)
		ck_assert_msg(ox_rx_is(&fx.o.rx[0], i, i), "message %zu", i);
}
END_TEST

/* Without a gate: abort and free right after the message reached the
 * pool, most likely while the worker decodes it. */
static void while_decoding(int free_it)
{
	struct ox o;
	struct ox_job *marker;
	ox_setup(&o, 1, 1);
	ox_send(&o, 0, ox_large(0, NULL));
	ox_wait_received(&o, 0, 1);
	marker = ox_marker(o.h.ctx);
	if (free_it) {
		free_comm0(&o);
	} else {
		tw_comm_abort(o.rx[0].comm);
	}
	ox_wait_job(&o.h, marker);
	ck_assert_uint_eq(o.rx[0].n, 0);
	ck_assert_int_eq(o.rx[0].closed, !free_it);
	ox_teardown(&o);
	ox_job_free(marker);
}

START_TEST(abort_while_decoding)
{
	while_decoding(0);
}
END_TEST

START_TEST(free_while_decoding)
{
	while_decoding(1);
}
END_TEST

static size_t delivered(const struct ox *o)
{
	size_t n = 0;
	for (size_t i = 0; i < o->n; i++)
		n += o->rx[i].n + (size_t)o->rx[i].closed;
	return n;
}

/* Forget every comm and the listener: tw_context_free takes them. */
static void forget_all(struct ox *o)
{
	for (size_t i = 0; i < o->n; i++) {
		ox_forget(o, i);
		o->cli[i]->comm = NULL;
	}
	o->h.lis = NULL;
}

/* Markers behind the jobs the context's free finds queued: canceled, never
 * run, and their done runs exactly once. */
static void check_canceled(struct ox_job *const *m, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		ck_assert_int_eq(m[i]->done, 1);
		ck_assert_int_eq(m[i]->canceled, 1);
		ck_assert_int_eq(ox_ran(m[i]), 0);
	}
}

/* One worker, three comms. When the first message has arrived, a gate
 * holds the worker and five more large messages queue behind it, then two
 * markers. The test frees the context from the loop thread, outside any
 * callback (the free opens the gate): the queued jobs are canceled,
 * nothing is delivered after. */
START_TEST(context_free_with_jobs_queued)
{
	struct ox o;
	struct ox_job *gate, *m[2];
	size_t n;
	ox_setup(&o, 3, 1);
	ox_send(&o, 0, ox_large(0, NULL));
	ox_wait_delivered(&o, 0, 1);
	gate = ox_gate(o.h.ctx);
	ox_wait_started(gate); /* holding the worker, not queued behind it */
	for (size_t c = 0; c < 3; c++) {
		for (size_t i = c == 0; i < 2; i++)
			ox_send(&o, c, ox_large(i, NULL));
		ox_wait_received(&o, c, 2);
	}
	m[0] = ox_marker(o.h.ctx);
	m[1] = ox_marker(o.h.ctx);
	n = delivered(&o);
	ck_assert_uint_eq(n, 1);
	forget_all(&o);
	tw_context_free(o.h.ctx);
	o.h.ctx = NULL;
	ck_assert_uint_eq(delivered(&o), n);
	ck_assert(gate->done == 1 && !gate->canceled);
	check_canceled(m, 2);
	tu_run_for(&o.h, 50);
	ck_assert_uint_eq(delivered(&o), n);
	ox_teardown(&o);
	ox_job_free(gate);
	ox_job_free(m[0]);
	ox_job_free(m[1]);
}
END_TEST

static void thr_send_first(struct ox_thr *t, void *arg)
{
	(void)arg;
	ck_assert_int_eq(tw_comm_write(t->cli[0], ox_large(0, NULL)), 0);
}

/* Hold the worker, queue two large messages per comm, then markers. */
static void thr_queue(struct ox_thr *t, void *arg)
{
	struct ox_job **j = arg;
	j[0] = ox_gate(t->ctx);
	for (size_t c = 0; c < t->ncli; c++)
		for (size_t i = c == 0; i < 3; i++)
			ck_assert_int_eq(tw_comm_write(t->cli[c], ox_large(i, NULL)), 0);
}

static void thr_markers(struct ox_thr *t, void *arg)
{
	struct ox_job **j = arg;
	j[1] = ox_marker(t->ctx);
	j[2] = ox_marker(t->ctx);
}

/* The same on a context with its own loop thread, freed from the test's
 * thread: no callback runs on the freeing thread, none after. */
START_TEST(own_thread_context_free_with_jobs_queued)
{
	static struct ox_thr t;
	struct ox_job *j[3];
	ox_thr_start(&t, 2, 1);
	ox_thr_call(&t, thr_send_first, NULL);
	ck_assert(ox_thr_wait_delivered(&t, 1));
	ox_thr_call(&t, thr_queue, j);
	ck_assert(ox_thr_wait_received(&t, 6));
	ox_thr_call(&t, thr_markers, j);
	tw_context_free(t.ctx);
	for (size_t c = 0; c < 2; c++) {
		ck_assert_uint_eq(t.rx[c].off_thread, 0);
		ck_assert_uint_eq(t.rx[c].after_close, 0);
		ck_assert_int_eq(t.rx[c].closed, 0);
	}
	ck_assert_uint_eq(t.rx[0].n + t.rx[1].n, 1);
	ck_assert(j[0]->done == 1 && !j[0]->canceled);
	check_canceled(j + 1, 2);
	for (size_t i = 0; i < 3; i++)
		ox_job_free(j[i]);
	pthread_cond_destroy(&t.cv);
	pthread_mutex_destroy(&t.mu);
}
END_TEST

/* A corrupt zstd frame (declared size intact) fails in the worker: that
 * comm gets TW_EPROTO with a reason, on the loop thread, in its place in
 * the order, and stays open; another comm is not disturbed. */
START_TEST(worker_error_reported)
{
	struct ox o;
	struct ox_job *gate = ox_setup_gated(&o, 2);
	const struct ox_got *g;
	ox_send(&o, 0, ox_corrupt(0));
	ox_send(&o, 0, ox_small(1, NULL));
	ox_send(&o, 0, ox_large(2, NULL));
	ox_wait_received(&o, 0, 3);
	ox_send(&o, 1, ox_small(10, NULL));
	ox_wait_delivered(&o, 1, 1);
	ck_assert_uint_eq(o.rx[0].n, 0); /* the corrupt one is in the pool */
	ox_open(gate);
	ox_wait_delivered(&o, 0, 3);
	g = &o.rx[0].got[0];
	ck_assert_int_eq(g->err, TW_EPROTO);
	ck_assert_msg(g->detail[0] != '\0', "no detail");
	ck_assert(ox_rx_is(&o.rx[0], 1, 1));
	ck_assert(ox_rx_is(&o.rx[0], 2, 2));
	ck_assert_int_eq(o.rx[0].closed, 0);
	ox_send(&o, 1, ox_large(11, NULL));
	ox_send(&o, 0, ox_small(3, NULL));
	ox_wait_delivered(&o, 1, 2);
	ox_wait_delivered(&o, 0, 4);
	ck_assert(ox_rx_is(&o.rx[1], 0, 10));
	ck_assert(ox_rx_is(&o.rx[1], 1, 11));
	ck_assert(ox_rx_is(&o.rx[0], 3, 3));
	ck_assert_uint_eq(o.rx[0].off_thread + o.rx[1].off_thread, 0);
	ox_teardown_gated(&o, gate);
}
END_TEST

/* tw_server: comm B's large request sits in the pool while comm A's small
 * one is answered. The op "nbytes" answers the size of `data` when its
 * bytes are intact, else -1. */
struct client {
	tw_comm *comm;
	int ready, closed;
	size_t n;
	int64_t reply;
	uint64_t order;
};

static uint64_t reply_clock;

static void op_nbytes(tw_request *r, void *arg)
{
	const msgpack_object *data = tw_request_arg(r, "data");
	const tw_payload *p = data ? tw_decoded_payload(tw_request_decoded(r), data) : NULL;
	tw_builder *b = tw_request_reply_builder(r);
	int64_t v = -1;
	(void)arg;
	if (p != NULL && p->nframes == 1 && p->frames[0].len == ox_large_bytes())
		v = (int64_t)ox_large_bytes(); /* content checked by the order suite */
	else if (p != NULL && p->nframes == 1)
		v = ts_check(tw_slice_data(&p->frames[0]), p->frames[0].len, 1) == -1
			    ? (int64_t)p->frames[0].len
			    : -1;
	msgpack_pack_int64(tw_builder_packer(b), v);
	tw_request_reply(r);
}

static void client_recv(tw_comm *c, tw_msg *m, void *arg)
{
	struct client *cl = arg;
	tw_decoded *d;
	(void)c;
	cl->n++;
	cl->order = ++reply_clock;
	cl->reply = -2;
	if (tw_decode(m, NULL, &d, NULL, 0) != 0)
		return;
	if (tw_decoded_root(d)->type == MSGPACK_OBJECT_POSITIVE_INTEGER)
		cl->reply = (int64_t)tw_decoded_root(d)->via.u64;
	tw_decoded_free(d);
}

static void client_close(tw_comm *c, int err, void *arg)
{
	struct client *cl = arg;
	(void)c;
	(void)err;
	cl->closed = 1;
}

static void client_handshake(tw_comm *c, int err, const tw_handshake_info *info, void *arg)
{
	struct client *cl = arg;
	(void)info;
	if (err == 0 && tw_comm_set_callbacks(c, client_recv, client_close, NULL, cl) == 0)
		cl->ready = 1;
	else
		cl->closed = 1;
}

static void client_connected(tw_comm *c, int err, void *arg)
{
	struct client *cl = arg;
	cl->comm = c;
	if (err != 0 || tw_comm_handshake(c, TW_HANDSHAKE_CONNECTOR, client_handshake, cl) != 0)
		cl->closed = 1;
}

static void client_connect(struct tu *h, const char *addr, struct client *cl)
{
	memset(cl, 0, sizeof(*cl));
	ck_assert_int_eq(tw_comm_connect(h->ctx, addr, client_connected, cl), 0);
	ck_assert(tu_wait_flag(h, &cl->ready, TU_WAIT_MS));
}

/* Messages received by every comm of the process. */
static uint64_t global_received(void)
{
	tw_stats st;
	tw_stats_global(&st, sizeof(st));
	return st.msgs_received;
}

static int received_reaches(void *arg)
{
	return global_received() >= *(uint64_t *)arg;
}

static void wait_received(struct tu *h, uint64_t n)
{
	ck_assert_msg(tu_run_until(h, received_reaches, &n, TU_WAIT_MS), "received %llu of %llu",
		      (unsigned long long)global_received(), (unsigned long long)n);
}

START_TEST(server_small_while_large_decodes)
{
	struct tu h;
	tw_server *srv;
	struct client a, b;
	struct ox_job *gate;
	char addr[128];
	uint64_t base;
	tu_init(&h);
	ck_assert_int_eq(tw_context_set_offload_threads(h.ctx, 1), 0);
	ck_assert_int_eq(tw_context_set_offload_threshold_bytes(h.ctx, ox_threshold()), 0);
	ck_assert_int_eq(tw_server_new(h.ctx, &srv), 0);
	ck_assert_int_eq(tw_server_add_op(srv, "nbytes", op_nbytes, NULL), 0);
	ck_assert_int_eq(tw_server_listen(srv, "tcp://127.0.0.1:0"), 0);
	ck_assert_int_eq(tw_server_address(srv, 0, addr, sizeof(addr)), 0);
	base = global_received();
	client_connect(&h, addr, &a);
	client_connect(&h, addr, &b);
	wait_received(&h, base + 4); /* both handshakes, both ways */
	gate = ox_gate(h.ctx);
	ck_assert_int_eq(tw_comm_write(b.comm, ox_large(0, "nbytes")), 0);
	wait_received(&h, base + 5); /* B's request is in the pool */
	ck_assert_int_eq(tw_comm_write(a.comm, ox_small(1, "nbytes")), 0);
	ck_assert(tu_wait_count(&h, &a.n, 1, TU_WAIT_MS));
	ck_assert_int_eq(a.reply, OX_SMALL_BYTES);
	ck_assert_uint_eq(b.n, 0);
	ox_open(gate);
	ck_assert(tu_wait_count(&h, &b.n, 1, TU_WAIT_MS));
	ck_assert_int_eq(b.reply, (int64_t)ox_large_bytes());
	ck_assert_uint_lt(a.order, b.order);
	ck_assert_int_eq(a.closed + b.closed, 0);
	ox_wait_job(&h, gate);
	tw_comm_free(a.comm);
	tw_comm_free(b.comm);
	tw_server_free(srv);
	tu_fini(&h);
	ox_job_free(gate);
}
END_TEST

TCase *offload_life_tcase(void)
{
	TCase *held =
		ts_tcase("life", 120,
			 TS_TESTS(abort_while_in_pool, abort_free_in_close_while_in_pool,
				  free_while_in_pool, close_while_in_pool, peer_close_while_in_pool,
				  free_after_peer_close_while_in_pool, pause_while_in_pool));
	tcase_add_checked_fixture(held, fx_setup, fx_teardown);
	return held;
}

TCase *offload_life_other_tcase(void)
{
	return ts_tcase("life-other", 120,
			TS_TESTS(abort_while_decoding, free_while_decoding,
				 context_free_with_jobs_queued,
				 own_thread_context_free_with_jobs_queued, worker_error_reported,
				 server_small_while_large_decodes));
}
