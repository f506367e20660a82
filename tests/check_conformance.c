/* SPDX-License-Identifier: BSD-3-Clause */
/* The conformance suite: what every transport (tcp, tls, ws, wss) must
 * do, written once and run over each (tests/support/tran.h; a case per
 * transport, CK_RUN_CASE=wss runs one). Every echo comes back intact,
 * byte for byte, and each comm counts exactly the bytes its transport
 * puts on the wire: message shapes (empty frames, 1,000 frames, 1,000
 * messages in flight, a 64 MiB frame, sizes around each transport's
 * thresholds), messages built from references crossing without a payload
 * byte copied, small writes gathered, idle comms holding no buffers, and
 * the same over IPv6 loopback (::1).
 * What only one transport has stays in its own suite (check_tcp_echo.c,
 * check_tls_echo.c, check_ws_echo.c). TW_TEST_QUICK=1 (valgrind runs)
 * shrinks the large frames. SIGPIPE keeps its default action: no
 * transport may raise it. */
#include <malloc.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <check.h>

#include "tests/support/sock.h"
#include "tests/support/suite.h"
#include "tests/support/tls.h"
#include "tests/support/tran.h"

#define MiB       ((size_t)1 << 20)
#define SHARD     TW_DEFAULT_WS_SHARD_BYTES
#define WAIT_MS   60000
#define MAX_MIXED 16
#define LARGE     (ts_quick() ? 8 * MiB + 1 : 64 * MiB)

/* What differs per transport: sizes around its own thresholds. */
struct sizes {
	/* every tenth frame of the 1,000-frame tests */
	size_t edges[10];
	/* one message of many sizes; TW_TEST_QUICK sends the first nquick */
	size_t mixed[MAX_MIXED], nmixed, nquick;
};

static const struct sizes sizes[TS_NTRAN] = {
	/* tcp: the 64 KiB small-frame limit and the 256 KiB mapped-block
	 * limit */
	[TS_TCP] = {{0, 1, 7, 8, 65535, 65536, 65537, 262143, 262144, 262145},
		    {0, 1, 70000, 5, 3 * MiB, 0, 65536, 65537, 100, 17 * MiB + 3, 2},
		    11,
		    11},
	/* tls: and the TLS record size (16 KiB) */
	[TS_TLS] = {{0, 1, 16383, 16384, 16385, 65535, 65536, 65537, 262144, 7},
		    {0, 1, 70000, 5, 3 * MiB, 0, 16384, 16385, 100, 17 * MiB + 3, 2},
		    11,
		    11},
	/* ws, wss: every length form's boundary (RFC 6455 section 5.2) and the 8 MiB shard */
	[TS_WS] = {{0, 1, 125, 126, 127, 65535, 65536, 65537, 300000, 7},
		   {0, 1, 125, 126, 127, 32767, 32768, 65535, 65536, 65537, 8 * MiB - 1, 8 * MiB, 3,
		    8 * MiB + 1, 16 * MiB + 5, 2 * MiB},
		   16,
		   13},
	[TS_WSS] = {{0, 1, 125, 126, 127, 65535, 65536, 65537, 300000, 7},
		    {0, 1, 125, 126, 127, 32767, 32768, 65535, 65536, 65537, 8 * MiB - 1, 8 * MiB,
		     3, 8 * MiB + 1, 16 * MiB + 5, 2 * MiB},
		    16,
		    13},
};

static tw_stats comm_stats(tw_comm *c)
{
	tw_stats st;
	tw_comm_stats(c, &st, sizeof(st));
	return st;
}

static void echo_wire(int t, struct tu_peer *cli, struct tu_peer *srv, const size_t *lens,
		      size_t nf, unsigned seed)
{
	ts_tran_echo_wire(t, cli, srv, lens, nf, seed, SHARD);
}

/* A frame of 0 bytes, one of 1 byte, a message of three empty frames. */
START_TEST(echo_empty_and_one_byte)
{
	struct tu h;
	struct tu_peer *cli = ts_tran_setup_echo(&h, _i), *srv = tu_server_peer(&h, 0);
	size_t empty[] = {0}, one[] = {1}, empties[] = {0, 0, 0};
	echo_wire(_i, cli, srv, empty, 1, 0);
	ck_assert_uint_eq(tw_msg_nframes(cli->msgs[0]), 1);
	ck_assert_uint_eq(tw_msg_frame(cli->msgs[0], 0)->len, 0);
	echo_wire(_i, cli, srv, one, 1, 5);
	ck_assert_uint_eq(tw_slice_data(tw_msg_frame(cli->msgs[1], 0))[0], ts_pattern_byte(0, 5));
	echo_wire(_i, cli, srv, empties, 3, 9);
	ck_assert_uint_eq(tw_msg_nframes(cli->msgs[2]), 3);
	ck_assert_uint_eq(srv->nmsgs, 3);
	ck_assert_int_eq(cli->closed + srv->closed, 0);
	tt_fini(&h);
}
END_TEST

/* Frame i of the 1,000-frame tests: every tenth one of the transport's
 * edges, the others 0..4999 bytes. */
static size_t varied(int t, size_t i)
{
	return i % 10 == 9 ? sizes[t].edges[(i / 10) % 10] : (i * 7919) % 5000;
}

START_TEST(echo_1000_frames_one_message)
{
	struct tu h;
	struct tu_peer *cli = ts_tran_setup_echo(&h, _i), *srv = tu_server_peer(&h, 0);
	static size_t lens[1000];
	for (size_t i = 0; i < 1000; i++)
		lens[i] = varied(_i, i);
	echo_wire(_i, cli, srv, lens, 1000, 11);
	ck_assert_uint_eq(tw_msg_nframes(cli->msgs[0]), 1000);
	tt_fini(&h);
}
END_TEST

/* 1,000 messages in flight at once: all arrive, in order, intact, and
 * both comms stay open. */
START_TEST(echo_1000_messages_pipelined)
{
	struct tu h;
	struct tu_peer *cli = ts_tran_setup_echo(&h, _i), *srv = tu_server_peer(&h, 0);
	static size_t lens[1000][2];
	for (size_t i = 0; i < 1000; i++) {
		lens[i][0] = varied(_i, i);
		lens[i][1] = i % 3;
		ck_assert_int_eq(tw_comm_write(cli->comm, ts_msg_pattern(lens[i], 2, (unsigned)i)),
				 0);
	}
	ck_assert_msg(tu_wait_count(&h, &cli->nmsgs, 1000, WAIT_MS),
		      "%zu echoes; server got %zu messages, closed %d: %s", cli->nmsgs, srv->nmsgs,
		      srv->closed, srv->last_error);
	for (size_t i = 0; i < 1000; i++)
		ck_assert_msg(ts_msg_matches(cli->msgs[i], lens[i], 2, (unsigned)i), "message %zu",
			      i);
	ck_assert_uint_eq(srv->nmsgs, 1000);
	ck_assert_int_eq(cli->closed + srv->closed, 0);
	tt_fini(&h);
}
END_TEST

/* 64 MiB (8 MiB + 1 with TW_TEST_QUICK) in one frame, received into one
 * block of its exact size (over ws: 8 fragments each way, reassembled). */
START_TEST(echo_large_frame)
{
	struct tu h;
	struct tu_peer *cli = ts_tran_setup_echo(&h, _i), *srv = tu_server_peer(&h, 0);
	size_t lens[] = {LARGE};
	const tw_slice *f;
	echo_wire(_i, cli, srv, lens, 1, 3);
	f = tw_msg_frame(cli->msgs[0], 0);
	ck_assert_uint_eq(f->offset, 0);
	ck_assert_uint_eq(tw_block_size(f->block), lens[0]);
	tt_fini(&h);
}
END_TEST

/* The transport's sizes in one message, then a small frame right behind a
 * large one. */
START_TEST(echo_mixed_sizes)
{
	struct tu h;
	struct tu_peer *cli = ts_tran_setup_echo(&h, _i), *srv = tu_server_peer(&h, 0);
	const struct sizes *sz = &sizes[_i];
	size_t behind[] = {3 * MiB, 0};
	echo_wire(_i, cli, srv, sz->mixed, ts_quick() ? sz->nquick : sz->nmixed, 21);
	echo_wire(_i, cli, srv, behind, 2, 22);
	tt_fini(&h);
}
END_TEST

/* Messages built from references (tw_msg_append_ref), out and back:
 * per comm and global stats each way, no payload byte copied in user
 * space, no block allocated for the small ones, and each reference
 * released once, after it was written. */
#define NSTAT 10
static uint8_t small_buf[100];
static int released;
static void count_release(void *data, void *arg)
{
	(void)data;
	(void)arg;
	released++;
}

static tw_msg *ref_msg(const uint8_t *big, size_t big_len)
{
	tw_msg *m;
	ck_assert_int_eq(tw_msg_new(&m), 0);
	ck_assert_int_eq(tw_msg_append_ref(m, small_buf, sizeof(small_buf), count_release, NULL),
			 0);
	ck_assert_int_eq(tw_msg_append_ref(m, big, big_len, count_release, NULL), 0);
	return m;
}

static void check_comm_stats(tw_comm *c, uint64_t msgs, uint64_t sent, uint64_t received)
{
	tw_stats st = comm_stats(c);
	ck_assert_uint_eq(st.msgs_sent, msgs);
	ck_assert_uint_eq(st.msgs_received, msgs);
	ck_assert_uint_eq(st.bytes_sent, sent);
	ck_assert_uint_eq(st.bytes_received, received);
	ck_assert_uint_eq(st.payload_bytes_copied, 0);
	ck_assert_uint_eq(st.blocks_allocated, 0);
}

START_TEST(references_not_copied)
{
	struct tu h;
	struct tu_peer *cli = ts_tran_setup_echo(&h, _i), *srv = tu_server_peer(&h, 0);
	size_t big_len = 300000, large_len = LARGE;
	size_t lens[] = {sizeof(small_buf), big_len}, large[] = {sizeof(small_buf), large_len};
	uint8_t *big = malloc(big_len), *p = malloc(large_len);
	uint64_t up = ts_tran_wire_bytes(_i, lens, 2, SHARD, 1);
	uint64_t down = ts_tran_wire_bytes(_i, lens, 2, SHARD, 0);
	tw_stats g0, g1;
	ts_fill(small_buf, sizeof(small_buf), 1);
	ts_fill(big, big_len, 2);
	ts_fill(p, large_len, 2);
	released = 0;
	tw_stats_global(&g0, sizeof(g0));
	for (int i = 0; i < NSTAT; i++)
		ck_assert_int_eq(tw_comm_write(cli->comm, ref_msg(big, big_len)), 0);
	ck_assert(tu_wait_count(&h, &cli->nmsgs, NSTAT, WAIT_MS));
	check_comm_stats(cli->comm, NSTAT, NSTAT * up, NSTAT * down);
	check_comm_stats(srv->comm, NSTAT, NSTAT * down, NSTAT * up);
	/* one large message: the receive path and the echo copy nothing */
	ck_assert_int_eq(tw_comm_write(cli->comm, ref_msg(p, large_len)), 0);
	ck_assert(tu_wait_count(&h, &cli->nmsgs, NSTAT + 1, WAIT_MS));
	tw_stats_global(&g1, sizeof(g1));
	up = NSTAT * up + ts_tran_wire_bytes(_i, large, 2, SHARD, 1);
	down = NSTAT * down + ts_tran_wire_bytes(_i, large, 2, SHARD, 0);
	ck_assert_uint_eq(g1.msgs_sent - g0.msgs_sent, 2 * (NSTAT + 1));
	ck_assert_uint_eq(g1.msgs_received - g0.msgs_received, 2 * (NSTAT + 1));
	ck_assert_uint_eq(g1.bytes_sent - g0.bytes_sent, up + down);
	ck_assert_uint_eq(g1.bytes_received - g0.bytes_received, up + down);
	ck_assert_uint_eq(g1.payload_bytes_copied - g0.payload_bytes_copied, 0);
	ck_assert_uint_eq(comm_stats(srv->comm).bytes_received, up);
	ck_assert_uint_eq(comm_stats(srv->comm).payload_bytes_copied, 0);
	ck_assert_int_eq(released, 2 * (NSTAT + 1));
	for (int i = 0; i <= NSTAT; i++)
		ck_assert_msg(ts_msg_matches(cli->msgs[i], i < NSTAT ? lens : large, 2, 1),
			      "message %d", i);
	ck_assert_int_eq(cli->closed + srv->closed, 0);
	tt_fini(&h);
	free(big);
	free(p);
}
END_TEST

static void on_unmap(void *data, void *arg)
{
	munmap(data, (size_t)arg);
	released++;
}

/* A server writes a large referenced frame: no byte is copied in user
 * space, on the server's send path nor on the client's receive path
 * (payload copies, merges); the reference is released once. */
START_TEST(server_send_not_copied)
{
	struct tu h;
	struct tu_peer *cli = ts_tran_setup_echo(&h, _i), *srv = tu_server_peer(&h, 0);
	size_t size = LARGE + 2, lens[] = {size};
	uint8_t *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	tw_stats before, after;
	tw_msg *m;
	ck_assert(p != MAP_FAILED);
	ts_fill(p, size, 4);
	srv->echo = 0;
	released = 0;
	ck_assert_int_eq(tw_msg_new(&m), 0);
	ck_assert_int_eq(tw_msg_append_ref(m, p, size, on_unmap, (void *)size), 0);
	tw_stats_global(&before, sizeof(before));
	ck_assert_int_eq(tw_comm_write(srv->comm, m), 0);
	ck_assert(tu_wait_count(&h, &cli->nmsgs, 1, WAIT_MS));
	tw_stats_global(&after, sizeof(after));
	ck_assert_uint_eq(after.payload_bytes_copied - before.payload_bytes_copied, 0);
	ck_assert_uint_eq(after.merges_copied - before.merges_copied, 0);
	ck_assert(ts_msg_matches(cli->msgs[0], lens, 1, 4));
	ck_assert(tu_wait_flag(&h, &released, WAIT_MS));
	ck_assert_int_eq(released, 1);
	tt_fini(&h);
}
END_TEST

/* A server's small messages leave in one write each: every wire byte
 * (headers, prelude, frames) is gathered into one buffer, and the client
 * receives them intact. */
START_TEST(server_small_writes_gathered)
{
	static uint8_t small[64];
	struct tu h;
	struct tu_peer *cli = ts_tran_setup_echo(&h, _i), *srv = tu_server_peer(&h, 0);
	tw_stats before, after, s0, s1;
	ts_fill(small, sizeof(small), 5);
	srv->echo = 0;
	tw_stats_global(&before, sizeof(before));
	s0 = comm_stats(srv->comm);
	for (size_t i = 0; i < 5; i++) {
		size_t lens[] = {10 + i};
		tw_msg *m;
		ck_assert_int_eq(tw_msg_new(&m), 0);
		ck_assert_int_eq(tw_msg_append_ref(m, small, lens[0], NULL, NULL), 0);
		ck_assert_int_eq(tw_comm_write(srv->comm, m), 0);
		ck_assert(tu_wait_count(&h, &cli->nmsgs, i + 1, WAIT_MS));
		ck_assert(ts_msg_matches(cli->msgs[i], lens, 1, 5));
	}
	tw_stats_global(&after, sizeof(after));
	s1 = comm_stats(srv->comm);
	ck_assert_uint_gt(s1.bytes_sent - s0.bytes_sent, 0);
	ck_assert_uint_eq(after.write_bytes_gathered - before.write_bytes_gathered,
			  s1.bytes_sent - s0.bytes_sent);
	tt_fini(&h);
}
END_TEST

/* Heap in use (malloc's count); 0 under valgrind or ASan, whose
 * allocators glibc's count does not see. */
static uint64_t heap_in_use(void)
{
	struct mallinfo2 mi = mallinfo2();
	return (uint64_t)mi.uordblks + (uint64_t)mi.hblkhd;
}

/* An idle comm keeps no buffers (issue 20): a ws client's 64 KiB masking
 * buffer is there only while it writes, what only the upgrade needs goes
 * after it, and TLS gives back its record buffers (about 17 KiB each per
 * SSL) once a message is through (SSL_MODE_RELEASE_BUFFERS). 32 more comm
 * pairs, each after one echo, measured per pair before and after issue
 * 20: tls 118 -> 55 KiB, ws 73.6 -> 6.6 KiB, wss 186 -> 55 KiB
 * (bench/idle-bench.sh has the figures per comm). */
static const uint64_t idle_bound[TS_NTRAN] = {24 * 1024, 80 * 1024, 24 * 1024, 80 * 1024};

START_TEST(idle_comms_keep_no_buffers)
{
	enum { PAIRS = 32 };
	struct tu h;
	struct tu_peer *cli = ts_tran_setup_echo(&h, _i), *more[PAIRS];
	size_t lens[] = {100};
	uint64_t before, per_pair;
	tu_echo_check(cli, lens, 1, 1, WAIT_MS); /* warm up */
	before = heap_in_use();
	for (int i = 0; i < PAIRS; i++) {
		more[i] = ts_tran_connect(&h);
		tu_echo_check(more[i], lens, 1, (unsigned)i, WAIT_MS);
	}
	per_pair = (heap_in_use() - before) / PAIRS;
	if (before != 0) /* else no malloc count here (valgrind, ASan) */
		ck_assert_msg(per_pair < idle_bound[_i],
			      "an idle %s comm pair holds %llu bytes of heap", ts_tran_scheme(_i),
			      (unsigned long long)per_pair);
	tt_fini(&h);
}
END_TEST

/* The same comms over IPv6 loopback: ::1 in brackets in every URI (RFC
 * 3986 section 3.2.2), the listener's, the connect's and the addresses
 * both comms report; the raw helpers too (ts_raw_listen_at, then
 * ts_raw_connect to "[::1]:PORT"). Skips, saying so, where ::1 cannot be
 * bound. */
START_TEST(ipv6_echo)
{
	struct tu h;
	struct tu_peer *cli, *srv;
	size_t lens[] = {0, 33, 300000};
	char a[128], prefix[16], raw[128];
	struct sockaddr_in6 sa;
	socklen_t sl = sizeof(sa);
	int lfd, fd, afd;
	if (!ts_have_ipv6()) {
		fprintf(stderr, "ipv6_echo (%s): skipped, ::1 unavailable\n", ts_tran_scheme(_i));
		return;
	}
	ts_tran_init(&h, _i);
	ck_assert_msg(ts_tran_listen_at(&h, _i, "::1") == 0, "%s", tw_context_last_error(h.ctx));
	snprintf(prefix, sizeof(prefix), "%s://[::1]:", ts_tran_scheme(_i));
	ck_assert_msg(strncmp(h.addr, prefix, strlen(prefix)) == 0, "%s", h.addr);
	cli = ts_tran_connect(&h);
	tu_echo_check(cli, lens, 3, 9, WAIT_MS);
	ck_assert_int_eq(tw_comm_peer_address(cli->comm, a, sizeof(a)), 0);
	ck_assert_str_eq(a, h.addr);
	ck_assert_int_eq(tw_comm_local_address(cli->comm, a, sizeof(a)), 0);
	ck_assert_msg(strncmp(a, prefix, strlen(prefix)) == 0, "%s", a);
	srv = tu_server_peer(&h, 0);
	ck_assert_int_eq(tw_comm_peer_address(srv->comm, h.addr, sizeof(h.addr)), 0);
	ck_assert_str_eq(h.addr, a);
	ck_assert_int_eq(tw_comm_peer_address(srv->comm, a, 8), TW_ERANGE);
	tt_fini(&h);

	lfd = ts_raw_listen_at("::1", ts_tran_scheme(_i), 1, 0, raw, sizeof(raw));
	ck_assert_msg(strncmp(raw, prefix, strlen(prefix)) == 0, "%s", raw);
	fd = ts_raw_connect(raw);
	afd = accept(lfd, (struct sockaddr *)&sa, &sl);
	ck_assert_int_ge(afd, 0);
	ck_assert_int_eq(sa.sin6_family, AF_INET6);
	ck_assert(IN6_IS_ADDR_LOOPBACK(&sa.sin6_addr));
	close(afd);
	close(fd);
	close(lfd);
}
END_TEST

static TCase *conformance_tcase(int t)
{
	const TTest *const tests[] = {echo_empty_and_one_byte,
				      echo_1000_frames_one_message,
				      echo_1000_messages_pipelined,
				      echo_large_frame,
				      echo_mixed_sizes,
				      references_not_copied,
				      server_send_not_copied,
				      server_small_writes_gathered,
				      idle_comms_keep_no_buffers,
				      ipv6_echo,
				      NULL};
	return ts_tran_tcase(t, tests, 120);
}

int main(void)
{
	Suite *s = suite_create("conformance");
	for (int t = 0; t < TS_NTRAN; t++)
		suite_add_tcase(s, conformance_tcase(t));
	return ts_run(s, TS_CERTS);
}
