/* SPDX-License-Identifier: BSD-3-Clause */
/* A string-keyed hash table with chaining (FNV-1a), doubling when full:
 * the scheduler's keys (100,000 scattered values) and nothing fancier. */
#include <stdlib.h>
#include <string.h>

#include "examples/mini-scheduler/sched.h"

struct tentry {
	struct tentry *next;
	uint64_t hash;
	void *val;
	size_t len;
	char name[];
};

static uint64_t fnv1a(const char *s, size_t n)
{
	uint64_t h = 1469598103934665603ULL;
	for (size_t i = 0; i < n; i++)
		h = (h ^ (unsigned char)s[i]) * 1099511628211ULL;
	return h;
}

static struct tentry **slot(const struct table *t, const char *name, size_t len, uint64_t h)
{
	struct tentry **p = &t->buckets[h & (t->nbuckets - 1)];
	while (*p != NULL && ((*p)->hash != h || (*p)->len != len || memcmp((*p)->name, name, len)))
		p = &(*p)->next;
	return p;
}

void *table_get(const struct table *t, const char *name, size_t len)
{
	struct tentry *e;
	if (t->nbuckets == 0)
		return NULL;
	e = *slot(t, name, len, fnv1a(name, len));
	return e ? e->val : NULL;
}

static int grow(struct table *t)
{
	size_t n = t->nbuckets ? 2 * t->nbuckets : 64;
	struct tentry **b = calloc(n, sizeof(*b));
	if (b == NULL)
		return -1;
	for (size_t i = 0; i < t->nbuckets; i++)
		for (struct tentry *e = t->buckets[i], *next; e != NULL; e = next) {
			next = e->next;
			e->next = b[e->hash & (n - 1)];
			b[e->hash & (n - 1)] = e;
		}
	free(t->buckets);
	t->buckets = b;
	t->nbuckets = n;
	return 0;
}

int table_put(struct table *t, const char *name, size_t len, void *val)
{
	uint64_t h = fnv1a(name, len);
	struct tentry **p, *e;
	if (t->n >= t->nbuckets && grow(t) != 0)
		return -1;
	p = slot(t, name, len, h);
	if (*p != NULL) {
		(*p)->val = val;
		return 0;
	}
	e = malloc(sizeof(*e) + len + 1);
	if (e == NULL)
		return -1;
	e->next = NULL;
	e->hash = h;
	e->val = val;
	e->len = len;
	memcpy(e->name, name, len);
	e->name[len] = '\0';
	*p = e;
	t->n++;
	return 0;
}

void *table_del(struct table *t, const char *name, size_t len)
{
	struct tentry **p, *e;
	void *val;
	if (t->nbuckets == 0)
		return NULL;
	p = slot(t, name, len, fnv1a(name, len));
	if ((e = *p) == NULL)
		return NULL;
	*p = e->next;
	val = e->val;
	free(e);
	t->n--;
	return val;
}

void table_filter(struct table *t, int (*fn)(void *val, void *arg), void *arg)
{
	for (size_t i = 0; i < t->nbuckets; i++) {
		struct tentry **p = &t->buckets[i];
		while (*p != NULL) {
			struct tentry *e = *p;
			if (fn(e->val, arg)) {
				*p = e->next;
				free(e);
				t->n--;
			} else {
				p = &e->next;
			}
		}
	}
}

void table_fini(struct table *t)
{
	for (size_t i = 0; i < t->nbuckets; i++)
		for (struct tentry *e = t->buckets[i], *next; e != NULL; e = next) {
			next = e->next;
			free(e);
		}
	free(t->buckets);
	t->buckets = NULL;
	t->nbuckets = t->n = 0;
}
