/* SPDX-License-Identifier: BSD-3-Clause */
/* raw-echo: the baseline for tw-echo-client/-server: plain blocking
 * sockets, the same stream framing (u64 total, u64 N, lengths, frames),
 * one reused buffer per side, the same byte check on the client.
 *
 *   raw-echo --serve PORT                  (binds 127.0.0.1)
 *   raw-echo --connect PORT --size BYTES --count N
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "examples/common.h"

static int read_full(int fd, void *p, size_t n)
{
	while (n > 0) {
		ssize_t r = read(fd, p, n);
		if (r <= 0)
			return -1;
		p = (char *)p + r;
		n -= (size_t)r;
	}
	return 0;
}

static int write_full(int fd, const void *p, size_t n)
{
	while (n > 0) {
		ssize_t r = write(fd, p, n);
		if (r <= 0)
			return -1;
		p = (const char *)p + r;
		n -= (size_t)r;
	}
	return 0;
}

/* Echo whole messages back: read total, read the rest into a reused
 * buffer, write both back. One connection at a time. */
static int serve(int port)
{
	int lfd = tw_ex_listen_loopback(port, "raw-echo");
	if (lfd < 0)
		return 1;
	for (;;) {
		int fd = accept(lfd, NULL, NULL);
		uint8_t *buf = NULL;
		size_t cap = 0;
		uint64_t total;
		tw_ex_nodelay(fd);
		while (read_full(fd, &total, 8) == 0) {
			if (total > cap && (buf = realloc(buf, cap = total)) == NULL)
				return 1;
			if (read_full(fd, buf, total) != 0 || write_full(fd, &total, 8) != 0 ||
			    write_full(fd, buf, total) != 0)
				break;
		}
		free(buf);
		close(fd);
	}
}

static int client(int port, uint64_t size, uint64_t count)
{
	int fd = tw_ex_dial_loopback(port, "raw-echo");
	uint64_t prelude[3] = {16 + size, 1, size};
	uint8_t *out = malloc(size + 1), *in = malloc(size + 1);
	uint64_t back[3];
	double t0, secs;
	if (fd < 0)
		return 1;
	for (uint64_t i = 0; i < size; i++)
		out[i] = (uint8_t)(i % 251);
	t0 = tw_ex_now();
	for (uint64_t k = 0; k < count; k++) {
		struct iovec iov[2] = {{prelude, 24}, {out, size}};
		ssize_t w = writev(fd, iov, 2);
		if (w < 0 || ((size_t)w < 24 + size &&
			      write_full(fd, out + (w - 24), size - (size_t)(w - 24)) != 0))
			return 1;
		if (read_full(fd, back, 24) != 0 || read_full(fd, in, size) != 0 ||
		    memcmp(in, out, size) != 0) {
			fprintf(stderr, "raw-echo: echo %llu differs\n", (unsigned long long)k);
			return 1;
		}
	}
	secs = tw_ex_now() - t0;
	printf("raw: %.3f s, %.1f MB/s payload each way, %.0f round trips/s\n", secs,
	       (double)size * (double)count / secs / 1e6, (double)count / secs);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc == 3 && strcmp(argv[1], "--serve") == 0)
		return serve(atoi(argv[2]));
	if (argc == 7 && strcmp(argv[1], "--connect") == 0)
		return client(atoi(argv[2]), tw_ex_parse_size(argv[4]), tw_ex_parse_size(argv[6]));
	fprintf(stderr, "usage: raw-echo --serve PORT | --connect PORT --size BYTES --count N\n");
	return 2;
}
