/* SPDX-License-Identifier: BSD-3-Clause */
/* tw_pool against tw_server, black-hole listeners and refused ports:
 * call timeouts, connect and handshake failures and their codes, a late
 * reply never taken for the next call, the per-address limit (counted by a
 * relay in front of the server), idle reuse and the idle sweep, cancel,
 * addresses forgotten once they have no comms and no calls (also when a
 * callback calls the address again), and pools freed with calls waiting,
 * connecting or in flight. */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include <check.h>
#include <event2/event.h>
#include <openssl/ssl.h>

#include "core/pass.h"
#include "protocol/pool.h"
#include "transport/comm_impl.h"
#include "transport/tls_config.h"
#include "transport/upper.h"
#include "tests/check_rpc.h"
#include "tests/support/dask.h"
#include "tests/support/fault_proxy.h"
#include "tests/support/pack.h"
#include "tests/loop_timeouts.h"
#include "tests/support/rpc.h"
#include "tests/support/tls.h"
#include "tests/support/suite.h"

#define NFAIL 20

static tw_pool *gone_pool;

static int no_comms_at(void *arg)
{
	return tw_pool_open_comms(gone_pool, arg) == 0;
}

struct ndests {
	tw_pool *pool;
	size_t n;
};

static int ndests_is(void *arg)
{
	struct ndests *w = arg;
	return tw__pool_ndests(w->pool) == w->n;
}

/* The pool holds entries for exactly n addresses once the loop has run
 * (an address left with nothing is freed from the loop). */
static void assert_ndests(struct tu *h, tw_pool *p, size_t n)
{
	struct ndests w = {p, n};
	tu_run_until(h, ndests_is, &w, TU_WAIT_MS);
	ck_assert_uint_eq(tw__pool_ndests(p), n);
}

static void invalid_cb(tw_call *call, int err, tw_decoded *reply, void *arg)
{
	(void)call;
	(void)err;
	(void)reply;
	(void)arg;
	ck_abort_msg("callback of a refused call");
}

/* The stream encoding of a handshake message whose frame 0 is `info`
 * (msgpack, n bytes). */
static uint8_t *encoded(const void *info, size_t n, size_t *len)
{
	tw_msg *m = rq_raw(info, n);
	uint8_t *p = du_encode(m, len);
	tw_msg_free(m);
	ck_assert_ptr_nonnull(p);
	return p;
}

/* The last call_peer's tw_call_error. */
static struct rc peer_rc;

/* One call's error against a peer that greets with greet (len bytes)
 * and then says nothing. */
static int call_peer(struct tu *h, const void *greet, size_t len, uint32_t hs_ms, uint32_t call_ms,
		     size_t *accepted)
{
	struct bh b;
	struct rc rc;
	tw_pool *p;
	int err;
	ck_assert_int_eq(tw_context_set_handshake_timeout_ms(h->ctx, hs_ms), 0);
	bh_start(&b, h->base, greet, len);
	ck_assert_int_eq(tw_pool_new(h->ctx, &p), 0);
	err = rc_call(h, p, b.addr, rq_op("identity"), call_ms, &rc);
	ck_assert_ptr_null(rc.reply);
	rc_assert_why(&rc, b.addr);
	peer_rc = rc;
	*accepted = b.n;
	tw_pool_free(p);
	bh_stop(&b);
	return err;
}

START_TEST(timeout_slow_handler)
{
	struct rf f;
	struct rc rc;
	rf_init(&f);
	/* an idle comm first: the 100 ms then cover the request, not the
	 * connect and handshake ("still connecting" under valgrind) */
	ck_assert_int_eq(rc_call(&f.h, f.pool, f.s.addr, rq_echo_str("warm"), 0, &rc), 0);
	rc_clear(&rc);
	ck_assert_int_eq(rc_call(&f.h, f.pool, f.s.addr, rq_slow(1.0), 100, &rc), TW_ETIMEDOUT);
	ck_assert_ptr_null(rc.reply);
	rc_assert_why(&rc, f.s.addr);
	rc_assert_why(&rc, "within 100 ms: the request was sent and no reply came");
	/* the comm that carried it is aborted, never reused */
	ck_assert_uint_eq(tw_pool_open_comms(f.pool, f.s.addr), 0);
	assert_ndests(&f.h, f.pool, 0);
	ck_assert_int_eq(rc_call(&f.h, f.pool, f.s.addr, rq_slow(0.01), 10000, &rc), 0);
	rc_assert_str(&rc, "done");
	rc_clear(&rc);
	assert_ndests(&f.h, f.pool, 1); /* its idle comm */
	rf_fini(&f);
}
END_TEST

/* A harness, a black hole (accepts, never answers) and a pool;
 * handshake_ms > 0 sets the context's handshake timeout. */
static tw_pool *black_hole_pool(struct tu *h, struct bh *b, uint32_t handshake_ms)
{
	tw_pool *p;
	tu_init(h);
	if (handshake_ms > 0)
		ck_assert_int_eq(tw_context_set_handshake_timeout_ms(h->ctx, handshake_ms), 0);
	bh_start(b, h->base, NULL, 0);
	ck_assert_int_eq(tw_pool_new(h->ctx, &p), 0);
	return p;
}

/* A listener that accepts and never sends: the connector waits for the
 * listener's handshake. The handshake timeout ends it with TW_EHANDSHAKE;
 * a shorter call timeout ends the call first with TW_ETIMEDOUT. */
START_TEST(timeout_black_hole)
{
	struct tu h;
	size_t n;
	tu_init(&h);
	ck_assert_int_eq(call_peer(&h, NULL, 0, 200, 20000, &n), TW_EHANDSHAKE);
	ck_assert_uint_eq(n, 1);
	rc_assert_why(&peer_rc, "handshake timed out: no answer from the peer within 200 ms "
				"(the handshake timeout;");
	ck_assert_int_eq(call_peer(&h, NULL, 0, 20000, 200, &n), TW_ETIMEDOUT);
	ck_assert_uint_eq(n, 1);
	rc_assert_why(&peer_rc, "within 200 ms: still in the Dask handshake");
	tu_fini(&h);
}
END_TEST

/* A call never times out before its timeout has passed, however short
 * (helper-34: with deadlines truncated to the millisecond, most 1-5 ms
 * calls failed early, a 1 ms one after 58 us). Measured from before
 * tw_pool_call to the callback; only the lower bound is checked. */
struct timed {
	int done, err;
	uint64_t end_ns;
};

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void timed_done(tw_call *call, int err, tw_decoded *reply, void *arg)
{
	struct timed *t = arg;
	(void)call;
	t->end_ns = now_ns();
	t->err = err;
	t->done = 1;
	tw_decoded_free(reply);
}

START_TEST(timeout_never_early)
{
	static const uint32_t ms[] = {1, 2, 3, 5};
	struct tu h;
	struct bh b;
	tw_pool *p;
	p = black_hole_pool(&h, &b, 0);
	for (size_t i = 0; i < sizeof(ms) / sizeof(ms[0]); i++)
		for (int k = 0; k < 25; k++) {
			struct timed t = {0, 0, 0};
			uint64_t start = now_ns();
			ck_assert_int_eq(tw_pool_call(p, b.addr, rq_op("identity"), ms[i],
						      timed_done, &t, NULL),
					 0);
			ck_assert(tu_wait_flag(&h, &t.done, TU_WAIT_MS));
			ck_assert_int_eq(t.err, TW_ETIMEDOUT);
			ck_assert_msg(t.end_ns - start >= ms[i] * 1000000u,
				      "a %u ms call timed out after %llu us", (unsigned)ms[i],
				      (unsigned long long)(t.end_ns - start) / 1000);
		}
	tw_pool_free(p);
	bh_stop(&b);
	tu_fini(&h);
}
END_TEST

/* Half a handshake, then silence; a complete handshake that is not a map;
 * one without `pickle-protocol`: TW_EHANDSHAKE. */
START_TEST(timeout_half_handshake)
{
	static const uint8_t not_map[] = {0x05};
	static const uint8_t no_pickle[] = {0x81, 0xab, 'c', 'o', 'm', 'p', 'r',
					    'e',  's',  's', 'i', 'o', 'n', 0xc0};
	struct tu h;
	size_t len, n;
	uint8_t *full = encoded(ts_handshake_info, sizeof(ts_handshake_info), &len);
	tu_init(&h);
	for (size_t cut = 4; cut < len; cut += len / 3) {
		char want[96];
		ck_assert_int_eq(call_peer(&h, full, cut, 300, 20000, &n), TW_EHANDSHAKE);
		/* what came, unless the loop ran the timer before the greeting
		 * (a loaded machine): then nothing came */
		snprintf(want, sizeof(want), "handshake timed out: %zu bytes from the peer", cut);
		if (strstr(peer_rc.why, "no answer from the peer") == NULL)
			rc_assert_why(&peer_rc, want);
		rc_assert_why(&peer_rc, "within 300 ms");
		rc_assert_why(&peer_rc, "(the handshake timeout)");
	}
	free(full);
	full = encoded(not_map, sizeof(not_map), &len);
	ck_assert_int_eq(call_peer(&h, full, len, 20000, 20000, &n), TW_EHANDSHAKE);
	rc_assert_why(&peer_rc, "handshake: not a map");
	free(full);
	full = encoded(no_pickle, sizeof(no_pickle), &len);
	ck_assert_int_eq(call_peer(&h, full, len, 20000, 20000, &n), TW_EHANDSHAKE);
	rc_assert_why(&peer_rc, "`pickle-protocol` missing");
	free(full);
	/* a whole, valid handshake and then silence: the call times out */
	full = encoded(ts_handshake_info, sizeof(ts_handshake_info), &len);
	ck_assert_int_eq(call_peer(&h, full, len, 300, 300, &n), TW_ETIMEDOUT);
	rc_assert_why(&peer_rc, "the request was sent and no reply came");
	free(full);
	tu_fini(&h);
}
END_TEST

START_TEST(timeout_refused_and_bad_uri)
{
	struct tu h;
	struct rc rc;
	tw_pool *p;
	char uri[64];
	tu_init(&h);
	ck_assert_int_eq(tw_pool_new(h.ctx, &p), 0);
	ru_refused_uri(uri, sizeof(uri));
	ck_assert_int_eq(rc_call(&h, p, uri, rq_op("identity"), 5000, &rc), TW_ECONNREFUSED);
	ck_assert_uint_eq(tw_pool_open_comms(p, uri), 0);
	rc_assert_why(&rc, "connect to 127.0.0.1:");
	rc_assert_why(&rc, "Connection refused");
	ck_assert_int_eq(rc_call(&h, p, "nope://127.0.0.1:1", rq_op("identity"), 0, &rc),
			 TW_ESCHEME);
	rc_assert_why(&rc, "cannot connect to nope://127.0.0.1:1: ");
	rc_assert_why(&rc, tw_strerror(TW_ESCHEME));
	ck_assert_int_eq(rc_call(&h, p, "tcp://127.0.0.1", rq_op("identity"), 0, &rc), TW_EADDR);
	rc_assert_why(&rc, tw_strerror(TW_EADDR));
	assert_ndests(&h, p, 0);
	tw_pool_free(p);
	tu_fini(&h);
}
END_TEST

/* Every connect to an address fails: all the calls that were waiting
 * fail with that error, and no call connects again for the next one
 * (one connect per waiting call, at most the limit). */
static void all_fail(struct tu *h, tw_pool *p, const char *uri, size_t n, int want)
{
	static struct rc rc[NFAIL];
	ck_assert_uint_le(n, NFAIL);
	for (size_t i = 0; i < n; i++)
		rc_start(p, uri, rq_op("identity"), 0, &rc[i]);
	for (size_t i = 0; i < n; i++) {
		ck_assert(rc_wait(h, &rc[i], TU_WAIT_MS));
		ck_assert_msg(rc[i].err == want, "call %zu: %s", i, tw_strerror(rc[i].err));
	}
	ck_assert_uint_eq(tw_pool_open_comms(p, uri), 0);
}

START_TEST(connect_failure_fails_waiting)
{
	struct tu h;
	struct bh b;
	tw_pool *p;
	char refused[64];
	p = black_hole_pool(&h, &b, 200);
	all_fail(&h, p, b.addr, 10, TW_EHANDSHAKE);
	/* the black hole may accept after the handshakes timed out (a loaded
	 * machine): wait for its accepts, then check no more come */
	ck_assert(tu_wait_count(&h, &b.n, 10, TU_WAIT_MS));
	tu_run_for(&h, 50);
	ck_assert_uint_eq(b.n, 10);
	ck_assert_int_eq(tw_pool_set_limit(p, 4), 0);
	all_fail(&h, p, b.addr, 20, TW_EHANDSHAKE);
	ck_assert(tu_wait_count(&h, &b.n, 14, TU_WAIT_MS));
	tu_run_for(&h, 50);
	ck_assert_uint_eq(b.n, 14);
	ru_refused_uri(refused, sizeof(refused));
	all_fail(&h, p, refused, 20, TW_ECONNREFUSED);
	assert_ndests(&h, p, 0);
	tw_pool_free(p);
	bh_stop(&b);
	tu_fini(&h);
}
END_TEST

/* Each failed connect fails a waiting call, as each call's own connect
 * does in Dask: two calls without a timeout to a black hole, the second
 * made once the first's connect was accepted: when the first connect's
 * handshake times out, the first call fails while the second's connect
 * is still open. Before, no call failed while another connect was in
 * flight, and connects failing at staggered times (the pool's sweep
 * starting new ones) kept calls without a timeout waiting for ever
 * (breaker18 b18-4). */
struct first_fail {
	struct rc rc;
	tw_pool *p;
	const char *uri;
	size_t open_then;
};

static void first_failed(tw_call *c, int err, tw_decoded *reply, void *arg)
{
	struct first_fail *f = arg;
	(void)c;
	f->rc.done = 1;
	f->rc.err = err;
	tw_decoded_free(reply);
	f->open_then = tw_pool_open_comms(f->p, f->uri);
}

static int first_done(void *arg)
{
	return ((struct first_fail *)arg)->rc.done;
}

START_TEST(failed_connect_fails_its_call)
{
	struct tu h;
	struct bh b;
	struct first_fail f;
	struct rc second;
	memset(&f, 0, sizeof(f));
	f.p = black_hole_pool(&h, &b, 300);
	f.uri = b.addr;
	ck_assert_int_eq(tw_pool_call(f.p, b.addr, rq_op("identity"), 0, first_failed, &f, NULL),
			 0);
	ck_assert(tu_wait_count(&h, &b.n, 1, TU_WAIT_MS));
	rc_start(f.p, b.addr, rq_op("identity"), 0, &second);
	ck_assert(tu_wait_count(&h, &b.n, 2, TU_WAIT_MS));
	ck_assert(tu_run_until(&h, first_done, &f, TU_WAIT_MS));
	ck_assert_int_eq(f.rc.err, TW_EHANDSHAKE);
	ck_assert_uint_eq(f.open_then, 1); /* the second call's connect */
	ck_assert(rc_wait(&h, &second, TU_WAIT_MS));
	ck_assert_int_eq(second.err, TW_EHANDSHAKE);
	ck_assert_uint_eq(tw_pool_open_comms(f.p, b.addr), 0);
	ck_assert_uint_eq(b.n, 2);
	tw_pool_free(f.p);
	bh_stop(&b);
	tu_fini(&h);
}
END_TEST

/* Arguments tw_pool_call refuses at once (the callback never runs). */
START_TEST(pool_call_invalid)
{
	struct tu h;
	tw_pool *p;
	tw_msg *empty, *req = rq_op("identity");
	char long_uri[400];
	tu_init(&h);
	ck_assert_int_eq(tw_pool_new(h.ctx, &p), 0);
	ck_assert_int_eq(tw_msg_new(&empty), 0);
	ck_assert_int_eq(tw_pool_call(p, "tcp://127.0.0.1:1", empty, 0, NULL, NULL, NULL),
			 TW_EINVAL);
	ck_assert_int_eq(tw_pool_call(p, "tcp://127.0.0.1:1", NULL, 0, NULL, NULL, NULL),
			 TW_EINVAL);
	ck_assert_int_eq(tw_pool_call(NULL, "tcp://127.0.0.1:1", req, 0, NULL, NULL, NULL),
			 TW_EINVAL);
	memset(long_uri, 'a', sizeof(long_uri) - 1);
	memcpy(long_uri, "tcp://", 6);
	long_uri[sizeof(long_uri) - 1] = '\0';
	ck_assert_int_eq(tw_pool_call(p, long_uri, req, 0, invalid_cb, NULL, NULL), TW_EINVAL);
	ck_assert_int_eq(tw_pool_call(p, "tcp://127.0.0.1:1", empty, 0, invalid_cb, NULL, NULL),
			 TW_EINVAL);
	tu_run_for(&h, 50);
	tw_msg_free(empty);
	tw_msg_free(req);
	tw_pool_free(p);
	tu_fini(&h);
}
END_TEST

/* A relay that counts connections: the fault proxy without a fault. */
static const struct fp_opts pass = {.fault = FP_PASS};

/* Call A times out before its (slow) reply; call B to the same address
 * right after gets its own reply, never A's, on a new comm. */
START_TEST(late_reply_not_taken)
{
	struct rf f;
	struct fp relay;
	struct rc a;
	rf_init(&f);
	fp_start(&relay, f.h.base, f.s.addr, &pass);
	/* an idle comm first, to carry A: A's 100 ms then cover its request,
	 * not the connect (else B could take the comm A was still making) */
	ck_assert_int_eq(rc_call(&f.h, f.pool, relay.addr, rq_echo_str("warm"), 0, &a), 0);
	rc_clear(&a);
	ck_assert_uint_eq(relay.accepts, 1);
	ck_assert_int_eq(rc_call(&f.h, f.pool, relay.addr, rq_slow(0.3), 100, &a), TW_ETIMEDOUT);
	rc_echo_ok(&f.h, f.pool, relay.addr, "B", 10000);
	ck_assert_uint_eq(relay.accepts, 2);
	/* the server answers A's request after all, into the aborted comm */
	ck_assert(tu_wait_count(&f.h, &f.s.slow_peak, 1, TU_WAIT_MS));
	ck_assert(tu_run_until(&f.h, rs_no_slow, &f.s, TU_WAIT_MS));
	rc_echo_ok(&f.h, f.pool, relay.addr, "C", 10000);
	ck_assert_uint_eq(relay.accepts, 2);
	ck_assert_uint_eq(tw_pool_open_comms(f.pool, relay.addr), 1);
	tw_pool_free(f.pool);
	f.pool = NULL;
	fp_stop(&relay);
	rf_fini(&f);
}
END_TEST

/* A call that times out while it waits for the only comm (limit 1): the
 * call in flight and its comm are not touched. */
START_TEST(timeout_while_waiting)
{
	struct rf f;
	struct rc a, b;
	rf_init(&f);
	ck_assert_int_eq(tw_pool_set_limit(f.pool, 1), 0);
	rc_start(f.pool, f.s.addr, rq_op("later"), 0, &a);
	ck_assert(tu_run_until(&f.h, rs_held_one, &f.s, TU_WAIT_MS));
	ck_assert_int_eq(rc_call(&f.h, f.pool, f.s.addr, rq_echo_str("b"), 100, &b), TW_ETIMEDOUT);
	ck_assert_int_eq(a.done, 0);
	ck_assert_uint_eq(tw_pool_open_comms(f.pool, f.s.addr), 1);
	rs_release(&f.s, 0);
	ck_assert(rc_wait(&f.h, &a, TU_WAIT_MS));
	rc_assert_str(&a, "later");
	rc_clear(&a);
	rf_serves_on(&f, "c");
	rf_fini(&f);
}
END_TEST

/* Calls with different timeouts time out soonest first, whatever order
 * they were made in (a later call with a shorter timeout re-arms the
 * pool's timer), and a call without a timeout outlives them all. */
START_TEST(timeouts_soonest_first)
{
	static const uint32_t ms[] = {0, 2000, 200, 1000};
	struct rf f;
	struct rc rc[4];
	long long t0;
	rf_init(&f);
	rc_start(f.pool, f.s.addr, rq_op("later"), ms[0], &rc[0]);
	ck_assert(tu_run_until(&f.h, rs_held_one, &f.s, TU_WAIT_MS));
	t0 = ts_now_ms();
	for (int i = 1; i < 4; i++)
		rc_start(f.pool, f.s.addr, rq_op("later"), ms[i], &rc[i]);
	/* each fires at its own time, not with the first-armed one: a call
	 * is still waiting when an earlier one has fired before its own
	 * deadline came (a loop that stalled past it fires both in one pass,
	 * soonest first) */
	ck_assert(rc_wait(&f.h, &rc[2], TU_WAIT_MS));
	if (ts_now_ms() < t0 + ms[3])
		ck_assert_int_eq(rc[1].done + rc[3].done, 0);
	ck_assert(rc_wait(&f.h, &rc[3], TU_WAIT_MS));
	if (ts_now_ms() < t0 + ms[1])
		ck_assert_int_eq(rc[1].done, 0);
	ck_assert(rc_wait(&f.h, &rc[1], TU_WAIT_MS));
	ck_assert_uint_lt(rc[2].seq, rc[3].seq);
	ck_assert_uint_lt(rc[3].seq, rc[1].seq);
	for (int i = 1; i < 4; i++)
		ck_assert_int_eq(rc[i].err, TW_ETIMEDOUT);
	ck_assert_int_eq(rc[0].done, 0);
	/* the timed-out calls' comms are aborted; the first call's waits */
	ck_assert_uint_eq(tw_pool_open_comms(f.pool, f.s.addr), 1);
	rs_release(&f.s, 0);
	ck_assert(rc_wait(&f.h, &rc[0], TU_WAIT_MS));
	rc_assert_str(&rc[0], "later");
	for (int i = 0; i < 4; i++)
		rc_clear(&rc[i]);
	rf_fini(&f);
}
END_TEST

/* The server goes away while the pool holds an idle comm to it: the comm
 * leaves the pool, and the next call is refused. */
START_TEST(server_gone)
{
	struct rf f;
	struct rc rc;
	char addr[128];
	rf_init(&f);
	ck_assert_int_eq(rc_call(&f.h, f.pool, f.s.addr, rq_echo_str("x"), 0, &rc), 0);
	rc_clear(&rc);
	snprintf(addr, sizeof(addr), "%s", f.s.addr);
	gone_pool = f.pool;
	rs_stop(&f.s);
	ck_assert(tu_run_until(&f.h, no_comms_at, addr, TU_WAIT_MS));
	assert_ndests(&f.h, f.pool, 0);
	ck_assert_int_eq(rc_call(&f.h, f.pool, addr, rq_echo_str("y"), 0, &rc), TW_ECONNREFUSED);
	rc_assert_why(&rc, "Connection refused");
	assert_ndests(&f.h, f.pool, 0);
	tw_pool_free(f.pool);
	tu_fini(&f.h);
}
END_TEST

/* A tls server that sends its Dask handshake and closes at once (one
 * shutting down): its close_notify arrives with the handshake, in one
 * read. The call fails as the comm ended (TW_ECLOSED, as over tcp), not
 * as a peer that spoke first (TW_EPROTO), which a close is not. */
static size_t hs_closed;

static void hs_close_done(tw_comm *c, int err, const tw_handshake_info *info, void *arg)
{
	(void)err;
	(void)info;
	(void)arg;
	hs_closed++;
	tw_comm_free(c);
}

static void hs_then_close(tw_listener *l, tw_comm *c, void *arg)
{
	(void)l;
	(void)arg;
	ck_assert_int_eq(tw_comm_handshake(c, TW_HANDSHAKE_LISTENER, hs_close_done, NULL), 0);
	tw_comm_close(c); /* after the handshake our side writes first */
}

START_TEST(pool_tls_server_closes_after_handshake)
{
	struct tu h;
	struct rc rc;
	tw_listener *l;
	tw_pool *p;
	char uri[128];
	tu_init(&h);
	tt_use_tls(h.ctx, "ca.pem", "cert.pem", "key.pem");
	ck_assert_int_eq(tw_listener_new(h.ctx, "tls://127.0.0.1:0", hs_then_close, NULL, &l), 0);
	ck_assert_int_eq(tw_listener_address(l, uri, sizeof(uri)), 0);
	ck_assert_int_eq(tw_pool_new(h.ctx, &p), 0);
	hs_closed = 0;
	ck_assert_int_eq(rc_call(&h, p, uri, rq_op("identity"), 0, &rc), TW_ECLOSED);
	rc_assert_why(&rc, "ended before the reply");
	ck_assert(tu_wait_count(&h, &hs_closed, 1, TU_WAIT_MS));
	tw_pool_free(p);
	tw_listener_free(l);
	tt_fini(&h);
}
END_TEST

/* TLS failures: a client that trusts another CA (TW_ETLS), tls:// to a
 * tcp:// server (TW_ETLS), tcp:// to a tls:// server (no Dask handshake
 * comes: TW_EHANDSHAKE). */
START_TEST(pool_tls_errors)
{
	struct tu h;
	struct rs tls, tcp;
	tw_context *bad, *plain;
	tw_pool *p;
	struct rc rc;
	char uri[128];
	tu_init(&h);
	tt_use_tls(h.ctx, "ca.pem", "cert.pem", "key.pem");
	rs_start(&tls, h.ctx, h.base, "tls://127.0.0.1:0");
	rs_start(&tcp, h.ctx, h.base, "tcp://127.0.0.1:0");
	bad = tt_context(&h, "other-ca.pem", "cert.pem", "key.pem");
	ck_assert_int_eq(tw_pool_new(bad, &p), 0);
	ck_assert_int_eq(rc_call(&h, p, tls.addr, rq_op("identity"), 0, &rc), TW_ETLS);
	rc_assert_why(&rc, "TLS handshake with the server failed: ");
	/* the next failure's own reason, not the TLS one left on the context */
	ru_refused_uri(uri, sizeof(uri));
	ck_assert_int_eq(rc_call(&h, p, uri, rq_op("identity"), 0, &rc), TW_ECONNREFUSED);
	rc_assert_why(&rc, "Connection refused");
	ck_assert_ptr_nonnull(strstr(tw_context_last_error(bad), "Connection refused"));
	tw_pool_free(p);
	ck_assert_int_eq(tw_pool_new(h.ctx, &p), 0);
	ck_assert_int_eq(rc_call(&h, p, tls.addr, rq_op("identity"), 0, &rc), 0);
	rc_clear(&rc);
	ck_assert_int_eq(rc_call(&h, p, tt_uri_as(tcp.addr, "tls", uri, sizeof(uri)),
				 rq_op("identity"), 0, &rc),
			 TW_ETLS);
	tw_pool_free(p);
	plain = tt_context(&h, NULL, NULL, NULL);
	ck_assert_int_eq(tw_context_set_handshake_timeout_ms(plain, 300), 0);
	ck_assert_int_eq(tw_pool_new(plain, &p), 0);
	/* tls:// on a context with no TLS configuration: refused, and why */
	ck_assert_int_eq(rc_call(&h, p, tls.addr, rq_op("identity"), 0, &rc), TW_EINVAL);
	rc_assert_why(&rc, "no TLS configuration on the context (tw_context_set_tls)");
	ck_assert_int_eq(rc_call(&h, p, tt_uri_as(tls.addr, "tcp", uri, sizeof(uri)),
				 rq_op("identity"), 0, &rc),
			 TW_EHANDSHAKE);
	rc_assert_why(&rc, "Dask handshake with tcp://");
	tw_pool_free(p);
	rs_stop(&tls);
	rs_stop(&tcp);
	tt_fini(&h);
}
END_TEST

TCase *rpc_timeout_tcase(void)
{
	return ts_tcase("timeout", 60,
			TS_TESTS(timeout_slow_handler, timeout_black_hole, timeout_never_early,
				 failed_connect_fails_its_call, timeouts_soonest_first,
				 timeout_half_handshake, timeout_refused_and_bad_uri,
				 connect_failure_fails_waiting, pool_call_invalid,
				 late_reply_not_taken, timeout_while_waiting, server_gone,
				 pool_tls_errors, pool_tls_server_closes_after_handshake));
}

/* Deadlines (one timer per pool, a list soonest first) while one comm is
 * held by a call with no timeout, so every other call waits: calls made
 * in shuffled order with timeouts 100 ms apart time out soonest first;
 * the first one's callback cancels the next one (the deadline the timer
 * would be armed for); a call canceled right after it was made (the
 * soonest, so the armed one) never fires; the third one's callback makes
 * a new call with a short timeout, which times out too; calls with no
 * timeout among them stay and get their replies, in order, once the
 * comm is free. */
#define DL_N 8
static const uint32_t dl_ms[DL_N] = {500, 100, 0, 800, 300, 0, 200, 400};
static struct rc dl_rc[DL_N], dl_nested;
static tw_pool *dl_pool;
static unsigned dl_seq;
static const char *dl_addr;
static long long dl_nested_made; /* ts_now_ms after the nested call was made */

static void dl_done(tw_call *call, int err, tw_decoded *reply, void *arg)
{
	struct rc *rc = arg;
	size_t i = (size_t)(rc - dl_rc);
	ck_assert_int_eq(rc->done, 0);
	rc->call = call;
	rc->done = 1;
	rc->err = err;
	rc->reply = reply;
	rc->seq = ++dl_seq;
	if (rc == &dl_nested || err != TW_ETIMEDOUT)
		return;
	if (dl_ms[i] == 100) /* cancel the 200 ms call */
		for (size_t k = 0; k < DL_N; k++)
			if (dl_ms[k] == 200)
				tw_call_cancel(dl_rc[k].call);
	if (dl_ms[i] == 300)
		ck_assert_int_eq(tw_pool_call(dl_pool, dl_addr, rq_op("identity"), 20, dl_done,
					      &dl_nested, &dl_nested.call),
				 0);
	if (dl_ms[i] == 300)
		dl_nested_made = ts_now_ms();
}

START_TEST(pool_deadlines)
{
	struct rf f;
	struct rc first, early;
	unsigned want = 0, seq400 = 0;
	long long t_made;
	rf_init(&f);
	dl_pool = f.pool;
	dl_addr = f.s.addr;
	dl_seq = 0;
	memset(dl_rc, 0, sizeof(dl_rc));
	memset(&dl_nested, 0, sizeof(dl_nested));
	ck_assert_int_eq(tw_pool_set_limit(f.pool, 1), 0);
	rc_start(f.pool, f.s.addr, rq_op("later"), 0, &first);
	ck_assert(tu_run_until(&f.h, rs_held_one, &f.s, TU_WAIT_MS));
	t_made = ts_now_ms();
	for (size_t i = 0; i < DL_N; i++) {
		char s[8];
		snprintf(s, sizeof(s), "c%zu", i);
		ck_assert_int_eq(tw_pool_call(f.pool, f.s.addr, rq_echo_str(s), dl_ms[i], dl_done,
					      &dl_rc[i], &dl_rc[i].call),
				 0);
	}
	rc_start(f.pool, f.s.addr, rq_echo_str("early"), 10, &early);
	tw_call_cancel(early.call); /* the soonest deadline: the armed one */
	ck_assert_int_eq(early.done, 1);
	ck_assert_int_eq(early.err, TW_ECANCELED);
	/* 100, 200 (canceled by 100's callback), 300, 400, 500 and 800 in
	 * that order; the nested call (20 ms) made by 300's callback after
	 * 300, and before 400 whenever its deadline came first (300's
	 * callback may run late on a slow machine: then 400 is due first) */
	for (size_t k = 0; k < DL_N; k++)
		if (dl_ms[k] == 800)
			ck_assert(rc_wait(&f.h, &dl_rc[k], TU_WAIT_MS));
	ck_assert(rc_wait(&f.h, &dl_nested, TU_WAIT_MS));
	ck_assert_int_eq(dl_nested.err, TW_ETIMEDOUT);
	for (uint32_t ms = 100; ms <= 800; ms += 100)
		for (size_t k = 0; k < DL_N; k++) {
			if (dl_ms[k] != ms)
				continue;
			ck_assert_msg(dl_rc[k].seq - (dl_nested.seq < dl_rc[k].seq) == ++want,
				      "%u ms: completed %u-th, not %u-th (nested %u-th)", ms,
				      dl_rc[k].seq, want, dl_nested.seq);
			ck_assert_int_eq(dl_rc[k].err, ms == 200 ? TW_ECANCELED : TW_ETIMEDOUT);
			if (ms == 400)
				seq400 = dl_rc[k].seq;
		}
	ck_assert_uint_gt(dl_nested.seq, 3);
	if (dl_nested_made + 20 + 1 < t_made + 400 + 1)
		ck_assert_uint_lt(dl_nested.seq, seq400);
	ck_assert_int_eq(early.late, 0);
	for (size_t k = 0; k < DL_N; k++)
		if (dl_ms[k] == 0)
			ck_assert_int_eq(dl_rc[k].done, 0);
	ck_assert_uint_eq(tw_pool_open_comms(f.pool, f.s.addr), 1);
	rs_release(&f.s, 0);
	ck_assert(rc_wait(&f.h, &first, TU_WAIT_MS));
	rc_assert_str(&first, "later");
	ck_assert(rc_wait(&f.h, &dl_rc[5], TU_WAIT_MS));
	rc_assert_str(&dl_rc[2], "c2");
	rc_assert_str(&dl_rc[5], "c5");
	ck_assert_uint_lt(dl_rc[2].seq, dl_rc[5].seq);
	rc_clear(&first);
	for (size_t k = 0; k < DL_N; k++)
		tw_decoded_free(dl_rc[k].reply);
	tw_decoded_free(dl_nested.reply);
	ck_assert_uint_eq(tw_pool_open_comms(f.pool, f.s.addr), 1);
	/* timed calls pending when the pool is freed: canceled, nothing after */
	for (size_t k = 0; k < 3; k++) {
		memset(&dl_rc[k], 0, sizeof(dl_rc[k]));
		ck_assert_int_eq(tw_pool_call(f.pool, f.s.addr, rq_op("later"),
					      100 * (uint32_t)(k + 1), dl_done, &dl_rc[k],
					      &dl_rc[k].call),
				 0);
	}
	tw_pool_free(f.pool);
	f.pool = NULL;
	for (size_t k = 0; k < 3; k++) {
		ck_assert_int_eq(dl_rc[k].done, 1);
		ck_assert_int_eq(dl_rc[k].err, TW_ECANCELED);
	}
	tu_run_for(&f.h, 400); /* past every deadline: dl_done would fail on a second run */
	rf_fini(&f);
}
END_TEST

/* A pool keeps its call deadlines and idle sweep on timerfds, not on
 * libevent timers: a pending libevent timer makes every epoll_wait of the
 * loop arm a kernel timer too (core/timer.h). After a timed call, the
 * loop has as many libevent timeouts pending as before the pool was made,
 * and the call still timed out when it had to (pool_deadlines). */
START_TEST(pool_adds_no_loop_timeout)
{
	struct rf f;
	struct rc rc;
	int before;
	tu_init(&f.h);
	rs_start(&f.s, f.h.ctx, f.h.base, "tcp://127.0.0.1:0");
	before = loop_timeouts(f.h.base);
	ck_assert_int_eq(tw_pool_new(f.h.ctx, &f.pool), 0);
	rc_start(f.pool, f.s.addr, rq_echo_str("timed"), 60000, &rc);
	ck_assert(rc_wait(&f.h, &rc, TU_WAIT_MS));
	rc_assert_str(&rc, "timed");
	rc_clear(&rc);
	ck_assert_int_eq(loop_timeouts(f.h.base), before);
	rf_fini(&f);
}
END_TEST

/* A reply that closes its comm (close: true), and a call made from its
 * callback: the comm is still idle in the pool, so the call is written
 * at once (the fast path); it fails with TW_ECLOSED when the server's
 * end arrives, from the loop, never inside tw_pool_call; the next call
 * gets a new comm. */
static struct rc fp_second;

static void fp_first_done(tw_call *call, int err, tw_decoded *reply, void *arg)
{
	struct rc *rc = arg;
	(void)call;
	rc->done = 1;
	rc->err = err;
	rc->reply = reply;
	rc_start(dl_pool, dl_addr, rq_echo_str("second"), 0, &fp_second);
	ck_assert_uint_eq(tw_pool_open_comms(dl_pool, dl_addr), 1); /* no new connect */
}

START_TEST(pool_call_after_closing_reply)
{
	struct rf f;
	struct rc first = {0};
	tw_builder *b;
	rf_init(&f);
	dl_pool = f.pool;
	dl_addr = f.s.addr;
	b = rq_begin("echo", 2);
	rq_str(b, "data", "bye");
	rq_bool(b, "close", 1);
	ck_assert_int_eq(tw_pool_call(f.pool, f.s.addr, rq_end(b), 0, fp_first_done, &first, NULL),
			 0);
	ck_assert(rc_wait(&f.h, &fp_second, TU_WAIT_MS));
	ck_assert_int_eq(first.err, 0);
	ck_assert(tw_msgpack_str_eq(tw_decoded_root(first.reply), "bye"));
	tw_decoded_free(first.reply);
	ck_assert_int_eq(fp_second.err, TW_ECLOSED);
	rf_serves_on(&f, "third");
	rf_fini(&f);
}
END_TEST

/* Pool limits and idle comms, through a relay that counts connections. */

#define BATCH 50

struct batch {
	struct rc rc[BATCH];
	struct rf *f;
	struct fp *relay;
	size_t peak_open; /* tw_pool_open_comms seen while waiting */
};

static int batch_done(void *arg)
{
	struct batch *b = arg;
	size_t open = tw_pool_open_comms(b->f->pool, b->relay->addr);
	if (open > b->peak_open)
		b->peak_open = open;
	for (size_t i = 0; i < BATCH; i++)
		if (!b->rc[i].done)
			return 0;
	return 1;
}

static void run_batch(struct batch *b)
{
	for (size_t i = 0; i < BATCH; i++)
		rc_start(b->f->pool, b->relay->addr, rq_slow(0.01), 0, &b->rc[i]);
	ck_assert(tu_run_until(&b->f->h, batch_done, b, TU_WAIT_MS));
	for (size_t i = 0; i < BATCH; i++) {
		rc_assert_str(&b->rc[i], "done");
		rc_clear(&b->rc[i]);
	}
}

struct open_wait {
	struct rf *f;
	struct fp *relay;
	size_t n;
};

static int open_is(void *arg)
{
	struct open_wait *w = arg;
	return tw_pool_open_comms(w->f->pool, w->relay->addr) == w->n && w->relay->live == w->n;
}

START_TEST(pool_limit_and_idle)
{
	static struct batch b;
	struct rf f;
	struct fp relay;
	struct open_wait w = {&f, &relay, 1};
	rf_init(&f);
	fp_start(&relay, f.h.base, f.s.addr, &pass);
	ck_assert_int_eq(tw_pool_set_limit(f.pool, 0), TW_EINVAL);
	ck_assert_int_eq(tw_pool_set_limit(f.pool, 4), 0);
	memset(&b, 0, sizeof(b));
	b.f = &f;
	b.relay = &relay;
	run_batch(&b);
	ck_assert_uint_eq(relay.accepts, 4); /* 50 waiting: the limit */
	ck_assert_uint_le(relay.peak, 4);
	ck_assert_uint_le(b.peak_open, 4);
	ck_assert_uint_le(f.s.slow_peak, 4);
	ck_assert_uint_eq(tw_pool_open_comms(f.pool, relay.addr), relay.accepts);
	/* a second batch reuses the idle comms */
	size_t accepts = relay.accepts;
	run_batch(&b);
	ck_assert_uint_eq(relay.accepts, accepts);
	/* the sweep (every second) keeps one idle comm, then none */
	ck_assert_int_eq(tw_pool_set_idle(f.pool, 1, 60000), 0);
	ck_assert(tu_run_until(&f.h, open_is, &w, TU_WAIT_MS));
	ck_assert_int_eq(tw_pool_set_idle(f.pool, 1, 200), 0);
	ck_assert_uint_eq(tw__pool_ndests(f.pool), 1);
	w.n = 0;
	ck_assert(tu_run_until(&f.h, open_is, &w, TU_WAIT_MS));
	ck_assert_uint_eq(tw__pool_ndests(f.pool), 0); /* the sweep freed it */
	ck_assert_uint_eq(relay.accepts, accepts);
	tw_pool_free(f.pool);
	f.pool = NULL;
	fp_stop(&relay);
	rf_fini(&f);
}
END_TEST

/* tw_call_cancel: a waiting call and a call in flight; the callback runs
 * at once with TW_ECANCELED; the in-flight call's comm is aborted. */
START_TEST(pool_cancel)
{
	struct rf f;
	struct rc a, b;
	char want[160];
	rf_init(&f);
	ck_assert_int_eq(tw_pool_set_limit(f.pool, 1), 0);
	rc_start(f.pool, f.s.addr, rq_op("later"), 0, &a);
	rc_start(f.pool, f.s.addr, rq_echo_str("b"), 0, &b);
	ck_assert(tu_run_until(&f.h, rs_held_one, &f.s, TU_WAIT_MS));
	tw_call_cancel(b.call); /* waiting for the only comm */
	ck_assert_int_eq(b.done, 1);
	ck_assert_int_eq(b.err, TW_ECANCELED);
	/* the text names the address (issue 16: "canceled" alone) */
	snprintf(want, sizeof(want), "call to %s canceled", f.s.addr);
	ck_assert_str_eq(b.why, want);
	ck_assert_int_eq(a.done, 0);
	tw_call_cancel(a.call); /* sent */
	ck_assert_int_eq(a.done, 1);
	ck_assert_int_eq(a.err, TW_ECANCELED);
	ck_assert_uint_eq(tw_pool_open_comms(f.pool, f.s.addr), 0);
	assert_ndests(&f.h, f.pool, 0);
	rc_echo_ok(&f.h, f.pool, f.s.addr, "c", 0);
	assert_ndests(&f.h, f.pool, 1);
	rf_fini(&f);
}
END_TEST

static void assert_closed_now(int fd);

/* tw_pool_fail_address: what a scheduler does when it removes a worker.
 * Every call to the address, in flight or waiting, fails at once with the
 * given code and a text naming the address and the reason; its comms are
 * closed; other addresses are untouched; the address works again after. */
START_TEST(pool_fail_address)
{
	static struct rc rc[5], other, again;
	struct rf f;
	struct bh b;
	rf_init(&f);
	bh_start(&b, f.h.base, NULL, 0);
	ck_assert_int_eq(tw_pool_set_limit(f.pool, 2), 0);
	memset(rc, 0, sizeof(rc));
	for (size_t i = 0; i < 4; i++) /* two in flight (held), two waiting */
		rc_start(f.pool, f.s.addr, rq_op("later"), 0, &rc[i]);
	rc_start(f.pool, b.addr, rq_op("identity"), 0, &other); /* in its handshake */
	ck_assert(tu_wait_count(&f.h, &f.s.nheld, 2, TU_WAIT_MS));
	ck_assert(tu_wait_count(&f.h, &b.n, 1, TU_WAIT_MS));
	ck_assert_int_eq(
		tw_pool_fail_address(f.pool, f.s.addr, TW_ETIMEDOUT, "no heartbeat within 1000 ms"),
		0);
	for (size_t i = 0; i < 4; i++) { /* at once: no loop pass since */
		ck_assert_int_eq(rc[i].done, 1);
		ck_assert_int_eq(rc[i].err, TW_ETIMEDOUT);
		ck_assert_msg(strstr(rc[i].why, f.s.addr) != NULL &&
				      strstr(rc[i].why, "no heartbeat within 1000 ms") != NULL,
			      "%zu: %s", i, rc[i].why);
	}
	ck_assert_uint_eq(tw_pool_open_comms(f.pool, f.s.addr), 0);
	ck_assert_int_eq(other.done, 0);
	ck_assert_uint_eq(tw_pool_open_comms(f.pool, b.addr), 1);
	/* the one in its handshake, and its socket closed at once */
	ck_assert_int_eq(tw_pool_fail_address(f.pool, b.addr, TW_ECLOSED, "removed"), 0);
	ck_assert_int_eq(other.err, TW_ECLOSED);
	assert_closed_now(b.fds[0]);
	ck_assert_int_eq(tw_pool_fail_address(f.pool, "tcp://127.0.0.1:1", TW_ECLOSED, NULL), 0);
	ck_assert_int_eq(tw_pool_fail_address(f.pool, b.addr, 0, "x"), TW_EINVAL);
	ck_assert_int_eq(rc_call(&f.h, f.pool, f.s.addr, rq_op("identity"), 0, &again), 0);
	rc_clear(&again);
	bh_stop(&b);
	rf_fini(&f);
}
END_TEST

/* Retries of idempotent calls (issue 16; Dask's retry_operation): tried
 * count + 1 times in all, the text saying so; a call that is not
 * idempotent is tried once; one sleeping before its next try is canceled,
 * failed by tw_pool_fail_address (never retried then) and canceled by
 * tw_pool_free; idempotent calls that succeed are plain calls. */
static int one_sleeping(void *arg)
{
	return tw__pool_nsleeping(arg) == 1;
}

START_TEST(pool_retry)
{
	static struct rc a, b, c, d, e, ok;
	struct rf f;
	char refused[64], want[160];
	rf_init(&f);
	ru_refused_uri(refused, sizeof(refused));
	ck_assert_int_eq(tw_pool_set_retry(f.pool, 2, 1, 5), 0);
	ck_assert_int_eq(tw_pool_set_retry(f.pool, 2, 0, 5), TW_EINVAL);
	ck_assert_int_eq(tw_pool_set_retry(f.pool, 2, 10, 5), TW_EINVAL);
	rc_start_flags(f.pool, refused, rq_op("identity"), 0, TW_CALL_IDEMPOTENT, &a);
	ck_assert(rc_wait(&f.h, &a, TU_WAIT_MS));
	ck_assert_int_eq(a.err, TW_ECONNREFUSED);
	ck_assert_msg(strstr(a.why, "(after 2 retries)") != NULL, "%s", a.why);
	ck_assert_int_eq(rc_call(&f.h, f.pool, refused, rq_op("identity"), 0, &b), TW_ECONNREFUSED);
	ck_assert_msg(strstr(b.why, "retries") == NULL, "%s", b.why);
	/* sleeping calls: canceled, failed with their address, freed */
	ck_assert_int_eq(tw_pool_set_retry(f.pool, 5, 60000, 60000), 0);
	rc_start_flags(f.pool, refused, rq_op("identity"), 0, TW_CALL_IDEMPOTENT, &c);
	ck_assert(tu_run_until(&f.h, one_sleeping, f.pool, TU_WAIT_MS));
	tw_call_cancel(c.call);
	ck_assert_int_eq(c.err, TW_ECANCELED);
	snprintf(want, sizeof(want), "call to %s canceled (after 1 retry)", refused);
	ck_assert_str_eq(c.why, want);
	ck_assert_uint_eq(tw__pool_nsleeping(f.pool), 0);
	rc_start_flags(f.pool, refused, rq_op("identity"), 0, TW_CALL_IDEMPOTENT, &d);
	ck_assert(tu_run_until(&f.h, one_sleeping, f.pool, TU_WAIT_MS));
	ck_assert_int_eq(tw_pool_fail_address(f.pool, refused, TW_ECLOSED, "removed"), 0);
	ck_assert_int_eq(d.err, TW_ECLOSED);
	ck_assert_msg(strstr(d.why, "removed") != NULL, "%s", d.why);
	rc_start_flags(f.pool, f.s.addr, rq_op("identity"), 0, TW_CALL_IDEMPOTENT, &ok);
	ck_assert(rc_wait(&f.h, &ok, TU_WAIT_MS));
	ck_assert_int_eq(ok.err, 0);
	rc_clear(&ok);
	rc_start_flags(f.pool, refused, rq_op("identity"), 0, TW_CALL_IDEMPOTENT, &e);
	ck_assert(tu_run_until(&f.h, one_sleeping, f.pool, TU_WAIT_MS));
	tw_pool_free(f.pool);
	f.pool = NULL;
	ck_assert_int_eq(e.err, TW_ECANCELED);
	rf_fini(&f);
}
END_TEST

/* Waiting calls cancelled from the middle, the tail and the head of the
 * queue (one comm, held by the first call): the others still go out, in
 * the order they were made, on the one comm. */
START_TEST(pool_cancel_waiting_order)
{
	static const char *names[] = {"b", "c", "d", "e", "f", "g"};
	struct rf f;
	struct rc a, w[6];
	rf_init(&f);
	ck_assert_int_eq(tw_pool_set_limit(f.pool, 1), 0);
	rc_start(f.pool, f.s.addr, rq_op("later"), 0, &a);
	for (int i = 0; i < 5; i++)
		rc_start(f.pool, f.s.addr, rq_echo_str(names[i]), 0, &w[i]);
	ck_assert(tu_run_until(&f.h, rs_held_one, &f.s, TU_WAIT_MS));
	tw_call_cancel(w[2].call);                                   /* middle */
	tw_call_cancel(w[4].call);                                   /* tail */
	rc_start(f.pool, f.s.addr, rq_echo_str(names[5]), 0, &w[5]); /* after the new tail */
	tw_call_cancel(w[0].call);                                   /* head */
	for (int i = 0; i < 6; i++) {
		int gone = i == 0 || i == 2 || i == 4;
		ck_assert_int_eq(w[i].done, gone);
		if (gone)
			ck_assert_int_eq(w[i].err, TW_ECANCELED);
	}
	rs_release(&f.s, 0);
	ck_assert(rc_wait(&f.h, &a, TU_WAIT_MS));
	ck_assert_int_eq(a.err, 0);
	for (int i = 1; i < 6; i += 2) {
		ck_assert(rc_wait(&f.h, &w[i], TU_WAIT_MS));
		ck_assert_int_eq(w[i].err, 0);
		rc_assert_str(&w[i], names[i]);
	}
	ck_assert_uint_lt(w[1].seq, w[3].seq);
	ck_assert_uint_lt(w[3].seq, w[5].seq);
	ck_assert_uint_eq(tw_pool_open_comms(f.pool, f.s.addr), 1);
	rc_clear(&a);
	for (int i = 0; i < 6; i++)
		rc_clear(&w[i]);
	rf_fini(&f);
}
END_TEST

/* Each reply callback makes the next call: they reuse the one comm. */
struct chain {
	tw_pool *pool;
	const char *addr;
	int n, done, err;
};

static void chain_cb(tw_call *call, int err, tw_decoded *reply, void *arg)
{
	struct chain *c = arg;
	char want[16];
	(void)call;
	snprintf(want, sizeof(want), "n%d", c->n);
	if (err != 0 || !tw_msgpack_str_eq(tw_decoded_root(reply), want))
		c->err = err != 0 ? err : -1;
	tw_decoded_free(reply);
	if (c->err != 0 || ++c->n == 5) {
		c->done = 1;
		return;
	}
	snprintf(want, sizeof(want), "n%d", c->n);
	ck_assert_int_eq(tw_pool_call(c->pool, c->addr, rq_echo_str(want), 0, chain_cb, c, NULL),
			 0);
}

START_TEST(pool_chain_from_callback)
{
	struct rf f;
	struct chain c = {0};
	rf_init(&f);
	c.pool = f.pool;
	c.addr = f.s.addr;
	ck_assert_int_eq(tw_pool_call(f.pool, f.s.addr, rq_echo_str("n0"), 0, chain_cb, &c, NULL),
			 0);
	ck_assert(tu_wait_flag(&f.h, &c.done, TU_WAIT_MS));
	ck_assert_int_eq(c.err, 0);
	ck_assert_int_eq(c.n, 5);
	ck_assert_uint_eq(tw_pool_open_comms(f.pool, f.s.addr), 1);
	assert_ndests(&f.h, f.pool, 1);
	rf_fini(&f);
}
END_TEST

/* Addresses that come and go: the pool keeps nothing for one with no
 * comms and no calls. NADDR refused addresses (127.0.0.i, one free port),
 * then NLISTEN addresses of one server (127.0.0.i) whose idle comms the
 * sweep closes. */
#define NADDR   200
#define NLISTEN 16

static int all_done(void *arg)
{
	struct rc *rc = arg;
	for (size_t i = 0; i < NADDR; i++)
		if (!rc[i].done)
			return 0;
	return 1;
}

START_TEST(pool_forgets_addresses)
{
	static struct rc rc[NADDR];
	static char uri[NADDR][64];
	char addr[128];
	unsigned port = ts_free_port();
	struct rf f;
	rf_init(&f);
	memset(rc, 0, sizeof(rc));
	for (size_t i = 0; i < NADDR; i++) {
		snprintf(uri[i], sizeof(uri[i]), "tcp://127.0.0.%zu:%u", i + 1, port);
		rc_start(f.pool, uri[i], rq_op("identity"), 0, &rc[i]);
	}
	ck_assert_uint_eq(tw__pool_ndests(f.pool), NADDR);
	ck_assert(tu_run_until(&f.h, all_done, rc, TU_WAIT_MS));
	for (size_t i = 0; i < NADDR; i++)
		ck_assert_msg(rc[i].err == TW_ECONNREFUSED, "%s: %s", uri[i],
			      tw_strerror(rc[i].err));
	assert_ndests(&f.h, f.pool, 0);

	/* One server on NLISTEN addresses: one idle comm each, then none. */
	for (size_t i = 1; i < NLISTEN; i++) {
		snprintf(addr, sizeof(addr), "tcp://127.0.0.%zu:0", i + 1);
		ck_assert_int_eq(tw_server_listen(f.s.srv, addr), 0);
	}
	for (size_t i = 0; i < NLISTEN; i++) {
		ck_assert_int_eq(tw_server_address(f.s.srv, i, addr, sizeof(addr)), 0);
		ck_assert_int_eq(rc_call(&f.h, f.pool, addr, rq_echo_str("x"), 0, &rc[0]), 0);
		rc_assert_str(&rc[0], "x");
		rc_clear(&rc[0]);
		ck_assert_uint_eq(tw_pool_open_comms(f.pool, addr), 1);
	}
	assert_ndests(&f.h, f.pool, NLISTEN);
	ck_assert_int_eq(tw_pool_set_idle(f.pool, 0, 60000), 0); /* the sweep, every second */
	assert_ndests(&f.h, f.pool, 0);
	for (size_t i = 0; i < NLISTEN; i++) {
		ck_assert_int_eq(tw_server_address(f.s.srv, i, addr, sizeof(addr)), 0);
		ck_assert_uint_eq(tw_pool_open_comms(f.pool, addr), 0);
	}
	/* and an address called again after that gets a new entry */
	ck_assert_int_eq(rc_call(&f.h, f.pool, f.s.addr, rq_echo_str("y"), 0, &rc[0]), 0);
	rc_assert_str(&rc[0], "y");
	rc_clear(&rc[0]);
	ck_assert_uint_eq(tw__pool_ndests(f.pool), 1);
	rf_fini(&f);
}
END_TEST

/* A callback that calls its address again when the call left the address
 * with nothing (its entry would be freed): the new call reuses the entry.
 * First result `first`, then `rest` for the calls made from callbacks. */
#define NAGAIN 4

struct again {
	tw_pool *pool;
	const char *uri;
	int errs[NAGAIN + 1];
	size_t ndests[NAGAIN + 1]; /* tw__pool_ndests inside each callback */
	int n, done;
};

static void again_cb(tw_call *call, int err, tw_decoded *reply, void *arg)
{
	struct again *a = arg;
	(void)call;
	tw_decoded_free(reply);
	a->ndests[a->n] = tw__pool_ndests(a->pool);
	a->errs[a->n++] = err;
	if (a->n == NAGAIN + 1) {
		a->done = 1;
		return;
	}
	ck_assert_int_eq(tw_pool_call(a->pool, a->uri, rq_echo_str("again"), 0, again_cb, a, NULL),
			 0);
}

static void call_again(struct tu *h, tw_pool *p, const char *uri, tw_msg *first_req,
		       uint32_t first_ms, int first, int rest, size_t ndests_after)
{
	struct again a;
	memset(&a, 0, sizeof(a));
	a.pool = p;
	a.uri = uri;
	ck_assert_int_eq(tw_pool_call(p, uri, first_req, first_ms, again_cb, &a, NULL), 0);
	ck_assert(tu_wait_flag(h, &a.done, TU_WAIT_MS));
	for (int i = 0; i <= NAGAIN; i++) {
		ck_assert_msg(a.errs[i] == (i == 0 ? first : rest), "%s, call %d: %s", uri, i,
			      tw_strerror(a.errs[i]));
		ck_assert_uint_eq(a.ndests[i], 1);
	}
	assert_ndests(h, p, ndests_after);
}

START_TEST(pool_call_again_from_callback)
{
	struct rf f;
	char refused[64];
	rf_init(&f);
	/* the connect fails on the loop (refused) or at once (no transport) */
	ru_refused_uri(refused, sizeof(refused));
	call_again(&f.h, f.pool, refused, rq_op("identity"), 0, TW_ECONNREFUSED, TW_ECONNREFUSED,
		   0);
	call_again(&f.h, f.pool, "nope://127.0.0.1:1", rq_op("identity"), 0, TW_ESCHEME, TW_ESCHEME,
		   0);
	/* a timeout aborts the only comm; the calls again get a new one */
	call_again(&f.h, f.pool, f.s.addr, rq_slow(1.0), 100, TW_ETIMEDOUT, 0, 1);
	ck_assert_uint_eq(tw_pool_open_comms(f.pool, f.s.addr), 1);
	rf_fini(&f);
}
END_TEST

/* Freeing the pool. */

#define NFREE 30

static void free_pool_all_canceled(struct tu *h, tw_pool *p, struct rc *rc, size_t n)
{
	tw_pool_free(p);
	rc_forbid = 1;
	for (size_t i = 0; i < n; i++) {
		ck_assert_msg(rc[i].done, "call %zu: no callback by tw_pool_free", i);
		ck_assert_int_eq(rc[i].err, TW_ECANCELED);
	}
	tu_run_for(h, 400); /* leftover connects and handshakes end: no callback */
	for (size_t i = 0; i < n; i++)
		ck_assert_int_eq(rc[i].late, 0);
	rc_forbid = 0;
}

/* Every call waits for a handshake from a black hole. */
START_TEST(pool_free_connecting)
{
	static struct rc rc[NFREE];
	struct tu h;
	struct bh b;
	tw_pool *p;
	p = black_hole_pool(&h, &b, 200);
	for (size_t i = 0; i < NFREE; i++)
		rc_start(p, b.addr, rq_op("identity"), 0, &rc[i]);
	ck_assert(tu_wait_count(&h, &b.n, NFREE, TU_WAIT_MS));
	ck_assert_uint_eq(tw_pool_open_comms(p, b.addr), NFREE);
	free_pool_all_canceled(&h, p, rc, NFREE);
	bh_stop(&b);
	tu_fini(&h);
}
END_TEST

/* Many calls, freed before the loop ran once: nothing connected yet. */
START_TEST(pool_free_at_once)
{
	static struct rc rc[NFREE];
	struct rf f;
	rf_init(&f);
	for (size_t i = 0; i < NFREE; i++)
		rc_start(f.pool, f.s.addr, rq_echo_str("x"), 0, &rc[i]);
	free_pool_all_canceled(&f.h, f.pool, rc, NFREE);
	f.pool = NULL;
	rf_fini(&f);
}
END_TEST

/* Calls in flight on four comms, the rest waiting, one more connecting
 * to another address. */
START_TEST(pool_free_in_flight)
{
	static struct rc rc[NFREE + 1];
	struct rf f;
	struct bh b;
	rf_init(&f);
	bh_start(&b, f.h.base, NULL, 0);
	ck_assert_int_eq(tw_pool_set_limit(f.pool, 4), 0);
	for (size_t i = 0; i < NFREE; i++)
		rc_start(f.pool, f.s.addr, rq_slow(0.3), 0, &rc[i]);
	rc_start(f.pool, b.addr, rq_op("identity"), 0, &rc[NFREE]);
	ck_assert(tu_wait_count(&f.h, &f.s.slow_now, 4, TU_WAIT_MS));
	ck_assert(tu_wait_count(&f.h, &b.n, 1, TU_WAIT_MS));
	free_pool_all_canceled(&f.h, f.pool, rc, NFREE + 1);
	f.pool = NULL;
	bh_stop(&b);
	rf_fini(&f);
}
END_TEST

/* Callbacks that tw_pool_free runs call the pool again: refused with
 * TW_ECLOSED (the caller keeps the request), and the pool's events are
 * still there while they run. */
struct recall {
	tw_pool *pool;
	const char *addr;
	int calls, refused;
};

static void recall_cb(tw_call *call, int err, tw_decoded *reply, void *arg)
{
	struct recall *r = arg;
	tw_msg *m = rq_echo_str("again");
	(void)call;
	ck_assert_int_eq(err, TW_ECANCELED);
	ck_assert_ptr_null(reply);
	r->calls++;
	r->refused += tw_pool_call(r->pool, r->addr, m, 100, recall_cb, r, NULL) == TW_ECLOSED;
	tw_msg_free(m);
}

START_TEST(pool_call_while_freeing)
{
	struct rf f;
	struct recall r;
	rf_init(&f);
	r.pool = f.pool;
	r.addr = f.s.addr;
	r.calls = r.refused = 0;
	/* deadlines armed (the pool's timer is live during the free), but
	 * far enough off that none comes before it, however slow the
	 * connect and handshake (100 ms timed out first under valgrind) */
	for (int i = 0; i < 3; i++)
		ck_assert_int_eq(tw_pool_call(f.pool, f.s.addr, rq_op("later"),
					      60000 * (uint32_t)(i + 1), recall_cb, &r, NULL),
				 0);
	ck_assert(tu_run_until(&f.h, rs_held_one, &f.s, TU_WAIT_MS));
	tw_pool_free(f.pool);
	f.pool = NULL;
	ck_assert_int_eq(r.calls, 3);
	ck_assert_int_eq(r.refused, 3);
	rf_fini(&f);
}
END_TEST

/* The pool, then the context, freed while handshakes are pending. */
START_TEST(pool_free_then_context)
{
	static struct rc rc[8];
	struct tu h;
	struct bh b;
	tw_pool *p;
	p = black_hole_pool(&h, &b, 0);
	for (size_t i = 0; i < 8; i++)
		rc_start(p, b.addr, rq_op("identity"), 0, &rc[i]);
	ck_assert(tu_wait_count(&h, &b.n, 8, TU_WAIT_MS));
	tw_pool_free(p);
	for (size_t i = 0; i < 8; i++)
		ck_assert_int_eq(rc[i].err, TW_ECANCELED);
	bh_stop(&b);
	tu_fini(&h); /* frees the pending handshakes (no loop ran since) */
}
END_TEST

/* Issue 17, finding 4: peers that accept and never answer, at every
 * stage before a comm is usable. The black hole accepts TCP and reads
 * nothing, so a tls connect waits in its TLS handshake, ws in its
 * upgrade, wss in its TLS handshake, tcp in the Dask handshake. */
static const char *const silent_schemes[] = {"tcp", "tls", "ws", "wss"};

/* b's address with the scheme replaced. */
static void silent_uri(const struct bh *b, const char *scheme, char *buf, size_t len)
{
	snprintf(buf, len, "%s%s", scheme, strstr(b->addr, "://"));
}

static void silent_ctx(struct tu *h, const char *scheme)
{
	if (strcmp(scheme, "tls") == 0 || strcmp(scheme, "wss") == 0)
		tt_use_tls(h->ctx, "ca.pem", "cert.pem", "key.pem");
	/* no clock of its own may end these stages while the test looks */
	ck_assert_int_eq(tw_context_set_handshake_timeout_ms(h->ctx, 600000), 0);
	ck_assert_int_eq(tw_context_set_tls_handshake_timeout_ms(h->ctx, 600000), 0);
}

struct fd_wait {
	int fd;
	short ev;
};

static int fd_ready(void *arg)
{
	struct fd_wait *w = arg;
	struct pollfd p = {w->fd, w->ev, 0};
	return poll(&p, 1, 0) == 1;
}

/* The connector's first bytes (TLS ClientHello, upgrade request) reached
 * the black hole: it is past TCP, in the stage that waits for the peer. */
static void wait_first_bytes(struct tu *h, struct bh *b, const char *scheme)
{
	struct fd_wait w;
	ck_assert(tu_wait_count(h, &b->n, 1, TU_WAIT_MS));
	w.fd = b->fds[0];
	w.ev = POLLIN;
	if (strcmp(scheme, "tcp") != 0) /* tcp: the connector reads first */
		ck_assert(tu_run_until(h, fd_ready, &w, TU_WAIT_MS));
}

/* The black hole's end of the comm sees EOF (or a reset) now, with no
 * loop running: whatever freed the comm closed its socket at once. */
static void assert_closed_now(int fd)
{
	char buf[4096];
	ssize_t n;
	struct pollfd p = {fd, POLLIN, 0};
	for (;;) {
		ck_assert_msg(poll(&p, 1, 10000) == 1, "the socket is still open");
		n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
		if (n == 0 || (n < 0 && errno == ECONNRESET))
			return;
		ck_assert_msg(n > 0, "recv: %s", strerror(errno));
	}
}

/* tw_pool_free aborts its comms in every stage at once (issue 17: those in
 * their TLS handshake or ws upgrade stayed open until its 10 s clock). */
START_TEST(pool_free_aborts_every_stage)
{
	const char *scheme = silent_schemes[_i];
	static struct rc rc;
	struct tu h;
	struct bh b;
	tw_pool *p;
	char uri[96];
	tu_init(&h);
	silent_ctx(&h, scheme);
	bh_start(&b, h.base, NULL, 0);
	silent_uri(&b, scheme, uri, sizeof(uri));
	ck_assert_int_eq(tw_pool_new(h.ctx, &p), 0);
	memset(&rc, 0, sizeof(rc));
	rc_start(p, uri, rq_op("identity"), 0, &rc);
	wait_first_bytes(&h, &b, scheme);
	tw_pool_free(p);
	ck_assert_int_eq(rc.err, TW_ECANCELED);
	assert_closed_now(b.fds[0]);
	bh_stop(&b);
	tu_fini(&h);
}
END_TEST

static void never_hs(tw_comm *c, int err, const tw_handshake_info *info, void *arg)
{
	(void)c;
	(void)err;
	(void)info;
	(void)arg;
	ck_abort_msg("handshake callback after tw_context_free");
}

/* tcp connects at once: its comm then waits in the Dask handshake. */
static void connected_cb(tw_comm *c, int err, void *arg)
{
	int *n = arg;
	ck_assert_int_eq(err, 0);
	ck_assert_int_eq(tw_comm_handshake(c, TW_HANDSHAKE_CONNECTOR, never_hs, NULL), 0);
	++*n;
}

/* tw_context_free does the same for connects in every stage. */
START_TEST(context_free_aborts_every_stage)
{
	const char *scheme = silent_schemes[_i];
	struct tu h;
	struct bh b;
	char uri[96];
	int fd, connected = 0;
	tu_init(&h);
	silent_ctx(&h, scheme);
	bh_start(&b, h.base, NULL, 0);
	silent_uri(&b, scheme, uri, sizeof(uri));
	ck_assert_int_eq(tw_comm_connect(h.ctx, uri, connected_cb, &connected), 0);
	wait_first_bytes(&h, &b, scheme);
	if (strcmp(scheme, "tcp") == 0)
		ck_assert(tu_wait_flag(&h, &connected, TU_WAIT_MS));
	else
		ck_assert_int_eq(connected, 0);
	event_free(b.ev); /* on the base tu_fini frees */
	b.ev = NULL;
	fd = b.fds[0];
	tw_context_free(h.ctx);
	h.ctx = NULL;
	assert_closed_now(fd);
	bh_stop(&b);
	tu_fini(&h);
}
END_TEST

/* The connect timeout covers everything until a comm is usable: TCP, the
 * TLS handshake and the ws upgrade (issue 17: with a 1 s connect timeout,
 * tls, ws and wss connects to a silent peer failed after 10 s, and ws said
 * "refused by the server"). The stages' own clocks are 600 s here, so
 * without the fix this waits for the hang guard. */
START_TEST(connect_timeout_covers_upgrade)
{
	const char *scheme = silent_schemes[_i + 1]; /* tls, ws, wss */
	struct tu_connect_result r = {NULL, 0, 0, ""};
	struct tu h;
	struct bh b;
	char uri[96];
	tu_init(&h);
	silent_ctx(&h, scheme);
	ck_assert_int_eq(tw_context_set_connect_timeout_ms(h.ctx, 300), 0);
	bh_start(&b, h.base, NULL, 0);
	silent_uri(&b, scheme, uri, sizeof(uri));
	r.ctx = h.ctx;
	ck_assert_int_eq(tw_comm_connect(h.ctx, uri, tu_connect_result_cb, &r), 0);
	ck_assert_msg(tu_wait_flag(&h, &r.done, TU_WAIT_MS), "%s: no result", scheme);
	ck_assert_int_eq(r.err, TW_ETIMEDOUT);
	ck_assert_msg(strstr(r.why, "timed out") != NULL && strstr(r.why, "300 ms") != NULL,
		      "%s: %s", scheme, r.why);
	ck_assert_msg(strstr(r.why, "refused") == NULL, "%s: %s", scheme, r.why);
	bh_stop(&b);
	tu_fini(&h);
}
END_TEST

/* The connect timeout ends a handshake that came in part: the text says
 * how much came (tcp; a peer that sends half its handshake, then
 * nothing). Run again with the timeout doubled while the machine was too
 * slow for the greeting to arrive first. */
START_TEST(connect_timeout_partial_handshake)
{
	static struct rc rc;
	struct tu h;
	struct bh b;
	tw_pool *p;
	size_t len;
	uint8_t *full = encoded(ts_handshake_info, sizeof(ts_handshake_info), &len);
	char want[160];
	uint32_t ms = 300;
	tu_init(&h);
	ck_assert_int_eq(
		tw_context_set_handshake_timeout_ms(h.ctx, TW_DEFAULT_HANDSHAKE_TIMEOUT_MS), 0);
	bh_start(&b, h.base, full, len / 2);
	ck_assert_int_eq(tw_pool_new(h.ctx, &p), 0);
	for (;;) {
		ck_assert_int_eq(tw_context_set_connect_timeout_ms(h.ctx, ms), 0);
		memset(&rc, 0, sizeof(rc));
		rc_call(&h, p, b.addr, rq_op("identity"), 0, &rc);
		if (strstr(rc.why, "bytes from the peer") != NULL || ms >= (uint32_t)TU_WAIT_MS / 2)
			break;
		ms *= 2;
	}
	ck_assert_msg(rc.err == TW_ETIMEDOUT, "%s: %s", tw_strerror(rc.err), rc.why);
	snprintf(want, sizeof(want),
		 "handshake timed out: %zu bytes from the peer within %u ms, not a whole handshake "
		 "(the connect timeout)",
		 len / 2, (unsigned)ms);
	rc_assert_why(&rc, want);
	tw_pool_free(p);
	bh_stop(&b);
	free(full);
	tu_fini(&h);
}
END_TEST

/* A peer past the transport stage that never sends the Dask handshake:
 * over tcp the black hole (a raw listener); over tls, ws and wss a
 * listener of this context (the TLS handshake done with the certificates
 * made for this run, the ws upgrade answered with 101) whose accept
 * callback keeps the comm and never writes on it. */
#define MUTE_MAX 64
struct mute {
	tw_listener *l;
	tw_comm *comms[MUTE_MAX];
	size_t n;
	char addr[128];
};

static void mute_accept(tw_listener *l, tw_comm *c, void *arg)
{
	struct mute *m = arg;
	(void)l;
	ck_assert_uint_lt(m->n, MUTE_MAX);
	m->comms[m->n++] = c;
}

static void mute_start(struct tu *h, struct mute *m, const char *scheme)
{
	char uri[64];
	memset(m, 0, sizeof(*m));
	snprintf(uri, sizeof(uri), "%s://127.0.0.1:0", scheme);
	ck_assert_int_eq(tu_tw_listen(h->ctx, uri, mute_accept, m, &m->l), 0);
	ck_assert_int_eq(tw_listener_address(m->l, m->addr, sizeof(m->addr)), 0);
}

static void mute_stop(struct mute *m)
{
	for (size_t i = 0; i < m->n; i++)
		tw_comm_free(m->comms[i]);
	tw_listener_free(m->l);
	memset(m, 0, sizeof(*m));
}

struct hs_result {
	int done, err, reached; /* reached: the connect succeeded, the handshake ran */
	char why[256];
};

static void hs_result_cb(tw_comm *c, int err, const tw_handshake_info *info, void *arg)
{
	struct hs_result *r = arg;
	(void)info;
	r->err = err;
	r->reached = c != NULL;
	snprintf(r->why, sizeof(r->why), "%s", c != NULL ? tw_comm_last_error(c) : "");
	r->done = 1;
	tw_comm_free(c);
}

/* The connect timeout covers the Dask handshake too, as Dask's connect()
 * bounds it by the connect timeout's time left (distributed/comm/core.py,
 * "Timed out during handshake while connecting to ..."): with a 300 ms
 * connect timeout and the handshake's own clock at its default (10 s), a
 * peer that completes the transport stage and never sends its handshake
 * ends a pool call, and a tw_comm_connect + tw_comm_handshake, with
 * TW_ETIMEDOUT and a text that names the connect timeout (issue 17: the
 * pool call failed after the handshake's own 10 s with TW_EHANDSHAKE, "not
 * a byte from the peer within 10000 ms"). The text tells which stage the
 * clock ended: when the machine was too slow for the transport stage to
 * finish within the connect timeout (its text names the TLS handshake or
 * the ws upgrade), the case runs again with the timeout doubled, up to
 * half the harness's wait (a TLS handshake under valgrind on a loaded
 * machine has taken over 10 s). No time is measured. */
START_TEST(connect_timeout_covers_dask_handshake)
{
	const char *scheme = silent_schemes[_i];
	static struct rc rc;
	struct hs_result r;
	struct tu h;
	struct bh b;
	struct mute m;
	tw_pool *p;
	char uri[128], want[96];
	uint32_t ms = 300;
	int tcp = strcmp(scheme, "tcp") == 0;
	tu_init(&h);
	if (strcmp(scheme, "tls") == 0 || strcmp(scheme, "wss") == 0)
		tt_use_tls(h.ctx, "ca.pem", "cert.pem", "key.pem");
	ck_assert_int_eq(
		tw_context_set_handshake_timeout_ms(h.ctx, TW_DEFAULT_HANDSHAKE_TIMEOUT_MS), 0);
	if (tcp) {
		bh_start(&b, h.base, NULL, 0);
		snprintf(uri, sizeof(uri), "%s", b.addr);
	} else {
		mute_start(&h, &m, scheme);
		snprintf(uri, sizeof(uri), "%s", m.addr);
	}
	ck_assert_int_eq(tw_pool_new(h.ctx, &p), 0);
	for (;;) {
		ck_assert_int_eq(tw_context_set_connect_timeout_ms(h.ctx, ms), 0);
		memset(&rc, 0, sizeof(rc));
		rc_call(&h, p, uri, rq_op("identity"), 0, &rc);
		if (strstr(rc.why, "Dask handshake") != NULL || ms >= (uint32_t)TU_WAIT_MS / 2)
			break;
		ms *= 2; /* still in the TLS handshake or the ws upgrade */
	}
	ck_assert_ptr_null(rc.reply);
	ck_assert_msg(rc.err == TW_ETIMEDOUT, "%s: %s: %s", scheme, tw_strerror(rc.err), rc.why);
	snprintf(want, sizeof(want), "within %u ms (the connect timeout", (unsigned)ms);
	rc_assert_why(&rc, "Dask handshake");
	rc_assert_why(&rc, "timed out: no answer from the peer");
	rc_assert_why(&rc, want);
	rc_assert_why(&rc, uri);
	tw_pool_free(p);
	/* the same for an application's own tw_comm_connect + tw_comm_handshake */
	for (;;) {
		ck_assert_int_eq(tw_context_set_connect_timeout_ms(h.ctx, ms), 0);
		memset(&r, 0, sizeof(r));
		ck_assert_int_eq(tu_connect_handshake(h.ctx, uri, hs_result_cb, &r), 0);
		ck_assert(tu_wait_flag(&h, &r.done, TU_WAIT_MS));
		if (r.reached || ms >= (uint32_t)TU_WAIT_MS / 2)
			break;
		ms *= 2;
	}
	ck_assert_msg(r.reached, "%s: the connect never finished", scheme);
	ck_assert_msg(r.err == TW_ETIMEDOUT, "%s: %s: %s", scheme, tw_strerror(r.err), r.why);
	snprintf(want, sizeof(want), "handshake timed out: no answer from the peer within %u ms",
		 (unsigned)ms);
	ck_assert_msg(strstr(r.why, want) != NULL && strstr(r.why, "(the connect timeout") != NULL,
		      "%s: %s", scheme, r.why);
	if (tcp)
		bh_stop(&b);
	else
		mute_stop(&m);
	tu_fini(&h);
}
END_TEST

/* The client's TLS step that completes the handshake lasts more than
 * late_ms: the info callback of the client's SSL_CTX sleeps in it (in
 * SSL_do_handshake), as a slow machine's step would run on. Once. */
static uint32_t late_ms;
static int late_slept;

static void late_step(const SSL *ssl, int where, int ret)
{
	uint64_t until = tw__mono_ms() + late_ms + 1;
	(void)ssl;
	(void)ret;
	if (!(where & SSL_CB_HANDSHAKE_DONE) || late_ms == 0)
		return;
	while (tw__mono_ms() <= until)
		usleep(1000);
	late_ms = 0;
	late_slept = 1;
}

struct late_conn {
	tw_context *ctx;
	int handshake;         /* start the Dask handshake on the comm */
	int armed;             /* its clock is pending, at expiry */
	struct timeval expiry; /* (wall clock, as event_pending gives it) */
	int done, err;
	uint32_t left_ms; /* tw__comm_connect_left_ms of the comm handed out */
	uint64_t seen_ms; /* tw__mono_ms in the callback */
	char why[256];
};

static void no_hs_cb(tw_comm *c, int err, const tw_handshake_info *info, void *arg)
{
	(void)c;
	(void)err;
	(void)info;
	(void)arg;
	ck_abort_msg("handshake callback of a freed comm");
}

static void late_conn_cb(tw_comm *c, int err, void *arg)
{
	struct late_conn *r = arg;
	r->seen_ms = tw__mono_ms();
	r->err = err;
	r->left_ms = c != NULL ? tw__comm_connect_left_ms(c) : 0;
	if (c != NULL && r->handshake) {
		ck_assert_int_eq(tw_comm_handshake(c, TW_HANDSHAKE_CONNECTOR, no_hs_cb, NULL), 0);
		r->armed = event_pending(c->timeout_ev, EV_TIMEOUT, &r->expiry);
	}
	snprintf(r->why, sizeof(r->why), "%s", err != 0 ? tw_context_last_error(r->ctx) : "");
	r->done = 1;
	tw_comm_free(c);
}

/* One connect to uri with connect timeout ms whose TLS handshake's last
 * step lasts more than step_ms; *t0 is tw__mono_ms before
 * tw_comm_connect. 0 when that step never ran (the machine was slower
 * than ms: the TLS stage's clock ended the connect first). */
static int late_connect(struct tu *h, const char *uri, uint32_t ms, uint32_t step_ms,
			struct late_conn *r, uint64_t *t0)
{
	int handshake = r->handshake;
	memset(r, 0, sizeof(*r));
	r->ctx = h->ctx;
	r->handshake = handshake;
	late_slept = 0;
	late_ms = step_ms;
	ck_assert_int_eq(tw_context_set_connect_timeout_ms(h->ctx, ms), 0);
	*t0 = tw__mono_ms();
	ck_assert_int_eq(tw_comm_connect(h->ctx, uri, late_conn_cb, r), 0);
	ck_assert(tu_wait_flag(h, &r->done, TU_WAIT_MS));
	late_ms = 0;
	return late_slept;
}

/* A client's TLS stage ended by the connect timeout of ms. */
static void tls_timed_out(char *buf, size_t len, uint32_t ms)
{
	snprintf(buf, len,
		 "TLS handshake with the server failed: timed out: no handshake within %u ms (the "
		 "connect timeout)",
		 (unsigned)ms);
}

/* One clock for the whole connect (breaker18 b18-7: a 5-10 ms connect
 * timeout to a tls peer that completes TLS and stays silent ended after
 * 18-21 ms). The stage after TLS (the ws upgrade, the Dask handshake) has
 * what the connect's deadline leaves, the TLS stage's time deducted: a
 * TLS step made to end 300 ms in leaves at most the timeout - 300 ms, and
 * at least what the deadline leaves when the callback runs. A TLS step
 * that ends after the deadline (the client's last: the certificate
 * checked, the keys made, 2.5 ms of CPU and 4.5-9 ms at a load of 8)
 * ends the connect there, with TW_ETIMEDOUT from the TLS stage: the comm
 * was handed on with 1 ms, and the connect ended 1 ms and a timer's
 * wake-up later (over tw_comm_connect it even succeeded, after its
 * deadline). A pool call then fails naming the TLS handshake, not the
 * Dask one. tls and wss (tcp and ws have no TLS step). The steps are
 * made late by sleeping in them, to an order, not a time: nothing
 * asserts how long anything took. */
START_TEST(connect_deadline_spans_tls_step)
{
	const char *scheme = _i == 0 ? "tls" : "wss";
	static struct rc rc;
	struct late_conn r;
	struct tu h;
	struct mute m;
	tw_pool *p;
	uint64_t t0;
	int64_t e_ms;
	struct timeval w0, w1;
	uint32_t ms = 60000, slow = 300;
	char want[128];
	tu_init(&h);
	silent_ctx(&h, scheme);
	SSL_CTX_set_info_callback(tw__tls_config_of(h.ctx)->client, late_step);
	mute_start(&h, &m, scheme);
	/* a step of over 300 ms, within the timeout; the Dask handshake's
	 * clock runs out at the connect's deadline (between the wall clock
	 * before and after tw_comm_connect, plus the timeout; 5 ms for the
	 * roundings to the ms), not 300 ms before it (libevent times from
	 * the pass's start, before the step) */
	memset(&r, 0, sizeof(r));
	r.handshake = 1;
	gettimeofday(&w0, NULL);
	ck_assert(late_connect(&h, m.addr, ms, slow, &r, &t0));
	gettimeofday(&w1, NULL);
	ck_assert(r.armed);
	e_ms = (int64_t)r.expiry.tv_sec * 1000 + r.expiry.tv_usec / 1000;
	ck_assert_msg(e_ms + 5 >= (int64_t)w0.tv_sec * 1000 + w0.tv_usec / 1000 + ms,
		      "%s: the handshake's clock ends %lld ms before the deadline", scheme,
		      (long long)((int64_t)w0.tv_sec * 1000 + w0.tv_usec / 1000 + ms - e_ms));
	ck_assert_msg(e_ms <= (int64_t)w1.tv_sec * 1000 + w1.tv_usec / 1000 + ms + 5,
		      "%s: the handshake's clock ends after the deadline", scheme);
	r.handshake = 0;
	ck_assert_msg(r.err == 0, "%s: %s: %s", scheme, tw_strerror(r.err), r.why);
	ck_assert_msg(r.left_ms + slow <= ms, "%s: %u ms left after a %u ms step", scheme,
		      (unsigned)r.left_ms, (unsigned)slow);
	ck_assert_msg(r.left_ms + r.seen_ms >= t0 + ms, "%s: %u ms left, %llu ms in", scheme,
		      (unsigned)r.left_ms, (unsigned long long)(r.seen_ms - t0));
	/* a step longer than the timeout: it ends after the deadline */
	for (ms = 200;; ms *= 2) {
		if (late_connect(&h, m.addr, ms, ms, &r, &t0) || ms >= (uint32_t)TU_WAIT_MS / 4)
			break;
	}
	ck_assert_msg(r.err == TW_ETIMEDOUT, "%s: %s (%s)", scheme, tw_strerror(r.err), r.why);
	tls_timed_out(want, sizeof(want), ms);
	ck_assert_msg(strstr(r.why, want) != NULL, "%s: %s", scheme, r.why);
	/* the same through a pool: the call ends in the TLS stage */
	ck_assert_int_eq(tw_pool_new(h.ctx, &p), 0);
	for (ms = 200;; ms *= 2) {
		ck_assert_int_eq(tw_context_set_connect_timeout_ms(h.ctx, ms), 0);
		memset(&rc, 0, sizeof(rc));
		late_slept = 0;
		late_ms = ms;
		rc_call(&h, p, m.addr, rq_op("identity"), 0, &rc);
		late_ms = 0;
		if (late_slept || ms >= (uint32_t)TU_WAIT_MS / 4)
			break;
	}
	ck_assert_msg(rc.err == TW_ETIMEDOUT, "%s: %s: %s", scheme, tw_strerror(rc.err), rc.why);
	tls_timed_out(want, sizeof(want), ms);
	rc_assert_why(&rc, want);
	tw_pool_free(p);
	mute_stop(&m);
	tu_fini(&h);
}
END_TEST

/* This process's sockets whose peer is 127.0.0.1:port (the connectors'
 * ends of comms to a listener on port). */
static size_t fds_to_port(unsigned port)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;
	size_t n = 0;
	ck_assert_ptr_nonnull(d);
	while ((e = readdir(d)) != NULL) {
		struct sockaddr_in sa;
		socklen_t len = sizeof(sa);
		int fd = atoi(e->d_name);
		if (e->d_name[0] == '.' || fd == dirfd(d))
			continue;
		if (getpeername(fd, (struct sockaddr *)&sa, &len) == 0 &&
		    sa.sin_family == AF_INET && ntohs(sa.sin_port) == port)
			n++;
	}
	closedir(d);
	return n;
}

struct port_wait {
	unsigned port;
	size_t n;
};

static int port_fds_at_most(void *arg)
{
	struct port_wait *w = arg;
	return fds_to_port(w->port) <= w->n;
}

/* tw_pool_free with many comms in their Dask handshake (breaker18 b18-6:
 * 50 wss calls to a silent peer; rpc.h said their comms closed before it
 * returned, and 10-39 of 50 were still open then). Every call is
 * canceled before it returns and no callback runs after; their sockets
 * close at once while the pass has time for it and the rest on the
 * loop's next passes (core/reap.h: a mass close is spread over passes,
 * as rpc.h now says), with the loop running and nothing else to end
 * them (the listener's side stays open, mute). How many were still open
 * when it returned is printed, not asserted: it depends on the pass's
 * time. All four transports. */
/* tw_pool_free from a callback of the loop, as an application calls it
 * (outside one, every release is a pass's first: done at once). */
struct free_in_loop {
	tw_pool *p;
	unsigned port;
	size_t open_after; /* connectors' sockets open when it returned */
	int done;
};

static void free_pool_cb(evutil_socket_t fd, short what, void *arg)
{
	struct free_in_loop *f = arg;
	(void)fd;
	(void)what;
	tw_pool_free(f->p);
	f->open_after = fds_to_port(f->port);
	f->done = 1;
}

START_TEST(pool_free_many_in_handshake)
{
	enum { MOST = 50 };
	/* 16 in valgrind's quick runs: 400 TLS handshakes cost minutes there */
	const size_t N = ts_quick() ? 16 : MOST;
	const char *scheme = silent_schemes[_i];
	static struct rc rc[MOST];
	struct port_wait w = {0, 0};
	struct free_in_loop f;
	struct tu h;
	struct mute m;
	tu_init(&h);
	silent_ctx(&h, scheme);
	mute_start(&h, &m, scheme);
	w.port = (unsigned)atoi(strrchr(m.addr, ':') + 1);
	/* second round: every pass's time spent, as on a loaded machine */
	for (int spent = 0; spent <= 1; spent++) {
		memset(&f, 0, sizeof(f));
		f.port = w.port;
		ck_assert_int_eq(tw_pool_new(h.ctx, &f.p), 0);
		ck_assert_int_eq(tw_pool_set_limit(f.p, N), 0);
		memset(rc, 0, sizeof(rc));
		for (size_t i = 0; i < N; i++)
			rc_start(f.p, m.addr, rq_op("identity"), 0, &rc[i]);
		/* every connect past its transport stage: the listener has its comm */
		ck_assert(tu_wait_count(&h, &m.n, N, TU_WAIT_MS));
		ck_assert_uint_eq(fds_to_port(w.port), N);
		tw__pass_spend(spent);
		ck_assert_int_eq(event_base_once(h.base, -1, EV_TIMEOUT, free_pool_cb, &f, NULL),
				 0);
		ck_assert(tu_wait_flag(&h, &f.done, TU_WAIT_MS));
		rc_forbid = 1;
		for (size_t i = 0; i < N; i++)
			ck_assert_msg(rc[i].done && rc[i].err == TW_ECANCELED, "%s: call %zu: %s",
				      scheme, i, tw_strerror(rc[i].err));
		ck_assert_msg(tu_run_until(&h, port_fds_at_most, &w, TU_WAIT_MS),
			      "%s: %zu of %zu comms still open", scheme, fds_to_port(w.port), N);
		rc_forbid = 0;
		for (size_t i = 0; i < N; i++)
			ck_assert(!rc[i].late);
		tw__pass_spend(0);
		printf("pool_free_many_in_handshake %s%s: %zu of %zu open when tw_pool_free "
		       "returned\n",
		       scheme, spent ? " (passes spent)" : "", f.open_after, N);
		for (size_t i = 0; i < m.n; i++)
			tw_comm_free(m.comms[i]);
		m.n = 0;
	}
	mute_stop(&m);
	tu_fini(&h);
}
END_TEST

TCase *rpc_pool_tcase(void)
{
	TCase *tc =
		ts_tcase("pool", 60,
			 TS_TESTS(pool_limit_and_idle, pool_cancel, pool_fail_address, pool_retry,
				  pool_cancel_waiting_order, pool_chain_from_callback,
				  pool_forgets_addresses, pool_call_again_from_callback,
				  pool_free_connecting, pool_free_at_once, pool_free_in_flight,
				  pool_call_while_freeing, pool_free_then_context));
	ts_add_loop(tc, 4, TS_TESTS(pool_free_aborts_every_stage, context_free_aborts_every_stage));
	ts_add_loop(tc, 3, TS_TESTS(connect_timeout_covers_upgrade));
	ts_add_loop(tc, 4, TS_TESTS(connect_timeout_covers_dask_handshake));
	ts_add_loop(tc, 2, TS_TESTS(connect_deadline_spans_tls_step));
	ts_add_loop(tc, 4, TS_TESTS(pool_free_many_in_handshake));
	ts_add(tc, TS_TESTS(connect_timeout_partial_handshake));
	ts_add(tc,
	       TS_TESTS(pool_deadlines, pool_adds_no_loop_timeout, pool_call_after_closing_reply));
	return tc;
}
