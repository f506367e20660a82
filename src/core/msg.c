/* SPDX-License-Identifier: BSD-3-Clause */
/* Messages as refcounted frame lists (include/taskwire/msg.h). */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include <taskwire/error.h>

#include "core/block.h"
#include "core/msg.h"
#include "core/stats.h"

/* Frames held in the message itself: most messages have a few, so they
 * cost no allocation of their own. */
#define INLINE_FRAMES 4

struct tw_msg {
	_Atomic size_t refs;
	size_t n, cap;
	uint64_t bytes;
	tw_slice *frames; /* inline, or malloc'd once more are needed */
	tw_slice inline_frames[INLINE_FRAMES];
};

int tw_msg_new(tw_msg **out)
{
	tw_msg *m;
	if (out == NULL)
		return TW_EINVAL;
	if ((m = malloc(sizeof(*m))) == NULL)
		return TW_ENOMEM;
	atomic_init(&m->refs, 1);
	m->n = m->bytes = 0;
	m->cap = INLINE_FRAMES;
	m->frames = m->inline_frames;
	*out = m;
	return 0;
}

tw_msg *tw_msg_hold(tw_msg *m)
{
	atomic_fetch_add_explicit(&m->refs, 1, memory_order_relaxed);
	return m;
}

void tw_msg_free(tw_msg *m)
{
	if (m == NULL || atomic_fetch_sub_explicit(&m->refs, 1, memory_order_acq_rel) != 1)
		return;
	for (size_t i = 0; i < m->n; i++)
		tw_block_free(m->frames[i].block);
	if (m->frames != m->inline_frames)
		free(m->frames);
	free(m);
}

int tw__msg_reserve(tw_msg *m, size_t n)
{
	size_t cap = m->cap;
	tw_slice *f;
	if (n <= m->cap)
		return 0;
	while (cap < n)
		cap *= 2;
	if (m->frames == m->inline_frames) {
		if ((f = malloc(cap * sizeof(*f))) == NULL)
			return TW_ENOMEM;
		memcpy(f, m->frames, m->n * sizeof(*f));
	} else if ((f = realloc(m->frames, cap * sizeof(*f))) == NULL) {
		return TW_ENOMEM;
	}
	m->frames = f;
	m->cap = cap;
	return 0;
}

void tw__msg_append_owned(tw_msg *m, tw_slice frame)
{
	m->frames[m->n++] = frame;
	m->bytes += frame.len;
}

int tw_msg_append(tw_msg *m, const tw_slice *frame)
{
	tw_slice s;
	if (m == NULL || frame == NULL)
		return TW_EINVAL;
	if (frame->block == NULL ? frame->len != 0
				 : frame->offset > tw_block_size(frame->block) ||
					   frame->len > tw_block_size(frame->block) - frame->offset)
		return TW_EINVAL;
	if (tw__msg_reserve(m, m->n + 1) != 0)
		return TW_ENOMEM;
	s = *frame;
	if (s.block != NULL)
		tw_block_hold(s.block);
	tw__msg_append_owned(m, s);
	return 0;
}

int tw_msg_append_copy(tw_msg *m, const void *data, size_t len)
{
	tw_block *b;
	if (m == NULL || (data == NULL && len > 0))
		return TW_EINVAL;
	if (tw__msg_reserve(m, m->n + 1) != 0 || tw_block_new(len, &b) != 0)
		return TW_ENOMEM;
	if (len > 0)
		memcpy(tw_block_data(b), data, len);
	TW__ADD(&tw__global_stats, payload_bytes_copied, len);
	tw__msg_append_owned(m, (tw_slice){b, 0, len});
	return 0;
}

int tw_msg_append_ref(tw_msg *m, const void *data, size_t len,
		      void (*release)(void *data, void *arg), void *arg)
{
	tw_block *b;
	if (m == NULL || (data == NULL && len > 0))
		return TW_EINVAL;
	if (tw__msg_reserve(m, m->n + 1) != 0 ||
	    tw_block_wrap((void *)data, len, release, arg, &b) != 0)
		return TW_ENOMEM;
	tw__msg_append_owned(m, (tw_slice){b, 0, len});
	return 0;
}

size_t tw_msg_nframes(const tw_msg *m)
{
	return m->n;
}

const tw_slice *tw_msg_frame(const tw_msg *m, size_t i)
{
	return i < m->n ? &m->frames[i] : NULL;
}

uint64_t tw_msg_bytes(const tw_msg *m)
{
	return m->bytes;
}

void tw__msg_truncate(tw_msg *m, size_t n)
{
	while (m->n > n) {
		tw_slice *f = &m->frames[--m->n];
		m->bytes -= f->len;
		tw_block_free(f->block);
	}
}

size_t tw__msg_footprint(const tw_msg *m)
{
	size_t bytes = sizeof(*m) + 16; /* 16: malloc's chunk header */
	if (m->frames != m->inline_frames)
		bytes += m->cap * sizeof(*m->frames) + 16;
	return bytes + m->n * tw__block_overhead();
}

const tw_slice *tw__msg_frames(const tw_msg *m)
{
	return m->frames;
}
