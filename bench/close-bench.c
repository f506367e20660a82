/* SPDX-License-Identifier: BSD-3-Clause */
/* close-bench: what tw_comm_close does with a full queue (issue 17,
 * finding 1), over tcp, tls, ws or wss on loopback, in one process.
 *
 *   close-bench SCHEME slow|stopped [--mb MiB] [--rate MB/s] [--certs DIR]
 *               [--linger MS]
 *
 * A client queues --mb messages of 1 MiB (default 63) and calls
 * tw_comm_close at once. The server's comm reads them at --rate MB/s
 * (slow; default 5) or never (stopped). Printed: the time from
 * tw_comm_close to the close callback, its err and text, and the bytes
 * the reader received. tls and wss need --certs DIR (made by
 * scripts/make-test-certs.sh). --linger sets tw_context_set_close_linger_ms
 * (builds that have it). Times are wall clock on a shared machine: run it
 * niced and read them as orders of magnitude. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <event2/event.h>
#include <taskwire/taskwire.h>

#define MiB ((size_t)1 << 20)

struct bench {
	struct event_base *base;
	tw_context *ctx;
	tw_listener *lis;
	tw_comm *srv, *cli;
	struct event *resume_ev;
	int stopped;
	double rate_mb;
	uint64_t got, srv_msgs;
	int cli_closed, cli_err, srv_closed, srv_err;
	char cli_text[512];
	double t_close, t_closed;
};

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void srv_recv(tw_comm *c, tw_msg *m, void *arg)
{
	struct bench *b = arg;
	double s = (double)tw_msg_bytes(m) / (b->rate_mb * 1e6);
	struct timeval tv = {(time_t)s, (suseconds_t)((s - (double)(time_t)s) * 1e6)};
	b->got += tw_msg_bytes(m);
	b->srv_msgs++;
	tw_comm_pause(c); /* the rate: one message, then a pause of its time */
	evtimer_add(b->resume_ev, &tv);
}

static void srv_resume(evutil_socket_t fd, short what, void *arg)
{
	struct bench *b = arg;
	(void)fd;
	(void)what;
	if (b->srv != NULL && !b->srv_closed)
		tw_comm_resume(b->srv);
}

static void srv_close(tw_comm *c, int err, void *arg)
{
	struct bench *b = arg;
	(void)c;
	b->srv_closed = 1;
	b->srv_err = err;
}

static void on_accept(tw_listener *l, tw_comm *c, void *arg)
{
	struct bench *b = arg;
	(void)l;
	b->srv = c;
	if (!b->stopped && tw_comm_set_callbacks(c, srv_recv, srv_close, NULL, b) != 0)
		exit(1);
}

static void cli_recv(tw_comm *c, tw_msg *m, void *arg)
{
	(void)c;
	(void)m;
	(void)arg;
}

static void cli_close(tw_comm *c, int err, void *arg)
{
	struct bench *b = arg;
	b->cli_closed = 1;
	b->cli_err = err;
	b->t_closed = now_s();
	snprintf(b->cli_text, sizeof(b->cli_text), "%s", tw_comm_last_error(c));
}

static void on_connect(tw_comm *c, int err, void *arg)
{
	struct bench *b = arg;
	if (err != 0) {
		fprintf(stderr, "connect: %s: %s\n", tw_strerror(err),
			tw_context_last_error(b->ctx));
		exit(1);
	}
	b->cli = c;
	if (tw_comm_set_callbacks(c, cli_recv, cli_close, NULL, b) != 0)
		exit(1);
}

static void use_certs(tw_context *ctx, const char *dir)
{
	char ca[512], cert[512], key[512];
	tw_tls_config *cfg;
	snprintf(ca, sizeof(ca), "%s/ca.pem", dir);
	snprintf(cert, sizeof(cert), "%s/cert.pem", dir);
	snprintf(key, sizeof(key), "%s/key.pem", dir);
	if (tw_tls_config_new(&cfg) != 0 || tw_tls_config_set_ca_file(cfg, ca) != 0 ||
	    tw_tls_config_set_cert_files(cfg, cert, key) != 0 ||
	    tw_context_set_tls(ctx, cfg) != 0) {
		fprintf(stderr, "TLS configuration from %s failed\n", dir);
		exit(1);
	}
	tw_tls_config_free(cfg);
}

int main(int argc, char **argv)
{
	struct bench b;
	const char *scheme, *certs = NULL;
	uint64_t got_at_close;
	char uri[160];
	unsigned mb = 63, linger = 0;
	memset(&b, 0, sizeof(b));
	b.rate_mb = 5;
	if (argc < 3) {
		fprintf(stderr, "usage: close-bench SCHEME slow|stopped [--mb N] [--rate MB/s] "
				"[--certs DIR] [--linger MS]\n");
		return 2;
	}
	scheme = argv[1];
	b.stopped = strcmp(argv[2], "stopped") == 0;
	for (int i = 3; i + 1 < argc; i += 2) {
		if (strcmp(argv[i], "--mb") == 0)
			mb = (unsigned)atoi(argv[i + 1]);
		else if (strcmp(argv[i], "--rate") == 0)
			b.rate_mb = atof(argv[i + 1]);
		else if (strcmp(argv[i], "--certs") == 0)
			certs = argv[i + 1];
		else if (strcmp(argv[i], "--linger") == 0)
			linger = (unsigned)atoi(argv[i + 1]);
	}
	b.base = event_base_new();
	if (b.base == NULL || tw_context_new(b.base, &b.ctx) != 0)
		return 1;
	if (certs != NULL)
		use_certs(b.ctx, certs);
	if (linger != 0) {
#ifdef TW_DEFAULT_CLOSE_LINGER_MS
		tw_context_set_close_linger_ms(b.ctx, linger);
#else
		fprintf(stderr, "this build has no close linger: --linger ignored\n");
#endif
	}
	b.resume_ev = evtimer_new(b.base, srv_resume, &b);
	snprintf(uri, sizeof(uri), "%s://127.0.0.1:0", scheme);
	if (tw_listener_new(b.ctx, uri, on_accept, &b, &b.lis) != 0 ||
	    tw_listener_address(b.lis, uri, sizeof(uri)) != 0 ||
	    tw_comm_connect(b.ctx, uri, on_connect, &b) != 0) {
		fprintf(stderr, "%s: %s\n", uri, tw_context_last_error(b.ctx));
		return 1;
	}
	while (b.cli == NULL || b.srv == NULL)
		event_base_loop(b.base, EVLOOP_ONCE);
	static uint8_t payload[MiB];
	for (unsigned i = 0; i < mb; i++) {
		tw_msg *m;
		if (tw_msg_new(&m) != 0 || tw_msg_append_copy(m, payload, MiB) != 0 ||
		    tw_comm_write(b.cli, m) != 0) {
			fprintf(stderr, "write %u failed\n", i);
			return 1;
		}
	}
	b.t_close = now_s();
	tw_comm_close(b.cli);
	while (!b.cli_closed)
		event_base_loop(b.base, EVLOOP_ONCE);
	got_at_close = b.got;
	/* A slow reader goes on to its end: what it got in all. */
	while (!b.stopped && !b.srv_closed)
		event_base_loop(b.base, EVLOOP_ONCE);
	printf("%s, reader %s %.0f MB/s: %u MiB queued (%llu payload bytes); close callback after "
	       "%.2f s: %s%s%s; reader had %llu bytes then",
	       scheme, b.stopped ? "stopped" : "slow at", b.stopped ? 0 : b.rate_mb, mb,
	       (unsigned long long)mb * MiB, b.t_closed - b.t_close, tw_strerror(b.cli_err),
	       b.cli_text[0] ? ": " : "", b.cli_text, (unsigned long long)got_at_close);
	if (!b.stopped)
		printf(", %llu in all (%llu messages), its end: %s", (unsigned long long)b.got,
		       (unsigned long long)b.srv_msgs, tw_strerror(b.srv_err));
	printf("\n");
	tw_comm_free(b.cli);
	tw_comm_free(b.srv);
	tw_listener_free(b.lis);
	event_free(b.resume_ev);
	tw_context_free(b.ctx);
	event_base_free(b.base);
	return 0;
}
