/* SPDX-License-Identifier: BSD-3-Clause */
/* TLS configuration objects (include/taskwire/tls.h), on OpenSSL. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <openssl/err.h>

#include <taskwire/error.h>

#include "core/context.h"
#include "transport/tls_config.h"

/* Record "what: OpenSSL's reason" and fail. */
static int ssl_fail(tw_tls_config *cfg, const char *what)
{
	char reason[256] = "unknown reason";
	unsigned long e = ERR_peek_last_error();
	if (e != 0)
		ERR_error_string_n(e, reason, sizeof(reason));
	ERR_clear_error();
	snprintf(cfg->error, sizeof(cfg->error), "%s: %s", what, reason);
	return TW_EINVAL;
}

/* Both sides: TLS 1.2 at least; partial writes, so a large frame goes out
 * record by record; a retried write may come from a rebuilt iovec.
 * OpenSSL gives back its record buffers (about 17 KiB each way per SSL)
 * once they are empty: an idle comm holds none (issue 20: 59.7 KiB of
 * heap per idle tls comm before, 27 KiB after, bench/idle-bench.sh).
 * They come back from malloc for the next record; a large message keeps
 * them while it is under way, so it costs one malloc and free per
 * SSL_write call or per drained read, not per record. */
static SSL_CTX *new_ctx(const SSL_METHOD *method)
{
	SSL_CTX *c = SSL_CTX_new(method);
	if (c == NULL)
		return NULL;
	SSL_CTX_set_min_proto_version(c, TLS1_2_VERSION);
	SSL_CTX_set_mode(c, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER |
				    SSL_MODE_RELEASE_BUFFERS);
	SSL_CTX_set_read_ahead(c, 1);
	/* A peer that closes without close_notify ends the comm like a TCP
	 * EOF (a truncated message is still caught by the framing); no
	 * renegotiation, so reads never wait for writability. */
	SSL_CTX_set_options(c, SSL_OP_IGNORE_UNEXPECTED_EOF | SSL_OP_NO_RENEGOTIATION);
	return c;
}

_Thread_local struct tw__tls_gather *tw__tls_gathering;

/* OpenSSL's socket BIO writes with write(2): a peer that has gone raises
 * SIGPIPE, whose default action kills the process. This BIO is the
 * socket BIO with its write done by send(MSG_NOSIGNAL), as tcp:// does. */
static int nosig_write(BIO *b, const char *p, int n)
{
	int fd = -1;
	ssize_t r;
	struct tw__tls_gather *g = tw__tls_gathering;
	BIO_get_fd(b, &fd);
	errno = 0;
	if (g != NULL) {
		BIO_clear_retry_flags(b);
		if ((size_t)n > g->cap - g->len) {
			BIO_set_retry_write(b);
			errno = EAGAIN;
			return -1;
		}
		memcpy(g->buf + g->len, p, (size_t)n);
		g->len += (size_t)n;
		return n;
	}
	r = send(fd, p, (size_t)n, MSG_NOSIGNAL);
	BIO_clear_retry_flags(b);
	if (r <= 0 && BIO_sock_should_retry((int)r))
		BIO_set_retry_write(b);
	return (int)r;
}

/* One method for the process, made once and never freed: BIOs keep a
 * pointer to it, and a comm may outlive the configuration it was made
 * with (an application replacing its certificates). */
static BIO_METHOD *bio_method;
static pthread_once_t bio_once = PTHREAD_ONCE_INIT;

static void make_bio_method(void)
{
	const BIO_METHOD *sock = BIO_s_socket();
	BIO_METHOD *m = BIO_meth_new(BIO_TYPE_SOCKET, "taskwire socket");
	if (m == NULL)
		return;
	if (BIO_meth_set_write(m, nosig_write) != 1 ||
	    BIO_meth_set_read(m, BIO_meth_get_read(sock)) != 1 ||
	    BIO_meth_set_puts(m, BIO_meth_get_puts(sock)) != 1 ||
	    BIO_meth_set_ctrl(m, BIO_meth_get_ctrl(sock)) != 1 ||
	    BIO_meth_set_create(m, BIO_meth_get_create(sock)) != 1 ||
	    BIO_meth_set_destroy(m, BIO_meth_get_destroy(sock)) != 1) {
		BIO_meth_free(m);
		return;
	}
	bio_method = m;
}

BIO *tw__tls_socket_bio(int fd)
{
	BIO *b;
	pthread_once(&bio_once, make_bio_method);
	if (bio_method == NULL || (b = BIO_new(bio_method)) == NULL)
		return NULL;
	BIO_set_fd(b, fd, BIO_NOCLOSE);
	return b;
}

static void set_verify(tw_tls_config *cfg)
{
	int server = SSL_VERIFY_PEER;
	if (cfg->require_client_cert)
		server |= SSL_VERIFY_FAIL_IF_NO_PEER_CERT;
	SSL_CTX_set_verify(cfg->server, cfg->has_ca ? server : SSL_VERIFY_NONE, NULL);
	SSL_CTX_set_verify(cfg->client, SSL_VERIFY_PEER, NULL);
}

int tw_tls_config_new(tw_tls_config **out)
{
	tw_tls_config *cfg;
	if (out == NULL)
		return TW_EINVAL;
	if ((cfg = calloc(1, sizeof(*cfg))) == NULL)
		return TW_ENOMEM;
	atomic_init(&cfg->refs, 1);
	cfg->require_client_cert = 1;
	cfg->verify_hostname = 1;
	cfg->server = new_ctx(TLS_server_method());
	cfg->client = new_ctx(TLS_client_method());
	if (cfg->server == NULL || cfg->client == NULL) {
		tw_tls_config_free(cfg);
		return TW_ENOMEM;
	}
	/* No session tickets: a client that writes its last message and
	 * closes at once would leave them unread, and its close would reset
	 * the connection before we read that message. No resumption at all,
	 * then: no TLS 1.2 tickets either, and no session cache, which would
	 * keep the session of each TLS 1.2 client without tickets after its
	 * comm closed (with its parsed certificate, about 8 KiB; up to
	 * 20,480 of them). */
	SSL_CTX_set_num_tickets(cfg->server, 0);
	SSL_CTX_set_options(cfg->server, SSL_OP_NO_TICKET);
	SSL_CTX_set_session_cache_mode(cfg->server, SSL_SESS_CACHE_OFF);
	set_verify(cfg);
	*out = cfg;
	return 0;
}

tw_tls_config *tw_tls_config_hold(tw_tls_config *cfg)
{
	atomic_fetch_add_explicit(&cfg->refs, 1, memory_order_relaxed);
	return cfg;
}

void tw_tls_config_free(tw_tls_config *cfg)
{
	if (cfg == NULL || atomic_fetch_sub_explicit(&cfg->refs, 1, memory_order_acq_rel) != 1)
		return;
	SSL_CTX_free(cfg->server);
	SSL_CTX_free(cfg->client);
	free(cfg);
}

int tw_tls_config_set_ca_file(tw_tls_config *cfg, const char *path)
{
	char what[300];
	if (cfg == NULL || path == NULL)
		return TW_EINVAL;
	snprintf(what, sizeof(what), "CA file %s", path);
	if (SSL_CTX_load_verify_locations(cfg->server, path, NULL) != 1 ||
	    SSL_CTX_load_verify_locations(cfg->client, path, NULL) != 1)
		return ssl_fail(cfg, what);
	cfg->has_ca = 1;
	set_verify(cfg);
	return 0;
}

static int load_pair(tw_tls_config *cfg, SSL_CTX *c, const char *chain, const char *key)
{
	char what[600];
	snprintf(what, sizeof(what), "certificate chain %s", chain);
	if (SSL_CTX_use_certificate_chain_file(c, chain) != 1)
		return ssl_fail(cfg, what);
	snprintf(what, sizeof(what), "private key %s", key);
	if (SSL_CTX_use_PrivateKey_file(c, key, SSL_FILETYPE_PEM) != 1)
		return ssl_fail(cfg, what);
	snprintf(what, sizeof(what), "private key %s does not match %s", key, chain);
	if (SSL_CTX_check_private_key(c) != 1)
		return ssl_fail(cfg, what);
	return 0;
}

int tw_tls_config_set_cert_files(tw_tls_config *cfg, const char *chain_path, const char *key_path)
{
	int rv;
	if (cfg == NULL || chain_path == NULL || key_path == NULL)
		return TW_EINVAL;
	if ((rv = load_pair(cfg, cfg->server, chain_path, key_path)) != 0 ||
	    (rv = load_pair(cfg, cfg->client, chain_path, key_path)) != 0)
		return rv;
	cfg->has_cert = 1;
	return 0;
}

void tw_tls_config_set_require_client_cert(tw_tls_config *cfg, bool on)
{
	cfg->require_client_cert = on;
	set_verify(cfg);
}

void tw_tls_config_set_verify_hostname(tw_tls_config *cfg, bool on)
{
	cfg->verify_hostname = on;
}

int tw_tls_config_set_ciphers(tw_tls_config *cfg, const char *list)
{
	if (cfg == NULL || list == NULL)
		return TW_EINVAL;
	if (SSL_CTX_set_cipher_list(cfg->server, list) != 1 ||
	    SSL_CTX_set_cipher_list(cfg->client, list) != 1)
		return ssl_fail(cfg, "cipher list");
	return 0;
}

const char *tw_tls_config_last_error(const tw_tls_config *cfg)
{
	return cfg->error;
}

static void release(void *tls)
{
	tw_tls_config_free(tls);
}

static void *hold(void *tls, unsigned nloops)
{
	(void)nloops;
	return tw_tls_config_hold(tls);
}

/* The context's reference, its extension (core/context.h); every loop
 * thread's context takes one with each comm handed to it, so a
 * configuration set later (certificates rotated) reaches them. */
static const struct tw__ext_ops tls_ops = {
	.release = release,
	.hold = hold,
	.per_comm = 1,
};

tw_tls_config *tw__tls_config_of(const tw_context *ctx)
{
	return tw__ctx_ext(ctx, &tls_ops);
}

int tw_context_set_tls(tw_context *ctx, tw_tls_config *cfg)
{
	int rv;
	if (ctx == NULL)
		return TW_EINVAL;
	if (cfg != NULL)
		tw_tls_config_hold(cfg);
	if ((rv = tw__ctx_set_ext(ctx, &tls_ops, cfg)) != 0 && cfg != NULL)
		tw_tls_config_free(cfg);
	return rv;
}

int tw_context_set_tls_handshake_timeout_ms(tw_context *ctx, uint32_t ms)
{
	return TW__SET_LIMIT(ctx, tls_handshake_timeout_ms, ms, ms > 0);
}
