/* SPDX-License-Identifier: BSD-3-Clause */
/* Peers that must be refused (bad certificates, plain TCP, junk such as
 * an HTTP request, silence), each while an established tls comm keeps echoing, and
 * configuration errors. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <check.h>
#include <event2/event.h>

#include "tests/check_tls.h"
#include "tests/support/tls.h"
#include "tests/support/suite.h"

/* How long a refusal may take to show: the harness's wait, which allows
 * for valgrind at load (a raw socket's close is no tw progress, so the
 * wait cannot restart on it). It bounds only how long a broken run waits. */
#define BAD_WAIT_MS TU_WAIT_MS

/* A client with the given certificate is refused by the listener with
 * TW_ETLS, either in the connect (TLS 1.2) or on the comm's first read
 * (TLS 1.3: the server checks the client's certificate after the client
 * finished), with OpenSSL's reason; the listener's context says why it
 * refused. */
static void refused_client(const char *cert, const char *key, const char *client_hears,
			   const char *server_says)
{
	struct tu h;
	struct tu_peer *good = tt_setup_echo(&h);
	tw_context *bad = tt_context(&h, "ca.pem", cert, key);
	char why[512];
	int stage;
	struct tu_refusal r = {0, 0, "", ""};
	ck_assert_int_eq(tw_listener_set_error_cb(h.lis, tu_on_refused, &r), 0);
	tt_canary(good, 0);
	for (int write = 0; write <= 1; write++) {
		int rv = tt_refused(&h, bad, h.addr, write, BAD_WAIT_MS, &stage, why, sizeof(why));
		ck_assert_msg(rv == TW_ETLS, "write %d: got %s at stage %d: %s", write,
			      tw_strerror(rv), stage, why);
		ck_assert_msg(strstr(why, client_hears) != NULL, "client hears: %s", why);
		ck_assert_msg(strstr(tw_context_last_error(h.ctx), server_says) != NULL,
			      "server says: %s", tw_context_last_error(h.ctx));
		/* issue 17: the refusal reaches the application, with the
		 * client's address and the reason (tw-echo-server logs it) */
		ck_assert_int_eq(r.n, 1 + write);
		ck_assert_int_eq(r.err, TW_ETLS);
		ck_assert_msg(strncmp(r.peer, "tls://127.0.0.1:", 16) == 0, "peer %s", r.peer);
		ck_assert_msg(strstr(r.why, server_says) != NULL && strstr(r.why, r.peer) != NULL,
			      "why: %s", r.why);
		tt_canary(good, 1 + (unsigned)write);
	}
	ck_assert_uint_eq(h.nsrv, 1); /* no comm was accepted for the bad client */
	tt_fini(&h);
}

START_TEST(client_without_certificate)
{
	refused_client(NULL, NULL, "alert certificate required",
		       "peer did not return a certificate");
}
END_TEST

START_TEST(client_from_other_ca)
{
	refused_client("other-cert.pem", "other-key.pem", "alert unknown ca",
		       "certificate verify failed (unable to get local issuer certificate)");
}
END_TEST

START_TEST(client_with_expired_certificate)
{
	refused_client("expired-cert.pem", "expired-key.pem", "alert certificate expired",
		       "certificate verify failed (certificate has expired)");
}
END_TEST

/* The server's certificate is from another CA: the client refuses it in
 * the connect. */
START_TEST(server_from_other_ca)
{
	struct tu h;
	struct tu_peer *good = tt_setup_echo(&h), *p = NULL;
	tw_context *srv = tt_context(&h, "ca.pem", "other-cert.pem", "other-key.pem");
	char addr[128], why[512];
	int rv;
	tt_listen(&h, srv, "tls://127.0.0.1:0", 0, NULL, addr, sizeof(addr));
	rv = tt_connect(&h, h.ctx, addr, &p, why, sizeof(why));
	ck_assert_msg(rv == TW_ETLS, "got %s: %s", tw_strerror(rv), why);
	ck_assert_ptr_null(p);
	ck_assert_msg(strstr(why, "certificate verify failed (unable to get local issuer "
				  "certificate)") != NULL,
		      "why: %s", why);
	ck_assert_str_eq(why, tw_context_last_error(h.ctx));
	tt_canary(good, 0);
	ck_assert_uint_eq(h.nsrv, 1);
	tt_fini(&h);
}
END_TEST

/* Raw bytes to the TLS port (an HTTP request, zeros): the server closes the connection,
 * says why, and keeps accepting. */
static void junk_case(struct tu *h, struct tu_peer *good, const void *p, size_t n, int fin,
		      unsigned seed)
{
	int fd = ts_raw_connect(h->addr);
	tu_raw_send(h, fd, p, n);
	if (fin)
		shutdown(fd, SHUT_WR);
	ck_assert_msg(tu_raw_wait_closed(h, fd, BAD_WAIT_MS), "server kept the connection");
	close(fd);
	ck_assert_msg(strlen(tw_context_last_error(h->ctx)) > 0, "no reason logged");
	tt_canary(good, seed);
}

START_TEST(plain_http_to_tls_port)
{
	struct tu h;
	struct tu_peer *good = tt_setup_echo(&h), *again;
	static const char get[] = "GET / HTTP/1.1\r\n\r\n";
	static uint8_t zeros[7], noise[1 << 20];
	int fd0 = tt_fd_count();
	junk_case(&h, good, get, strlen(get), 0, 0);
	ck_assert_msg(strstr(tw_context_last_error(h.ctx), "http request") != NULL, "%s",
		      tw_context_last_error(h.ctx));
	junk_case(&h, good, zeros, sizeof(zeros), 1, 1);
	ck_assert_msg(strstr(tw_context_last_error(h.ctx), "wrong version number") != NULL, "%s",
		      tw_context_last_error(h.ctx));
	for (size_t i = 0; i < sizeof(noise); i++)
		noise[i] = (uint8_t)((i * 2654435761u) >> 13);
	junk_case(&h, good, noise, sizeof(noise), 1, 2);
	ck_assert_uint_eq(h.nsrv, 1);
	ck_assert_int_eq(tt_fd_count(), fd0);
	/* the listener still accepts tls clients */
	ck_assert_int_eq(tt_connect(&h, h.ctx, h.addr, &again, NULL, 0), 0);
	again->keep = 1;
	tt_canary(again, 3);
	tt_fini(&h);
}
END_TEST

/* A plain tcp:// taskwire client to a tls listener: its Dask handshake
 * reads first and the listener waits for a ClientHello. Whichever
 * timeout is shorter decides: the client's handshake timeout (TW_ETIMEDOUT,
 * with a hint at tls), or the listener's TLS handshake timeout, which
 * closes the connection (TW_ECLOSED). */
static void tcp_to_tls(int client_ms, int server_ms, int want)
{
	struct tu h;
	struct tu_peer *good = tt_setup_echo(&h);
	tw_context *plain = tt_context(&h, NULL, NULL, NULL);
	char uri[160], why[512];
	tw_comm *c;
	int rv;
	ck_assert_int_eq(tw_context_set_handshake_timeout_ms(plain, (uint32_t)client_ms), 0);
	ck_assert_int_eq(tw_context_set_tls_handshake_timeout_ms(h.ctx, (uint32_t)server_ms), 0);
	tt_uri_as(h.addr, "tcp", uri, sizeof(uri));
	ck_assert_int_eq(tt_connect_bare(&h, plain, uri, &c, NULL, 0), 0);
	rv = tt_handshake(&h, c, 0, why, sizeof(why));
	ck_assert_msg(rv == want, "got %s: %s", tw_strerror(rv), why);
	ck_assert_msg(strlen(why) > 0, "no reason");
	if (want == TW_ETIMEDOUT)
		ck_assert_msg(strstr(why, "tls") != NULL, "no hint at tls: %s", why);
	tt_canary(good, 0);
	ck_assert_uint_eq(h.nsrv, 1);
	tt_fini(&h);
}

START_TEST(tcp_client_to_tls_listener)
{
	tcp_to_tls(300, 5000, TW_ETIMEDOUT);
	tcp_to_tls(5000, 300, TW_ECLOSED);
}
END_TEST

/* A tls:// client to a tcp:// listener fails at once: the listener reads
 * the ClientHello as a stream prelude, refuses it (its `total` is far
 * above the limit) and closes. */
START_TEST(tls_client_to_tcp_listener)
{
	struct tu h;
	struct tu_peer *good = tt_setup_echo(&h), *p = NULL;
	char addr[128], tls_uri[160], why[512];
	int rv;
	tt_listen(&h, h.ctx, "tcp://127.0.0.1:0", 0, NULL, addr, sizeof(addr));
	tt_uri_as(addr, "tls", tls_uri, sizeof(tls_uri));
	rv = tt_connect(&h, h.ctx, tls_uri, &p, why, sizeof(why));
	ck_assert_msg(rv == TW_ETLS || rv == TW_EIO || rv == TW_ECLOSED, "got %s: %s",
		      tw_strerror(rv), why);
	ck_assert_ptr_null(p);
	ck_assert_msg(strlen(why) > 0, "no reason");
	ck_assert_str_eq(why, tw_context_last_error(h.ctx));
	/* the tcp listener's comm ended on the bad prelude */
	ck_assert_uint_eq(h.nsrv, 2);
	ck_assert(tu_wait_flag(&h, &h.srv[1]->closed, BAD_WAIT_MS));
	ck_assert_int_eq(h.srv[1]->close_err, TW_ETOOBIG);
	tt_canary(good, 0);
	tt_fini(&h);
}
END_TEST

/* A silent raw client on the TLS port is dropped after the TLS handshake
 * timeout, and nothing it held stays open; the context is freed after
 * (valgrind and ASan runs check that nothing leaks). */
START_TEST(silent_peer_dropped)
{
	struct tu h;
	struct tu_peer *good = tt_setup_echo(&h);
	int fd0 = tt_fd_count(), fds[20];
	ck_assert_int_eq(tw_context_set_tls_handshake_timeout_ms(h.ctx, 300), 0);
	for (int i = 0; i < 20; i++)
		fds[i] = ts_raw_connect(h.addr);
	for (int i = 0; i < 20; i++) {
		ck_assert_msg(tu_raw_wait_closed(&h, fds[i], BAD_WAIT_MS), "silent peer %d kept",
			      i);
		close(fds[i]);
	}
	ck_assert_msg(strstr(tw_context_last_error(h.ctx), "timed out") != NULL, "%s",
		      tw_context_last_error(h.ctx));
	/* one that starts a record (a 512-byte handshake) and stalls */
	fds[0] = ts_raw_connect(h.addr);
	tu_raw_send(&h, fds[0], "\x16\x03\x01\x02\x00\x01", 6);
	ck_assert_msg(tu_raw_wait_closed(&h, fds[0], BAD_WAIT_MS), "stalled peer kept");
	close(fds[0]);
	ck_assert_int_eq(tt_fd_count(), fd0);
	tt_canary(good, 0);
	/* one more, still in its handshake when the context is freed */
	fds[0] = ts_raw_connect(h.addr);
	tu_run_for(&h, 50);
	tt_fini(&h);
	close(fds[0]);
}
END_TEST

/* A tls client to a server that accepts TCP and never answers its
 * ClientHello fails with TW_ETIMEDOUT after its TLS handshake timeout. */
START_TEST(silent_server)
{
	struct tu h;
	struct tu_peer *p = NULL;
	char uri[128], why[512];
	int lfd = ts_raw_listen("tls", 4, 0, uri, sizeof(uri)), rv;
	tt_init(&h);
	ck_assert_int_eq(tw_context_set_tls_handshake_timeout_ms(h.ctx, 300), 0);
	rv = tt_connect(&h, h.ctx, uri, &p, why, sizeof(why));
	ck_assert_msg(rv == TW_ETIMEDOUT, "got %s: %s", tw_strerror(rv), why);
	ck_assert_msg(strstr(why, "timed out") != NULL, "%s", why);
	close(lfd);
	tt_fini(&h);
}
END_TEST

/* 1 when `name` resolves (first answer, as tw_comm_connect takes it) to
 * 127.0.0.1. */
static int resolves_to_loopback(const char *name)
{
	struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *ai;
	int ok;
	if (getaddrinfo(name, "1", &hints, &ai) != 0)
		return 0;
	ok = ai->ai_family == AF_INET &&
	     ((struct sockaddr_in *)ai->ai_addr)->sin_addr.s_addr == htonl(INADDR_LOOPBACK);
	freeaddrinfo(ai);
	return ok;
}

/* A client that connects to a host name checks it against the server's
 * certificate (SAN IP:127.0.0.1, DNS:localhost) unless switched off
 * (Dask-compatible mode); one that connects to an IP address does not. */
START_TEST(hostname_checked)
{
	struct tu h;
	struct tu_peer *good = tt_setup_echo(&h), *p;
	tw_tls_config *cfg = tt_config("ca.pem", "cert.pem", "key.pem");
	tw_context *lax = tt_context(&h, NULL, NULL, NULL);
	unsigned port = tt_uri_port(h.addr);
	char host[64], uri[128], why[512];
	int rv;
	tw_tls_config_set_verify_hostname(cfg, false);
	ck_assert_int_eq(tw_context_set_tls(lax, cfg), 0);
	tw_tls_config_free(cfg);
	if (resolves_to_loopback("localhost")) {
		snprintf(uri, sizeof(uri), "tls://localhost:%u", port);
		rv = tt_connect(&h, h.ctx, uri, &p, why, sizeof(why));
		ck_assert_msg(rv == 0, "%s: %s: %s", uri, tw_strerror(rv), why);
		p->keep = 1;
		tt_canary(p, 0);
	}
	ck_assert_int_eq(gethostname(host, sizeof(host)), 0);
	host[sizeof(host) - 1] = '\0';
	if (strcmp(host, "localhost") != 0 && resolves_to_loopback(host)) {
		snprintf(uri, sizeof(uri), "tls://%s:%u", host, port);
		rv = tt_connect(&h, h.ctx, uri, &p, why, sizeof(why));
		ck_assert_msg(rv == TW_ETLS, "%s: %s: %s", uri, tw_strerror(rv), why);
		ck_assert_msg(strstr(why, "hostname mismatch") != NULL, "%s", why);
		rv = tt_connect(&h, lax, uri, &p, why, sizeof(why));
		ck_assert_msg(rv == 0, "%s without the check: %s: %s", uri, tw_strerror(rv), why);
		p->keep = 1;
		tt_canary(p, 1);
	} else {
		fprintf(stderr,
			"hostname_checked: %s does not resolve to 127.0.0.1, part skipped\n", host);
	}
	tt_canary(good, 2);
	tt_fini(&h);
}
END_TEST

TCase *tls_reject_tcase(void)
{
	return ts_tcase("reject", 120,
			TS_TESTS(client_without_certificate, client_from_other_ca,
				 client_with_expired_certificate, server_from_other_ca,
				 plain_http_to_tls_port, tcp_client_to_tls_listener,
				 tls_client_to_tcp_listener, silent_peer_dropped, silent_server,
				 hostname_checked));
}

/* Configuration errors name the file and OpenSSL's reason. */

START_TEST(ca_file_missing)
{
	tw_tls_config *cfg;
	const char *path = "/nonexistent/taskwire/ca.pem";
	ck_assert_int_eq(tw_tls_config_new(&cfg), 0);
	ck_assert_str_eq(tw_tls_config_last_error(cfg), "");
	ck_assert_int_eq(tw_tls_config_set_ca_file(cfg, path), TW_EINVAL);
	ck_assert_msg(strstr(tw_tls_config_last_error(cfg), path) != NULL, "%s",
		      tw_tls_config_last_error(cfg));
	/* a file that is not PEM */
	ck_assert_int_eq(tw_tls_config_set_ca_file(cfg, "/dev/null"), TW_EINVAL);
	ck_assert_msg(strstr(tw_tls_config_last_error(cfg), "/dev/null") != NULL, "%s",
		      tw_tls_config_last_error(cfg));
	tw_tls_config_free(cfg);
}
END_TEST

START_TEST(cert_errors)
{
	tw_tls_config *cfg;
	char cert[320], key[320];
	snprintf(cert, sizeof(cert), "%s", ts_cert("cert.pem"));
	snprintf(key, sizeof(key), "%s", ts_cert("other-key.pem"));
	ck_assert_int_eq(tw_tls_config_new(&cfg), 0);
	/* a key that does not match the certificate */
	ck_assert_int_eq(tw_tls_config_set_cert_files(cfg, cert, key), TW_EINVAL);
	ck_assert_msg(strstr(tw_tls_config_last_error(cfg), key) != NULL, "%s",
		      tw_tls_config_last_error(cfg));
	/* a missing certificate file, a missing key file */
	ck_assert_int_eq(tw_tls_config_set_cert_files(cfg, "/nonexistent/c.pem", key), TW_EINVAL);
	ck_assert_msg(strstr(tw_tls_config_last_error(cfg), "/nonexistent/c.pem") != NULL, "%s",
		      tw_tls_config_last_error(cfg));
	ck_assert_int_eq(tw_tls_config_set_cert_files(cfg, cert, "/nonexistent/k.pem"), TW_EINVAL);
	ck_assert_msg(strstr(tw_tls_config_last_error(cfg), "/nonexistent/k.pem") != NULL, "%s",
		      tw_tls_config_last_error(cfg));
	ck_assert_int_eq(tw_tls_config_set_ciphers(cfg, "NO-SUCH-CIPHER"), TW_EINVAL);
	ck_assert_uint_gt(strlen(tw_tls_config_last_error(cfg)), 0);
	/* the right pair still loads afterwards */
	ck_assert_int_eq(tw_tls_config_set_cert_files(cfg, cert, ts_cert("key.pem")), 0);
	tw_tls_config_free(cfg);
}
END_TEST

static void never_accept(tw_listener *l, tw_comm *c, void *arg)
{
	(void)l;
	(void)arg;
	tw_comm_free(c);
	ck_abort_msg("accepted");
}

static void never_connect(tw_comm *c, int err, void *arg)
{
	(void)c;
	(void)err;
	(void)arg;
	ck_abort_msg("connect callback ran");
}

/* tls:// without a configuration (or without a certificate, for a
 * listener) is refused with TW_EINVAL, and no callback runs; so are bad
 * arguments. */
START_TEST(tls_without_config)
{
	struct event_base *base = event_base_new();
	tw_context *ctx;
	tw_tls_config *ca_only;
	tw_listener *l = NULL;
	ck_assert_int_eq(tw_context_new(base, &ctx), 0);
	ck_assert_int_eq(tw_listener_new(ctx, "tls://127.0.0.1:0", never_accept, NULL, &l),
			 TW_EINVAL);
	ck_assert_ptr_null(l);
	ck_assert_int_eq(tw_comm_connect(ctx, "tls://127.0.0.1:9", never_connect, NULL), TW_EINVAL);
	ca_only = tt_config("ca.pem", NULL, NULL);
	ck_assert_int_eq(tw_context_set_tls(ctx, ca_only), 0);
	tw_tls_config_free(ca_only);
	ck_assert_int_eq(tw_listener_new(ctx, "tls://127.0.0.1:0", never_accept, NULL, &l),
			 TW_EINVAL);
	ck_assert_ptr_null(l);
	ck_assert_int_eq(tw_context_set_tls(ctx, NULL), 0);
	ck_assert_int_eq(tw_comm_connect(ctx, "tls://127.0.0.1:9", never_connect, NULL), TW_EINVAL);
	ck_assert_int_eq(tw_context_set_tls_handshake_timeout_ms(ctx, 0), TW_EINVAL);
	ck_assert_int_eq(tw_tls_config_new(NULL), TW_EINVAL);
	ck_assert_int_eq(tw_tls_config_set_ca_file(NULL, "x"), TW_EINVAL);
	event_base_loop(base, EVLOOP_NONBLOCK);
	tw_context_free(ctx);
	event_base_free(base);
}
END_TEST

static void store_connect(tw_comm *c, int err, void *arg)
{
	ck_assert_ptr_null(c);
	*(int *)arg = err;
}

static int connect_finished(void *arg)
{
	return *(int *)arg != 1;
}

/* The context's configuration replaced while comms run (certificates
 * rotated), then removed: comms keep the configuration they were made
 * with, new ones use the new one, and without one a connect in flight
 * fails and the listener drops new connections, with a reason. */
START_TEST(config_replaced_while_running)
{
	struct tu h;
	struct tu_peer *good = tt_setup_echo(&h), *p;
	tw_tls_config *next = tt_config("ca.pem", "cert.pem", "key.pem");
	int err = 1, fd;
	tt_canary(good, 0);
	ck_assert_int_eq(tw_context_set_tls(h.ctx, next), 0);
	tw_tls_config_free(next); /* the context holds the only reference now */
	tt_canary(good, 1);
	ck_assert_int_eq(tt_connect(&h, h.ctx, h.addr, &p, NULL, 0), 0);
	p->keep = 1;
	tt_canary(p, 2);
	/* a connect in flight when the configuration goes away */
	ck_assert_int_eq(tw_comm_connect(h.ctx, h.addr, store_connect, &err), 0);
	ck_assert_int_eq(tw_context_set_tls(h.ctx, NULL), 0);
	ck_assert(tu_run_until(&h, connect_finished, &err, TU_WAIT_MS));
	ck_assert_msg(err == TW_EINVAL, "got %s", tw_strerror(err));
	ck_assert_msg(strstr(tw_context_last_error(h.ctx), "no TLS configuration") != NULL, "%s",
		      tw_context_last_error(h.ctx));
	fd = ts_raw_connect(h.addr);
	ck_assert(tu_raw_wait_closed(&h, fd, TU_WAIT_MS));
	close(fd);
	tt_canary(good, 3);
	tt_canary(p, 4);
	ck_assert_uint_eq(h.nsrv, 2);
	tt_fini(&h);
}
END_TEST

TCase *tls_config_tcase(void)
{
	TCase *tc = tcase_create("config");
	ts_add(tc, TS_TESTS(ca_file_missing, cert_errors, tls_without_config,
			    config_replaced_while_running));
	return tc;
}
