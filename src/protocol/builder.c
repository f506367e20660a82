/* SPDX-License-Identifier: BSD-3-Clause */
/* Building Dask messages: frame 0 packed with msgpack-c, payload groups
 * appended as sub-header + frames (include/taskwire/serial.h; Dask's
 * distributed/protocol/core.py dumps). */
#include <stdlib.h>
#include <string.h>

#include <taskwire/error.h>
#include <taskwire/serial.h>

#include "core/block.h"
#include "core/msg.h"
#include "core/zalloc.h"
#include "core/stats.h"
#include "protocol/builder.h"
#include "protocol/compress.h"
#include "protocol/decode.h"

/* pickle.dumps(bytes, protocol=5): how Python names the `bytes` type in
 * "type-serialized" (docs/design.md, Messages). */
static const uint8_t bytes_type_pickle[33] = {0x80, 0x05, 0x95, 0x16, 0x00, 0x00, 0x00, 0x00, 0x00,
					      0x00, 0x00, 0x8c, 0x08, 0x62, 0x75, 0x69, 0x6c, 0x74,
					      0x69, 0x6e, 0x73, 0x94, 0x8c, 0x05, 0x62, 0x79, 0x74,
					      0x65, 0x73, 0x94, 0x93, 0x94, 0x2e};

int tw__builder_init(tw_builder *b, const char *compression)
{
	enum tw__codec codec = TW__CODEC_NONE;
	if (compression != NULL && tw__codec_parse(compression, strlen(compression), &codec) != 0)
		return TW_ENOTSUP;
	tw__packbuf_init(&b->frame0);
	tw__packbuf_packer(&b->frame0, &b->pk);
	b->codec = codec;
	b->groups = NULL;
	b->done = 0;
	return 0;
}

void tw__builder_fini(tw_builder *b)
{
	tw__packbuf_fini(&b->frame0);
	tw_msg_free(b->groups);
}

int tw_builder_new(const char *compression, tw_builder **out)
{
	tw_builder *b;
	int rv;
	if (out == NULL)
		return TW_EINVAL;
	if ((b = malloc(sizeof(*b))) == NULL)
		return TW_ENOMEM;
	if ((rv = tw__builder_init(b, compression)) != 0) {
		free(b);
		return rv;
	}
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
	tw__builder_fini(b);
	free(b);
}

int tw_msgpack_pack_str(msgpack_packer *pk, const char *s)
{
	size_t n = strlen(s);
	return msgpack_pack_str(pk, n) == 0 ? msgpack_pack_str_body(pk, s, n) : -1;
}

static size_t ngroup_frames(const tw_builder *b)
{
	return b->groups != NULL ? tw_msg_nframes(b->groups) : 0;
}

/* The frames after frame 0, made when the first group comes: a message
 * without payload groups (most small RPCs) never needs them. */
static int need_groups(tw_builder *b)
{
	return b->groups != NULL || tw_msg_new(&b->groups) == 0 ? 0 : TW_ENOMEM;
}

static void pack_placeholder(tw_builder *b)
{
	msgpack_pack_map(&b->pk, 1);
	tw_msgpack_pack_str(&b->pk, "__Serialized__");
	msgpack_pack_uint64(&b->pk, 1 + ngroup_frames(b));
}

/* Sub-header keys shared by every group of one frame. */
static void pack_common(msgpack_packer *pk, const char *codec)
{
	tw_msgpack_pack_str(pk, "num-sub-frames");
	msgpack_pack_uint8(pk, 1);
	tw_msgpack_pack_str(pk, "compression");
	msgpack_pack_array(pk, 1);
	if (codec != NULL)
		tw_msgpack_pack_str(pk, codec);
	else
		msgpack_pack_nil(pk);
}

/* Append sub-header and frame; on failure the message is left as it was
 * except for frames already appended, which finish never uses. */
static int append_group(tw_builder *b, struct tw__packbuf *sub, const tw_slice *frame)
{
	if (need_groups(b) != 0 || tw__packbuf_append(b->groups, sub) != 0)
		return TW_ENOMEM;
	return tw_msg_append(b->groups, frame);
}

int tw_builder_pack_bytes(tw_builder *b, const tw_slice *data)
{
	struct tw__packbuf sub;
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
	tw__packbuf_init(&sub);
	tw__packbuf_packer(&sub, &pk);
	msgpack_pack_map(&pk, 8);
	tw_msgpack_pack_str(&pk, "serializer");
	tw_msgpack_pack_str(&pk, "dask");
	tw_msgpack_pack_str(&pk, "type");
	tw_msgpack_pack_str(&pk, "bytes");
	tw_msgpack_pack_str(&pk, "type-serialized");
	msgpack_pack_bin(&pk, sizeof(bytes_type_pickle));
	msgpack_pack_bin_body(&pk, bytes_type_pickle, sizeof(bytes_type_pickle));
	tw_msgpack_pack_str(&pk, "sub-header");
	msgpack_pack_map(&pk, 0);
	tw_msgpack_pack_str(&pk, "split-num-sub-frames");
	msgpack_pack_array(&pk, 1);
	msgpack_pack_uint8(&pk, 1);
	tw_msgpack_pack_str(&pk, "split-offsets");
	msgpack_pack_array(&pk, 1);
	msgpack_pack_uint8(&pk, 0);
	pack_common(&pk, codec);
	pack_placeholder(b);
	rv = append_group(b, &sub, z.block != NULL ? &z : data);
	tw_block_free(z.block);
	tw__packbuf_fini(&sub);
	return rv;
}

int tw_builder_pack_msgpack(tw_builder *b, const void *packed, size_t len)
{
	struct tw__packbuf sub;
	msgpack_packer pk;
	tw_block *blk;
	int rv;
	if (b == NULL || b->done || (packed == NULL && len > 0))
		return TW_EINVAL;
	if (tw_block_new(len, &blk) != 0)
		return TW_ENOMEM;
	memcpy(tw_block_data(blk), packed, len);
	TW__ADD(&tw__global_stats, payload_bytes_copied, len);
	tw__packbuf_init(&sub);
	tw__packbuf_packer(&sub, &pk);
	msgpack_pack_map(&pk, 3);
	tw_msgpack_pack_str(&pk, "serializer");
	tw_msgpack_pack_str(&pk, "msgpack");
	pack_common(&pk, NULL);
	pack_placeholder(b);
	rv = append_group(b, &sub, &(tw_slice){blk, 0, len});
	tw_block_free(blk);
	tw__packbuf_fini(&sub);
	return rv;
}

static int skip_key(const msgpack_object *k)
{
	return TW__STR_IS(k, "num-sub-frames") || TW__STR_IS(k, "compression") ||
	       TW__STR_IS(k, "split-num-sub-frames") || TW__STR_IS(k, "split-offsets");
}

/* Frame i of a re-packed group, compressed when the builder says so;
 * *codec gets the codec name or NULL. */
static int group_frame(tw_builder *b, const tw_slice *f, tw_slice *out, const char **codec)
{
	*codec = NULL;
	*out = *f;
	if (b->codec == TW__CODEC_NONE || f->len == 0)
		return 0;
	if (tw__compress(b->codec, tw_slice_data(f), f->len, out) != 0)
		return TW_ENOMEM;
	if (out->block == NULL) {
		*out = *f;
		return 0;
	}
	*codec = tw__codec_name(b->codec);
	return 1; /* out holds a new reference */
}

/* A serialized group's split keys when no frame is split: one sub-frame
 * per logical frame, the i-th at offset i. */
static void pack_unsplit(msgpack_packer *pk, size_t nframes)
{
	tw_msgpack_pack_str(pk, "split-num-sub-frames");
	msgpack_pack_array(pk, nframes);
	for (size_t i = 0; i < nframes; i++)
		msgpack_pack_uint8(pk, 1);
	tw_msgpack_pack_str(pk, "split-offsets");
	msgpack_pack_array(pk, nframes);
	for (size_t i = 0; i < nframes; i++)
		msgpack_pack_uint64(pk, i);
}

/* Re-emit a received payload group: its sub-header's own keys, its
 * logical frames (one sub-frame each, no split), new bookkeeping keys. */
static int pack_group(tw_builder *b, const tw_payload *p)
{
	const msgpack_object *h = p->sub_header;
	int serialized = p->kind == TW_PAYLOAD_SERIALIZED, rv = 0;
	uint32_t keep = 0;
	struct tw__packbuf sub;
	msgpack_packer pk;
	tw_msg *frames;
	for (uint32_t i = 0; i < h->via.map.size; i++)
		keep += !skip_key(&h->via.map.ptr[i].key);
	if (tw_msg_new(&frames) != 0)
		return TW_ENOMEM;
	tw__packbuf_init(&sub);
	tw__packbuf_packer(&sub, &pk);
	msgpack_pack_map(&pk, keep + (serialized ? 4 : 2));
	for (uint32_t i = 0; i < h->via.map.size; i++) {
		if (skip_key(&h->via.map.ptr[i].key))
			continue;
		msgpack_pack_object(&pk, h->via.map.ptr[i].key);
		msgpack_pack_object(&pk, h->via.map.ptr[i].val);
	}
	tw_msgpack_pack_str(&pk, "num-sub-frames");
	msgpack_pack_uint64(&pk, p->nframes);
	tw_msgpack_pack_str(&pk, "compression");
	msgpack_pack_array(&pk, p->nframes);
	for (size_t i = 0; i < p->nframes && rv == 0; i++) {
		const char *codec;
		tw_slice f;
		int owned = group_frame(b, &p->frames[i], &f, &codec);
		if (owned < 0) {
			rv = owned;
			break;
		}
		if (codec != NULL)
			tw_msgpack_pack_str(&pk, codec);
		else
			msgpack_pack_nil(&pk);
		rv = tw_msg_append(frames, &f);
		if (owned)
			tw_block_free(f.block);
	}
	if (serialized)
		pack_unsplit(&pk, p->nframes);
	if (rv == 0) {
		msgpack_pack_map(&b->pk, 1);
		tw_msgpack_pack_str(&b->pk, serialized ? "__Serialized__" : "__Pickled__");
		msgpack_pack_uint64(&b->pk, 1 + ngroup_frames(b));
		rv = need_groups(b) != 0 ? TW_ENOMEM : tw__packbuf_append(b->groups, &sub);
	}
	for (size_t i = 0; rv == 0 && i < tw_msg_nframes(frames); i++)
		rv = tw_msg_append(b->groups, tw_msg_frame(frames, i));
	tw_msg_free(frames);
	tw__packbuf_fini(&sub);
	return rv;
}

/* Send a group on as it came: its sub-header frame and its frames, by
 * reference (tw__decoded_raw: they describe each other unchanged). A
 * scheduler forwarding 100,000 small values packed a new sub-header for
 * each (a malloc, a msgpack walk, a tw_msg): 16% of its CPU (issue 16). */
static int pack_raw(tw_builder *b, const tw_payload *p, const tw_slice *sub)
{
	size_t n = ngroup_frames(b);
	if (need_groups(b) != 0 || tw__msg_reserve(b->groups, n + 1 + p->nframes) != 0)
		return TW_ENOMEM;
	msgpack_pack_map(&b->pk, 1);
	tw_msgpack_pack_str(&b->pk,
			    p->kind == TW_PAYLOAD_SERIALIZED ? "__Serialized__" : "__Pickled__");
	msgpack_pack_uint64(&b->pk, 1 + n);
	tw__msg_append_owned(b->groups,
			     tw__slice(tw_block_hold(sub->block), sub->offset, sub->len));
	for (size_t i = 0; i < p->nframes; i++) {
		tw_slice f = p->frames[i];
		if (f.block != NULL)
			tw_block_hold(f.block);
		tw__msg_append_owned(b->groups, f);
	}
	return 0;
}

int tw_builder_pack_object(tw_builder *b, const tw_decoded *d, const msgpack_object *o)
{
	const tw_payload *p = d != NULL ? tw_decoded_payload(d, o) : NULL;
	const tw_slice *raw;
	int rv = 0;
	if (b == NULL || o == NULL || b->done)
		return TW_EINVAL;
	/* a relay group (include/taskwire/relay.h) goes on as it came too,
	 * whatever the codec: its frames cannot be read, as Dask's scheduler
	 * forwards Serialized values */
	if (p != NULL && p->relay_sub_header != NULL)
		return pack_raw(b, p, p->relay_sub_header);
	if (p != NULL && b->codec == TW__CODEC_NONE && (raw = tw__decoded_raw(d, p)) != NULL)
		return pack_raw(b, p, raw);
	if (p != NULL)
		return pack_group(b, p);
	switch (o->type) {
	case MSGPACK_OBJECT_ARRAY:
		msgpack_pack_array(&b->pk, o->via.array.size);
		for (uint32_t i = 0; i < o->via.array.size && rv == 0; i++)
			rv = tw_builder_pack_object(b, d, &o->via.array.ptr[i]);
		return rv;
	case MSGPACK_OBJECT_MAP:
		msgpack_pack_map(&b->pk, o->via.map.size);
		for (uint32_t i = 0; i < o->via.map.size && rv == 0; i++) {
			rv = tw_builder_pack_object(b, d, &o->via.map.ptr[i].key);
			if (rv == 0)
				rv = tw_builder_pack_object(b, d, &o->via.map.ptr[i].val);
		}
		return rv;
	default: return msgpack_pack_object(&b->pk, *o) == 0 ? 0 : TW_ENOMEM;
	}
}

int tw_builder_finish(tw_builder *b, tw_msg **out)
{
	tw_msg *m;
	size_t n;
	if (b == NULL || out == NULL || b->done)
		return TW_EINVAL;
	n = ngroup_frames(b);
	if (tw_msg_new(&m) != 0 || tw__msg_reserve(m, n + 1) != 0 ||
	    tw__packbuf_append(m, &b->frame0) != 0) {
		tw_msg_free(m);
		return TW_ENOMEM;
	}
	for (size_t i = 0; i < n; i++)
		tw_msg_append(m, tw_msg_frame(b->groups, i)); /* room reserved */
	b->done = 1;
	*out = m;
	return 0;
}

int tw__builder_empty(const tw_builder *b)
{
	return b->frame0.size == 0;
}
