/* SPDX-License-Identifier: BSD-3-Clause */
/* Stream framing codec (transport/stream_codec.h). */
#include <endian.h>
#include <stdlib.h>
#include <string.h>

#include <taskwire/error.h>

#include "transport/stream_codec.h"

void tw__sdec_init(struct tw__sdec *d, uint64_t max_message_bytes, uint64_t max_frames)
{
	memset(d, 0, sizeof(*d));
	d->max_message_bytes = max_message_bytes;
	d->max_frames = max_frames;
}

void tw__sdec_fini(struct tw__sdec *d)
{
	if (d->lens != d->lens_inline)
		free(d->lens);
	d->lens = NULL;
}

void tw__sdec_reset(struct tw__sdec *d)
{
	tw__sdec_fini(d);
	tw__sdec_init(d, d->max_message_bytes, d->max_frames);
}

void tw__sdec_want(struct tw__sdec *d, uint8_t **dst, size_t *len)
{
	switch (d->state) {
	case SDEC_TOTAL:
	case SDEC_COUNT:
		*dst = d->word + d->have;
		*len = 8 - d->have;
		return;
	case SDEC_LENGTHS:
		*dst = (uint8_t *)d->lens + d->have;
		*len = 8 * d->n - d->have;
		return;
	default: *dst = NULL; *len = 0;
	}
}

static int fail(struct tw__sdec *d, int err)
{
	d->state = SDEC_ERROR;
	d->err = err;
	return err;
}

static uint64_t word(const struct tw__sdec *d)
{
	uint64_t v;
	memcpy(&v, d->word, 8);
	return le64toh(v);
}

/* The total field: checked against the limit before anything else. It
 * must at least hold N; whether it holds N's lengths is checked when N is
 * in, so that N = 0 is reported as such. */
static int got_total(struct tw__sdec *d)
{
	d->total = word(d);
	if (d->total > d->max_message_bytes)
		return fail(d, TW_ETOOBIG);
	if (d->total < 8)
		return fail(d, TW_ELENGTH);
	d->state = SDEC_COUNT;
	d->have = 0;
	return 0;
}

/* The frame count: bounded by the frames limit and by what total can hold
 * (8 + 8N <= total, written so it cannot overflow), before the lengths
 * array is allocated. */
static int got_count(struct tw__sdec *d)
{
	d->n = word(d);
	if (d->n == 0)
		return fail(d, TW_ENOFRAMES);
	if (d->n > d->max_frames)
		return fail(d, TW_ETOOMANY);
	if (d->n > (d->total - 8) / 8)
		return fail(d, TW_ELENGTH);
	if (d->n <= sizeof(d->lens_inline) / 8)
		d->lens = d->lens_inline;
	else if ((d->lens = malloc(8 * d->n)) == NULL)
		return fail(d, TW_ENOMEM);
	d->state = SDEC_LENGTHS;
	d->have = 0;
	return 0;
}

/* Validate the lengths completed so far: their sum may never pass the
 * payload that total leaves, and must equal it at the end. */
static int got_lengths(struct tw__sdec *d)
{
	uint64_t room = tw__sdec_payload(d);
	for (; d->checked < d->have / 8; d->checked++) {
		uint64_t len = le64toh(d->lens[d->checked]);
		d->lens[d->checked] = len;
		if (len > room - d->sum)
			return fail(d, TW_ELENGTH);
		d->sum += len;
	}
	if (d->checked < d->n)
		return 0;
	if (d->sum != room)
		return fail(d, TW_ELENGTH);
	d->state = SDEC_DONE;
	return 1;
}

int tw__sdec_advance(struct tw__sdec *d, size_t n)
{
	int rv;
	if (d->state == SDEC_ERROR)
		return d->err;
	if (d->state == SDEC_DONE)
		return 1;
	d->have += n;
	switch (d->state) {
	case SDEC_TOTAL:
		if (d->have < 8)
			return 0;
		if ((rv = got_total(d)) != 0)
			return rv;
		return 0;
	case SDEC_COUNT:
		if (d->have < 8)
			return 0;
		return got_count(d);
	case SDEC_LENGTHS: return got_lengths(d);
	default: return d->err;
	}
}

int tw__sdec_feed(struct tw__sdec *d, const uint8_t *p, size_t n, size_t *used)
{
	int rv = d->state == SDEC_ERROR ? d->err : d->state == SDEC_DONE;
	*used = 0;
	while (rv == 0 && *used < n) {
		uint8_t *dst;
		size_t want, k;
		tw__sdec_want(d, &dst, &want);
		k = want < n - *used ? want : n - *used;
		if (k == 8) /* a whole field, the usual case: no memcpy call */
			memcpy(dst, p + *used, 8);
		else
			memcpy(dst, p + *used, k);
		*used += k;
		rv = tw__sdec_advance(d, k);
	}
	return rv;
}

void tw__stream_encode_prelude(const tw_slice *frames, size_t n, uint8_t *out)
{
	uint64_t total = 8 + 8 * (uint64_t)n, v;
	for (size_t i = 0; i < n; i++) {
		v = htole64((uint64_t)frames[i].len);
		memcpy(out + 16 + 8 * i, &v, 8);
		total += frames[i].len;
	}
	v = htole64(total);
	memcpy(out, &v, 8);
	v = htole64((uint64_t)n);
	memcpy(out + 8, &v, 8);
}
