/* SPDX-License-Identifier: BSD-3-Clause */
/* dask-recv: receive one Dask message carrying a large out-of-band payload
 * and report what it cost: payload bytes copied in user space and peak RSS
 * above idle, as a multiple of the payload.
 *
 *   dask-recv URI        (prints "listening on ADDR", then one result line)
 *
 * Offers the codec in DASK_DISTRIBUTED__COMM__COMPRESSION in its handshake.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>

#include <taskwire/taskwire.h>

#include "examples/common.h"

static uint64_t idle_rss, copied_before;
static struct event_base *base;
static int failed = 1;

static void on_recv(tw_comm *comm, tw_msg *msg, void *arg)
{
	char why[256] = "";
	tw_decoded *d;
	tw_stats st;
	uint64_t payload = 0, wire = tw_msg_bytes(msg);
	int rv = tw_decode(msg, NULL, &d, why, sizeof(why));
	(void)arg;
	if (rv != 0) {
		fprintf(stderr, "dask-recv: decode failed: %s: %s\n", tw_strerror(rv), why);
		event_base_loopbreak(base);
		return;
	}
	for (size_t i = 0; i < tw_decoded_npayloads(d); i++)
		for (size_t j = 0; j < tw_decoded_payload_at(d, i)->nframes; j++)
			payload += tw_decoded_payload_at(d, i)->frames[j].len;
	tw_stats_global(&st, sizeof(st));
	printf("taskwire: payload %.1f MiB (%.1f MiB on the wire), copied %llu bytes, "
	       "peak RSS above idle %.1f MiB = %.3fx payload\n",
	       (double)payload / 1048576, (double)wire / 1048576,
	       (unsigned long long)(st.payload_bytes_copied - copied_before),
	       (double)(tw_ex_peak_rss() - idle_rss) / 1048576,
	       (double)(tw_ex_peak_rss() - idle_rss) / (double)payload);
	fflush(stdout);
	failed = 0;
	tw_decoded_free(d);
	tw_comm_close(comm);
}

static void on_close(tw_comm *comm, int err, void *arg)
{
	(void)err;
	(void)arg;
	tw_comm_free(comm);
	event_base_loopbreak(base);
}

static void on_handshake(tw_comm *comm, int err, const tw_handshake_info *info, void *arg)
{
	(void)info;
	(void)arg;
	if (err != 0 || tw_comm_set_callbacks(comm, on_recv, on_close, NULL, NULL) != 0) {
		tw_comm_free(comm);
		event_base_loopbreak(base);
	}
}

static void on_accept(tw_listener *l, tw_comm *comm, void *arg)
{
	(void)l;
	(void)arg;
	if (tw_comm_handshake(comm, TW_HANDSHAKE_LISTENER, on_handshake, NULL) != 0)
		tw_comm_free(comm);
}

int main(int argc, char **argv)
{
	tw_context *ctx;
	tw_listener *l;
	tw_stats st;
	char addr[128];
	const char *codec = getenv("DASK_DISTRIBUTED__COMM__COMPRESSION");
	if (argc != 2) {
		fprintf(stderr, "usage: dask-recv URI\n");
		return 2;
	}
	base = event_base_new();
	if (tw_context_new(base, &ctx) != 0 ||
	    tw_listener_new(ctx, argv[1], on_accept, NULL, &l) != 0)
		return 1;
	/* Offer what the Python peer is pinned to, or it sends uncompressed. */
	if (codec != NULL && strcmp(codec, "False") != 0 &&
	    tw_context_set_compression(ctx, codec) != 0)
		return 2;
	tw_listener_address(l, addr, sizeof(addr));
	tw_stats_global(&st, sizeof(st));
	copied_before = st.payload_bytes_copied;
	idle_rss = tw_ex_rss();
	printf("listening on %s\n", addr);
	fflush(stdout);
	event_base_dispatch(base);
	tw_listener_free(l);
	tw_context_free(ctx);
	event_base_free(base);
	return failed;
}
