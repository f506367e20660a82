/* SPDX-License-Identifier: BSD-3-Clause */
/* tw-echo-server: accept comms on a URI, do the Dask handshake, then
 * write back every message unchanged (a comm-level echo, like a Python
 * `distributed.comm.listen` handler that writes back what it reads),
 * without copying its frames.
 *
 *   tw-echo-server tcp://127.0.0.1:8786 [--max-message BYTES] [--quiet]
 *                  [--memory-limit BYTES] [--receive-budget BYTES]
 *                  [--write-budget BYTES] [TLS options]
 *
 * Prints each comm's totals when it ends, with the payload bytes the
 * process copied and its peak RSS above idle. */
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>

#include <taskwire/taskwire.h>

#include "examples/common.h"

struct conn {
	tw_comm *comm;
	tw_msg **pending; /* echoes refused by the high-water mark, in order */
	size_t npending, cap;
	uint64_t msgs, bytes;
};

static int quiet;
static uint64_t idle_rss;

/* The write queue drained: send what waited, and read again once nothing
 * waits (reading pauses meanwhile, so a peer that never reads cannot make
 * this server buffer without bound). */
static void flush_pending(struct conn *c)
{
	size_t done = 0;
	while (done < c->npending && tw_comm_write(c->comm, c->pending[done]) == 0)
		done++;
	if (done > 0)
		memmove(c->pending, c->pending + done, (c->npending - done) * sizeof(*c->pending));
	c->npending -= done;
	if (c->npending == 0)
		tw_comm_resume(c->comm);
}

static void push_pending(struct conn *c, tw_msg *msg)
{
	c->pending = tw_ex_grow(c->pending, c->npending, &c->cap, 16, sizeof(*c->pending));
	c->pending[c->npending++] = msg;
}

/* Echo: the received message is borrowed, so hold it; the comm takes
 * that reference when the write succeeds. */
static void on_recv(tw_comm *comm, tw_msg *msg, void *arg)
{
	struct conn *c = arg;
	int rv = TW_EAGAIN;
	c->msgs++;
	c->bytes += tw_msg_bytes(msg);
	tw_msg_hold(msg);
	if (c->npending == 0)
		rv = tw_comm_write(comm, msg);
	if (rv == TW_EAGAIN) {
		push_pending(c, msg);
		tw_comm_pause(comm);
	} else if (rv != 0) {
		tw_msg_free(msg);
		fprintf(stderr, "echo failed: %s\n", tw_strerror(rv));
	}
}

static void on_drain(tw_comm *comm, void *arg)
{
	(void)comm;
	flush_pending(arg);
}

static void on_close(tw_comm *comm, int err, void *arg)
{
	struct conn *c = arg;
	char peer[128] = "?";
	tw_stats g;
	tw_comm_peer_address(comm, peer, sizeof(peer));
	tw_stats_global(&g, sizeof(g));
	if (!quiet || err != 0)
		printf("%s: %s; echoed %llu messages, %llu bytes in their frames; "
		       "process so far: copied %llu payload bytes, peak RSS %llu MiB above idle\n",
		       peer, err ? tw_strerror(err) : "closed", (unsigned long long)c->msgs,
		       (unsigned long long)c->bytes, (unsigned long long)g.payload_bytes_copied,
		       (unsigned long long)((tw_ex_peak_rss() - idle_rss) >> 20));
	if (err != 0 && *tw_comm_last_error(comm))
		printf("  detail: %s\n", tw_comm_last_error(comm));
	fflush(stdout);
	for (size_t i = 0; i < c->npending; i++)
		tw_msg_free(c->pending[i]);
	free(c->pending);
	free(c);
	tw_comm_free(comm);
}

static void on_handshake(tw_comm *comm, int err, const tw_handshake_info *info, void *arg)
{
	struct conn *c = calloc(1, sizeof(*c));
	char peer[128] = "?";
	(void)info;
	(void)arg;
	tw_comm_peer_address(comm, peer, sizeof(peer));
	if (err != 0 || c == NULL) {
		printf("%s: handshake failed: %s: %s\n", peer, tw_strerror(err),
		       tw_comm_last_error(comm));
		fflush(stdout);
		free(c);
		tw_comm_free(comm);
		return;
	}
	c->comm = comm;
	if (tw_comm_set_callbacks(comm, on_recv, on_close, on_drain, c) != 0) {
		free(c);
		tw_comm_free(comm);
	}
}

/* A client that failed before it became a comm (a TLS client refused for
 * its certificate, a ws upgrade): one line, so an operator sees why. */
static void on_accept_error(tw_listener *l, int err, const char *peer, const char *why, void *arg)
{
	(void)l;
	(void)arg;
	printf("%s: refused before the handshake: %s\n  detail: %s\n", *peer ? peer : "?",
	       tw_strerror(err), why);
	fflush(stdout);
}

static void on_accept(tw_listener *l, tw_comm *comm, void *arg)
{
	(void)l;
	(void)arg;
	if (tw_comm_handshake(comm, TW_HANDSHAKE_LISTENER, on_handshake, NULL) != 0)
		tw_comm_free(comm);
}

static void usage(FILE *f)
{
	fputs("usage: tw-echo-server URI [--max-message BYTES] [--quiet] [--memory-limit BYTES]\n"
	      "                      [--receive-budget BYTES] [--write-budget BYTES]\n"
	      "                      [--pause-limit MS] [TLS options]\n",
	      f);
	fputs(TW_EX_TLS_USAGE, f);
	fputs("  Listen on URI (tcp://, tls://, ws:// or wss://, e.g. tcp://127.0.0.1:8786;\n"
	      "  port 0 picks a free port) and write every message back unchanged. Prints\n"
	      "  the bound address, then one line per comm when it ends. Stops on\n"
	      "  SIGINT/SIGTERM.\n"
	      "  --max-message BYTES   refuse messages larger than BYTES (K, M, G suffixes;\n"
	      "                        default 4GiB)\n"
	      "  --quiet               print only the comms that end with an error\n",
	      f);
	fputs(TW_EX_MEMORY_USAGE, f);
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {{"max-message", required_argument, NULL, 'm'},
					     {"quiet", no_argument, NULL, 'q'},
					     {"help", no_argument, NULL, 'h'},
					     TW_EX_TLS_OPTIONS,
					     TW_EX_MEMORY_OPTIONS,
					     {NULL, 0, NULL, 0}};
	uint64_t max_message = 0;
	struct tw_ex_tls tls = {NULL, NULL, NULL};
	struct tw_ex_memory mem = TW_EX_MEMORY_INIT;
	struct event_base *base;
	tw_context *ctx;
	tw_listener *l;
	const char *uri;
	char addr[128], bounds[256];
	int o, rv;
	while ((o = getopt_long(argc, argv, "m:qh", opts, NULL)) != -1) {
		switch (o) {
		case 'm': max_message = tw_ex_parse_size(optarg); break;
		case 'q': quiet = 1; break;
		case 'h': usage(stdout); return 0;
		default:
			if (!tw_ex_memory_option(&mem, o, optarg))
				tw_ex_other_option(&tls, o, optarg, usage);
		}
	}
	uri = tw_ex_uri_arg(argc, argv, usage);
	signal(SIGPIPE, SIG_IGN);
	base = event_base_new();
	if (base == NULL || tw_context_new(base, &ctx) != 0) {
		fprintf(stderr, "tw-echo-server: cannot make the event loop\n");
		return 1;
	}
	if (max_message > 0)
		tw_context_set_max_message_bytes(ctx, max_message);
	tw_ex_memory_setup(ctx, &mem, bounds, sizeof(bounds));
	tw_ex_tls_setup(ctx, &tls);
	if ((rv = tw_listener_new(ctx, uri, on_accept, NULL, &l)) != 0) {
		fprintf(stderr, "tw-echo-server: cannot listen on %s: %s\n", uri, tw_strerror(rv));
		if (*tw_context_last_error(ctx))
			fprintf(stderr, "  %s\n", tw_context_last_error(ctx));
		return 1;
	}
	tw_listener_set_error_cb(l, on_accept_error, NULL);
	tw_listener_address(l, addr, sizeof(addr));
	idle_rss = tw_ex_rss();
	printf("listening on %s\n", addr);
	fflush(stdout);
	fprintf(stderr, "%s\n", bounds);
	tw_ex_run_until_signal(base);
	tw_listener_free(l);
	tw_context_free(ctx);
	event_base_free(base);
	return 0;
}
