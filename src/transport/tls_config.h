/* SPDX-License-Identifier: BSD-3-Clause */
/* Internal view of a TLS configuration. */
#ifndef TW_TRANSPORT_TLS_CONFIG_H
#define TW_TRANSPORT_TLS_CONFIG_H

#include <stdatomic.h>

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

#endif
