/* SPDX-License-Identifier: BSD-3-Clause */
/* tw-echo-client: send Dask messages to a comm-level echo peer and check
 * every byte that comes back.
 *
 *   tw-echo-client tcp://127.0.0.1:8786 [--size BYTES] [--frames N] [--count N]
 *
 * After the Dask handshake, each message is {"op": "echo", "seq": k,
 * "payload": [p_0 .. p_N-1]} where each p_j is an out-of-band bytes payload
 * of BYTES bytes (sent from one pattern buffer without copying, compressed
 * if the handshake agreed on a codec). The peer may send payloads back out
 * of band or inline (a Python peer that deserialized them): both are
 * checked. Messages go one at a time. Prints MB/s of payload echoed and
 * round trips per second. Exits 0 only if every byte matched. */
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>

#include <taskwire/taskwire.h>

#include "examples/common.h"

struct client {
	struct event_base *base;
	tw_context *ctx;
	uint64_t size, frames, count;
	tw_block *pattern; /* size + frames + 8 bytes; payload j of message k starts at j + k % 8 */
	uint64_t sent, verified;
	int failed;
	double t0, t1;
};

static int send_next(tw_comm *comm, struct client *cl)
{
	size_t shift = (size_t)(cl->sent % 8);
	msgpack_packer *pk;
	tw_builder *b;
	tw_msg *m = NULL;
	int rv = tw_builder_new(tw_comm_compression(comm), &b);
	if (rv == 0) {
		pk = tw_builder_packer(b);
		msgpack_pack_map(pk, 3);
		tw_msgpack_pack_str(pk, "op");
		tw_msgpack_pack_str(pk, "echo");
		tw_msgpack_pack_str(pk, "seq");
		msgpack_pack_uint64(pk, cl->sent);
		tw_msgpack_pack_str(pk, "payload");
		msgpack_pack_array(pk, (size_t)cl->frames);
		for (uint64_t j = 0; rv == 0 && j < cl->frames; j++)
			rv = tw_builder_pack_bytes(b,
						   &(tw_slice){cl->pattern, j + shift, cl->size});
		if (rv == 0)
			rv = tw_builder_finish(b, &m);
		tw_builder_free(b);
	}
	if (rv == 0 && (rv = tw_comm_write(comm, m)) != 0)
		tw_msg_free(m);
	if (rv != 0) {
		fprintf(stderr, "tw-echo-client: write failed: %s\n", tw_strerror(rv));
		return rv;
	}
	cl->sent++;
	return 0;
}

static int check_payloads(const struct client *cl, const tw_decoded *d, uint64_t k)
{
	const msgpack_object *arr = tw_msgpack_map_get(tw_decoded_root(d), "payload");
	const uint8_t *want = tw_block_data(cl->pattern) + k % 8;
	if (arr == NULL || arr->type != MSGPACK_OBJECT_ARRAY || arr->via.array.size != cl->frames) {
		fprintf(stderr, "message %llu: no payload list of %llu entries\n",
			(unsigned long long)k, (unsigned long long)cl->frames);
		return -1;
	}
	for (uint32_t j = 0; j < arr->via.array.size; j++) {
		const uint8_t *p;
		size_t n;
		if (tw_decoded_bytes(d, &arr->via.array.ptr[j], &p, &n) != 0 || n != cl->size ||
		    (n > 0 && memcmp(p, want + j, n) != 0)) {
			fprintf(stderr, "message %llu payload %u: bytes differ\n",
				(unsigned long long)k, j);
			return -1;
		}
	}
	return 0;
}

static int check(const struct client *cl, const tw_msg *m, uint64_t k)
{
	char why[256] = "";
	tw_decoded *d;
	int rv = tw_decode(m, NULL, &d, why, sizeof(why));
	if (rv != 0) {
		fprintf(stderr, "message %llu: cannot decode: %s: %s\n", (unsigned long long)k,
			tw_strerror(rv), why);
		return -1;
	}
	rv = check_payloads(cl, d, k);
	tw_decoded_free(d);
	return rv;
}

static void on_recv(tw_comm *comm, tw_msg *m, void *arg)
{
	struct client *cl = arg;
	if (check(cl, m, cl->verified) != 0) {
		cl->failed = 1;
		tw_comm_close(comm);
		return;
	}
	cl->verified++;
	if (cl->verified == cl->count) {
		cl->t1 = tw_ex_now();
		tw_comm_close(comm);
	} else if (send_next(comm, cl) != 0) {
		cl->failed = 1;
		tw_comm_close(comm);
	}
}

static void on_close(tw_comm *comm, int err, void *arg)
{
	struct client *cl = arg;
	if (err != 0 || cl->verified < cl->count) {
		fprintf(stderr, "tw-echo-client: comm ended after %llu of %llu echoes: %s: %s\n",
			(unsigned long long)cl->verified, (unsigned long long)cl->count,
			tw_strerror(err), tw_comm_last_error(comm));
		cl->failed = 1;
	}
	tw_comm_free(comm);
	event_base_loopbreak(cl->base);
}

static void on_handshake(tw_comm *comm, int err, const tw_handshake_info *info, void *arg)
{
	struct client *cl = arg;
	(void)info;
	if (err != 0) {
		fprintf(stderr, "tw-echo-client: handshake failed: %s: %s\n", tw_strerror(err),
			tw_comm_last_error(comm));
		tw_ex_give_up(comm, &cl->failed, cl->base);
		return;
	}
	tw_comm_set_callbacks(comm, on_recv, on_close, NULL, cl);
	cl->t0 = tw_ex_now();
	if (send_next(comm, cl) != 0) {
		cl->failed = 1;
		tw_comm_close(comm);
	}
}

static void on_connect(tw_comm *comm, int err, void *arg)
{
	struct client *cl = arg;
	if (err == 0)
		err = tw_comm_handshake(comm, TW_HANDSHAKE_CONNECTOR, on_handshake, cl);
	if (err != 0) {
		fprintf(stderr, "tw-echo-client: connect failed: %s%s%s\n", tw_strerror(err),
			*tw_context_last_error(cl->ctx) ? ": " : "",
			tw_context_last_error(cl->ctx));
		tw_ex_give_up(comm, &cl->failed, cl->base);
	}
}

static void usage(FILE *f)
{
	fprintf(f, "usage: tw-echo-client URI [--size BYTES] [--frames N] [--count N]\n"
		   "                      [--compression zstd|lz4] [TLS options]\n" TW_EX_TLS_USAGE
		   "  After the Dask handshake, send COUNT messages carrying FRAMES\n"
		   "  out-of-band payloads of BYTES bytes each (defaults: --size 1MiB\n"
		   "  --frames 1 --count 10; sizes take K, M, G suffixes) to the comm-level\n"
		   "  echo peer at URI (tcp://, tls://, ws:// or wss://), one at a time, check\n"
		   "  every echoed byte, and print the throughput. --compression offers that\n"
		   "  codec in the handshake; payloads are compressed if the peer agrees.\n");
}

static void report(const struct client *cl)
{
	double secs = cl->t1 - cl->t0;
	double bytes = (double)cl->size * (double)cl->frames * (double)cl->count;
	printf("echoed %llu messages of %llu x %llu bytes: all bytes match\n",
	       (unsigned long long)cl->count, (unsigned long long)cl->frames,
	       (unsigned long long)cl->size);
	printf("%.3f s, %.1f MB/s payload each way, %.0f round trips/s\n", secs,
	       secs > 0 ? bytes / secs / 1e6 : 0.0, secs > 0 ? (double)cl->count / secs : 0.0);
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {{"size", required_argument, NULL, 's'},
					     {"compression", required_argument, NULL, 'z'},
					     {"frames", required_argument, NULL, 'f'},
					     {"count", required_argument, NULL, 'c'},
					     {"help", no_argument, NULL, 'h'},
					     TW_EX_TLS_OPTIONS,
					     {NULL, 0, NULL, 0}};
	struct client cl = {.size = 1 << 20, .frames = 1, .count = 10};
	const char *codec = NULL;
	struct tw_ex_tls tls = {NULL, NULL, NULL};
	tw_context *ctx;
	const char *uri;
	uint8_t *pattern;
	int o, rv;
	while ((o = getopt_long(argc, argv, "s:f:c:z:h", opts, NULL)) != -1) {
		switch (o) {
		case 'z': codec = optarg; break;
		case 's': cl.size = tw_ex_parse_size(optarg); break;
		case 'f': cl.frames = tw_ex_parse_size(optarg); break;
		case 'c': cl.count = tw_ex_parse_size(optarg); break;
		case 'h': usage(stdout); return 0;
		default: tw_ex_other_option(&tls, o, optarg, usage);
		}
	}
	uri = tw_ex_uri_arg(argc, argv, usage);
	if (cl.frames == 0 || cl.count == 0) {
		usage(stderr);
		return 2;
	}
	signal(SIGPIPE, SIG_IGN);
	if (tw_block_new(cl.size + cl.frames + 8, &cl.pattern) != 0) {
		fprintf(stderr, "tw-echo-client: out of memory\n");
		return 1;
	}
	pattern = tw_block_data(cl.pattern);
	for (uint64_t i = 0; i < cl.size + cl.frames + 8; i++)
		pattern[i] = (uint8_t)(i % 251);
	cl.base = event_base_new();
	if (cl.base == NULL || tw_context_new(cl.base, &ctx) != 0)
		return 1;
	cl.ctx = ctx;
	tw_ex_tls_setup(ctx, &tls);
	if (codec != NULL && (rv = tw_context_set_compression(ctx, codec)) != 0) {
		fprintf(stderr, "tw-echo-client: %s: %s\n", codec, tw_strerror(rv));
		return 2;
	}
	if ((rv = tw_comm_connect(ctx, uri, on_connect, &cl)) != 0) {
		/* the context's error says why, the address included */
		fprintf(stderr, "tw-echo-client: %s\n", tw_context_last_error(ctx));
		return 1;
	}
	event_base_dispatch(cl.base);
	if (!cl.failed)
		report(&cl);
	tw_context_free(ctx);
	event_base_free(cl.base);
	tw_block_free(cl.pattern);
	return cl.failed ? 1 : 0;
}
