/* Internal builder helpers. */
#ifndef TW_PROTOCOL_BUILDER_H
#define TW_PROTOCOL_BUILDER_H

#include <taskwire/serial.h>

/* 1 while nothing has been packed into frame 0. */
int tw__builder_empty(const tw_builder *b);

/* Bytes a packing buffer starts with; it doubles as it fills. */
#define TW__SBUFFER_START 256

/* msgpack_sbuffer_init, starting at TW__SBUFFER_START bytes (0 if that
 * allocation fails: the first write then allocates). */
void tw__sbuffer_init(msgpack_sbuffer *sb);

#endif
