/* Building Dask messages: frame 0 packed with msgpack-c, payload groups
 * appended as sub-header + frames (include/taskwire/serial.h; Dask's
 * distributed/protocol/core.py dumps). */
#include <stdlib.h>
#include <string.h>

#include <taskwire/error.h>
#include <taskwire/serial.h>

#include "core/msg.h"
#include "core/stats.h"
#include "protocol/compress.h"

/* pickle.dumps(bytes, protocol=5): how Python names the `bytes` type in
 * "type-serialized" (DESIGN.md, Messages). */
static const uint8_t bytes_type_pickle[33] = {
	0x80, 0x05, 0x95, 0x16, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x8c,
	0x08, 0x62, 0x75, 0x69, 0x6c, 0x74, 0x69, 0x6e, 0x73, 0x94, 0x8c, 0x05,
	0x62, 0x79, 0x74, 0x65, 0x73, 0x94, 0x93, 0x94, 0x2e};

struct tw_builder {
	msgpack_sbuffer frame0;
	msgpack_packer pk;
	enum tw__codec codec;
	tw_msg *groups; /* frames 1.. */
	int done;
};

int tw_builder_new(const char *compression, tw_builder **out)
{
	tw_builder *b;
	enum tw__codec codec = TW__CODEC_NONE;
	if (out == NULL)
		return TW_EINVAL;
	if (compression != NULL && tw__codec_parse(compression, strlen(compression), &codec) != 0)
		return TW_ENOTSUP;
	if ((b = calloc(1, sizeof(*b))) == NULL)
		return TW_ENOMEM;
	if (tw_msg_new(&b->groups) != 0) {
		free(b);
		return TW_ENOMEM;
	}
	msgpack_sbuffer_init(&b->frame0);
	msgpack_packer_init(&b->pk, &b->frame0, msgpack_sbuffer_write);
	b->codec = codec;
	*out = b;
	return 0;
}

msgpack_packer *tw_builder_packer(tw_builder *b)
{
	return &b->pk;
}

void tw_builder_free(tw_builder *b)
{
	if (b == NULL)
		return;
	msgpack_sbuffer_destroy(&b->frame0);
	tw_msg_free(b->groups);
	free(b);
}

static void release_malloc(void *data, void *arg)
{
	(void)arg;
	free(data);
}

/* Move a packed buffer into a message as a frame, without copying it. */
static int append_sbuffer(tw_msg *m, msgpack_sbuffer *sb)
{
	size_t len = sb->size;
	char *data = msgpack_sbuffer_release(sb);
	if (tw_msg_append_ref(m, data, len, release_malloc, NULL) != 0) {
		free(data);
		return TW_ENOMEM;
	}
	return 0;
}

static void pack_str(msgpack_packer *pk, const char *s)
{
	size_t n = strlen(s);
	msgpack_pack_str(pk, n);
	msgpack_pack_str_body(pk, s, n);
}

static void pack_placeholder(tw_builder *b)
{
	msgpack_pack_map(&b->pk, 1);
	pack_str(&b->pk, "__Serialized__");
	msgpack_pack_uint64(&b->pk, 1 + tw_msg_nframes(b->groups));
}

/* Sub-header keys shared by every group of one frame. */
static void pack_common(msgpack_packer *pk, const char *codec)
{
	pack_str(pk, "num-sub-frames");
	msgpack_pack_uint8(pk, 1);
	pack_str(pk, "compression");
	msgpack_pack_array(pk, 1);
	if (codec != NULL)
		pack_str(pk, codec);
	else
		msgpack_pack_nil(pk);
}

/* Append sub-header and frame; on failure the message is left as it was
 * except for frames already appended, which finish never uses. */
static int append_group(tw_builder *b, msgpack_sbuffer *sub, const tw_slice *frame)
{
	if (append_sbuffer(b->groups, sub) != 0)
		return TW_ENOMEM;
	return tw_msg_append(b->groups, frame);
}

int tw_builder_pack_bytes(tw_builder *b, const tw_slice *data)
{
	msgpack_sbuffer sub;
	msgpack_packer pk;
	tw_slice z = {NULL, 0, 0};
	const char *codec = NULL;
	int rv;
	if (b == NULL || data == NULL || b->done)
		return TW_EINVAL;
	if (b->codec != TW__CODEC_NONE && data->len > 0) {
		if (tw__compress(b->codec, tw_slice_data(data), data->len, &z) != 0)
			return TW_ENOMEM;
		if (z.block != NULL)
			codec = tw__codec_name(b->codec);
	}
	msgpack_sbuffer_init(&sub);
	msgpack_packer_init(&pk, &sub, msgpack_sbuffer_write);
	msgpack_pack_map(&pk, 8);
	pack_str(&pk, "serializer");
	pack_str(&pk, "dask");
	pack_str(&pk, "type");
	pack_str(&pk, "bytes");
	pack_str(&pk, "type-serialized");
	msgpack_pack_bin(&pk, sizeof(bytes_type_pickle));
	msgpack_pack_bin_body(&pk, bytes_type_pickle, sizeof(bytes_type_pickle));
	pack_str(&pk, "sub-header");
	msgpack_pack_map(&pk, 0);
	pack_str(&pk, "split-num-sub-frames");
	msgpack_pack_array(&pk, 1);
	msgpack_pack_uint8(&pk, 1);
	pack_str(&pk, "split-offsets");
	msgpack_pack_array(&pk, 1);
	msgpack_pack_uint8(&pk, 0);
	pack_common(&pk, codec);
	pack_placeholder(b);
	rv = append_group(b, &sub, z.block != NULL ? &z : data);
	tw_block_free(z.block);
	msgpack_sbuffer_destroy(&sub);
	return rv;
}

int tw_builder_pack_msgpack(tw_builder *b, const void *packed, size_t len)
{
	msgpack_sbuffer sub;
	msgpack_packer pk;
	tw_block *blk;
	int rv;
	if (b == NULL || b->done || (packed == NULL && len > 0))
		return TW_EINVAL;
	if (tw_block_new(len, &blk) != 0)
		return TW_ENOMEM;
	memcpy(tw_block_data(blk), packed, len);
	TW__ADD(&tw__global_stats, payload_bytes_copied, len);
	msgpack_sbuffer_init(&sub);
	msgpack_packer_init(&pk, &sub, msgpack_sbuffer_write);
	msgpack_pack_map(&pk, 3);
	pack_str(&pk, "serializer");
	pack_str(&pk, "msgpack");
	pack_common(&pk, NULL);
	pack_placeholder(b);
	rv = append_group(b, &sub, &(tw_slice){blk, 0, len});
	tw_block_free(blk);
	msgpack_sbuffer_destroy(&sub);
	return rv;
}

int tw_builder_finish(tw_builder *b, tw_msg **out)
{
	tw_msg *m;
	size_t n;
	if (b == NULL || out == NULL || b->done)
		return TW_EINVAL;
	n = tw_msg_nframes(b->groups);
	if (tw_msg_new(&m) != 0 || tw__msg_reserve(m, n + 1) != 0 ||
	    append_sbuffer(m, &b->frame0) != 0) {
		tw_msg_free(m);
		return TW_ENOMEM;
	}
	for (size_t i = 0; i < n; i++)
		tw_msg_append(m, tw_msg_frame(b->groups, i)); /* room reserved */
	b->done = 1;
	*out = m;
	return 0;
}
