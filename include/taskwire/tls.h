/* SPDX-License-Identifier: BSD-3-Clause */
/* taskwire: TLS configuration for tls:// and wss:// comms
 * (docs/design.md, TLS). OpenSSL types never appear here.
 *
 * A configuration is refcounted and shared by the comms made with it:
 * tw_context_set_tls holds a reference, so the caller may free its own
 * right after. Defaults follow Dask clusters: TLS 1.2 minimum, peers
 * verified against the CA file, client certificates required by
 * listeners (mutual TLS), host names checked by clients that connect to a
 * name (not to an IP address) unless switched off.
 *
 * Threads: fill a configuration (tw_tls_config_set_*) on one thread before
 * tw_context_set_tls hands it to a context; from then on the handshakes
 * of every loop thread read it without a lock, so it is not changed any
 * more: to rotate certificates, fill a new configuration and set that
 * (comms made after use it). The setters that return void take a
 * non-NULL cfg. */
#ifndef TASKWIRE_TLS_H
#define TASKWIRE_TLS_H

#include <stdbool.h>

#include <taskwire/context.h>
#include <taskwire/limits.h>

#ifdef __cplusplus
extern "C" {
#endif

#pragma GCC visibility push(default)

typedef struct tw_tls_config tw_tls_config;

/* tw_tls_config_new: an empty configuration (one reference, the
 * caller's). Any thread.
 * Returns 0 and sets *out, or:
 *   TW_EINVAL  out is NULL
 *   TW_ENOMEM  out of memory (OpenSSL's contexts included) */
int tw_tls_config_new(tw_tls_config **out);
/* tw_tls_config_hold: take one more reference to cfg (any thread); returns
 * cfg. Each reference is dropped with tw_tls_config_free. */
tw_tls_config *tw_tls_config_hold(tw_tls_config *cfg);
/* Drop one reference; accepts NULL. */
void tw_tls_config_free(tw_tls_config *cfg);

/* tw_tls_config_set_ca_file: the PEM file of the CAs that sign peers'
 * certificates.
 * Returns 0, or:
 *   TW_EINVAL  cfg or path NULL, or OpenSSL cannot load the file
 *              (tw_tls_config_last_error names it and OpenSSL's reason) */
int tw_tls_config_set_ca_file(tw_tls_config *cfg, const char *path);

/* tw_tls_config_set_cert_files: this side's certificate chain and private
 * key (PEM files), used by listeners and, for mutual TLS, by connectors.
 * Returns 0, or:
 *   TW_EINVAL  an argument NULL, an unreadable file, or a key that does
 *              not match the certificate (tw_tls_config_last_error says
 *              which) */
int tw_tls_config_set_cert_files(tw_tls_config *cfg, const char *chain_path, const char *key_path);

/* tw_tls_config_set_require_client_cert: listeners require and verify
 * client certificates (default true). */
void tw_tls_config_set_require_client_cert(tw_tls_config *cfg, bool on);
/* tw_tls_config_set_verify_hostname: connectors to a host name check it
 * against the peer's certificate (default true; Dask-compatible mode is
 * false). */
void tw_tls_config_set_verify_hostname(tw_tls_config *cfg, bool on);
/* tw_tls_config_set_ciphers: OpenSSL cipher list for TLS 1.2 (TLS 1.3
 * suites keep OpenSSL's defaults).
 * Returns 0, or:
 *   TW_EINVAL  cfg or list NULL, or OpenSSL refuses the list */
int tw_tls_config_set_ciphers(tw_tls_config *cfg, const char *list);

/* The last configuration error, "" if none; valid while cfg lives,
 * overwritten by the next setter that fails. */
const char *tw_tls_config_last_error(const tw_tls_config *cfg);

/* tw_context_set_tls: the configuration tls:// comms of this context use
 * (NULL: none, tls:// then fails with TW_EINVAL). Holds a reference.
 * Loop thread (or before the loop runs).
 * Returns 0, or:
 *   TW_EINVAL  ctx is NULL */
int tw_context_set_tls(tw_context *ctx, tw_tls_config *cfg);

/* tw_context_set_tls_handshake_timeout_ms: bound on the TLS handshake
 * (default 10,000 ms); a silent or stalled peer is dropped after it. A
 * connecting side's handshake also ends when the connect timeout, counted
 * from tw_comm_connect, runs out (tw_context_set_connect_timeout_ms).
 * Applies to comms made after the call. Loop thread (or before the loop
 * runs).
 * Returns 0, or:
 *   TW_EINVAL  ctx NULL or ms 0 */
int tw_context_set_tls_handshake_timeout_ms(tw_context *ctx, uint32_t ms);

#pragma GCC visibility pop

#ifdef __cplusplus
}
#endif
#endif
