/* SPDX-License-Identifier: BSD-3-Clause */
/* Internal decoder helpers. */
#ifndef TW_PROTOCOL_DECODE_H
#define TW_PROTOCOL_DECODE_H

#include <stdint.h>
#include <string.h>

#include <taskwire/msg.h>
#include <taskwire/serial.h>

/* tw__decode_cost: what decoding msg will touch, in bytes: its frames
 * (frame 0 weighed by the objects it unpacks into) plus the declared
 * decompressed size of every compressed sub-frame, each group counted
 * once. Reads only frame 0 and the sub-headers, and stops as soon as the
 * cost reaches `stop` (a malformed message just costs its frames;
 * tw_decode reports the error). Decides what goes to the offload pool, so
 * a small message that inflates to gigabytes is not decoded on the loop. */
uint64_t tw__decode_cost(const tw_msg *msg, uint64_t stop);

/* tw__decoded_alloc: size bytes that live as long as d and are freed
 * with it (from its zone: no allocation of their own for what is made
 * per message, like a server's request). NULL when out of memory. */
void *tw__decoded_alloc(tw_decoded *d, size_t size);

/* tw__decoded_raw: the sub-header frame of payload p (one of d's) when
 * p's logical frames are exactly the sub-frames that came (none
 * compressed, none merged), so the group can be sent on as it came: that
 * sub-header and those frames, by reference. NULL otherwise. The slice
 * lives as long as d. */
const tw_slice *tw__decoded_raw(const tw_decoded *d, const tw_payload *p);

/* TW__STR_IS(o, "lit"): whether o is the string lit. The length is
 * compared first, so a key of another length costs no loop: the loops
 * that test every key of every payload against a few names
 * (tw__walk_placeholders, the builder's re-packed sub-headers) spent 9%
 * of tw-mini-scheduler's CPU in tw_msgpack_str_eq on 100,000 small values
 * (perf, issue 16). */
static inline int tw__str_is(const msgpack_object *o, const char *s, uint32_t n)
{
	return o->type == MSGPACK_OBJECT_STR && o->via.str.size == n &&
	       memcmp(o->via.str.ptr, s, n) == 0;
}
#define TW__STR_IS(o, lit) tw__str_is((o), (lit), (uint32_t)(sizeof(lit) - 1))

#endif
