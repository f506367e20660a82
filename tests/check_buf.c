/* SPDX-License-Identifier: BSD-3-Clause */
/* Unit tests: refcounted blocks, slices and messages (core/block.c,
 * core/msg.c). Stats are process-wide, so every check compares counters
 * before and after. */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <stdio.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <event2/event.h>

#include <taskwire/buf.h>
#include <taskwire/context.h>
#include <taskwire/error.h>
#include <taskwire/msg.h>
#include <taskwire/stats.h>

#include "core/block.h"
#include "core/budget.h"
#include "core/context.h"
#include "core/memlimit.h"
#include "core/reclaim.h"
#include "protocol/packbuf.h"
#include "tests/proc_status.h"
#include "tests/unit.h"
#include "tests/support/suite.h"

#define DEFAULT_CACHE_BYTES ((size_t)256 << 20)

struct release_log {
	int calls;
	void *data;
	void *arg;
};

static void on_release(void *data, void *arg)
{
	struct release_log *log = arg;
	log->calls++;
	log->data = data;
	log->arg = arg;
}

/* Allocate, fill, check and free one block of `size` bytes; the live
 * counters move by exactly one block of that size and back. */
static void check_block_size(size_t size)
{
	tw_stats before = stats_now(), mid, after;
	tw_block *b = NULL;
	ck_assert_int_eq(tw_block_new(size, &b), 0);
	ck_assert_ptr_nonnull(b);
	ck_assert_uint_eq(tw_block_size(b), size);
	ck_assert_ptr_nonnull(tw_block_data(b));
	memset(tw_block_data(b), 0xa5, size);
	for (size_t i = 0; i < size; i += 4093)
		REQUIRE(tw_block_data(b)[i] == 0xa5);
	mid = stats_now();
	ck_assert_uint_eq(mid.blocks_allocated, before.blocks_allocated + 1);
	ck_assert_uint_eq(mid.block_bytes_allocated, before.block_bytes_allocated + size);
	ck_assert_uint_eq(mid.blocks_live, before.blocks_live + 1);
	ck_assert_uint_eq(mid.block_bytes_live, before.block_bytes_live + size);
	tw_block_free(b);
	after = stats_now();
	ck_assert_uint_eq(after.blocks_live, before.blocks_live);
	ck_assert_uint_eq(after.block_bytes_live, before.block_bytes_live);
}

START_TEST(block_sizes)
{
	static const size_t sizes[] = {0,
				       1,
				       100,
				       4096,
				       TW__MAP_MIN_BYTES - 1,
				       TW__MAP_MIN_BYTES,
				       TW__MAP_MIN_BYTES + 1,
				       ((size_t)1 << 20) + 3};
	for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++)
		check_block_size(sizes[i]);
}
END_TEST

/* Blocks of 256 KiB and more are mappings of their own: page-aligned. */
START_TEST(block_large_is_mapped)
{
	size_t pg = (size_t)sysconf(_SC_PAGESIZE);
	tw_block *a, *b;
	ck_assert_int_eq(tw_block_new(TW__MAP_MIN_BYTES, &a), 0);
	ck_assert_int_eq(tw_block_new(TW__MAP_MIN_BYTES + 10, &b), 0);
	ck_assert_uint_eq((uintptr_t)tw_block_data(a) % pg, 0);
	ck_assert_uint_eq((uintptr_t)tw_block_data(b) % pg, 0);
	ck_assert_ptr_ne(tw_block_data(a), tw_block_data(b));
	tw_block_free(a);
	tw_block_free(b);
}
END_TEST

START_TEST(block_hold_free)
{
	tw_stats before = stats_now(), st;
	tw_block *b;
	ck_assert_int_eq(tw_block_new(1000, &b), 0);
	ck_assert_ptr_eq(tw_block_hold(b), b);
	ck_assert_ptr_eq(tw_block_hold(b), b);
	tw_block_free(b);
	tw_block_free(b);
	st = stats_now();
	ck_assert_uint_eq(st.blocks_live, before.blocks_live + 1);
	ck_assert_uint_eq(st.block_bytes_live, before.block_bytes_live + 1000);
	tw_block_data(b)[999] = 7; /* still alive: one reference left */
	tw_block_free(b);
	st = stats_now();
	ck_assert_uint_eq(st.blocks_live, before.blocks_live);
	ck_assert_uint_eq(st.block_bytes_live, before.block_bytes_live);
	tw_block_free(NULL);
}
END_TEST

START_TEST(block_bad_args)
{
	char c;
	tw_block *b = NULL;
	ck_assert_int_eq(tw_block_new(10, NULL), TW_EINVAL);
	ck_assert_int_eq(tw_block_wrap(&c, 1, NULL, NULL, NULL), TW_EINVAL);
	ck_assert_int_eq(tw_block_wrap(NULL, 5, NULL, NULL, &b), TW_EINVAL);
	ck_assert_ptr_null(b);
}
END_TEST

START_TEST(block_wrap_release_once)
{
	char buf[32] = "caller memory";
	struct release_log log = {0, NULL, NULL};
	tw_stats before = stats_now(), st;
	tw_block *b;
	ck_assert_int_eq(tw_block_wrap(buf, sizeof(buf), on_release, &log, &b), 0);
	ck_assert_ptr_eq(tw_block_data(b), (uint8_t *)buf);
	ck_assert_uint_eq(tw_block_size(b), sizeof(buf));
	tw_block_hold(b);
	tw_block_hold(b);
	tw_block_free(b);
	tw_block_free(b);
	ck_assert_int_eq(log.calls, 0);
	tw_block_free(b);
	ck_assert_int_eq(log.calls, 1);
	ck_assert_ptr_eq(log.data, buf);
	ck_assert_ptr_eq(log.arg, &log);
	/* Wrapped blocks are not allocations of ours. */
	st = stats_now();
	ck_assert_uint_eq(st.blocks_allocated, before.blocks_allocated);
	ck_assert_uint_eq(st.blocks_live, before.blocks_live);
	ck_assert_uint_eq(st.block_bytes_live, before.block_bytes_live);
}
END_TEST

START_TEST(block_wrap_empty_and_no_release)
{
	char c = 'x';
	tw_block *b;
	ck_assert_int_eq(tw_block_wrap(NULL, 0, NULL, NULL, &b), 0);
	ck_assert_uint_eq(tw_block_size(b), 0);
	tw_block_free(b);
	ck_assert_int_eq(tw_block_wrap(&c, 1, NULL, NULL, &b), 0);
	ck_assert_uint_eq(tw_block_data(b)[0], 'x');
	tw_block_free(b);
}
END_TEST

/* A released large block is reused for the next block of its size, unless
 * the cache is disabled or the block is larger than the limit. */
static int cache_hit_after_reuse(size_t size)
{
	tw_stats before, after;
	tw_block *b;
	ck_assert_int_eq(tw_block_new(size, &b), 0);
	tw_block_free(b);
	before = stats_now();
	ck_assert_int_eq(tw_block_new(size, &b), 0);
	after = stats_now();
	tw_block_free(b);
	return (int)(after.block_cache_hits - before.block_cache_hits);
}

START_TEST(block_cache)
{
	size_t mib = (size_t)1 << 20;
	tw_block_cache_set_limit(DEFAULT_CACHE_BYTES);
	ck_assert_int_eq(cache_hit_after_reuse(mib), 1);
	tw_block_cache_set_limit(mib / 2);
	ck_assert_int_eq(cache_hit_after_reuse(mib), 0);
	ck_assert_int_eq(cache_hit_after_reuse(TW__MAP_MIN_BYTES), 1);
	tw_block_cache_set_limit(0);
	ck_assert_int_eq(cache_hit_after_reuse(mib), 0);
	ck_assert_int_eq(cache_hit_after_reuse(TW__MAP_MIN_BYTES), 0);
	/* Small blocks never come from the cache. */
	tw_block_cache_set_limit(DEFAULT_CACHE_BYTES);
	ck_assert_int_eq(cache_hit_after_reuse(1000), 0);
	tw_block_cache_set_limit(DEFAULT_CACHE_BYTES);
}
END_TEST

/* A cached mapping keeps no live-block count and is writable again. */
START_TEST(block_cache_stats)
{
	tw_stats before, st;
	tw_block *b;
	tw_block_cache_set_limit(DEFAULT_CACHE_BYTES);
	before = stats_now();
	ck_assert_int_eq(tw_block_new((size_t)2 << 20, &b), 0);
	tw_block_free(b);
	st = stats_now();
	ck_assert_uint_eq(st.blocks_live, before.blocks_live);
	ck_assert_uint_eq(st.block_bytes_live, before.block_bytes_live);
	ck_assert_int_eq(tw_block_new((size_t)2 << 20, &b), 0);
	memset(tw_block_data(b), 1, (size_t)2 << 20);
	st = stats_now();
	ck_assert_uint_eq(st.blocks_live, before.blocks_live + 1);
	ck_assert_uint_eq(st.block_bytes_live, before.block_bytes_live + ((size_t)2 << 20));
	tw_block_free(b);
	tw_block_cache_set_limit(0);
	tw_block_cache_set_limit(DEFAULT_CACHE_BYTES);
}
END_TEST

/* A receiving block (tw__block_new_lazy) has no writable page until it
 * is committed; commit follows the bytes, a quarter of what arrived (at
 * least TW__COMMIT_MIN_BYTES) at a time, in few steps, and says when it
 * committed more; a block committed whole is cached like any other, one
 * left part-way is unmapped. */
START_TEST(block_lazy_commit)
{
	size_t size = (size_t)32 << 20, off = 0, len, steps = 0;
	tw_stats before;
	tw_block *b;
	uint8_t *p;
	tw_block_cache_set_limit(0);
	tw_block_cache_set_limit(DEFAULT_CACHE_BYTES);
	ck_assert_int_eq(tw__block_new_lazy(size, &b), 0);
	ck_assert_uint_eq(tw_block_size(b), size);
	p = tw_block_data(b);
	ck_assert_uint_eq(writable_bytes(p, size), 0);
	len = size;
	ck_assert_int_eq(tw__block_commit(b, 0, &len), 1);
	ck_assert_uint_eq(len, TW__COMMIT_MIN_BYTES);
	ck_assert_uint_eq(writable_bytes(p, size), TW__COMMIT_MIN_BYTES);
	while (off < size) {
		len = size - off;
		ck_assert_int_eq(tw__block_commit(b, off, &len), off == 0 ? 0 : 1);
		ck_assert_uint_gt(len, 0);
		memset(p + off, 0xab, len);
		off += len;
		steps++;
		ck_assert_uint_eq(writable_bytes(p, size), off);
		ck_assert_uint_le(off, TW__COMMIT_MIN_BYTES + (off - len) + (off - len) / 4);
	}
	ck_assert_uint_lt(steps, 40);
	len = 10; /* committed already: unchanged */
	ck_assert_int_eq(tw__block_commit(b, 100, &len), 0);
	ck_assert_uint_eq(len, 10);
	before = stats_now();
	tw_block_free(b);
	ck_assert_int_eq(tw_block_new(size, &b), 0); /* the cache's, written */
	ck_assert_uint_eq(stats_now().block_cache_hits, before.block_cache_hits + 1);
	ck_assert_uint_eq(tw_block_data(b)[size - 1], 0xab);
	tw_block_free(b);
	/* Left part-way: unmapped, not cached (the cache hands out usable
	 * pages only). */
	ck_assert_int_eq(tw__block_new_lazy((size_t)3 << 20, &b), 0);
	len = 1; /* a whole step even so, as a slab's next frames need it */
	ck_assert_int_eq(tw__block_commit(b, 0, &len), 1);
	ck_assert_uint_eq(len, 1);
	ck_assert_uint_eq(writable_bytes(tw_block_data(b), (size_t)3 << 20), TW__COMMIT_MIN_BYTES);
	tw_block_free(b);
	before = stats_now();
	ck_assert_int_eq(tw_block_new((size_t)3 << 20, &b), 0);
	ck_assert_uint_eq(stats_now().block_cache_hits, before.block_cache_hits);
	ck_assert_uint_eq(writable_bytes(tw_block_data(b), (size_t)3 << 20), (size_t)3 << 20);
	tw_block_free(b);
	/* Up to TW__COMMIT_MIN_BYTES: plain heap blocks, usable at once;
	 * above it, even below TW__MAP_MIN_BYTES, address space only. */
	ck_assert_int_eq(tw__block_new_lazy(TW__COMMIT_MIN_BYTES, &b), 0);
	len = TW__COMMIT_MIN_BYTES;
	ck_assert_int_eq(tw__block_commit(b, 0, &len), 0);
	ck_assert_uint_eq(len, TW__COMMIT_MIN_BYTES);
	tw_block_free(b);
	ck_assert_int_eq(tw__block_new_lazy(TW__COMMIT_MIN_BYTES + 1, &b), 0);
	ck_assert_uint_eq(writable_bytes(tw_block_data(b), TW__COMMIT_MIN_BYTES + 1), 0);
	tw_block_free(b);
}
END_TEST

/* A thread of this process named `name` (/proc/self/task/N/comm). */
static int has_thread(const char *name)
{
	DIR *d = opendir("/proc/self/task");
	struct dirent *e;
	int found = 0;
	ck_assert_ptr_nonnull(d);
	while (!found && (e = readdir(d)) != NULL) {
		char path[300], comm[32] = "";
		FILE *f;
		snprintf(path, sizeof(path), "/proc/self/task/%s/comm", e->d_name);
		if ((f = fopen(path, "r")) == NULL)
			continue;
		if (fgets(comm, sizeof(comm), f) != NULL)
			found = strncmp(comm, name, strlen(name)) == 0;
		fclose(f);
	}
	closedir(d);
	return found;
}

/* Freeing a large block never unmaps on the caller's thread (the loop's,
 * in a server): munmap of 2 GiB took 0.25 s there (issue 17). The
 * mapping goes to the reclaimer thread, and is gone once it has run. */
START_TEST(block_free_unmaps_off_thread)
{
	size_t size = (size_t)64 << 20;
	tw_block *b;
	uint8_t *p;
	tw_block_cache_set_limit(0);
	ck_assert_int_eq(tw_block_new(size, &b), 0);
	p = tw_block_data(b);
	memset(p, 1, size);
	tw_block_free(b);
	ck_assert(has_thread("tw-reclaim"));
	tw__reclaim_wait();
	ck_assert_uint_eq(writable_bytes(p, size), 0);
	/* small ones are unmapped at once, with no thread involved */
	ck_assert_int_eq(tw_block_new(TW__MAP_MIN_BYTES, &b), 0);
	p = tw_block_data(b);
	tw_block_free(b);
	ck_assert_uint_eq(writable_bytes(p, TW__MAP_MIN_BYTES), 0);
	tw_block_cache_set_limit((size_t)256 << 20);
}
END_TEST

static int granted[4];

static void on_granted(struct tw__claim *c)
{
	granted[c->want == 0 ? 0 : 1]++; /* want is cleared before it runs */
}

/* The receive budget's rules (core/budget.h): alone, any size goes, and
 * only one at a time past the limit; waiters go on smallest first (the
 * largest stays paused), until the oldest has been passed over
 * TW__BUDGET_MAX_SKIPS times; past a full budget the message nearest to
 * done passes, once a message in progress waits; the write queues count
 * with the reservations, and while they may drain nobody passes the
 * limit until tw__budget_pass; a passer that stops moving hands the pass
 * to a waiter nearer to done. */
START_TEST(budget_rules)
{
	struct tw__budget b;
	struct tw__claim c[4];
	uint64_t queued = 0;
	memset(c, 0, sizeof(c));
	memset(granted, 0, sizeof(granted));
	for (int i = 0; i < 4; i++)
		c[i].granted = on_granted;
	tw__reclaim_wait(); /* bytes the reclaimer holds count */
	tw__budget_init(&b, 100);
	b.also = &queued;
	ck_assert_int_eq(tw__budget_reserve(&b, &c[0], 300, 300), 0); /* alone: past the limit */
	ck_assert_int_eq(tw__budget_reserve(&b, &c[1], 80, 80), TW_EAGAIN);
	ck_assert_int_eq(tw__budget_reserve(&b, &c[2], 10, 10), TW_EAGAIN);
	ck_assert_int_eq(tw__budget_reserve(&b, &c[3], 30, 30), TW_EAGAIN);
	ck_assert_int_eq(tw__budget_reserve(&b, &c[1], 80, 80), TW_EAGAIN); /* keeps its place */
	ck_assert_uint_eq(b.used, 300);
	tw__budget_release(&b, &c[0]); /* the smallest first; the largest waits */
	ck_assert_int_eq(granted[0], 2);
	ck_assert_uint_eq(c[2].held, 10);
	ck_assert_uint_eq(c[3].held, 30);
	ck_assert_uint_eq(c[1].held, 0);
	ck_assert_uint_eq(c[1].skips, 2);
	/* c[2] comes back with small messages and passes c[1] each time ... */
	while (c[1].skips < TW__BUDGET_MAX_SKIPS) {
		tw__budget_release(&b, &c[2]);
		ck_assert_int_eq(tw__budget_reserve(&b, &c[2], 10, 10), 0);
	}
	/* ... until c[1] was passed over enough: then nobody passes it */
	tw__budget_release(&b, &c[2]);
	ck_assert_int_eq(tw__budget_reserve(&b, &c[2], 10, 10), TW_EAGAIN);
	ck_assert_int_eq(tw__budget_reserve(&b, &c[0], 1, 1), TW_EAGAIN);
	tw__budget_release(&b, &c[3]); /* alone: c[1], then what fits */
	ck_assert_uint_eq(c[1].held, 80);
	ck_assert_uint_eq(c[0].held, 1);
	ck_assert_uint_eq(c[2].held, 10);
	ck_assert_uint_eq(b.used, 91);
	/* holders ask again: past a full budget the message nearest to done
	 * goes (c[1], 40 bytes to come, not c[2], 50), and only once no
	 * message in progress and not waiting has fewer to come (c[0], 1) */
	ck_assert_int_eq(tw__budget_reserve(&b, &c[2], 50, 50), TW_EAGAIN);
	ck_assert_int_eq(tw__budget_reserve(&b, &c[1], 50, 40), TW_EAGAIN);
	ck_assert_ptr_null(b.passer);
	tw__budget_release(&b, &c[0]);
	ck_assert_ptr_eq(b.passer, &c[1]);
	ck_assert_uint_eq(c[1].held, 130);
	ck_assert_uint_eq(b.used, 140);
	tw__budget_release(&b, &c[1]); /* c[2]'s 50 fit now */
	ck_assert_uint_eq(c[2].held, 60);
	tw__budget_release(&b, &c[2]);
	ck_assert_uint_eq(b.used, 0);
	/* bytes queued for writing count: while they may still drain, even
	 * a lone message waits for them, until the owner's pass (no bytes
	 * came back for a while); the passer goes on, the others wait */
	queued = 95;
	ck_assert_int_eq(tw__budget_reserve(&b, &c[0], 10, 10), TW_EAGAIN);
	tw__budget_pass(&b);
	ck_assert_uint_eq(c[0].held, 10);
	ck_assert_ptr_eq(b.passer, &c[0]);
	ck_assert_int_eq(tw__budget_reserve(&b, &c[1], 10, 10), TW_EAGAIN);
	ck_assert_int_eq(tw__budget_reserve(&b, &c[0], 10, 10), 0); /* the passer, to its end */
	tw__budget_release(&b, &c[0]);
	ck_assert_ptr_null(b.passer);
	ck_assert_uint_eq(c[1].held, 0); /* the pass was used: c[1] waits for the queue */
	queued = 90;
	tw__budget_admit(&b);
	ck_assert_uint_eq(c[1].held, 10);
	tw__budget_release(&b, &c[1]);
	ck_assert_uint_eq(b.used, 0);
	/* a passer that moves keeps the pass; one that stopped (no step
	 * until the owner's pass) hands it to a waiter with fewer bytes to
	 * come, and waits when it asks again (breaker b1: a dripper held
	 * the pass for ever) */
	queued = 0;
	ck_assert_int_eq(tw__budget_reserve(&b, &c[0], 300, 1000), 0); /* alone: passes */
	ck_assert_int_eq(tw__budget_reserve(&b, &c[1], 10, 10), TW_EAGAIN);
	ck_assert_int_eq(tw__budget_reserve(&b, &c[0], 10, 700), 0); /* it moves */
	ck_assert_ptr_eq(b.passer, &c[0]);
	tw__budget_pass(&b);
	ck_assert_ptr_eq(b.passer, &c[1]);
	ck_assert_uint_eq(c[1].held, 10);
	ck_assert_uint_eq(b.used, 320);
	ck_assert_int_eq(tw__budget_reserve(&b, &c[0], 10, 690), TW_EAGAIN);
	tw__budget_release(&b, &c[1]); /* c[0], in progress, waits: it passes again */
	ck_assert_ptr_eq(b.passer, &c[0]);
	ck_assert_uint_eq(c[0].held, 320);
	tw__budget_release(&b, &c[0]);
	ck_assert_uint_eq(b.used, 0);
	ck_assert_int_eq(b.tight, 0);
}
END_TEST

static int cuts;

static void on_cut(struct tw__claim *c)
{
	(void)c;
	cuts++;
}

/* An empty budget of limit bytes and three claims, told of cuts. */
static void cut_setup(struct tw__budget *b, struct tw__claim c[3], uint64_t limit)
{
	memset(c, 0, 3 * sizeof(*c));
	for (int i = 0; i < 3; i++) {
		c[i].granted = on_granted;
		c[i].cut_off = on_cut;
	}
	cuts = 0;
	tw__budget_init(b, limit);
}

/* One pass interval of the owner (core/context.c): holders' moves count
 * from a new epoch; c[i] for i < n receives drip[i] bytes in it (got[i]
 * is what it has received); then no bytes came back. */
static void interval(struct tw__budget *b, struct tw__claim *c, uint64_t *got, const uint64_t *drip,
		     int n)
{
	b->epoch++;
	for (int i = 0; i < n; i++) {
		tw__budget_moved(b, &c[i], got[i]);
		got[i] += drip[i];
		tw__budget_moved(b, &c[i], got[i]);
	}
	tw__budget_pass(b);
}

/* Passers replaced because they drip keep what they hold, but not past
 * the limit and tw__budget_past_bytes together: when a new pass would
 * start on top of more than that, it waits, and once a holder has dripped
 * for TW__BUDGET_CUT_INTERVALS intervals so slowly that its rest would
 * take longer than the pause limit, the hoarder holding the most is cut
 * (its bytes given back at once, cut_off called, and it asks in vain
 * until released); under that bound nobody is cut (breaker17 b17-5). */
START_TEST(budget_cuts_slow_hoarders)
{
	struct tw__budget b;
	struct tw__claim c[3];
	uint64_t mib = (uint64_t)1 << 20, got[2] = {10 * mib, 0}, drip[2] = {1024, 1024};
	cut_setup(&b, c, 8 * mib);
	ck_assert_uint_eq(tw__budget_past_bytes(&b), 4 * mib); /* at least 4 MiB */
	/* under the bound: c0 is replaced as passer and keeps its 10 MiB */
	tw__budget_moved(&b, &c[0], got[0]);
	ck_assert_int_eq(tw__budget_reserve(&b, &c[0], 10 * mib, 100 * mib), 0); /* alone */
	ck_assert_int_eq(tw__budget_reserve(&b, &c[1], mib, mib), TW_EAGAIN);
	interval(&b, c, got, drip, 1); /* c0 dripped 1 KiB in the interval: slow */
	ck_assert_int_eq(c[0].slow, 1);
	ck_assert_ptr_eq(b.passer, &c[1]);
	ck_assert_uint_eq(c[0].held, 10 * mib);
	ck_assert_int_eq(cuts, 0);
	/* c1 goes on past the limit to 12 MiB, then drips: a new pass would
	 * start on 22 MiB, 14 past the limit. No pass starts on top while
	 * the slow holders may only be pausing; once one has dripped for
	 * TW__BUDGET_CUT_INTERVALS intervals (its 100 MiB to come at 1 KiB
	 * an interval: far past the pause limit), the largest such is cut,
	 * as many as it takes to be within the 4 MiB, and c2 goes on */
	tw__budget_moved(&b, &c[1], 0);
	got[1] = 11 * mib;
	tw__budget_moved(&b, &c[1], got[1]);
	ck_assert_int_eq(tw__budget_reserve(&b, &c[1], 11 * mib, 100 * mib), 0);
	ck_assert_uint_eq(b.used, 22 * mib);
	ck_assert_int_eq(tw__budget_reserve(&b, &c[2], mib, mib), TW_EAGAIN);
	for (unsigned i = 0; i < 2 * TW__BUDGET_CUT_INTERVALS && cuts == 0; i++) {
		ck_assert_uint_eq(c[2].held, 0); /* nothing on top meanwhile */
		ck_assert_uint_eq(b.used, 22 * mib);
		interval(&b, c, got, drip, 2);
	}
	ck_assert_int_eq(cuts, 1);
	ck_assert_int_eq(c[0].cut + c[1].cut, 1);
	ck_assert_uint_ge(c[0].cut ? c[0].slow : c[1].slow, TW__BUDGET_CUT_INTERVALS);
	ck_assert_uint_lt(c[0].cut ? c[0].slow : c[1].slow, 2 * TW__BUDGET_CUT_INTERVALS);
	ck_assert_uint_le(b.used, 8 * mib + 4 * mib + mib);
	ck_assert_uint_eq(c[2].held, mib);
	ck_assert_ptr_eq(b.passer, &c[2]);
	for (int i = 0; i < 2; i++) { /* a cut claim asks in vain, and does not wait */
		if (!c[i].cut)
			continue;
		ck_assert_int_eq(tw__budget_reserve(&b, &c[i], mib, mib), TW_EAGAIN);
		ck_assert_ptr_null(c[i].next);
	}
	for (int i = 0; i < 3; i++)
		tw__budget_release(&b, &c[i]);
	ck_assert_int_eq(c[0].cut + c[1].cut, 0); /* released: they may ask again */
	ck_assert_int_eq(tw__budget_reserve(&b, &c[1], mib, mib), 0);
	tw__budget_release(&b, &c[1]);
	ck_assert_uint_eq(b.used, 0);
}
END_TEST

/* Holders past the bound that pause (move nothing: a blocked sender) are
 * waited for: no pass on top, nobody cut, until one has been slow for
 * the pause limit (pause_ms; 0: never); one that drips near its end
 * (its rest at its rate within the pause limit) is not cut either. The
 * 2 s rule before cut the pausers (breaker13 b7, breaker17 b17-24). */
START_TEST(budget_waits_for_pausers)
{
	struct tw__budget b;
	struct tw__claim c[3];
	uint64_t mib = (uint64_t)1 << 20, got[2] = {0, 0}, drip[2] = {0, 0};
	uint32_t pause_ms = 3000; /* 30 intervals */
	unsigned limit = pause_ms / TW__BUDGET_PASS_MS;
	cut_setup(&b, c, 8 * mib);
	b.pause_ms = &pause_ms;
	/* c0 passes to 10 MiB of 20 (10 to come) and pauses; c1 takes the
	 * pass, gets to 12 MiB with 2 KiB to come, then drips 64 bytes an
	 * interval (what is left, at that rate, within the limit at every
	 * look from the 20th interval); c2 waits */
	got[0] = 10 * mib;
	tw__budget_moved(&b, &c[0], got[0]);
	ck_assert_int_eq(tw__budget_reserve(&b, &c[0], 10 * mib, 10 * mib), 0);
	ck_assert_int_eq(tw__budget_reserve(&b, &c[1], mib, 13 * mib), TW_EAGAIN);
	interval(&b, c, got, drip, 2);
	ck_assert_ptr_eq(b.passer, &c[1]);
	got[1] = 12 * mib - 2048;
	tw__budget_moved(&b, &c[1], got[1]);
	ck_assert_int_eq(tw__budget_reserve(&b, &c[1], 11 * mib, 2048), 0);
	ck_assert_int_eq(tw__budget_reserve(&b, &c[2], mib, mib), TW_EAGAIN);
	drip[1] = 64;
	for (unsigned i = 2; i < limit; i++) {
		interval(&b, c, got, drip, 2);
		ck_assert_int_eq(cuts, 0);
		ck_assert_uint_eq(c[2].held, 0); /* nothing on top meanwhile */
		ck_assert_uint_eq(b.used, 22 * mib);
	}
	/* slow for the pause limit: c0, which holds the most, is cut */
	ck_assert_uint_eq(c[0].slow, limit - 1);
	interval(&b, c, got, drip, 2);
	ck_assert_int_eq(cuts, 1);
	ck_assert_int_eq(c[0].cut, 1);
	ck_assert_uint_eq(c[2].held, mib);
	for (int i = 0; i < 3; i++)
		tw__budget_release(&b, &c[i]);
	ck_assert_uint_eq(b.used, 0);
	/* limit 0: nobody is cut, however long they pause */
	pause_ms = 0;
	got[0] = got[1] = 0;
	drip[1] = 0;
	ck_assert_int_eq(tw__budget_reserve(&b, &c[0], 13 * mib, 10 * mib), 0);
	ck_assert_int_eq(tw__budget_reserve(&b, &c[2], mib, mib), TW_EAGAIN);
	for (unsigned i = 0; i < 3 * limit; i++)
		interval(&b, c, got, drip, 1);
	ck_assert_int_eq(cuts, 1);
	ck_assert_uint_eq(c[2].held, 0);
	tw__budget_release(&b, &c[0]);
	ck_assert_uint_eq(c[2].held, mib);
	tw__budget_release(&b, &c[2]);
	ck_assert_uint_eq(b.used, 0);
}
END_TEST

/* Bytes each claim's peer sent that wait unread in its socket (the
 * comm's FIONREAD: tw__claim.ready), for claims of the array ready_of. */
static const struct tw__claim *ready_of;
static uint64_t ready_bytes[4];

static uint64_t fake_ready(const struct tw__claim *c)
{
	return ready_bytes[c - ready_of];
}

/* An empty budget of limit bytes with a pause limit of 30 intervals, and
 * four claims told of cuts, with nothing ready in their sockets. */
static void ready_setup(struct tw__budget *b, struct tw__claim c[4], uint64_t limit,
			uint32_t *pause_ms)
{
	memset(c, 0, 4 * sizeof(*c));
	memset(ready_bytes, 0, sizeof(ready_bytes));
	ready_of = c;
	for (int i = 0; i < 4; i++) {
		c[i].granted = on_granted;
		c[i].cut_off = on_cut;
		c[i].ready = fake_ready;
	}
	cuts = 0;
	*pause_ms = 3000;
	tw__budget_init(b, limit);
	b->pause_ms = pause_ms;
}

/* c1, 7 MiB + 8 bytes from a slow link, has 7 MiB of it reserved with
 * 32 KiB to come; c0 takes the pass and goes to 16 MiB, 8 past the
 * limit; c2 (1 MiB) waits; c0 moves while c1 drips its 32 KiB, 1 KiB an
 * interval, for longer than the pause limit (30 intervals). */
static void slow_link_setup(struct tw__budget *b, struct tw__claim c[4], uint32_t *pause_ms)
{
	uint64_t mib = (uint64_t)1 << 20, got[2] = {0, 7 * mib - 32768};
	uint64_t drip[2] = {TW__BUDGET_MOVING_BYTES, 1024};
	ready_setup(b, c, 8 * mib, pause_ms);
	tw__budget_moved(b, &c[1], got[1]);
	ck_assert_int_eq(tw__budget_reserve(b, &c[1], 7 * mib, 32768 + 8), 0);
	ck_assert_int_eq(tw__budget_reserve(b, &c[0], 2 * mib, 100 * mib), TW_EAGAIN);
	interval(b, c, got, drip, 2);
	ck_assert_ptr_eq(b->passer, &c[0]);
	ck_assert_int_eq(tw__budget_reserve(b, &c[0], 7 * mib, 98 * mib), 0);
	ck_assert_int_eq(tw__budget_reserve(b, &c[2], mib, mib), TW_EAGAIN);
	while (got[1] < 7 * mib)
		interval(b, c, got, drip, 2);
	ck_assert_uint_ge(c[1].slow, *pause_ms / TW__BUDGET_PASS_MS);
	ck_assert_uint_eq(b->used, 16 * mib);
	ck_assert_int_eq(cuts, 0);
}

/* A message of a slow link whose rest is all in its socket is neither
 * kept waiting behind the passer nor cut. Its steps end with a tiny one
 * (64 KiB, 64 KiB, 128 KiB ... 4 MiB sum to 8 MiB: the last of an 8 MiB
 * message is 8 bytes); slow for the pause limit, it ranked last behind a
 * full budget and was cut as a hoarder 8 bytes before its end, its peer
 * having sent everything (breaker15 b15-4). Its last step, when all of it
 * is ready, is granted at once past the limit (one such at a time); while
 * another holds that place, it waits ranked by its real rest, first to
 * pass, and is not cut. */
START_TEST(budget_last_step_all_ready)
{
	struct tw__budget b;
	struct tw__claim c[4];
	uint64_t mib = (uint64_t)1 << 20, got[1] = {16 * mib}, still[1] = {0};
	uint32_t pause_ms;
	slow_link_setup(&b, c, &pause_ms);
	ready_bytes[1] = 8; /* its last 8 bytes came: granted at once */
	ck_assert_int_eq(tw__budget_reserve(&b, &c[1], 8, 8), 0);
	ck_assert_ptr_eq(b.finisher, &c[1]);
	ck_assert_uint_eq(b.used, 16 * mib + 8);
	tw__budget_release(&b, &c[1]); /* its message ends */
	ck_assert_ptr_null(b.finisher);
	ck_assert_uint_eq(b.used, 9 * mib);
	for (int i = 0; i < 3; i++)
		tw__budget_release(&b, &c[i]);

	/* c3's last 64 KiB, all ready, take that place first (not read yet) */
	slow_link_setup(&b, c, &pause_ms);
	ready_bytes[3] = TW__BUDGET_MOVING_BYTES;
	ck_assert_int_eq(
		tw__budget_reserve(&b, &c[3], TW__BUDGET_MOVING_BYTES, TW__BUDGET_MOVING_BYTES), 0);
	ck_assert_ptr_eq(b.finisher, &c[3]);
	ready_bytes[1] = 8;
	ck_assert_int_eq(tw__budget_reserve(&b, &c[1], 8, 8), TW_EAGAIN);
	/* it ranks by its 8 bytes, first in line; once c0 stops, it takes
	 * the pass over (the others hold 9 MiB past the limit, within the 12
	 * MiB bound) and ends; nobody is cut, c3 (all its rest ready) neither */
	ck_assert_int_eq(c[1].ready_wait, 1);
	for (unsigned i = 0; c[1].next != NULL && i < 2 * pause_ms / TW__BUDGET_PASS_MS; i++)
		interval(&b, c, got, still, 1);
	ck_assert_ptr_eq(b.passer, &c[1]);
	ck_assert_uint_eq(c[1].held, 7 * mib + 8);
	ck_assert_uint_eq(c[2].held, 0);
	ck_assert_int_eq(cuts, 0);
	for (int i = 0; i < 4; i++)
		tw__budget_release(&b, &c[i]);
	ck_assert_uint_eq(b.used, 0);
}
END_TEST

/* Two uploads fill a budget of 16 MiB; c0 passes and takes 8 MiB past
 * it (12 MiB received, 28 to come), and stops past the bound; c1 waits.
 * Both peers sent 1 MiB we have not read. */
static void uploads_setup(struct tw__budget *b, struct tw__claim c[4], uint64_t got[4],
			  uint32_t *pause_ms)
{
	uint64_t mib = (uint64_t)1 << 20;
	tw__reclaim_wait();
	ready_setup(b, c, 16 * mib, pause_ms);
	got[0] = got[1] = 8 * mib;
	got[2] = got[3] = 0;
	ck_assert_int_eq(tw__budget_reserve(b, &c[0], 8 * mib, 40 * mib), 0);
	ck_assert_int_eq(tw__budget_reserve(b, &c[1], 8 * mib, 40 * mib), 0);
	tw__budget_moved(b, &c[0], got[0]);
	tw__budget_moved(b, &c[1], got[1]);
	ready_bytes[0] = ready_bytes[1] = mib;
	ck_assert_int_eq(tw__budget_reserve(b, &c[0], 4 * mib, 32 * mib), 0);
	ck_assert_ptr_eq(b->passer, &c[0]);
	ck_assert_int_eq(tw__budget_reserve(b, &c[1], 4 * mib, 32 * mib), TW_EAGAIN);
	got[0] = 12 * mib;
	tw__budget_moved(b, &c[0], got[0]);
	ck_assert_int_eq(tw__budget_reserve(b, &c[0], 4 * mib, 28 * mib), 0);
	ck_assert_uint_eq(b->used, 24 * mib); /* past the bound: no other pass */
}

/* c2, the express message, granted its first step, reads to the end of
 * its `size` bytes, a step an interval, each granted at once, while c0
 * receives drip[0] an interval as passer; it holds all of it then. */
static void express_to_end(struct tw__budget *b, struct tw__claim c[4], uint64_t got[4],
			   const uint64_t drip[4], uint64_t size)
{
	uint64_t left;
	ck_assert_ptr_eq(b->express, &c[2]);
	for (got[2] = c[2].held; got[2] < size; got[2] += left) {
		/* an interval: c0 moves, c1 waits, c2 reads its step */
		b->epoch++;
		tw__budget_moved(b, &c[0], got[0]);
		got[0] += drip[0];
		tw__budget_moved(b, &c[0], got[0]);
		tw__budget_moved(b, &c[2], c[2].got);
		tw__budget_moved(b, &c[2], got[2]);
		left = size - got[2];
		left = got[2] < left ? got[2] : left;
		ck_assert_int_eq(tw__budget_reserve(b, &c[2], left, size - got[2]), 0);
		tw__budget_pass(b);
	}
	ck_assert_uint_eq(c[2].held, size);
	ck_assert_ptr_eq(b->passer, &c[0]);
}

/* A message of a sixteenth of the limit at most whose peer sent it at once
 * goes on past a full budget beside a passer that moves above the floor
 * but slowly, one such at a time: behind two honest uploads at 1 MB/s
 * that held a 64 MiB budget, the passer kept the pass to its end and,
 * once it was past the bound, an honest 16 MiB message waited for the
 * uploads to end, 12-29 s (breaker18 b18-2). Not such a message: one
 * larger than a sixteenth of the limit and a step (an upload, even near its
 * end), one whose peer sent nothing yet; and the express message that
 * goes slow keeps its place, granted nothing past the limit, until it is
 * released. Orders only: no clock. */
START_TEST(budget_express_beside_slow_passer)
{
	uint64_t mib = (uint64_t)1 << 20, step = TW__BUDGET_MOVING_BYTES;
	uint64_t got[4], drip[4] = {100000, 0, 0, 0};
	uint64_t size = mib + 8; /* a sixteenth of the 16 MiB limit, and a head */
	struct tw__claim c[4];
	struct tw__budget b;
	uint32_t pause_ms;
	uploads_setup(&b, c, got, &pause_ms);
	/* more to come than a sixteenth and a step, or nothing sent: it waits */
	ck_assert_int_eq(tw__budget_reserve(&b, &c[3], step, size + 2 * step), TW_EAGAIN);
	tw__budget_release(&b, &c[3]);
	ck_assert_int_eq(tw__budget_reserve(&b, &c[3], step, size), TW_EAGAIN);
	ck_assert_ptr_null(b.express);
	tw__budget_release(&b, &c[3]);
	/* c2, new, all sent: it goes on at once, to its end, past the limit,
	 * while c0 moves on as passer and c1 waits */
	ready_bytes[2] = mib;
	ck_assert_int_eq(tw__budget_reserve(&b, &c[2], step, size), 0);
	express_to_end(&b, c, got, drip, size);
	ck_assert_ptr_nonnull(c[1].next);
	tw__budget_release(&b, &c[2]);
	ck_assert_ptr_null(b.express);
	ck_assert_uint_eq(c[1].held, 8 * mib); /* c1, 40 MiB, is no express message */
	/* c2 again, and it stops: slow, it waits when it asks, and keeps its
	 * place from c3 until it is released; then c3 goes */
	got[2] = 0;
	ck_assert_int_eq(tw__budget_reserve(&b, &c[2], step, size), 0);
	ck_assert_ptr_eq(b.express, &c[2]);
	tw__budget_moved(&b, &c[2], step);
	got[2] = step;
	interval(&b, c, got, drip, 3);
	ck_assert_uint_eq(c[2].slow, 1);
	ck_assert_int_eq(tw__budget_reserve(&b, &c[2], step, size - step), TW_EAGAIN);
	ready_bytes[3] = mib;
	ck_assert_int_eq(tw__budget_reserve(&b, &c[3], step, size), TW_EAGAIN);
	ck_assert_ptr_eq(b.express, &c[2]);
	ck_assert_uint_eq(c[2].held, step);
	tw__budget_release(&b, &c[2]);
	ck_assert_ptr_eq(b.express, &c[3]);
	ck_assert_uint_eq(c[3].held, step);
	ck_assert_int_eq(cuts, 0);
	for (int i = 0; i < 4; i++)
		tw__budget_release(&b, &c[i]);
	ck_assert_uint_eq(b.used, 0);
}
END_TEST

/* A message of more than a sixteenth of the limit, up to the limit, whose
 * peer sent its next bytes goes on beside a passer that lags: its peer
 * sends slower than we read (nothing of it waits in its socket) and,
 * at that rate, its bytes to come would take more than
 * TW__BUDGET_LAG_FINISH intervals, for TW__BUDGET_LAG_LOOKS intervals in
 * a row (an honest 16 MiB message waited 11.8 s and 28.9 s behind two
 * uploads of 48 and 64 MiB at 1 MB/s through 64 MiB: breaker18 b18-2).
 * Not beside a passer whose socket holds a step (we are the slow one, as
 * for budget-bench's 100 MiB passers), nor beside one that would end
 * within that time; and not a message larger than the limit, nor one
 * that lagged itself (the other upload). Orders only: no clock. */
START_TEST(budget_express_beside_lagging_passer)
{
	uint64_t mib = (uint64_t)1 << 20, step = TW__BUDGET_MOVING_BYTES;
	uint64_t got[4], drip[4] = {100000, 0, 0, 0};
	uint64_t size = 8 * mib + 8; /* half the 16 MiB limit, and a head */
	struct tw__claim c[4];
	struct tw__budget b;
	uint32_t pause_ms;
	uploads_setup(&b, c, got, &pause_ms);
	ck_assert_int_eq(tw__budget_reserve(&b, &c[0], 8 * mib, 28 * mib), 0); /* held 24 MiB */
	ready_bytes[2] = mib;
	ck_assert_int_eq(tw__budget_reserve(&b, &c[2], step, size), TW_EAGAIN);
	/* c0's socket holds a step: we read slower than its peer sends */
	for (unsigned i = 0; i < 2 * TW__BUDGET_LAG_LOOKS; i++)
		interval(&b, c, got, drip, 1);
	ck_assert_uint_eq(c[0].lag, 0);
	/* its socket empty, but 1.5 MiB an interval: done within the horizon */
	ready_bytes[0] = 0;
	drip[0] = 3 * mib / 2;
	for (unsigned i = 0; i < TW__BUDGET_LAG_LOOKS; i++)
		interval(&b, c, got, drip, 1);
	ck_assert_uint_eq(c[0].lag, 0);
	ck_assert_ptr_null(b.express);
	ck_assert_uint_eq(c[2].held, 0);
	/* 100 KB an interval with 19 MiB to come: it lags; c2 goes beside it
	 * once it lagged TW__BUDGET_LAG_LOOKS intervals, to its end */
	drip[0] = 100000;
	for (unsigned i = 1; i < TW__BUDGET_LAG_LOOKS; i++) {
		interval(&b, c, got, drip, 1);
		ck_assert_uint_eq(c[2].held, 0);
	}
	interval(&b, c, got, drip, 1);
	ck_assert_uint_eq(c[2].held, step);
	ck_assert_uint_eq(c[0].lag, TW__BUDGET_LAG_LOOKS);
	express_to_end(&b, c, got, drip, size);
	ck_assert_ptr_nonnull(c[1].next); /* c1, the other upload, waits */
	ck_assert_uint_eq(b.used, 40 * mib + 8);
	tw__budget_release(&b, &c[2]);
	ck_assert_ptr_null(b.express);
	/* larger than the limit: it waits for a pass, even beside this one */
	ready_bytes[3] = mib;
	ck_assert_int_eq(tw__budget_reserve(&b, &c[3], step, 16 * mib + 2 * step), TW_EAGAIN);
	interval(&b, c, got, drip, 1);
	ck_assert_uint_ge(c[0].lag, TW__BUDGET_LAG_LOOKS);
	ck_assert_ptr_null(b.express);
	tw__budget_release(&b, &c[3]);
	/* within the limit, but it lagged while it held room: it waits */
	c[3].lag = 1;
	ck_assert_int_eq(tw__budget_reserve(&b, &c[3], step, size), TW_EAGAIN);
	interval(&b, c, got, drip, 1);
	ck_assert_ptr_null(b.express);
	ck_assert_uint_eq(c[3].held, 0);
	/* the same, new: it goes */
	tw__budget_release(&b, &c[3]);
	ck_assert_uint_eq(c[3].lag, 0);
	ck_assert_int_eq(tw__budget_reserve(&b, &c[3], step, size), 0);
	ck_assert_ptr_eq(b.express, &c[3]);
	ck_assert_int_eq(cuts, 0);
	for (int i = 0; i < 4; i++)
		tw__budget_release(&b, &c[i]);
	ck_assert_uint_eq(b.used, 0);
}
END_TEST

/* A holder past the bound that stands still, and now and then sends a
 * step's worth at once, is slow for its average since it slowed, not for
 * the last interval: a hoarder that stood still 15 s then sent 100 KB,
 * over and over, started its count afresh each time, was never cut, and
 * an honest 16 MiB message waited for ever (breaker15 b15-1, b15-3).
 * One back from a pause at full speed makes the pause up at once and
 * gets its place back (breaker17 b17-20). */
START_TEST(budget_burst_does_not_reset_slow)
{
	struct tw__budget b;
	struct tw__claim c[3];
	uint64_t mib = (uint64_t)1 << 20, got[1] = {0}, step[1] = {0};
	uint32_t pause_ms = 3000; /* 30 intervals */
	unsigned limit = pause_ms / TW__BUDGET_PASS_MS, i;
	cut_setup(&b, c, 8 * mib);
	b.pause_ms = &pause_ms;
	ck_assert_int_eq(tw__budget_reserve(&b, &c[0], 14 * mib, 256 * mib), 0); /* alone */
	ck_assert_int_eq(tw__budget_reserve(&b, &c[1], mib, mib), TW_EAGAIN);
	/* c0 stands still, sends 100 KB once every 8 intervals */
	for (i = 0; cuts == 0 && i < 3 * limit; i++) {
		step[0] = i % 8 == 7 ? 100000 : 0;
		interval(&b, c, got, step, 1);
	}
	ck_assert_int_eq(cuts, 1);
	ck_assert_int_eq(c[0].cut, 1);
	/* at the pause limit, or sooner once two bursts in ten intervals
	 * show a drip that would take longer */
	ck_assert_uint_ge(i, TW__BUDGET_CUT_INTERVALS);
	ck_assert_uint_le(i, limit);
	ck_assert_uint_eq(c[1].held, mib);
	for (i = 0; i < 2; i++)
		tw__budget_release(&b, &c[i]);
	/* paused 5 intervals, then 1 MiB in one: slow no more */
	got[0] = step[0] = 0;
	ck_assert_int_eq(tw__budget_reserve(&b, &c[0], 14 * mib, 64 * mib), 0);
	for (i = 0; i < 5; i++)
		interval(&b, c, got, step, 1);
	ck_assert_uint_eq(c[0].slow, 5);
	step[0] = mib;
	interval(&b, c, got, step, 1);
	ck_assert_uint_eq(c[0].slow, 0);
	tw__budget_release(&b, &c[0]);
	ck_assert_uint_eq(b.used, 0);
}
END_TEST

/* Waiters whose peers sent their next bytes wait for us, and the bytes
 * past the bound are held by waiters alone, with no passer (a limit
 * lowered under them): nothing would come back, so the one nearest to
 * done passes at once with what it holds, to its end, and the other
 * (its count standing still: its bytes wait in its socket) passes when
 * the first is done. Nobody is cut. Before, their counts ran until the
 * pause limit and all but one were cut (breaker18 b18-3: 6 honest
 * messages of 128 MiB, the budget lowered from 1 GiB to 16 MiB, all 6
 * cut); excused for ever, or never passed for what it held itself (the
 * rules before that), they held the budget for ever. */
/* The budget's clock in budget_cuts_still_holders (tw__budget.now_ms). */
static uint64_t fake_now;

static uint64_t fake_clock(void)
{
	return fake_now;
}

/* A pass interval of ms: the passer c0 moves 128 KiB in it, then the look. */
static void still_interval(struct tw__budget *b, struct tw__claim *c0, uint64_t *got0, uint64_t ms)
{
	b->epoch++;
	fake_now += ms;
	*got0 += (uint64_t)128 << 10;
	tw__budget_moved(b, c0, *got0);
	tw__budget_look(b);
}

/* A holder whose peer sends nothing is cut once the pause limit (3 s) has
 * passed since its last byte, within the limit and its eighth, while it
 * waits for its next step; while bytes of its peer wait unread in its
 * socket (the budget paused it) it is not, nor with the limit at 0. c1
 * holds 4 MiB of an 8 MiB budget and waits for 4 MiB more behind the
 * passer c0, which moves. Before (pause19), a waiter that had moved when
 * it asked counted as waiting for us, was never slow and never cut. */
START_TEST(budget_cuts_still_holders)
{
	struct tw__budget b;
	struct tw__claim c[4];
	uint32_t pause_ms;
	uint64_t mib = (uint64_t)1 << 20, got0 = 4 * mib;
	ready_setup(&b, c, 8 * mib, &pause_ms);
	b.now_ms = fake_clock;
	fake_now = 1000;
	ck_assert_int_eq(tw__budget_reserve(&b, &c[1], 4 * mib, 200 * mib), 0);
	ck_assert_int_eq(tw__budget_reserve(&b, &c[0], 4 * mib, 100 * mib), 0);
	tw__budget_moved(&b, &c[0], got0);
	ck_assert_int_eq(tw__budget_reserve(&b, &c[0], 4 * mib, 96 * mib), 0);
	ck_assert_ptr_eq(b.passer, &c[0]);
	tw__budget_moved(&b, &c[1], 4 * mib);
	ck_assert_int_eq(tw__budget_reserve(&b, &c[1], 4 * mib, 196 * mib), TW_EAGAIN);
	ready_bytes[1] = 100; /* its peer's bytes wait: the wait is ours */
	for (int i = 0; i < 10; i++)
		still_interval(&b, &c[0], &got0, 500);
	ck_assert_int_eq(cuts, 0);
	ready_bytes[1] = 0; /* its peer sends nothing from here */
	for (int i = 0; i < 5; i++)
		still_interval(&b, &c[0], &got0, 500);
	ck_assert_int_eq(cuts, 0); /* 2500 ms since its last byte */
	pause_ms = 0;              /* 3000 ms, the limit at 0: nobody is cut */
	still_interval(&b, &c[0], &got0, 500);
	ck_assert_int_eq(cuts, 0);
	pause_ms = 3000;
	still_interval(&b, &c[0], &got0, 0);
	ck_assert_int_eq(cuts, 1);
	ck_assert_int_eq(c[1].cut, TW__BUDGET_CUT_STILL);
	ck_assert_uint_eq(c[1].held, 0);
	ck_assert_int_eq(c[0].cut, 0);
	ck_assert_uint_eq(b.used, 8 * mib);
	ck_assert_int_eq(tw__budget_reserve(&b, &c[1], 4 * mib, 196 * mib), TW_EAGAIN);
	tw__budget_release(&b, &c[1]);
	tw__budget_release(&b, &c[0]);
	ck_assert_uint_eq(b.used, 0);
}
END_TEST

START_TEST(budget_waiters_alone_past_the_bound)
{
	uint64_t mib = (uint64_t)1 << 20, got[2] = {0, 0};
	struct tw__claim c[4];
	struct tw__budget b;
	uint32_t pause_ms;
	unsigned i;
	ready_setup(&b, c, 16 * mib, &pause_ms);
	ready_bytes[0] = ready_bytes[1] = mib;
	ck_assert_int_eq(tw__budget_reserve(&b, &c[0], 8 * mib, 32 * mib), 0);
	ck_assert_int_eq(tw__budget_reserve(&b, &c[1], 6 * mib, 32 * mib), 0);
	got[0] = 8 * mib;
	got[1] = 6 * mib;
	tw__budget_moved(&b, &c[0], got[0]);
	tw__budget_moved(&b, &c[1], got[1]);
	tw__budget_set_limit(&b, mib); /* 14 MiB held, 9 past the bound */
	ck_assert_int_eq(tw__budget_reserve(&b, &c[1], 4 * mib, 26 * mib), TW_EAGAIN);
	ck_assert_ptr_null(b.passer); /* c[0] still holds its step */
	ck_assert_int_eq(tw__budget_reserve(&b, &c[0], 4 * mib, 24 * mib), 0);
	ck_assert_ptr_eq(b.passer, &c[0]); /* both wait: the nearer passes */
	ck_assert_uint_eq(c[0].held, 12 * mib);
	for (i = 0; i < 2 * pause_ms / TW__BUDGET_PASS_MS; i++) /* c[0] moves, c[1] waits */
		interval(&b, c, got, (const uint64_t[]){TW__BUDGET_MOVING_BYTES, 0}, 2);
	ck_assert_int_eq(cuts, 0);
	ck_assert_int_eq(c[1].cut, 0);
	tw__budget_release(&b, &c[0]); /* c[0] done: c[1] passes */
	ck_assert_ptr_eq(b.passer, &c[1]);
	ck_assert_uint_eq(c[1].held, 10 * mib);
	ck_assert_int_eq(cuts, 0);
	tw__budget_release(&b, &c[1]);
	ck_assert_uint_eq(b.used, 0);
}
END_TEST

/* Honest traffic that keeps the budget full does not hold back a waiter
 * with the most bytes to come for ever: once passed over
 * TW__BUDGET_MAX_SKIPS times it is the one to pass too, even with its
 * rest unknown (ws) while others' are known (breaker17 b17-17); and the
 * slow mark is looked at again every interval, so a holder that moves
 * again gets its place back (b17-20). */
START_TEST(budget_skipped_waiter_passes)
{
	struct tw__budget b;
	struct tw__claim c0, u, k;
	memset(&c0, 0, sizeof(c0));
	memset(&u, 0, sizeof(u));
	memset(&k, 0, sizeof(k));
	c0.granted = u.granted = k.granted = on_granted;
	tw__budget_init(&b, 100);
	ck_assert_int_eq(tw__budget_reserve(&b, &c0, 60, 60), 0);
	ck_assert_int_eq(tw__budget_reserve(&b, &u, 50, UINT64_MAX), TW_EAGAIN); /* unknown */
	for (int i = 0; i < TW__BUDGET_MAX_SKIPS; i++) { /* smaller messages go first */
		ck_assert_int_eq(tw__budget_reserve(&b, &k, 30, 30), 0);
		tw__budget_release(&b, &k);
	}
	ck_assert_uint_eq(u.skips, TW__BUDGET_MAX_SKIPS);
	ck_assert_int_eq(tw__budget_reserve(&b, &k, 30, 30), TW_EAGAIN); /* behind u now */
	tw__budget_pass(&b); /* nothing came back: u's turn, not k's */
	ck_assert_ptr_eq(b.passer, &u);
	ck_assert_uint_eq(u.held, 50);
	ck_assert_int_eq(c0.slow, 1);
	/* c0 moves again in the next interval: no longer slow */
	b.epoch++;
	tw__budget_moved(&b, &c0, 0);
	tw__budget_moved(&b, &c0, 2 * TW__BUDGET_MOVING_BYTES);
	tw__budget_pass(&b);
	ck_assert_int_eq(c0.slow, 0);
	tw__budget_release(&b, &u);
	tw__budget_release(&b, &k);
	tw__budget_release(&b, &c0);
	ck_assert_uint_eq(b.used, 0);
}
END_TEST

/* The block cache counts in the receive budget: a reservation that fits
 * only without the cache's pages trims the cache and is granted; while a
 * comm waits, released large blocks are not cached. */
START_TEST(budget_counts_block_cache)
{
	struct tw__budget b;
	struct tw__claim c[2];
	size_t mib = (size_t)1 << 20;
	tw_block *blk, *blk2;
	memset(c, 0, sizeof(c));
	c[0].granted = c[1].granted = on_granted;
	tw_block_cache_set_limit((size_t)256 << 20); /* also waits for the reclaimer */
	ck_assert_int_eq(tw_block_new(2 * mib, &blk), 0);
	ck_assert_int_eq(tw_block_new(2 * mib, &blk2), 0);
	tw_block_free(blk);
	tw_block_free(blk2);
	ck_assert_uint_eq(tw__block_cache_bytes(), 4 * mib);
	tw__budget_init(&b, 6 * mib);
	ck_assert_int_eq(tw__budget_reserve(&b, &c[0], 3 * mib, 3 * mib), 0);
	ck_assert_uint_eq(tw__block_cache_bytes(), 2 * mib); /* the oldest mapping went */
	ck_assert_int_eq(tw__budget_reserve(&b, &c[1], 4 * mib, 4 * mib), TW_EAGAIN);
	ck_assert_int_eq(b.tight, 1);
	ck_assert_int_eq(tw_block_new(mib, &blk), 0);
	tw_block_free(blk); /* a comm waits: not cached */
	ck_assert_uint_eq(tw__block_cache_bytes(), 2 * mib);
	tw__budget_release(&b, &c[0]); /* c[1] goes on */
	ck_assert_uint_eq(c[1].held, 4 * mib);
	ck_assert_uint_eq(tw__block_cache_bytes(), 2 * mib);
	ck_assert_int_eq(b.tight, 0);
	tw__budget_release(&b, &c[1]);
	ck_assert_int_eq(tw_block_new(mib, &blk), 0);
	tw_block_free(blk); /* nobody waits: cached again */
	ck_assert_uint_eq(tw__block_cache_bytes(), 3 * mib);
	/* a block freed while nobody waits goes to the cache, on top of what
	 * is reserved; the budget's next look trims the cache back within
	 * what the reservations leave (breaker13 b5-cache) */
	ck_assert_int_eq(tw__budget_reserve(&b, &c[0], 4 * mib, 4 * mib), 0);
	ck_assert_uint_le(tw__block_cache_bytes(), 2 * mib);
	ck_assert_int_eq(tw_block_new(2 * mib, &blk), 0);
	tw_block_free(blk);
	ck_assert_uint_eq(b.tight, 0);
	tw__budget_admit(&b);
	ck_assert_uint_le(b.used + tw__block_cache_bytes(), 6 * mib);
	tw__budget_release(&b, &c[0]);
	tw_block_cache_set_limit((size_t)256 << 20);
}
END_TEST

/* The bound holds at the moment a block goes into the cache, not only at
 * the budget's next look: a block freed while nobody looks (an
 * application freeing its messages, with no reservation, release or
 * write in between) is cached only within what the context's
 * reservations and write queues leave of its receive budget, the
 * tightest context's when there are several; and bytes queued for
 * writing trim the cache as they are queued. Before, the cache grew on
 * top of the reservations until the next look (session 13's left gap). */
START_TEST(budget_bounds_cache_put)
{
	struct event_base *base = event_base_new();
	tw_context *ctx, *roomy;
	struct tw__claim c;
	size_t mib = (size_t)1 << 20;
	tw_block *blk[3];
	memset(&c, 0, sizeof(c));
	c.granted = on_granted;
	tw_block_cache_set_limit(DEFAULT_CACHE_BYTES); /* also waits for the reclaimer */
	ck_assert_ptr_nonnull(base);
	/* the caller's base: this thread is the contexts' loop thread */
	ck_assert_int_eq(tw_context_new(base, &roomy), 0);
	ck_assert_int_eq(tw_context_new(base, &ctx), 0);
	ck_assert_int_eq(tw_context_set_receive_budget_bytes(roomy, 64 * mib), 0);
	ck_assert_int_eq(tw_context_set_receive_budget_bytes(ctx, 8 * mib), 0);
	ck_assert_int_eq(tw__budget_reserve(&ctx->rbudget, &c, 4 * mib, 4 * mib), 0);
	ck_assert_uint_eq(ctx->rbudget.used, 4 * mib);
	for (int i = 0; i < 3; i++)
		ck_assert_int_eq(tw_block_new(2 * mib, &blk[i]), 0);
	for (int i = 0; i < 3; i++) {
		tw_block_free(blk[i]); /* nobody looks at the budget */
		ck_assert_uint_le(ctx->rbudget.used + tw__block_cache_bytes(), 8 * mib);
	}
	ck_assert_uint_eq(tw__block_cache_bytes(), 4 * mib); /* it still caches what fits */
	ck_assert_uint_eq(tw__reclaim_pending(), 0);         /* 2 MiB: unmapped at once */
	/* 2 MiB queued for writing: the cache gives way as they are queued */
	tw__ctx_write_held(ctx, 2 * mib);
	ck_assert_uint_le(ctx->rbudget.used + ctx->wq_held + tw__block_cache_bytes(), 8 * mib);
	ck_assert_uint_eq(tw__block_cache_bytes(), 2 * mib);
	tw__ctx_write_unheld(ctx, 2 * mib);
	tw__budget_release(&ctx->rbudget, &c);
	tw_context_free(ctx);
	/* the tight context is gone: the roomy one's 64 MiB bound the cache */
	ck_assert_int_eq(tw_block_new(8 * mib, &blk[0]), 0);
	tw_block_free(blk[0]);
	ck_assert_uint_eq(tw__block_cache_bytes(), 10 * mib);
	tw_context_free(roomy);
	event_base_free(base);
	tw_block_cache_set_limit(DEFAULT_CACHE_BYTES);
}
END_TEST

/* The child's part of block_commit_rlimit: 0, or the step that failed. */
static int commit_past_limit(void *arg)
{
	size_t len = (size_t)128 << 20, off = 0;
	tw_block *b;
	void *p;
	(void)arg;
	tw_block_cache_set_limit(0);
	if (tw__block_new_lazy((size_t)1 << 30, &b) != 0)
		return 11;
	while (len > 0 && tw__block_commit(b, off, &len) >= 0) {
		memset(tw_block_data(b) + off, 1, len);
		off += len;
		len = ((size_t)128 << 20) - off;
	}
	tw_block_free(b);
	/* failed between 32 and 64 MiB in, with memory to spare after */
	if (len == 0 || off < ((size_t)32 << 20) || off > ((size_t)64 << 20))
		return 12;
	p = mmap(NULL, (size_t)1 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	return p == MAP_FAILED ? 13 : 0;
}

/* Under RLIMIT_DATA (VmData + 64 MiB) a commit past the limit fails with
 * TW_ENOMEM (no crash), while a reservation far larger than the limit is
 * fine: the memory a peer can make us take is what it sent. Run in a
 * child, as the limit is process-wide; skipped where the limit is not
 * enforced (a 128 MiB mapping succeeds: under valgrind, which keeps its
 * own). */
START_TEST(block_commit_rlimit)
{
	int status = rlimit_data_child((size_t)64 << 20, (size_t)128 << 20, NULL, commit_past_limit,
				       NULL, NULL);
	ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child status %d", status);
}
END_TEST

START_TEST(slice_data)
{
	tw_block *b;
	tw_slice s, empty = {NULL, 0, 0};
	ck_assert_int_eq(tw_block_new(16, &b), 0);
	s = tw__slice(b, 7, 3);
	ck_assert_ptr_eq(tw_slice_data(&s), tw_block_data(b) + 7);
	s = tw__slice(b, 0, 16);
	ck_assert_ptr_eq(tw_slice_data(&s), tw_block_data(b));
	ck_assert_ptr_null(tw_slice_data(&empty));
	tw_block_free(b);
}
END_TEST

START_TEST(msg_empty)
{
	tw_msg *m = NULL;
	ck_assert_int_eq(tw_msg_new(NULL), TW_EINVAL);
	ck_assert_int_eq(tw_msg_new(&m), 0);
	ck_assert_uint_eq(tw_msg_nframes(m), 0);
	ck_assert_uint_eq(tw_msg_bytes(m), 0);
	ck_assert_ptr_null(tw_msg_frame(m, 0));
	tw_msg_free(m);
	tw_msg_free(NULL);
}
END_TEST

START_TEST(msg_append_copy)
{
	static const char text[] = "abc";
	tw_stats before = stats_now(), st;
	const tw_slice *f;
	tw_msg *m;
	ck_assert_int_eq(tw_msg_new(&m), 0);
	ck_assert_int_eq(tw_msg_append_copy(m, text, 3), 0);
	ck_assert_int_eq(tw_msg_append_copy(m, NULL, 0), 0);
	ck_assert_int_eq(tw_msg_append_copy(m, NULL, 5), TW_EINVAL);
	ck_assert_int_eq(tw_msg_append_copy(NULL, text, 3), TW_EINVAL);
	ck_assert_uint_eq(tw_msg_nframes(m), 2);
	ck_assert_uint_eq(tw_msg_bytes(m), 3);
	f = tw_msg_frame(m, 0);
	ck_assert_uint_eq(f->len, 3);
	ck_assert_ptr_ne(tw_slice_data(f), (const uint8_t *)text);
	ck_assert_mem_eq(tw_slice_data(f), text, 3);
	ck_assert_uint_eq(tw_msg_frame(m, 1)->len, 0);
	ck_assert_ptr_null(tw_msg_frame(m, 2));
	st = stats_now();
	ck_assert_uint_eq(st.payload_bytes_copied, before.payload_bytes_copied + 3);
	ck_assert_uint_eq(st.blocks_live, before.blocks_live + 2);
	tw_msg_free(m);
	st = stats_now();
	ck_assert_uint_eq(st.blocks_live, before.blocks_live);
	ck_assert_uint_eq(st.block_bytes_live, before.block_bytes_live);
}
END_TEST

START_TEST(msg_append_ref)
{
	static const char text[] = "zero copy";
	struct release_log log = {0, NULL, NULL};
	tw_stats before = stats_now(), st;
	tw_msg *m;
	ck_assert_int_eq(tw_msg_new(&m), 0);
	ck_assert_int_eq(tw_msg_append_ref(m, text, 9, on_release, &log), 0);
	ck_assert_int_eq(tw_msg_append_ref(m, NULL, 7, on_release, &log), TW_EINVAL);
	ck_assert_uint_eq(tw_msg_nframes(m), 1);
	ck_assert_uint_eq(tw_msg_bytes(m), 9);
	ck_assert_ptr_eq(tw_slice_data(tw_msg_frame(m, 0)), (const uint8_t *)text);
	st = stats_now();
	ck_assert_uint_eq(st.payload_bytes_copied, before.payload_bytes_copied);
	ck_assert_ptr_eq(tw_msg_hold(m), m);
	tw_msg_free(m);
	ck_assert_int_eq(log.calls, 0);
	tw_msg_free(m);
	ck_assert_int_eq(log.calls, 1);
	ck_assert_ptr_eq(log.data, text);
}
END_TEST

/* tw_msg_append holds its own reference on the frame's block. */
START_TEST(msg_append_slice)
{
	char buf[10] = "0123456789";
	struct release_log log = {0, NULL, NULL};
	tw_slice s;
	tw_block *b;
	tw_msg *m;
	ck_assert_int_eq(tw_block_wrap(buf, 10, on_release, &log, &b), 0);
	ck_assert_int_eq(tw_msg_new(&m), 0);
	s = tw__slice(b, 2, 4);
	ck_assert_int_eq(tw_msg_append(m, &s), 0);
	s = tw__slice(b, 10, 0);
	ck_assert_int_eq(tw_msg_append(m, &s), 0);
	s = tw__slice(NULL, 0, 0);
	ck_assert_int_eq(tw_msg_append(m, &s), 0);
	tw_block_free(b);
	ck_assert_int_eq(log.calls, 0);
	ck_assert_uint_eq(tw_msg_nframes(m), 3);
	ck_assert_uint_eq(tw_msg_bytes(m), 4);
	ck_assert_ptr_eq(tw_msg_frame(m, 0)->block, b);
	ck_assert_uint_eq(tw_msg_frame(m, 0)->offset, 2);
	ck_assert_mem_eq(tw_slice_data(tw_msg_frame(m, 0)), "2345", 4);
	tw_msg_free(m);
	ck_assert_int_eq(log.calls, 1);
}
END_TEST

START_TEST(msg_append_invalid)
{
	struct release_log log = {0, NULL, NULL};
	char buf[10];
	tw_slice bad[] = {{NULL, 0, 1}, {NULL, 0, 0}, {NULL, 0, 0}, {NULL, 0, 0}, {NULL, 0, 0}};
	tw_block *b;
	tw_msg *m;
	ck_assert_int_eq(tw_block_wrap(buf, 10, on_release, &log, &b), 0);
	bad[1] = tw__slice(b, 11, 0);       /* offset past the end */
	bad[2] = tw__slice(b, 5, 6);        /* runs past the end */
	bad[3] = tw__slice(b, 1, SIZE_MAX); /* offset + len overflows */
	bad[4] = tw__slice(b, SIZE_MAX, 2);
	ck_assert_int_eq(tw_msg_new(&m), 0);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		ck_assert_int_eq(tw_msg_append(m, &bad[i]), TW_EINVAL);
	ck_assert_int_eq(tw_msg_append(m, NULL), TW_EINVAL);
	ck_assert_int_eq(tw_msg_append(NULL, &bad[0]), TW_EINVAL);
	ck_assert_uint_eq(tw_msg_nframes(m), 0);
	ck_assert_uint_eq(tw_msg_bytes(m), 0);
	tw_msg_free(m);
	/* No reference was taken by the failed appends. */
	tw_block_free(b);
	ck_assert_int_eq(log.calls, 1);
}
END_TEST

/* tw_stats as an older or a newer program was compiled: an older one's
 * smaller struct gets its fields and nothing past them; a newer one's
 * larger struct gets zeros in the fields this library lacks. */
/* A packing buffer that failed refuses every later write, even of zero
 * bytes, and no frame comes of it (a failure may leave no memory at all:
 * a zero-length write must not memcpy to NULL). */
START_TEST(packbuf_refuses_after_failure)
{
	struct tw__packbuf pb;
	tw_msg *m;
	tw__packbuf_init(&pb);
	ck_assert_int_eq(tw__packbuf_write(&pb, "x", SIZE_MAX), -1); /* no room can hold it */
	ck_assert_int_eq(tw__packbuf_write(&pb, "", 0), -1);
	ck_assert_int_eq(tw__packbuf_write(&pb, "y", 1), -1);
	ck_assert_int_eq(tw__packbuf_write(&pb, "yz", 2), -1);
	ck_assert_int_eq(tw_msg_new(&m), 0);
	ck_assert_int_eq(tw__packbuf_append(m, &pb), TW_ENOMEM);
	ck_assert_uint_eq(tw_msg_nframes(m), 0);
	tw_msg_free(m);
	/* after a good write, the same */
	ck_assert_int_eq(tw__packbuf_write(&pb, "ab", 2), 0);
	ck_assert_int_eq(tw__packbuf_write(&pb, "x", SIZE_MAX - 1), -1);
	ck_assert_int_eq(tw__packbuf_write(&pb, "", 0), -1);
	ck_assert_int_eq(tw__packbuf_write(&pb, "c", 1), -1);
	tw__packbuf_fini(&pb);
}
END_TEST

START_TEST(stats_sized)
{
	union {
		tw_stats st;
		uint8_t bytes[sizeof(tw_stats) + 64];
	} u;
	size_t old = offsetof(tw_stats, blocks_allocated);
	tw_block *b;
	ck_assert_int_eq(tw_block_new(100, &b), 0);
	memset(&u, 0xAB, sizeof(u));
	tw_stats_global(&u.st, old);
	for (size_t i = old; i < sizeof(u); i++)
		ck_assert_uint_eq(u.bytes[i], 0xAB);
	ck_assert_uint_ne(u.st.msgs_sent, 0xABABABABABABABABull);
	memset(&u, 0xAB, sizeof(u));
	tw_stats_global(&u.st, sizeof(u));
	ck_assert_uint_ge(u.st.block_bytes_live, 100);
	for (size_t i = sizeof(tw_stats); i < sizeof(u); i++)
		ck_assert_uint_eq(u.bytes[i], 0);
	memset(&u, 0xAB, sizeof(u));
	tw_stats_global(&u.st, sizeof(u.st));
	ck_assert_uint_ge(u.st.block_bytes_live, 100);
	ck_assert_uint_eq(u.bytes[sizeof(tw_stats)], 0xAB);
	tw_stats_global(NULL, 0);
	tw_block_free(b);
}
END_TEST

START_TEST(msg_many_frames)
{
	tw_stats before = stats_now(), st;
	uint64_t sum = 0;
	tw_msg *m;
	uint8_t data[64];
	for (size_t i = 0; i < sizeof(data); i++)
		data[i] = (uint8_t)i;
	ck_assert_int_eq(tw_msg_new(&m), 0);
	for (size_t i = 0; i < 1000; i++) {
		ck_assert_int_eq(tw_msg_append_copy(m, data, i % 65), 0);
		sum += i % 65;
	}
	ck_assert_uint_eq(tw_msg_nframes(m), 1000);
	ck_assert_uint_eq(tw_msg_bytes(m), sum);
	for (size_t i = 0; i < 1000; i++) {
		const tw_slice *f = tw_msg_frame(m, i);
		REQUIRE(f->len == i % 65);
		if (f->len > 0)
			REQUIRE(memcmp(tw_slice_data(f), data, f->len) == 0);
	}
	tw_msg_free(m);
	st = stats_now();
	ck_assert_uint_eq(st.blocks_live, before.blocks_live);
	ck_assert_uint_eq(st.block_bytes_live, before.block_bytes_live);
}
END_TEST

static int remove_one(const char *path, const struct stat *st, int type, struct FTW *ftw)
{
	(void)st, (void)type, (void)ftw;
	return remove(path);
}

/* Writes text to the file dir/name (dir/sub made first when given). */
static void put_file(const char *dir, const char *sub, const char *name, const char *text)
{
	char path[512];
	FILE *f;
	if (sub != NULL) {
		snprintf(path, sizeof(path), "%s/%s", dir, sub);
		REQUIRE(mkdir(path, 0700) == 0 || errno == EEXIST);
	}
	snprintf(path, sizeof(path), "%s/%s%s%s", dir, sub != NULL ? sub : "",
		 sub != NULL ? "/" : "", name);
	REQUIRE((f = fopen(path, "w")) != NULL);
	REQUIRE(fputs(text, f) >= 0);
	REQUIRE(fclose(f) == 0);
}

/* The budgets' default follows the least limit Dask's memory_limit()
 * reads (distributed/system.py): cgroup v1 and v2 files at the root,
 * the process's own cgroup, RLIMIT_RSS; "max" and missing files count
 * for nothing. */
START_TEST(memory_limit_follows_cgroups)
{
	char root[] = "/tmp/tw-memlimit-XXXXXX", cgroups[600], mem[600];
	long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGESIZE);
	uint64_t phys = (uint64_t)pages * (uint64_t)size;
	struct rlimit rss;
	REQUIRE(pages > 0 && size > 0);
	REQUIRE(getrlimit(RLIMIT_RSS, &rss) == 0);
	REQUIRE(rss.rlim_max == RLIM_INFINITY || rss.rlim_max > ((uint64_t)64 << 20));
	if (rss.rlim_max != RLIM_INFINITY && rss.rlim_max < phys)
		phys = rss.rlim_max;
	REQUIRE(mkdtemp(root) != NULL);
	snprintf(cgroups, sizeof(cgroups), "%s/cgroup", root);
	snprintf(mem, sizeof(mem), "%s/memory", root);
	ck_assert_uint_eq(tw__memory_limit(root, cgroups), phys); /* nothing set */
	put_file(root, NULL, "memory.max", "max\n");
	ck_assert_uint_eq(tw__memory_limit(root, cgroups), phys);
	put_file(root, NULL, "memory.max", "1073741824\n");
	ck_assert_uint_eq(tw__memory_limit(root, cgroups), (uint64_t)1 << 30);
	put_file(root, NULL, "memory.high", "805306368\n");
	ck_assert_uint_eq(tw__memory_limit(root, cgroups), (uint64_t)768 << 20);
	put_file(root, "memory", "memory.limit_in_bytes", "9223372036854771712\n"); /* v1: none */
	ck_assert_uint_eq(tw__memory_limit(root, cgroups), (uint64_t)768 << 20);
	put_file(root, "memory", "memory.soft_limit_in_bytes", "536870912\n");
	ck_assert_uint_eq(tw__memory_limit(root, cgroups), (uint64_t)512 << 20);
	/* the process's own cgroups, v1 and v2, below the root */
	put_file(root, NULL, "cgroup", "4:memory:/svc\n0::/svc2\n1:cpu:/svc\n");
	ck_assert_uint_eq(tw__memory_limit(root, cgroups), (uint64_t)512 << 20);
	put_file(mem, "svc", "memory.limit_in_bytes", "268435456\n");
	ck_assert_uint_eq(tw__memory_limit(root, cgroups), (uint64_t)256 << 20);
	put_file(root, "svc2", "memory.max", "134217728\n");
	ck_assert_uint_eq(tw__memory_limit(root, cgroups), (uint64_t)128 << 20);
	/* RLIMIT_RSS's hard limit (Linux ignores it; Dask reads it) */
	rss.rlim_cur = rss.rlim_max = (rlim_t)64 << 20;
	REQUIRE(setrlimit(RLIMIT_RSS, &rss) == 0);
	ck_assert_uint_eq(tw__memory_limit(root, cgroups), (uint64_t)64 << 20);
	/* the default budgets: a quarter, at least 256 MiB */
	ck_assert_uint_eq(tw__budget_default_bytes(), (uint64_t)256 << 20);
	REQUIRE(nftw(root, remove_one, 8, FTW_DEPTH | FTW_PHYS) == 0);
}
END_TEST

int main(void)
{
	TCase *blocks = ts_tcase(
		"blocks", 0,
		TS_TESTS(block_sizes, block_large_is_mapped, block_hold_free, block_bad_args,
			 block_wrap_release_once, block_wrap_empty_and_no_release, block_cache,
			 block_cache_stats, block_lazy_commit, block_commit_rlimit, slice_data,
			 block_free_unmaps_off_thread, budget_rules, budget_cuts_slow_hoarders,
			 budget_waits_for_pausers, budget_last_step_all_ready,
			 budget_burst_does_not_reset_slow, budget_cuts_still_holders,
			 budget_waiters_alone_past_the_bound, budget_express_beside_slow_passer,
			 budget_express_beside_lagging_passer, budget_skipped_waiter_passes,
			 budget_counts_block_cache, budget_bounds_cache_put));
	TCase *msgs = ts_tcase("msg", 0,
			       TS_TESTS(msg_empty, msg_append_copy, msg_append_ref,
					msg_append_slice, msg_append_invalid, msg_many_frames,
					packbuf_refuses_after_failure, stats_sized));
	TCase *limits = ts_tcase("memlimit", 0, TS_TESTS(memory_limit_follows_cgroups));
	return ts_main("buf", 0, TS_CASES(blocks, msgs, limits));
}
