/* SPDX-License-Identifier: BSD-3-Clause */
/* Msgpack packed by hand, for messages the tests build byte by byte
 * (placeholders, sub-headers, bad inputs): a packer on a growing buffer
 * whose bytes then become the next frame of a message. Strings go
 * through the library's tw_msgpack_pack_str. */
#ifndef TW_TESTS_SUPPORT_PACK_H
#define TW_TESTS_SUPPORT_PACK_H

#include <stdint.h>

#include <msgpack.h>
#include <taskwire/msg.h>
#include <taskwire/serial.h>

struct ts_pack {
	msgpack_sbuffer sb;
	msgpack_packer pk;
};

/* Start packing into p's own buffer; returns its packer. */
msgpack_packer *ts_pack_start(struct ts_pack *p);
/* Append what was packed as the next frame of msg (a copy) and free p's
 * buffer. Asserts. */
void ts_pack_append(struct ts_pack *p, tw_msg *msg);

/* Dask's handshake info map as a Python peer sends it (msgpack bytes),
 * {"compression": nil, "python": [3, 11, 2], "pickle-protocol": 5}. */
extern const uint8_t ts_handshake_info[42];
/* Pack it with `extra` more entries for the caller to pack after it. */
void ts_pack_handshake_info(msgpack_packer *pk, uint32_t extra);

/* A new builder in *b (asserted) whose message starts with a map of n
 * entries; returns the builder's packer. */
msgpack_packer *ts_builder_map(tw_builder **b, uint32_t n);

#endif
