/* SPDX-License-Identifier: BSD-3-Clause */
/* offload-bench: does decoding large messages stall the server's loop?
 *
 *   offload-bench RPC_SERVER_BINARY [MIB] [COUNT]
 *
 * Runs tw-rpc-server twice, with offload on (default threshold) and off
 * (TW_OFFLOAD_THRESHOLD=off). Each time, comm A does small echo round
 * trips continuously while comm B sends COUNT messages of MIB MiB
 * zstd-compressed payload (op nbytes) to the same server loop. Prints
 * p50/p99/max round trip on comm A and B's decode throughput, and the
 * ratio of A's p99 off/on. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <event2/event.h>

#include <taskwire/taskwire.h>

#include "examples/common.h"

struct run {
	struct event_base *base;
	tw_context *ctx;
	tw_comm *a, *b;
	tw_msg *big;
	uint64_t mib, count, b_done;
	double *rtt;
	size_t nrtt, cap;
	double t_send, b_start, b_end;
	int failed, ready;
};

/* A payload zstd shrinks to about half: 4 random bits a byte. */
static tw_msg *big_message(uint64_t mib)
{
	size_t n = (size_t)mib << 20;
	tw_block *blk;
	uint32_t x = 12345;
	if (tw_block_new(n, &blk) != 0)
		return NULL;
	for (size_t i = 0; i < n; i++) {
		x = x * 1103515245u + 12345u;
		tw_block_data(blk)[i] = (uint8_t)((x >> 16) & 0x0f);
	}
	return tw_ex_data_msg("nbytes", "zstd", blk, n);
}

static void send_a(struct run *r)
{
	tw_msg *m = tw_ex_small_echo();
	r->t_send = tw_ex_now();
	if (m == NULL || tw_comm_write(r->a, m) != 0) {
		tw_msg_free(m);
		r->failed = 1;
		event_base_loopbreak(r->base);
	}
}

static void send_b(struct run *r)
{
	if (tw_comm_write(r->b, tw_msg_hold(r->big)) != 0) {
		tw_msg_free(r->big);
		r->failed = 1;
		event_base_loopbreak(r->base);
	}
}

static void on_recv_a(tw_comm *comm, tw_msg *m, void *arg)
{
	struct run *r = arg;
	(void)comm;
	(void)m;
	if (r->b_start > 0 && r->b_end == 0) {
		if (r->nrtt == r->cap) {
			r->cap = r->cap ? 2 * r->cap : 4096;
			r->rtt = realloc(r->rtt, r->cap * sizeof(*r->rtt));
		}
		r->rtt[r->nrtt++] = (tw_ex_now() - r->t_send) * 1e3;
	}
	if (r->b_end == 0)
		send_a(r);
	else
		event_base_loopbreak(r->base);
}

static void on_recv_b(tw_comm *comm, tw_msg *m, void *arg)
{
	struct run *r = arg;
	(void)comm;
	(void)m;
	fprintf(stderr, "\r  B: %llu/%llu messages decoded by the server",
		(unsigned long long)++r->b_done, (unsigned long long)r->count);
	if (r->b_done < r->count) {
		send_b(r);
	} else {
		r->b_end = tw_ex_now();
		fprintf(stderr, "\n");
	}
}

static void on_close(tw_comm *comm, int err, void *arg)
{
	struct run *r = arg;
	(void)comm;
	if (err != 0 || r->b_end == 0) {
		fprintf(stderr, "offload-bench: comm ended: %s\n", tw_strerror(err));
		r->failed = 1;
		event_base_loopbreak(r->base);
	}
}

static void on_handshake(tw_comm *comm, int err, const tw_handshake_info *info, void *arg)
{
	struct run *r = arg;
	int is_a = r->a == NULL;
	(void)info;
	if (err != 0) {
		r->failed = 1;
		event_base_loopbreak(r->base);
		return;
	}
	if (is_a)
		r->a = comm;
	else
		r->b = comm;
	tw_comm_set_callbacks(comm, is_a ? on_recv_a : on_recv_b, on_close, NULL, r);
	if (++r->ready == 2) {
		send_a(r);
		r->b_start = tw_ex_now();
		send_b(r);
	}
}

static void on_connect(tw_comm *comm, int err, void *arg)
{
	struct run *r = arg;
	if (err != 0 || tw_comm_handshake(comm, TW_HANDSHAKE_CONNECTOR, on_handshake, r) != 0) {
		r->failed = 1;
		event_base_loopbreak(r->base);
	}
}

static int cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static pid_t start_server(const char *bin, const char *offload, char *addr, size_t len)
{
	int fds[2];
	pid_t pid;
	FILE *f;
	char line[256];
	if (pipe(fds) != 0)
		return -1;
	if ((pid = fork()) == 0) {
		dup2(fds[1], 1);
		close(fds[0]);
		if (offload != NULL)
			setenv("TW_OFFLOAD_THRESHOLD", offload, 1);
		execl(bin, bin, "tcp://127.0.0.1:0", (char *)NULL);
		_exit(127);
	}
	close(fds[1]);
	f = fdopen(fds[0], "r");
	if (f == NULL || fgets(line, sizeof(line), f) == NULL ||
	    sscanf(line, "listening on %127s", addr) != 1) {
		kill(pid, SIGTERM);
		return -1;
	}
	(void)len;
	fclose(f);
	return pid;
}

static int one_run(const char *bin, const char *label, const char *offload, tw_msg *big,
		   uint64_t mib, uint64_t count, double *p99_out)
{
	struct run r = {.mib = mib, .count = count, .big = big};
	char addr[128];
	pid_t pid = start_server(bin, offload, addr, sizeof(addr));
	double secs;
	if (pid < 0)
		return -1;
	r.base = event_base_new();
	tw_context_new(r.base, &r.ctx);
	fprintf(stderr, "offload %s: server %s\n", label, addr);
	tw_comm_connect(r.ctx, addr, on_connect, &r);
	tw_comm_connect(r.ctx, addr, on_connect, &r);
	event_base_dispatch(r.base);
	kill(pid, SIGTERM);
	waitpid(pid, NULL, 0);
	if (r.failed || r.nrtt == 0) {
		fprintf(stderr, "offload-bench: run failed\n");
		return -1;
	}
	qsort(r.rtt, r.nrtt, sizeof(double), cmp);
	secs = r.b_end - r.b_start;
	*p99_out = r.rtt[r.nrtt * 99 / 100];
	printf("offload %-4s | A: %6zu round trips, p50 %7.3f ms, p99 %7.3f ms, max %8.3f ms | "
	       "B: %.0f MB/s decoded (%llu x %llu MiB zstd)\n",
	       label, r.nrtt, r.rtt[r.nrtt / 2], r.rtt[r.nrtt * 99 / 100], r.rtt[r.nrtt - 1],
	       (double)count * (double)(mib << 20) / secs / 1e6, (unsigned long long)count,
	       (unsigned long long)mib);
	fflush(stdout);
	tw_comm_free(r.a);
	tw_comm_free(r.b);
	tw_context_free(r.ctx);
	event_base_free(r.base);
	free(r.rtt);
	return 0;
}

int main(int argc, char **argv)
{
	uint64_t mib = argc > 2 ? strtoull(argv[2], NULL, 10) : 256;
	uint64_t count = argc > 3 ? strtoull(argv[3], NULL, 10) : 8;
	double on, off;
	tw_msg *big;
	if (argc < 2) {
		fprintf(stderr, "usage: offload-bench RPC_SERVER_BINARY [MIB] [COUNT]\n");
		return 2;
	}
	signal(SIGPIPE, SIG_IGN);
	fprintf(stderr, "compressing a %llu MiB payload with zstd...\n", (unsigned long long)mib);
	if ((big = big_message(mib)) == NULL)
		return 1;
	if (one_run(argv[1], "on", NULL, big, mib, count, &on) != 0 ||
	    one_run(argv[1], "off", "off", big, mib, count, &off) != 0)
		return 1;
	printf("p99 of comm A: %.1fx lower with offload on\n", off / on);
	tw_msg_free(big);
	return 0;
}
