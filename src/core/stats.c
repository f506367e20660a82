/* SPDX-License-Identifier: BSD-3-Clause */
/* Process-wide counters and snapshots (include/taskwire/stats.h).
 *
 * Each thread that counts has a shard of its own, and a snapshot sums
 * them: with several loop threads (tw_context_set_loop_threads) one set
 * of counters that every core adds to per message moves its cache lines
 * between the cores at each add. A thread's shard is folded into
 * `retired` when the thread exits, so the sums never go back. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core/stats.h"

struct shard {
	struct tw__stats st; /* first: a shard is its counters */
	struct shard *next;
} __attribute__((aligned(64)));

_Thread_local struct tw__stats *tw__stats_mine __attribute__((tls_model("initial-exec")));

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER; /* guards shards, retired's folds */
static struct shard *shards;
static struct tw__stats retired; /* the threads that exited */
/* Counts when a thread's shard cannot be made (no memory): shared. */
static struct tw__stats fallback;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static pthread_key_t key;
static int key_ok;

#define FIELDS(X)                                                                                  \
	X(msgs_sent)                                                                               \
	X(msgs_received)                                                                           \
	X(bytes_sent)                                                                              \
	X(bytes_received)                                                                          \
	X(payload_bytes_copied)                                                                    \
	X(blocks_allocated)                                                                        \
	X(block_bytes_allocated)                                                                   \
	X(blocks_live)                                                                             \
	X(block_bytes_live)                                                                        \
	X(block_cache_hits)                                                                        \
	X(merges_zero_copy)                                                                        \
	X(merges_copied)                                                                           \
	X(write_bytes_gathered)

/* A thread ends: its counts go to `retired`, its shard away. Counting
 * after this (a later destructor freeing a block) makes a new shard. */
static void retire(void *arg)
{
	struct shard *s = arg, **p;
	pthread_mutex_lock(&lock);
	for (p = &shards; *p != NULL && *p != s; p = &(*p)->next)
		;
	if (*p == s)
		*p = s->next;
#define FOLD(f) TW__ADD(&retired, f, atomic_load_explicit(&s->st.f, memory_order_relaxed));
	FIELDS(FOLD)
#undef FOLD
	pthread_mutex_unlock(&lock);
	tw__stats_mine = NULL;
	free(s);
}

static void make_key(void)
{
	key_ok = pthread_key_create(&key, retire) == 0;
}

struct tw__stats *tw__stats_first(void)
{
	struct shard *s;
	pthread_once(&once, make_key);
	if (!key_ok || (s = calloc(1, sizeof(*s))) == NULL)
		return &fallback;
	if (pthread_setspecific(key, s) != 0) {
		free(s);
		return &fallback;
	}
	pthread_mutex_lock(&lock);
	s->next = shards;
	shards = s;
	pthread_mutex_unlock(&lock);
	tw__stats_mine = &s->st;
	return &s->st;
}

#define LOAD(f) all.f = atomic_load_explicit(&st->f, memory_order_relaxed);

static void copy_out(const tw_stats *all, tw_stats *out, size_t size)
{
	size_t n = size < sizeof(*all) ? size : sizeof(*all);
	if (out == NULL)
		return;
	memcpy(out, all, n);
	memset((char *)out + n, 0, size - n); /* fields this library lacks */
}

void tw__stats_snapshot(const struct tw__stats *st, tw_stats *out, size_t size)
{
	tw_stats all;
	FIELDS(LOAD)
	copy_out(&all, out, size);
}

/* The sum of every shard (unsigned: a block made on one thread and freed
 * on another leaves one shard's blocks_live wrapped; the sum is right). */
static void global(tw_stats *out, size_t size)
{
	tw_stats all;
	const struct tw__stats *st = &retired;
	pthread_mutex_lock(&lock); /* a thread folding its shard: before or after */
	FIELDS(LOAD)
#define SUM(f) all.f += atomic_load_explicit(&st->f, memory_order_relaxed);
	st = &fallback;
	FIELDS(SUM)
	for (const struct shard *s = shards; s != NULL; s = s->next) {
		st = &s->st;
		FIELDS(SUM)
	}
	pthread_mutex_unlock(&lock);
#undef SUM
	copy_out(&all, out, size);
}

void tw_stats_global(tw_stats *out, size_t size)
{
	global(out, size);
}
