/* SPDX-License-Identifier: BSD-3-Clause */
/* Small helpers shared by the example programs. */
#ifndef TW_EXAMPLES_COMMON_H
#define TW_EXAMPLES_COMMON_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <getopt.h>

#include <taskwire/taskwire.h>

/* "64MiB", "1GiB", "3000", "10KiB" -> bytes; exits on garbage. */
static inline uint64_t tw_ex_parse_size(const char *s)
{
	char *end;
	unsigned long long v = strtoull(s, &end, 10);
	if (end == s)
		goto bad;
	if (*end == 'K' || *end == 'k')
		v <<= 10, end++;
	else if (*end == 'M')
		v <<= 20, end++;
	else if (*end == 'G')
		v <<= 30, end++;
	if (strcmp(end, "iB") == 0 || strcmp(end, "B") == 0 || *end == '\0')
		return v;
bad:
	fprintf(stderr, "bad size: %s\n", s);
	exit(2);
}

/* A field of /proc/self/status in bytes (VmRSS, VmHWM). */
static inline uint64_t tw_ex_status_bytes(const char *field)
{
	char line[256];
	unsigned long long kb = 0;
	size_t n = strlen(field);
	FILE *f = fopen("/proc/self/status", "r");
	if (f == NULL)
		return 0;
	while (fgets(line, sizeof(line), f) != NULL)
		if (strncmp(line, field, n) == 0 && line[n] == ':')
			kb = strtoull(line + n + 1, NULL, 10);
	fclose(f);
	return (uint64_t)kb << 10;
}

static inline uint64_t tw_ex_rss(void)
{
	return tw_ex_status_bytes("VmRSS");
}

static inline uint64_t tw_ex_peak_rss(void)
{
	return tw_ex_status_bytes("VmHWM");
}

/* --tls-ca, --tls-cert, --tls-key: the options every example takes. */
struct tw_ex_tls {
	const char *ca, *cert, *key;
};

#define TW_EX_TLS_OPTIONS                                                                          \
	{"tls-ca", required_argument, NULL, 1001}, {"tls-cert", required_argument, NULL, 1002},    \
	{                                                                                          \
		"tls-key", required_argument, NULL, 1003                                           \
	}

#define TW_EX_TLS_USAGE                                                                            \
	"  --tls-ca FILE --tls-cert FILE --tls-key FILE   PEM files for tls:// (mutual TLS)\n"

/* Take one TLS option; 1 if o was one. */
static inline int tw_ex_tls_option(struct tw_ex_tls *t, int o, const char *arg)
{
	switch (o) {
	case 1001: t->ca = arg; return 1;
	case 1002: t->cert = arg; return 1;
	case 1003: t->key = arg; return 1;
	default: return 0;
	}
}

/* Give ctx the TLS configuration the options name (none given: nothing).
 * Exits with a message naming the file on error. */
static inline void tw_ex_tls_setup(tw_context *ctx, const struct tw_ex_tls *t)
{
	tw_tls_config *cfg;
	int rv = 0;
	if (t->ca == NULL && t->cert == NULL && t->key == NULL)
		return;
	if (tw_tls_config_new(&cfg) != 0)
		exit(1);
	if (t->ca != NULL)
		rv = tw_tls_config_set_ca_file(cfg, t->ca);
	if (rv == 0 && (t->cert != NULL || t->key != NULL))
		rv = tw_tls_config_set_cert_files(cfg, t->cert ? t->cert : "",
						  t->key ? t->key : "");
	if (rv != 0) {
		fprintf(stderr, "TLS: %s\n", tw_tls_config_last_error(cfg));
		exit(2);
	}
	tw_context_set_tls(ctx, cfg);
	tw_tls_config_free(cfg);
}

/* 127.0.0.1:port, for the benches' raw sockets. */
static inline struct sockaddr_in tw_ex_loopback(int port)
{
	struct sockaddr_in sa;
	memset(&sa, 0, sizeof(sa));
	sa.sin_family = AF_INET;
	sa.sin_port = htons((uint16_t)port);
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	return sa;
}

/* The request {"op": "echo", "data": <10 bytes "0123456789">}; NULL when
 * out of memory. */
static inline tw_msg *tw_ex_small_echo(void)
{
	tw_builder *b;
	tw_msg *m = NULL;
	msgpack_packer *pk;
	if (tw_builder_new(NULL, &b) != 0)
		return NULL;
	pk = tw_builder_packer(b);
	msgpack_pack_map(pk, 2);
	tw_msgpack_pack_str(pk, "op");
	tw_msgpack_pack_str(pk, "echo");
	tw_msgpack_pack_str(pk, "data");
	msgpack_pack_bin(pk, 10);
	msgpack_pack_bin_body(pk, "0123456789", 10);
	tw_builder_finish(b, &m);
	tw_builder_free(b);
	return m;
}

static inline double tw_ex_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

#endif
