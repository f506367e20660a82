/* SPDX-License-Identifier: BSD-3-Clause */
/* The close contract, one conformance suite over tcp, tls, ws and wss
 * (include/taskwire/comm.h, tw_comm_close; docs/design.md, Close):
 * tw_comm_close delivers everything queued, or ends with an error that
 * says how many bytes were not delivered, at the latest once bytes stood
 * still for the close linger (tw_context_set_close_linger_ms). Real
 * sockets on loopback, TLS with certificates made at start. Every wait
 * is on a callback, bounded by the harness's hang guard. */
#include <endian.h>
#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <check.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <event2/event.h>

#include "core/context.h"
#include "core/pass.h"
#include "tests/support/harness.h"
#include "tests/support/tls.h"
#include "tests/support/tran.h"
#include "tests/support/ws.h"
#include "tests/support/suite.h"

#define MiB ((size_t)1 << 20)
/* What every close test queues: 64 messages of 1 MiB (64 MiB; 16 under
 * TW_TEST_QUICK=1, for valgrind). */
static unsigned nmsgs(void)
{
	return ts_quick() ? 16 : 64;
}

/* A harness for scheme i whose listener's comms do what `opts` says. */
static void setup(struct tu *h, int i, struct tu_server_opts opts, uint32_t linger_ms)
{
	ts_tran_init(h, i);
	if (linger_ms != 0)
		ck_assert_int_eq(tw_context_set_close_linger_ms(h->ctx, linger_ms), 0);
	h->sopts = opts;
	ts_tran_listen(h, i);
}

static struct tu_peer *connect_client(struct tu *h)
{
	struct tu_peer *cli;
	int rv = tu_connect(h, h->addr, &cli);
	ck_assert_msg(rv == 0, "connect %s: %s: %s", h->addr, tw_strerror(rv),
		      tw_context_last_error(h->ctx));
	return cli;
}

/* Queue nmsgs() messages of 1 MiB on cli before the loop runs again. */
static uint64_t queue_all(struct tu_peer *cli)
{
	size_t lens[] = {MiB};
	for (unsigned k = 0; k < nmsgs(); k++)
		ck_assert_int_eq(tw_comm_write(cli->comm, ts_msg_pattern(lens, 1, k)), 0);
	return (uint64_t)nmsgs() * MiB;
}

/* The slow reader: takes one message, then pauses for `slow_ms` (a rate
 * of about 1 MiB per slow_ms, far below what loopback moves). Only the
 * pace depends on the clock; what the test asserts does not. */
struct slow {
	struct event *ev;
	struct tu_peer *p;
	int ms;
};

static void slow_resume(evutil_socket_t fd, short what, void *arg)
{
	struct slow *s = arg;
	(void)fd;
	(void)what;
	if (s->p->comm != NULL && !s->p->closed)
		tw_comm_resume(s->p->comm);
}

static void slow_on_recv(struct tu_peer *p, tw_msg *m)
{
	struct slow *s = p->user;
	struct timeval tv = {0, s->ms * 1000};
	(void)m;
	tw_comm_pause(p->comm);
	evtimer_add(s->ev, &tv);
}

/* 64 MiB queued, then closed at once, to a reader that takes about 1 MiB
 * per 50 ms: everything arrives (the close waits as long as bytes move),
 * and the close callback says 0. Before the fix, ws and wss ran it with 0
 * after 2 s, with a third of the bytes still queued. */
START_TEST(slow_reader_gets_everything)
{
	struct tu h;
	struct tu_server_opts opts = {0};
	struct tu_peer *cli, *sp;
	struct slow s = {NULL, NULL, 50};
	uint64_t queued;
	setup(&h, _i, opts, 0);
	cli = connect_client(&h);
	sp = tu_server_peer(&h, 0);
	ck_assert_ptr_nonnull(sp);
	s.p = sp;
	s.ev = evtimer_new(h.base, slow_resume, &s);
	sp->user = &s;
	sp->on_recv = slow_on_recv;
	queued = queue_all(cli);
	tw_comm_close(cli->comm);
	ck_assert_msg(tu_wait_flag(&h, &cli->closed, TU_WAIT_MS), "close never ended");
	ck_assert_msg(cli->close_err == 0, "%s: close: %s (%s); reader got %llu of %llu bytes",
		      ts_tran_scheme(_i), tw_strerror(cli->close_err), cli->last_error,
		      (unsigned long long)sp->bytes, (unsigned long long)queued);
	/* The reader goes on until our end. */
	ck_assert_msg(tu_wait_flag(&h, &sp->closed, TU_WAIT_MS), "reader never saw the end");
	ck_assert_msg(sp->close_err == 0, "reader: %s (%s)", tw_strerror(sp->close_err),
		      sp->last_error);
	ck_assert_uint_eq(sp->bytes, queued);
	ck_assert_uint_eq(sp->nmsgs, nmsgs());
	event_free(s.ev);
	tt_fini(&h);
}
END_TEST

/* The bytes-not-delivered count in a close's error text, or -1. */
static long long undelivered(const char *text)
{
	const char *p = strstr(text, " bytes not delivered");
	while (p != NULL && p > text && p[-1] >= '0' && p[-1] <= '9')
		p--;
	return p != NULL && p[0] >= '0' && p[0] <= '9' ? atoll(p) : -1;
}

/* 64 MiB queued to a reader that never reads: the close ends once bytes
 * stood still for the linger (300 ms here), with TW_ETIMEDOUT and the
 * bytes not delivered in the text (at least what the kernels' buffers
 * could not take). Before the fix, tcp and tls waited for the TCP timeout
 * (none in tests: for ever), ws and wss ended with 0 after 2 s. */
START_TEST(stopped_reader_times_out)
{
	struct tu h;
	struct tu_server_opts opts = {0};
	struct tu_peer *cli, *sp;
	uint64_t queued;
	long long lost;
	opts.no_callbacks = 1; /* accepted, never read */
	setup(&h, _i, opts, 300);
	cli = connect_client(&h);
	sp = tu_server_peer(&h, 0);
	ck_assert_ptr_nonnull(sp);
	queued = queue_all(cli);
	tw_comm_close(cli->comm);
	ck_assert_msg(tu_wait_flag(&h, &cli->closed, TU_WAIT_MS), "close never ended");
	ck_assert_msg(cli->close_err == TW_ETIMEDOUT, "%s: close: %s (%s)", ts_tran_scheme(_i),
		      tw_strerror(cli->close_err), cli->last_error);
	lost = undelivered(cli->last_error);
	ck_assert_msg(lost > 0, "no count in \"%s\"", cli->last_error);
	/* loopback's buffers take a few MiB (far below 32); the queue's
	 * framing adds little */
	ck_assert_msg((uint64_t)lost + 32 * MiB > queued && (uint64_t)lost < queued + MiB,
		      "%lld of %llu bytes not delivered: \"%s\"", lost, (unsigned long long)queued,
		      cli->last_error);
	ck_assert_msg(strstr(cli->last_error, "close gave up") != NULL, "%s", cli->last_error);
	ck_assert_uint_eq(sp->nmsgs, 0);
	tt_fini(&h);
}
END_TEST

/* A short queue to a reader that reads: the close ends with 0 at the
 * peer's end, well before any linger (the common case stays quick: no
 * tick is waited for when the peer answers our end). */
START_TEST(quick_close_delivers)
{
	struct tu h;
	struct tu_server_opts opts = {0};
	struct tu_peer *cli, *sp;
	size_t lens[] = {100, 3};
	opts.keep = 1;
	opts.free_in_close = 1; /* the reader closes its end at ours */
	setup(&h, _i, opts, 0);
	cli = connect_client(&h);
	ck_assert_int_eq(tw_comm_write(cli->comm, ts_msg_pattern(lens, 2, 9)), 0);
	tw_comm_close(cli->comm);
	ck_assert(tu_wait_flag(&h, &cli->closed, TU_WAIT_MS));
	ck_assert_msg(cli->close_err == 0, "%s (%s)", tw_strerror(cli->close_err), cli->last_error);
	sp = tu_server_peer(&h, 0);
	ck_assert_uint_eq(sp->nmsgs, 1);
	ck_assert(ts_msg_matches(sp->msgs[0], lens, 2, 9));
	tt_fini(&h);
}
END_TEST

/* Bad input after a served request (the rule: replies already queued go
 * out before a comm closes for bad input that followed them; the comm
 * then ends with the input's error). The request is a 5-byte message
 * that the server echoes; the bad input is a message of zero frames
 * (stream framing) or a count message of 9 bytes (WebSocket). Same read:
 * the raw peer sends both in one write, so the echo is queued when the
 * bad input is read (before the fix, the echo was dropped with the
 * comm). Separate reads: the server takes the request and holds its
 * reply (deferred, as a tw_server handler may), the bad input arrives
 * while it is paused, and the reply is written as reading resumes. */
static const uint8_t req_payload[5] = {'h', 'e', 'l', 'l', 'o'};

/* Stream framing: a message of one frame of n bytes. */
static size_t stream_msg(uint8_t *out, const uint8_t *p, size_t n)
{
	uint64_t v[3] = {htole64(16 + n), htole64(1), htole64(n)};
	memcpy(out, v, 24);
	memcpy(out + 24, p, n);
	return 24 + n;
}

static size_t stream_bad(uint8_t *out)
{
	uint64_t v[2] = {htole64(8), htole64(0)}; /* N = 0: TW_ENOFRAMES */
	memcpy(out, v, 16);
	return 16;
}

/* WebSocket, masked as a client: the count (N = 1), then the frame. */
static size_t ws_msg(uint8_t *out, const uint8_t *p, size_t n)
{
	uint64_t one = htole64(1);
	size_t k = wu_frame(out, 1, 2, &one, 8, 1);
	return k + wu_frame(out + k, 1, 2, p, n, 1);
}

static size_t ws_bad(uint8_t *out)
{
	static const uint8_t nine[9] = {0};
	return wu_frame(out, 1, 2, nine, 9, 1); /* a count is 8 bytes: close 1002 */
}

/* Deferred replies: the server peer pauses at each request. */
static void hold_on_recv(struct tu_peer *p, tw_msg *m)
{
	(void)m;
	tw_comm_pause(p->comm);
}

struct raw {
	struct tu *h;
	int ws;
	int fd;            /* tcp */
	struct wu_raw wr;  /* ws */
	uint8_t in[65536]; /* tcp: what the server sent */
	size_t nin;
	int eof;
};

static int raw_read_eof(void *arg)
{
	struct raw *r = arg;
	ssize_t n = 1; /* the queue may be full before any recv */
	while (r->nin < sizeof(r->in) &&
	       (n = recv(r->fd, r->in + r->nin, sizeof(r->in) - r->nin, MSG_DONTWAIT)) > 0)
		r->nin += (size_t)n;
	r->eof = r->nin == sizeof(r->in) || (n == 0 || (n < 0 && errno == ECONNRESET));
	return r->eof;
}

static void raw_open(struct raw *r, struct tu *h)
{
	r->h = h;
	if (r->ws)
		ck_assert_int_eq(wu_raw_open(h, h->addr, NULL, &r->wr), 101);
	else
		r->fd = ts_raw_connect(h->addr);
}

static void raw_send(struct raw *r, const uint8_t *p, size_t n)
{
	if (r->ws)
		ck_assert_uint_eq(wu_raw_send(&r->wr, p, n), n);
	else
		ck_assert_uint_eq(tu_raw_send(r->h, r->fd, p, n), n);
}

/* Read to the server's EOF; the reply must be there, then (ws) close
 * 1002. */
static void raw_check_reply(struct raw *r)
{
	if (r->ws) {
		struct wu_fr f[4];
		size_t nf;
		ck_assert(wu_raw_read_eof(&r->wr, TU_WAIT_MS));
		nf = wu_parse(r->wr.in, r->wr.nin, f, 4, NULL);
		ck_assert_msg(nf == 3, "%zu frames from the server, not count, reply, close", nf);
		ck_assert_uint_eq(f[0].len, 8);
		ck_assert_uint_eq(f[1].len, sizeof(req_payload));
		ck_assert(memcmp(f[1].payload, req_payload, sizeof(req_payload)) == 0);
		ck_assert_int_eq(wu_close_code(r->wr.in, r->wr.nin, NULL, 0), 1002);
		wu_raw_close(&r->wr);
	} else {
		uint8_t want[64];
		size_t n = stream_msg(want, req_payload, sizeof(req_payload));
		ck_assert(tu_run_until(r->h, raw_read_eof, r, TU_WAIT_MS));
		ck_assert_msg(r->nin == n, "%zu bytes from the server, not the %zu of the reply",
			      r->nin, n);
		ck_assert(memcmp(r->in, want, n) == 0);
		close(r->fd);
	}
}

/* _i: 0 tcp same read, 1 tcp separate reads, 2 ws same read, 3 ws
 * separate reads. */
START_TEST(reply_before_bad_input_close)
{
	int ws = _i >= 2, same = _i % 2 == 0;
	struct tu h;
	struct tu_server_opts opts = {0};
	struct tu_peer *sp;
	struct raw *r = calloc(1, sizeof(*r));
	uint8_t b[256];
	size_t n;
	ck_assert_ptr_nonnull(r);
	r->ws = ws;
	opts.echo = same;
	setup(&h, ws ? 2 : 0, opts, 0);
	raw_open(r, &h);
	sp = tu_server_peer(&h, 0);
	ck_assert_ptr_nonnull(sp);
	n = ws ? ws_msg(b, req_payload, sizeof(req_payload))
	       : stream_msg(b, req_payload, sizeof(req_payload));
	if (same) {
		n += ws ? ws_bad(b + n) : stream_bad(b + n);
		raw_send(r, b, n);
	} else {
		size_t lens[] = {sizeof(req_payload)};
		tw_msg *reply;
		sp->on_recv = hold_on_recv;
		raw_send(r, b, n);
		ck_assert(tu_wait_count(&h, &sp->nmsgs, 1, TU_WAIT_MS));
		n = ws ? ws_bad(b) : stream_bad(b);
		raw_send(r, b, n);
		/* on loopback, sent bytes are in the server's socket now */
		ck_assert_int_eq(tw_msg_new(&reply), 0);
		ck_assert_int_eq(tw_msg_append_copy(reply, req_payload, lens[0]), 0);
		tw_comm_resume(sp->comm);
		ck_assert_int_eq(tw_comm_write(sp->comm, reply), 0);
	}
	raw_check_reply(r);
	ck_assert(tu_wait_flag(&h, &sp->closed, TU_WAIT_MS));
	ck_assert_msg(sp->close_err == (ws ? TW_EPROTO : TW_ENOFRAMES), "server: %s (%s)",
		      tw_strerror(sp->close_err), sp->last_error);
	ck_assert_uint_eq(sp->nmsgs, 1);
	free(r);
	tt_fini(&h);
}
END_TEST

static int some_sent(void *arg)
{
	tw_comm *c = arg;
	return tw_comm_queued_bytes(c) < 64 * MiB;
}

/* A ws client in the middle of a 64 MiB frame gets close 1009 from a
 * server that then stops reading. RFC 6455 section 5.5.1: answer at
 * once; a close frame can only go out at the end of the fragment being
 * written, which this peer will never take: the linger (300 ms) bounds
 * the wait, the comm ends with the peer's reason (TW_ETOOBIG) and the
 * bytes not delivered. Before the fix it waited for the TCP timeout
 * (none in tests: for ever). */
START_TEST(ws_peer_close_mid_fragment)
{
	struct tu h;
	struct wu_fake *f = calloc(1, sizeof(*f));
	struct tu_peer *cli;
	tw_comm *c;
	size_t lens[] = {64 * MiB};
	static const uint8_t body[] = {0x03, 0xf1, 't', 'o', 'o', ' ', 'b', 'i', 'g'};
	char why[256];
	ck_assert_ptr_nonnull(f);
	f->mode = WU_FAKE_101;
	f->stall = 1;
	f->nextra = wu_frame(f->extra, 1, 8, body, sizeof(body), 0);
	wu_fake_start(f);
	tu_init(&h);
	ck_assert_int_eq(tw_context_set_close_linger_ms(h.ctx, 300), 0);
	ck_assert_int_eq(tt_connect_bare(&h, h.ctx, f->uri, &c, why, sizeof(why)), 0);
	/* not reading yet: the frame goes out first, then the close is read */
	ck_assert_int_eq(tw_comm_write(c, ts_msg_pattern(lens, 1, 1)), 0);
	ck_assert(tu_run_until(&h, some_sent, c, TU_WAIT_MS));
	cli = tu_peer_new(&h);
	ck_assert_int_eq(tu_peer_start(cli, c), 0);
	ck_assert_msg(tu_wait_flag(&h, &cli->closed, TU_WAIT_MS), "close 1009 never answered");
	ck_assert_msg(cli->close_err == TW_ETOOBIG, "%s (%s)", tw_strerror(cli->close_err),
		      cli->last_error);
	ck_assert_msg(strstr(cli->last_error, "code 1009") != NULL, "%s", cli->last_error);
	ck_assert_msg(undelivered(cli->last_error) > 0, "%s", cli->last_error);
	atomic_store(&f->release, 1);
	wu_fake_join(f);
	free(f);
	tu_peer_free(cli);
	tt_fini(&h);
}
END_TEST

/* The same close 1009 to an idle client: the close frame is answered and
 * TCP closed, at once. */
START_TEST(ws_peer_close_idle)
{
	struct tu h;
	struct wu_fake *f = calloc(1, sizeof(*f));
	struct tu_peer *cli;
	static const uint8_t body[] = {0x03, 0xf1, 't', 'o', 'o', ' ', 'b', 'i', 'g'};
	struct wu_fr fr[2];
	ck_assert_ptr_nonnull(f);
	f->mode = WU_FAKE_101;
	f->nextra = wu_frame(f->extra, 1, 8, body, sizeof(body), 0);
	wu_fake_start(f);
	tu_init(&h);
	ck_assert_int_eq(tu_connect(&h, f->uri, &cli), 0);
	ck_assert(tu_wait_flag(&h, &cli->closed, TU_WAIT_MS));
	ck_assert_msg(cli->close_err == TW_ETOOBIG, "%s (%s)", tw_strerror(cli->close_err),
		      cli->last_error);
	/* the peer's reason, and nothing counted as not delivered: the only
	 * bytes we wrote are our answering close frame, which the peer reads
	 * (before: "...; 8 bytes not delivered", that frame, evidence18 D3) */
	ck_assert_msg(strcmp(cli->last_error, "closed by peer (code 1009: too big)") == 0, "%s",
		      cli->last_error);
	wu_fake_join(f); /* it read to our EOF */
	ck_assert_uint_eq(wu_parse(f->got, f->ngot, fr, 2, NULL), 1);
	ck_assert_int_eq(fr[0].op, 8);
	ck_assert_int_eq(wu_close_code(f->got, f->ngot, NULL, 0), 1009);
	free(f);
	tt_fini(&h);
}
END_TEST

/* Many comms ending at once (issue 17): 500 tls comms ending in one
 * callback were one loop pass of 15-26 ms, in which no other comm was
 * served. A comm's end sends its end (close_notify, FIN) and releases its
 * socket (SSL_free, close) while the loop's pass has time, else on later
 * passes (core/reap.h). Here every pass's time is spent from its start
 * (tw__pass_spend), as on a loaded machine: after the server ends MASS
 * comms in one callback, their clients see the ends over many passes,
 * a canary comm echoing between them, and every comm still ends as the
 * close contract says. */
#define MASS_MAX 24

/* epoll_ctl calls made on this thread while counting: a comm's read
 * event's removal is one (1.5-2 us), the costliest part of a
 * tw_comm_free left in the application's callback. Exported
 * (visibility and -export-dynamic), so libevent's calls come here. */
static _Thread_local int epoll_counting;
static _Thread_local unsigned epoll_calls;

__attribute__((visibility("default"))) int epoll_ctl(int epfd, int op, int fd,
						     struct epoll_event *ev)
{
	if (epoll_counting)
		epoll_calls++;
	return (int)syscall(SYS_epoll_ctl, epfd, op, fd, ev);
}

static size_t mass_n(void)
{
	return ts_quick() ? 8 : MASS_MAX;
}

struct mass {
	struct tu h;
	struct tu_peer *canary, *cli[MASS_MAX], *srv[MASS_MAX];
	int free;     /* tw_comm_free, not tw_comm_close */
	int then_say; /* free, then each client writes to its freed comm */
	int ended;
	unsigned epoll_calls; /* epoll_ctl calls of the callback that ends them */
	size_t srv_msgs[MASS_MAX];
	size_t canary_sent;
};

/* The canary writes its next message as each echo comes. */
static void canary_on_recv(struct tu_peer *p, tw_msg *m)
{
	struct mass *ms = p->user;
	size_t lens[] = {10};
	(void)m;
	ck_assert_int_eq(tw_comm_write(p->comm, ts_msg_pattern(lens, 1, 0)), 0);
	ms->canary_sent++;
}

/* One callback ends them all: a last message and tw_comm_close, or
 * tw_comm_free. */
static void mass_end(evutil_socket_t fd, short what, void *arg)
{
	struct mass *m = arg;
	size_t lens[] = {100};
	(void)fd, (void)what;
	epoll_calls = 0;
	epoll_counting = 1;
	for (size_t i = 0; i < mass_n(); i++) {
		struct tu_peer *sp = m->srv[i];
		if (m->free) {
			tw_comm_free(sp->comm);
			sp->comm = NULL;
			m->srv_msgs[i] = sp->nmsgs;
			continue;
		}
		ck_assert_int_eq(tw_comm_write(sp->comm, ts_msg_pattern(lens, 1, (unsigned)i)), 0);
		tw_comm_close(sp->comm);
	}
	epoll_counting = 0;
	m->epoll_calls = epoll_calls;
	/* bytes for the freed comms: their read events fire before the
	 * later passes release them */
	for (size_t i = 0; i < mass_n() && m->then_say; i++)
		ck_assert_int_eq(tw_comm_write(m->cli[i]->comm, ts_msg_pattern(lens, 1, 0)), 0);
	m->ended = 1;
}

static size_t clients_closed(const struct mass *m)
{
	size_t n = 0;
	for (size_t i = 0; i < mass_n(); i++)
		n += m->cli[i]->closed != 0;
	return n;
}

static void mass_case(int t, int free_them, int then_say)
{
	static const struct timeval now = {0, 0};
	struct mass *m = calloc(1, sizeof(*m));
	size_t lens[] = {10}, done = 0, n = mass_n(), echoes_first = 0, most = 0;
	long long deadline;
	ck_assert_ptr_nonnull(m);
	m->free = free_them;
	m->then_say = then_say;
	setup(&m->h, t, (struct tu_server_opts){.echo = 1}, 0);
	m->canary = ts_tran_connect(&m->h);
	m->canary->user = m;
	m->canary->on_recv = canary_on_recv;
	for (size_t i = 0; i < n; i++) {
		m->cli[i] = ts_tran_connect(&m->h);
		m->srv[i] = tu_server_peer(&m->h, i + 1); /* srv 0: the canary's */
	}
	ck_assert_int_eq(tw_comm_write(m->canary->comm, ts_msg_pattern(lens, 1, 0)), 0);
	m->canary_sent = 1;
	ck_assert(tu_wait_count(&m->h, &m->canary->nmsgs, 1, TU_WAIT_MS));
	tw__pass_spend(1);
	ck_assert_int_eq(event_base_once(m->h.base, -1, EV_TIMEOUT, mass_end, m, &now), 0);
	deadline = ts_now_ms() + TU_WAIT_MS;
	while (done < n) {
		size_t closed;
		ck_assert_msg(ts_now_ms() < deadline,
			      "%s: %zu of %zu clients saw their end, then none", ts_tran_scheme(t),
			      done, n);
		event_base_loop(m->h.base, EVLOOP_ONCE);
		closed = clients_closed(m);
		if (closed > done && done == 0)
			echoes_first = m->canary->nmsgs;
		if (closed - done > most)
			most = closed - done;
		if (closed != done)
			deadline = ts_now_ms() + TU_WAIT_MS;
		done = closed;
	}
	tw__pass_spend(0);
	m->canary->on_recv = NULL; /* its last echo comes in, then it rests */
	ck_assert(tu_wait_count(&m->h, &m->canary->nmsgs, m->canary_sent, TU_WAIT_MS));
	ck_assert(m->ended);
	if (getenv("TU_VERBOSE") != NULL)
		fprintf(stderr, "%s %s: at most %zu of %zu ends in one pass; canary echoes %zu\n",
			ts_tran_scheme(t), free_them ? "free" : "close", most, n,
			m->canary->nmsgs - echoes_first);
	/* the ends came over many passes, the canary served between them */
	ck_assert_msg(most <= n / 2, "%s: %zu of %zu ends in one pass", ts_tran_scheme(t), most, n);
	ck_assert_msg(m->canary->nmsgs > echoes_first,
		      "%s: the canary had no echo between the first and the last end",
		      ts_tran_scheme(t));
	ck_assert_int_eq(m->canary->closed, 0);
	/* tw_comm_free: the pass's first release only is done in the
	 * callback (its read event's removal), the others' wait with their
	 * sockets (transport/sock_comm.c, sock_park) */
	ck_assert_msg(!free_them || m->epoll_calls <= 1,
		      "%s: %u epoll_ctl calls in the callback that freed %zu comms",
		      ts_tran_scheme(t), m->epoll_calls, n);
	for (size_t i = 0; i < n; i++) {
		struct tu_peer *c = m->cli[i], *sp = m->srv[i];
		if (free_them) { /* nothing ran for a freed comm */
			ck_assert_uint_eq(sp->nmsgs, m->srv_msgs[i]);
			ck_assert_int_eq(sp->closed, 0);
		}
		if (then_say) /* its bytes unread, the freed comm's close may reset */
			continue;
		ck_assert_msg(c->close_err == 0, "%s client %zu: %s (%s)", ts_tran_scheme(t), i,
			      tw_strerror(c->close_err), c->last_error);
		if (free_them)
			continue;
		/* tw_comm_close: the last message came before the end */
		ck_assert_uint_eq(c->nmsgs_at_close, 1);
		ck_assert(ts_msg_matches(c->msgs[0], (size_t[]){100}, 1, (unsigned)i));
		ck_assert_msg(tu_wait_flag(&m->h, &sp->closed, TU_WAIT_MS), "server %zu", i);
		ck_assert_msg(sp->close_err == 0, "%s server %zu: %s (%s)", ts_tran_scheme(t), i,
			      tw_strerror(sp->close_err), sp->last_error);
	}
	tt_canary(m->canary, 3);
	tt_fini(&m->h);
	free(m);
}

START_TEST(mass_close)
{
	mass_case(_i, 0, 0);
}
END_TEST

START_TEST(mass_free)
{
	mass_case(_i, 1, 0);
}
END_TEST

/* The clients write to their comms just freed: the freed comms' read
 * events fire while their release waits, and run nothing. */
START_TEST(mass_free_then_peers_write)
{
	mass_case(_i, 1, 1);
}
END_TEST

/* A closing comm whose end waits for a later pass (core/reap.h: the pass
 * had no time left) and that stops before that pass, its peer having reset
 * the connection: the stop takes the end out of the context's queue, which
 * is then empty, and the queue's timer, still armed, ran a release from
 * it anyway, a NULL dereference. The tw-mini-scheduler died so in CI: it
 * closed the stream of a worker SIGKILLed in the middle of a relayed
 * get_data reply, on a loaded machine, and read the reset on the next
 * pass. Here every pass's time counts as spent (tw__pass_spend) and the
 * test takes the pass's first release itself, so the close's end waits;
 * the raw peer resets (SO_LINGER 0) in the same pass, after the close,
 * with bytes of ours unacknowledged (it never reads): the next pass reads
 * the reset, and the comm ends, before the queue's timer runs. */
struct reset_case {
	struct tu h;
	struct wu_raw raw; /* the client: a raw socket that never reads */
	struct tu_peer *srv;
	struct event *reset;
	int queued; /* the close's end waited in the queue */
	int owed;   /* bytes of ours were not in the peer's socket at the reset */
	int marked; /* a timer armed after the comm's end ran */
};

/* The message the server writes; more than the peer's receive window
 * takes (tcp_rmem's default 128 KiB), so some of it is unacknowledged. */
#define RESET_MSG_BYTES ((size_t)256 << 10)

/* After the close's own events of this pass (ws writes its close frame
 * from its write event): the end waits, then the peer resets. */
static void reset_peer(evutil_socket_t fd, short what, void *arg)
{
	struct reset_case *c = arg;
	struct linger reset = {1, 0};
	struct timeval t0, t;
	long long guard = ts_now_ms() + TU_WAIT_MS;
	int inq = 0;
	(void)fd, (void)what;
	c->queued = c->h.ctx->reap_head != NULL;
	ck_assert_int_eq(ioctl(c->raw.fd, FIONREAD, &inq), 0);
	c->owed = (size_t)inq < RESET_MSG_BYTES;
	ck_assert_int_eq(setsockopt(c->raw.fd, SOL_SOCKET, SO_LINGER, &reset, sizeof(reset)), 0);
	wu_raw_close(&c->raw); /* SSL_free sends nothing: the reset alone */
	/* The next pass is a new one (core/pass.h: the loop's cached clock,
	 * coarse, moved), as when a loaded machine ran something else in
	 * between: its first release is free again, so the comm's own is
	 * not queued behind the waiting end. Wait for the clock, not for a
	 * time. */
	event_base_gettimeofday_cached(c->h.base, &t0);
	do {
		event_base_update_cache_time(c->h.base);
		event_base_gettimeofday_cached(c->h.base, &t);
	} while (!timercmp(&t, &t0, !=) && ts_now_ms() < guard);
}

static void close_in_spent_pass(evutil_socket_t fd, short what, void *arg)
{
	struct reset_case *c = arg;
	(void)fd, (void)what;
	(void)tw__pass_release(c->h.base); /* the pass's first release: not the close's */
	tw_comm_close(c->srv->comm);
	event_active(c->reset, EV_TIMEOUT, 0); /* runs in this pass, after the close's */
}

static void mark(evutil_socket_t fd, short what, void *arg)
{
	(void)fd, (void)what;
	*(int *)arg = 1;
}

static int srv_flushed(void *arg)
{
	struct reset_case *c = arg;
	return tw_comm_queued_bytes(c->srv->comm) == 0;
}

START_TEST(close_then_peer_reset)
{
	static const struct timeval now = {0, 0}, next = {0, TW__PASS_NEXT_US};
	struct reset_case *c = calloc(1, sizeof(*c));
	size_t lens[] = {RESET_MSG_BYTES};
	char uri[160];
	ck_assert_ptr_nonnull(c);
	setup(&c->h, _i, (struct tu_server_opts){0}, 0);
	if (ts_tran_ws(_i))
		ck_assert_int_eq(wu_raw_open(&c->h, c->h.addr, NULL, &c->raw), 101);
	else /* tls: wu_raw_connect's TLS handshake, as for wss:// */
		wu_raw_connect(&c->h,
			       ts_tran_tls(_i) ? tt_uri_as(c->h.addr, "wss", uri, sizeof(uri))
					       : c->h.addr,
			       &c->raw);
	c->srv = tu_server_peer(&c->h, 0);
	ck_assert_int_eq(tw_comm_write(c->srv->comm, ts_msg_pattern(lens, 1, 0)), 0);
	ck_assert(tu_run_until(&c->h, srv_flushed, c, TU_WAIT_MS)); /* all in the kernel */
	ck_assert_ptr_nonnull(c->reset = event_new(c->h.base, -1, 0, reset_peer, c));
	tw__pass_spend(1);
	ck_assert_int_eq(event_base_once(c->h.base, -1, EV_TIMEOUT, close_in_spent_pass, c, &now),
			 0);
	ck_assert(tu_wait_flag(&c->h, &c->srv->closed, TU_WAIT_MS));
	/* The queue's timer was armed before this one, for the same delay:
	 * it has had its turn when this one runs. */
	ck_assert_int_eq(event_base_once(c->h.base, -1, EV_TIMEOUT, mark, &c->marked, &next), 0);
	ck_assert(tu_wait_flag(&c->h, &c->marked, TU_WAIT_MS));
	tw__pass_spend(0);
	ck_assert_msg(c->queued, "%s: the close's end did not wait", ts_tran_scheme(_i));
	/* tcp, tls: a reset with our bytes unacknowledged ends the comm with
	 * an error (a reset with none is the peer's end, as a FIN) */
	ck_assert_msg(!c->owed || ts_tran_ws(_i) || c->srv->close_err == TW_EIO,
		      "%s: ended with %s (%s)", ts_tran_scheme(_i), tw_strerror(c->srv->close_err),
		      c->srv->last_error);
	ck_assert_ptr_null(c->h.ctx->reap_head);
	event_free(c->reset);
	tt_fini(&c->h);
	free(c);
}
END_TEST

int main(void)
{
	TCase *tc = ts_tcase("close", 120, NULL);
	ts_add_loop(tc, 4,
		    TS_TESTS(slow_reader_gets_everything, stopped_reader_times_out,
			     quick_close_delivers, reply_before_bad_input_close, mass_close,
			     mass_free, mass_free_then_peers_write, close_then_peer_reset));
	ts_add(tc, TS_TESTS(ws_peer_close_mid_fragment, ws_peer_close_idle));
	return ts_main("close", TS_CERTS | TS_NO_SIGPIPE, TS_CASES(tc));
}
