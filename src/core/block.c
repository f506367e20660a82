/* SPDX-License-Identifier: BSD-3-Clause */
/* Refcounted blocks (include/taskwire/buf.h).
 *
 * Small blocks are one malloc (header and bytes together). Large blocks are
 * mmap'd on their own so that freeing one returns its pages to the OS at
 * once (glibc would keep a heap chunk), and so that a large frame never
 * shares memory with a small neighbour. Released large mappings go to a
 * bounded cache because touching fresh pages costs more than the copy we
 * avoid (docs/design.md, Blocks, slices, messages). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <taskwire/error.h>

#include "core/block.h"
#include "core/pass.h"
#include "core/reclaim.h"
#include "core/stats.h"

enum kind { KIND_HEAP, KIND_MAP, KIND_WRAP };

struct tw_block {
	_Atomic size_t refs;
	uint8_t *data;
	size_t size;
	size_t map_len;   /* KIND_MAP: bytes mapped (page multiple) */
	size_t committed; /* KIND_MAP: bytes usable from the start; the rest PROT_NONE */
	uint8_t kind;     /* enum kind */
	uint8_t uncached; /* trimmed reservations: odd sizes the cache would never reuse */
	uint8_t cached;   /* KIND_MAP: a mapping from the cache, its pages in already */
	/* KIND_MAP receivers: the last prefault of the window
	 * (tw__prefault's number; 0: none, or ask mincore) */
	uint32_t pseq;
	union { /* 64 bytes in all: the header of every small message */
		struct {
			void (*release)(void *data, void *arg);
			void *arg;
		} wrap; /* KIND_WRAP */
		/* KIND_MAP receivers (tw__block_commit): bytes from the
		 * start known faulted in; in pages, the furthest write seen
		 * and the end of what was handed to the prefaulter. */
		struct {
			size_t hot;
			uint32_t wpos, warm;
		} map;
	} u;
};

_Static_assert(sizeof(struct tw_block) <= 64, "a small block's header is one cache line");
#define HDR_BYTES   ((sizeof(struct tw_block) + 63) & ~(size_t)63)
#define CACHE_SLOTS 16

static struct {
	pthread_mutex_t lock;
	size_t limit;
	_Atomic size_t bytes; /* changed under lock, read without (tw__block_cache_bytes) */
	size_t n;
	struct {
		void *p;
		size_t len;
	} slot[CACHE_SLOTS];
} cache = {PTHREAD_MUTEX_INITIALIZER, (size_t)256 << 20, 0, 0, {{0, 0}}};

static size_t page_round(size_t n)
{
	size_t pg = (size_t)sysconf(_SC_PAGESIZE);
	return (n + pg - 1) & ~(pg - 1);
}

/* Take a cached mapping of exactly `len` bytes, or NULL. */
static void *cache_take(size_t len)
{
	void *p = NULL;
	pthread_mutex_lock(&cache.lock);
	for (size_t i = 0; i < cache.n; i++) {
		if (cache.slot[i].len != len)
			continue;
		p = cache.slot[i].p;
		cache.slot[i] = cache.slot[--cache.n];
		cache.bytes -= len;
		break;
	}
	pthread_mutex_unlock(&cache.lock);
	return p;
}

/* The largest cached mapping of at most cap bytes (its length in *len),
 * or NULL. */
static void *cache_take_le(size_t cap, size_t *len)
{
	void *p = NULL;
	size_t best = 0, bi = 0;
	pthread_mutex_lock(&cache.lock);
	for (size_t i = 0; i < cache.n; i++)
		if (cache.slot[i].len <= cap && cache.slot[i].len > best)
			best = cache.slot[i].len, bi = i;
	if (best > 0) {
		p = cache.slot[bi].p;
		cache.slot[bi] = cache.slot[--cache.n];
		cache.bytes -= best;
	}
	pthread_mutex_unlock(&cache.lock);
	*len = best;
	return p;
}

/* Drop the oldest cached mapping; cache.lock held. */
static void evict_oldest(void)
{
	tw__unmap(cache.slot[0].p, cache.slot[0].len, cache.slot[0].len);
	cache.bytes -= cache.slot[0].len;
	cache.n--;
	memmove(&cache.slot[0], &cache.slot[1], cache.n * sizeof(cache.slot[0]));
}

/* Receive budgets with comms waiting (tw__block_cache_bypass). */
static atomic_int bypass;

/* The receive budgets watching the cache (tw__block_cache_watch); cache.lock. */
static struct tw__cache_room rooms = {&rooms, &rooms, 0};

/* What the cache may hold: its limit, and within what every watching
 * budget leaves (the least room), less the bytes still resident with the
 * reclaimer or prefaulted ahead, which those budgets count too
 * (core/budget.c need_for); cache.lock held. Without this, a block freed
 * while nobody looked at a budget (an application freeing its large
 * messages) went to the cache on top of the reservations until the
 * budget's next look. */
static size_t cache_keep(void)
{
	uint64_t room = cache.limit, other = tw__reclaim_pending() + tw__block_warm_ahead();
	for (const struct tw__cache_room *r = rooms.next; r != &rooms; r = r->next) {
		uint64_t b = atomic_load_explicit(&r->bytes, memory_order_relaxed);
		room = b < room ? b : room;
	}
	return room > other ? (size_t)(room - other) : 0;
}

void tw__block_cache_watch(struct tw__cache_room *r)
{
	pthread_mutex_lock(&cache.lock);
	r->next = &rooms;
	r->prev = rooms.prev;
	rooms.prev->next = r;
	rooms.prev = r;
	pthread_mutex_unlock(&cache.lock);
}

void tw__block_cache_unwatch(struct tw__cache_room *r)
{
	if (r->next == NULL)
		return;
	pthread_mutex_lock(&cache.lock);
	r->prev->next = r->next;
	r->next->prev = r->prev;
	r->next = r->prev = NULL;
	pthread_mutex_unlock(&cache.lock);
}

/* Keep a released mapping for reuse, evicting the oldest past what the
 * cache may hold (cache_keep); one that does not fit goes back to the
 * system (the reclaimer unmaps it when large). */
static void cache_put(void *p, size_t len)
{
	size_t keep;
	pthread_mutex_lock(&cache.lock);
	keep = cache_keep();
	if (len <= keep && atomic_load_explicit(&bypass, memory_order_relaxed) == 0) {
		while (cache.n > 0 && (cache.bytes + len > keep || cache.n == CACHE_SLOTS))
			evict_oldest();
		cache.slot[cache.n].p = p;
		cache.slot[cache.n].len = len;
		cache.n++;
		cache.bytes += len;
		p = NULL;
	}
	pthread_mutex_unlock(&cache.lock);
	if (p != NULL)
		tw__unmap(p, len, len);
}

void tw__block_cache_drain(void)
{
	pthread_mutex_lock(&cache.lock);
	for (size_t i = 0; i < cache.n; i++)
		tw__unmap(cache.slot[i].p, cache.slot[i].len, cache.slot[i].len);
	cache.n = 0;
	cache.bytes = 0;
	pthread_mutex_unlock(&cache.lock);
	tw__reclaim_wait(); /* callers count on the memory being back */
}

size_t tw__block_cache_bytes(void)
{
	return atomic_load_explicit(&cache.bytes, memory_order_relaxed);
}

void tw__block_cache_trim(size_t keep)
{
	pthread_mutex_lock(&cache.lock);
	while (cache.n > 0 && cache.bytes > keep)
		evict_oldest();
	pthread_mutex_unlock(&cache.lock);
}

void tw__block_cache_bypass(int on)
{
	atomic_fetch_add_explicit(&bypass, on ? 1 : -1, memory_order_relaxed);
}

void tw_block_cache_set_limit(size_t bytes)
{
	pthread_mutex_lock(&cache.lock);
	cache.limit = bytes;
	pthread_mutex_unlock(&cache.lock);
	tw__block_cache_drain();
}

static void count_new(size_t size)
{
	TW__ADD(&tw__global_stats, blocks_allocated, 1);
	TW__ADD(&tw__global_stats, block_bytes_allocated, size);
	TW__ADD(&tw__global_stats, blocks_live, 1);
	TW__ADD(&tw__global_stats, block_bytes_live, size);
}

/* One reference, the caller's; counted unless it wraps caller memory. */
static tw_block *init(struct tw_block *b, uint8_t *data, size_t size, size_t map_len,
		      enum kind kind)
{
	atomic_init(&b->refs, 1);
	b->data = data;
	b->size = size;
	b->map_len = map_len;
	b->committed = map_len;
	b->kind = (uint8_t)kind;
	b->uncached = 0;
	b->cached = 0;
	b->pseq = 0;
	memset(&b->u, 0, sizeof(b->u));
	if (kind != KIND_WRAP)
		count_new(size);
	return b;
}

/* Address space with no commit charge: a peer's declared size costs
 * nothing until its bytes arrive. Usable at once (PROT_READ|WRITE), or,
 * for a receiver (lazy), only once tw__block_commit makes it so: strict
 * overcommit (vm.overcommit_memory=2) ignores MAP_NORESERVE, and
 * RLIMIT_DATA counts every writable private page, but neither charges
 * PROT_NONE pages until they are made writable. */
static void *map_fresh(size_t len, int lazy)
{
	int prot = lazy ? PROT_NONE : PROT_READ | PROT_WRITE;
	void *p = mmap(NULL, len, prot, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	return p == MAP_FAILED ? NULL : p;
}

static int new_mapped(size_t size, int lazy, tw_block **out)
{
	struct tw_block *b = malloc(sizeof(*b));
	size_t len = page_round(size), committed = len;
	void *p;
	int hit = 0;
	if (b == NULL)
		return TW_ENOMEM;
	if ((p = cache_take(len)) != NULL) {
		TW__ADD(&tw__global_stats, block_cache_hits, 1);
		hit = 1;
	} else if ((p = map_fresh(len, lazy)) == NULL) {
		free(b);
		return TW_ENOMEM;
	} else if (lazy) {
		committed = 0;
	}
	*out = init(b, p, size, len, KIND_MAP);
	b->committed = committed;
	b->cached = (uint8_t)hit;
	return 0;
}

int tw_block_new(size_t size, tw_block **out)
{
	struct tw_block *b;
	if (out == NULL)
		return TW_EINVAL;
	if (size >= TW__MAP_MIN_BYTES)
		return new_mapped(size, 0, out);
	if ((b = malloc(HDR_BYTES + size)) == NULL)
		return TW_ENOMEM;
	*out = init(b, (uint8_t *)b + HDR_BYTES, size, 0, KIND_HEAP);
	return 0;
}

int tw__block_new_lazy(size_t size, tw_block **out)
{
	int rv;
	if (size <= TW__COMMIT_MIN_BYTES)
		return tw_block_new(size, out);
	if ((rv = new_mapped(size, 1, out)) == 0 && size < TW__MAP_MIN_BYTES)
		(*out)->uncached = 1; /* mid-size: would only churn the cache */
	return rv;
}

/* Make usable a step past off (a quarter of what is usable, at least
 * TW__COMMIT_MIN_BYTES): few mprotect calls for a large frame, and a peer
 * that stops early holds at most a step more than it sent. */
static int commit_step(tw_block *b, size_t off)
{
	size_t step =
		b->committed / 4 > TW__COMMIT_MIN_BYTES ? b->committed / 4 : TW__COMMIT_MIN_BYTES;
	size_t end = page_round(off + step);
	if (end > b->map_len)
		end = b->map_len;
	if (mprotect(b->data + b->committed, end - b->committed, PROT_READ | PROT_WRITE) != 0)
		return TW_ENOMEM;
	b->committed = end;
	return 0;
}

/* Receivers' pages are faulted in off the loop (issue 17: the page faults
 * of fresh 100 MiB blocks were most of the loop's longest passes): the
 * reclaimer prefaults up to WARM_AHEAD bytes past the writer, topped up
 * in halves, in blocks of at least WARM_MIN_BYTES, within what is usable
 * (so memory still follows the bytes: a step ahead at most). Those bytes
 * count in the receive budgets (tw__block_warm_ahead): resident memory
 * as much as the bytes that arrived. All windows together stay within
 * WARM_TOTAL: a window is resident past its comm's reservation once the
 * comm waits for the budget (it read what it reserved), and 46 waiting
 * comms held 45 MiB so, outside a 1 GiB budget (budget-bench's peak RSS
 * was reserved bytes + windows); a block that finds no room is written
 * to cold pages, a few a pass (tw__pass_cold). */
#define WARM_MIN_BYTES ((size_t)1 << 20)
#define WARM_AHEAD     ((size_t)1 << 20)
#define WARM_TOTAL     ((size_t)8 << 20)

/* Bytes prefaulted (or asked to be) past their blocks' writers. */
static _Atomic uint64_t ahead;

uint64_t tw__block_warm_ahead(void)
{
	return atomic_load_explicit(&ahead, memory_order_relaxed);
}

static unsigned pg_shift(void)
{
	return (unsigned)__builtin_ctzl((unsigned long)sysconf(_SC_PAGESIZE));
}

static size_t wpos_of(const tw_block *b)
{
	return (size_t)b->u.map.wpos << pg_shift();
}

static size_t warm_of(const tw_block *b)
{
	return (size_t)b->u.map.warm << pg_shift();
}

static size_t ahead_of(const tw_block *b)
{
	return warm_of(b) > wpos_of(b) ? warm_of(b) - wpos_of(b) : 0;
}

/* Set the window (page multiples, or off for wpos: its page counts). */
static void set_window(tw_block *b, size_t wpos, size_t warm)
{
	size_t was = ahead_of(b);
	b->u.map.wpos = (uint32_t)(wpos >> pg_shift());
	b->u.map.warm = (uint32_t)(warm >> pg_shift());
	atomic_fetch_add_explicit(&ahead, ahead_of(b) - was, memory_order_relaxed);
}

/* The writer is at off: move the window, prefault its new end. */
static void warm_up(tw_block *b, size_t off)
{
	size_t wpos = off > wpos_of(b) ? off : wpos_of(b), warm = warm_of(b), to, room;
	uint64_t others;
	if (warm < wpos)
		warm = wpos & ~(((size_t)1 << pg_shift()) - 1); /* written meanwhile */
	to = wpos + WARM_AHEAD < b->committed ? wpos + WARM_AHEAD : b->committed;
	/* what the other blocks' windows leave of WARM_TOTAL */
	others = tw__block_warm_ahead() - ahead_of(b);
	room = others < WARM_TOTAL ? WARM_TOTAL - others : 0;
	if (to > wpos + room)
		to = wpos + room;
	to &= ~(((size_t)1 << pg_shift()) - 1);
	if (to > warm && (to - warm >= WARM_AHEAD / 2 || to == b->committed)) {
		size_t from = warm > b->u.map.hot ? warm : b->u.map.hot;
		if (to > from && !b->cached) /* a cached block's pages are in */
			b->pseq = tw__prefault(b->data + from, to - from);
		warm = to;
	}
	set_window(b, wpos, warm);
}

/* The first page from first (a page multiple) up to end that is not
 * faulted in (mincore), or end. */
static size_t resident_to(const tw_block *b, size_t first, size_t end)
{
	size_t pg = (size_t)sysconf(_SC_PAGESIZE), i = 0;
	unsigned char vec[1024];
	while (first < end) {
		size_t n = (end - first) / pg < sizeof(vec) ? (end - first) / pg : sizeof(vec);
		if (mincore(b->data + first, n * pg, vec) != 0)
			break;
		for (i = 0; i < n && (vec[i] & 1); i++)
			;
		first += i * pg;
		if (i < n)
			break;
	}
	return first;
}

/* Of len bytes at off, how many lead up to the first page not faulted in
 * (mincore), at least up to the known hot bytes; looks at most 4 MiB
 * ahead (a comm's pass moves no more). */
static size_t hot_bytes(tw_block *b, size_t off, size_t len)
{
	size_t pg = (size_t)sysconf(_SC_PAGESIZE), first = off & ~(pg - 1), end;
	size_t *hot = &b->u.map.hot;
	/* The window's prefaults are done: its pages are in, and those
	 * past it are not (a block with prefaults is a fresh mapping, or
	 * its cached pages end before the window: tw__block_reserve): no
	 * need to ask the kernel. mincore on every read took a sixth of
	 * a busy loop's time in budget-bench (117,000 calls for 3 GiB). */
	if (tw__prefault_done(b->pseq)) {
		if (*hot < warm_of(b))
			*hot = warm_of(b);
		return off + len <= *hot ? len : *hot > off ? *hot - off : 0;
	}
	if (off + len <= *hot)
		return len;
	if (off < *hot)
		first = *hot;
	end = page_round(off + len);
	if (end - first > ((size_t)4 << 20))
		end = first + ((size_t)4 << 20);
	*hot = resident_to(b, first, end);
	return *hot > off ? (*hot - off < len ? *hot - off : len) : 0;
}

int tw__block_commit(tw_block *b, size_t off, size_t *len)
{
	int rv = 0;
	size_t hot;
	if (b->kind != KIND_MAP)
		return 0;
	if (off + *len > b->committed) {
		if (off >= b->committed) {
			if (commit_step(b, off) != 0)
				return TW_ENOMEM;
			rv = 1;
		}
		if (*len > b->committed - off)
			*len = b->committed - off;
	}
	if (b->map_len >= WARM_MIN_BYTES)
		warm_up(b, off);
	/* Pages not faulted in yet are the pass's to fault in, a few per
	 * pass (core/pass.h); the prefaulter does the rest. */
	hot = hot_bytes(b, off, *len);
	if (hot < *len)
		*len = hot + tw__pass_cold(*len - hot);
	/* The last bytes asked for: the window is written, or never will be
	 * (it counts no more). */
	if (b->map_len >= WARM_MIN_BYTES && off + *len >= b->size)
		set_window(b, warm_of(b), warm_of(b));
	return rv;
}

/* Drafts: a heap block's bytes, filled and grown (realloc) by their only
 * owner before the header is written; packing a small message this way
 * costs one malloc, not a buffer plus a wrapper. */
uint8_t *tw__block_draft(size_t cap)
{
	uint8_t *p = malloc(HDR_BYTES + cap);
	return p != NULL ? p + HDR_BYTES : NULL;
}

uint8_t *tw__block_draft_grow(uint8_t *data, size_t cap)
{
	uint8_t *p = realloc(data - HDR_BYTES, HDR_BYTES + cap);
	return p != NULL ? p + HDR_BYTES : NULL;
}

void tw__block_draft_free(uint8_t *data)
{
	if (data != NULL)
		free(data - HDR_BYTES);
}

tw_block *tw__block_seal(uint8_t *data, size_t size)
{
	return init((struct tw_block *)(void *)(data - HDR_BYTES), data, size, 0, KIND_HEAP);
}

int tw__block_reserve(size_t capacity, tw_block **out)
{
	struct tw_block *b = malloc(sizeof(*b));
	size_t len = page_round(capacity ? capacity : 1), qlen = 0;
	void *p, *q;
	if (b == NULL)
		return TW_ENOMEM;
	if ((p = map_fresh(len, 1)) == NULL) {
		free(b);
		return TW_ENOMEM;
	}
	/* Move already-touched cached pages to the front of the reservation:
	 * faulting in fresh pages costs more than the bytes we receive. */
	if ((q = cache_take_le(len, &qlen)) != NULL &&
	    mremap(q, qlen, qlen, MREMAP_MAYMOVE | MREMAP_FIXED, p) == MAP_FAILED) {
		munmap(q, qlen);
		qlen = 0;
	}
	*out = init(b, p, capacity, len, KIND_MAP);
	b->committed = qlen;
	b->uncached = 1;
	/* The pages in already are known hot: the prefaulter starts past
	 * them. Else it walked them again (every moved page, 256 KiB per
	 * madvise, one reclaimer wakeup each: per 64 MiB message of a ws echo,
	 * 230 madvise and futex calls on each side, 3-7% of its CPU; issue 20). */
	b->u.map.hot = resident_to(b, 0, qlen);
	return 0;
}

void tw__block_trim(tw_block *b, size_t size)
{
	size_t keep = page_round(size ? size : 1);
	if (b->kind != KIND_MAP || size > b->size)
		return;
	if (keep < b->map_len) {
		munmap(b->data + keep, b->map_len - keep);
		b->map_len = keep;
	}
	if (b->committed > keep)
		b->committed = keep;
	if (warm_of(b) > keep) /* the window past the end is gone */
		set_window(b, wpos_of(b) < keep ? wpos_of(b) : keep, keep);
	if (b->u.map.hot > keep)
		b->u.map.hot = keep;
	TW__SUB(&tw__global_stats, block_bytes_live, b->size - size);
	TW__SUB(&tw__global_stats, block_bytes_allocated, b->size - size);
	b->size = size;
	b->uncached = 0; /* trimmed to its size: the cache may reuse it */
}

int tw_block_wrap(void *data, size_t size, void (*release)(void *, void *), void *arg,
		  tw_block **out)
{
	struct tw_block *b;
	if (out == NULL || (data == NULL && size > 0))
		return TW_EINVAL;
	if ((b = malloc(sizeof(*b))) == NULL)
		return TW_ENOMEM;
	*out = init(b, data, size, 0, KIND_WRAP);
	b->u.wrap.release = release;
	b->u.wrap.arg = arg;
	return 0;
}

void *tw__block_wrap_arg(const tw_block *b, void (*release)(void *, void *))
{
	return b != NULL && b->kind == KIND_WRAP && b->u.wrap.release == release ? b->u.wrap.arg
										 : NULL;
}

tw_block *tw_block_hold(tw_block *b)
{
	atomic_fetch_add_explicit(&b->refs, 1, memory_order_relaxed);
	return b;
}

void tw_block_free(tw_block *b)
{
	if (b == NULL || atomic_fetch_sub_explicit(&b->refs, 1, memory_order_acq_rel) != 1)
		return;
	switch (b->kind) {
	case KIND_WRAP:
		if (b->u.wrap.release != NULL)
			b->u.wrap.release(b->data, b->u.wrap.arg);
		free(b);
		return;
	case KIND_MAP:
		atomic_fetch_sub_explicit(&ahead, ahead_of(b), memory_order_relaxed);
		/* The cache hands out usable pages only. Large unmaps run on
		 * the reclaimer: this may be the loop thread (issue 17); so do
		 * those of prefaulted blocks, after their prefaults. */
		if (b->uncached || b->committed < b->map_len)
			tw__unmap(b->data, b->map_len, b->u.map.warm > 0 ? SIZE_MAX : b->committed);
		else
			cache_put(b->data, b->map_len);
		break;
	case KIND_HEAP: break;
	}
	TW__SUB(&tw__global_stats, blocks_live, 1);
	TW__SUB(&tw__global_stats, block_bytes_live, b->size);
	free(b);
}

uint8_t *tw_block_data(const tw_block *b)
{
	return b->data;
}

size_t tw__block_overhead(void)
{
	return HDR_BYTES + 16; /* 16: malloc's chunk header and rounding */
}

int tw__block_sole(const tw_block *b)
{
	/* acquire: the other holders' reads of the bytes come before our
	 * writes, as tw_block_free's release orders them */
	return atomic_load_explicit(&b->refs, memory_order_acquire) == 1;
}

size_t tw_block_size(const tw_block *b)
{
	return b->size;
}

uint8_t *tw_slice_data(const tw_slice *s)
{
	return s->block == NULL ? NULL : s->block->data + s->offset;
}
