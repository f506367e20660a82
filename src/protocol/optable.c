/* SPDX-License-Identifier: BSD-3-Clause */
/* Op tables and stream dispatch by op (protocol/optable.h). */
#include <stdlib.h>
#include <string.h>

#include <taskwire/error.h>

#include "protocol/optable.h"

static int op_cmp(const struct tw__op *o, const char *name, size_t len)
{
	if (o->len != len)
		return o->len < len ? -1 : 1;
	return memcmp(o->name, name, len);
}

/* 1 with *at where name is; 0 with *at where it would go. */
static int op_search(const struct tw__optable *t, const char *name, size_t len, size_t *at)
{
	size_t lo = 0, hi = t->n;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		int c = op_cmp(&t->ops[mid], name, len);
		if (c == 0) {
			*at = mid;
			return 1;
		}
		if (c < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	*at = lo;
	return 0;
}

int tw__optable_add(struct tw__optable *t, const char *name, void (*fn)(void), void *arg)
{
	struct tw__op *ops;
	size_t at, len;
	if (name == NULL || fn == NULL)
		return TW_EINVAL;
	len = strlen(name);
	if (!op_search(t, name, len, &at)) { /* new: else replaced */
		char *copy = strdup(name);
		if (copy == NULL || (ops = realloc(t->ops, (t->n + 1) * sizeof(*ops))) == NULL) {
			free(copy);
			return TW_ENOMEM;
		}
		t->ops = ops;
		memmove(&ops[at + 1], &ops[at], (t->n - at) * sizeof(*ops));
		ops[at].name = copy;
		ops[at].len = len;
		t->n++;
	}
	t->ops[at].fn = fn;
	t->ops[at].arg = arg;
	return 0;
}

const struct tw__op *tw__optable_find(const struct tw__optable *t, const msgpack_object *name)
{
	size_t at;
	if (name == NULL || name->type != MSGPACK_OBJECT_STR)
		return NULL;
	return op_search(t, name->via.str.ptr, name->via.str.size, &at) ? &t->ops[at] : NULL;
}

void tw__optable_fini(struct tw__optable *t)
{
	for (size_t i = 0; i < t->n; i++)
		free(t->ops[i].name);
	free(t->ops);
	t->ops = NULL;
	t->n = 0;
}

/* One map: its op's handler; 1 at close-stream. */
static int stream_map(const struct tw__optable *t, tw_comm *comm, const tw_decoded *d,
		      const msgpack_object *m)
{
	const msgpack_object *op = tw_msgpack_map_get(m, "op");
	const struct tw__op *h;
	if (op == NULL)
		return 0;
	if (tw_msgpack_str_eq(op, "close-stream"))
		return 1;
	if ((h = tw__optable_find(t, op)) != NULL)
		((tw_stream_fn)h->fn)(comm, d, m, h->arg);
	return 0;
}

int tw__stream_dispatch(const struct tw__optable *t, tw_comm *comm, const tw_decoded *d,
			int (*stop)(void *arg), void *stop_arg)
{
	const msgpack_object *root = tw_decoded_root(d);
	if (root->type == MSGPACK_OBJECT_MAP)
		return stream_map(t, comm, d, root);
	if (root->type != MSGPACK_OBJECT_ARRAY)
		return TW_EPROTO;
	for (uint32_t i = 0; i < root->via.array.size; i++) {
		if (stream_map(t, comm, d, &root->via.array.ptr[i]))
			return 1;
		if (stop(stop_arg))
			break;
	}
	return 0;
}
