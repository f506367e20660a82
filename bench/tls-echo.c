/* SPDX-License-Identifier: BSD-3-Clause */
/* tls-echo: the TLS baseline for tw-echo-client/-server over tls://:
 * plain blocking sockets under OpenSSL (TLS 1.3, mutual TLS), the same
 * exchange as bench/raw-echo.c (u64 total, u64 N, lengths, frames; the
 * server echoes whole messages from one reused buffer; the client checks
 * every byte).
 *
 *   tls-echo --serve PORT   --tls-ca CA --tls-cert CERT --tls-key KEY
 *   tls-echo --connect PORT --size BYTES --count N --tls-ca CA --tls-cert CERT --tls-key KEY
 *
 * Binds and connects to 127.0.0.1. SSL_read/SSL_write get pieces of at
 * most INT_MAX bytes. */
#include <arpa/inet.h>
#include <limits.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <openssl/err.h>
#include <openssl/ssl.h>

#include "examples/common.h"

static size_t piece(size_t n)
{
	return n < INT_MAX ? n : INT_MAX;
}

static int read_full(SSL *ssl, void *p, size_t n)
{
	while (n > 0) {
		size_t got = 0;
		if (SSL_read_ex(ssl, p, piece(n), &got) != 1)
			return -1;
		p = (char *)p + got;
		n -= got;
	}
	return 0;
}

static int write_full(SSL *ssl, const void *p, size_t n)
{
	while (n > 0) {
		size_t put = 0;
		if (SSL_write_ex(ssl, p, piece(n), &put) != 1)
			return -1;
		p = (const char *)p + put;
		n -= put;
	}
	return 0;
}

/* TLS 1.3 only, peers verified against the CA, this side's pair loaded;
 * a server requires the client's certificate. */
static SSL_CTX *make_ctx(int server, const struct tw_ex_tls *t)
{
	SSL_CTX *c = SSL_CTX_new(server ? TLS_server_method() : TLS_client_method());
	if (c == NULL || t->ca == NULL || t->cert == NULL || t->key == NULL)
		return NULL;
	SSL_CTX_set_min_proto_version(c, TLS1_3_VERSION);
	SSL_CTX_set_max_proto_version(c, TLS1_3_VERSION);
	if (SSL_CTX_load_verify_locations(c, t->ca, NULL) != 1 ||
	    SSL_CTX_use_certificate_chain_file(c, t->cert) != 1 ||
	    SSL_CTX_use_PrivateKey_file(c, t->key, SSL_FILETYPE_PEM) != 1) {
		ERR_print_errors_fp(stderr);
		SSL_CTX_free(c);
		return NULL;
	}
	SSL_CTX_set_verify(c, SSL_VERIFY_PEER | (server ? SSL_VERIFY_FAIL_IF_NO_PEER_CERT : 0),
			   NULL);
	return c;
}

static void serve_one(SSL_CTX *ctx, int fd)
{
	SSL *ssl = SSL_new(ctx);
	uint8_t *buf = NULL;
	size_t cap = 0;
	uint64_t total;
	tw_ex_nodelay(fd);
	SSL_set_fd(ssl, fd);
	if (SSL_accept(ssl) != 1) {
		ERR_print_errors_fp(stderr);
		goto done;
	}
	while (read_full(ssl, &total, 8) == 0) {
		if (total > cap && (buf = realloc(buf, cap = total)) == NULL)
			break;
		if (read_full(ssl, buf, total) != 0 || write_full(ssl, &total, 8) != 0 ||
		    write_full(ssl, buf, total) != 0)
			break;
	}
	SSL_shutdown(ssl);
done:
	ERR_clear_error();
	free(buf);
	SSL_free(ssl);
	close(fd);
}

/* One connection at a time, like raw-echo. */
static int serve(int port, const struct tw_ex_tls *t)
{
	SSL_CTX *ctx = make_ctx(1, t);
	int lfd;
	if (ctx == NULL)
		return 2;
	if ((lfd = tw_ex_listen_loopback(port, "tls-echo")) < 0)
		return 1;
	for (;;) {
		int fd = accept(lfd, NULL, NULL);
		if (fd >= 0)
			serve_one(ctx, fd);
	}
}

static SSL *connect_tls(SSL_CTX *ctx, int port, int *fd)
{
	SSL *ssl;
	if ((*fd = tw_ex_dial_loopback(port, "tls-echo")) < 0)
		return NULL;
	ssl = SSL_new(ctx);
	SSL_set_fd(ssl, *fd);
	if (SSL_connect(ssl) != 1) {
		ERR_print_errors_fp(stderr);
		SSL_free(ssl);
		return NULL;
	}
	return ssl;
}

static int client(int port, uint64_t size, uint64_t count, const struct tw_ex_tls *t)
{
	SSL_CTX *ctx = make_ctx(0, t);
	uint64_t prelude[3] = {16 + size, 1, size}, back[3];
	uint8_t *out = malloc(size + 1), *in = malloc(size + 1);
	double t0, secs;
	SSL *ssl;
	int fd;
	if (ctx == NULL || out == NULL || in == NULL || (ssl = connect_tls(ctx, port, &fd)) == NULL)
		return 1;
	for (uint64_t i = 0; i < size; i++)
		out[i] = (uint8_t)(i % 251);
	t0 = tw_ex_now();
	for (uint64_t k = 0; k < count; k++) {
		if (write_full(ssl, prelude, 24) != 0 || write_full(ssl, out, size) != 0 ||
		    read_full(ssl, back, 24) != 0 || read_full(ssl, in, size) != 0 ||
		    memcmp(in, out, size) != 0) {
			fprintf(stderr, "tls-echo: echo %llu failed or differs\n",
				(unsigned long long)k);
			ERR_print_errors_fp(stderr);
			return 1;
		}
	}
	secs = tw_ex_now() - t0;
	printf("tls: %.3f s, %.1f MB/s payload each way, %.0f round trips/s\n", secs,
	       (double)size * (double)count / secs / 1e6, (double)count / secs);
	SSL_shutdown(ssl);
	SSL_free(ssl);
	SSL_CTX_free(ctx);
	close(fd);
	free(out);
	free(in);
	return 0;
}

static void usage(FILE *f)
{
	fprintf(f, "usage: tls-echo --serve PORT [TLS options]\n"
		   "       tls-echo --connect PORT --size BYTES --count N [TLS "
		   "options]\n" TW_EX_TLS_USAGE);
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {{"serve", required_argument, NULL, 'S'},
					     {"connect", required_argument, NULL, 'C'},
					     {"size", required_argument, NULL, 's'},
					     {"count", required_argument, NULL, 'c'},
					     TW_EX_TLS_OPTIONS,
					     {NULL, 0, NULL, 0}};
	struct tw_ex_tls tls = {NULL, NULL, NULL};
	int o, serve_port = 0, connect_port = 0;
	uint64_t size = 1 << 20, count = 10;
	while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (o) {
		case 'S': serve_port = atoi(optarg); break;
		case 'C': connect_port = atoi(optarg); break;
		case 's': size = tw_ex_parse_size(optarg); break;
		case 'c': count = tw_ex_parse_size(optarg); break;
		default: tw_ex_other_option(&tls, o, optarg, usage);
		}
	}
	if ((serve_port > 0) == (connect_port > 0) || optind != argc) {
		usage(stderr);
		return 2;
	}
	signal(SIGPIPE, SIG_IGN);
	return serve_port > 0 ? serve(serve_port, &tls) : client(connect_port, size, count, &tls);
}
