/* SPDX-License-Identifier: BSD-3-Clause */
/* A string-keyed hash table: the scheduler's keys (100,000 scattered
 * values) and nothing fancier. Open addressing with linear probing over
 * slots that hold each entry's hash, at most half full: a lookup reads one
 * slot (a cache line holds four) and then the one entry whose hash
 * matches. Chaining read a bucket, then entries until the name matched:
 * some three cache misses per lookup, 8% of the scheduler's CPU in the
 * 100,000-key round (issue 16). */
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "examples/mini-scheduler/sched.h"

struct tentry {
	void *val;
	size_t len;
	char name[];
};

struct tslot {
	uint64_t hash; /* of e's name; any value when e is NULL */
	struct tentry *e;
};

/* A per-process random start for the hash: keys come from peers, and
 * with a known start, 16-byte keys of one full hash are a computation
 * away (the second word undoes the first's state), making every insert
 * walk one probe run: 15,000 such keys in one update_data held the loop
 * 19 s (breaker, session 12). Not a keyed cryptographic hash (SipHash,
 * Python's): it raises the bar, no more. */
static uint64_t seed(void)
{
	static uint64_t v;
	static int done;
	if (!done) {
		if (getrandom(&v, sizeof(v), 0) != (ssize_t)sizeof(v))
			v = (uint64_t)(uintptr_t)&v ^ (uint64_t)time(NULL);
		done = 1;
	}
	return v;
}

/* Eight bytes per step (multiply, rotate; a final mix), not one: names
 * are Dask keys of 30-60 bytes, and byte-wise FNV-1a is a chain of
 * dependent multiplies as long as the name. */
static uint64_t hash_of(const char *s, size_t n)
{
	const uint64_t k = 0x9e3779b97f4a7c15ULL;
	uint64_t h = (n * k) ^ seed(), w;
	for (; n >= 8; s += 8, n -= 8) {
		memcpy(&w, s, 8);
		h = (h ^ w) * k;
		h ^= h >> 32;
	}
	w = 0;
	memcpy(&w, s, n);
	h = (h ^ w) * k;
	h ^= h >> 29;
	h *= 0xbf58476d1ce4e5b9ULL;
	return h ^ (h >> 32);
}

/* The slot of name, or the empty slot where it would go. */
static struct tslot *find(const struct table *t, const char *name, size_t len, uint64_t h)
{
	size_t mask = t->nslots - 1;
	for (size_t i = h & mask;; i = (i + 1) & mask) {
		struct tslot *s = &t->slots[i];
		if (s->e == NULL ||
		    (s->hash == h && s->e->len == len && memcmp(s->e->name, name, len) == 0))
			return s;
	}
}

void *table_get(const struct table *t, const char *name, size_t len)
{
	struct tslot *s;
	if (t->n == 0)
		return NULL;
	s = find(t, name, len, hash_of(name, len));
	return s->e != NULL ? s->e->val : NULL;
}

/* Move every entry into a new array of n slots. */
static int rehash(struct table *t, size_t n)
{
	struct tslot *old = t->slots, *slots = calloc(n, sizeof(*slots));
	size_t nold = t->nslots;
	if (slots == NULL)
		return -1;
	t->slots = slots;
	t->nslots = n;
	for (size_t i = 0; i < nold; i++)
		if (old[i].e != NULL)
			*find(t, old[i].e->name, old[i].e->len, old[i].hash) = old[i];
	free(old);
	return 0;
}

int table_put(struct table *t, const char *name, size_t len, void *val)
{
	uint64_t h = hash_of(name, len);
	struct tslot *s;
	struct tentry *e;
	if (2 * (t->n + 1) > t->nslots && rehash(t, t->nslots ? 2 * t->nslots : 64) != 0)
		return -1;
	s = find(t, name, len, h);
	if (s->e != NULL) {
		s->e->val = val;
		return 0;
	}
	if ((e = malloc(sizeof(*e) + len + 1)) == NULL)
		return -1;
	e->val = val;
	e->len = len;
	memcpy(e->name, name, len);
	e->name[len] = '\0';
	s->hash = h;
	s->e = e;
	t->n++;
	return 0;
}

/* Empty slot i and move back the entries after it that probed past it
 * (deletion without tombstones, Knuth's Algorithm R). */
static void remove_at(struct table *t, size_t i)
{
	size_t mask = t->nslots - 1;
	t->slots[i].e = NULL;
	for (size_t j = (i + 1) & mask; t->slots[j].e != NULL; j = (j + 1) & mask) {
		size_t home = t->slots[j].hash & mask;
		/* j's entry may move to i when i lies between its home and j */
		if (((j - home) & mask) >= ((j - i) & mask)) {
			t->slots[i] = t->slots[j];
			t->slots[j].e = NULL;
			i = j;
		}
	}
	t->n--;
}

void *table_del(struct table *t, const char *name, size_t len)
{
	struct tslot *s;
	void *val;
	if (t->n == 0)
		return NULL;
	s = find(t, name, len, hash_of(name, len));
	if (s->e == NULL)
		return NULL;
	val = s->e->val;
	free(s->e);
	remove_at(t, (size_t)(s - t->slots));
	return val;
}

/* From an empty slot on, so no probe run wraps past the start: a removal
 * moves later entries of its run back into the slot just visited (look at
 * it again), never into one visited before. */
void table_filter(struct table *t, int (*fn)(void *val, void *arg), void *arg)
{
	size_t mask = t->nslots - 1, start = 0, step = 1;
	if (t->n == 0)
		return;
	while (t->slots[start].e != NULL)
		start++;
	while (step < t->nslots) {
		size_t i = (start + step) & mask;
		struct tentry *e = t->slots[i].e;
		if (e != NULL && fn(e->val, arg)) {
			free(e);
			remove_at(t, i);
		} else {
			step++;
		}
	}
}

void table_fini(struct table *t)
{
	for (size_t i = 0; i < t->nslots; i++)
		free(t->slots[i].e);
	free(t->slots);
	t->slots = NULL;
	t->nslots = t->n = 0;
}
