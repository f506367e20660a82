/* SPDX-License-Identifier: BSD-3-Clause */
/* OpenSSL's allocations counted by source line: what an idle TLS comm
 * holds, and who allocated it (bench/idle-bench --openssl-sites). OpenSSL
 * passes file and line to the functions CRYPTO_set_mem_functions installs;
 * each allocation gets a header naming its site and size. Single-threaded
 * (idle-bench's processes are). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/crypto.h>

#include "bench/openssl-sites.h"

#define SITES 8192 /* a power of 2; OpenSSL has some thousands of sites */

struct site {
	const char *file;
	int line;
	long long live, n;   /* bytes and allocations live now */
	long long live0, n0; /* at the last report */
};

struct hdr {
	size_t size;
	uint32_t site;
	uint32_t pad; /* keeps the payload 16-byte aligned */
};

static struct site sites[SITES];
static int started;

/* The site's slot (open addressing on the file pointer and line; the
 * last slot takes everything once the table is full). */
static uint32_t site_of(const char *file, int line)
{
	uint32_t h = (uint32_t)(((uintptr_t)file >> 4) * 2654435761u) ^ (uint32_t)line * 40503u;
	for (uint32_t i = 0; i < SITES - 1; i++) {
		uint32_t k = (h + i) % (SITES - 1);
		if (sites[k].file == file && sites[k].line == line)
			return k;
		if (sites[k].file == NULL) {
			sites[k].file = file != NULL ? file : "?";
			sites[k].line = line;
			return k;
		}
	}
	return SITES - 1;
}

static void *take(struct hdr *h, size_t n, const char *file, int line)
{
	h->size = n;
	h->site = site_of(file, line);
	sites[h->site].live += (long long)n;
	sites[h->site].n++;
	return h + 1;
}

static void give(struct hdr *h)
{
	sites[h->site].live -= (long long)h->size;
	sites[h->site].n--;
}

static void *count_malloc(size_t n, const char *file, int line)
{
	struct hdr *h = malloc(sizeof(*h) + n);
	return h != NULL ? take(h, n, file, line) : NULL;
}

static void count_free(void *p, const char *file, int line)
{
	(void)file, (void)line;
	if (p == NULL)
		return;
	give((struct hdr *)p - 1);
	free((struct hdr *)p - 1);
}

static void *count_realloc(void *p, size_t n, const char *file, int line)
{
	struct hdr *h, *old;
	if (p == NULL)
		return count_malloc(n, file, line);
	if (n == 0) {
		count_free(p, file, line);
		return NULL;
	}
	old = (struct hdr *)p - 1;
	give(old);
	if ((h = realloc(old, sizeof(*h) + n)) == NULL) {
		sites[old->site].live += (long long)old->size; /* still there */
		sites[old->site].n++;
		return NULL;
	}
	return take(h, n, file, line);
}

int tw_bench_sites_start(void)
{
	if (CRYPTO_set_mem_functions(count_malloc, count_realloc, count_free) != 1)
		return -1;
	started = 1;
	return 0;
}

static int by_growth(const void *a, const void *b)
{
	const struct site *x = *(struct site *const *)a, *y = *(struct site *const *)b;
	long long dx = x->live - x->live0, dy = y->live - y->live0;
	return dx < dy ? 1 : dx > dy ? -1 : 0;
}

void tw_bench_sites_report(FILE *f, const char *who, size_t n, size_t top)
{
	static struct site *order[SITES];
	static int have_base;
	long long bytes = 0, allocs = 0;
	size_t k = 0;
	if (!started)
		return;
	for (size_t i = 0; i < SITES; i++) {
		if (sites[i].file == NULL)
			continue;
		bytes += sites[i].live - sites[i].live0;
		allocs += sites[i].n - sites[i].n0;
		order[k++] = &sites[i];
	}
	if (have_base && n > 0) {
		qsort(order, k, sizeof(*order), by_growth);
		fprintf(f, "%s: OpenSSL holds %.0f bytes in %.1f allocations per comm; by site:\n",
			who, (double)bytes / (double)n, (double)allocs / (double)n);
		for (size_t i = 0; i < k && i < top; i++) {
			struct site *s = order[i];
			if (s->live == s->live0)
				break;
			fprintf(f, "  %8.0f B %5.1f  %s:%d\n",
				(double)(s->live - s->live0) / (double)n,
				(double)(s->n - s->n0) / (double)n, s->file, s->line);
		}
	}
	for (size_t i = 0; i < SITES; i++) {
		sites[i].live0 = sites[i].live;
		sites[i].n0 = sites[i].n;
	}
	have_base = 1;
}
