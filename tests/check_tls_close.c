/* SPDX-License-Identifier: BSD-3-Clause */
/* Closing tls comms without losing data, partial writes of referenced
 * frames (SSL_write retried from a rebuilt iovec), no leaks over many
 * connections, read-ahead
 * over tls (tests/support/readahead.h), where SSL_read_ex is the readv, and
 * TLS 1.3 KeyUpdates that arrive while a send side is full. */
#include <endian.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <check.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <unistd.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <event2/event.h>

#include "tests/check_tls.h"
#include "tests/support/readahead.h"
#include "tests/support/tls.h"
#include "tests/support/suite.h"

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
	ck_assert_msg(ts_msg_matches(sp->msgs[0], lens, nf, seed), "message differs");
}

/* Write the last message and close at once: the close flushes it. */
START_TEST(close_right_after_write)
{
	size_t sizes[] = {1, MiB, ts_quick() ? 8 * MiB : 64 * MiB};
	struct tu h;
	keep_listener(&h);
	for (size_t i = 0; i < 3; i++) {
		struct tu_peer *cli;
		size_t lens[] = {sizes[i], 3};
		ck_assert_int_eq(tt_connect(&h, h.ctx, h.addr, &cli, NULL, 0), 0);
		ck_assert_int_eq(tw_comm_write(cli->comm, ts_msg_pattern(lens, 2, (unsigned)i)), 0);
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
	size_t sizes[] = {1, MiB, ts_quick() ? 8 * MiB : 64 * MiB};
	struct tu h;
	keep_listener(&h);
	for (size_t i = 0; i < 3; i++) {
		struct freer f = {NULL, 0, 0};
		size_t lens[] = {sizes[i]};
		ck_assert_int_eq(tt_connect_bare(&h, h.ctx, h.addr, &f.comm, NULL, 0), 0);
		ck_assert_int_eq(tw_comm_set_callbacks(f.comm, ignore_recv, on_freer_close,
						       free_on_drain, &f),
				 0);
		ck_assert_int_eq(tw_comm_write(f.comm, ts_msg_pattern(lens, 1, 40 + (unsigned)i)),
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
	ck_assert_int_eq(tw_comm_write(f.comm, ts_msg_pattern(lens, 1, 3)), 0);
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
		ck_assert_int_eq(tw_comm_write(cli->comm, ts_msg_pattern(lens, 1, i)), 0);
	tw_comm_close(cli->comm);
	late = ts_msg_pattern(lens, 1, 0);
	ck_assert_int_eq(tw_comm_write(cli->comm, late), TW_ECLOSED);
	tw_msg_free(late); /* refused: still the caller's */
	ck_assert(tu_wait_flag(&h, &cli->closed, TU_WAIT_MS));
	ck_assert_int_eq(cli->close_err, 0);
	sp = tu_server_peer(&h, 0);
	ck_assert(tu_wait_flag(&h, &sp->closed, TU_WAIT_MS));
	ck_assert_msg(sp->close_err == 0, "%s", sp->last_error);
	ck_assert_uint_eq(sp->nmsgs, 40);
	for (unsigned i = 0; i < 40; i++)
		ck_assert_msg(ts_msg_matches(sp->msgs[i], lens, 1, i), "message %u", i);
	tt_fini(&h);
}
END_TEST

/* Partial writes: 2,000 messages of three referenced frames (17, 70,000 and 1
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
	tw_comm_stats(ref_comm, &st, sizeof(st));
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
	size_t n = ts_quick() ? 200 : NREF;
	ref_buf = malloc(251 + 70000);
	ts_fill(ref_buf, 251 + 70000, 0);
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
		ck_assert_msg(ts_msg_matches(cli->msgs[i], ref_lens, 3, (unsigned)(i % 251)),
			      "message %zu", i);
		/* one release per frame */
		ck_assert_msg(ref_released[i] == 3, "message %zu: %d releases", i, ref_released[i]);
	}
	ck_assert_int_eq(cli->closed, 0);
	tt_fini(&h);
	free(ref_buf);
}
END_TEST

/* No leaks: sequential connections, each one small echo and an orderly
 * close, then clients refused for their certificate: the process's fds
 * come back to where they were and no socket is left in CLOSE_WAIT. */
START_TEST(many_sequential_connections)
{
	struct tu h;
	int n = ts_quick() ? 50 : 500, nbad = ts_quick() ? 10 : 100, fd0, stage;
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
	ck_assert_int_eq(SSL_CTX_load_verify_locations(r->ctx, ts_cert("ca.pem"), NULL), 1);
	ck_assert_int_eq(SSL_CTX_use_certificate_chain_file(r->ctx, ts_cert("cert.pem")), 1);
	ck_assert_int_eq(SSL_CTX_use_PrivateKey_file(r->ctx, ts_cert("key.pem"), SSL_FILETYPE_PEM),
			 1);
	r->fd = ts_raw_connect(uri);
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

/* Around a test whose hand-driven client writes with write(2) to a
 * socket the server may have closed: SIGPIPE is ignored meanwhile (only
 * the library must never raise it), and the blocks live at the start are
 * kept. */
struct hand_driven {
	struct sigaction old;
	uint64_t live0;
};

static void hand_begin(struct hand_driven *d)
{
	struct sigaction ign = {.sa_handler = SIG_IGN};
	d->live0 = ts_blocks_live();
	sigaction(SIGPIPE, &ign, &d->old);
}

/* tt_fini(h); with check_blocks, the live blocks are back where they
 * were; SIGPIPE's action is restored. */
static void hand_end(struct hand_driven *d, struct tu *h, int check_blocks)
{
	tt_fini(h);
	if (check_blocks)
		ck_assert_uint_eq(ts_blocks_live(), d->live0);
	sigaction(SIGPIPE, &d->old, NULL);
}

/* The listener is freed while a client's TLS handshake is in progress:
 * that connection is dropped (it has no one to be handed to), and
 * nothing touches the freed listener. */
START_TEST(listener_freed_mid_handshake)
{
	struct tu h;
	struct raw_tls r;
	struct hand_driven hd;
	int fd0;
	hand_begin(&hd);
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
	hand_end(&hd, &h, 0);
}
END_TEST

/* A client that resets before its handshake is named by the listener's
 * error callback, with the address kept from accept (tcp:
 * check_tcp_errors' peer_address_kept_from_accept). */
START_TEST(reset_before_handshake_named)
{
	struct tu h;
	tt_init(&h);
	ck_assert_int_eq(tu_listen(&h, "tls://127.0.0.1:0"), 0);
	tu_reset_named(&h, "tls");
	tu_reset_named(&h, "tls");
	tt_fini(&h);
}
END_TEST

/* A peer that ends in the middle of a message: after close_notify, at
 * a TCP EOF without close_notify, or with a reset. The server's comm
 * ends with TW_ETRUNCATED (TW_EIO for the reset) and a reason that says
 * how much of the message had arrived (issue 17: "after 0" where 99 MiB
 * had). */
enum { END_NOTIFY, END_EOF, END_RESET };

/* Send n bytes over r's TLS, driving the loop while the socket is full
 * (the server reads on this thread). */
static void raw_tls_send(struct tu *h, struct raw_tls *r, const void *p, size_t n)
{
	long long deadline = ts_now_ms() + TU_WAIT_MS;
	size_t done = 0;
	SSL_set_mode(r->ssl, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
	while (done < n) {
		size_t put = 0;
		int e;
		ERR_clear_error();
		if (SSL_write_ex(r->ssl, (const uint8_t *)p + done, n - done, &put) == 1) {
			done += put;
			deadline = ts_now_ms() + TU_WAIT_MS; /* a hang guard: slow is not stuck */
			continue;
		}
		e = SSL_get_error(r->ssl, 0);
		ck_assert_msg(e == SSL_ERROR_WANT_WRITE || e == SSL_ERROR_WANT_READ,
			      "SSL_write_ex at %zu of %zu bytes: error %d", done, n, e);
		ck_assert_msg(ts_now_ms() < deadline, "send stalled at %zu of %zu bytes", done, n);
		tu_run_for(h, 5);
	}
}

/* A hand-driven client, its handshake done, that wrote n bytes of p. */
static void send_bytes(struct tu *h, struct raw_tls *r, const void *p, size_t n)
{
	raw_tls_start(r, h->addr);
	ck_assert(tu_run_until(h, raw_tls_handshake_step, r, TU_WAIT_MS));
	ck_assert_int_eq(r->result, 1);
	raw_tls_send(h, r, p, n);
}

/* A hand-driven client that wrote body_len bytes of a one-frame message
 * of 1000 bytes. */
static void send_part(struct tu *h, struct raw_tls *r, size_t body_len)
{
	static uint8_t buf[24 + 1000];
	uint64_t prelude[3] = {htole64(16 + 1000), htole64(1), htole64(1000)};
	memcpy(buf, prelude, sizeof(prelude));
	send_bytes(h, r, buf, sizeof(prelude) + body_len);
}

/* The client wrote n bytes of p and ends `how`: the server's comm idx
 * got nmsgs whole messages, then ended with want and a text that has
 * `says` (NULL: any). */
static void end_after_msgs(struct tu *h, const void *p, size_t n, int how, size_t idx, int want,
			   const char *says, size_t nmsgs)
{
	struct raw_tls r;
	struct tu_peer *sp;
	send_bytes(h, &r, p, n);
	ck_assert_ptr_nonnull(sp = tu_server_peer(h, idx));
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
	if (says != NULL)
		ck_assert_msg(strstr(sp->last_error, says) != NULL, "end %d: text '%s', not '%s'",
			      how, sp->last_error, says);
	ck_assert_uint_gt(strlen(sp->last_error), 0);
	ck_assert_uint_eq(sp->nmsgs, nmsgs);
}

static void end_after(struct tu *h, const void *p, size_t n, int how, size_t idx, int want,
		      const char *says)
{
	end_after_msgs(h, p, n, how, idx, want, says, 0);
}

/* Append u64 little-endian words. */
static void put_u64(uint8_t *buf, size_t *len, uint64_t v)
{
	v = htole64(v);
	memcpy(buf + *len, &v, 8);
	*len += 8;
}

START_TEST(peer_ends_mid_message)
{
	static uint8_t buf[24 + 1000];
	uint64_t prelude[3] = {htole64(16 + 1000), htole64(1), htole64(1000)};
	const char *says = "peer closed in the middle of a message: after 524 of its 1024 bytes";
	struct tu h;
	struct hand_driven hd;
	memcpy(buf, prelude, sizeof(prelude));
	hand_begin(&hd);
	keep_listener(&h);
	end_after(&h, buf, 24 + 500, END_NOTIFY, 0, TW_ETRUNCATED, says);
	end_after(&h, buf, 24 + 500, END_EOF, 1, TW_ETRUNCATED, says);
	end_after(&h, buf, 24 + 500, END_RESET, 2, TW_EIO, NULL);
	hand_end(&hd, &h, 0);
}
END_TEST

/* The count in the text is what arrived, at every point of a message
 * (tcp: check_tcp_errors' peer_closes_mid_message), the peer ending with
 * close_notify or a bare EOF. */
START_TEST(mid_message_counts)
{
	static uint8_t small[2 * (24 + 1000)], big[32 + 2 * MiB];
	/* frames of 300 KiB and 1.7 MiB (340 KiB in valgrind's quick runs) */
	const size_t body = ts_quick() ? 640 << 10 : 2 * MiB;
	const unsigned long long big_total = 8 + 24 + body;
	struct {
		const uint8_t *p;
		size_t n;                 /* bytes of p sent */
		unsigned long long total; /* the message's, 0 while unknown */
		size_t nmsgs;             /* whole messages before */
	} cut[6];
	size_t n = 0, k = 0, ns = 0;
	char says[128];
	struct tu h;
	struct hand_driven hd;
	/* a small message: prelude and a 1,000-byte frame */
	put_u64(small, &ns, 8 + 8 + 1000);
	put_u64(small, &ns, 1);
	put_u64(small, &ns, 1000);
	memcpy(small + ns + 1000, small, ns); /* a second one behind it */
	/* two frames, the second in many TLS records */
	put_u64(big, &n, 8 + 16 + body);
	put_u64(big, &n, 2);
	put_u64(big, &n, 300 << 10);
	put_u64(big, &n, body - (300 << 10));
	ts_fill(big + n, body, 5);
	memset(cut, 0, sizeof(cut));
	/* inside the 16-byte head */
	cut[k].p = small, cut[k].n = 7, cut[k++].total = 0;
	/* a whole message, and 7 bytes of the next read along with it */
	cut[k].p = small, cut[k].n = ns + 1000 + 7, cut[k].nmsgs = 1, cut[k++].total = 0;
	/* half of the small message's frame */
	cut[k].p = small, cut[k].n = ns + 500, cut[k++].total = 8 + 16 + 1000;
	/* in the middle of the lengths */
	cut[k].p = big, cut[k].n = n - 4, cut[k++].total = big_total;
	/* 600 KiB into the frames: into the second */
	cut[k].p = big, cut[k].n = n + (600 << 10), cut[k++].total = big_total;
	/* all but the last byte */
	cut[k].p = big, cut[k].n = n + body - 1, cut[k++].total = big_total;
	hand_begin(&hd);
	keep_listener(&h);
	/* each cut with both ends; in quick runs (valgrind) one, by turns */
	for (size_t i = 0, idx = 0; i < k; i++)
		for (int how = END_NOTIFY; how <= END_EOF; how++) {
			size_t got = cut[i].n - cut[i].nmsgs * (ns + 1000);
			if (ts_quick() && (size_t)how != i % 2)
				continue;
			if (cut[i].total == 0)
				snprintf(says, sizeof(says),
					 "in the middle of a message: after %zu bytes of its "
					 "prelude",
					 got);
			else
				snprintf(says, sizeof(says),
					 "in the middle of a message: after %zu of its %llu bytes",
					 got, cut[i].total);
			end_after_msgs(&h, cut[i].p, cut[i].n, how, idx++, TW_ETRUNCATED, says,
				       cut[i].nmsgs);
		}
	hand_end(&hd, &h, 0);
}
END_TEST

/* Data and close_notify in one TCP segment, and no FIN after it:
 * OpenSSL takes the close_notify off the socket along with the data, so
 * the socket never becomes readable again. The comm must still end: in
 * order after a whole message, with TW_ETRUNCATED after part of one. */
static void notify_with_data(struct tu *h, size_t idx, size_t body_len)
{
	struct raw_tls r;
	struct tu_peer *sp;
	/* the loop does not run until data and close_notify are in the
	 * server's socket */
	send_part(h, &r, body_len);
	SSL_shutdown(r.ssl);
	ck_assert_ptr_nonnull(sp = tu_server_peer(h, idx));
	ck_assert_msg(tu_wait_flag(h, &sp->closed, TU_WAIT_MS),
		      "close_notify after %zu bytes missed", body_len);
	if (body_len == 1000) {
		ck_assert_msg(sp->close_err == 0, "%s (%s)", tw_strerror(sp->close_err),
			      sp->last_error);
		ck_assert_uint_eq(sp->nmsgs, 1);
	} else {
		ck_assert_int_eq(sp->close_err, TW_ETRUNCATED);
		ck_assert_uint_eq(sp->nmsgs, 0);
	}
	raw_tls_free(&r); /* only now the FIN */
}

START_TEST(close_notify_with_data)
{
	struct tu h;
	keep_listener(&h);
	notify_with_data(&h, 0, 1000);
	notify_with_data(&h, 1, 500);
	tt_fini(&h);
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

static void ra_tls_setup(struct tu *h, struct ra_env *e, int dask)
{
	char why[512] = "";
	int rv;
	tt_init(h);
	ra_listen(h, "tls://127.0.0.1:0", dask);
	ra_env_init(e, h, ra_open_tls, 99, 6);
	if (!dask) {
		rv = tt_connect(h, h->ctx, h->addr, &e->good, why, sizeof(why));
		ck_assert_msg(rv == 0, "tls connect: %s: %s", tw_strerror(rv), why);
		ck_assert_ptr_nonnull(e->good_srv = tu_server_peer(h, 0));
	}
}

START_TEST(readahead_scenarios)
{
	struct tu h;
	struct ra_env e;
	struct hand_driven hd;
	hand_begin(&hd);
	ra_tls_setup(&h, &e, ra_cases[_i].dask);
	ra_cases[_i].run(&e);
	hand_end(&hd, &h, 1);
}
END_TEST

/* TLS 1.3 KeyUpdate (RFC 8446 section 4.6.3) while the send side of a
 * connection is full. The raw peer is a client SSL driven by hand, as
 * for read-ahead; it asks for an update (update_requested), so our side
 * must answer with a KeyUpdate of its own before its next application
 * data, possibly while an SSL_write of ours waits on a full socket. */

/* A message whose frames are pseudo-random bytes (a lost, repeated or
 * reordered record changes the bytes, unlike a short periodic pattern),
 * and its wire bytes: the stream prelude, then the frames. */
struct noise_msg {
	size_t nf, lens[3];
	uint8_t *wire;
	size_t wire_len, prelude_len;
};

static void noise_msg_init(struct noise_msg *b, size_t big, uint64_t seed)
{
	uint64_t *w, x = seed | 1;
	size_t body = 0;
	b->nf = 3;
	b->lens[0] = 7, b->lens[1] = big, b->lens[2] = 3;
	for (size_t i = 0; i < b->nf; i++)
		body += b->lens[i];
	b->prelude_len = 8 * (b->nf + 2);
	b->wire_len = b->prelude_len + body;
	b->wire = malloc(b->wire_len + 8);
	ck_assert_ptr_nonnull(b->wire);
	w = (uint64_t *)(void *)b->wire;
	w[0] = htole64(8 + 8 * (uint64_t)b->nf + body);
	w[1] = htole64(b->nf);
	for (size_t i = 0; i < b->nf; i++)
		w[2 + i] = htole64(b->lens[i]);
	for (size_t i = b->prelude_len; i < b->wire_len; i += 8) {
		x ^= x << 13, x ^= x >> 7, x ^= x << 17; /* xorshift64 */
		memcpy(b->wire + i, &x, 8);
	}
}

static const uint8_t *noise_frame(const struct noise_msg *b, size_t i)
{
	const uint8_t *p = b->wire + b->prelude_len;
	for (size_t k = 0; k < i; k++)
		p += b->lens[k];
	return p;
}

static tw_msg *noise_msg_new(const struct noise_msg *b)
{
	tw_msg *m;
	ck_assert_int_eq(tw_msg_new(&m), 0);
	for (size_t i = 0; i < b->nf; i++)
		ck_assert_int_eq(tw_msg_append_copy(m, noise_frame(b, i), b->lens[i]), 0);
	return m;
}

static void noise_msg_check(const struct noise_msg *b, const tw_msg *m)
{
	ck_assert_uint_eq(tw_msg_nframes(m), b->nf);
	for (size_t i = 0; i < b->nf; i++) {
		const tw_slice *f = tw_msg_frame(m, i);
		ck_assert_uint_eq(f->len, b->lens[i]);
		ck_assert_msg(memcmp(tw_slice_data(f), noise_frame(b, i), f->len) == 0,
			      "frame %zu differs", i);
	}
}

/* The received wire bytes are exactly the message's. */
static void noise_wire_check(const struct noise_msg *b, const uint8_t *got)
{
	for (size_t i = 0; i < b->wire_len; i++)
		if (got[i] != b->wire[i])
			ck_abort_msg("byte %zu of %zu differs", i, b->wire_len);
}

/* KeyUpdate messages the raw peer sent and received (its msg callback). */
struct ku_count {
	int sent, received;
};

static void count_key_updates(int write_p, int version, int content_type, const void *buf,
			      size_t len, SSL *ssl, void *arg)
{
	struct ku_count *k = arg;
	(void)version;
	(void)ssl;
	if (content_type != SSL3_RT_HANDSHAKE || len < 1 ||
	    ((const uint8_t *)buf)[0] != SSL3_MT_KEY_UPDATE)
		return;
	if (write_p)
		k->sent++;
	else
		k->received++;
}

/* Open the raw TLS 1.3 peer; *sp is its server comm (keeps what it gets). */
static void ku_open(struct tu *h, struct ra_peer *p, struct ku_count *k, struct tu_peer **sp)
{
	size_t idx = h->nsrv;
	ra_open_tls(h, p);
	ck_assert_int_eq(SSL_version(p->ssl), TLS1_3_VERSION);
	memset(k, 0, sizeof(*k));
	SSL_set_msg_callback(p->ssl, count_key_updates);
	SSL_set_msg_callback_arg(p->ssl, k);
	*sp = tu_server_peer(h, idx);
	ck_assert_ptr_nonnull(*sp);
}

/* The raw peer's nonblocking I/O, one step per loop turn: write out
 * (SSL_write retried with the same bytes after WANT_*), read into in. */
struct pump {
	SSL *ssl;
	const uint8_t *out;
	size_t out_len, out_done;
	uint8_t *in;
	size_t in_len, in_done;
	int write_blocked; /* the last SSL_write wanted I/O */
	int error;         /* SSL_get_error of a failure */
};

/* One SSL_write of at most 64 KiB: 1 when it wrote. */
static int pump_write(struct pump *u)
{
	size_t want = u->out_len - u->out_done < 65536 ? u->out_len - u->out_done : 65536, n;
	int rv;
	ERR_clear_error();
	rv = SSL_write_ex(u->ssl, u->out + u->out_done, want, &n);
	u->write_blocked = rv != 1;
	if (rv == 1) {
		u->out_done += n;
		return 1;
	}
	rv = SSL_get_error(u->ssl, rv);
	if (rv != SSL_ERROR_WANT_WRITE && rv != SSL_ERROR_WANT_READ)
		u->error = rv;
	return 0;
}

static int pump_step(void *arg)
{
	struct pump *u = arg;
	size_t n;
	int rv;
	while (u->error == 0 && u->out_done < u->out_len && pump_write(u))
		;
	while (u->error == 0 && u->in_done < u->in_len) {
		ERR_clear_error();
		rv = SSL_read_ex(u->ssl, u->in + u->in_done, u->in_len - u->in_done, &n);
		if (rv == 1) {
			u->in_done += n;
			continue;
		}
		rv = SSL_get_error(u->ssl, rv);
		if (rv != SSL_ERROR_WANT_WRITE && rv != SSL_ERROR_WANT_READ)
			u->error = rv;
		break;
	}
	return u->error != 0 || (u->out_done == u->out_len && u->in_done == u->in_len);
}

/* The pending write retried until it completes (or fails). */
static int pump_one_write(void *arg)
{
	struct pump *u = arg;
	return pump_write(u) || u->error != 0;
}

static void pump_run(struct tu *h, struct pump *u, const char *what)
{
	ck_assert_msg(tu_run_until(h, pump_step, u, TU_WAIT_MS),
		      "%s: stalled (sent %zu of %zu, received %zu of %zu)", what, u->out_done,
		      u->out_len, u->in_done, u->in_len);
	ck_assert_msg(u->error == 0, "%s: raw peer: SSL error %d", what, u->error);
}

/* The peer writes (u has nothing to read yet) until c has received
 * more than `at` bytes. */
struct read_past {
	struct pump *u;
	tw_comm *c;
	uint64_t at;
};

static int read_past(void *arg)
{
	struct read_past *r = arg;
	tw_stats st;
	pump_step(r->u);
	tw_comm_stats(r->c, &st, sizeof(st));
	return r->u->error != 0 || st.bytes_received > r->at;
}

/* Run the loop until c's queue stops shrinking (its socket is full and
 * the peer does not read); returns the bytes still queued. */
static uint64_t wait_write_blocked(struct tu *h, tw_comm *c)
{
	uint64_t last = UINT64_MAX;
	int still = 0;
	for (int i = 0; still < 5; i++) {
		uint64_t q;
		ck_assert_msg(i < TU_WAIT_MS / 20, "writes never blocked");
		tu_run_for(h, 20);
		q = tw_comm_queued_bytes(c);
		still = q == last ? still + 1 : 0;
		last = q;
	}
	return last;
}

/* One more small message each way (both sides on their new keys), then
 * an orderly close: no error on either side. */
static void ku_finish(struct tu *h, struct ra_peer *p, struct tu_peer *sp, size_t nmsgs)
{
	size_t lens[] = {11, 700};
	struct noise_msg small;
	struct ra_buf b = {0};
	uint8_t *got;
	noise_msg_init(&small, 5000, 77);
	got = malloc(small.wire_len);
	ck_assert_int_eq(tw_comm_write(sp->comm, noise_msg_new(&small)), 0);
	ck_assert(ra_recv(p, got, small.wire_len));
	noise_wire_check(&small, got);
	ra_put_msg(&b, lens, 2, 88);
	ra_send(p, b.p, b.len);
	ck_assert(tu_wait_count(h, &sp->nmsgs, nmsgs + 1, TU_WAIT_MS));
	ck_assert(ts_msg_matches(sp->msgs[nmsgs], lens, 2, 88));
	ra_close(p);
	ck_assert(tu_wait_flag(h, &sp->closed, TU_WAIT_MS));
	ck_assert_msg(sp->close_err == 0, "server: %s (%s)", tw_strerror(sp->close_err),
		      sp->last_error);
	ck_assert_uint_eq(sp->nmsgs, nmsgs + 1);
	ra_buf_free(&b);
	free(got);
	free(small.wire);
}

/* Our side writes a large message that the peer does not read, so its
 * SSL_write waits for a writable socket; the peer then sends a KeyUpdate
 * (update requested) and a small message. The small message is
 * delivered while our write still waits; when the peer reads, every
 * byte of ours arrives in order, and our KeyUpdate came with them. */
START_TEST(key_update_while_our_send_is_full)
{
	struct tu h;
	struct ra_peer p;
	struct tu_peer *sp;
	struct ku_count k;
	struct noise_msg ours;
	struct ra_buf b = {0};
	struct pump u = {0};
	size_t lens[] = {5, 3000};
	struct hand_driven hd;
	hand_begin(&hd);
	keep_listener(&h);
	ku_open(&h, &p, &k, &sp);
	noise_msg_init(&ours, (ts_quick() ? 16 : 48) * MiB, 1);
	ck_assert_int_eq(tw_comm_write(sp->comm, noise_msg_new(&ours)), 0);
	ck_assert_uint_gt(wait_write_blocked(&h, sp->comm), 0);

	ck_assert_int_eq(SSL_key_update(p.ssl, SSL_KEY_UPDATE_REQUESTED), 1);
	ra_put_msg(&b, lens, 2, 9);
	ra_send(&p, b.p, b.len);
	ck_assert_int_eq(k.sent, 1);
	ck_assert_msg(tu_wait_count(&h, &sp->nmsgs, 1, TU_WAIT_MS),
		      "message after the KeyUpdate not delivered (closed %d: %s)", sp->closed,
		      sp->last_error);
	ck_assert(ts_msg_matches(sp->msgs[0], lens, 2, 9));
	ck_assert_uint_gt(tw_comm_queued_bytes(sp->comm), 0); /* still waiting */
	ck_assert_int_eq(sp->closed, 0);

	u.ssl = p.ssl;
	u.in = malloc(ours.wire_len);
	u.in_len = ours.wire_len;
	pump_run(&h, &u, "reading our message");
	noise_wire_check(&ours, u.in);
	ck_assert_int_eq(k.received, 1); /* our answer */
	ck_assert_int_eq(sp->closed, 0);
	ku_finish(&h, &p, sp, 1);
	ck_assert_int_eq(k.sent, 1);
	ck_assert_int_eq(k.received, 1);

	free(u.in);
	free(ours.wire);
	ra_buf_free(&b);
	hand_end(&hd, &h, 1);
}
END_TEST

/* The reverse: the peer's large write waits on a full socket (our comm
 * paused) while our own large write waits too; the peer sends a
 * KeyUpdate (update requested) in the middle of its message, followed
 * by the rest of it and a small message. Both large messages and the
 * small one arrive intact, and our KeyUpdate answers the peer's. */
START_TEST(key_update_while_peer_send_is_full)
{
	struct tu h;
	struct ra_peer p;
	struct tu_peer *sp;
	struct ku_count k;
	struct noise_msg ours, theirs;
	struct pump u = {0};
	struct ra_buf out = {0};
	struct read_past past;
	size_t lens[] = {9, 20000}, before;
	struct hand_driven hd;
	hand_begin(&hd);
	keep_listener(&h);
	ku_open(&h, &p, &k, &sp);
	noise_msg_init(&ours, (ts_quick() ? 16 : 48) * MiB, 2);
	noise_msg_init(&theirs, (ts_quick() ? 16 : 48) * MiB, 3);
	tw_comm_pause(sp->comm);
	ck_assert_int_eq(tw_comm_write(sp->comm, noise_msg_new(&ours)), 0);
	ck_assert_uint_gt(wait_write_blocked(&h, sp->comm), 0);

	/* the peer writes until its socket is full */
	u.ssl = p.ssl;
	u.out = theirs.wire;
	u.out_len = theirs.wire_len;
	for (int still = 0, i = 0; still < 5; i++) {
		before = u.out_done;
		ck_assert_msg(i < TU_WAIT_MS / 20, "the peer's writes never blocked");
		pump_step(&u);
		ck_assert_int_eq(u.error, 0);
		tu_run_for(&h, 20);
		still = u.write_blocked && u.out_done == before ? still + 1 : 0;
	}
	ck_assert_uint_lt(u.out_done, u.out_len);

	/* OpenSSL refuses SSL_key_update while a write is pending ("bad
	 * write retry"): our comm reads again until the peer's pending
	 * record is written, and right after it, with megabytes of the
	 * peer's message still in the sockets ahead of it, the peer asks for
	 * a KeyUpdate. The peer writes on without reading until our side
	 * has read past the KeyUpdate, in the middle of a frame, with its
	 * own write still waiting. */
	tw_comm_resume(sp->comm);
	ck_assert(tu_run_until(&h, pump_one_write, &u, TU_WAIT_MS));
	ck_assert_int_eq(u.error, 0);
	ck_assert_int_eq(SSL_key_update(p.ssl, SSL_KEY_UPDATE_REQUESTED), 1);
	past.u = &u;
	past.c = sp->comm;
	past.at = u.out_done;
	ck_assert_msg(tu_run_until(&h, read_past, &past, TU_WAIT_MS),
		      "our side never read past the KeyUpdate (closed %d: %s)", sp->closed,
		      sp->last_error);
	ck_assert_int_eq(u.error, 0);
	ck_assert_int_eq(k.sent, 1);
	ck_assert_int_eq(sp->closed, 0);
	ck_assert_uint_gt(tw_comm_queued_bytes(sp->comm), 0); /* still waiting */
	u.in = malloc(ours.wire_len);
	u.in_len = ours.wire_len;
	pump_run(&h, &u, "exchanging large messages");
	noise_wire_check(&ours, u.in);
	ck_assert_int_eq(k.sent, 1);
	ra_put_msg(&out, lens, 2, 21);
	ra_send(&p, out.p, out.len);
	ck_assert_msg(tu_wait_count(&h, &sp->nmsgs, 2, TU_WAIT_MS), "received %zu of 2 (%s)",
		      sp->nmsgs, sp->last_error);
	noise_msg_check(&theirs, sp->msgs[0]);
	ck_assert(ts_msg_matches(sp->msgs[1], lens, 2, 21));
	ku_finish(&h, &p, sp, 2);
	ck_assert_int_eq(k.received, 1); /* our answer */

	free(u.in);
	free(ours.wire);
	free(theirs.wire);
	ra_buf_free(&out);
	hand_end(&hd, &h, 1);
}
END_TEST

/* Small pieces gathered into one buffer (stream_comm.c coalesce) while
 * the peer does not read: SSL_write keeps hitting a full socket with a
 * gathered first buffer, and its retry must start at the same byte with
 * a buffer at least as long. Shapes around the 4096-byte gather limit
 * (exactly 4096 with the prelude, 4097, empty frames, 70 tiny frames past
 * the 64-iovec batch) between large frames; the reader pauses and resumes
 * now and then so partial writes land anywhere. Every byte arrives in
 * order, no comm fails (no "bad write retry"), and pieces were gathered. */
#define GS_SHAPES 8
#define GS_ROUNDS 12
static size_t gs_lens[GS_SHAPES][70];
static size_t gs_nf[GS_SHAPES];

static void gs_shapes(void)
{
	static const size_t fixed[][4] = {
		{4072},       /* 24-byte prelude + 4072: exactly 4096 */
		{4073},       /* one past */
		{0, 5, 0},    /* empty frames */
		{MiB + 3, 1}, /* large, then a tiny frame */
		{1, 4095},    /* the second piece does not fit */
		{300000},     /* large alone */
	};
	static const size_t nfixed[] = {1, 1, 3, 2, 2, 1};
	for (size_t s = 0; s < 6; s++) {
		gs_nf[s] = nfixed[s];
		memcpy(gs_lens[s], fixed[s], sizeof(fixed[s]));
	}
	gs_nf[6] = 70; /* 70 frames of 0..6 bytes: past IOV_BATCH */
	for (size_t i = 0; i < 70; i++)
		gs_lens[6][i] = i % 7;
	gs_nf[7] = 1; /* a small one, sized by its round */
}

static unsigned char gs_shape_of[1 << 15];

static int gs_small_only(size_t s)
{
	return s != 3 && s != 5;
}

/* The fd of this process's TCP socket whose local (or, with peer, remote)
 * port is that of addr ("tls://127.0.0.1:PORT"); -1 if none. */
/* Write message number *n, of shape s, and count it. */
static void gs_write(tw_comm *c, size_t s, size_t *n)
{
	gs_lens[7][0] = 1 + *n % 3000;
	gs_shape_of[*n] = (unsigned char)s;
	ck_assert_int_eq(tw_comm_write(c, ts_msg_pattern(gs_lens[s], gs_nf[s], (unsigned)*n)), 0);
	(*n)++;
}

static int gs_fd_of(const char *addr, int peer)
{
	int port = atoi(strrchr(addr, ':') + 1);
	for (int fd = 3; fd < 1024; fd++) {
		struct sockaddr_in sa;
		socklen_t sl = sizeof(sa);
		int rv = peer ? getpeername(fd, (struct sockaddr *)&sa, &sl)
			      : getsockname(fd, (struct sockaddr *)&sa, &sl);
		if (rv == 0 && sa.sin_family == AF_INET && ntohs(sa.sin_port) == port)
			return fd;
	}
	return -1;
}

/* Small socket buffers on both ends: the writer meets a full socket
 * every few KiB. */
static void gs_small_buffers(struct tu_peer *cli)
{
	char local[128];
	int small = 65536, cfd, sfd;
	ck_assert_int_eq(tw_comm_local_address(cli->comm, local, sizeof(local)), 0);
	ck_assert_int_ge(cfd = gs_fd_of(local, 0), 0);
	ck_assert_int_ge(sfd = gs_fd_of(local, 1), 0);
	ck_assert_int_eq(setsockopt(cfd, SOL_SOCKET, SO_SNDBUF, &small, sizeof(small)), 0);
	ck_assert_int_eq(setsockopt(sfd, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small)), 0);
}

START_TEST(gathered_writes_while_peer_full)
{
	struct tu h;
	struct tu_peer *cli, *sp;
	size_t n = 0;
	tw_stats g0, g1;
	gs_shapes();
	keep_listener(&h);
	ck_assert_int_eq(tt_connect(&h, h.ctx, h.addr, &cli, NULL, 0), 0);
	ck_assert_ptr_nonnull(sp = tu_server_peer(&h, 0));
	gs_small_buffers(cli);
	tw_comm_pause(sp->comm);
	tw_stats_global(&g0, sizeof(g0));
	/* GS_ROUNDS rounds of every shape, the reader pausing and resuming,
	 * then everything read; then rounds of small shapes only, the reader
	 * paused, until the socket is full (it fills inside gathered pieces) */
	for (size_t r = 0; n + GS_SHAPES <= sizeof(gs_shape_of); r++) {
		if (r == GS_ROUNDS) {
			tw_comm_resume(sp->comm);
			ck_assert(tu_wait_count(&h, &sp->nmsgs, n, TU_WAIT_MS));
			tw_comm_pause(sp->comm);
		}
		for (size_t s = 0; s < GS_SHAPES; s++)
			if (r < GS_ROUNDS || gs_small_only(s))
				gs_write(cli->comm, s, &n);
		/* some of it goes out, the rest waits on a full socket */
		for (int i = 0; i < 4; i++)
			event_base_loop(h.base, EVLOOP_NONBLOCK);
		if (r > GS_ROUNDS && tw_comm_queued_bytes(cli->comm) > 0)
			break;
		if (r % 3 == 1 && r < GS_ROUNDS)
			tw_comm_resume(sp->comm);
		else
			tw_comm_pause(sp->comm);
	}
	ck_assert_uint_gt(tw_comm_queued_bytes(cli->comm), 0); /* the socket filled */
	/* the reader takes a little at a time while small messages keep
	 * coming: the socket fills again and again inside gathered pieces */
	for (int i = 0; i < 1000 && n + GS_SHAPES <= sizeof(gs_shape_of); i++) {
		for (size_t s = 0; s < GS_SHAPES; s++)
			if (gs_small_only(s))
				gs_write(cli->comm, s, &n);
		tw_comm_resume(sp->comm);
		event_base_loop(h.base, EVLOOP_NONBLOCK);
		tw_comm_pause(sp->comm);
		event_base_loop(h.base, EVLOOP_NONBLOCK);
	}
	tw_comm_resume(sp->comm);
	ck_assert(tu_wait_count(&h, &sp->nmsgs, n, TU_WAIT_MS));
	for (size_t i = 0; i < n; i++) {
		size_t s = gs_shape_of[i];
		gs_lens[7][0] = 1 + i % 3000;
		ck_assert_msg(ts_msg_matches(sp->msgs[i], gs_lens[s], gs_nf[s], (unsigned)i),
			      "message %zu (shape %zu)", i, s);
	}
	tw_stats_global(&g1, sizeof(g1));
	ck_assert_uint_gt(g1.write_bytes_gathered, g0.write_bytes_gathered);
	ck_assert_int_eq(cli->closed, 0);
	ck_assert_int_eq(sp->closed, 0);
	tw_comm_close(cli->comm);
	ck_assert(tu_wait_flag(&h, &cli->closed, TU_WAIT_MS));
	ck_assert_msg(cli->close_err == 0, "%s", cli->last_error);
	ck_assert(tu_wait_flag(&h, &sp->closed, TU_WAIT_MS));
	ck_assert_msg(sp->close_err == 0, "%s", sp->last_error);
	ck_assert_uint_eq(sp->nmsgs, n);
	tt_fini(&h);
}
END_TEST

TCase *tls_close_tcase(void)
{
	TCase *tc = ts_tcase("close", 300,
			     TS_TESTS(close_right_after_write, free_right_after_drain,
				      write_to_closed_peer, close_with_full_queue,
				      partial_writes_of_references, many_sequential_connections,
				      listener_freed_mid_handshake, reset_before_handshake_named,
				      peer_ends_mid_message, mid_message_counts,
				      close_notify_with_data));
	ts_add_loop(tc, RA_NCASES, TS_TESTS(readahead_scenarios));
	ts_add(tc, TS_TESTS(key_update_while_our_send_is_full, key_update_while_peer_send_is_full,
			    gathered_writes_while_peer_full));
	return tc;
}
