/* SPDX-License-Identifier: BSD-3-Clause */
/* Internal view of a TLS configuration. */
#ifndef TW_TRANSPORT_TLS_CONFIG_H
#define TW_TRANSPORT_TLS_CONFIG_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include <openssl/ssl.h>

#include <taskwire/tls.h>

struct tw_tls_config {
	_Atomic size_t refs;
	SSL_CTX *server; /* for listeners */
	SSL_CTX *client; /* for connectors */
	int require_client_cert;
	int verify_hostname;
	int has_ca, has_cert;
	char error[512];
};

/* A socket BIO for fd whose writes never raise SIGPIPE (the fd stays
 * the caller's), or NULL. */
BIO *tw__tls_socket_bio(int fd);

/* Records written by OpenSSL on this thread while one is set: that BIO's
 * writes are appended to buf (cap bytes, len used) instead of going to the
 * socket, and refused (a retryable write) once they do not fit; tls.c
 * sends what gathered with one send (transport/tls.c, tls_writev). */
struct tw__tls_gather {
	uint8_t *buf;
	size_t len, cap;
};
extern _Thread_local struct tw__tls_gather *tw__tls_gathering;

/* The context's configuration (tw_context_set_tls), or NULL. Loop thread. */
tw_tls_config *tw__tls_config_of(const tw_context *ctx);

#endif
