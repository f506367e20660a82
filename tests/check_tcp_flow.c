/* SPDX-License-Identifier: BSD-3-Clause */
/* Retention of large frames, backpressure, a context on its own loop
 * thread, read-ahead from a raw peer (tests/support/readahead.h). */
#include <linux/sockios.h>
#include <linux/tcp.h>
#include <netinet/in.h>
#include <poll.h>
#include <stddef.h>
#include <sys/ioctl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/mman.h>
#include <time.h>

#include <check.h>
#include <event2/event.h>

#include "core/msg.h"
#include "core/reclaim.h"
#include "tests/check_tcp.h"
#include "tests/support/readahead.h"
#include "tests/support/harness.h"
#include "tests/support/suite.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)
#define GiB ((size_t)1 << 30)

/* Retention: a kept 10-byte frame must not pin its 1 GiB neighbour. */
static tw_slice kept;
static tw_stats in_cb;
static uint64_t rss_in_cb;
static int big_ok;

static void keep_small(struct tu_peer *p, tw_msg *m)
{
	const tw_slice *f = tw_msg_frame(m, 0), *big = tw_msg_frame(m, 1);
	(void)p;
	kept = *f;
	tw_block_hold(kept.block);
	tw_stats_global(&in_cb, sizeof(in_cb));
	rss_in_cb = tu_rss_bytes();
	big_ok = big != NULL && ts_check(tw_slice_data(big), big->len, 2) == -1;
}

static void unmap_release(void *data, void *arg)
{
	munmap(data, *(size_t *)arg);
}

START_TEST(retention)
{
	struct tu h;
	struct tu_peer *cli, *srv;
	static uint8_t small[10];
	static size_t big_len;
	uint8_t *big;
	tw_msg *m;
	tw_stats g0, g1;
	uint64_t rss_after;
	big_len = ts_quick() ? 64 * MiB : GiB;
	tw_block_cache_set_limit(0); /* released blocks go back to the OS at once */
	tu_init(&h);
	h.sopts.echo = 0;
	ck_assert_int_eq(tu_listen(&h, "tcp://127.0.0.1:0"), 0);
	ck_assert_int_eq(tu_connect(&h, h.addr, &cli), 0);
	ck_assert_ptr_nonnull(srv = tu_server_peer(&h, 0));
	srv->on_recv = keep_small;
	/* the sender's memory is the application's own (not a taskwire block) */
	big = mmap(NULL, big_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	ck_assert(big != MAP_FAILED);
	ts_fill(small, sizeof(small), 1);
	ts_fill(big, big_len, 2);
	ck_assert_int_eq(tw_msg_new(&m), 0);
	ck_assert_int_eq(tw_msg_append_ref(m, small, sizeof(small), NULL, NULL), 0);
	ck_assert_int_eq(tw_msg_append_ref(m, big, big_len, unmap_release, &big_len), 0);
	tw_stats_global(&g0, sizeof(g0));
	ck_assert_int_eq(tw_comm_write(cli->comm, m), 0);
	ck_assert(tu_wait_count(&h, &srv->nmsgs, 1, 60000));
	tw_stats_global(&g1, sizeof(g1));
	tw__reclaim_wait(); /* large blocks are unmapped on the reclaimer thread */
	rss_after = tu_rss_bytes();
	ck_assert(big_ok);
	/* while the message was alive it held the big block ... */
	ck_assert_uint_ge(in_cb.block_bytes_live - g0.block_bytes_live, big_len);
	/* ... and once it was freed only the small frame's block is left */
	ck_assert_uint_ge(in_cb.block_bytes_live - g1.block_bytes_live, big_len);
	ck_assert_uint_lt(g1.block_bytes_live - g0.block_bytes_live, 64 * KiB);
	ck_assert_uint_lt(tw_block_size(kept.block), 64 * KiB);
	ck_assert_uint_eq(kept.len, sizeof(small));
	ck_assert_int_eq(ts_check(tw_slice_data(&kept), kept.len, 1), -1);
	ck_assert_msg(rss_in_cb - rss_after >= big_len - big_len / 8, "RSS dropped by %llu only",
		      (unsigned long long)(rss_in_cb - rss_after));
	tw_block_free(kept.block);
	tu_fini(&h);
	tw_block_cache_set_limit(256 * MiB);
}
END_TEST

/* Backpressure: a peer that does not read; writes are refused with
 * TW_EAGAIN at the high-water mark, nothing is lost; once the peer reads,
 * the drain callback runs and every message arrives in order. */
#define HWM       (256 * KiB)
#define MSG_BYTES (64 * KiB)

static tw_msg *seq_msg(size_t i)
{
	size_t len = MSG_BYTES;
	return ts_msg_pattern(&len, 1, (unsigned)i);
}

static int drains_above(void *arg)
{
	struct tu_peer *p = ((struct tu_peer **)arg)[0];
	return p->drains > *(int *)((struct tu_peer **)arg)[1];
}

/* Write until refused; returns the refused message (still ours). */
static tw_msg *write_until_refused(struct tu_peer *cli, tw_msg *next, size_t *sent)
{
	int rv;
	for (;;) {
		if (next == NULL)
			next = seq_msg(*sent);
		if ((rv = tw_comm_write(cli->comm, next)) != 0)
			break;
		(*sent)++;
		next = NULL;
	}
	ck_assert_int_eq(rv, TW_EAGAIN);
	/* the mark counts each message's bookkeeping too (under 512 bytes) */
	ck_assert_uint_ge(tw_comm_queued_bytes(cli->comm) + (HWM / MSG_BYTES + 1) * 512, HWM);
	ck_assert_uint_le(tw_comm_queued_bytes(cli->comm), HWM + MSG_BYTES + 24);
	return next;
}

/* The client comm's socket: the test's one connection to the listener's
 * port (addr "tcp://127.0.0.1:PORT"). */
static int fd_connected_to(const char *addr)
{
	unsigned port = (unsigned)atoi(strrchr(addr, ':') + 1);
	int fd;
	for (fd = 3; fd < 1024; fd++) {
		struct sockaddr_in sa;
		socklen_t len = sizeof(sa);
		if (getpeername(fd, (struct sockaddr *)&sa, &len) == 0 &&
		    sa.sin_family == AF_INET && ntohs(sa.sin_port) == port)
			break;
	}
	ck_assert_msg(fd < 1024, "no socket connected to %s", addr);
	return fd;
}

/* The kernel takes nothing more until the peer reads: our send buffer is
 * full and the peer's receive window is closed (TCP_INFO's snd_wnd, Linux
 * 6.2; before, bytes that TCP holds back unsent). Both stay so while the
 * peer does not read, however slow the machine. */
static int kernel_full(int fd)
{
	struct tcp_info ti;
	socklen_t len = sizeof(ti);
	struct pollfd pfd = {.fd = fd, .events = POLLOUT};
	int unsent = 0;
	if (poll(&pfd, 1, 0) != 0)
		return 0;
	memset(&ti, 0, sizeof(ti));
	ck_assert_int_eq(getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len), 0);
	if (len >= offsetof(struct tcp_info, tcpi_snd_wnd) + sizeof(ti.tcpi_snd_wnd))
		return ti.tcpi_snd_wnd == 0;
	ck_assert_int_eq(ioctl(fd, SIOCOUTQNSD, &unsent), 0);
	return unsent > 0;
}

struct bp_wait {
	struct tu_peer *cli;
	size_t q; /* queued bytes before the loop ran */
	int fd;
};

/* The kernel took more (write again), or it is full (stalled). */
static int bp_moved_or_full(void *arg)
{
	struct bp_wait *w = arg;
	return tw_comm_queued_bytes(w->cli->comm) < w->q || kernel_full(w->fd);
}

START_TEST(backpressure)
{
	struct tu h;
	struct tu_peer *cli, *srv;
	struct bp_wait w;
	tw_msg *next = NULL;
	size_t sent = 0, len = MSG_BYTES;
	int stalled = 0, d0;
	void *wait_arg[2];
	tu_init(&h);
	ck_assert_int_eq(tw_context_set_write_hwm_bytes(h.ctx, HWM), 0);
	h.sopts.no_callbacks = 1; /* accepted, not read: the kernel buffers fill */
	h.sopts.echo = 0;
	h.sopts.keep = 1;
	ck_assert_int_eq(tu_listen(&h, "tcp://127.0.0.1:0"), 0);
	ck_assert_int_eq(tu_connect(&h, h.addr, &cli), 0);
	ck_assert_ptr_nonnull(srv = tu_server_peer(&h, 0));
	w.cli = cli;
	w.fd = fd_connected_to(h.addr);
	while (!stalled) {
		next = write_until_refused(cli, next, &sent);
		w.q = tw_comm_queued_bytes(cli->comm);
		/* the queue (at the mark) always has bytes for the kernel: it
		 * shrinks unless the kernel is full */
		ck_assert(tu_run_until(&h, bp_moved_or_full, &w, TU_WAIT_MS));
		stalled = tw_comm_queued_bytes(cli->comm) == w.q;
	}
	ck_assert_uint_gt(sent * MSG_BYTES, 2 * HWM); /* the kernel took some */
	/* while the peer does not read, writes stay refused and the queue
	 * stays bounded (the hwm plus one message) */
	tu_run_for(&h, 200);
	next = write_until_refused(cli, next, &sent);
	/* the peer reads: the queue drains */
	d0 = cli->drains;
	ck_assert_int_eq(tu_peer_start(srv, srv->comm), 0);
	wait_arg[0] = cli;
	wait_arg[1] = &d0;
	ck_assert_msg(tu_run_until(&h, drains_above, wait_arg, TU_WAIT_MS), "no drain callback");
	ck_assert_int_eq(tw_comm_write(cli->comm, next), 0);
	sent++;
	ck_assert(tu_wait_count(&h, &srv->nmsgs, sent, TU_WAIT_MS));
	tu_run_for(&h, 50);
	ck_assert_uint_eq(srv->nmsgs, sent);
	for (size_t i = 0; i < sent; i++)
		ck_assert_msg(ts_msg_matches(srv->msgs[i], &len, 1, (unsigned)i), "message %zu", i);
	ck_assert_int_eq(cli->closed + srv->closed, 0);
	tu_fini(&h);
}
END_TEST

/* The write high-water mark counts what a queued message costs beyond
 * its bytes: a 100-byte frame is 124 bytes on the wire, but its queue
 * entry (104 bytes on 64-bit), message object and block header
 * (tw__msg_footprint) take about 330 more; counting bytes alone let a
 * 64 MiB mark hold 177 MB of 100-byte messages (issue 20). Writes are
 * queued without a flush until the loop runs, so the count is exact. */
START_TEST(hwm_counts_bookkeeping)
{
	const size_t mark = 64 * KiB, len = 100, entry = 104;
	struct tu h;
	struct tu_peer *cli;
	size_t accepted = 0, per = 0;
	tw_msg *m;
	int rv;
	ck_assert_uint_eq(sizeof(void *), 8); /* the entry size above */
	tu_init(&h);
	ck_assert_int_eq(tw_context_set_write_hwm_bytes(h.ctx, mark), 0);
	h.sopts.no_callbacks = 1;
	h.sopts.echo = 0;
	ck_assert_int_eq(tu_listen(&h, "tcp://127.0.0.1:0"), 0);
	ck_assert_int_eq(tu_connect(&h, h.addr, &cli), 0);
	for (;;) {
		m = ts_msg_pattern(&len, 1, (unsigned)accepted);
		per = 24 + len + entry + tw__msg_footprint(m);
		if ((rv = tw_comm_write(cli->comm, m)) != 0)
			break;
		accepted++;
	}
	ck_assert_int_eq(rv, TW_EAGAIN);
	tw_msg_free(m);
	ck_assert_uint_eq(per, 124 + 104 + 136 + 16 + 80);
	ck_assert_uint_eq(accepted, (mark + per - 1) / per); /* 143; bytes alone: 529 */
	ck_assert_uint_eq(tw_comm_queued_bytes(cli->comm), accepted * 124);
	tu_fini(&h);
}
END_TEST

/* A peer that stops reading holds what we queued for as long as it stays
 * connected (its window closed, our bytes unsent in the kernel), unless
 * the kernel's TCP timeout (TCP_USER_TIMEOUT, set as Dask sets it) ends
 * the connection: the writer's comm then ends with TW_ETIMEDOUT. Waits
 * only bound a hang. */
START_TEST(peer_stops_reading_times_out)
{
	struct tu h;
	struct tu_peer *cli;
	tw_msg *next;
	size_t sent = 0;
	tu_init(&h);
	ck_assert_int_eq(tw_context_set_tcp_timeout_ms(h.ctx, 1000), 0);
	ck_assert_int_eq(tw_context_set_write_hwm_bytes(h.ctx, HWM), 0);
	h.sopts.no_callbacks = 1; /* accepted, never read */
	h.sopts.echo = 0;
	ck_assert_int_eq(tu_listen(&h, "tcp://127.0.0.1:0"), 0);
	ck_assert_int_eq(tu_connect(&h, h.addr, &cli), 0);
	next = write_until_refused(cli, NULL, &sent);
	ck_assert_msg(tu_wait_flag(&h, &cli->closed, 60000), "the comm outlived its TCP timeout");
	ck_assert_msg(cli->close_err == TW_ETIMEDOUT, "%s (%s)", tw_strerror(cli->close_err),
		      cli->last_error);
	ck_assert_ptr_nonnull(strstr(cli->last_error, "timed out"));
	tw_msg_free(next);
	tu_fini(&h);
}
END_TEST

/* A context on its own loop thread, driven through tw_context_call. */
struct thr {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	tw_context *ctx;
	tw_listener *lis;
	tw_comm *srv, *cli;
	pthread_t loop_tid;
	int off_thread; /* a callback ran on another thread */
	int callbacks;
	int done; /* 1: echo came back; 2: cleaned up */
	int reply_ok;
	int err;
};

static void on_loop(struct thr *t)
{
	if (!pthread_equal(pthread_self(), t->loop_tid))
		t->off_thread = 1;
	t->callbacks++;
}

static void signal_done(struct thr *t, int done)
{
	pthread_mutex_lock(&t->mu);
	t->done = done;
	pthread_cond_signal(&t->cv);
	pthread_mutex_unlock(&t->mu);
}

static const size_t thr_lens[] = {5, 300000};

static void thr_srv_recv(tw_comm *c, tw_msg *m, void *arg)
{
	on_loop(arg);
	if (tw_comm_write(c, tw_msg_hold(m)) != 0)
		tw_msg_free(m);
}

static void thr_cli_recv(tw_comm *c, tw_msg *m, void *arg)
{
	struct thr *t = arg;
	(void)c;
	on_loop(t);
	t->reply_ok = ts_msg_matches(m, thr_lens, 2, 4);
	signal_done(t, 1);
}

static void thr_close(tw_comm *c, int err, void *arg)
{
	struct thr *t = arg;
	(void)c;
	on_loop(t);
	t->err = err != 0 ? err : TW_ECLOSED;
	signal_done(t, 1);
}

static void thr_accept(tw_listener *l, tw_comm *c, void *arg)
{
	struct thr *t = arg;
	(void)l;
	on_loop(t);
	t->srv = c;
	if (tw_comm_set_callbacks(c, thr_srv_recv, thr_close, NULL, t) != 0)
		t->err = TW_EINVAL;
}

static void thr_connected(tw_comm *c, int err, void *arg)
{
	struct thr *t = arg;
	tw_msg *m = ts_msg_pattern(thr_lens, 2, 4);
	on_loop(t);
	t->cli = c;
	if (err == 0)
		err = tw_comm_set_callbacks(c, thr_cli_recv, thr_close, NULL, t);
	if (err == 0)
		err = tw_comm_write(c, m);
	if (err != 0) {
		tw_msg_free(m);
		t->err = err;
		signal_done(t, 1);
	}
}

static void thr_start(void *arg)
{
	struct thr *t = arg;
	char addr[128];
	int err;
	t->loop_tid = pthread_self();
	on_loop(t);
	err = tw_listener_new(t->ctx, "tcp://127.0.0.1:0", thr_accept, t, &t->lis);
	if (err == 0)
		err = tw_listener_address(t->lis, addr, sizeof(addr));
	if (err == 0)
		err = tw_comm_connect(t->ctx, addr, thr_connected, t);
	if (err != 0) {
		t->err = err;
		signal_done(t, 1);
	}
}

static void thr_cleanup(void *arg)
{
	struct thr *t = arg;
	on_loop(t);
	tw_comm_free(t->cli);
	tw_comm_free(t->srv);
	tw_listener_free(t->lis);
	signal_done(t, 2);
}

static int thr_wait(struct thr *t, int done)
{
	struct timespec ts;
	int rv = 0;
	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += TU_WAIT_MS / 1000;
	pthread_mutex_lock(&t->mu);
	while (t->done < done && rv == 0)
		rv = pthread_cond_timedwait(&t->cv, &t->mu, &ts);
	rv = t->done >= done;
	pthread_mutex_unlock(&t->mu);
	return rv;
}

START_TEST(own_loop_thread)
{
	static struct thr t;
	memset(&t, 0, sizeof(t));
	pthread_mutex_init(&t.mu, NULL);
	pthread_cond_init(&t.cv, NULL);
	ck_assert_int_eq(tw_context_new(NULL, &t.ctx), 0);
	ck_assert_int_eq(tw_context_call(t.ctx, thr_start, &t), 0);
	ck_assert_msg(thr_wait(&t, 1), "no echo from the loop thread");
	ck_assert_msg(t.err == 0, "%s", tw_strerror(t.err));
	ck_assert(t.reply_ok);
	ck_assert_int_eq(tw_context_call(t.ctx, thr_cleanup, &t), 0);
	ck_assert(thr_wait(&t, 2));
	tw_context_free(t.ctx);
	ck_assert(!pthread_equal(t.loop_tid, pthread_self()));
	ck_assert_int_eq(t.off_thread, 0);
	ck_assert_int_ge(t.callbacks, 6); /* start, accept, connect, 2 recv, cleanup */
	pthread_cond_destroy(&t.cv);
	pthread_mutex_destroy(&t.mu);
}
END_TEST

/* tw_context_free with a listener, open comms with queued messages and a
 * connect in flight: everything is released (ASan/valgrind check the
 * leaks), and no callback runs. */
static int stray_connects;
static void stray_connect(tw_comm *c, int err, void *arg)
{
	(void)c;
	(void)err;
	(void)arg;
	stray_connects++;
}

START_TEST(context_free_with_open_comms)
{
	struct tu h;
	struct tu_peer *cli, *srv;
	size_t lens[] = {10, 4 * MiB};
	tu_init(&h);
	h.sopts.no_callbacks = 1;
	ck_assert_int_eq(tu_listen(&h, "tcp://127.0.0.1:0"), 0);
	ck_assert_int_eq(tu_connect(&h, h.addr, &cli), 0);
	ck_assert_ptr_nonnull(srv = tu_server_peer(&h, 0));
	ck_assert_int_eq(tw_comm_write(cli->comm, ts_msg_pattern(lens, 2, 0)), 0);
	ck_assert_int_eq(tw_comm_write(cli->comm, ts_msg_pattern(lens, 2, 1)), 0);
	tu_run_for(&h, 20);
	ck_assert_int_eq(tw_comm_connect(h.ctx, h.addr, stray_connect, NULL), 0);
	/* the context owns the teardown now */
	cli->comm = srv->comm = NULL;
	tw_context_free(h.ctx);
	h.ctx = NULL;
	h.lis = NULL;
	ck_assert_int_eq(cli->closed + srv->closed + stray_connects, 0);
	tu_fini(&h);
}
END_TEST

/* Read-ahead (design.md, Receive path, item 5) over tcp: a raw peer
 * writes to a listener whose comms keep what they receive; a taskwire
 * client of the same listener must keep working next to it. Every block
 * is released once the harness is gone (nothing read ahead leaks). */
static void ra_setup(struct tu *h, struct ra_env *e, int dask)
{
	tu_init(h);
	ra_listen(h, "tcp://127.0.0.1:0", dask);
	ra_env_init(e, h, ra_open_tcp, 77, 8);
	e->peeks = 1; /* tcp reads ahead by peeking: nothing is ever copied */
	if (!dask) {
		ck_assert_int_eq(tu_connect(h, h->addr, &e->good), 0);
		ck_assert_ptr_nonnull(e->good_srv = tu_server_peer(h, 0));
	}
}

START_TEST(readahead)
{
	struct tu h;
	struct ra_env e;
	uint64_t live0 = ts_blocks_live();
	ra_setup(&h, &e, ra_cases[_i].dask);
	ra_cases[_i].run(&e);
	tu_fini(&h);
	ck_assert_uint_eq(ts_blocks_live(), live0);
}
END_TEST

/* Read-ahead fed one byte at a time: after a paced run of small messages
 * (read-ahead on), the next messages arrive in 1- and 7-byte pieces, so
 * the head lands in the read-ahead block a few bytes per read, then a
 * message larger than predicted, then a head with N = 0. Every good
 * message arrives intact and in order, the bad head ends the comm with
 * TW_ENOFRAMES, and no block is left behind. */
static void drip(struct tu *h, struct ra_peer *p, const struct ra_buf *b, size_t step)
{
	for (size_t off = 0; off < b->len; off += step) {
		ra_send(p, b->p + off, b->len - off < step ? b->len - off : step);
		event_base_loop(h->base, EVLOOP_NONBLOCK);
	}
}

/* A large frame that arrives in pieces after a small prelude, once
 * read-ahead is on (a paced run of small messages): tcp reads ahead by
 * peeking and takes only whole small messages, so the large message is
 * read into its own blocks from its head on and not one payload byte is
 * copied (payload_bytes_copied stays put). Each piece is waited for by
 * the comm's bytes_received, never by a clock. */
struct got {
	tw_comm *c;
	uint64_t want;
};

static int got_bytes(void *arg)
{
	struct got *g = arg;
	tw_stats st;
	tw_comm_stats(g->c, &st, sizeof(st));
	return st.bytes_received >= g->want;
}

START_TEST(large_in_pieces_no_copy)
{
	static const size_t small[] = {40, 3}, big[] = {90, (size_t)3 << 20, 5};
	static const size_t pieces[] = {1, 15, 8, 700, 4096, 1, 65536, 1000000};
	uint64_t live0 = ts_blocks_live(), sent = 0;
	tw_stats g0, g1;
	struct tu h;
	struct ra_peer p;
	struct ra_buf b = {0};
	struct tu_peer *sp;
	struct got g;
	size_t off = 0, prelude;
	tu_init(&h);
	ra_listen(&h, "tcp://127.0.0.1:0", 0);
	ra_open_tcp(&h, &p);
	ck_assert_ptr_nonnull(sp = tu_server_peer(&h, 0));
	for (unsigned i = 0; i < 3; i++) { /* paced: read-ahead comes on */
		ra_put_msg(&b, small, 2, i);
		ra_send(&p, b.p, b.len);
		sent += b.len;
		b.len = 0;
		ck_assert(tu_wait_count(&h, &sp->nmsgs, i + 1, TU_WAIT_MS));
	}
	tw_stats_global(&g0, sizeof(g0));
	ra_put_msg(&b, big, 3, 3);
	ra_put_msg(&b, small, 2, 4);
	/* head, lengths and frame 0, then the large frame's first byte */
	prelude = 16 + 3 * 8 + big[0] + 1;
	g.c = sp->comm;
	for (size_t i = 0; off < b.len; i++) {
		size_t k = i == 0                                       ? prelude
			   : i - 1 < sizeof(pieces) / sizeof(pieces[0]) ? pieces[i - 1]
									: b.len;
		if (k > b.len - off)
			k = b.len - off;
		ra_send(&p, b.p + off, k);
		off += k;
		if (off < b.len) { /* the comm took every byte sent so far */
			g.want = sent + off;
			ck_assert(tu_run_until(&h, got_bytes, &g, TU_WAIT_MS));
		}
	}
	ck_assert(tu_wait_count(&h, &sp->nmsgs, 5, TU_WAIT_MS));
	tw_stats_global(&g1, sizeof(g1));
	ck_assert_uint_eq(g1.payload_bytes_copied - g0.payload_bytes_copied, 0);
	ck_assert(ts_msg_matches(sp->msgs[3], big, 3, 3));
	ck_assert(ts_msg_matches(sp->msgs[4], small, 2, 4));
	ck_assert_uint_eq(tw_block_size(tw_msg_frame(sp->msgs[3], 1)->block), big[1]);
	ck_assert_uint_eq(tw_msg_frame(sp->msgs[3], 1)->offset, 0);
	ra_buf_free(&b);
	ra_close(&p);
	tu_fini(&h);
	ck_assert_uint_eq(ts_blocks_live(), live0);
}
END_TEST

START_TEST(readahead_drip)
{
	static const size_t small[] = {40, 3}, big[] = {2, 2900, 0, 1};
	static const uint64_t nzero[] = {16, 0};
	uint64_t live0 = ts_blocks_live();
	struct tu h;
	struct ra_peer p;
	struct ra_buf b = {0};
	struct tu_peer *sp;
	unsigned seed = 0;
	tu_init(&h);
	ra_listen(&h, "tcp://127.0.0.1:0", 0);
	ra_open_tcp(&h, &p);
	ck_assert_ptr_nonnull(sp = tu_server_peer(&h, 0));
	for (; seed < 3; seed++) { /* paced: read-ahead comes on */
		ra_put_msg(&b, small, 2, seed);
		ra_send(&p, b.p, b.len);
		b.len = 0;
		ck_assert(tu_wait_count(&h, &sp->nmsgs, seed + 1, TU_WAIT_MS));
	}
	for (size_t step = 1; step <= 7; step += 6) {
		ra_put_msg(&b, small, 2, seed++);
		ra_put_msg(&b, small, 2, seed++);
		ra_put_msg(&b, big, 4, seed++);
		ra_put_msg(&b, small, 2, seed++);
		drip(&h, &p, &b, step);
		b.len = 0;
		ck_assert(tu_wait_count(&h, &sp->nmsgs, seed, TU_WAIT_MS));
	}
	ra_put_u64(&b, nzero, 2);
	drip(&h, &p, &b, 1);
	ck_assert(tu_wait_flag(&h, &sp->closed, TU_WAIT_MS));
	ck_assert_int_eq(sp->close_err, TW_ENOFRAMES);
	ck_assert_uint_eq(sp->nmsgs, seed);
	for (unsigned i = 0; i < seed; i++) {
		int is_big = i >= 3 && (i - 3) % 4 == 2;
		ck_assert_msg(ts_msg_matches(sp->msgs[i], is_big ? big : small, is_big ? 4 : 2, i),
			      "message %u", i);
	}
	ra_buf_free(&b);
	ra_close(&p);
	tu_fini(&h);
	ck_assert_uint_eq(ts_blocks_live(), live0);
}
END_TEST

/* Writes made by a callback of the comm's own read go out when the read
 * ends; what the callback does next decides whether they go at all:
 * freed or aborted, the reply is dropped with the comm (the client sees
 * an end and no message); paused, the reply still goes out; written to
 * another comm, it goes out there. */
enum { WR_FREE, WR_ABORT, WR_PAUSE, WR_OTHER, WR_CLOSE };
static int wr_mode;
static struct tu_peer *wr_other;

static void write_then(struct tu_peer *p, tw_msg *m)
{
	tw_comm *c = p->comm;
	ck_assert_int_eq(tw_comm_write(wr_mode == WR_OTHER ? wr_other->comm : c, tw_msg_hold(m)),
			 0);
	switch (wr_mode) {
	case WR_FREE:
		tw_comm_free(c);
		p->comm = NULL;
		break;
	case WR_ABORT: tw_comm_abort(c); break;
	case WR_PAUSE: tw_comm_pause(c); break;
	case WR_CLOSE: tw_comm_close(c); break;
	default: break;
	}
}

START_TEST(writes_inside_read)
{
	static const size_t lens[] = {20, 3000};
	uint64_t live0 = ts_blocks_live();
	struct tu h;
	struct tu_peer *cli, *sp, *other, *osp;
	tu_init(&h);
	h.sopts.echo = 0;
	h.sopts.keep = 1;
	ck_assert_int_eq(tu_listen(&h, "tcp://127.0.0.1:0"), 0);
	ck_assert_int_eq(tu_connect(&h, h.addr, &other), 0);
	other->keep = 1;
	ck_assert_ptr_nonnull(osp = tu_server_peer(&h, 0));
	wr_other = osp;
	for (wr_mode = WR_FREE; wr_mode <= WR_CLOSE; wr_mode++) {
		size_t idx = h.nsrv;
		ck_assert_int_eq(tu_connect(&h, h.addr, &cli), 0);
		cli->keep = 1;
		ck_assert_ptr_nonnull(sp = tu_server_peer(&h, idx));
		sp->on_recv = write_then;
		ck_assert_int_eq(tw_comm_write(cli->comm, ts_msg_pattern(lens, 2, 50 + wr_mode)),
				 0);
		ck_assert(tu_wait_count(&h, &sp->nmsgs, 1, TU_WAIT_MS));
		switch (wr_mode) {
		case WR_FREE:
		case WR_ABORT:
			ck_assert(tu_wait_flag(&h, &cli->closed, TU_WAIT_MS));
			ck_assert_int_eq(cli->close_err, 0);
			ck_assert_uint_eq(cli->nmsgs, 0);
			ck_assert_int_eq(sp->closed, wr_mode == WR_ABORT);
			if (wr_mode == WR_ABORT)
				ck_assert_int_eq(sp->close_err, TW_ECANCELED);
			break;
		case WR_PAUSE:
		case WR_CLOSE:
			ck_assert(tu_wait_count(&h, &cli->nmsgs, 1, TU_WAIT_MS));
			ck_assert(ts_msg_matches(cli->msgs[0], lens, 2, 50 + wr_mode));
			if (wr_mode == WR_CLOSE) {
				ck_assert(tu_wait_flag(&h, &cli->closed, TU_WAIT_MS));
				ck_assert_int_eq(cli->close_err, 0);
				ck_assert(tu_wait_flag(&h, &sp->closed, TU_WAIT_MS));
				ck_assert_int_eq(sp->close_err, 0);
			} else {
				tw_comm_resume(sp->comm);
				tu_echo_check(cli, lens, 2, 70, TU_WAIT_MS); /* resumed: answers */
			}
			ck_assert_uint_eq(cli->nmsgs, wr_mode == WR_PAUSE ? 2 : 1);
			break;
		case WR_OTHER:
			ck_assert(tu_wait_count(&h, &other->nmsgs, 1, TU_WAIT_MS));
			ck_assert(ts_msg_matches(other->msgs[0], lens, 2, 50 + wr_mode));
			ck_assert_uint_eq(cli->nmsgs, 0);
			break;
		}
	}
	tu_fini(&h);
	ck_assert_uint_eq(ts_blocks_live(), live0);
}
END_TEST

TCase *tcp_flow_tcase(void)
{
	TCase *tc = ts_tcase("flow", 120,
			     TS_TESTS(retention, backpressure, hwm_counts_bookkeeping,
				      peer_stops_reading_times_out, own_loop_thread,
				      context_free_with_open_comms));
	ts_add_loop(tc, RA_NCASES, TS_TESTS(readahead));
	ts_add(tc, TS_TESTS(readahead_drip, large_in_pieces_no_copy, writes_inside_read));
	return tc;
}
