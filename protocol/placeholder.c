/* Payload placeholders in frame 0 (protocol/placeholder.h). */
#include <taskwire/error.h>

#include "protocol/placeholder.h"

int tw__walk_placeholders(const msgpack_object *o, tw__holder_fn fn, void *arg, const char **why)
{
	static const char *const keys[] = {"__Serialized__", "__Pickled__"};
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
	 * tw_map_get (and Python's dict) would */
	const msgpack_object *vals[2] = {NULL, NULL};
	for (uint32_t i = 0; i < o->via.map.size; i++) {
		const msgpack_object *k = &o->via.map.ptr[i].key;
		for (int kind = 0; kind < 2; kind++)
			if (tw_obj_str_eq(k, keys[kind]))
				vals[kind] = &o->via.map.ptr[i].val;
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
