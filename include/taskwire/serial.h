/* SPDX-License-Identifier: BSD-3-Clause */
/* taskwire: Dask messages: frame 0 as a msgpack value, with out-of-band
 * payload groups (docs/design.md, Messages; the Dask comm protocol,
 * distributed/protocol/core.py dumps/loads).
 *
 * A payload group is a placeholder map {"__Serialized__": k} (or
 * {"__Pickled__": k}) somewhere in frame 0; frame k is its msgpack
 * sub-header and the next `num-sub-frames` frames carry the payload. A
 * sender splitting a payload into shards says so in `split-num-sub-frames`
 * and `split-offsets`; a receiver merges them back (zero-copy when they are
 * adjacent, which the comm's placement arranges) and decompresses each
 * sub-frame named in `compression`. taskwire never splits when it sends.
 *
 * msgpack-c is part of taskwire's API: frame 0 is written with msgpack-c's
 * packer (tw_builder_packer returns a msgpack_packer *) and read as
 * msgpack-c objects (msgpack_object, tw_payload.sub_header), so this
 * header includes <msgpack.h>, and a program that uses it builds and links
 * against msgpack-c's C API, version 4.x (pkg-config module `msgpack` >=
 * 4.0.0, libmsgpackc.so.2; taskwire.pc requires it). The layouts of those
 * types are msgpack-c's: a msgpack-c that changes them needs a new
 * taskwire SONAME (docs/versioning.md). Nothing else in taskwire's API
 * exposes msgpack-c.
 *
 * Threads: builders and decoded messages belong to no context; every
 * function here may be called on any thread, one thread at a time for
 * each builder or tw_decoded (the tw_msg and blocks they hold are
 * refcounted atomically: msg.h, buf.h), except that one holding relay
 * frames is freed on its source comm's loop thread (relay.h). */
#ifndef TASKWIRE_SERIAL_H
#define TASKWIRE_SERIAL_H

#include <stddef.h>
#include <stdint.h>

#include <msgpack.h>

#if !defined(MSGPACK_VERSION_MAJOR) || MSGPACK_VERSION_MAJOR < 4
#error "taskwire needs msgpack-c 4.x (its C API: msgpack.h)"
#endif

#include <taskwire/buf.h>
#include <taskwire/msg.h>

#ifdef __cplusplus
extern "C" {
#endif

#pragma GCC visibility push(default)

/* Building messages. */

typedef struct tw_builder tw_builder;
typedef struct tw_decoded tw_decoded;

/* tw_builder_new: a builder for one message. `compression` is the codec
 * for payload frames ("zstd", "lz4") or NULL for none; frames of 10,000 B
 * to 2 GiB are compressed and kept compressed only if that saves 10%.
 * Returns 0 and sets *out, or:
 *   TW_EINVAL   out is NULL
 *   TW_ENOTSUP  an unknown codec, or one this build lacks (lz4)
 *   TW_ENOMEM   out of memory */
int tw_builder_new(const char *compression, tw_builder **out);

/* tw_builder_packer: the msgpack-c packer that writes frame 0. Pack one
 * value (a map for requests) with msgpack_pack_* calls; call the
 * tw_builder_pack_* functions below where a payload goes. Valid until the
 * builder is freed. */
msgpack_packer *tw_builder_packer(tw_builder *b);

/* tw_builder_pack_bytes: at the packer's current position, pack a
 * placeholder for `data` as raw bytes (serializer "dask", type "bytes";
 * Python receives `bytes`). The frame is referenced, not copied (one more
 * reference on data->block), unless it is compressed.
 * Returns 0, or:
 *   TW_EINVAL  b or data NULL, or the builder is finished
 *   TW_ENOMEM  out of memory */
int tw_builder_pack_bytes(tw_builder *b, const tw_slice *data);

/* tw_builder_pack_msgpack: pack a placeholder for a structured value
 * carried out of band (serializer "msgpack"): `packed` holds len bytes of
 * one msgpack value, copied into the message.
 * Returns 0, or:
 *   TW_EINVAL  b NULL, packed NULL with len > 0, or the builder is
 *              finished
 *   TW_ENOMEM  out of memory */
int tw_builder_pack_msgpack(tw_builder *b, const void *packed, size_t len);

/* tw_builder_pack_object: pack `o`, a value inside the decoded message d
 * (or any msgpack object when d is NULL), at the packer's position. Each
 * placeholder of d inside o becomes a new payload group of this message
 * that references the same (merged, decompressed) frames without copying
 * them, with the original sub-header's keys (serializer, type ...) and
 * fresh num-sub-frames, compression and split keys. d must outlive the
 * finished message only until tw_builder_finish (the message then holds
 * its own references). This is how an echo replies with its argument.
 * Returns 0, or:
 *   TW_EINVAL  b or o NULL, or the builder is finished
 *   TW_ENOMEM  out of memory */
int tw_builder_pack_object(tw_builder *b, const tw_decoded *d, const msgpack_object *o);

/* tw_builder_finish: the message (frame 0, then every payload group in
 * the order packed), owned by the caller. The builder is spent: only
 * tw_builder_free is valid after.
 * Returns 0 and sets *out, or:
 *   TW_EINVAL  b or out NULL, or called twice
 *   TW_ENOMEM  out of memory */
int tw_builder_finish(tw_builder *b, tw_msg **out);

/* tw_builder_free: free the builder and what it holds. Accepts NULL. */
void tw_builder_free(tw_builder *b);

/* Reading messages. */

enum tw_payload_kind { TW_PAYLOAD_SERIALIZED = 1, TW_PAYLOAD_PICKLED = 2 };

typedef struct tw_payload {
	enum tw_payload_kind kind;
	uint64_t index;                   /* k: frame of the sub-header */
	const msgpack_object *sub_header; /* the sub-header map */
	const char *serializer;           /* NUL-terminated; "" when absent */
	size_t nframes;                   /* logical frames */
	const tw_slice *frames;           /* merged and decompressed */
	/* A relay group (include/taskwire/relay.h): some of its frames are
	 * still in the source's socket, so nothing was merged or
	 * decompressed: `frames` are the group's frames as they came (its
	 * num-sub-frames), and this is its sub-header frame as it came
	 * (unread when it is a relay frame too: sub_header is then an empty
	 * map, serializer "", and the group's size is inferred from where the
	 * next group starts, as Dask's serialize lays groups out one after
	 * another). tw_builder_pack_object forwards such a group verbatim.
	 * NULL for every other group. */
	const tw_slice *relay_sub_header;
} tw_payload;

typedef struct tw_decode_limits {
	/* Cap on what decoding allocates for one message, 0: 4 GiB: the
	 * decompressed frames together, plus the objects msgpack-c unpacks
	 * frame 0 and the sub-headers into (24 bytes per array element, 48
	 * per map entry), so a frame of one-byte nils cannot take 24 times
	 * its size. */
	uint64_t max_message_bytes;
} tw_decode_limits;

/* tw_decode: decode frame 0 of msg into a msgpack object tree, and every
 * payload group it references: parse its sub-header, decompress each
 * sub-frame (size checked against the limit before allocating, and
 * against what decompression produced), and merge the sub-frames of each
 * logical frame (a view when adjacent, else one copy). msg is held by the
 * result until tw_decoded_free. `detail` (may be NULL) receives a
 * NUL-terminated reason on failure.
 * Any thread.
 * Returns 0 and sets *out, or:
 *   TW_EINVAL   msg or out is NULL
 *   TW_EPROTO   frame 0 empty, truncated, with trailing bytes, or with
 *               invalid UTF-8 in a str; a placeholder or num-sub-frames
 *               past the last frame; a bad sub-header; a size mismatch;
 *               corrupt compressed data
 *   TW_ENOTSUP  a codec that is unknown or not built
 *   TW_ETOOBIG  a declared size, or frame 0's unpacked objects, above the
 *               limit
 *   TW_ENOMEM   out of memory */
int tw_decode(const tw_msg *msg, const tw_decode_limits *limits, tw_decoded **out, char *detail,
	      size_t detail_len);

/* tw_decoded_root: frame 0's value; valid until tw_decoded_free. */
const msgpack_object *tw_decoded_root(const tw_decoded *d);

/* tw_decoded_npayloads / tw_decoded_payload_at: payload groups in the order
 * of their frames. tw_decoded_payload: the group a placeholder map (an
 * object inside the root) stands for, or NULL if it is not one. */
size_t tw_decoded_npayloads(const tw_decoded *d);
const tw_payload *tw_decoded_payload_at(const tw_decoded *d, size_t i);
const tw_payload *tw_decoded_payload(const tw_decoded *d, const msgpack_object *placeholder);

/* tw_decoded_bytes: the bytes a value of d stands for, the way Python
 * peers send bytes: a placeholder of one logical frame (out of band), or an
 * inline msgpack bin (a peer that deserialized and re-sent it). *p points
 * into d (valid until tw_decoded_free), *n is the length in bytes.
 * Returns 0, or:
 *   TW_EINVAL  o is neither (or NULL) */
int tw_decoded_bytes(const tw_decoded *d, const msgpack_object *o, const uint8_t **p, size_t *n);

/* tw_decoded_free: free the tree and payloads, drop the message. Accepts
 * NULL. */
void tw_decoded_free(tw_decoded *d);

/* msgpack-c helpers (tw_msgpack_*): what msgpack-c lacks for Dask's
 * str-keyed maps. */

/* tw_msgpack_pack_str: pack the NUL-terminated UTF-8 string s as a
 * msgpack str (msgpack-c has no one-call form). Returns msgpack-c's
 * result, not a taskwire error code: 0, or -1 when its buffer is out of
 * memory. */
int tw_msgpack_pack_str(msgpack_packer *pk, const char *s);

/* tw_msgpack_map_get: the value of str key `key` in map `m`, or NULL when
 * m is not a map or has no such key. Of duplicate keys the last counts, as in the
 * dict Python's msgpack unpacks from the same bytes. */
const msgpack_object *tw_msgpack_map_get(const msgpack_object *m, const char *key);

/* tw_msgpack_str_eq: 1 when o is a str equal to s, else 0
 * (not a taskwire error code). */
int tw_msgpack_str_eq(const msgpack_object *o, const char *s);

#pragma GCC visibility pop

#ifdef __cplusplus
}
#endif
#endif
