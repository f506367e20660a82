/* SPDX-License-Identifier: BSD-3-Clause */
/* Structural msgpack check (protocol/mpcheck.h), following the msgpack
 * spec's formats (github.com/msgpack/msgpack/blob/master/spec.md). */
#include <string.h>

#include <taskwire/error.h>

#include "core/utf8.h"
#include "protocol/mpcheck.h"

struct cursor {
	const uint8_t *p;
	size_t n, off;
	uint64_t elems; /* container elements: one msgpack_object each */
	const char *why;
};

static int fail(struct cursor *c, const char *why)
{
	c->why = why;
	return TW_EPROTO;
}

/* Read a big-endian unsigned of `size` bytes. */
static int take_uint(struct cursor *c, size_t size, uint64_t *v)
{
	if (c->n - c->off < size)
		return fail(c, "truncated msgpack value");
	*v = 0;
	for (size_t i = 0; i < size; i++)
		*v = (*v << 8) | c->p[c->off + i];
	c->off += size;
	return 0;
}

static int skip(struct cursor *c, uint64_t len)
{
	if (c->n - c->off < len)
		return fail(c, "truncated msgpack value");
	c->off += (size_t)len;
	return 0;
}

static int str_body(struct cursor *c, uint64_t len)
{
	if (c->n - c->off < len)
		return fail(c, "truncated msgpack str");
	if (!tw__utf8_valid(c->p + c->off, (size_t)len))
		return fail(c, "invalid UTF-8 in a msgpack str");
	c->off += (size_t)len;
	return 0;
}

static int value(struct cursor *c, int depth);

/* count elements (maps: 2 per entry); each takes at least one byte. */
static int elements(struct cursor *c, uint64_t count, int depth)
{
	if (depth >= TW__MP_MAX_DEPTH)
		return fail(c, "msgpack nesting too deep");
	if (count > c->n - c->off)
		return fail(c, "msgpack container larger than its frame");
	c->elems += count;
	for (uint64_t i = 0; i < count; i++)
		if (value(c, depth + 1) != 0)
			return TW_EPROTO;
	return 0;
}

/* Sized formats 0xc4..0xdf (bin, ext, fixed numbers, str, array, map). */
static int sized(struct cursor *c, uint8_t t, int depth)
{
	/* clang-format off */
	static const uint8_t width[] = {
		/* c4 bin8 */ 1, 2, 4, /* c7 ext8 */ 1, 2, 4, /* ca float32 */ 0, 0,
		/* cc uint8 */ 0, 0, 0, 0, /* d0 int8 */ 0, 0, 0, 0,
		/* d4 fixext */ 0, 0, 0, 0, 0, /* d9 str8 */ 1, 2, 4,
		/* dc array16 */ 2, 4, /* de map16 */ 2, 4};
	static const uint8_t fixed[] = {0, 0, 0, 0, 0, 0, 4, 8, 1, 2, 4, 8, 1, 2, 4, 8,
					2, 3, 5, 9, 17, 0, 0, 0, 0, 0, 0, 0};
	/* clang-format on */
	size_t i = t - 0xc4;
	uint64_t len;
	if (fixed[i] > 0)
		return skip(c, fixed[i]);
	if (take_uint(c, width[i], &len) != 0)
		return TW_EPROTO;
	if (t <= 0xc6)
		return skip(c, len);
	if (t <= 0xc9)
		return skip(c, len + 1); /* ext: type byte, then data */
	if (t <= 0xdb)
		return str_body(c, len);
	if (t <= 0xdd)
		return elements(c, len, depth);
	return len > UINT64_MAX / 2 ? fail(c, "msgpack map too large")
				    : elements(c, 2 * len, depth);
}

static int value(struct cursor *c, int depth)
{
	uint8_t t;
	if (c->off >= c->n)
		return fail(c, "truncated msgpack value");
	t = c->p[c->off++];
	if (t <= 0x7f || t >= 0xe0 || t == 0xc0 || t == 0xc2 || t == 0xc3)
		return 0;
	if (t <= 0x8f)
		return elements(c, 2u * (t & 0x0f), depth);
	if (t <= 0x9f)
		return elements(c, t & 0x0f, depth);
	if (t <= 0xbf)
		return str_body(c, t & 0x1f);
	if (t == 0xc1)
		return fail(c, "msgpack byte 0xc1 is never used");
	return sized(c, t, depth);
}

int tw__mp_check(const uint8_t *p, size_t n, uint64_t *elems, const char **why)
{
	struct cursor c = {p, n, 0, 0, NULL};
	if (n == 0) {
		*why = "empty msgpack frame";
		return TW_EPROTO;
	}
	if (value(&c, 0) != 0) {
		*why = c.why;
		return TW_EPROTO;
	}
	if (c.off != n) {
		*why = "trailing bytes after the msgpack value";
		return TW_EPROTO;
	}
	if (elems != NULL)
		*elems = c.elems;
	return 0;
}
