/* SPDX-License-Identifier: BSD-3-Clause */
/* Reading the process's own sizes from /proc/self/status. Header-only. */
#ifndef TW_TESTS_PROC_STATUS_H
#define TW_TESTS_PROC_STATUS_H

#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

/* A size line of /proc/self/status, in bytes: "VmRSS" (resident),
 * "VmData" (writable private mappings: what RLIMIT_DATA and strict
 * overcommit charge). */
static inline uint64_t status_bytes(const char *field)
{
	FILE *f = fopen("/proc/self/status", "r");
	char line[256];
	unsigned long long kb = 0;
	size_t n = strlen(field);
	ck_assert_ptr_nonnull(f);
	while (fgets(line, sizeof(line), f) != NULL)
		if (strncmp(line, field, n) == 0 && line[n] == ':' &&
		    sscanf(line + n + 1, "%llu kB", &kb) == 1)
			break;
	fclose(f);
	return (uint64_t)kb * 1024;
}

/* How many bytes of [p, p + len) are mapped writable, from
 * /proc/self/maps: what a block has committed, exactly, and unlike
 * VmData unaffected by other memory of the process (or of valgrind). */
static inline size_t writable_bytes(const void *p, size_t len)
{
	FILE *f = fopen("/proc/self/maps", "r");
	uintptr_t lo = (uintptr_t)p, hi = lo + len, a, b;
	char perms[8], line[512];
	size_t n = 0;
	ck_assert_ptr_nonnull(f);
	while (fgets(line, sizeof(line), f) != NULL) {
		if (sscanf(line, "%lx-%lx %7s", &a, &b, perms) != 3 || perms[1] != 'w')
			continue;
		if (a < lo)
			a = lo;
		if (b > hi)
			b = hi;
		if (a < b)
			n += b - a;
	}
	fclose(f);
	return n;
}

/* Run a test body in a child process (RLIMIT_DATA is process-wide)
 * under RLIMIT_DATA = VmData + extra_bytes, VmData read in the child
 * before prepare(arg) runs (prepare may be NULL). The child exits 10 if
 * setrlimit fails; if a mapping of probe_bytes (more than the limit
 * leaves) still succeeds, the limit is not enforced here (valgrind keeps
 * its own): the child calls skip(arg) (may be NULL; valgrind's leak check
 * runs in the child too) and exits 0; else it exits with body(arg). mmap,
 * not malloc, probes the limit: ASan's malloc aborts where glibc's
 * returns NULL. Returns the child's wait status (waitpid asserted). */
static inline int rlimit_data_child(uint64_t extra_bytes, size_t probe_bytes,
				    void (*prepare)(void *), int (*body)(void *),
				    void (*skip)(void *), void *arg)
{
	pid_t pid = fork();
	int status;
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		uint64_t d0 = status_bytes("VmData");
		struct rlimit rl = {d0 + extra_bytes, d0 + extra_bytes};
		void *p;
		if (prepare != NULL)
			prepare(arg);
		if (setrlimit(RLIMIT_DATA, &rl) != 0)
			_exit(10);
		p = mmap(NULL, probe_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1,
			 0);
		if (p != MAP_FAILED) {
			munmap(p, probe_bytes);
			if (skip != NULL)
				skip(arg);
			_exit(0);
		}
		_exit(body(arg));
	}
	ck_assert_int_eq(waitpid(pid, &status, 0), pid);
	return status;
}

#endif
