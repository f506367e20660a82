/* SPDX-License-Identifier: BSD-3-Clause */
/* Reading Dask messages: frame 0 and its payload groups, decompressed
 * and merged (include/taskwire/serial.h; Dask's
 * distributed/protocol/core.py loads and serialize.py
 * merge_and_deserialize). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <taskwire/error.h>
#include <taskwire/merge.h>
#include <taskwire/relay.h>
#include <taskwire/serial.h>

#include "core/block.h"
#include "core/stats.h"
#include "protocol/compress.h"
#include "protocol/decode.h"
#include "protocol/mpcheck.h"
#include "protocol/placeholder.h"

struct tw_decoded {
	tw_msg *msg;
	msgpack_zone *zone; /* &zone_mem once initialised; tw_decode puts d in it */
	msgpack_zone zone_mem;
	msgpack_object root;
	tw_payload *payloads;
	const msgpack_object **holders; /* placeholder map of each payload */
	size_t n, cap;
	tw_slice *slices; /* every logical frame, one reference each */
	size_t nslices, slices_cap;
	uint64_t budget; /* decompressed and unpacked bytes still allowed */
	uint8_t *used;   /* frames claimed by frame 0 or a payload group */
	size_t *order;   /* payload indices sorted by placeholder address */
	uint8_t *raw;    /* per payload: its frames are its sub-frames (tw__decoded_raw) */
	/* the last sub-header unpacked: its bytes, object, cost, serializer */
	const uint8_t *last_sub;
	size_t last_sub_len;
	const msgpack_object *last_obj;
	uint64_t last_cost;
	const char *last_serializer;
	char *detail;
	size_t detail_len;
	uint8_t used_inline[16]; /* `used` of messages with few frames */
	size_t relay_from;       /* first relay frame (they are the tail), or the count */
	uint64_t *starts;        /* relay messages: the groups' indices, sorted */
};

/* Claim flags for the message's frames, zeroed. */
static int alloc_used(tw_decoded *d)
{
	size_t n = tw_msg_nframes(d->msg);
	if (n <= sizeof(d->used_inline)) {
		memset(d->used_inline, 0, sizeof(d->used_inline));
		d->used = d->used_inline;
		return 0;
	}
	return (d->used = calloc(n, 1)) != NULL ? 0 : TW_ENOMEM;
}

static void free_used(tw_decoded *d)
{
	if (d->used != d->used_inline)
		free(d->used);
	d->used = NULL;
}

/* Most frames 0 are small: start the zone small too, at a size glibc
 * serves from its per-thread cache (chunks up to 1032 bytes with the
 * zone's 8-byte header). */
#define ZONE_CHUNK 1024

static int init_zone(tw_decoded *d)
{
	if (!msgpack_zone_init(&d->zone_mem, ZONE_CHUNK))
		return TW_ENOMEM;
	d->zone = &d->zone_mem;
	return 0;
}

/* A decoded message lives at the start of its own zone: one allocation
 * for both (two on every small RPC otherwise). msgpack_zone holds no
 * pointer to itself, so it moves by assignment, as msgpack_zone_swap
 * moves it. */
static tw_decoded *new_decoded(void)
{
	msgpack_zone z;
	tw_decoded *d;
	if (!msgpack_zone_init(&z, ZONE_CHUNK))
		return NULL;
	if ((d = msgpack_zone_malloc(&z, sizeof(*d))) == NULL) {
		msgpack_zone_destroy(&z);
		return NULL;
	}
	memset(d, 0, sizeof(*d));
	d->zone_mem = z;
	d->zone = &d->zone_mem;
	return d;
}

static void fini_zone(tw_decoded *d)
{
	if (d->zone != NULL)
		msgpack_zone_destroy(d->zone);
	d->zone = NULL;
}

static int fail(tw_decoded *d, int err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static int fail(tw_decoded *d, int err, const char *fmt, ...)
{
	va_list ap;
	if (d->detail != NULL && d->detail_len > 0) {
		va_start(ap, fmt);
		vsnprintf(d->detail, d->detail_len, fmt, ap);
		va_end(ap);
	}
	return err;
}

const msgpack_object *tw_msgpack_map_get(const msgpack_object *m, const char *key)
{
	size_t n = strlen(key);
	if (m == NULL || m->type != MSGPACK_OBJECT_MAP)
		return NULL;
	/* from the end: of duplicate keys the last counts, as in the dict
	 * Python's msgpack makes of the same bytes */
	for (uint32_t i = m->via.map.size; i-- > 0;) {
		const msgpack_object *k = &m->via.map.ptr[i].key;
		if (k->type == MSGPACK_OBJECT_STR && k->via.str.size == n &&
		    memcmp(k->via.str.ptr, key, n) == 0)
			return &m->via.map.ptr[i].val;
	}
	return NULL;
}

int tw_msgpack_str_eq(const msgpack_object *o, const char *s)
{
	/* no strlen: most comparisons (keys, op names) fail at once */
	if (o == NULL || o->type != MSGPACK_OBJECT_STR)
		return 0;
	for (uint32_t i = 0; i < o->via.str.size; i++)
		if (s[i] == '\0' || s[i] != o->via.str.ptr[i])
			return 0;
	return s[o->via.str.size] == '\0';
}

/* The zone's chunks start small (ZONE_CHUNK) and double each time an
 * unpack needed a new one, up to ZONE_CHUNK_MAX: a message of 100,000
 * sub-headers (a Dask gather of small results) unpacks into some 40 MB,
 * which took 40,000 mallocs of 1 KiB (10% of tw-mini-scheduler's CPU in
 * that round, issue 16) and now takes some hundreds. */
#define ZONE_CHUNK_MAX ((size_t)64 << 10)

static void grow_zone(tw_decoded *d, const msgpack_zone_chunk *head)
{
	if (d->zone->chunk_list.head != head && d->zone->chunk_size < ZONE_CHUNK_MAX)
		d->zone->chunk_size *= 2;
}

/* Check, then unpack frame i into the zone. Its objects are charged to
 * the message's budget like decompressed bytes: msgpack-c makes a 24-byte
 * object per element, so a frame of one-byte nils would take 24 times
 * its size. */
static int unpack_frame(tw_decoded *d, size_t i, msgpack_object *out)
{
	const tw_slice *f = tw_msg_frame(d->msg, i);
	const char *why;
	uint64_t elems, bytes;
	size_t off = 0;
	msgpack_zone_chunk *head;
	if (tw__mp_check(tw_slice_data(f), f->len, &elems, &why) != 0)
		return fail(d, TW_EPROTO, "frame %zu: %s", i, why);
	bytes = elems * sizeof(msgpack_object); /* elems <= f->len: no overflow */
	if (bytes > d->budget)
		return fail(d, TW_ETOOBIG,
			    "frame %zu unpacks into %llu objects (%llu bytes), above the "
			    "message limit left (%llu bytes)",
			    i, (unsigned long long)elems, (unsigned long long)bytes,
			    (unsigned long long)d->budget);
	d->budget -= bytes;
	head = d->zone->chunk_list.head;
	if (msgpack_unpack((const char *)tw_slice_data(f), f->len, &off, d->zone, out) !=
	    MSGPACK_UNPACK_SUCCESS)
		return fail(d, TW_ENOMEM, "frame %zu: msgpack-c could not unpack it", i);
	grow_zone(d, head);
	return 0;
}

static int add_slice(tw_decoded *d, tw_slice s)
{
	if (d->nslices == d->slices_cap) {
		size_t cap = d->slices_cap ? 2 * d->slices_cap : 8;
		tw_slice *p = realloc(d->slices, cap * sizeof(*p));
		if (p == NULL) {
			tw_block_free(s.block);
			return TW_ENOMEM;
		}
		d->slices = p;
		d->slices_cap = cap;
	}
	d->slices[d->nslices++] = s;
	return 0;
}

/* Decompress the parts of one logical frame straight into one block of
 * their declared total size; uncompressed parts are copied in. */
static int inflate(tw_decoded *d, const tw_slice *parts, const enum tw__codec *codecs, size_t n,
		   size_t first)
{
	uint64_t total = 0, size;
	size_t off = 0, got;
	tw_block *b;
	int rv;
	for (size_t i = 0; i < n; i++) {
		rv = tw__decompressed_size(codecs[i], tw_slice_data(&parts[i]), parts[i].len,
					   d->budget - total, &size);
		if (rv != 0)
			return fail(d, rv, "frame %zu: %s", first + i,
				    rv == TW_ETOOBIG
					    ? "decompressed size or zstd window above the limit"
					    : "corrupt compressed data");
		total += size;
	}
	if (tw_block_new(total, &b) != 0)
		return fail(d, TW_ENOMEM, "out of memory for %llu bytes",
			    (unsigned long long)total);
	for (size_t i = 0; i < n; i++) {
		const uint8_t *src = tw_slice_data(&parts[i]);
		uint64_t cap = total - off;
		if (codecs[i] == TW__CODEC_NONE) {
			memcpy(tw_block_data(b) + off, src, parts[i].len);
			TW__ADD(&tw__global_stats, payload_bytes_copied, parts[i].len);
			off += parts[i].len;
			continue;
		}
		tw__decompressed_size(codecs[i], src, parts[i].len, cap, &size);
		if (tw__decompress(codecs[i], src, parts[i].len, tw_block_data(b) + off, size,
				   &got) != 0) {
			tw_block_free(b);
			return fail(d, TW_EPROTO,
				    "frame %zu: decompressed data differs from its "
				    "declared size or is corrupt",
				    first + i);
		}
		off += got;
	}
	/* A streaming zstd frame's size is the bound of its blocks: what it
	 * did not fill goes back now, not when the message is freed. */
	if (off < total)
		tw__block_trim(b, off);
	d->budget -= off;
	return add_slice(d, (tw_slice){b, 0, off});
}

/* One logical frame from sub-frames [first, first + n). */
static int logical(tw_decoded *d, size_t first, size_t n, const enum tw__codec *codecs)
{
	const tw_slice *parts = tw_msg_frame(d->msg, first);
	tw_slice out;
	for (size_t i = 0; i < n; i++)
		if (codecs[i] != TW__CODEC_NONE)
			return inflate(d, parts, codecs, n, first);
	if (n == 0)
		return add_slice(d, (tw_slice){NULL, 0, 0});
	if (tw_merge(parts, n, &out) != 0)
		return fail(d, TW_ENOMEM, "out of memory merging frames");
	return add_slice(d, out);
}

static int get_uint(const msgpack_object *o, uint64_t *v)
{
	if (o == NULL || o->type != MSGPACK_OBJECT_POSITIVE_INTEGER)
		return -1;
	*v = o->via.u64;
	return 0;
}

/* The codec of each of the num sub-frames ("compression": nil or name). */
#define LOCAL_CODECS 8

/* Into local (LOCAL_CODECS entries) when they fit, else a new array: the
 * caller frees *out unless it is local. */
static int codecs_of(tw_decoded *d, const msgpack_object *sub, uint64_t num, size_t k,
		     enum tw__codec *local, enum tw__codec **out)
{
	const msgpack_object *c = tw_msgpack_map_get(sub, "compression");
	enum tw__codec *codecs = num <= LOCAL_CODECS ? local : calloc(num, sizeof(*codecs));
	if (codecs == NULL)
		return TW_ENOMEM;
	if (codecs == local)
		memset(local, 0, LOCAL_CODECS * sizeof(*local));
	*out = codecs;
	if (c == NULL || c->type == MSGPACK_OBJECT_NIL)
		return 0;
	if (c->type != MSGPACK_OBJECT_ARRAY || c->via.array.size != num)
		return fail(d, TW_EPROTO,
			    "sub-header %zu: compression is not a list of "
			    "num-sub-frames entries",
			    k);
	for (uint64_t i = 0; i < num; i++) {
		const msgpack_object *e = &c->via.array.ptr[i];
		if (e->type == MSGPACK_OBJECT_NIL)
			continue;
		if (e->type != MSGPACK_OBJECT_STR ||
		    tw__codec_parse(e->via.str.ptr, e->via.str.size, &codecs[i]) != 0)
			return fail(d, TW_ENOTSUP, "sub-header %zu: unknown codec %.*s", k,
				    e->type == MSGPACK_OBJECT_STR ? (int)e->via.str.size : 3,
				    e->type == MSGPACK_OBJECT_STR ? e->via.str.ptr : "???");
	}
	return 0;
}

/* Split the num sub-frames into logical frames as split-num-sub-frames
 * and split-offsets say (one each when absent), and build them. */
static int build_logical(tw_decoded *d, const msgpack_object *sub, size_t k, uint64_t num,
			 const enum tw__codec *codecs)
{
	const msgpack_object *cnt = tw_msgpack_map_get(sub, "split-num-sub-frames");
	const msgpack_object *off = tw_msgpack_map_get(sub, "split-offsets");
	int rv = 0;
	if (cnt == NULL) {
		for (uint64_t i = 0; i < num && rv == 0; i++)
			rv = logical(d, k + 1 + i, 1, codecs + i);
		return rv;
	}
	if (off == NULL || cnt->type != MSGPACK_OBJECT_ARRAY || off->type != MSGPACK_OBJECT_ARRAY ||
	    cnt->via.array.size != off->via.array.size)
		return fail(d, TW_EPROTO, "sub-header %zu: bad split-num-sub-frames/split-offsets",
			    k);
	for (uint32_t i = 0, next = 0; i < cnt->via.array.size && rv == 0; i++) {
		uint64_t c, o;
		/* In order and disjoint, as Python writes them: an overlap
		 * would copy the same sub-frames again and again. */
		if (get_uint(&cnt->via.array.ptr[i], &c) != 0 ||
		    get_uint(&off->via.array.ptr[i], &o) != 0 || o < next || o > num || c > num - o)
			return fail(d, TW_EPROTO,
				    "sub-header %zu: split %u outside its sub-frames or "
				    "overlapping another",
				    k, i);
		next = (uint32_t)(o + c);
		rv = logical(d, k + 1 + o, c, codecs + o);
	}
	return rv;
}

static const char *serializer_of(tw_decoded *d, const msgpack_object *sub)
{
	const msgpack_object *s = tw_msgpack_map_get(sub, "serializer");
	char *copy;
	if (sub == d->last_obj && d->last_serializer != NULL)
		return d->last_serializer;
	if (s == NULL || s->type != MSGPACK_OBJECT_STR ||
	    (copy = msgpack_zone_malloc(d->zone, s->via.str.size + 1)) == NULL)
		return "";
	memcpy(copy, s->via.str.ptr, s->via.str.size);
	copy[s->via.str.size] = '\0';
	if (sub == d->last_obj)
		d->last_serializer = copy;
	return copy;
}

/* Whether the logical frames built from group k's num sub-frames (from
 * slice `first` on) are those sub-frames themselves: none compressed, none
 * merged with another. */
static uint8_t is_raw(const tw_decoded *d, size_t k, size_t first, uint64_t num,
		      const enum tw__codec *codecs)
{
	if (d->nslices - first != num)
		return 0;
	for (size_t i = 0; i < num; i++) {
		const tw_slice *f = tw_msg_frame(d->msg, k + 1 + i), *s = &d->slices[first + i];
		if (codecs[i] != TW__CODEC_NONE || s->block != f->block || s->offset != f->offset ||
		    s->len != f->len)
			return 0;
	}
	return 1;
}

/* Sub-header k, unpacked; the same object as the last one when its bytes
 * are the same. Many small values of one type (a Dask gather of 100,000
 * ints) come with byte-identical sub-headers: checking and unpacking each
 * was a quarter of a scheduler's CPU (issue 16); now it is a memcmp. Its
 * objects are charged to the budget each time, as if unpacked again. */
static int sub_header(tw_decoded *d, size_t k, const msgpack_object **out)
{
	const tw_slice *f = tw_msg_frame(d->msg, k);
	const uint8_t *p = tw_slice_data(f);
	uint64_t before = d->budget;
	msgpack_object *sub;
	int rv;
	if (d->last_obj != NULL && f->len == d->last_sub_len &&
	    memcmp(p, d->last_sub, f->len) == 0) {
		if (d->last_cost > d->budget)
			return fail(d, TW_ETOOBIG,
				    "frame %zu unpacks into %llu bytes of objects, above the "
				    "message limit left (%llu bytes)",
				    k, (unsigned long long)d->last_cost,
				    (unsigned long long)d->budget);
		d->budget -= d->last_cost;
		*out = d->last_obj;
		return 0;
	}
	if ((sub = msgpack_zone_malloc(d->zone, sizeof(*sub))) == NULL)
		return TW_ENOMEM;
	if ((rv = unpack_frame(d, k, sub)) != 0)
		return rv;
	d->last_sub = p;
	d->last_sub_len = f->len;
	d->last_obj = sub;
	d->last_cost = before - d->budget;
	d->last_serializer = NULL;
	*out = sub;
	return 0;
}

static int by_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

/* Where the group after the one at k starts (the message's end if none). */
static uint64_t next_start(const tw_decoded *d, uint64_t k)
{
	size_t lo = 0, hi = d->n;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (d->starts[mid] <= k)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo < d->n ? d->starts[lo] : tw_msg_nframes(d->msg);
}

/* A group with frames still in the source's socket: its frames as they
 * came, never merged nor decompressed (include/taskwire/relay.h). */
static int relay_group(tw_decoded *d, tw_payload *p, uint64_t num, size_t first)
{
	size_t k = (size_t)p->index;
	int rv = 0;
	for (uint64_t i = 1; i <= num && rv == 0; i++) {
		tw_slice f = *tw_msg_frame(d->msg, k + (size_t)i);
		if (f.block != NULL)
			tw_block_hold(f.block);
		rv = add_slice(d, f);
	}
	if (p->sub_header == NULL) {
		msgpack_object *empty = msgpack_zone_malloc(d->zone, sizeof(*empty));
		if (empty == NULL)
			return TW_ENOMEM;
		memset(empty, 0, sizeof(*empty));
		empty->type = MSGPACK_OBJECT_MAP;
		p->sub_header = empty;
		p->serializer = "";
	}
	p->relay_sub_header = tw_msg_frame(d->msg, k);
	d->raw[p - d->payloads] = 0; /* forwarded by relay_sub_header instead */
	p->nframes = d->nslices - first;
	p->frames = (const tw_slice *)(uintptr_t)first; /* index until all are built */
	return rv;
}

/* Claim frames k+1..k+num for one group. */
static int claim(tw_decoded *d, size_t k, uint64_t num)
{
	for (uint64_t i = 1; i <= num; i++) {
		if (d->used[k + i])
			return fail(d, TW_EPROTO, "frame %zu is claimed by two payload groups",
				    (size_t)(k + i));
		d->used[k + i] = 1;
	}
	return 0;
}

static int load_group(tw_decoded *d, tw_payload *p)
{
	size_t nframes = tw_msg_nframes(d->msg), k = (size_t)p->index, first = d->nslices;
	const msgpack_object *sub = NULL;
	enum tw__codec local[LOCAL_CODECS], *codecs = NULL;
	uint64_t num;
	int rv;
	if (p->index >= nframes)
		return fail(d, TW_EPROTO, "placeholder index %llu past the last frame (%zu frames)",
			    (unsigned long long)p->index, nframes);
	/* Each frame belongs to one group: a repeated or overlapping
	 * placeholder would make us parse and copy the same frames again. */
	if (d->used[k])
		return fail(d, TW_EPROTO, "frame %zu is claimed by two payload groups", k);
	d->used[k] = 1;
	if (k >= d->relay_from) { /* the sub-header itself is in the socket */
		num = next_start(d, k) - k - 1;
		return (rv = claim(d, k, num)) != 0 ? rv : relay_group(d, p, num, first);
	}
	if ((rv = sub_header(d, k, &sub)) != 0)
		return rv;
	if (sub->type != MSGPACK_OBJECT_MAP)
		return fail(d, TW_EPROTO, "sub-header %zu is not a map", k);
	if (get_uint(tw_msgpack_map_get(sub, "num-sub-frames"), &num) != 0)
		return fail(d, TW_EPROTO, "sub-header %zu: num-sub-frames missing", k);
	if (num > nframes - k - 1)
		return fail(d, TW_EPROTO,
			    "sub-header %zu: num-sub-frames %llu overflows the %zu frames", k,
			    (unsigned long long)num, nframes);
	if ((rv = claim(d, k, num)) != 0)
		return rv;
	if (k + num >= d->relay_from) {
		p->sub_header = sub;
		p->serializer = serializer_of(d, sub);
		return relay_group(d, p, num, first);
	}
	if ((rv = codecs_of(d, sub, num, k, local, &codecs)) == 0)
		rv = build_logical(d, sub, k, num, codecs);
	if (rv == 0)
		d->raw[p - d->payloads] = is_raw(d, k, first, num, codecs);
	if (codecs != local)
		free(codecs);
	p->sub_header = sub;
	p->serializer = serializer_of(d, sub);
	p->nframes = d->nslices - first;
	p->frames = (const tw_slice *)(uintptr_t)first; /* index until all are built */
	return rv;
}

static int add_payload(tw_decoded *d, const msgpack_object *holder, enum tw_payload_kind kind,
		       uint64_t k)
{
	if (d->n == d->cap) {
		size_t cap = d->cap ? 2 * d->cap : 4;
		tw_payload *p = realloc(d->payloads, cap * sizeof(*p));
		const msgpack_object **h;
		if (p == NULL)
			return TW_ENOMEM;
		d->payloads = p;
		if ((h = realloc(d->holders, cap * sizeof(*h))) == NULL)
			return TW_ENOMEM;
		d->holders = h;
		d->cap = cap;
	}
	memset(&d->payloads[d->n], 0, sizeof(d->payloads[0]));
	d->payloads[d->n].kind = kind;
	d->payloads[d->n].index = k;
	d->holders[d->n++] = holder;
	return 0;
}

static int on_holder(void *arg, const msgpack_object *holder, enum tw_payload_kind kind, uint64_t k)
{
	return add_payload(arg, holder, kind, k);
}

static int by_holder(const void *a, const void *b, void *arg)
{
	const tw_decoded *d = arg;
	uintptr_t x = (uintptr_t)d->holders[*(const size_t *)a];
	uintptr_t y = (uintptr_t)d->holders[*(const size_t *)b];
	return x < y ? -1 : x > y;
}

/* Sort payloads by placeholder address, so tw_decoded_payload is a binary
 * search (an echo of many references stays linear-logarithmic). */
static int index_holders(tw_decoded *d)
{
	if (d->n == 0)
		return 0;
	if ((d->order = malloc(d->n * sizeof(*d->order))) == NULL)
		return fail(d, TW_ENOMEM, "out of memory");
	for (size_t i = 0; i < d->n; i++)
		d->order[i] = i;
	qsort_r(d->order, d->n, sizeof(*d->order), by_holder, d); /* glibc */
	return 0;
}

/* Relay frames are a message's tail (include/taskwire/relay.h): find
 * where it starts, and sort the groups' starts to size the groups whose
 * sub-header is unread. */
static int find_relay(tw_decoded *d)
{
	size_t n = tw_msg_nframes(d->msg);
	d->relay_from = n;
	while (d->relay_from > 1 && tw_msg_frame_is_relay(d->msg, d->relay_from - 1))
		d->relay_from--;
	if (d->relay_from == n || d->n == 0)
		return 0;
	if ((d->starts = malloc(d->n * sizeof(*d->starts))) == NULL)
		return fail(d, TW_ENOMEM, "out of memory");
	for (size_t i = 0; i < d->n; i++)
		d->starts[i] = d->payloads[i].index;
	qsort(d->starts, d->n, sizeof(*d->starts), by_u64);
	return 0;
}

static int decode(tw_decoded *d)
{
	const tw_slice *f0;
	const char *why = NULL;
	int rv;
	if (tw_msg_nframes(d->msg) == 0)
		return fail(d, TW_EPROTO, "message has no frames");
	if (alloc_used(d) != 0)
		return fail(d, TW_ENOMEM, "out of memory");
	d->used[0] = 1;
	if ((rv = unpack_frame(d, 0, &d->root)) != 0)
		return rv;
	f0 = tw_msg_frame(d->msg, 0);
	if (tw__may_hold_placeholders(tw_slice_data(f0), f0->len) &&
	    (rv = tw__walk_placeholders(&d->root, on_holder, d, &why)) != 0)
		return rv == TW_EPROTO ? fail(d, rv, "frame 0: %s", why) : rv;
	if (d->n > 0 && (d->raw = msgpack_zone_malloc(d->zone, d->n)) == NULL)
		return fail(d, TW_ENOMEM, "out of memory");
	if ((rv = find_relay(d)) != 0)
		return rv;
	for (size_t i = 0; i < d->n; i++)
		if ((rv = load_group(d, &d->payloads[i])) != 0)
			return rv;
	free(d->starts);
	d->starts = NULL;
	/* indices become pointers; no slices at all (every group empty) leaves
	 * d->slices NULL, and NULL + 0 is undefined */
	for (size_t i = 0; i < d->n; i++)
		d->payloads[i].frames =
			d->slices != NULL ? d->slices + (uintptr_t)d->payloads[i].frames : NULL;
	return index_holders(d);
}

/* Unpacking frame 0 (or a sub-header) makes one 24-byte object per value,
 * and a value can take one byte: weigh its bytes by that. */
#define FRAME0_WEIGHT 24

struct cost {
	tw_decoded *d;
	uint64_t bytes, stop;
};

/* Add the declared decompressed sizes of group k's compressed sub-frames. */
static int cost_of_group(void *arg, const msgpack_object *holder, enum tw_payload_kind kind,
			 uint64_t k)
{
	struct cost *c = arg;
	msgpack_object sub;
	enum tw__codec local[LOCAL_CODECS], *codecs = NULL;
	uint64_t num, size;
	size_t n = tw_msg_nframes(c->d->msg);
	(void)holder;
	(void)kind;
	if (k >= n || c->d->used[k] || c->bytes >= c->stop ||
	    tw_msg_frame_is_relay(c->d->msg, (size_t)k))
		return 0; /* repeated: counted once; or the answer is known; or unread */
	c->d->used[k] = 1;
	/* parsing the sub-header is work too, as frame 0's is */
	c->bytes += (uint64_t)tw_msg_frame(c->d->msg, (size_t)k)->len * (FRAME0_WEIGHT - 1);
	if (unpack_frame(c->d, (size_t)k, &sub) != 0 ||
	    get_uint(tw_msgpack_map_get(&sub, "num-sub-frames"), &num) != 0 || num > n - k - 1)
		return 0;
	/* Groups that overlap are refused by tw_decode; counting them here
	 * would take time quadratic in the frames: stop at the first. */
	for (uint64_t i = 1; i <= num; i++) {
		if (c->d->used[k + i])
			return 1;
		c->d->used[k + i] = 1;
	}
	if (codecs_of(c->d, &sub, num, (size_t)k, local, &codecs) != 0) {
		if (codecs != local)
			free(codecs);
		return 0;
	}
	for (uint64_t i = 0; i < num; i++) {
		const tw_slice *f = tw_msg_frame(c->d->msg, (size_t)(k + 1 + i));
		if (codecs[i] != TW__CODEC_NONE &&
		    !tw_msg_frame_is_relay(c->d->msg, (size_t)(k + 1 + i)) &&
		    tw__decompressed_size(codecs[i], tw_slice_data(f), f->len, UINT64_MAX, &size) ==
			    0)
			c->bytes += size < UINT64_MAX - c->bytes ? size : 0;
	}
	if (codecs != local)
		free(codecs);
	return 0;
}

uint64_t tw__decode_cost(const tw_msg *msg, uint64_t stop)
{
	const tw_slice *f0 = tw_msg_frame(msg, 0);
	tw_decoded d;
	struct cost c = {&d, tw_msg_bytes(msg), stop};
	/* relay frames are forwarded, never touched here */
	for (size_t i = tw_msg_nframes(msg); i > 1 && tw_msg_frame_is_relay(msg, i - 1); i--)
		c.bytes -= tw_msg_frame(msg, i - 1)->len;
	msgpack_object root;
	const char *why;
	if (f0 != NULL)
		c.bytes += (uint64_t)f0->len * (FRAME0_WEIGHT - 1);
	/* Only frame 0 and the sub-headers are read, and not at all when the
	 * frames alone reach `stop`: that parse would be the work we offload. */
	if (tw_msg_nframes(msg) < 2 || c.bytes >= stop)
		return c.bytes;
	memset(&d, 0, sizeof(d));
	d.msg = (tw_msg *)msg;
	d.budget = UINT64_MAX; /* an estimate: the limits are tw_decode's */
	if (init_zone(&d) == 0 && alloc_used(&d) == 0 && unpack_frame(&d, 0, &root) == 0) {
		d.used[0] = 1; /* frame 0 is no group's, as in decode */
		tw__walk_placeholders(&root, cost_of_group, &c, &why);
	}
	fini_zone(&d);
	free_used(&d);
	return c.bytes;
}

int tw_decode(const tw_msg *msg, const tw_decode_limits *limits, tw_decoded **out, char *detail,
	      size_t detail_len)
{
	tw_decoded *d;
	int rv;
	if (msg == NULL || out == NULL)
		return TW_EINVAL;
	if ((d = new_decoded()) == NULL)
		return TW_ENOMEM;
	d->msg = tw_msg_hold((tw_msg *)msg);
	d->detail = detail;
	d->detail_len = detail_len;
	d->budget = limits != NULL && limits->max_message_bytes > 0 ? limits->max_message_bytes
								    : UINT64_C(4) << 30;
	if ((rv = decode(d)) != 0) {
		tw_decoded_free(d);
		return rv;
	}
	d->detail = NULL;
	*out = d;
	return 0;
}

void *tw__decoded_alloc(tw_decoded *d, size_t size)
{
	return msgpack_zone_malloc(d->zone, size);
}

const tw_slice *tw__decoded_raw(const tw_decoded *d, const tw_payload *p)
{
	return d->raw != NULL && d->raw[p - d->payloads] ? tw_msg_frame(d->msg, (size_t)p->index)
							 : NULL;
}

const msgpack_object *tw_decoded_root(const tw_decoded *d)
{
	return &d->root;
}

size_t tw_decoded_npayloads(const tw_decoded *d)
{
	return d->n;
}

const tw_payload *tw_decoded_payload_at(const tw_decoded *d, size_t i)
{
	return i < d->n ? &d->payloads[i] : NULL;
}

const tw_payload *tw_decoded_payload(const tw_decoded *d, const msgpack_object *placeholder)
{
	size_t lo = 0, hi = d->n;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		const msgpack_object *h = d->holders[d->order[mid]];
		if (h == placeholder)
			return &d->payloads[d->order[mid]];
		if ((uintptr_t)h < (uintptr_t)placeholder)
			lo = mid + 1;
		else
			hi = mid;
	}
	return NULL;
}

int tw_decoded_bytes(const tw_decoded *d, const msgpack_object *o, const uint8_t **p, size_t *n)
{
	const tw_payload *pl = o != NULL ? tw_decoded_payload(d, o) : NULL;
	if (pl != NULL && pl->relay_sub_header != NULL)
		return TW_EINVAL; /* its bytes are in a socket, not here */
	if (pl != NULL && pl->nframes == 1) {
		*p = tw_slice_data(&pl->frames[0]);
		*n = pl->frames[0].len;
		return 0;
	}
	if (pl == NULL && o != NULL && o->type == MSGPACK_OBJECT_BIN) {
		*p = (const uint8_t *)o->via.bin.ptr;
		*n = o->via.bin.size;
		return 0;
	}
	return TW_EINVAL;
}

void tw_decoded_free(tw_decoded *d)
{
	msgpack_zone zone;
	if (d == NULL)
		return;
	for (size_t i = 0; i < d->nslices; i++)
		tw_block_free(d->slices[i].block);
	free(d->slices);
	free(d->payloads);
	free(d->holders);
	free(d->order);
	free(d->starts);
	free_used(d);
	tw_msg_free(d->msg);
	zone = d->zone_mem; /* d is in the zone: move it out, then free */
	msgpack_zone_destroy(&zone);
}
