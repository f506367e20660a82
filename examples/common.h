/* SPDX-License-Identifier: BSD-3-Clause */
/* Small helpers shared by the example programs. */
#ifndef TW_EXAMPLES_COMMON_H
#define TW_EXAMPLES_COMMON_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>

#include <getopt.h>

#include <event2/event.h>

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
	"  --tls-ca FILE --tls-cert FILE --tls-key FILE\n"                                         \
	"                         PEM files for tls:// and wss:// (mutual TLS)\n"

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

/* The default case of an option loop: take a TLS option; for any other,
 * print the usage on stderr and exit 2. */
static inline void tw_ex_other_option(struct tw_ex_tls *t, int o, const char *arg,
				      void (*usage)(FILE *f))
{
	if (tw_ex_tls_option(t, o, arg))
		return;
	usage(stderr);
	exit(2);
}

/* After the options: the one argument left, the URI; none or more print
 * the usage on stderr and exit 2. */
static inline const char *tw_ex_uri_arg(int argc, char **argv, void (*usage)(FILE *f))
{
	if (optind != argc - 1) {
		usage(stderr);
		exit(2);
	}
	return argv[optind];
}

/* --memory-limit, --receive-budget, --write-budget: the context's bounds
 * on what its comms hold (include/taskwire/context.h); 0: the default.
 * --pause-limit: how long a peer may stand still (pause_ms; -1: the
 * default). */
struct tw_ex_memory {
	uint64_t limit, receive, write;
	long pause_ms;
};

#define TW_EX_MEMORY_INIT                                                                          \
	{                                                                                          \
		0, 0, 0, -1                                                                        \
	}

#define TW_EX_MEMORY_OPTIONS                                                                       \
	{"memory-limit", required_argument, NULL, 1011},                                           \
		{"receive-budget", required_argument, NULL, 1012},                                 \
		{"write-budget", required_argument, NULL, 1013},                                   \
	{                                                                                          \
		"pause-limit", required_argument, NULL, 1014                                       \
	}

#define TW_EX_MEMORY_USAGE                                                                         \
	"  --memory-limit BYTES   the most the comms may hold (messages being received\n"          \
	"                         and queued for writing); past it, a comm whose peer\n"           \
	"                         reads none of its queue for the pause limit is ended\n"          \
	"                         (TW_ENOMEM) (default 3/4 of the memory the process may use)\n"   \
	"  --receive-budget BYTES messages being received on all comms; past it reads\n"           \
	"                         pause (default 1/4 of the memory the process may use)\n"         \
	"  --write-budget BYTES   bytes queued for writing on all comms; past it a comm\n"         \
	"                         with a queue gets no more (default as the receive budget)\n"     \
	"                         (sizes take K, M, G suffixes: 256M, 1GiB)\n"                     \
	"  --pause-limit MS       how long a peer may stand still while it holds memory\n"         \
	"                         or a relay's source before its comm is ended\n"                  \
	"                         (default 20000; 0: never)\n"

/* --pause-limit MS: 1; exits 2 when MS is not a number of milliseconds. */
static inline int tw_ex_pause_option(struct tw_ex_memory *m, const char *arg)
{
	char *end;
	unsigned long ms = strtoul(arg, &end, 10);
	if (*arg < '0' || *arg > '9' || *end != '\0' || ms > UINT32_MAX) {
		fprintf(stderr, "bad pause limit: %s (milliseconds)\n", arg);
		exit(2);
	}
	m->pause_ms = (long)ms;
	return 1;
}

/* Take one of those options; 1 if o was one. Exits 2 on a bad or zero
 * size. */
static inline int tw_ex_memory_option(struct tw_ex_memory *m, int o, const char *arg)
{
	uint64_t *v;
	switch (o) {
	case 1011: v = &m->limit; break;
	case 1012: v = &m->receive; break;
	case 1013: v = &m->write; break;
	case 1014: return tw_ex_pause_option(m, arg);
	default: return 0;
	}
	if ((*v = tw_ex_parse_size(arg)) == 0) {
		fprintf(stderr, "bad size: %s (0: leave the option out for the default)\n", arg);
		exit(2);
	}
	return 1;
}

/* Give ctx the bounds the options set, and describe what it now has (the
 * defaults too) into text: "memory limit 256 MiB, receive budget ...",
 * with a warning when the limit is below the sum of the budgets (honest
 * traffic the budgets let through can then pass it: context.h). */
static inline void tw_ex_memory_setup(tw_context *ctx, const struct tw_ex_memory *m, char *text,
				      size_t len)
{
	uint64_t limit, receive, write;
	if (m->limit > 0)
		tw_context_set_memory_limit_bytes(ctx, m->limit);
	if (m->receive > 0)
		tw_context_set_receive_budget_bytes(ctx, m->receive);
	if (m->write > 0)
		tw_context_set_write_budget_bytes(ctx, m->write);
	if (m->pause_ms >= 0)
		tw_context_set_receive_budget_pause_ms(ctx, (uint32_t)m->pause_ms);
	tw_context_memory_limit_bytes(ctx, &limit, NULL);
	tw_context_receive_budget_bytes(ctx, &receive, NULL);
	tw_context_write_budget_bytes(ctx, &write, NULL);
	snprintf(text, len,
		 "memory limit %llu MiB, receive budget %llu MiB, write budget %llu MiB%s",
		 (unsigned long long)(limit >> 20), (unsigned long long)(receive >> 20),
		 (unsigned long long)(write >> 20),
		 limit < receive + write ? " (warning: the memory limit is below the sum of the "
					   "budgets, which honest traffic may pass)"
					 : "");
}

/* A client gives up: its comm freed, its run marked failed, its loop
 * stopped. */
static inline void tw_ex_give_up(tw_comm *comm, int *failed, struct event_base *base)
{
	tw_comm_free(comm);
	*failed = 1;
	event_base_loopbreak(base);
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

/* A TCP socket listening on 127.0.0.1:port (SO_REUSEADDR), announced on
 * stdout as "listening on 127.0.0.1:PORT"; -1 after perror("who: bind"). */
static inline int tw_ex_listen_loopback(int port, const char *who)
{
	struct sockaddr_in sa = tw_ex_loopback(port);
	int one = 1, lfd = socket(AF_INET, SOCK_STREAM, 0);
	char what[64];
	setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(lfd, (struct sockaddr *)&sa, sizeof(sa)) != 0 || listen(lfd, 16) != 0) {
		snprintf(what, sizeof(what), "%s: bind", who);
		perror(what);
		return -1;
	}
	printf("listening on 127.0.0.1:%d\n", port);
	fflush(stdout);
	return lfd;
}

static inline void tw_ex_nodelay(int fd)
{
	int one = 1;
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

/* A TCP socket connected to 127.0.0.1:port, with TCP_NODELAY; -1 after
 * perror("who: connect"). */
static inline int tw_ex_dial_loopback(int port, const char *who)
{
	struct sockaddr_in sa = tw_ex_loopback(port);
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	char what[64];
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
		snprintf(what, sizeof(what), "%s: connect", who);
		perror(what);
		return -1;
	}
	tw_ex_nodelay(fd);
	return fd;
}

/* Room for element n of the array *arr of *cap elements of elem bytes,
 * which doubles from `first`; aborts when out of memory. */
static inline void *tw_ex_grow(void *arr, size_t n, size_t *cap, size_t first, size_t elem)
{
	if (n < *cap)
		return arr;
	*cap = *cap ? 2 * *cap : first;
	if ((arr = realloc(arr, *cap * elem)) == NULL)
		abort();
	return arr;
}

static inline void tw_ex_stop_loop(evutil_socket_t sig, short what, void *base)
{
	(void)sig;
	(void)what;
	event_base_loopbreak(base);
}

/* Run base until SIGINT or SIGTERM. */
static inline void tw_ex_run_until_signal(struct event_base *base)
{
	struct event *sigint = evsignal_new(base, SIGINT, tw_ex_stop_loop, base);
	struct event *sigterm = evsignal_new(base, SIGTERM, tw_ex_stop_loop, base);
	event_add(sigint, NULL);
	event_add(sigterm, NULL);
	event_base_dispatch(base);
	event_free(sigint);
	event_free(sigterm);
}

/* The request {"op": OP, "data": <blk's first n bytes, out of band>},
 * its payload compressed with `compression` (NULL: none; tw_builder_new);
 * takes blk (freed here, held by the message). NULL when out of memory. */
static inline tw_msg *tw_ex_data_msg(const char *op, const char *compression, tw_block *blk,
				     size_t n)
{
	tw_builder *b;
	tw_msg *m = NULL;
	msgpack_packer *pk;
	if (tw_builder_new(compression, &b) != 0) {
		tw_block_free(blk);
		return NULL;
	}
	pk = tw_builder_packer(b);
	msgpack_pack_map(pk, 2);
	tw_msgpack_pack_str(pk, "op");
	tw_msgpack_pack_str(pk, op);
	tw_msgpack_pack_str(pk, "data");
	tw_builder_pack_bytes(b, &(tw_slice){blk, 0, n});
	tw_builder_finish(b, &m);
	tw_builder_free(b);
	tw_block_free(blk);
	return m;
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

/* One map {"op": op, field: value (a str of n bytes)} into a batched
 * sender (a stream message): tw_batched_send's result. */
static inline int tw_ex_batch_op(tw_batched *b, const char *op, const char *field,
				 const char *value, size_t n)
{
	msgpack_sbuffer sb;
	msgpack_packer pk;
	int rv;
	msgpack_sbuffer_init(&sb);
	msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
	msgpack_pack_map(&pk, 2);
	tw_msgpack_pack_str(&pk, "op");
	tw_msgpack_pack_str(&pk, op);
	tw_msgpack_pack_str(&pk, field);
	msgpack_pack_str(&pk, n);
	msgpack_pack_str_body(&pk, value, n);
	rv = tw_batched_send(b, sb.data, sb.size);
	msgpack_sbuffer_destroy(&sb);
	return rv;
}

static inline double tw_ex_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Open files up to the hard limit: 1,000 comms and a process's own files
 * pass the usual soft limit of 1,024. */
static inline void tw_ex_raise_files(void)
{
	struct rlimit rl;
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		setrlimit(RLIMIT_NOFILE, &rl);
	}
}

#endif
