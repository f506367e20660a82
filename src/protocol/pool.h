/* SPDX-License-Identifier: BSD-3-Clause */
/* tw_pool internals that tests read (protocol/pool.c). */
#ifndef TW_PROTOCOL_POOL_H
#define TW_PROTOCOL_POOL_H

#include <stddef.h>

#include <taskwire/rpc.h>

#define TW__WHY_BYTES 256 /* tw_call_error's text, truncated */

/* tw__pool_ndests: the addresses p keeps an entry for (one with comms or
 * calls, or one freed on the loop's next pass). */
size_t tw__pool_ndests(const tw_pool *p);
/* tw__pool_nsleeping: idempotent calls waiting for their next try. */
size_t tw__pool_nsleeping(const tw_pool *p);

#endif
