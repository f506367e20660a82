/* SPDX-License-Identifier: BSD-3-Clause */
/* forward-floor: the CPU floor of a scheduler that forwards large
 * messages over loopback TCP (issue 16's 512 MiB round: 512 MiB in from
 * the client and out to the workers, then in from the workers and out to
 * the client, 1 GiB each way). A child writes MIB MiB to this process,
 * which reads each CHUNK into one buffer and writes it on to a second
 * child that discards it; the CPU seconds printed are this process's
 * alone (getrusage), the kernel's copies in and out being what any
 * forwarder pays.
 *
 *   forward-floor [--mib 1024] [--chunk-mib 32] [--fresh] [--populate] [--huge] [--splice]
 *                 [--cc NAME]
 *
 * Default: one buffer, touched once, reused (the floor). --fresh maps a
 * new buffer per chunk and unmaps it after sending (every page faulted
 * in and zeroed by the kernel, as a receiver without a block cache pays);
 * --populate maps it with MAP_POPULATE; --huge asks for transparent huge
 * pages (madvise MADV_HUGEPAGE) on each fresh buffer. Here (shared VM,
 * Dec 2026) --huge cost less than --fresh in this loop, but huge-page
 * blocks made tw-mini-scheduler's 512 MiB round dearer (1.7-2.0 s against
 * 1.05-1.4 s): zeroing 2 MiB pages goes to memory ahead of the receive's
 * copy, where a 4 KiB page is zeroed in cache just before it. --splice
 * moves the bytes socket -> pipe -> socket with splice(2) instead, never
 * through user space (the relay's floor, docs/design.md "Relay"). --cc
 * sets every socket's congestion control (TCP_CONGESTION, e.g. cubic:
 * no pacing timers; the system's default here is bbr, which paces with an
 * hrtimer per burst when the qdisc is not fq). Timing, not a test.
 */
#include <fcntl.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static void die(const char *what)
{
	perror(what);
	exit(1);
}

static void read_full(int fd, uint8_t *p, size_t n)
{
	while (n > 0) {
		ssize_t r = read(fd, p, n);
		if (r <= 0)
			die("read");
		p += r;
		n -= (size_t)r;
	}
}

static void write_full(int fd, const uint8_t *p, size_t n)
{
	while (n > 0) {
		ssize_t r = write(fd, p, n);
		if (r <= 0)
			die("write");
		p += r;
		n -= (size_t)r;
	}
}

static const char *cc; /* --cc NAME, or NULL: the system's default */

static void set_cc(int fd)
{
	if (cc != NULL &&
	    setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, cc, (socklen_t)strlen(cc)) != 0)
		die("setsockopt TCP_CONGESTION");
}

static int dial(const struct sockaddr_in *sa)
{
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	if (fd < 0)
		die("socket");
	set_cc(fd);
	if (connect(fd, (const struct sockaddr *)sa, sizeof(*sa)) != 0)
		die("connect");
	return fd;
}

/* Child: send total bytes (role 0) or read and drop them (role 1). */
static void child(const struct sockaddr_in *sa, int role, size_t total, size_t chunk)
{
	int fd = dial(sa);
	uint8_t *buf = malloc(chunk);
	uint8_t r = (uint8_t)role;
	if (buf == NULL)
		die("malloc");
	memset(buf, 0x5a, chunk);
	write_full(fd, &r, 1);
	for (size_t done = 0; done < total; done += chunk) {
		if (role == 0)
			write_full(fd, buf, chunk);
		else
			read_full(fd, buf, chunk);
	}
	close(fd);
	exit(0);
}

/* in -> pipe -> out with splice(2), total bytes. */
static void splice_all(int in, int out, size_t total)
{
	int p[2];
	if (pipe(p) != 0)
		die("pipe");
	fcntl(p[1], F_SETPIPE_SZ, 1 << 20);
	while (total > 0) {
		ssize_t r = splice(in, NULL, p[1], NULL, total, SPLICE_F_MOVE);
		if (r <= 0)
			die("splice in");
		total -= (size_t)r;
		while (r > 0) {
			ssize_t w = splice(p[0], NULL, out, NULL, (size_t)r, SPLICE_F_MOVE);
			if (w <= 0)
				die("splice out");
			r -= w;
		}
	}
	close(p[0]);
	close(p[1]);
}

static double secs(struct timeval tv)
{
	return (double)tv.tv_sec + (double)tv.tv_usec / 1e6;
}

static uint8_t *get_buf(size_t chunk, int flags, int huge)
{
	void *p = mmap(NULL, chunk, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | flags, -1,
		       0);
	if (p == MAP_FAILED)
		die("mmap");
	if (huge)
		madvise(p, chunk, MADV_HUGEPAGE);
	return p;
}

int main(int argc, char **argv)
{
	size_t mib = 1024, chunk = (size_t)32 << 20;
	int fresh = 0, populate = 0, huge = 0, use_splice = 0, lfd, in = -1, out = -1, one = 1;
	struct sockaddr_in sa;
	socklen_t sl = sizeof(sa);
	struct rusage r0, r1;
	struct timespec t0, t1;
	uint8_t *buf = NULL;
	const char *mode;
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--mib") == 0 && i + 1 < argc)
			mib = strtoull(argv[++i], NULL, 10);
		else if (strcmp(argv[i], "--chunk-mib") == 0 && i + 1 < argc)
			chunk = strtoull(argv[++i], NULL, 10) << 20;
		else if (strcmp(argv[i], "--fresh") == 0)
			fresh = 1;
		else if (strcmp(argv[i], "--populate") == 0)
			fresh = populate = 1;
		else if (strcmp(argv[i], "--huge") == 0)
			fresh = huge = 1;
		else if (strcmp(argv[i], "--splice") == 0)
			use_splice = 1;
		else if (strcmp(argv[i], "--cc") == 0 && i + 1 < argc)
			cc = argv[++i];
		else {
			fprintf(stderr,
				"usage: %s [--mib N] [--chunk-mib N] [--fresh] [--populate] "
				"[--huge] [--splice] [--cc NAME]\n",
				argv[0]);
			return 2;
		}
	}
	memset(&sa, 0, sizeof(sa));
	sa.sin_family = AF_INET;
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if ((lfd = socket(AF_INET, SOCK_STREAM, 0)) < 0)
		die("socket");
	set_cc(lfd); /* accepted sockets inherit it */
	if (setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0 ||
	    bind(lfd, (struct sockaddr *)&sa, sizeof(sa)) != 0 || listen(lfd, 4) != 0 ||
	    getsockname(lfd, (struct sockaddr *)&sa, &sl) != 0)
		die("listen");
	for (int role = 0; role < 2; role++)
		if (fork() == 0)
			child(&sa, role, mib << 20, chunk);
	for (int k = 0; k < 2; k++) {
		int fd = accept(lfd, NULL, NULL);
		uint8_t role;
		if (fd < 0)
			die("accept");
		read_full(fd, &role, 1);
		*(role == 0 ? &in : &out) = fd;
	}
	if (!fresh && !use_splice) {
		buf = get_buf(chunk, 0, 0);
		memset(buf, 0, chunk); /* touched once, outside the measurement */
	}
	mode = use_splice ? "spliced (no)"
	       : huge     ? "fresh huge-page"
	       : populate ? "populated"
	       : fresh    ? "fresh"
			  : "reused";
	getrusage(RUSAGE_SELF, &r0);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	if (use_splice)
		splice_all(in, out, mib << 20);
	for (size_t done = 0; !use_splice && done < mib << 20; done += chunk) {
		if (fresh)
			buf = get_buf(chunk, populate ? MAP_POPULATE : 0, huge);
		read_full(in, buf, chunk);
		write_full(out, buf, chunk);
		if (fresh)
			munmap(buf, chunk);
	}
	shutdown(out, SHUT_WR);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	getrusage(RUSAGE_SELF, &r1);
	while (wait(NULL) > 0)
		;
	printf("forward-floor: %zu MiB in and out, chunks of %zu MiB, %s buffer: wall %.3f s, "
	       "user %.3f s, sys %.3f s, minor faults %ld%s%s\n",
	       mib, chunk >> 20, mode,
	       (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9,
	       secs(r1.ru_utime) - secs(r0.ru_utime), secs(r1.ru_stime) - secs(r0.ru_stime),
	       r1.ru_minflt - r0.ru_minflt, cc != NULL ? ", congestion control " : "",
	       cc != NULL ? cc : "");
	return 0;
}
