/* SPDX-License-Identifier: BSD-3-Clause */
/* Independent peers over ws:// and wss:// (loop tests: _i = 0 ws, 1 wss
 * with mutual TLS): Python `websockets` (Debian's 10.4) as client and as
 * echo server, and real Dask (Debian's python3-distributed) as scheduler
 * and as client. The scripts are in $TW_TOP_SRCDIR/tests/interop. Every
 * process started is stopped, also when an assertion fails (the fixture's
 * teardown and tests/support/proc.c's atexit handler). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <check.h>

#include "tests/check_ws.h"
#include "tests/support/ws.h"
#include "tests/support/suite.h"

#define MiB      ((size_t)1 << 20)
#define START_MS 60000
#define RUN_MS   120000

static void script(const char *name, char *buf, size_t len)
{
	const char *top = getenv("TW_TOP_SRCDIR");
	snprintf(buf, len, "%s/tests/interop/%s", top ? top : ".", name);
}

/* The certificate paths, in buffers of the caller. */
struct certs {
	char ca[320], cert[320], key[320];
};

static void certs(struct certs *c)
{
	snprintf(c->ca, sizeof(c->ca), "%s", ts_cert("ca.pem"));
	snprintf(c->cert, sizeof(c->cert), "%s", ts_cert("cert.pem"));
	snprintf(c->key, sizeof(c->key), "%s", ts_cert("key.pem"));
}

/* Start the Python WebSocket client `name` (tests/interop) against addr:
 * over ws (wss 0) with no more arguments, over wss with CA CERT KEY. */
static void spawn_ws_client(struct ts_proc *py, const char *name, char *addr, int wss)
{
	struct certs c;
	char path[512];
	script(name, path, sizeof(path));
	certs(&c);
	char *argv[] = {TS_PYTHON, path, addr, c.ca, c.cert, c.key, NULL};
	if (!wss)
		argv[3] = NULL;
	ck_assert_int_eq(ts_spawn(py, argv, NULL), 0);
}

static int frame_is(const tw_msg *m, size_t i, size_t len, unsigned seed)
{
	const tw_slice *f = tw_msg_frame(m, i);
	return f != NULL && f->len == len && ts_check(tw_slice_data(f), len, seed) == -1;
}

static void wait_ok(struct tu *h, struct ts_proc *py, const char *ok)
{
	char tail[4096];
	ck_assert_msg(ts_proc_wait_exit(py, h->base, RUN_MS), "still running: %s",
		      ts_proc_log_tail(py, tail, sizeof(tail)));
	ck_assert_msg(WIFEXITED(py->status) && WEXITSTATUS(py->status) == 0, "failed: %s",
		      ts_proc_log_tail(py, tail, sizeof(tail)));
	ck_assert_msg(strstr(ts_proc_log_tail(py, tail, sizeof(tail)), ok) != NULL, "%s", tail);
}

/* ws_client.py against a taskwire echo server: three messages (one frame
 * of each sent fragmented, pings in between), echoed and checked on both
 * sides, then a clean close. */
START_TEST(websockets_client)
{
	struct tu h;
	static struct ts_proc py;
	char uri[64];
	struct tu_peer *sp;
	const tw_msg *m;
	wu_init(&h, wu_scheme(_i));
	/* the script pings between fragments, a ping per round trip: far
	 * above the ping-rate policy's default, so it is off here */
	ck_assert_int_eq(tw_context_set_ws_min_ping_interval_ms(h.ctx, 0), 0);
	h.sopts.keep = 1;
	snprintf(uri, sizeof(uri), "%s://127.0.0.1:0", wu_scheme(_i));
	ck_assert_int_eq(tu_listen(&h, uri), 0);
	spawn_ws_client(&py, "ws_client.py", h.addr, _i);
	wait_ok(&h, &py, "OK 3");
	sp = tu_server_peer(&h, 0);
	ck_assert_uint_eq(sp->nmsgs, 3);
	m = sp->msgs[0];
	ck_assert_uint_eq(tw_msg_nframes(m), 3);
	ck_assert(tw_msg_frame(m, 0)->len == 5 &&
		  memcmp(tw_slice_data(tw_msg_frame(m, 0)), "hello", 5) == 0);
	ck_assert(frame_is(m, 1, 300000, 1));
	ck_assert_uint_eq(tw_msg_frame(m, 2)->len, 0);
	ck_assert(tw_msg_nframes(sp->msgs[1]) == 1 && frame_is(sp->msgs[1], 0, 20 * MiB, 2));
	ck_assert_uint_eq(tw_msg_nframes(sp->msgs[2]), 50);
	for (unsigned i = 0; i < 50; i++)
		ck_assert_msg(frame_is(sp->msgs[2], i, i * 37 % 1000, i), "frame %u", i);
	ck_assert(tu_wait_flag(&h, &sp->closed, RUN_MS));
	ck_assert_msg(sp->close_err == 0, "%s", sp->last_error);
	ts_proc_stop(&py);
	tt_fini(&h);
}
END_TEST

/* A taskwire client against ws_echo_server.py, which pings every 50 ms
 * (unanswered pings would close the connection), then a clean close that
 * the server sees as 1000. */
START_TEST(websockets_server)
{
	struct tu h;
	static struct ts_proc py;
	struct certs c;
	char path[512], addr[128], tail[2048], count[32];
	struct tu_peer *cli;
	size_t edges[] = {0, 1, 125, 126, 127, 65535, 65536, 65537}, big[] = {20 * MiB + 1};
	static size_t many[1000];
	int rv;
	wu_init(&h, wu_scheme(_i));
	/* the server pings every 50 ms, and pings that wait while a 20 MiB
	 * echo is read arrive together: the ping-rate policy is off */
	ck_assert_int_eq(tw_context_set_ws_min_ping_interval_ms(h.ctx, 0), 0);
	script("ws_echo_server.py", path, sizeof(path));
	certs(&c);
	char *argv[] = {TS_PYTHON, path, c.ca, c.cert, c.key, NULL};
	if (_i == 0)
		argv[2] = NULL;
	ck_assert_int_eq(ts_spawn(&py, argv, NULL), 0);
	ck_assert_msg(ts_proc_wait_log(&py, h.base, "listening on", addr, sizeof(addr), START_MS),
		      "server did not start: %s", ts_proc_log_tail(&py, tail, sizeof(tail)));
	rv = tu_connect(&h, addr, &cli);
	ck_assert_msg(rv == 0, "connect %s: %s: %s", addr, tw_strerror(rv),
		      tw_context_last_error(h.ctx));
	cli->keep = 1;
	tu_echo_check(cli, edges, 8, 1, RUN_MS);
	tu_echo_check(cli, big, 1, 2, RUN_MS);
	for (size_t i = 0; i < 1000; i++)
		many[i] = i % 17;
	tu_echo_check(cli, many, 1000, 3, RUN_MS);
	tu_run_for(&h, 300); /* a few pings, answered */
	tu_echo_check(cli, edges, 3, 4, RUN_MS);
	tw_comm_close(cli->comm);
	ck_assert(tu_wait_flag(&h, &cli->closed, RUN_MS));
	ck_assert_msg(cli->close_err == 0, "%s", cli->last_error);
	ck_assert_msg(ts_proc_wait_log(&py, h.base, "closed code=1000 messages=", count,
				       sizeof(count), RUN_MS),
		      "%s", ts_proc_log_tail(&py, tail, sizeof(tail)));
	ck_assert_str_eq(count, "1016"); /* 9 + 2 + 1001 + 4 WebSocket messages */
	ts_proc_stop(&py);
	tt_fini(&h);
}
END_TEST

/* With small_sockets set, every TCP socket this process makes gets 4 KiB
 * kernel buffers, so writes block often, as on a slow link. Exported
 * (visibility and -export-dynamic), so libevent's listeners come here
 * too. */
static int small_sockets;

__attribute__((visibility("default"))) int socket(int domain, int type, int protocol)
{
	int fd = (int)syscall(SYS_socket, domain, type, protocol);
	int v = 4096;
	if (fd >= 0 && small_sockets && (domain == AF_INET || domain == AF_INET6)) {
		setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &v, sizeof(v));
		setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &v, sizeof(v));
	}
	return fd;
}

/* Tornado (Dask's ws comm is tornado's) pings every 0.3 s and reads 200
 * messages of 64 KiB slowly, queued at once by the server, so pongs fall
 * due while the server's writes block. Over wss a pong written then went
 * out as the bytes OpenSSL held for the blocked data frame (the next
 * frame header sent twice, the pong lost): the client read a corrupt
 * stream. */
static tw_msg *pinger_msg(unsigned k, size_t size)
{
	uint8_t *p = malloc(size);
	tw_msg *m;
	ck_assert_ptr_nonnull(p);
	for (size_t i = 0; i < size; i++)
		p[i] = (uint8_t)(((k % 251 + i) * 131 + 7) % 251);
	ck_assert_int_eq(tw_msg_new(&m), 0);
	ck_assert_int_eq(tw_msg_append_copy(m, p, size), 0);
	free(p);
	return m;
}

START_TEST(pongs_while_writes_block)
{
	struct tu h;
	static struct ts_proc py;
	struct certs c;
	struct tu_peer *sp;
	char path[512], uri[64], tail[4096];
	wu_init(&h, wu_scheme(_i));
	/* pings every 0.3 s: under the ping-rate policy's default */
	ck_assert_int_eq(tw_context_set_ws_min_ping_interval_ms(h.ctx, 0), 0);
	h.sopts.echo = 0;
	h.sopts.keep = 1;
	small_sockets = 1;
	snprintf(uri, sizeof(uri), "%s://127.0.0.1:0", wu_scheme(_i));
	ck_assert_int_eq(tu_listen(&h, uri), 0);
	script("ws_slow_pinger.py", path, sizeof(path));
	certs(&c);
	char *argv[] = {TS_PYTHON, path,    h.addr, c.ca,   c.cert, c.key,
			"200",     "65536", "0.3",  "0.02", NULL};
	if (_i == 0)
		memmove(&argv[3], &argv[6], 5 * sizeof(argv[0]));
	ck_assert_int_eq(ts_spawn(&py, argv, NULL), 0);
	sp = tu_server_peer(&h, 0);
	ck_assert_msg(tu_wait_count(&h, &sp->nmsgs, 1, RUN_MS), "no go: %s",
		      ts_proc_log_tail(&py, tail, sizeof(tail)));
	for (unsigned k = 0; k < 200; k++)
		ck_assert_int_eq(tw_comm_write(sp->comm, pinger_msg(k, 65536)), 0);
	ck_assert_msg(ts_proc_wait_exit(&py, h.base, RUN_MS) && WIFEXITED(py.status) &&
			      WEXITSTATUS(py.status) == 0,
		      "client: %s; server comm: closed %d (%s)",
		      ts_proc_log_tail(&py, tail, sizeof(tail)), sp->closed, sp->last_error);
	wait_ok(&h, &py, "OK 200 messages");
	small_sockets = 0;
	tt_fini(&h);
}
END_TEST

/* A TCase of Python-peer tests, each over ws and wss (_i 0, 1); the
 * peers a failed test left are stopped after it. */
static TCase *peers_tcase(const char *name, const TTest *const tests[])
{
	TCase *tc = ts_tcase(name, 300, NULL);
	tcase_add_checked_fixture(tc, NULL, ts_proc_stop_all);
	ts_add_loop(tc, 2, tests);
	return tc;
}

TCase *ws_peers_tcase(void)
{
	return peers_tcase("websockets", TS_TESTS(websockets_client, websockets_server,
						  pongs_while_writes_block));
}

/* Dask. */

static const size_t dask_sizes[] = {0, 3, 20000, 70 * MiB};

static void start_scheduler(struct tu *h, int wss, struct ts_proc *sched, char *addr, size_t len)
{
	char port[16], dash[32], tail[2048];
	struct certs c;
	unsigned p = ts_free_port();
	snprintf(port, sizeof(port), "%u", p);
	snprintf(dash, sizeof(dash), "127.0.0.1:%u", p);
	certs(&c);
	char *argv[] = {TS_PYTHON,
			"-m",
			"distributed.cli.dask_scheduler",
			"--protocol",
			wss ? "wss" : "ws",
			"--host",
			"127.0.0.1",
			"--port",
			port,
			"--dashboard-address",
			dash,
			"--no-show",
			"--tls-ca-file",
			c.ca,
			"--tls-cert",
			c.cert,
			"--tls-key",
			c.key,
			NULL};
	if (!wss)
		argv[12] = NULL;
	ck_assert_int_eq(ts_spawn(sched, argv, NULL), 0);
	ck_assert_msg(ts_proc_wait_log(sched, h->base, "Scheduler at:", addr, len, START_MS),
		      "scheduler did not start: %s", ts_proc_log_tail(sched, tail, sizeof(tail)));
	ck_assert_msg(strncmp(addr, wss ? "wss://127.0.0.1:" : "ws://127.0.0.1:", wss ? 16 : 15) ==
			      0,
		      "address %s", addr);
}

/* A taskwire client against `dask scheduler --protocol ws|wss`: Dask
 * handshake, identity, echo of out-of-band bytes of 0, 3, 20,000 bytes
 * and 70 MiB. */
START_TEST(taskwire_client_to_dask_scheduler)
{
	struct tu h;
	static struct ts_proc sched;
	struct tu_peer *p;
	char addr[128];
	tw_block *data;
	wu_init(&h, wu_scheme(_i));
	start_scheduler(&h, _i, &sched, addr, sizeof(addr));
	p = tt_dask_client(&h, addr);
	tt_assert_scheduler(&h, p, RUN_MS);
	ck_assert_int_eq(tw_block_new(70 * MiB + 8, &data), 0);
	ts_fill(tw_block_data(data), 70 * MiB + 8, 5);
	for (size_t k = 0; k < 4; k++)
		tt_assert_echo(&h, p, data, k, dask_sizes[k], RUN_MS);
	tw_block_free(data);
	ck_assert_int_eq(p->closed, 0);
	ts_proc_stop(&sched);
	tt_fini(&h);
}
END_TEST

/* What the server's hook saw of the 70 MiB message. */
struct big_seen {
	int seen, msgs, pattern_ok, one_block;
	size_t wire_frames, logical_frames, len, block_size;
	uint64_t zero_copy, copied, merges_copied;
};

static void note_big(struct big_seen *b, const tw_msg *m, const tw_payload *pl)
{
	const tw_block *blk = tw_msg_frame(m, 2)->block;
	b->seen++;
	b->wire_frames = tw_msg_nframes(m);
	b->logical_frames = pl->nframes;
	b->len = pl->frames[0].len;
	b->pattern_ok = ts_check(tw_slice_data(&pl->frames[0]), b->len, 3) == -1;
	b->block_size = tw_block_size(blk);
	b->one_block = 1;
	for (size_t i = 2; i < tw_msg_nframes(m); i++)
		b->one_block &= tw_msg_frame(m, i)->block == blk;
}

/* Decode each message the Python client sends, as a Dask server would. */
static void decode_hook(struct tu_peer *p, tw_msg *m)
{
	struct big_seen *b = p->user;
	const tw_payload *pl;
	char why[256] = "";
	tw_stats before = wu_stats(), after;
	tw_decoded *d;
	int rv = tw_decode(m, NULL, &d, why, sizeof(why));
	after = wu_stats();
	ck_assert_msg(rv == 0, "decode: %s: %s", tw_strerror(rv), why);
	b->msgs++;
	pl = tw_decoded_payload(d, tw_msgpack_map_get(tw_decoded_root(d), "data"));
	ck_assert_ptr_nonnull(pl);
	if (pl->nframes == 1 && pl->frames[0].len == 70 * MiB) {
		b->zero_copy = after.merges_zero_copy - before.merges_zero_copy;
		b->merges_copied = after.merges_copied - before.merges_copied;
		b->copied = after.payload_bytes_copied - before.payload_bytes_copied;
		note_big(b, m, pl);
	}
	tw_decoded_free(d);
}

/* ws_dask_client.py (distributed.comm.connect) against a taskwire echo
 * listener: the 70 MiB payload arrives as 9 shards of at most 8 MiB, each
 * its own WebSocket message, read into one block, merged without a copy. */
START_TEST(dask_client_to_taskwire_server)
{
	struct tu h;
	static struct ts_proc py;
	static struct wu_dask_srv srv;
	struct big_seen big = {0};
	char uri[64];
	wu_init(&h, wu_scheme(_i));
	setenv("DASK_DISTRIBUTED__COMM__COMPRESSION", "False", 1);
	srv = (struct wu_dask_srv){.hook = decode_hook, .user = &big};
	snprintf(uri, sizeof(uri), "%s://127.0.0.1:0", wu_scheme(_i));
	wu_dask_listen(&h, uri, &srv);
	spawn_ws_client(&py, "ws_dask_client.py", srv.addr, _i);
	wait_ok(&h, &py, "OK 4");
	ck_assert_int_eq(srv.failed, 0);
	ck_assert_int_eq(big.msgs, 4);
	ck_assert_int_eq(big.seen, 1);
	ck_assert_uint_eq(big.wire_frames, 2 + 9); /* frame 0, sub-header, 9 shards */
	ck_assert_uint_eq(big.logical_frames, 1);
	ck_assert_uint_eq(big.len, 70 * MiB);
	ck_assert(big.pattern_ok);
	ck_assert(big.one_block);
	ck_assert_uint_eq(big.block_size, 70 * MiB);
	ck_assert_uint_eq(big.zero_copy, 1);
	ck_assert_uint_eq(big.merges_copied, 0);
	ck_assert_uint_eq(big.copied, 0);
	ts_proc_stop(&py);
	tt_fini(&h);
}
END_TEST

TCase *ws_dask_tcase(void)
{
	return peers_tcase("dask", TS_TESTS(taskwire_client_to_dask_scheduler,
					    dask_client_to_taskwire_server));
}
