/* SPDX-License-Identifier: BSD-3-Clause */
/* loops-bench: the server side of bench/loops-bench.sh, aggregate small
 * RPCs against one tw_server on 1 or more loop threads
 * (tw_context_set_loop_threads; issue 20, "every core"). The load comes
 * from bench/rpc-load, a process of its own.
 *
 *   loops-bench server LOOPS [WORK_BYTES]
 *       a tw_server on tcp://127.0.0.1:0 with LOOPS loop threads; prints
 *       "listening on URI"; runs until SIGTERM or SIGINT. Without
 *       WORK_BYTES (or 0) `echo` is the built-in one. With WORK_BYTES,
 *       `echo` also hashes WORK_BYTES bytes with SHA-256 before it
 *       replies (work a scheduler's handler does per message, on the
 *       thread of the request's comm); the server first prints what that
 *       costs in CPU time ("work: X us per request").
 *
 * Not a test: no pass or fail. */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <event2/event.h>
#include <openssl/evp.h>

#include <taskwire/taskwire.h>

#include "examples/common.h"

static uint8_t *work_buf; /* read only once the server runs */
static size_t work_bytes;
static _Thread_local unsigned char work_sink;

static void do_work(void)
{
	unsigned char md[EVP_MAX_MD_SIZE];
	unsigned int n;
	EVP_Digest(work_buf, work_bytes, md, &n, EVP_sha256(), NULL);
	work_sink ^= md[0];
}

/* echo, after the work: on the thread of the request's comm. */
static void op_work_echo(tw_request *r, void *arg)
{
	const msgpack_object *data = tw_request_arg(r, "data");
	tw_builder *b;
	(void)arg;
	do_work();
	b = tw_request_reply_builder(r);
	if (b != NULL && data != NULL)
		tw_builder_pack_object(b, tw_request_decoded(r), data);
	tw_request_reply(r);
}

/* This thread's CPU time: the work's cost whatever else runs. */
static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* The work's CPU cost alone, on this thread, before any comm. */
static double work_us(void)
{
	double t0;
	for (int i = 0; i < 200; i++)
		do_work();
	t0 = now();
	for (int i = 0; i < 2000; i++)
		do_work();
	return (now() - t0) * 1e6 / 2000;
}

static void on_signal(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	event_base_loopbreak(arg);
}

static int run_server(unsigned loops)
{
	struct event_base *base = event_base_new();
	struct event *term, *intr;
	tw_context *ctx;
	tw_server *s;
	char addr[128];
	if (base == NULL || tw_context_new(base, &ctx) != 0) {
		fprintf(stderr, "loops-bench: no context\n");
		return 1;
	}
	if (tw_context_set_loop_threads(ctx, loops) != 0 || tw_server_new(ctx, &s) != 0 ||
	    (work_bytes > 0 && tw_server_add_op(s, "echo", op_work_echo, NULL) != 0) ||
	    tw_server_listen(s, "tcp://127.0.0.1:0") != 0 ||
	    tw_server_address(s, 0, addr, sizeof(addr)) != 0) {
		fprintf(stderr, "loops-bench: server setup failed\n");
		return 1;
	}
	term = evsignal_new(base, SIGTERM, on_signal, base);
	intr = evsignal_new(base, SIGINT, on_signal, base);
	event_add(term, NULL);
	event_add(intr, NULL);
	if (work_bytes > 0)
		printf("work: %.2f us per request (SHA-256 of %zu bytes)\n", work_us(), work_bytes);
	printf("listening on %s (%u loop threads)\n", addr, loops);
	fflush(stdout);
	event_base_dispatch(base);
	tw_server_free(s);
	tw_context_free(ctx);
	event_free(term);
	event_free(intr);
	event_base_free(base);
	return 0;
}

int main(int argc, char **argv)
{
	tw_ex_raise_files();
	if ((argc == 3 || argc == 4) && strcmp(argv[1], "server") == 0) {
		work_bytes = argc == 4 ? (size_t)strtoul(argv[3], NULL, 10) : 0;
		if (work_bytes > 0 && (work_buf = calloc(1, work_bytes)) == NULL)
			return 1;
		return run_server((unsigned)atoi(argv[2]));
	}
	fprintf(stderr, "usage: loops-bench server LOOPS [WORK_BYTES]\n"
			"(the client: bench/rpc-load)\n");
	return 2;
}
