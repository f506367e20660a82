/* SPDX-License-Identifier: BSD-3-Clause */
/* Payload placeholders in frame 0 (protocol/placeholder.h). */
#include <string.h>

#include <taskwire/error.h>

#include "protocol/decode.h"
#include "protocol/placeholder.h"

int tw__walk_placeholders(const msgpack_object *o, tw__holder_fn fn, void *arg, const char **why)
{
	int rv;
	if (o->type == MSGPACK_OBJECT_ARRAY) {
		for (uint32_t i = 0; i < o->via.array.size; i++)
			if ((rv = tw__walk_placeholders(&o->via.array.ptr[i], fn, arg, why)) != 0)
				return rv;
		return 0;
	}
	if (o->type != MSGPACK_OBJECT_MAP)
		return 0;
	/* one pass for both keys, each taken at its last occurrence as
	 * tw_msgpack_map_get (and Python's dict) would */
	const msgpack_object *vals[2] = {NULL, NULL};
	for (uint32_t i = 0; i < o->via.map.size; i++) {
		const msgpack_object *k = &o->via.map.ptr[i].key;
		if (TW__STR_IS(k, "__Serialized__"))
			vals[0] = &o->via.map.ptr[i].val;
		else if (TW__STR_IS(k, "__Pickled__"))
			vals[1] = &o->via.map.ptr[i].val;
	}
	for (int kind = 0; kind < 2; kind++) {
		const msgpack_object *v = vals[kind];
		if (v == NULL || (v->type == MSGPACK_OBJECT_POSITIVE_INTEGER && v->via.u64 == 0))
			continue;
		if (v->type != MSGPACK_OBJECT_POSITIVE_INTEGER) {
			*why = kind == 0 ? "__Serialized__ is not a frame index"
					 : "__Pickled__ is not a frame index";
			return TW_EPROTO;
		}
		return fn(arg, o, kind == 0 ? TW_PAYLOAD_SERIALIZED : TW_PAYLOAD_PICKLED,
			  v->via.u64);
	}
	for (uint32_t i = 0; i < o->via.map.size; i++)
		if ((rv = tw__walk_placeholders(&o->via.map.ptr[i].key, fn, arg, why)) != 0 ||
		    (rv = tw__walk_placeholders(&o->via.map.ptr[i].val, fn, arg, why)) != 0)
			return rv;
	return 0;
}

int tw__may_hold_placeholders(const uint8_t *p, size_t n)
{
	/* Both keys start with "__" and msgpack keeps a str's bytes as they
	 * are, whatever its length prefix: without those two bytes in a row
	 * no key can match. (memchr, not memmem: glibc's memmem costs ten
	 * times as much on a small frame.) */
	const uint8_t *last, *u;
	if (n < 2)
		return 0;
	last = p + n - 1; /* a match starts before the last byte */
	while ((u = memchr(p, '_', (size_t)(last - p))) != NULL) {
		if (u[1] == '_')
			return 1;
		p = u + 1;
	}
	return 0;
}
