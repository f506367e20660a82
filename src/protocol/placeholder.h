/* SPDX-License-Identifier: BSD-3-Clause */
/* Finding payload placeholders in frame 0 (Dask's _decode_default): a map
 * with "__Serialized__" or "__Pickled__" set to k > 0. */
#ifndef TW_PROTOCOL_PLACEHOLDER_H
#define TW_PROTOCOL_PLACEHOLDER_H

#include <msgpack.h>

#include <taskwire/serial.h>

typedef int (*tw__holder_fn)(void *arg, const msgpack_object *holder, enum tw_payload_kind kind,
			     uint64_t k);

/* tw__walk_placeholders: call fn for each placeholder inside o, in the
 * order of a depth-first walk; a value of 0 leaves a plain map. Stops at
 * fn's first non-zero return and returns it; TW_EPROTO (with *why) when a
 * placeholder's value is not an unsigned integer. */
int tw__walk_placeholders(const msgpack_object *o, tw__holder_fn fn, void *arg, const char **why);

/* tw__may_hold_placeholders: whether the n msgpack bytes at p can hold a
 * placeholder key at all; when not, the walk can be skipped (most small
 * RPCs carry none). */
int tw__may_hold_placeholders(const uint8_t *p, size_t n);

#endif
