/* Small helpers shared by the example programs. */
#ifndef TW_EXAMPLES_COMMON_H
#define TW_EXAMPLES_COMMON_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* "64MiB", "1GiB", "3000", "10KiB" -> bytes; exits on garbage. */
static inline uint64_t tw_ex_parse_size(const char *s)
{
	char *end;
	unsigned long long v = strtoull(s, &end, 10);
	if (end == s)
		goto bad;
	if (*end == 'K' || *end == 'k')
		v <<= 10, end++;
	else if (*end == 'M')
		v <<= 20, end++;
	else if (*end == 'G')
		v <<= 30, end++;
	if (strcmp(end, "iB") == 0 || strcmp(end, "B") == 0 || *end == '\0')
		return v;
bad:
	fprintf(stderr, "bad size: %s\n", s);
	exit(2);
}

/* A field of /proc/self/status in bytes (VmRSS, VmHWM). */
static inline uint64_t tw_ex_status_bytes(const char *field)
{
	char line[256];
	unsigned long long kb = 0;
	size_t n = strlen(field);
	FILE *f = fopen("/proc/self/status", "r");
	if (f == NULL)
		return 0;
	while (fgets(line, sizeof(line), f) != NULL)
		if (strncmp(line, field, n) == 0 && line[n] == ':')
			kb = strtoull(line + n + 1, NULL, 10);
	fclose(f);
	return (uint64_t)kb << 10;
}

static inline uint64_t tw_ex_rss(void)
{
	return tw_ex_status_bytes("VmRSS");
}

static inline uint64_t tw_ex_peak_rss(void)
{
	return tw_ex_status_bytes("VmHWM");
}

static inline double tw_ex_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

#endif
