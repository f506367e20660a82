/* SPDX-License-Identifier: BSD-3-Clause */
/* The memory this process may use, found as Dask finds it
 * (distributed/system.py, memory_limit(): the least of the machine's
 * memory, the cgroup limits and the RLIMIT_RSS hard limit), so that the
 * budgets' defaults (a quarter of it) fit a container's limit rather
 * than the host's memory. */
#ifndef TW_CORE_MEMLIMIT_H
#define TW_CORE_MEMLIMIT_H

#include <stdint.h>

/* Bytes: the least of the physical memory (sysconf), every positive
 * limit in the cgroup files Dask reads under root (v1
 * memory/memory.limit_in_bytes and memory.soft_limit_in_bytes, v2
 * memory.max and memory.high: the cgroup seen at the root of a
 * container's namespace), the same files of the process's own cgroup as
 * `cgroups` (the format of /proc/self/cgroup) names it (a service in a
 * cgroup of its own, without a cgroup namespace), and the RLIMIT_RSS
 * hard limit. A file missing, unreadable or saying "max" counts for
 * nothing. root and cgroups are "/sys/fs/cgroup" and "/proc/self/cgroup"
 * except in tests. Any thread. */
uint64_t tw__memory_limit(const char *root, const char *cgroups);

#endif
