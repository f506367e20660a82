/* SPDX-License-Identifier: BSD-3-Clause */
#include "core/memlimit.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

/* The limit in the file dir/name, or 0 when there is none (no file,
 * "max", or not a number). */
static uint64_t file_limit(const char *dir, const char *name)
{
	char path[4096];
	uint64_t v = 0;
	FILE *f;
	if (snprintf(path, sizeof(path), "%s/%s", dir, name) >= (int)sizeof(path))
		return 0;
	if ((f = fopen(path, "re")) == NULL)
		return 0;
	if (fscanf(f, "%" SCNu64, &v) != 1)
		v = 0;
	fclose(f);
	return v;
}

static uint64_t least(uint64_t a, uint64_t b)
{
	return b > 0 && b < a ? b : a;
}

/* The least limit in one cgroup's directories: v1's under dir/memory
 * (with sub, the cgroup's path, when given), v2's under dir. */
static uint64_t cgroup_limit(uint64_t limit, const char *root, const char *v1, const char *v2)
{
	char dir[4096];
	if (v1 != NULL && snprintf(dir, sizeof(dir), "%s/memory%s", root, v1) < (int)sizeof(dir)) {
		limit = least(limit, file_limit(dir, "memory.limit_in_bytes"));
		limit = least(limit, file_limit(dir, "memory.soft_limit_in_bytes"));
	}
	if (v2 != NULL && snprintf(dir, sizeof(dir), "%s%s", root, v2) < (int)sizeof(dir)) {
		limit = least(limit, file_limit(dir, "memory.max"));
		limit = least(limit, file_limit(dir, "memory.high"));
	}
	return limit;
}

/* The process's own cgroups, as /proc/self/cgroup names them: lines
 * "ID:memory:/path" (v1) and "0::/path" (v2). */
static uint64_t own_cgroup_limit(uint64_t limit, const char *root, const char *cgroups)
{
	char line[4096];
	FILE *f = fopen(cgroups, "re");
	if (f == NULL)
		return limit;
	while (fgets(line, sizeof(line), f) != NULL) {
		char *ctl = strchr(line, ':'), *path;
		if (ctl == NULL || (path = strchr(++ctl, ':')) == NULL)
			continue;
		*path++ = '\0';
		path[strcspn(path, "\n")] = '\0';
		if (strcmp(path, "/") == 0) /* the root: read already */
			continue;
		if (strcmp(ctl, "memory") == 0)
			limit = cgroup_limit(limit, root, path, NULL);
		else if (*ctl == '\0')
			limit = cgroup_limit(limit, root, NULL, path);
	}
	fclose(f);
	return limit;
}

uint64_t tw__memory_limit(const char *root, const char *cgroups)
{
	long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGESIZE);
	uint64_t limit = pages > 0 && size > 0 ? (uint64_t)pages * (uint64_t)size : UINT64_MAX;
	struct rlimit rss;
	limit = cgroup_limit(limit, root, "", "");
	limit = own_cgroup_limit(limit, root, cgroups);
	if (getrlimit(RLIMIT_RSS, &rss) == 0 && rss.rlim_max != RLIM_INFINITY)
		limit = least(limit, (uint64_t)rss.rlim_max);
	return limit;
}
