/* SPDX-License-Identifier: BSD-3-Clause */
/* A structural check of one msgpack value before msgpack-c unpacks it:
 * msgpack-c allocates an array's or map's elements from the declared count
 * before reading them, so a 5-byte header could ask for gigabytes. The
 * check walks the bytes without allocating and refuses counts that the
 * remaining bytes cannot hold, nesting deeper than a limit, invalid UTF-8
 * in a str (Python peers decode str as UTF-8), truncation and trailing
 * bytes. */
#ifndef TW_PROTOCOL_MPCHECK_H
#define TW_PROTOCOL_MPCHECK_H

#include <stddef.h>
#include <stdint.h>

/* Containers nested deeper than this are refused: msgpack-c's unpacker
 * (MSGPACK_EMBED_STACK_SIZE, 32) fails on them with an out-of-memory code,
 * which would report a bad peer as TW_ENOMEM. */
#define TW__MP_MAX_DEPTH 32

/* tw__mp_check: 0 when p[0..n) is exactly one well-formed msgpack value,
 * else TW_EPROTO with a reason (static string) in *why. *elems (when not
 * NULL) gets the number of array and map elements (a map entry counts
 * 2): msgpack-c unpacks each into a msgpack_object of its own. */
int tw__mp_check(const uint8_t *p, size_t n, uint64_t *elems, const char **why);

#endif
