/* SPDX-License-Identifier: BSD-3-Clause */
/* What only ws:// and wss:// have of echo (each test is a loop test: _i =
 * 0 ws, 1 wss, mutual TLS with the test certificates; the shapes every
 * transport carries, with the bytes on the wire, are in
 * tests/check_conformance.c): the receive budget with 1 MiB fragments, a
 * small shard size (fragments on the wire), and orderly close. */
#include <endian.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <check.h>
#include <event2/event.h>

#include "tests/check_ws.h"
#include "tests/support/tran.h"
#include "tests/support/ws.h"
#include "tests/support/suite.h"

#define MiB ((size_t)1 << 20)

/* The receive budget over ws and wss (include/taskwire/context.h): six
 * clients send two-frame messages of 3 MiB and 2 MiB at once, in 1 MiB
 * fragments, through a 4 MiB budget shared by the server's and the
 * clients' comms. Frames reserve as they start, comms pause and resume,
 * and every echo comes back intact (nothing dropped, no deadlock). */
START_TEST(echo_through_receive_budget)
{
	enum { N = 6 };
	struct tu h;
	struct tu_peer *cli[N];
	char uri[64];
	size_t lens[] = {3 * MiB, 2 * MiB + 1};
	uint64_t used;
	wu_init(&h, wu_scheme(_i));
	h.sopts.echo = 1;
	ck_assert_int_eq(tw_context_set_receive_budget_bytes(h.ctx, 4 * MiB), 0);
	ck_assert_int_eq(tw_context_set_ws_shard_bytes(h.ctx, MiB), 0);
	snprintf(uri, sizeof(uri), "%s://127.0.0.1:0", wu_scheme(_i));
	ck_assert_int_eq(tu_listen(&h, uri), 0);
	for (int i = 0; i < N; i++) {
		ck_assert_int_eq(tu_connect(&h, h.addr, &cli[i]), 0);
		cli[i]->keep = 1;
	}
	for (int i = 0; i < N; i++)
		ck_assert_int_eq(tw_comm_write(cli[i]->comm, ts_msg_pattern(lens, 2, (unsigned)i)),
				 0);
	for (int i = 0; i < N; i++) {
		ck_assert(tu_wait_count(&h, &cli[i]->nmsgs, 1, WU_WAIT_MS));
		ck_assert(ts_msg_matches(cli[i]->msgs[0], lens, 2, (unsigned)i));
		ck_assert_int_eq(cli[i]->closed, 0);
	}
	ck_assert_int_eq(tw_context_receive_budget_bytes(h.ctx, NULL, &used), 0);
	ck_assert_uint_eq(used, 0);
	tt_fini(&h);
}
END_TEST

/* A 1,000-byte shard: frames go out in many fragments (the byte count on
 * the wire proves it) and come back whole. */
START_TEST(echo_small_shard)
{
	struct tu h;
	struct tu_peer *cli, *srv;
	size_t lens[] = {0, 1, 999, 1000, 1001, 2000, 2001, 300000, 3, MiB + 17};
	char uri[64];
	wu_init(&h, wu_scheme(_i));
	ck_assert_int_eq(tw_context_set_ws_shard_bytes(h.ctx, 1000), 0);
	snprintf(uri, sizeof(uri), "%s://127.0.0.1:0", wu_scheme(_i));
	ck_assert_int_eq(tu_listen(&h, uri), 0);
	ck_assert_int_eq(tu_connect(&h, h.addr, &cli), 0);
	cli->keep = 1;
	srv = tu_server_peer(&h, 0);
	ts_tran_echo_wire(_i ? TS_WSS : TS_WS, cli, srv, lens, sizeof(lens) / sizeof(lens[0]), 33,
			  1000);
	ck_assert_uint_eq(tw_block_size(tw_msg_frame(cli->msgs[0], 9)->block), MiB + 17);
	tt_fini(&h);
}
END_TEST

/* tw_comm_close on the client: close 1000 both ways, the client's comm
 * ends with 0; the server's view of the client's close is a clean one,
 * except that the server's echo of the last message may still be queued
 * when the client's close frame arrives (same read): the server answers
 * the close at once and its comm ends with TW_ECLOSED and the bytes of
 * the echo not delivered (the client, closing, reads no more messages),
 * never 0 with them missing. */
START_TEST(orderly_close)
{
	struct tu h;
	struct tu_peer *cli = wu_setup_echo(&h, wu_scheme(_i)), *srv = tu_server_peer(&h, 0);
	size_t lens[] = {100, 70000};
	tu_echo_check(cli, lens, 2, 1, WU_WAIT_MS);
	ck_assert_int_eq(tw_comm_write(cli->comm, ts_msg_pattern(lens, 2, 2)), 0);
	tw_comm_close(cli->comm);
	ck_assert(tu_wait_flag(&h, &cli->closed, WU_WAIT_MS));
	ck_assert(tu_wait_flag(&h, &srv->closed, WU_WAIT_MS));
	ck_assert_msg(cli->close_err == 0, "%s", cli->last_error);
	ck_assert_msg(srv->close_err == 0 || (srv->close_err == TW_ECLOSED &&
					      strstr(srv->last_error, "not delivered") != NULL),
		      "%s", srv->last_error);
	ck_assert_uint_eq(srv->nmsgs, 2); /* the message queued before the close went out */
	tt_fini(&h);
}
END_TEST

/* The server closes: the same from the other side. */
START_TEST(orderly_close_by_server)
{
	struct tu h;
	struct tu_peer *cli = wu_setup_echo(&h, wu_scheme(_i)), *srv = tu_server_peer(&h, 0);
	size_t lens[] = {5};
	tu_echo_check(cli, lens, 1, 1, WU_WAIT_MS);
	tw_comm_close(srv->comm);
	ck_assert(tu_wait_flag(&h, &cli->closed, WU_WAIT_MS));
	ck_assert(tu_wait_flag(&h, &srv->closed, WU_WAIT_MS));
	ck_assert_msg(cli->close_err == 0, "%s", cli->last_error);
	ck_assert_msg(srv->close_err == 0, "%s", srv->last_error);
	tt_fini(&h);
}
END_TEST

/* Raw ws peers that start a two-frame taskwire message whose second frame
 * is a WebSocket message in fragments: 1 MiB at once in 64 KiB fragments,
 * then a 1 KiB fragment every FD_TICK_MS, never the last (100 KB/s, far
 * above the minimum receive rate). The tick paces them; no assertion
 * depends on it. */
#define FD_N       4
#define FD_TICK_MS 10
#define FD_CHUNK   1024
#define FD_HEAD    14 /* a masked frame's header, at most (len < 65536) */

struct frag_drip {
	struct wu_raw r[FD_N];
	struct tu_peer *sp[FD_N];
	uint8_t *burst[FD_N]; /* the message's start and its 1 MiB, not yet sent */
	size_t boff[FD_N], blen[FD_N];
	uint8_t pend[FD_N][FD_HEAD + FD_CHUNK];
	size_t off[FD_N], len[FD_N];
	uint8_t chunk[FD_CHUNK];
	struct event *ev;
};

/* Send what the socket takes of p[*off..len) now; the rest waits for the
 * next tick (over TLS, the same bytes are offered again, as OpenSSL
 * asks). A dripper the budget paused must not stall the test: across
 * network namespaces (veth) the socket buffers hold far less than the
 * 1 MiB burst that loopback absorbs. */
static void send_some(struct wu_raw *r, const uint8_t *p, size_t *off, size_t len)
{
	ssize_t k = wu_raw_write(r, p + *off, len - *off);
	if (k > 0)
		*off += (size_t)k;
}

static void frag_tick(evutil_socket_t fd, short what, void *arg)
{
	struct frag_drip *d = arg;
	(void)fd;
	(void)what;
	for (int i = 0; i < FD_N; i++) { /* a full socket: the rest goes next tick */
		if (d->boff[i] < d->blen[i]) {
			send_some(&d->r[i], d->burst[i], &d->boff[i], d->blen[i]);
			continue;
		}
		if (d->off[i] == d->len[i]) {
			d->len[i] = wu_frame(d->pend[i], 0, 0, d->chunk, FD_CHUNK, 1);
			d->off[i] = 0;
		}
		send_some(&d->r[i], d->pend[i], &d->off[i], d->len[i]);
	}
}

static uint64_t peer_received(const struct tu_peer *p)
{
	tw_stats st;
	tw_comm_stats(p->comm, &st, sizeof(st));
	return st.bytes_received;
}

/* The drippers' bytes the server has read: at 1.5 MiB they hold most of
 * the 2 MiB budget, so the honest message comes to a budget they fill. */
static int drippers_hold(void *arg)
{
	struct frag_drip *d = arg;
	uint64_t n = 0;
	for (int i = 0; i < FD_N; i++)
		n += peer_received(d->sp[i]);
	return n >= 3 * MiB / 2;
}

/* Breaker b8 (session 13) at small scale: four ws peers hold and wait for
 * a 2 MiB receive budget with messages that never end, sent in fragments;
 * an honest message is echoed whole and byte-identical while they still
 * drip. Before, a dripper's bytes still to come were those of its current
 * fragment (1 KiB), so the pass went to the drippers, always nearer to
 * done, for ever, and the echo never came (the watchdog on the honest
 * comm's own bytes fails). A loop test: _i bit 0, wss (the drippers' bytes
 * through TLS records); bit 1, the honest message is [1 byte, 1 MiB,
 * 4 bytes], its large frame not its last, so its bytes to come are
 * unknown while it waits, like the drippers' (breaker17 b17-1, session 14:
 * a slow passer handed the pass only to a waiter with fewer bytes to come,
 * and unknown was no fewer than slow, so the echo never came); else one
 * 1 MiB frame. */
START_TEST(fragment_drippers_do_not_hold_the_pass)
{
	struct tu h;
	struct frag_drip d;
	struct tu_peer *cli, *srv;
	char uri[64];
	const char *scheme = wu_scheme(_i & 1);
	size_t one[] = {MiB}, mid[] = {1, MiB, 4};
	const size_t *lens = _i & 2 ? mid : one;
	size_t nlens = _i & 2 ? 3 : 1;
	uint8_t *frag = malloc(64 * 1024 + FD_HEAD);
	uint64_t two = htole64(2);
	struct timeval tv = {0, FD_TICK_MS * 1000};
	ck_assert_ptr_nonnull(frag);
	memset(&d, 0, sizeof(d));
	wu_init(&h, scheme);
	h.sopts.echo = 1;
	ck_assert_int_eq(tw_context_set_receive_budget_bytes(h.ctx, 2 * MiB), 0);
	ck_assert_int_eq(tw_context_set_ws_shard_bytes(h.ctx, 4 * MiB), 0);
	snprintf(uri, sizeof(uri), "%s://127.0.0.1:0", scheme);
	ck_assert_int_eq(tu_listen(&h, uri), 0);
	memset(frag, 'x', 64 * 1024 + FD_HEAD);
	memset(d.chunk, 'z', sizeof(d.chunk));
	for (int i = 0; i < FD_N; i++) {
		uint8_t *payload = malloc(64 * 1024), *b;
		ck_assert_ptr_nonnull(payload);
		ck_assert_ptr_nonnull(
			b = d.burst[i] = malloc(2 * (FD_HEAD + 8) + 16 * (64 * 1024 + FD_HEAD)));
		memset(payload, 'x', 64 * 1024);
		ck_assert_int_eq(wu_raw_open(&h, h.addr, NULL, &d.r[i]), 101);
		ck_assert_ptr_nonnull(d.sp[i] = tu_server_peer(&h, (size_t)i));
		d.blen[i] = wu_frame(b, 1, 2, &two, 8, 1);                /* the frame count */
		d.blen[i] += wu_frame(b + d.blen[i], 1, 2, "\x80", 1, 1); /* frame 0 */
		for (int f = 0; f < 16; f++) { /* frame 1: 1 MiB, fragments */
			size_t n = wu_frame(frag, 0, f == 0 ? 2 : 0, payload, 64 * 1024, 1);
			memcpy(b + d.blen[i], frag, n);
			d.blen[i] += n;
		}
		free(payload);
	}
	free(frag);
	ck_assert_ptr_nonnull(d.ev = event_new(h.base, -1, EV_PERSIST, frag_tick, &d));
	ck_assert_int_eq(event_add(d.ev, &tv), 0);
	ck_assert_msg(tu_run_until(&h, drippers_hold, &d, WU_WAIT_MS),
		      "the drippers never filled the budget");
	ck_assert_int_eq(tu_connect(&h, h.addr, &cli), 0);
	cli->keep = 1;
	ck_assert_ptr_nonnull(srv = tu_server_peer(&h, FD_N));
	ck_assert_int_eq(tw_comm_write(cli->comm, ts_msg_pattern(lens, nlens, 3)), 0);
	/* the watchdog: the honest message's bytes, read by the server and
	 * echoed back to the client, stop moving for WU_WAIT_MS */
	wu_wait_msg_moving(&h, cli, srv, WU_WAIT_MS);
	ck_assert(ts_msg_matches(cli->msgs[0], lens, nlens, 3));
	ck_assert_int_eq(cli->closed, 0);
	event_free(d.ev);
	for (int i = 0; i < FD_N; i++) { /* none cut, none delivered */
		ck_assert_int_eq(d.sp[i]->closed, 0);
		ck_assert_uint_eq(d.sp[i]->nmsgs, 0);
		wu_raw_close(&d.r[i]);
		free(d.burst[i]);
	}
	tt_fini(&h);
}
END_TEST

TCase *ws_echo_tcase(void)
{
	TCase *tc = ts_tcase("echo", 120, NULL);
	ts_add_loop(tc, 2,
		    TS_TESTS(echo_through_receive_budget, echo_small_shard, orderly_close,
			     orderly_close_by_server));
	ts_add_loop(tc, 4, TS_TESTS(fragment_drippers_do_not_hold_the_pass));
	return tc;
}
