/* SPDX-License-Identifier: BSD-3-Clause */
/* Packing buffers (protocol/packbuf.h). */
#include <string.h>

#include <taskwire/error.h>

#include "core/block.h"
#include "core/msg.h"
#include "protocol/packbuf.h"

void tw__packbuf_init(struct tw__packbuf *pb)
{
	pb->data = NULL;
	pb->size = pb->cap = 0;
	pb->failed = 0;
}

void tw__packbuf_packer(struct tw__packbuf *pb, msgpack_packer *pk)
{
	msgpack_packer_init(pk, pb, tw__packbuf_write);
}

static int grow(struct tw__packbuf *pb, size_t need)
{
	size_t cap = pb->cap ? pb->cap : TW__PACKBUF_START;
	uint8_t *p;
	while (cap < need) {
		if (cap > SIZE_MAX / 2)
			return -1;
		cap *= 2;
	}
	p = pb->data == NULL ? tw__block_draft(cap) : tw__block_draft_grow(pb->data, cap);
	if (p == NULL)
		return -1;
	pb->data = p;
	pb->cap = cap;
	return 0;
}

/* Room for len more bytes. A failure is for good: cap drops to size, so
 * every later write comes here and is refused. */
static int reserve(struct tw__packbuf *pb, size_t len)
{
	if (pb->failed || len > SIZE_MAX - pb->size || grow(pb, pb->size + len) != 0) {
		pb->failed = 1;
		pb->cap = pb->size;
		return -1;
	}
	return 0;
}

int tw__packbuf_write(void *arg, const char *buf, size_t len)
{
	struct tw__packbuf *pb = arg;
	if (len == 0) /* refused too after a failure; data may be NULL */
		return pb->failed ? -1 : 0;
	if (pb->cap - pb->size < len && reserve(pb, len) != 0)
		return -1;
	/* msgpack-c writes most headers and small values one byte at a
	 * time: those need no memcpy call */
	if (len == 1)
		pb->data[pb->size] = (uint8_t)buf[0];
	else
		memcpy(pb->data + pb->size, buf, len);
	pb->size += len;
	return 0;
}

int tw__packbuf_append(tw_msg *m, struct tw__packbuf *pb)
{
	tw_block *b;
	if (pb->failed || (pb->data == NULL && grow(pb, 1) != 0) ||
	    tw__msg_reserve(m, tw_msg_nframes(m) + 1) != 0) {
		tw__packbuf_fini(pb);
		return TW_ENOMEM;
	}
	b = tw__block_seal(pb->data, pb->size);
	tw__msg_append_owned(m, tw__slice(b, 0, pb->size));
	tw__packbuf_init(pb);
	return 0;
}

void tw__packbuf_fini(struct tw__packbuf *pb)
{
	tw__block_draft_free(pb->data);
	tw__packbuf_init(pb);
}

void tw__packbuf_truncate(struct tw__packbuf *pb, size_t size)
{
	pb->size = size;
	pb->failed = 0;
}
