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

/* tw__append_sbuffer: move sb's packed bytes into m as a new last frame,
 * without copying them (the frame frees them); sb is left empty. Returns
 * 0 or TW_ENOMEM (sb's bytes are freed). */
int tw__append_sbuffer(tw_msg *m, msgpack_sbuffer *sb);

#endif
