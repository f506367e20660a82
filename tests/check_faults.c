/* SPDX-License-Identifier: BSD-3-Clause */
/* Faults between a client and a server (issue 17): the fault proxy
 * (tests/support/fault_proxy.h) between taskwire clients (tw_pool calls, stream
 * comms, plain comms) and taskwire servers (tw_server, an echo
 * listener), over tcp, tls, ws and wss. For each fault the test asserts
 * the error code the call or comm ends with, that it ends by its own
 * deadline (every other clock of the library is set far out, and the
 * wait's guard, WAIT_MS, is shorter than those), that other comms of the
 * same server keep working while the faulty connection hangs, and that
 * nothing is left behind: once the proxy lets go, the process has the
 * descriptors and live blocks it had before the call (valgrind and ASan
 * runs of the suite check the rest). Deadlines are short and payloads
 * small (1 MiB) so the suite stays quick; no assertion is on time. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <check.h>
#include <msgpack.h>

#include "tests/support/fault_proxy.h"
#include "tests/support/rpc.h"
#include "tests/support/harness.h"
#include "tests/support/tls.h"
#include "tests/support/tran.h"
#include "tests/support/suite.h"

#define MiB ((size_t)1 << 20)
#define KiB ((size_t)1 << 10)
/* Clocks that no test case may run into: the one under test is short. */
#define FAR_MS 600000
/* How long a deadline of a few hundred ms may take, on a loaded machine,
 * before the test says it did not hold (valgrind, TW_TEST_QUICK=1: 120 s). */
#define WAIT_MS (ts_quick() ? 120000 : 20000)
/* The proxy lets this much through before its fault: past any handshake
 * (tls certificates, the ws upgrade), inside a 1 MiB message. */
#define AFTER (256 * KiB)

enum { TCP = TS_TCP, TLS = TS_TLS, WS = TS_WS, WSS = TS_WSS };

static long long now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Drive the loop until pred(arg) or ms pass, progress or not (the
 * harness's waits restart on progress: a throttled transfer would keep
 * them going past a deadline that failed to hold). */
static int run_until_abs(struct tu *h, int (*pred)(void *), void *arg, int ms)
{
	long long end = now_ms() + ms;
	while (!pred(arg)) {
		if (now_ms() > end)
			return 0;
		tu_run_for(h, 10);
	}
	return 1;
}

static int rc_is_done(void *arg)
{
	return ((struct rc *)arg)->done;
}

/* The fixture: a tw_server (tests/support/rpc.h ops) on transport t, a pool,
 * the proxy in front of the server. */
struct ff {
	struct tu h;
	struct rs s;
	tw_pool *pool;
	struct fp px;
	int t;
	char via[128]; /* the proxy's URI, with t's scheme */
	int fds;       /* descriptors open before the proxy started */
	int pool_fds;  /* of those, the pool's own (its timers' timerfds) */
	uint64_t blocks;
};

static void far_clocks(tw_context *ctx)
{
	ck_assert_int_eq(tw_context_set_connect_timeout_ms(ctx, FAR_MS), 0);
	ck_assert_int_eq(tw_context_set_handshake_timeout_ms(ctx, FAR_MS), 0);
	ck_assert_int_eq(tw_context_set_tls_handshake_timeout_ms(ctx, FAR_MS), 0);
	ck_assert_int_eq(tw_context_set_tcp_timeout_ms(ctx, 0), 0);
	ck_assert_int_eq(tw_context_set_min_receive_rate(ctx, 0, 0), 0);
}

static void ff_init(struct ff *f, int t, const struct fp_opts *o)
{
	char uri[64];
	memset(f, 0, sizeof(*f));
	f->t = t;
	ts_tran_init(&f->h, t);
	far_clocks(f->h.ctx);
	snprintf(uri, sizeof(uri), "%s://127.0.0.1:0", ts_tran_scheme(t));
	rs_start(&f->s, f->h.ctx, f->h.base, uri);
	f->pool_fds = tt_fd_count();
	ck_assert_int_eq(tw_pool_new(f->h.ctx, &f->pool), 0);
	f->fds = tt_fd_count();
	f->pool_fds = f->fds - f->pool_fds;
	f->blocks = ts_blocks_live();
	fp_start(&f->px, f->h.base, f->s.addr, o);
	fp_uri(&f->px, ts_tran_scheme(t), f->via, sizeof(f->via));
}

/* A call straight to the server, on a pool of its own: the server keeps
 * serving while a faulty connection hangs. */
static void canary(struct ff *f)
{
	tw_pool *p;
	struct rc rc;
	ck_assert_int_eq(tw_pool_new(f->h.ctx, &p), 0);
	rc_start(p, f->s.addr, rq_echo_str("canary"), WAIT_MS, &rc);
	ck_assert_msg(run_until_abs(&f->h, rc_is_done, &rc, WAIT_MS + 1000), "%s: canary hung",
		      ts_tran_scheme(f->t));
	rc_assert_str(&rc, "canary");
	rc_clear(&rc);
	tw_pool_free(p);
}

struct fd_wait {
	int fds;
	uint64_t blocks;
};

static int back_to(void *arg)
{
	const struct fd_wait *w = arg;
	return tt_fd_count() == w->fds && ts_blocks_live() == w->blocks;
}

/* The proxy px lets go of every connection; then the comms on both
 * sides must be gone: the descriptors (fds) and blocks of before the
 * proxy (transport t). */
static void nothing_left(struct tu *h, struct fp *px, int t, int fds, uint64_t blocks)
{
	struct fd_wait w = {fds, blocks};
	fp_stop(px);
	ck_assert_msg(run_until_abs(h, back_to, &w, WAIT_MS),
		      "%s: %d descriptors open (%d before), %llu blocks live (%llu before)",
		      ts_tran_scheme(t), tt_fd_count(), fds, (unsigned long long)ts_blocks_live(),
		      (unsigned long long)blocks);
}

static void assert_nothing_left(struct ff *f)
{
	nothing_left(&f->h, &f->px, f->t, f->fds, f->blocks);
}

static void ff_fini(struct ff *f)
{
	fp_stop(&f->px);
	tw_pool_free(f->pool);
	rs_stop(&f->s);
	tu_fini(&f->h);
}

/* The end of a failed call's case: the server still serves (canary),
 * nothing is left once the proxy lets go, the fixture is freed. */
static void ff_end(struct ff *f)
{
	canary(f);
	assert_nothing_left(f);
	ff_fini(f);
}

static void assert_echo(const struct rc *rc, size_t n, unsigned seed)
{
	const uint8_t *p;
	size_t len;
	ck_assert_msg(rc->done && rc->err == 0, "call: %s: %s", tw_strerror(rc->err), rc->why);
	ck_assert_int_eq(ru_bytes(rc->reply, tw_decoded_root(rc->reply), &p, &len), 0);
	ck_assert_uint_eq(len, n);
	ck_assert_int_eq(ts_check(p, n, seed), -1);
}

/* A deadline of ms, twenty times longer under valgrind (TW_TEST_QUICK=1),
 * where moving a 1 MiB request through the server takes seconds. */
static uint32_t dl(uint32_t ms)
{
	return ts_quick() ? 20 * ms : ms;
}

/* The stall came before the deadline. Under valgrind on a loaded machine,
 * a 1 MiB request may take longer than even the scaled deadline to come
 * through the server, so there only "at most once" is asserted (the
 * ASan run of make check keeps the exact count). */
static void assert_stalled(const struct ff *f)
{
	if (ts_quick())
		ck_assert_uint_le(f->px.faults, 1);
	else
		ck_assert_uint_eq(f->px.faults, 1);
}

/* A small call through the proxy first, so the pool holds a comm past
 * its handshakes: the deadline of the next call then covers its bytes
 * only, and the proxy's fault moves to `after` bytes into them (the
 * proxy counts from the connection's first byte). */
static void warm(struct ff *f, uint64_t after)
{
	struct rc rc;
	int d = f->px.o.dir == FP_UP ? 0 : 1;
	ck_assert_int_eq(rc_call(&f->h, f->pool, f->via, rq_echo_str("warm"), WAIT_MS, &rc), 0);
	rc_assert_str(&rc, "warm");
	rc_clear(&rc);
	ck_assert_uint_eq(tw_pool_open_comms(f->pool, f->via), 1);
	ck_assert_uint_eq(f->px.faults, 0);
	f->px.o.after = f->px.moved[d] + after;
}

/* One pool call through the proxy with deadline ms: it must end by then
 * with want (or `also`, when not 0); the pool keeps no comm to the proxy afterwards (a comm still
 * connecting may stay, for the calls to come, until its own clocks or
 * tw_pool_free end it: pass connecting). */
static void call_fails_in(struct ff *f, tw_msg *req, uint32_t ms, int want, int also,
			  const char *what, int connecting)
{
	struct rc rc;
	rc_start(f->pool, f->via, req, ms, &rc);
	ck_assert_msg(run_until_abs(&f->h, rc_is_done, &rc, WAIT_MS),
		      "%s over %s: the call outlived its %u ms deadline", what,
		      ts_tran_scheme(f->t), ms);
	ck_assert_msg(rc.err == want || (also != 0 && rc.err == also),
		      "%s over %s: %s (%s), wanted %s", what, ts_tran_scheme(f->t),
		      tw_strerror(rc.err), rc.why, tw_strerror(want));
	rc_assert_why(&rc, f->via);
	rc_clear(&rc);
	if (!connecting)
		ck_assert_uint_eq(tw_pool_open_comms(f->pool, f->via), 0);
}

static void call_fails(struct ff *f, tw_msg *req, uint32_t ms, int want, const char *what)
{
	call_fails_in(f, req, ms, want, 0, what, 0);
}

/* tw_pool calls. */

/* Accepted, never answered: the call's deadline ends it, in whatever
 * stage the connect is (tcp: the Dask handshake; tls: the TLS handshake;
 * ws: the upgrade; wss: the TLS handshake). */
START_TEST(pool_black_hole)
{
	struct fp_opts o = {.fault = FP_BLACK_HOLE};
	struct ff f;
	ff_init(&f, _i, &o);
	call_fails_in(&f, rq_op("identity"), dl(300), TW_ETIMEDOUT, 0, "black hole", 1);
	ck_assert_uint_eq(f.px.accepts, 1);
	ff_end(&f);
}
END_TEST

/* One fault in the middle of a 1 MiB pool call (the proxy lets AFTER
 * bytes through first), on every transport: _i = case * 4 + transport. */
static const struct pool_fault {
	enum fp_fault fault;
	int dir;
	int warm;      /* a warm call first (the stall cases): assert_stalled */
	unsigned seed; /* of the request's pattern */
	uint32_t ms;   /* the call's deadline, dl(ms); 0: FAR_MS */
	int want;
	const char *what;
	int also; /* another error it may end with (call_fails_in), or 0 */
} pool_faults[] = {
	/* The reply stops coming 64 KiB in: the call's deadline ends it. */
	{FP_STALL, FP_DOWN, 1, 3, 500, TW_ETIMEDOUT, "stalled reply", 0},
	/* The request stops going 64 KiB in: the call's deadline ends it. */
	{FP_STALL, FP_UP, 1, 4, 500, TW_ETIMEDOUT, "stalled request", 0},
	/* A reset in the middle of the reply: the call fails at once with
	 * the socket error (ECONNRESET), not at its deadline (FAR_MS). */
	{FP_RESET, FP_DOWN, 0, 5, 0, TW_EIO, "reset reply", 0},
	/* A reset in the middle of the request. */
	{FP_RESET, FP_UP, 0, 6, 0, TW_EIO, "reset request", 0},
	/* The server's direction ends (FIN) in the middle of the reply
	 * while the client's stays open: the message was cut,
	 * TW_ETRUNCATED, at once. */
	{FP_HALF_OPEN, FP_DOWN, 0, 7, 0, TW_ETRUNCATED, "half-open reply", 0},
	/* The client's direction ends (FIN to the server) in the middle of
	 * the request, the server's stays open: the server drops the cut
	 * request and closes, which comes back through the proxy: the
	 * call fails at once with the peer's close (TW_ECLOSED), not at its
	 * deadline (FAR_MS); or with the reset (TW_EIO) when the proxy
	 * closed its socket with the rest of our request unread in it. */
	{FP_HALF_OPEN, FP_UP, 0, 11, 0, TW_ECLOSED, "half-open request", TW_EIO},
};
enum { STALL_REPLY, STALL_REQUEST, RESET_REPLY, RESET_REQUEST, HALF_OPEN_REPLY, HALF_OPEN_REQUEST };

/* A stall case proves its deadline only if the stall came first. Under
 * ASan at load 30 (2 of 2 runs of the suite; tls and wss), and once in 6
 * plain runs (ws), the 1 MiB request had not come back 64 KiB through the
 * proxy when 500 ms ran out: the call ended by its deadline with
 * TW_ETIMEDOUT, but nothing had stalled (px.faults 0). Such a run is made
 * again, from a new fixture, with the deadline doubled until it reaches
 * WAIT_MS / 4 (not under valgrind, where assert_stalled allows it): the
 * machine's speed sets how long the test takes, not whether it passes. */
START_TEST(pool_fault_mid_call)
{
	const struct pool_fault *c = &pool_faults[_i / 4];
	struct fp_opts o = {.fault = c->fault, .dir = c->dir, .after = AFTER};
	uint32_t ms = c->ms != 0 ? dl(c->ms) : FAR_MS;
	struct ff f;
	for (;;) {
		ff_init(&f, _i % 4, &o);
		if (c->warm)
			warm(&f, 64 * KiB);
		call_fails_in(&f, rq_echo_pattern(MiB, c->seed), ms, c->want, c->also, c->what, 0);
		if (!c->warm || f.px.faults != 0 || ts_quick() || ms >= WAIT_MS / 4)
			break;
		ff_end(&f);
		ms *= 2;
	}
	if (c->warm)
		assert_stalled(&f);
	else
		ck_assert_uint_eq(f.px.faults, 1);
	ff_end(&f);
}
END_TEST

/* Slow but working paths: delayed bursts and a throttled link carry
 * every byte; a deadline shorter than the throttled transfer holds while
 * bytes still move (500 ms for 1 MiB each way at 256 KiB/s, which takes
 * 4 s or more: not scaled under valgrind). */
START_TEST(pool_delay_throttle)
{
	struct fp_opts d = {.fault = FP_DELAY, .delay_ms = 20};
	struct fp_opts th = {.fault = FP_THROTTLE, .rate = 4 * MiB};
	struct fp_opts slow = {.fault = FP_THROTTLE, .rate = 256 * KiB};
	struct ff f;
	struct rc rc;
	const struct fp_opts *carry[] = {&d, &th}; /* seeds 8 and 9 */
	for (unsigned k = 0; k < 2; k++) {
		ff_init(&f, _i, carry[k]);
		rc_start(f.pool, f.via, rq_echo_pattern(MiB, 8 + k), WAIT_MS, &rc);
		ck_assert(run_until_abs(&f.h, rc_is_done, &rc, WAIT_MS + 1000));
		assert_echo(&rc, MiB, 8 + k);
		rc_clear(&rc);
		assert_nothing_left(&f);
		ff_fini(&f);
	}

	ff_init(&f, _i, &slow);
	warm(&f, 0);
	call_fails(&f, rq_echo_pattern(MiB, 10), 500, TW_ETIMEDOUT, "throttled");
	ck_assert_uint_gt(f.px.moved[0], 0);
	ff_end(&f);
}
END_TEST

/* tw_pool_free while a call's comm hangs in its handshake behind a black
 * hole: the comm is aborted at once (the proxy sees its client go), not
 * when a handshake clock (FAR_MS) runs out. */
START_TEST(pool_free_black_hole)
{
	struct fp_opts o = {.fault = FP_BLACK_HOLE};
	struct ff f;
	struct rc rc;
	ff_init(&f, _i, &o);
	rc_start(f.pool, f.via, rq_op("identity"), 0, &rc);
	while (f.px.accepts == 0)
		tu_run_for(&f.h, 10);
	tu_run_for(&f.h, 50); /* into the handshake or upgrade */
	tw_pool_free(f.pool);
	f.pool = NULL;
	f.fds -= f.pool_fds; /* the pool's timers went with it */
	ck_assert(rc.done);
	ck_assert_int_eq(rc.err, TW_ECANCELED);
	ck_assert_msg(run_until_abs(&f.h, fp_idle, &f.px, WAIT_MS),
		      "%s: tw_pool_free left its comm open in the handshake", ts_tran_scheme(_i));
	assert_nothing_left(&f);
	ff_fini(&f);
}
END_TEST

/* Plain comms: an echo listener on transport t, the proxy in front. */

struct pf {
	struct tu h;
	struct fp px;
	char via[128];
	int fds;
	uint64_t blocks;
};

static void pf_init(struct pf *f, int t, const struct fp_opts *o)
{
	memset(f, 0, sizeof(*f));
	ts_tran_init(&f->h, t);
	far_clocks(f->h.ctx);
	ts_tran_listen(&f->h, t);
	f->fds = tt_fd_count();
	f->blocks = ts_blocks_live();
	fp_start(&f->px, f->h.base, f->h.addr, o);
	fp_uri(&f->px, ts_tran_scheme(t), f->via, sizeof(f->via));
}

static void pf_nothing_left(struct pf *f, int t)
{
	nothing_left(&f->h, &f->px, t, f->fds, f->blocks);
}

static void pf_fini(struct pf *f)
{
	fp_stop(&f->px);
	tu_fini(&f->h);
}

/* A direct client to the echo listener echoes while the other hangs. */
static void pf_canary(struct pf *f)
{
	struct tu_peer *c;
	size_t len = 100;
	ck_assert_int_eq(tu_connect(&f->h, f->h.addr, &c), 0);
	c->keep = 1;
	tu_echo_check(c, &len, 1, 11, WAIT_MS);
	tu_peer_free(c);
}

/* The end of a plain-comm case: the listener still echoes, nothing is
 * left once the proxy lets go, the fixture is freed. */
static void pf_end(struct pf *f, int t)
{
	pf_canary(f);
	pf_nothing_left(f, t);
	pf_fini(f);
}

static int connect_ended(void *arg)
{
	return *(const int *)arg != 1;
}

static int peer_closed(void *arg)
{
	return ((const struct tu_peer *)arg)->closed;
}

static int px_fired(void *arg)
{
	return ((const struct fp *)arg)->faults > 0;
}

/* tw_comm_connect to a black hole with a 300 ms connect timeout: tcp is
 * usable once TCP connects; tls, ws and wss never are, and the connect
 * timeout ends them (not a handshake or upgrade clock) with
 * TW_ETIMEDOUT. */
START_TEST(comm_connect_black_hole)
{
	struct fp_opts o = {.fault = FP_BLACK_HOLE};
	struct pf f;
	struct tu_peer *c = NULL;
	int err = 1;
	pf_init(&f, _i, &o);
	ck_assert_int_eq(tw_context_set_connect_timeout_ms(f.h.ctx, 300), 0);
	ck_assert_int_eq(tu_connect_async(&f.h, f.via, &c, &err), 0);
	ck_assert_msg(run_until_abs(&f.h, connect_ended, &err, WAIT_MS),
		      "%s: the connect outlived its 300 ms timeout", ts_tran_scheme(_i));
	if (_i == TCP) {
		ck_assert_int_eq(err, 0);
		tu_peer_free(c);
	} else {
		ck_assert_msg(err == TW_ETIMEDOUT, "%s: %s (%s)", ts_tran_scheme(_i),
			      tw_strerror(err), tw_context_last_error(f.h.ctx));
	}
	/* the canary's own wss handshake takes longer than 300 ms under
	 * valgrind (CI failed so): it gets the default deadline back */
	ck_assert_int_eq(tw_context_set_connect_timeout_ms(f.h.ctx, TW_DEFAULT_CONNECT_TIMEOUT_MS),
			 0);
	pf_end(&f, _i);
}
END_TEST

/* A message stops coming a quarter of the way in: the minimum receive
 * rate (1 MiB/s on average after 300 ms, 256 KiB having come; under
 * valgrind a tenth of that) ends the receiving comm with
 * TW_ETIMEDOUT, and nothing of the message is delivered. */
START_TEST(comm_stall_mid_message)
{
	struct fp_opts o = {.fault = FP_STALL, .dir = FP_DOWN, .after = AFTER};
	struct pf f;
	struct tu_peer *c;
	tw_context *cc;
	size_t len = MiB;
	char why[256];
	pf_init(&f, _i, &o);
	/* the client's own context: the server must not be held to the rate
	 * (under valgrind it receives slower than that) */
	ck_assert_int_eq(tw_context_new(f.h.base, &cc), 0);
	if (ts_tran_tls(_i))
		tt_use_tls(cc, "ca.pem", "cert.pem", "key.pem");
	far_clocks(cc);
	ck_assert_int_eq(tw_context_set_min_receive_rate(cc, ts_quick() ? MiB / 10 : MiB, 300), 0);
	ck_assert_msg(tt_connect(&f.h, cc, f.via, &c, why, sizeof(why)) == 0, "%s", why);
	c->keep = 1;
	/* not reading until the proxy stalled: the cut is then the stall's,
	 * however slowly the echo came (valgrind on a loaded machine: the
	 * rate cut it before the stall, px.faults 0) */
	tw_comm_pause(c->comm);
	ck_assert_int_eq(tw_comm_write(c->comm, ts_msg_pattern(&len, 1, 12)), 0);
	ck_assert(tu_run_until(&f.h, px_fired, &f.px, TU_WAIT_MS));
	tw_comm_resume(c->comm);
	ck_assert_msg(run_until_abs(&f.h, peer_closed, c, WAIT_MS),
		      "%s: a stalled message outlived the minimum receive rate",
		      ts_tran_scheme(_i));
	ck_assert_msg(c->close_err == TW_ETIMEDOUT, "%s: %s (%s)", ts_tran_scheme(_i),
		      tw_strerror(c->close_err), c->last_error);
	ck_assert_uint_eq(c->nmsgs, 0);
	ck_assert_uint_eq(f.px.faults, 1);
	tt_peer_free(c);
	tw_context_free(cc);
	pf_canary(&f);
	pf_nothing_left(&f, _i);
	pf_fini(&f);
}
END_TEST

/* The peer's side stops reading (the proxy stalls the client's
 * direction): the TCP timeout (1,000 ms) ends the writing comm with
 * TW_ETIMEDOUT and releases what it queued. */
START_TEST(comm_stall_writer)
{
	struct fp_opts o = {.fault = FP_STALL, .dir = FP_UP, .after = AFTER};
	struct pf f;
	struct tu_peer *c;
	size_t len = 32 * MiB;
	pf_init(&f, _i, &o);
	ck_assert_int_eq(tw_context_set_tcp_timeout_ms(f.h.ctx, 1000), 0);
	ck_assert_int_eq(tu_connect(&f.h, f.via, &c), 0);
	ck_assert_int_eq(tw_comm_write(c->comm, ts_msg_pattern(&len, 1, 13)), 0);
	ck_assert_msg(run_until_abs(&f.h, peer_closed, c, WAIT_MS),
		      "%s: a write to a stalled peer outlived the TCP timeout", ts_tran_scheme(_i));
	/* the server's comm too: under valgrind at load (wss) the client got
	 * a broken pipe instead (ci17; 2 of 3 runs beside 2 CPU hogs): its
	 * TLS layer dropped the ETIMEDOUT of a send after bytes of the same
	 * write had gone, and the next send said EPIPE (fixed in tls.c) */
	ck_assert_msg(c->close_err == TW_ETIMEDOUT, "%s: %s (%s); the server's comm: %s (%s)",
		      ts_tran_scheme(_i), tw_strerror(c->close_err), c->last_error,
		      f.h.nsrv == 0        ? "none"
		      : f.h.srv[0]->closed ? "ended"
					   : "open",
		      f.h.nsrv == 0 ? "" : f.h.srv[0]->last_error);
	ck_assert_uint_eq(tw_comm_queued_bytes(c->comm), 0);
	tu_peer_free(c);
	pf_end(&f, _i);
}
END_TEST

/* Streams (connection_stream and tw_batched) through a reset: the client
 * comm ends with TW_EIO, the server got a prefix of the maps, in order
 * and intact, and keeps serving. */
static int rw_is_closed(void *arg)
{
	return ((const struct rw *)arg)->closed;
}

START_TEST(stream_reset)
{
	struct fp_opts o = {.fault = FP_RESET, .dir = FP_UP, .after = 64 * KiB};
	struct ff f;
	struct rw w;
	tw_batched *b;
	tw_builder *start;
	int64_t i;
	ff_init(&f, _i, &o);
	ck_assert_int_eq(rw_open(&f.h, f.h.ctx, f.via, &w), 0);
	start = rq_begin("connection_stream", 1);
	rq_bool(start, "reply", 0);
	rw_send(&w, rq_end(start));
	ck_assert_int_eq(tw_batched_new(w.comm, 2, &b), 0);
	for (i = 0; i < 20000 && !w.closed; i++) {
		ru_send_item(b, "item", i);
		if (i % 500 == 499)
			tu_run_for(&f.h, 1);
	}
	ck_assert_msg(run_until_abs(&f.h, rw_is_closed, &w, WAIT_MS),
		      "%s: the stream outlived a reset", ts_tran_scheme(_i));
	ck_assert_msg(w.close_err == TW_EIO, "%s: %s (%s)", ts_tran_scheme(_i),
		      tw_strerror(w.close_err), tw_comm_last_error(w.comm));
	ck_assert_uint_eq(f.px.faults, 1);
	ck_assert_uint_gt(f.s.items, 0);
	ck_assert_uint_lt(f.s.items, (size_t)i);
	ck_assert_uint_eq(f.s.item_errors, 0);
	tw_batched_free(b);
	rw_free(&w);
	ff_end(&f);
}
END_TEST

/* A stream opened through the proxy (its connection_stream request
 * sent), with a batched sender on it. */
static void stream_open(struct ff *f, struct rw *w, tw_batched **b)
{
	tw_builder *start;
	ck_assert_int_eq(rw_open(&f->h, f->h.ctx, f->via, w), 0);
	start = rq_begin("connection_stream", 1);
	rq_bool(start, "reply", 0);
	rw_send(w, rq_end(start));
	ck_assert_int_eq(tw_batched_new(w->comm, 2, b), 0);
}

/* Send items 0, 1, ... on b until the stream's comm closed, or, with
 * `until_queued` > 0, until that many bytes wait in its write queue (the
 * kernel's buffers on both sides are full: the peer's window is shut).
 * The loop turns every 500 items, and at least every 20 ms: the proxy and
 * the server run in it, and while it does not turn nobody reads the
 * stream's socket. (Every 500 items only, stream_stall over wss failed
 * under valgrind at load 13 with px.faults 0: the stream's 1 s TCP timeout
 * ended it before the proxy's fault, its window shut, most likely, while
 * the loop did not turn.) Returns the number sent. */
static int64_t stream_items(struct ff *f, struct rw *w, tw_batched *b, size_t until_queued)
{
	int64_t i;
	long long turned = now_ms();
	for (i = 0; !w->closed; i++) {
		ru_send_item(b, "item", i);
		if (i % 500 == 499 || (i % 25 == 24 && now_ms() - turned >= 20)) {
			tu_run_for(&f->h, 1);
			turned = now_ms();
			if (until_queued > 0 && !w->closed &&
			    tw_comm_queued_bytes(w->comm) >= until_queued)
				break;
		}
		ck_assert_msg(i < 50000000, "%s: the stream never ended", ts_tran_scheme(f->t));
	}
	return i;
}

/* The server got a prefix of the stream's maps, in order and intact. */
static void assert_prefix(const struct ff *f, int64_t sent)
{
	ck_assert_uint_gt(f->s.items, 0);
	ck_assert_uint_lt(f->s.items, (size_t)sent);
	ck_assert_uint_eq(f->s.item_errors, 0);
}

/* The stream's connect reaches a black hole (accepted, never answered):
 * the connect timeout (300 ms) ends it with TW_ETIMEDOUT in whatever
 * stage it is, the Dask handshake included (tcp; tls and wss in the TLS
 * handshake, ws in the upgrade), with every stage's own clock far out;
 * nothing is left once the proxy lets go. Before the connect timeout
 * covered the Dask handshake, the tcp stream waited for the handshake's
 * own clock (here FAR_MS). */
START_TEST(stream_black_hole)
{
	struct fp_opts o = {.fault = FP_BLACK_HOLE};
	struct ff f;
	struct rw w;
	const char *why;
	int err;
	ff_init(&f, _i, &o);
	ck_assert_int_eq(tw_context_set_connect_timeout_ms(f.h.ctx, 300), 0);
	err = rw_open(&f.h, f.h.ctx, f.via, &w); /* asserts it ends (TU_WAIT_MS) */
	why = w.comm != NULL ? tw_comm_last_error(w.comm) : tw_context_last_error(f.h.ctx);
	ck_assert_msg(err == TW_ETIMEDOUT, "%s: %s (%s)", ts_tran_scheme(_i), tw_strerror(err),
		      why);
	ck_assert_msg(strstr(why, "timed out") != NULL && strstr(why, "300 ms") != NULL &&
			      strstr(why, "(the connect timeout") != NULL,
		      "%s: %s", ts_tran_scheme(_i), why);
	if (_i == TCP) /* past TCP: the Dask handshake is what waited */
		ck_assert_msg(strstr(why, "handshake timed out") != NULL, "%s", why);
	ck_assert_uint_eq(f.px.accepts, 1);
	rw_free(&w);
	/* the canary's own handshakes get the default deadline back */
	ck_assert_int_eq(tw_context_set_connect_timeout_ms(f.h.ctx, TW_DEFAULT_CONNECT_TIMEOUT_MS),
			 0);
	ff_end(&f);
}
END_TEST

/* The proxy stops taking the stream's bytes 64 KiB in (the server's
 * reading stalls, the window shuts, the connection stays up): the TCP
 * timeout (1,000 ms) ends the stream's comm with TW_ETIMEDOUT and
 * releases what it queued; the server got a prefix, in order, and
 * keeps serving; nothing is left once the proxy lets go. */
START_TEST(stream_stall)
{
	struct fp_opts o = {.fault = FP_STALL, .dir = FP_UP, .after = 64 * KiB};
	struct ff f;
	struct rw w;
	tw_batched *b;
	int64_t sent;
	ff_init(&f, _i, &o);
	ck_assert_int_eq(tw_context_set_tcp_timeout_ms(f.h.ctx, 1000), 0);
	stream_open(&f, &w, &b);
	sent = stream_items(&f, &w, b, 4 * MiB);
	ck_assert_msg(run_until_abs(&f.h, rw_is_closed, &w, WAIT_MS),
		      "%s: a stream to a stalled peer outlived the TCP timeout",
		      ts_tran_scheme(_i));
	ck_assert_msg(w.close_err == TW_ETIMEDOUT, "%s: %s (%s)", ts_tran_scheme(_i),
		      tw_strerror(w.close_err), tw_comm_last_error(w.comm));
	ck_assert_uint_eq(tw_comm_queued_bytes(w.comm), 0);
	ck_assert_uint_eq(f.px.faults, 1);
	assert_prefix(&f, sent);
	tw_batched_free(b);
	rw_free(&w);
	ck_assert_int_eq(tw_context_set_tcp_timeout_ms(f.h.ctx, 0), 0);
	ff_end(&f);
}
END_TEST

/* The stream's direction is shut 64 KiB in (FIN to the server in the
 * middle of a message; the proxy discards what follows), the server's
 * direction stays open: the server ends its comm (a message cut), its
 * close comes back through the proxy, and the stream's comm ends with
 * the peer's end while every clock is far out: the orderly close (0,
 * "peer closed", nothing of ours queued; TW_ECLOSED with bytes queued)
 * or, when a write of ours met the proxy's closed socket first, the
 * reset (TW_EIO: 1 of 4 wss runs in 6 suite runs); never TW_ETIMEDOUT.
 * The server got a prefix, in order, and keeps serving; nothing is
 * left. */
START_TEST(stream_half_open_request)
{
	struct fp_opts o = {.fault = FP_HALF_OPEN, .dir = FP_UP, .after = 64 * KiB};
	struct ff f;
	struct rw w;
	tw_batched *b;
	const char *why;
	int64_t sent;
	ff_init(&f, _i, &o);
	stream_open(&f, &w, &b);
	sent = stream_items(&f, &w, b, 0);
	why = tw_comm_last_error(w.comm);
	ck_assert_msg(w.close_err == 0 || w.close_err == TW_ECLOSED || w.close_err == TW_EIO,
		      "%s: %s (%s)", ts_tran_scheme(_i), tw_strerror(w.close_err), why);
	ck_assert_msg(w.close_err != 0 || strstr(why, "peer closed") != NULL, "%s: %s",
		      ts_tran_scheme(_i), why);
	ck_assert_msg(w.close_err != TW_ECLOSED || strstr(why, "not delivered") != NULL, "%s: %s",
		      ts_tran_scheme(_i), why);
	ck_assert_uint_eq(f.px.faults, 1);
	assert_prefix(&f, sent);
	tw_batched_free(b);
	rw_free(&w);
	ff_end(&f);
}
END_TEST

/* Slow but working paths under a stream: delayed bursts (20 ms) and a
 * throttled link (256 KiB/s) carry every one of 10,000 maps, in order,
 * with no clock ending the stream; nothing is left once the stream and
 * the proxy are gone. */
START_TEST(stream_delay_throttle)
{
	struct fp_opts d = {.fault = FP_DELAY, .delay_ms = 20};
	struct fp_opts th = {.fault = FP_THROTTLE, .rate = 256 * KiB};
	const struct fp_opts *carry[] = {&d, &th};
	for (unsigned k = 0; k < 2; k++) {
		struct ff f;
		struct rw w;
		tw_batched *b;
		const int64_t n = 10000;
		ff_init(&f, _i, carry[k]);
		stream_open(&f, &w, &b);
		for (int64_t i = 0; i < n; i++) {
			ru_send_item(b, "item", i);
			if (i % 500 == 499)
				tu_run_for(&f.h, 1);
		}
		ck_assert_msg(tu_wait_count(&f.h, &f.s.items, (size_t)n, WAIT_MS),
			      "%s: %zu of %lld maps through the %s proxy", ts_tran_scheme(_i),
			      f.s.items, (long long)n, k == 0 ? "delaying" : "throttling");
		ck_assert_uint_eq(f.s.items, (size_t)n);
		ck_assert_uint_eq(f.s.item_errors, 0);
		ck_assert_uint_gt(f.px.moved[0], 0);
		ck_assert(!w.closed);
		tw_batched_free(b);
		rw_free(&w);
		ff_end(&f);
	}
}
END_TEST

/* A TCase called name running t over every transport, _i = k * 4 +
 * transport (k: a row of t's table, 0 for the other tests). */
static TCase *tc_row(const char *name, const TTest *t, int k)
{
	TCase *c = tcase_create(name);
	tcase_set_timeout(c, 300);
	if (ts_quick()) { /* valgrind: tcp and wss cover the code of all four */
		tcase_add_loop_test(c, t, k * 4 + TCP, k * 4 + TCP + 1);
		tcase_add_loop_test(c, t, k * 4 + WSS, k * 4 + WSS + 1);
	} else {
		tcase_add_loop_test(c, t, k * 4 + TCP, k * 4 + WSS + 1);
	}
	return c;
}

static TCase *tc(const char *name, const TTest *t)
{
	return tc_row(name, t, 0);
}

int main(void)
{
	Suite *s = suite_create("faults");
	suite_add_tcase(s, tc("pool_black_hole", pool_black_hole));
	suite_add_tcase(s, tc_row("pool_stall_reply", pool_fault_mid_call, STALL_REPLY));
	suite_add_tcase(s, tc_row("pool_stall_request", pool_fault_mid_call, STALL_REQUEST));
	suite_add_tcase(s, tc_row("pool_reset_reply", pool_fault_mid_call, RESET_REPLY));
	suite_add_tcase(s, tc_row("pool_reset_request", pool_fault_mid_call, RESET_REQUEST));
	suite_add_tcase(s, tc_row("pool_half_open_reply", pool_fault_mid_call, HALF_OPEN_REPLY));
	suite_add_tcase(s,
			tc_row("pool_half_open_request", pool_fault_mid_call, HALF_OPEN_REQUEST));
	suite_add_tcase(s, tc("pool_delay_throttle", pool_delay_throttle));
	suite_add_tcase(s, tc("pool_free_black_hole", pool_free_black_hole));
	suite_add_tcase(s, tc("comm_connect_black_hole", comm_connect_black_hole));
	suite_add_tcase(s, tc("comm_stall_mid_message", comm_stall_mid_message));
	suite_add_tcase(s, tc("comm_stall_writer", comm_stall_writer));
	suite_add_tcase(s, tc("stream_reset", stream_reset));
	suite_add_tcase(s, tc("stream_black_hole", stream_black_hole));
	suite_add_tcase(s, tc("stream_stall", stream_stall));
	suite_add_tcase(s, tc("stream_half_open_request", stream_half_open_request));
	suite_add_tcase(s, tc("stream_delay_throttle", stream_delay_throttle));
	/* The proxy writes with libevent (writev) to peers that reset; the
	 * library itself never raises SIGPIPE (tests/check_tcp.c keeps the
	 * default action to show it). */
	return ts_run(s, TS_CERTS | TS_NO_SIGPIPE);
}
