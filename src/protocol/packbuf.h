/* SPDX-License-Identifier: BSD-3-Clause */
/* Packing buffers: where msgpack-c's packer writes a frame that will be
 * sent. The bytes grow in a block draft (core/block.h), so the finished
 * frame becomes a block with no copy and no second allocation. */
#ifndef TW_PROTOCOL_PACKBUF_H
#define TW_PROTOCOL_PACKBUF_H

#include <stddef.h>
#include <stdint.h>

#include <msgpack.h>

#include <taskwire/msg.h>

/* Bytes of the first allocation; the buffer doubles as it fills. Most
 * frames 0 and sub-headers are a few hundred bytes. */
#define TW__PACKBUF_START 256

struct tw__packbuf {
	uint8_t *data; /* a block draft, NULL until the first write */
	size_t size, cap;
	int failed; /* a write ran out of memory: the bytes are incomplete */
};

/* An empty buffer; allocates nothing. */
void tw__packbuf_init(struct tw__packbuf *pb);

/* Bind a packer to pb (msgpack_packer_init with tw__packbuf_write). */
void tw__packbuf_packer(struct tw__packbuf *pb, msgpack_packer *pk);

/* msgpack_packer_write: append len bytes; 0, or -1 when out of memory
 * (pb->failed is then set and later writes are refused too). */
int tw__packbuf_write(void *pb, const char *buf, size_t len);

/* Move the packed bytes into m as its new last frame, without copying;
 * pb is left empty. Returns 0, or TW_ENOMEM when a write or this call ran
 * out of memory (the bytes are then dropped and m is unchanged). */
int tw__packbuf_append(tw_msg *m, struct tw__packbuf *pb);

/* Cut the bytes back to `size` (<= pb->size), forgetting a failed
 * write after it: what lies before size was whole. */
void tw__packbuf_truncate(struct tw__packbuf *pb, size_t size);

/* Drop the bytes; pb is left empty. */
void tw__packbuf_fini(struct tw__packbuf *pb);

#endif
