/* SPDX-License-Identifier: BSD-3-Clause */
/* Op tables (a server's ops, stream ops on either side of a comm) and
 * the dispatch of one stream message by op, shared by protocol/server.c
 * and tw_comm_dispatch_stream (protocol/stream_ops.c). */
#ifndef TW_PROTOCOL_OPTABLE_H
#define TW_PROTOCOL_OPTABLE_H

#include <stddef.h>

#include <taskwire/stream.h>

struct tw__op {
	char *name;
	size_t len;
	void (*fn)(void);
	void *arg;
};

/* Sorted by (length, bytes), searched by bisection: a Dask scheduler
 * registers about a hundred ops. */
struct tw__optable {
	struct tw__op *ops;
	size_t n;
};

/* Public as tw_stream_ops. */
struct tw_stream_ops {
	struct tw__optable t;
};

/* Register or replace name (copied) -> fn. Returns 0, TW_ENOMEM, TW_EINVAL. */
int tw__optable_add(struct tw__optable *t, const char *name, void (*fn)(void), void *arg);
/* The entry of a msgpack str op (by its bytes: "close\0x" is no op's
 * name), or NULL. */
const struct tw__op *tw__optable_find(const struct tw__optable *t, const msgpack_object *name);
void tw__optable_fini(struct tw__optable *t);

/* Dispatch one stream message, a map or an array of maps, to t's
 * handlers by `op` (maps without a known op are skipped), as Dask's
 * Server.handle_stream. stop(stop_arg) is asked after each handler: 1
 * ends the batch there. Returns 0, 1 when a close-stream map came (maps
 * after it are not dispatched), or TW_EPROTO when the message is not a
 * map or an array. */
int tw__stream_dispatch(const struct tw__optable *t, tw_comm *comm, const tw_decoded *d,
			int (*stop)(void *arg), void *stop_arg);

#endif
