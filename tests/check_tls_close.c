/* Closing tls comms without losing data, partial writes of referenced
 * frames (BH-11), no leaks over many connections (BH-14), and read-ahead
 * over tls (tests/readahead_util.h), where SSL_read_ex is the readv. */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <check.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <event2/event.h>

#include "tests/check_tls.h"
#include "tests/readahead_util.h"
#include "tests/tls_util.h"

#define MiB ((size_t)1 << 20)

/* A listener whose comms keep what they receive and do not answer. */
static void keep_listener(struct tu *h)
{
	tt_init(h);
	h->sopts.echo = 0;
	h->sopts.keep = 1;
	ck_assert_int_eq(tu_listen(h, "tls://127.0.0.1:0"), 0);
}

/* The server got exactly one message, intact, then an orderly end. */
static void check_received(struct tu *h, size_t idx, const size_t *lens, size_t nf, unsigned seed)
{
	struct tu_peer *sp = tu_server_peer(h, idx);
	ck_assert_ptr_nonnull(sp);
	ck_assert_msg(tu_wait_flag(h, &sp->closed, TU_WAIT_MS), "server comm still open");
	ck_assert_msg(sp->close_err == 0, "server: %s (%s)", tw_strerror(sp->close_err),
		      sp->last_error);
	ck_assert_uint_eq(sp->nmsgs, 1);
	ck_assert_msg(tu_msg_matches(sp->msgs[0], lens, nf, seed), "message differs");
}

/* Write the last message and close at once: the close flushes it. */
START_TEST(close_right_after_write)
{
	size_t sizes[] = {1, MiB, tu_quick() ? 8 * MiB : 64 * MiB};
	struct tu h;
	keep_listener(&h);
	for (size_t i = 0; i < 3; i++) {
		struct tu_peer *cli;
		size_t lens[] = {sizes[i], 3};
		ck_assert_int_eq(tt_connect(&h, h.ctx, h.addr, &cli, NULL, 0), 0);
		ck_assert_int_eq(tw_comm_write(cli->comm, tu_msg_pattern(lens, 2, (unsigned)i)), 0);
		tw_comm_close(cli->comm);
		ck_assert(tu_wait_flag(&h, &cli->closed, TU_WAIT_MS));
		ck_assert_msg(cli->close_err == 0, "client: %s (%s)", tw_strerror(cli->close_err),
			      cli->last_error);
		check_received(&h, i, lens, 2, (unsigned)i);
	}
	tt_fini(&h);
}
END_TEST

/* Free the comm from its drain callback, right after the write. */
struct freer {
	tw_comm *comm;
	int drained, closed;
};

static void ignore_recv(tw_comm *c, tw_msg *m, void *arg)
{
	(void)c;
	(void)m;
	(void)arg;
}

static void on_freer_close(tw_comm *c, int err, void *arg)
{
	(void)c;
	(void)err;
	((struct freer *)arg)->closed = 1;
}

static void free_on_drain(tw_comm *c, void *arg)
{
	struct freer *f = arg;
	f->drained = 1;
	tw_comm_free(c);
}

START_TEST(free_right_after_drain)
{
	size_t sizes[] = {1, MiB, tu_quick() ? 8 * MiB : 64 * MiB};
	struct tu h;
	keep_listener(&h);
	for (size_t i = 0; i < 3; i++) {
		struct freer f = {NULL, 0, 0};
		size_t lens[] = {sizes[i]};
		ck_assert_int_eq(tt_connect_bare(&h, h.ctx, h.addr, &f.comm, NULL, 0), 0);
		ck_assert_int_eq(tw_comm_set_callbacks(f.comm, ignore_recv, on_freer_close,
						       free_on_drain, &f),
				 0);
		ck_assert_int_eq(tw_comm_write(f.comm, tu_msg_pattern(lens, 1, 40 + (unsigned)i)),
				 0);
		ck_assert(tu_wait_flag(&h, &f.drained, TU_WAIT_MS));
		ck_assert_int_eq(f.closed, 0); /* freed: no close callback */
		check_received(&h, i, lens, 1, 40 + (unsigned)i);
	}
	tt_fini(&h);
}
END_TEST

/* The client writes and vanishes; the server's echo then writes to a
 * closed socket. That must end the server's comm with an error, never
 * raise SIGPIPE (whose default action, kept by this suite, kills the
 * process), and leave the other comms alone. */
START_TEST(write_to_closed_peer)
{
	struct tu h;
	struct tu_peer *good = tt_setup_echo(&h), *sp;
	struct freer f = {NULL, 0, 0};
	size_t lens[] = {8 * MiB};
	ck_assert_int_eq(tt_connect_bare(&h, h.ctx, h.addr, &f.comm, NULL, 0), 0);
	ck_assert_int_eq(
		tw_comm_set_callbacks(f.comm, ignore_recv, on_freer_close, free_on_drain, &f), 0);
	ck_assert_int_eq(tw_comm_write(f.comm, tu_msg_pattern(lens, 1, 3)), 0);
	ck_assert(tu_wait_flag(&h, &f.drained, TU_WAIT_MS));
	sp = tu_server_peer(&h, 1);
	ck_assert(tu_wait_flag(&h, &sp->closed, TU_WAIT_MS));
	ck_assert_msg(sp->close_err == TW_EIO, "server: %s (%s)", tw_strerror(sp->close_err),
		      sp->last_error);
	ck_assert_msg(strlen(sp->last_error) > 0, "no reason");
	tt_canary(good, 0);
	tt_fini(&h);
}
END_TEST

/* Many queued messages, then close: every one arrives before the end. */
START_TEST(close_with_full_queue)
{
	struct tu h;
	struct tu_peer *cli, *sp;
	size_t lens[] = {MiB + 17};
	tw_msg *late;
	keep_listener(&h);
	ck_assert_int_eq(tt_connect(&h, h.ctx, h.addr, &cli, NULL, 0), 0);
	for (unsigned i = 0; i < 40; i++)
		ck_assert_int_eq(tw_comm_write(cli->comm, tu_msg_pattern(lens, 1, i)), 0);
	tw_comm_close(cli->comm);
	late = tu_msg_pattern(lens, 1, 0);
	ck_assert_int_eq(tw_comm_write(cli->comm, late), TW_ECLOSED);
	tw_msg_free(late); /* refused: still the caller's */
	ck_assert(tu_wait_flag(&h, &cli->closed, TU_WAIT_MS));
	ck_assert_int_eq(cli->close_err, 0);
	sp = tu_server_peer(&h, 0);
	ck_assert(tu_wait_flag(&h, &sp->closed, TU_WAIT_MS));
	ck_assert_msg(sp->close_err == 0, "%s", sp->last_error);
	ck_assert_uint_eq(sp->nmsgs, 40);
	for (unsigned i = 0; i < 40; i++)
		ck_assert_msg(tu_msg_matches(sp->msgs[i], lens, 1, i), "message %u", i);
	tt_fini(&h);
}
END_TEST

/* BH-11: 2,000 messages of three referenced frames (17, 70,000 and 1
 * bytes) pipelined through the echo, so SSL_write keeps hitting a full
 * socket and retrying from a rebuilt iovec. Every byte comes back in
 * order, and each reference is released exactly once, after its message
 * was written. */
#define NREF 2000
static const size_t ref_lens[3] = {17, 70000, 1};
static uint8_t *ref_buf;
static tw_comm *ref_comm;
static uint64_t ref_wire;
static int ref_released[NREF];

static void ref_release(void *data, void *arg)
{
	size_t i = (size_t)(uintptr_t)arg;
	tw_stats st;
	(void)data;
	tw_comm_stats(ref_comm, &st);
	ck_assert_msg(st.bytes_sent >= (i + 1) * ref_wire, "message %zu released unsent", i);
	ref_released[i]++;
}

static tw_msg *ref_msg(size_t i)
{
	tw_msg *m;
	ck_assert_int_eq(tw_msg_new(&m), 0);
	for (size_t f = 0; f < 3; f++)
		ck_assert_int_eq(tw_msg_append_ref(m, ref_buf + (i + f) % 251, ref_lens[f],
						   ref_release, (void *)(uintptr_t)i),
				 0);
	return m;
}

START_TEST(partial_writes_of_references)
{
	struct tu h;
	struct tu_peer *cli = tt_setup_echo(&h);
	size_t n = tu_quick() ? 200 : NREF;
	ref_buf = malloc(251 + 70000);
	tu_fill(ref_buf, 251 + 70000, 0);
	ref_comm = cli->comm;
	ref_wire = 8 * 5 + 17 + 70000 + 1;
	for (size_t i = 0; i < n; i++) {
		tw_msg *m = ref_msg(i);
		int rv;
		while ((rv = tw_comm_write(cli->comm, m)) == TW_EAGAIN)
			event_base_loop(h.base, EVLOOP_ONCE); /* above the high-water mark */
		ck_assert_int_eq(rv, 0);
	}
	ck_assert(tu_wait_count(&h, &cli->nmsgs, n, TU_WAIT_MS));
	for (size_t i = 0; i < n; i++) {
		ck_assert_msg(tu_msg_matches(cli->msgs[i], ref_lens, 3, (unsigned)(i % 251)),
			      "message %zu", i);
		/* one release per frame */
		ck_assert_msg(ref_released[i] == 3, "message %zu: %d releases", i, ref_released[i]);
	}
	ck_assert_int_eq(cli->closed, 0);
	tt_fini(&h);
	free(ref_buf);
}
END_TEST

/* BH-14: sequential connections, each one small echo and an orderly
 * close, then clients refused for their certificate: the process's fds
 * come back to where they were and no socket is left in CLOSE_WAIT. */
START_TEST(many_sequential_connections)
{
	struct tu h;
	int n = tu_quick() ? 50 : 500, nbad = tu_quick() ? 10 : 100, fd0, stage;
	tw_context *bad;
	char why[512];
	tt_init(&h);
	h.sopts.free_in_close = 1;
	ck_assert_int_eq(tu_listen(&h, "tls://127.0.0.1:0"), 0);
	bad = tt_context(&h, "ca.pem", "other-cert.pem", "other-key.pem");
	fd0 = tt_fd_count();
	for (int i = 0; i < n; i++) {
		struct tu_peer *cli, *sp;
		size_t lens[] = {(size_t)i % 300 + 1};
		int rv = tt_connect(&h, h.ctx, h.addr, &cli, why, sizeof(why));
		ck_assert_msg(rv == 0, "connection %d: %s: %s", i, tw_strerror(rv), why);
		cli->keep = 1;
		tu_echo_check(cli, lens, 1, (unsigned)i, TU_WAIT_MS);
		tw_comm_close(cli->comm);
		ck_assert_msg(tu_wait_flag(&h, &cli->closed, TU_WAIT_MS), "connection %d", i);
		ck_assert_msg(cli->close_err == 0, "connection %d: %s", i, cli->last_error);
		sp = tu_server_peer(&h, (size_t)i);
		ck_assert(tu_wait_flag(&h, &sp->closed, TU_WAIT_MS));
		ck_assert_msg(sp->close_err == 0, "connection %d: %s", i, sp->last_error);
		tt_peer_free(cli);
	}
	for (int i = 0; i < nbad; i++) {
		int rv = tt_refused(&h, bad, h.addr, i % 2, TU_WAIT_MS, &stage, why, sizeof(why));
		ck_assert_msg(rv == TW_ETLS, "bad client %d: %s: %s", i, tw_strerror(rv), why);
	}
	tu_run_for(&h, 100);
	ck_assert_msg(abs(tt_fd_count() - fd0) <= 2, "fds: %d at start, %d now", fd0,
		      tt_fd_count());
	ck_assert_int_eq(tt_close_wait_count(tt_uri_port(h.addr)), 0);
	ck_assert_uint_eq(h.nsrv, (size_t)n);
	tt_fini(&h);
}
END_TEST

/* A client driven by hand with OpenSSL on a raw socket, so the test
 * decides when its handshake moves. */
struct raw_tls {
	SSL_CTX *ctx;
	SSL *ssl;
	int fd, result; /* 1 done, -1 failed, 0 in progress */
};

static void raw_tls_start(struct raw_tls *r, const char *uri)
{
	r->ctx = SSL_CTX_new(TLS_client_method());
	ck_assert_ptr_nonnull(r->ctx);
	ck_assert_int_eq(SSL_CTX_load_verify_locations(r->ctx, tt_cert("ca.pem"), NULL), 1);
	ck_assert_int_eq(SSL_CTX_use_certificate_chain_file(r->ctx, tt_cert("cert.pem")), 1);
	ck_assert_int_eq(SSL_CTX_use_PrivateKey_file(r->ctx, tt_cert("key.pem"), SSL_FILETYPE_PEM),
			 1);
	r->fd = tu_raw_connect(uri);
	ck_assert_int_eq(fcntl(r->fd, F_SETFL, O_NONBLOCK), 0);
	r->ssl = SSL_new(r->ctx);
	SSL_set_fd(r->ssl, r->fd);
	SSL_set_connect_state(r->ssl);
	r->result = 0;
}

/* One step of the client: handshake, then read until the server's EOF. */
static int raw_tls_step(void *arg)
{
	struct raw_tls *r = arg;
	char buf[256];
	int rv, e;
	ERR_clear_error();
	rv = SSL_is_init_finished(r->ssl) ? SSL_read(r->ssl, buf, sizeof(buf))
					  : SSL_do_handshake(r->ssl);
	e = SSL_get_error(r->ssl, rv);
	if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE || rv > 0)
		return 0;
	r->result = SSL_is_init_finished(r->ssl) ? 1 : -1;
	return 1;
}

/* One step of the client's handshake alone: 1 when it finished. */
static int raw_tls_handshake_step(void *arg)
{
	struct raw_tls *r = arg;
	int rv, e;
	ERR_clear_error();
	rv = SSL_do_handshake(r->ssl);
	e = SSL_get_error(r->ssl, rv);
	if (rv != 1 && (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE))
		return 0;
	r->result = rv == 1 ? 1 : -1;
	return 1;
}

static void raw_tls_free(struct raw_tls *r)
{
	SSL_free(r->ssl);
	SSL_CTX_free(r->ctx);
	close(r->fd);
	ERR_clear_error();
}

/* The listener is freed while a client's TLS handshake is in progress:
 * that connection is dropped (it has no one to be handed to), and
 * nothing touches the freed listener. */
START_TEST(listener_freed_mid_handshake)
{
	struct tu h;
	struct raw_tls r;
	struct sigaction ign = {.sa_handler = SIG_IGN}, old;
	int fd0;
	/* The hand-driven client writes with write(2) to a socket the server
	 * may have closed; only the library must never raise SIGPIPE. */
	sigaction(SIGPIPE, &ign, &old);
	tt_init(&h);
	ck_assert_int_eq(tu_listen(&h, "tls://127.0.0.1:0"), 0);
	fd0 = tt_fd_count();
	raw_tls_start(&r, h.addr);
	tu_run_for(&h, 100); /* accepted; the server waits for the ClientHello */
	tw_listener_free(h.lis);
	h.lis = NULL;
	ck_assert_msg(tu_run_until(&h, raw_tls_step, &r, TU_WAIT_MS), "client hung");
	tu_run_for(&h, 100);
	ck_assert_uint_eq(h.nsrv, 0);
	raw_tls_free(&r);
	ck_assert_int_eq(tt_fd_count(), fd0 - 1); /* the listening socket */
	tt_fini(&h);
	sigaction(SIGPIPE, &old, NULL);
}
END_TEST

/* A peer that ends in the middle of a message: after close_notify, at
 * a TCP EOF without close_notify, or with a reset. The server's comm
 * ends with TW_ETRUNCATED (TW_EIO for the reset) and a reason. */
enum { END_NOTIFY, END_EOF, END_RESET };

static void end_mid_message(struct tu *h, int how, size_t idx, int want)
{
	struct raw_tls r;
	struct tu_peer *sp;
	uint64_t prelude[3] = {16 + 1000, 1, 1000};
	static uint8_t body[500];
	size_t put = 0;
	raw_tls_start(&r, h->addr);
	ck_assert(tu_run_until(h, raw_tls_handshake_step, &r, TU_WAIT_MS));
	ck_assert_int_eq(r.result, 1);
	ck_assert_int_eq(SSL_write_ex(r.ssl, prelude, sizeof(prelude), &put), 1);
	ck_assert_int_eq(SSL_write_ex(r.ssl, body, sizeof(body), &put), 1);
	sp = tu_server_peer(h, idx);
	ck_assert_ptr_nonnull(sp);
	if (how == END_NOTIFY)
		SSL_shutdown(r.ssl);
	if (how == END_RESET) {
		struct linger lg = {1, 0};
		tu_run_for(h, 50); /* let the server take the bytes first */
		setsockopt(r.fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
	}
	raw_tls_free(&r);
	ck_assert(tu_wait_flag(h, &sp->closed, TU_WAIT_MS));
	ck_assert_msg(sp->close_err == want, "end %d: %s (%s)", how, tw_strerror(sp->close_err),
		      sp->last_error);
	ck_assert_uint_gt(strlen(sp->last_error), 0);
	ck_assert_uint_eq(sp->nmsgs, 0);
}

START_TEST(peer_ends_mid_message)
{
	struct tu h;
	struct sigaction ign = {.sa_handler = SIG_IGN}, old;
	sigaction(SIGPIPE, &ign, &old); /* the hand-driven client's writes */
	keep_listener(&h);
	end_mid_message(&h, END_NOTIFY, 0, TW_ETRUNCATED);
	end_mid_message(&h, END_EOF, 1, TW_ETRUNCATED);
	end_mid_message(&h, END_RESET, 2, TW_EIO);
	tt_fini(&h);
	sigaction(SIGPIPE, &old, NULL);
}
END_TEST

/* Read-ahead over tls: the raw peer is a client SSL on a plain socket
 * (the harness's certificates), driven by hand. */

static void ra_open_tls(struct tu *h, struct ra_peer *p)
{
	struct raw_tls r;
	raw_tls_start(&r, h->addr);
	ck_assert(tu_run_until(h, raw_tls_handshake_step, &r, TU_WAIT_MS));
	ck_assert_int_eq(r.result, 1);
	SSL_set_mode(r.ssl, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
	memset(p, 0, sizeof(*p));
	p->h = h;
	p->fd = r.fd;
	p->ssl = r.ssl;
	p->ssl_ctx = r.ctx;
}

static uint64_t blocks_live(void)
{
	tw_stats st;
	tw_stats_global(&st);
	return st.blocks_live;
}

static void ra_tls_setup(struct tu *h, struct ra_env *e, int dask)
{
	char why[512] = "";
	int rv;
	tt_init(h);
	ra_listen(h, "tls://127.0.0.1:0", dask);
	memset(e, 0, sizeof(*e));
	e->h = h;
	e->open = ra_open_tls;
	e->seed = 99;
	if (!dask) {
		rv = tt_connect(h, h->ctx, h->addr, &e->good, why, sizeof(why));
		ck_assert_msg(rv == 0, "tls connect: %s: %s", tw_strerror(rv), why);
		ck_assert_ptr_nonnull(e->good_srv = tu_server_peer(h, 0));
	}
}

enum { RA_PIPELINED, RA_LARGE, RA_BAD, RA_PENDING, RA_HANDSHAKE, RA_SOAK, RA_READ_CALLS };

static void ra_tls_run(int which)
{
	struct tu h;
	struct ra_env e;
	struct sigaction ign = {.sa_handler = SIG_IGN}, old;
	uint64_t live0 = blocks_live();
	sigaction(SIGPIPE, &ign, &old); /* the hand-driven client's writes */
	ra_tls_setup(&h, &e, which == RA_HANDSHAKE);
	switch (which) {
	case RA_PIPELINED: ra_pipelined(&e); break;
	case RA_LARGE: ra_runs_then_large(&e, 5 * MiB); break;
	case RA_BAD: ra_bad_heads(&e); break;
	case RA_PENDING: ra_pending(&e); break;
	case RA_READ_CALLS: ra_read_calls(&e); break;
	case RA_SOAK:
		for (unsigned i = 0; i < (tu_quick() ? 2u : 6u); i++) {
			e.seed += 1000;
			ra_soak(&e, 400);
		}
		break;
	default: ra_after_handshake(&e, 5 * MiB); break;
	}
	tt_fini(&h);
	ck_assert_uint_eq(blocks_live(), live0);
	sigaction(SIGPIPE, &old, NULL);
}

START_TEST(readahead_pipelined)
{
	ra_tls_run(RA_PIPELINED);
}
END_TEST

START_TEST(readahead_runs_then_large)
{
	ra_tls_run(RA_LARGE);
}
END_TEST

START_TEST(readahead_bad_heads)
{
	ra_tls_run(RA_BAD);
}
END_TEST

START_TEST(readahead_pending)
{
	ra_tls_run(RA_PENDING);
}
END_TEST

START_TEST(readahead_after_handshake)
{
	ra_tls_run(RA_HANDSHAKE);
}
END_TEST

START_TEST(readahead_soak)
{
	ra_tls_run(RA_SOAK);
}
END_TEST

START_TEST(readahead_read_calls)
{
	ra_tls_run(RA_READ_CALLS);
}
END_TEST

TCase *tls_close_tcase(void)
{
	TCase *tc = tcase_create("close");
	tcase_set_timeout(tc, 300);
	tcase_add_test(tc, close_right_after_write);
	tcase_add_test(tc, free_right_after_drain);
	tcase_add_test(tc, write_to_closed_peer);
	tcase_add_test(tc, close_with_full_queue);
	tcase_add_test(tc, partial_writes_of_references);
	tcase_add_test(tc, many_sequential_connections);
	tcase_add_test(tc, listener_freed_mid_handshake);
	tcase_add_test(tc, peer_ends_mid_message);
	tcase_add_test(tc, readahead_pipelined);
	tcase_add_test(tc, readahead_runs_then_large);
	tcase_add_test(tc, readahead_bad_heads);
	tcase_add_test(tc, readahead_pending);
	tcase_add_test(tc, readahead_after_handshake);
	tcase_add_test(tc, readahead_read_calls);
	tcase_add_test(tc, readahead_soak);
	return tc;
}
