/* SPDX-License-Identifier: BSD-3-Clause */
/* Read-ahead against real sockets (tests/support/readahead.h). */
#include <endian.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <check.h>
#include <event2/event.h>
#include <openssl/err.h>

#include "tests/support/readahead.h"

/* A message that should come at once but does not: the receiver stalls,
 * and nothing moves. Only a hang guard (tu_run_until restarts it on
 * progress): on a loaded machine "at once" can take seconds. */
#define STALL_MS TU_WAIT_MS

static uint64_t copied_now(void)
{
	tw_stats st;
	tw_stats_global(&st, sizeof(st));
	return st.payload_bytes_copied;
}

/* Raw peers. */

void ra_open_tcp(struct tu *h, struct ra_peer *p)
{
	memset(p, 0, sizeof(*p));
	p->h = h;
	p->fd = ts_raw_connect(h->addr);
}

/* Open a raw peer and find its server comm (the next one accepted). */
static void open_peer(struct ra_env *e, struct ra_peer *p)
{
	size_t idx = e->h->nsrv;
	e->open(e->h, p);
	p->sp = tu_server_peer(e->h, idx);
	ck_assert_ptr_nonnull(p->sp);
}

/* One SSL_write_ex of w[0..n) (w not NULL) or SSL_read_ex into r[0..n):
 * 1 when *moved bytes moved, 0 when it must wait (SSL_ERROR_WANT_READ or
 * WANT_WRITE), else minus the SSL_get_error code. */
static int ssl_step(SSL *ssl, const uint8_t *w, uint8_t *r, size_t n, size_t *moved)
{
	int rv, e;
	ERR_clear_error();
	rv = w != NULL ? SSL_write_ex(ssl, w, n, moved) : SSL_read_ex(ssl, r, n, moved);
	if (rv == 1)
		return 1;
	e = SSL_get_error(ssl, rv);
	return e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE ? 0 : -e;
}

void ra_send(struct ra_peer *p, const void *buf, size_t n)
{
	const uint8_t *b = buf;
	size_t done = 0;
	long long deadline = ts_now_ms() + TU_WAIT_MS;
	if (p->ssl == NULL) {
		ck_assert_uint_eq(tu_raw_send(p->h, p->fd, buf, n), n);
		return;
	}
	while (done < n) {
		size_t put = 0;
		int rv = ssl_step(p->ssl, b + done, NULL, n - done, &put);
		if (rv == 1) {
			done += put;
			deadline = ts_now_ms() + TU_WAIT_MS; /* a hang guard: slow is not stuck */
			continue;
		}
		ck_assert_msg(rv == 0, "SSL_write_ex: error %d", -rv);
		ck_assert_msg(ts_now_ms() < deadline, "raw tls send stalled at %zu of %zu bytes",
			      done, n);
		event_base_loop(p->h->base, EVLOOP_ONCE);
	}
}

int ra_recv(struct ra_peer *p, void *buf, size_t n)
{
	uint8_t *b = buf;
	size_t done = 0;
	long long deadline = ts_now_ms() + TU_WAIT_MS;
	while (done < n) {
		if (p->ssl != NULL) {
			size_t got = 0;
			int rv = ssl_step(p->ssl, NULL, b + done, n - done, &got);
			if (rv == 1) {
				done += got;
				deadline = ts_now_ms() + TU_WAIT_MS;
				continue;
			}
			if (rv < 0)
				return 0;
		} else {
			ssize_t k = recv(p->fd, b + done, n - done, MSG_DONTWAIT);
			if (k > 0) {
				done += (size_t)k;
				deadline = ts_now_ms() + TU_WAIT_MS;
				continue;
			}
			if (k == 0 || (errno != EAGAIN && errno != EINTR))
				return 0;
		}
		if (ts_now_ms() > deadline)
			return 0;
		event_base_loop(p->h->base, EVLOOP_ONCE);
	}
	return 1;
}

void ra_shutdown(struct ra_peer *p)
{
	if (p->ssl != NULL) {
		ERR_clear_error();
		SSL_shutdown(p->ssl);
	}
	shutdown(p->fd, SHUT_WR);
}

void ra_close(struct ra_peer *p)
{
	if (p->ssl != NULL) {
		ERR_clear_error();
		SSL_shutdown(p->ssl);
		SSL_free(p->ssl);
		p->ssl = NULL;
	}
	if (p->ssl_ctx != NULL)
		SSL_CTX_free(p->ssl_ctx);
	p->ssl_ctx = NULL;
	if (p->fd >= 0)
		close(p->fd);
	p->fd = -1;
	ERR_clear_error();
}

/* Wire bytes. */

void ra_buf_free(struct ra_buf *b)
{
	free(b->p);
	memset(b, 0, sizeof(*b));
}

static uint8_t *buf_room(struct ra_buf *b, size_t n)
{
	if (b->len + n > b->cap) {
		size_t cap = b->cap ? b->cap : 4096;
		while (cap < b->len + n)
			cap *= 2;
		b->p = realloc(b->p, cap);
		ck_assert_ptr_nonnull(b->p);
		b->cap = cap;
	}
	b->len += n;
	return b->p + b->len - n;
}

void ra_put_u64(struct ra_buf *b, const uint64_t *w, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		uint64_t v = htole64(w[i]);
		memcpy(buf_room(b, 8), &v, 8);
	}
}

void ra_put_msg(struct ra_buf *b, const size_t *lens, size_t nf, unsigned seed)
{
	uint64_t total = 8 + 8 * (uint64_t)nf, n = nf;
	for (size_t i = 0; i < nf; i++)
		total += lens[i];
	ra_put_u64(b, &total, 1);
	ra_put_u64(b, &n, 1);
	for (size_t i = 0; i < nf; i++) {
		uint64_t len = lens[i];
		ra_put_u64(b, &len, 1);
	}
	for (size_t i = 0; i < nf; i++)
		ts_fill(buf_room(b, lens[i]), lens[i], seed + (unsigned)i);
}

/* The messages a server comm should have received, in order. */
#define MAX_FRAMES 4
struct want {
	size_t nf, lens[MAX_FRAMES];
	unsigned seed;
};

struct wants {
	struct want *w;
	size_t n, cap;
};

static void want_add(struct wants *ws, const size_t *lens, size_t nf, unsigned seed)
{
	ck_assert_uint_le(nf, MAX_FRAMES);
	if (ws->n == ws->cap) {
		ws->cap = ws->cap ? 2 * ws->cap : 64;
		ws->w = realloc(ws->w, ws->cap * sizeof(*ws->w));
		ck_assert_ptr_nonnull(ws->w);
	}
	ws->w[ws->n].nf = nf;
	memcpy(ws->w[ws->n].lens, lens, nf * sizeof(*lens));
	ws->w[ws->n].seed = seed;
	ws->n++;
}

/* Append a message to the wire bytes and to what should arrive. */
static void put(struct ra_buf *b, struct wants *ws, const size_t *lens, size_t nf, unsigned seed)
{
	ra_put_msg(b, lens, nf, seed);
	want_add(ws, lens, nf, seed);
}

/* Small message shapes: 1..3 frames of 0..60 bytes (empty ones too). */
static size_t small_shape(unsigned i, size_t *lens)
{
	size_t nf = 1 + i % 3;
	for (size_t k = 0; k < nf; k++)
		lens[k] = (i * 7 + k * 13) % 61;
	return nf;
}

/* Wait until the server comm has every wanted message, then check them
 * all, in order, byte for byte. */
static void expect_all(struct ra_peer *p, const struct wants *ws, const char *what)
{
	struct tu_peer *sp = p->sp;
	ck_assert_msg(tu_wait_count(p->h, &sp->nmsgs, ws->n, TU_WAIT_MS),
		      "%s: %zu of %zu messages (closed %d: %s)", what, sp->nmsgs, ws->n, sp->closed,
		      sp->last_error);
	ck_assert_msg(sp->nmsgs == ws->n && sp->nkept == ws->n, "%s: %zu messages, want %zu", what,
		      sp->nmsgs, ws->n);
	for (size_t i = 0; i < ws->n; i++)
		ck_assert_msg(
			ts_msg_matches(sp->msgs[i], ws->w[i].lens, ws->w[i].nf, ws->w[i].seed),
			"%s: message %zu differs", what, i);
}

/* Send one message and wait until it was delivered (request/response:
 * the socket is drained between messages, which is when read-ahead is
 * offered). */
static void paced(struct ra_peer *p, struct wants *ws, const size_t *lens, size_t nf, unsigned seed)
{
	struct ra_buf b = {0};
	put(&b, ws, lens, nf, seed);
	ra_send(p, b.p, b.len);
	ck_assert_msg(tu_wait_count(p->h, &p->sp->nmsgs, ws->n, TU_WAIT_MS),
		      "paced message %zu not delivered (closed %d: %s)", ws->n, p->sp->closed,
		      p->sp->last_error);
	ra_buf_free(&b);
}

/* A run of n small messages, paced: read-ahead is on after two. */
static void paced_run(struct ra_peer *p, struct wants *ws, size_t n, size_t len, unsigned seed)
{
	for (size_t i = 0; i < n; i++) {
		size_t lens[] = {len};
		paced(p, ws, lens, 1, seed + (unsigned)i);
	}
}

static void good_check(struct ra_env *e)
{
	size_t lens[] = {10, 100000};
	struct tu_peer *gs = e->good_srv;
	size_t n0;
	if (e->good == NULL)
		return;
	n0 = gs->nmsgs;
	ck_assert_int_eq(tw_comm_write(e->good->comm, ts_msg_pattern(lens, 2, ++e->seed)), 0);
	ck_assert_msg(tu_wait_count(e->h, &gs->nmsgs, n0 + 1, TU_WAIT_MS), "good comm stalled");
	ck_assert(ts_msg_matches(gs->msgs[gs->nkept - 1], lens, 2, e->seed));
	ck_assert_int_eq(e->good->closed, 0);
	ck_assert_int_eq(gs->closed, 0);
}

/* The peer closes; the server comm ends cleanly with everything read. */
static void end_clean(struct ra_peer *p, const struct wants *ws, const char *what)
{
	ra_close(p);
	ck_assert_msg(tu_wait_flag(p->h, &p->sp->closed, TU_WAIT_MS), "%s: not closed", what);
	ck_assert_msg(p->sp->close_err == 0, "%s: %s (%s)", what, tw_strerror(p->sp->close_err),
		      p->sp->last_error);
	ck_assert_uint_eq(p->sp->nmsgs, ws->n);
}

static void wants_free(struct wants *ws)
{
	free(ws->w);
	memset(ws, 0, sizeof(*ws));
}

/* (a) */
void ra_pipelined(struct ra_env *e)
{
	for (int run = 0; run < 3; run++) {
		struct ra_peer p;
		struct wants ws = {0};
		struct ra_buf b = {0};
		uint64_t c0, c1;
		size_t lens[MAX_FRAMES], nf, nsent = 0;
		open_peer(e, &p);
		/* run 0: straight away; 1: after a paced run (read-ahead on);
		 * 2: after a run, with a large message in the middle */
		if (run > 0)
			paced_run(&p, &ws, 3, 28, e->seed += 10);
		for (unsigned i = 0; i < 1000; i++) {
			if (run == 2 && i == 500) {
				size_t big[] = {5, 200000};
				put(&b, &ws, big, 2, e->seed + 5000);
			} else {
				nf = small_shape(i, lens);
				put(&b, &ws, lens, nf, e->seed + i);
			}
			nsent++;
		}
		c0 = copied_now();
		ra_send(&p, b.p, b.len);
		expect_all(&p, &ws, "pipelined");
		c1 = copied_now();
		ck_assert_msg(c1 - c0 <= (e->peeks ? 0 : nsent * RA_GULP_MAX),
			      "pipelined run %d: %llu bytes copied", run,
			      (unsigned long long)(c1 - c0));
		if (getenv("TU_VERBOSE") != NULL)
			fprintf(stderr, "pipelined run %d: %llu bytes copied for %zu messages\n",
				run, (unsigned long long)(c1 - c0), nsent);
		end_clean(&p, &ws, "pipelined");
		ra_buf_free(&b);
		wants_free(&ws);
		good_check(e);
	}
}

/* The large message's big frame got an exact-size block of its own. */
static void check_large_placed(struct tu_peer *sp, size_t idx, size_t large)
{
	const tw_slice *f = tw_msg_frame(sp->msgs[idx], 1);
	ck_assert_ptr_nonnull(f->block);
	ck_assert_uint_eq(tw_block_size(f->block), large);
	ck_assert_uint_eq(f->offset, 0);
}

/* (b) */
void ra_runs_then_large(struct ra_env *e, size_t large)
{
	size_t big[] = {3, large};
	struct ra_peer p;
	struct wants ws = {0};
	uint64_t c0, c1;
	open_peer(e, &p);
	/* paced runs of 0..5 small messages of various sizes, then the large
	 * one; after two small ones its head is read with a read-ahead block,
	 * which takes its first bytes: those are copied (and no more than
	 * the block), the rest lands in place; a transport that peeks takes
	 * none of it ahead, and copies nothing */
	for (size_t r = 0; r <= 5; r++) {
		for (size_t k = 0; k < r; k++) {
			size_t lens[] = {28 + 800 * k};
			paced(&p, &ws, lens, 1, e->seed + (unsigned)(100 * r + k));
		}
		c0 = copied_now();
		paced(&p, &ws, big, 2, e->seed + 1000 + (unsigned)r);
		c1 = copied_now();
		ck_assert_msg(c1 - c0 <= (e->peeks ? 0 : RA_GULP_MAX),
			      "run %zu: large message copied %llu", r,
			      (unsigned long long)(c1 - c0));
		if (r >= 2 && !e->peeks)
			ck_assert_msg(c1 - c0 > 0,
				      "run %zu: no read-ahead before the large message", r);
		else
			ck_assert_msg(c1 - c0 == 0, "run %zu: copied %llu without read-ahead", r,
				      (unsigned long long)(c1 - c0));
		check_large_placed(p.sp, ws.n - 1, large);
	}
	/* a large message right after a large one: nothing copied */
	c0 = copied_now();
	paced(&p, &ws, big, 2, e->seed + 2000);
	ck_assert_uint_eq(copied_now() - c0, 0);
	check_large_placed(p.sp, ws.n - 1, large);
	/* the same shapes in one write: [run][large][run], twice */
	for (size_t r = 0; r <= 5; r++) {
		struct ra_buf b = {0};
		paced_run(&p, &ws, 3, 40, e->seed + 3000);
		for (size_t k = 0; k < r; k++) {
			size_t lens[] = {28 + 800 * k};
			put(&b, &ws, lens, 1, e->seed + 4000 + (unsigned)k);
		}
		put(&b, &ws, big, 2, e->seed + 5000 + (unsigned)r);
		for (size_t k = 0; k < 3; k++) {
			size_t lens[] = {17 * k};
			put(&b, &ws, lens, 1, e->seed + 6000 + (unsigned)k);
		}
		c0 = copied_now();
		ra_send(&p, b.p, b.len);
		expect_all(&p, &ws, "run, large, run in one write");
		c1 = copied_now();
		ck_assert_msg(c1 - c0 <= (e->peeks ? 0 : (r + 4) * RA_GULP_MAX),
			      "one write, run %zu: copied %llu", r, (unsigned long long)(c1 - c0));
		check_large_placed(p.sp, ws.n - 4, large);
		ra_buf_free(&b);
	}
	expect_all(&p, &ws, "runs then large");
	end_clean(&p, &ws, "runs then large");
	wants_free(&ws);
	good_check(e);
}

/* (c) */
struct bad_head {
	const char *name;
	uint64_t w[4];
	size_t nw, pad; /* words, then pad zero bytes */
	int err;
};

static const struct bad_head bad_heads[] = {
	{"total above the limit", {UINT64_C(1) << 40, 1, 0}, 3, 0, TW_ETOOBIG},
	{"total above the limit, alone", {UINT64_C(1) << 40}, 1, 0, TW_ETOOBIG},
	{"N = 0", {16, 0, 0}, 3, 0, TW_ENOFRAMES},
	{"N = 0, head alone", {8, 0}, 2, 0, TW_ENOFRAMES},
	{"N above the limit", {8 + 8 * 70000, 70000}, 2, 0, TW_ETOOMANY},
	{"total below 8", {7, 1}, 2, 0, TW_ELENGTH},
	{"small message, lengths short of total", {8 + 16 + 10, 2, 3, 4}, 4, 10, TW_ELENGTH},
};

static void bad_head_case(struct ra_env *e, const struct bad_head *c, size_t k, size_t junk)
{
	struct ra_peer p;
	struct wants ws = {0};
	struct ra_buf b = {0};
	struct tu_peer *sp;
	static const uint8_t zeros[128];
	char what[160];
	snprintf(what, sizeof(what), "%s after %zu good, %zu junk", c->name, k, junk);
	open_peer(e, &p);
	sp = p.sp;
	paced_run(&p, &ws, 3, 28, e->seed += 10);
	for (size_t i = 0; i < k; i++) {
		size_t lens[] = {i % 2 ? 1 : 28};
		put(&b, &ws, lens, 1, e->seed + 100 + (unsigned)i);
	}
	ra_put_u64(&b, c->w, c->nw);
	memcpy(buf_room(&b, c->pad), zeros, c->pad);
	memcpy(buf_room(&b, junk), zeros, junk);
	ra_send(&p, b.p, b.len);
	ck_assert_msg(tu_wait_flag(e->h, &sp->closed, TU_WAIT_MS), "%s: comm not closed", what);
	ck_assert_msg(sp->close_err == c->err, "%s: %s, want %s (%s)", what,
		      tw_strerror(sp->close_err), tw_strerror(c->err), sp->last_error);
	ck_assert_msg(strlen(sp->last_error) > 0, "%s: no error text", what);
	if (getenv("TU_VERBOSE") != NULL)
		fprintf(stderr, "%s: %s\n", what, sp->last_error);
	ck_assert_msg(sp->nmsgs_at_close == ws.n, "%s: %zu delivered before the close, want %zu",
		      what, sp->nmsgs_at_close, ws.n);
	expect_all(&p, &ws, what);
	ck_assert_msg(tu_raw_wait_closed(e->h, p.fd, TU_WAIT_MS), "%s: raw peer not closed", what);
	ra_close(&p);
	ra_buf_free(&b);
	wants_free(&ws);
	good_check(e);
}

void ra_bad_heads(struct ra_env *e)
{
	static const size_t goods[] = {0, 1, 3};
	for (size_t i = 0; i < sizeof(bad_heads) / sizeof(bad_heads[0]); i++)
		for (size_t g = 0; g < 3; g++) {
			bad_head_case(e, &bad_heads[i], goods[g], 0);
			bad_head_case(e, &bad_heads[i], goods[g], 100);
		}
}

/* Read-ahead bytes pending. A run of three 250-byte bodies makes the
 * read-ahead block 256 bytes; then ten 25-byte messages in one write:
 * the read of the first one's head takes all of them (16 + 234 bytes),
 * so the other nine wait in the receiver, not in the socket. The action
 * runs when the first of the ten is delivered. */
enum ra_action {
	ACT_NONE,
	ACT_PAUSE,      /* pause; the test resumes later */
	ACT_PAUSE_EACH, /* pause and resume inside every callback */
	ACT_CLOSE,      /* tw_comm_close */
	ACT_FREE,       /* tw_comm_free */
	ACT_ABORT,      /* tw_comm_abort */
};

struct pend {
	enum ra_action act;
	size_t at; /* nmsgs when it runs */
};

static void on_pending_recv(struct tu_peer *sp, tw_msg *m)
{
	struct pend *pd = sp->user;
	(void)m;
	if (pd->act == ACT_PAUSE_EACH) {
		tw_comm_pause(sp->comm);
		tw_comm_resume(sp->comm);
		return;
	}
	if (sp->nmsgs != pd->at)
		return;
	switch (pd->act) {
	case ACT_PAUSE: tw_comm_pause(sp->comm); break;
	case ACT_CLOSE: tw_comm_close(sp->comm); break;
	case ACT_FREE:
		tw_comm_free(sp->comm);
		sp->comm = NULL;
		break;
	case ACT_ABORT: tw_comm_abort(sp->comm); break;
	default: break;
	}
}

enum ra_after {
	AFTER_NOTHING,
	AFTER_MORE, /* while paused, the peer sends another message */
	AFTER_EOF,  /* while paused (or at once), the peer half-closes */
	AFTER_CUT,  /* the last message is cut short, then EOF */
};

static void pending_case(struct ra_env *e, enum ra_action act, enum ra_after after)
{
	struct ra_peer p;
	struct wants ws = {0};
	struct ra_buf b = {0};
	struct pend pd;
	struct tu_peer *sp;
	size_t tiny[] = {1};
	char what[64];
	snprintf(what, sizeof(what), "pending: action %d, then %d", (int)act, (int)after);
	open_peer(e, &p);
	sp = p.sp;
	paced_run(&p, &ws, 3, 242, e->seed += 20);
	pd.act = act;
	pd.at = ws.n + 1;
	sp->user = &pd;
	sp->on_recv = on_pending_recv;
	for (unsigned i = 0; i < 10; i++)
		put(&b, &ws, tiny, 1, e->seed + i);
	if (after == AFTER_CUT) {
		b.len -= 10; /* the last one is cut short */
		ws.n--;
	}
	ra_send(&p, b.p, b.len);
	if (after == AFTER_EOF && act != ACT_PAUSE)
		ra_shutdown(&p);
	if (after == AFTER_CUT)
		ra_shutdown(&p);
	switch (act) {
	case ACT_PAUSE:
		ck_assert(tu_wait_count(e->h, &sp->nmsgs, pd.at, TU_WAIT_MS));
		tu_run_for(e->h, 200);
		ck_assert_msg(sp->nmsgs == pd.at, "%s: %zu delivered while paused", what,
			      sp->nmsgs - pd.at);
		if (after == AFTER_MORE) {
			struct ra_buf more = {0};
			put(&more, &ws, tiny, 1, e->seed + 10);
			ra_send(&p, more.p, more.len);
			ra_buf_free(&more);
		} else if (after == AFTER_EOF) {
			ra_shutdown(&p);
		}
		tu_run_for(e->h, 200);
		ck_assert_msg(sp->nmsgs == pd.at, "%s: %zu delivered while paused", what,
			      sp->nmsgs - pd.at);
		ck_assert_int_eq(sp->closed, 0);
		tw_comm_resume(sp->comm);
		/* the nine read ahead come at once: nothing else wakes the
		 * loop for them */
		ck_assert_msg(tu_wait_count(e->h, &sp->nmsgs, ws.n, STALL_MS),
			      "%s: stalled at %zu of %zu messages after resume", what, sp->nmsgs,
			      ws.n);
		break;
	case ACT_NONE:
	case ACT_PAUSE_EACH:
		ck_assert_msg(tu_wait_count(e->h, &sp->nmsgs, ws.n, STALL_MS),
			      "%s: stalled at %zu of %zu messages", what, sp->nmsgs, ws.n);
		break;
	case ACT_CLOSE:
	case ACT_FREE:
	case ACT_ABORT:
		ck_assert(tu_wait_count(e->h, &sp->nmsgs, pd.at, TU_WAIT_MS));
		tu_run_for(e->h, 100);
		ck_assert_msg(sp->nmsgs == pd.at, "%s: %zu delivered after the close", what,
			      sp->nmsgs - pd.at);
		ws.n = pd.at;
		break;
	}
	expect_all(&p, &ws, what);
	if (act == ACT_FREE) {
		ck_assert_ptr_null(sp->comm);
		ck_assert_int_eq(sp->closed, 0);
	} else if (act == ACT_CLOSE || act == ACT_ABORT) {
		if (act == ACT_CLOSE)
			ra_close(&p); /* the close waits for our EOF */
		ck_assert_msg(tu_wait_flag(e->h, &sp->closed, TU_WAIT_MS), "%s: not closed", what);
		ck_assert_msg(sp->close_err == (act == ACT_CLOSE ? 0 : TW_ECANCELED), "%s: %s (%s)",
			      what, tw_strerror(sp->close_err), sp->last_error);
	} else if (after == AFTER_EOF || after == AFTER_CUT) {
		ck_assert_msg(tu_wait_flag(e->h, &sp->closed, TU_WAIT_MS), "%s: not closed", what);
		ck_assert_msg(sp->close_err == (after == AFTER_CUT ? TW_ETRUNCATED : 0),
			      "%s: %s (%s)", what, tw_strerror(sp->close_err), sp->last_error);
		ck_assert_uint_eq(sp->nmsgs_at_close, ws.n);
	} else {
		end_clean(&p, &ws, what);
	}
	ra_close(&p);
	ra_buf_free(&b);
	wants_free(&ws);
	good_check(e);
}

void ra_pending(struct ra_env *e)
{
	pending_case(e, ACT_NONE, AFTER_NOTHING);
	pending_case(e, ACT_PAUSE, AFTER_NOTHING);
	pending_case(e, ACT_PAUSE, AFTER_MORE);
	pending_case(e, ACT_PAUSE, AFTER_EOF);
	pending_case(e, ACT_PAUSE_EACH, AFTER_NOTHING);
	pending_case(e, ACT_NONE, AFTER_EOF);
	pending_case(e, ACT_NONE, AFTER_CUT);
	pending_case(e, ACT_CLOSE, AFTER_NOTHING);
	pending_case(e, ACT_FREE, AFTER_NOTHING);
	pending_case(e, ACT_ABORT, AFTER_NOTHING);
}

/* The per-wakeup read limit (stream_comm.c READ_CALLS, 256) reached with
 * read-ahead bytes pending and nothing left in the socket: after a run of
 * 24-byte bodies (read-ahead 64 bytes), a write of N 40-byte messages
 * (after one whose body is exactly 64 bytes, or not) is read two messages
 * a read: one read, one replay of the carry. For some N the last read of
 * a wakeup leaves the last message in the carry; the loop must come back
 * for it although the socket will not signal. */
void ra_read_calls(struct ra_env *e)
{
	for (unsigned n = 250; n <= 262; n++)
		for (int lead = 0; lead < 2; lead++) {
			struct ra_peer p;
			struct wants ws = {0};
			struct ra_buf b = {0};
			size_t sixteen[] = {16}, block[] = {56};
			open_peer(e, &p);
			paced_run(&p, &ws, 3, 16, e->seed += 10);
			if (lead)
				put(&b, &ws, block, 1, e->seed + 100);
			for (unsigned i = 0; i < n; i++)
				put(&b, &ws, sixteen, 1, e->seed + 200 + i);
			ra_send(&p, b.p, b.len);
			ck_assert_msg(tu_wait_count(e->h, &p.sp->nmsgs, ws.n, STALL_MS),
				      "n %u lead %d: stalled at %zu of %zu", n, lead, p.sp->nmsgs,
				      ws.n);
			expect_all(&p, &ws, "read calls");
			end_clean(&p, &ws, "read calls");
			ra_buf_free(&b);
			wants_free(&ws);
		}
	good_check(e);
}

/* Soak: a random stream (mostly small messages, some medium, a few
 * large) written in random pieces, sometimes one message at a time and
 * waiting for it (read-ahead on), sometimes cut anywhere; the server comm
 * pauses in some callbacks (resumed later from outside, or at once). All
 * messages arrive in order, byte for byte, with no stall. */
struct soak {
	uint64_t rnd;
	int paused;
};

static unsigned soak_rnd(struct soak *st, unsigned n)
{
	st->rnd = st->rnd * UINT64_C(6364136223846793005) + UINT64_C(1442695040888963407);
	return (unsigned)(st->rnd >> 33) % n;
}

static void on_soak_recv(struct tu_peer *sp, tw_msg *m)
{
	struct soak *st = sp->user;
	unsigned r = soak_rnd(st, 8);
	(void)m;
	if (r == 0) {
		tw_comm_pause(sp->comm);
		st->paused = 1;
	} else if (r == 1) {
		tw_comm_pause(sp->comm);
		tw_comm_resume(sp->comm);
	}
}

static void soak_resume(struct ra_peer *p, struct soak *st)
{
	if (st->paused) {
		st->paused = 0;
		tw_comm_resume(p->sp->comm);
	}
}

/* Run the loop until the server comm delivered n messages, resuming it
 * when the soak paused it; fails after STALL_MS without any progress. */
static void soak_wait(struct ra_peer *p, struct soak *st, size_t n)
{
	long long deadline = ts_now_ms() + STALL_MS;
	uint64_t seen = ts_progress();
	while (p->sp->nmsgs < n) {
		uint64_t io = ts_progress();
		if (io != seen) {
			seen = io;
			deadline = ts_now_ms() + STALL_MS;
		}
		ck_assert_msg(ts_now_ms() < deadline, "soak: stalled at %zu of %zu", p->sp->nmsgs,
			      n);
		soak_resume(p, st);
		event_base_loop(p->h->base, EVLOOP_NONBLOCK);
	}
}

void ra_soak(struct ra_env *e, unsigned nmsgs)
{
	struct ra_peer p;
	struct wants ws = {0};
	struct ra_buf b = {0};
	struct soak st = {0x50a6 + e->seed, 0};
	size_t *ends = calloc(nmsgs, sizeof(*ends)), sent = 0, nsent = 0;
	uint64_t c0 = copied_now(), c1;
	open_peer(e, &p);
	p.sp->user = &st;
	p.sp->on_recv = on_soak_recv;
	for (unsigned i = 0; i < nmsgs; i++) {
		size_t lens[MAX_FRAMES], nf;
		unsigned kind = soak_rnd(&st, 100);
		if (kind < 80) {
			nf = 1 + soak_rnd(&st, 3);
			for (size_t k = 0; k < nf; k++)
				lens[k] = soak_rnd(&st, 4) == 0 ? 0 : soak_rnd(&st, 300);
		} else if (kind < 96) {
			nf = 1;
			lens[0] = 4000 + soak_rnd(&st, 70000);
		} else {
			nf = 2;
			lens[0] = 3;
			lens[1] = 100000 + soak_rnd(&st, 1000000);
		}
		put(&b, &ws, lens, nf, e->seed + i);
		ends[i] = b.len;
	}
	while (sent < b.len) {
		unsigned how = soak_rnd(&st, 4);
		size_t end;
		if (how == 0) { /* one message, then wait for it (request/response) */
			end = ends[nsent];
		} else if (how == 1) { /* a few messages */
			size_t k = nsent + soak_rnd(&st, 8);
			end = ends[k < nmsgs ? k : nmsgs - 1];
		} else { /* cut anywhere */
			end = sent + 1 + soak_rnd(&st, 20000);
			if (end > b.len)
				end = b.len;
		}
		ra_send(&p, b.p + sent, end - sent);
		sent = end;
		while (nsent < nmsgs && ends[nsent] <= sent)
			nsent++;
		if (how == 0) {
			soak_wait(&p, &st, nsent); /* delivered before the next write */
		} else {
			event_base_loop(e->h->base, EVLOOP_NONBLOCK);
			if (soak_rnd(&st, 2) == 0)
				soak_resume(&p, &st);
		}
		ck_assert_int_eq(p.sp->closed, 0);
	}
	soak_wait(&p, &st, nmsgs);
	p.sp->on_recv = NULL;
	soak_resume(&p, &st);
	expect_all(&p, &ws, "soak");
	c1 = copied_now();
	ck_assert_msg(c1 - c0 <= (e->peeks ? 0 : (uint64_t)nmsgs * RA_GULP_MAX),
		      "soak: copied %llu", (unsigned long long)(c1 - c0));
	if (getenv("TU_VERBOSE") != NULL)
		fprintf(stderr, "soak: %u messages, %zu bytes, %llu copied\n", nmsgs, b.len,
			(unsigned long long)(c1 - c0));
	end_clean(&p, &ws, "soak");
	free(ends);
	ra_buf_free(&b);
	wants_free(&ws);
	good_check(e);
}

/* Listeners. */

static void keep_peer(struct tu *h, tw_comm *c)
{
	struct tu_peer *p = tu_peer_new(h);
	ck_assert_uint_lt(h->nsrv, TU_MAX_SERVER_COMMS);
	p->keep = 1;
	ck_assert_int_eq(tu_peer_start(p, c), 0);
	h->srv[h->nsrv++] = p;
}

static void on_handshake(tw_comm *c, int err, const tw_handshake_info *info, void *arg)
{
	(void)info;
	if (err != 0) {
		tw_comm_free(c);
		return;
	}
	keep_peer(arg, c);
}

struct listen_arg {
	struct tu *h;
	int dask;
};

static void on_accept(tw_listener *l, tw_comm *c, void *arg)
{
	struct listen_arg *la = arg;
	(void)l;
	if (la->dask)
		ck_assert_int_eq(tw_comm_handshake(c, TW_HANDSHAKE_LISTENER, on_handshake, la->h),
				 0);
	else
		keep_peer(la->h, c);
}

void ra_listen(struct tu *h, const char *uri, int dask)
{
	static struct listen_arg la[2];
	la[dask != 0] = (struct listen_arg){h, dask != 0};
	/* bad_heads' "N above the limit" sends 70,000 frames (the default
	 * now follows the byte limit) */
	ck_assert_int_eq(tw_context_set_max_frames(h->ctx, 65536), 0);
	ck_assert_int_eq(tu_tw_listen(h->ctx, uri, on_accept, &la[dask != 0], &h->lis), 0);
	ck_assert_int_eq(tw_listener_address(h->lis, h->addr, sizeof(h->addr)), 0);
}

/* The Dask handshake of a client, as bytes: {"compression": nil,
 * "python": [3, 11, 2], "pickle-protocol": 5}. */
static void put_handshake(struct ra_buf *b)
{
	static const uint8_t map[] = "\x83\xab"
				     "compression"
				     "\xc0\xa6"
				     "python"
				     "\x93\x03\x0b\x02\xaf"
				     "pickle-protocol"
				     "\x05";
	uint64_t w[] = {8 + 8 + sizeof(map) - 1, 1, sizeof(map) - 1};
	ra_put_u64(b, w, 3);
	memcpy(buf_room(b, sizeof(map) - 1), map, sizeof(map) - 1);
}

/* Connect, read the listener's handshake, and send ours followed by
 * `after` in the same write. */
static void open_dask(struct ra_env *e, struct ra_peer *p, struct ra_buf *after)
{
	struct ra_buf b = {0};
	uint64_t total;
	uint8_t *rest;
	size_t idx = e->h->nsrv;
	e->open(e->h, p); /* its server comm appears after the handshake */
	ck_assert(ra_recv(p, &total, 8));
	total = le64toh(total);
	ck_assert_uint_lt(total, 4096);
	rest = malloc(total);
	ck_assert(ra_recv(p, rest, total));
	free(rest);
	put_handshake(&b);
	if (after != NULL)
		memcpy(buf_room(&b, after->len), after->p, after->len);
	ra_send(p, b.p, b.len);
	ra_buf_free(&b);
	p->sp = tu_server_peer(e->h, idx);
	ck_assert_ptr_nonnull(p->sp);
}

void ra_after_handshake(struct ra_env *e, size_t large)
{
	size_t big[] = {3, large};
	for (int v = 0; v < 4; v++) {
		struct ra_peer p;
		struct wants ws = {0};
		struct ra_buf b = {0};
		uint64_t c0 = copied_now(), c1;
		if (v == 0) {
			/* the large message in the handshake's write */
			put(&b, &ws, big, 2, e->seed + 1);
			open_dask(e, &p, &b);
		} else if (v == 1) {
			/* right after the handshake, in a write of its own */
			open_dask(e, &p, NULL);
			tu_run_for(e->h, 50);
			put(&b, &ws, big, 2, e->seed + 2);
			ra_send(&p, b.p, b.len);
		} else if (v == 2) {
			/* after a pipelined run of small ones */
			for (unsigned i = 0; i < 5; i++) {
				size_t lens[] = {20 + i};
				put(&b, &ws, lens, 1, e->seed + 10 + i);
			}
			put(&b, &ws, big, 2, e->seed + 3);
			open_dask(e, &p, &b);
		} else {
			/* after a paced run: read-ahead takes its first bytes */
			open_dask(e, &p, NULL);
			paced_run(&p, &ws, 3, 28, e->seed + 20);
			c0 = copied_now();
			put(&b, &ws, big, 2, e->seed + 4);
			ra_send(&p, b.p, b.len);
		}
		expect_all(&p, &ws, "after the handshake");
		c1 = copied_now();
		check_large_placed(p.sp, ws.n - 1, large);
		if (v < 2 || e->peeks)
			ck_assert_msg(c1 - c0 == 0, "variant %d: copied %llu", v,
				      (unsigned long long)(c1 - c0));
		else if (v == 2)
			ck_assert_msg(c1 - c0 <= 6 * RA_GULP_MAX, "variant %d: copied %llu", v,
				      (unsigned long long)(c1 - c0));
		else
			ck_assert_msg(c1 - c0 > 0 && c1 - c0 <= RA_GULP_MAX,
				      "variant %d: copied %llu", v, (unsigned long long)(c1 - c0));
		end_clean(&p, &ws, "after the handshake");
		ra_buf_free(&b);
		wants_free(&ws);
	}
}

void ra_env_init(struct ra_env *e, struct tu *h, ra_open_fn open, unsigned seed,
		 unsigned soak_rounds)
{
	memset(e, 0, sizeof(*e));
	e->h = h;
	e->open = open;
	e->seed = seed;
	e->soak_rounds = soak_rounds;
}

/* The large message: 5 MiB, or 1 MiB with TW_TEST_QUICK (valgrind: the
 * 17 of them were most of these cases' time over tls). Either is far past
 * the map threshold (TW__MAP_MIN_BYTES, 256 KiB: a block of its own),
 * RA_GULP_MAX and a socket's or a TLS record's worth, which is what the
 * cases check: nothing of it copied but what read-ahead took. */
static size_t large_bytes(void)
{
	return ts_quick() ? (size_t)1 << 20 : (size_t)5 << 20;
}

static void runs_then_large(struct ra_env *e)
{
	ra_runs_then_large(e, large_bytes());
}

static void after_handshake(struct ra_env *e)
{
	ra_after_handshake(e, large_bytes());
}

static void soak(struct ra_env *e)
{
	for (unsigned i = 0; i < (ts_quick() ? 2u : e->soak_rounds); i++) {
		e->seed += 1000;
		ra_soak(e, 400);
	}
}

const struct ra_case ra_cases[RA_NCASES] = {
	/* (a) 1,000 small messages in one write, with and without read-ahead
	 * on when they come, and with a large one among them */
	{ra_pipelined, 0},
	/* (b) runs of small messages, then a large message whose first frame
	 * is tiny: at most 4096 bytes copied for it, and only when a run of
	 * two or more came before it; its large frame has a block of its own */
	{runs_then_large, 0},
	/* (c) a run, then good messages and a bad head in one write: the good
	 * ones are delivered in order, the comm ends with the head's own
	 * code, the other comm carries on */
	{ra_bad_heads, 0},
	/* messages read ahead and waiting in the receiver when the comm is
	 * paused and resumed, closed, freed or aborted, or at the peer's EOF */
	{ra_pending, 0},
	/* a large message right after the Dask handshake: nothing copied */
	{after_handshake, 1},
	/* the per-wakeup read limit reached with read-ahead bytes pending */
	{ra_read_calls, 0},
	/* a random stream in random writes, the comm pausing now and then */
	{soak, 0},
};
