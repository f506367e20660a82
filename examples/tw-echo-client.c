/* tw-echo-client: send messages to an echo peer and check every byte that
 * comes back.
 *
 *   tw-echo-client tcp://127.0.0.1:8786 [--size BYTES] [--frames N] [--count N]
 *
 * Each message has N frames of BYTES bytes (sent from one pattern buffer
 * without copying); messages go one at a time. Prints MB/s of payload
 * echoed and round trips per second. Exits 0 only if every byte matched. */
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
	uint64_t size, frames, count;
	uint8_t *pattern; /* size + frames + 8 bytes; frame j of message k starts at j + k % 8 */
	uint64_t sent, verified;
	int failed;
	double t0, t1;
};

static int send_next(tw_comm *comm, struct client *cl)
{
	size_t shift = (size_t)(cl->sent % 8);
	tw_msg *m;
	int rv = tw_msg_new(&m);
	for (uint64_t j = 0; rv == 0 && j < cl->frames; j++)
		rv = tw_msg_append_ref(m, cl->pattern + j + shift, cl->size, NULL, NULL);
	if (rv == 0)
		rv = tw_comm_write(comm, m);
	if (rv != 0) {
		tw_msg_free(m);
		fprintf(stderr, "tw-echo-client: write failed: %s\n", tw_strerror(rv));
		return rv;
	}
	cl->sent++;
	return 0;
}

static int check(const struct client *cl, const tw_msg *m, uint64_t k)
{
	size_t shift = (size_t)(k % 8);
	if (tw_msg_nframes(m) != cl->frames) {
		fprintf(stderr, "message %llu: %zu frames, expected %llu\n", (unsigned long long)k,
			tw_msg_nframes(m), (unsigned long long)cl->frames);
		return -1;
	}
	for (size_t j = 0; j < cl->frames; j++) {
		const tw_slice *f = tw_msg_frame(m, j);
		if (f->len != cl->size ||
		    (f->len > 0 && memcmp(tw_slice_data(f), cl->pattern + j + shift, f->len) != 0)) {
			fprintf(stderr, "message %llu frame %zu: bytes differ\n",
				(unsigned long long)k, j);
			return -1;
		}
	}
	return 0;
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
		fprintf(stderr, "tw-echo-client: comm ended after %llu of %llu echoes: %s %s\n",
			(unsigned long long)cl->verified, (unsigned long long)cl->count,
			tw_strerror(err), tw_comm_last_error(comm));
		cl->failed = 1;
	}
	tw_comm_free(comm);
	event_base_loopbreak(cl->base);
}

static void on_connect(tw_comm *comm, int err, void *arg)
{
	struct client *cl = arg;
	if (err != 0) {
		fprintf(stderr, "tw-echo-client: connect failed: %s\n", tw_strerror(err));
		cl->failed = 1;
		event_base_loopbreak(cl->base);
		return;
	}
	tw_comm_set_callbacks(comm, on_recv, on_close, NULL, cl);
	cl->t0 = tw_ex_now();
	if (send_next(comm, cl) != 0) {
		cl->failed = 1;
		tw_comm_close(comm);
	}
}

static void usage(FILE *f)
{
	fprintf(f, "usage: tw-echo-client URI [--size BYTES] [--frames N] [--count N]\n"
		   "  Send COUNT messages of FRAMES frames of BYTES bytes each (default\n"
		   "  1MiB x 1 x 10; sizes take K, M, G suffixes) to the echo server at URI,\n"
		   "  one at a time, check every echoed byte, and print the throughput.\n");
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
					     {"frames", required_argument, NULL, 'f'},
					     {"count", required_argument, NULL, 'c'},
					     {"help", no_argument, NULL, 'h'},
					     {NULL, 0, NULL, 0}};
	struct client cl = {.size = 1 << 20, .frames = 1, .count = 10};
	tw_context *ctx;
	int o, rv;
	while ((o = getopt_long(argc, argv, "s:f:c:h", opts, NULL)) != -1) {
		switch (o) {
		case 's': cl.size = tw_ex_parse_size(optarg); break;
		case 'f': cl.frames = tw_ex_parse_size(optarg); break;
		case 'c': cl.count = tw_ex_parse_size(optarg); break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
	}
	if (optind != argc - 1 || cl.frames == 0 || cl.count == 0) {
		usage(stderr);
		return 2;
	}
	signal(SIGPIPE, SIG_IGN);
	if ((cl.pattern = malloc(cl.size + cl.frames + 8)) == NULL) {
		fprintf(stderr, "tw-echo-client: out of memory\n");
		return 1;
	}
	for (uint64_t i = 0; i < cl.size + cl.frames + 8; i++)
		cl.pattern[i] = (uint8_t)(i % 251);
	cl.base = event_base_new();
	if (cl.base == NULL || tw_context_new(cl.base, &ctx) != 0)
		return 1;
	if ((rv = tw_connect(ctx, argv[optind], on_connect, &cl)) != 0) {
		fprintf(stderr, "tw-echo-client: cannot connect to %s: %s\n", argv[optind],
			tw_strerror(rv));
		return 1;
	}
	event_base_dispatch(cl.base);
	if (!cl.failed)
		report(&cl);
	tw_context_free(ctx);
	event_base_free(cl.base);
	free(cl.pattern);
	return cl.failed ? 1 : 0;
}
