/* SPDX-License-Identifier: BSD-3-Clause */
/* Dask-aware placement of received frames (protocol/placement.h). */
#include <stdlib.h>
#include <string.h>

#include <taskwire/serial.h>

#include "protocol/mpcheck.h"
#include "protocol/placeholder.h"
#include "protocol/placement.h"

void tw__dask_place_reset(struct tw__dask_place *p)
{
	free(p->span);
	free(p->subs);
	memset(p, 0, sizeof(*p));
}

/* Unpack a complete frame into zone; 0 or -1. */
static int unpack(const tw_msg *msg, size_t i, msgpack_zone *zone, msgpack_object *out)
{
	const tw_slice *f = tw_msg_frame(msg, i);
	const char *why;
	size_t off = 0;
	if (tw__mp_check(tw_slice_data(f), f->len, NULL, &why) != 0)
		return -1;
	return msgpack_unpack((const char *)tw_slice_data(f), f->len, &off, zone, out) ==
			       MSGPACK_UNPACK_SUCCESS
		       ? 0
		       : -1;
}

static int add_sub(void *arg, const msgpack_object *holder, enum tw_payload_kind kind, uint64_t k)
{
	struct tw__dask_place *p = arg;
	(void)holder;
	(void)kind;
	if (k == 0 || k >= p->n)
		return 0;
	p->subs[p->nsubs++] = k;
	return p->nsubs == p->n ? 1 : 0;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

#define PLAN_MAX_FRAME0 ((size_t)1 << 20)
/* Sub-headers are hints too, parsed on the loop thread as they arrive: a
 * Dask sub-header is a few hundred bytes (a long `lengths` list at most
 * some KiB), so a larger one, or more than PLACE_MAX_SUBS bytes of them
 * in one message, is left to tw_decode (every msgpack byte can cost a
 * 24-byte object: a 32 MiB array of nils took 900 MiB and a second here). */
#define PLACE_MAX_SUB  ((size_t)64 << 10)
#define PLACE_MAX_SUBS ((size_t)1 << 20)

/* Frame 0 is complete: list the sub-header frames. */
static void plan(struct tw__dask_place *p, const tw_msg *msg, size_t n)
{
	msgpack_zone zone;
	msgpack_object root;
	const char *why;
	p->planned = 1;
	p->n = n;
	p->span = calloc(n, sizeof(*p->span));
	p->subs = malloc(n * sizeof(*p->subs));
	/* A huge frame 0 is parsed by tw_decode, off the loop when large, not
	 * here: its payloads then just get the default placement. */
	if (p->span == NULL || p->subs == NULL || tw_msg_frame(msg, 0)->len > PLAN_MAX_FRAME0 ||
	    !msgpack_zone_init(&zone, 4096))
		return;
	if (unpack(msg, 0, &zone, &root) == 0)
		tw__walk_placeholders(&root, add_sub, p, &why);
	msgpack_zone_destroy(&zone);
	qsort(p->subs, p->nsubs, sizeof(*p->subs), cmp_u64);
}

static int uncompressed(const msgpack_object *comp, uint64_t from, uint64_t count)
{
	if (comp == NULL || comp->type != MSGPACK_OBJECT_ARRAY)
		return 1;
	for (uint64_t j = from; j < from + count; j++)
		if (j >= comp->via.array.size || comp->via.array.ptr[j].type != MSGPACK_OBJECT_NIL)
			return 0;
	return 1;
}

/* Sub-header k is complete: a logical frame split into c > 1 uncompressed
 * sub-frames starting at k + 1 + offset is read into one block. */
static void read_sub(struct tw__dask_place *p, const tw_msg *msg, uint64_t k)
{
	const msgpack_object *cnt, *off, *comp;
	msgpack_zone zone;
	msgpack_object sub;
	size_t len = tw_msg_frame(msg, (size_t)k)->len;
	if (len > PLACE_MAX_SUB || len > PLACE_MAX_SUBS - p->parsed)
		return;
	p->parsed += len;
	if (!msgpack_zone_init(&zone, 1024))
		return;
	if (unpack(msg, (size_t)k, &zone, &sub) != 0)
		goto done;
	cnt = tw_msgpack_map_get(&sub, "split-num-sub-frames");
	off = tw_msgpack_map_get(&sub, "split-offsets");
	comp = tw_msgpack_map_get(&sub, "compression");
	if (cnt == NULL || off == NULL || cnt->type != MSGPACK_OBJECT_ARRAY ||
	    off->type != MSGPACK_OBJECT_ARRAY || cnt->via.array.size != off->via.array.size)
		goto done;
	for (uint32_t m = 0; m < cnt->via.array.size; m++) {
		const msgpack_object *c = &cnt->via.array.ptr[m], *o = &off->via.array.ptr[m];
		uint64_t first;
		if (c->type != MSGPACK_OBJECT_POSITIVE_INTEGER ||
		    o->type != MSGPACK_OBJECT_POSITIVE_INTEGER || c->via.u64 < 2 ||
		    o->via.u64 > p->n || c->via.u64 > p->n)
			continue;
		first = k + 1 + o->via.u64;
		if (first < p->n && c->via.u64 <= p->n - first &&
		    uncompressed(comp, o->via.u64, c->via.u64))
			p->span[first] = (uint32_t)c->via.u64;
	}
done:
	msgpack_zone_destroy(&zone);
}

int tw__dask_place(void *arg, const tw_msg *msg, const uint64_t *lens, size_t n, size_t i)
{
	struct tw__dask_place *p = arg;
	(void)lens;
	if (i == 0) {
		tw__dask_place_reset(p);
		return 0;
	}
	if (!p->planned)
		plan(p, msg, n);
	if (p->span == NULL || p->subs == NULL)
		return 0;
	while (p->next < p->nsubs && p->subs[p->next] < i) {
		uint64_t k = p->subs[p->next++];
		if (p->next < 2 || p->subs[p->next - 2] != k) /* repeated placeholders: once */
			read_sub(p, msg, k);
	}
	return (int)p->span[i];
}

void tw__dask_place_free(void *p)
{
	if (p == NULL)
		return;
	tw__dask_place_reset(p);
	free(p);
}
