/* SPDX-License-Identifier: BSD-3-Clause */
/* A WebSocket frame decoder driven over bytes in memory, the way the glue
 * drives it over a socket, with what it reports written down as text.
 * Shared by tests/check_ws_codec.c and tests/fuzz/fuzz_ws_codec.c, so the
 * unit tests and the fuzzer compare the same transcripts. Header-only, no
 * Check: a failed allocation sets oom and the caller decides.
 *
 * Transcript entries, one per event, in order:
 *   data(op=2,fin=0,first=1,len=5,msg=5,frags=1)  a data frame header
 *   end(len=10,frags=2,<payload>)                 a whole message
 *   ping(<payload>) pong(<payload>)               control frames
 *   close(1000,<reason>)                          a close (1005: no body)
 *   error(1002,<text>)                            the sticky failure
 * <payload> is lowercase hex up to 64 bytes, else "#" and an FNV-1a hash. */
#ifndef TW_TESTS_FUZZ_WS_DRIVE_H
#define TW_TESTS_FUZZ_WS_DRIVE_H

#include <inttypes.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "transport/ws_codec.h"

struct ws_log {
	char *s; /* the transcript, NUL-terminated */
	size_t len, cap;
	uint8_t *msg; /* payload of the message being received */
	size_t msg_len, msg_cap;
	uint64_t used; /* input bytes consumed */
	int rv;        /* 0, or the decoder's error */
	int oom;
	/* Called with every event before it is written down, if set. */
	void (*hook)(void *arg, const struct tw__ws_dec *d, const struct tw__ws_event *ev);
	void *hook_arg;
};

static inline void ws_log_init(struct ws_log *l)
{
	memset(l, 0, sizeof(*l));
}

static inline void ws_log_free(struct ws_log *l)
{
	free(l->s);
	free(l->msg);
	memset(l, 0, sizeof(*l));
}

static inline void ws_logf(struct ws_log *l, const char *fmt, ...)
{
	va_list ap;
	int n;
	va_start(ap, fmt);
	n = vsnprintf(NULL, 0, fmt, ap);
	va_end(ap);
	if (n < 0 || l->oom)
		return;
	if (l->len + (size_t)n + 1 > l->cap) {
		size_t cap = 2 * (l->len + (size_t)n + 1) + 64;
		char *s = realloc(l->s, cap);
		if (s == NULL) {
			l->oom = 1;
			return;
		}
		l->s = s;
		l->cap = cap;
	}
	va_start(ap, fmt);
	vsnprintf(l->s + l->len, l->cap - l->len, fmt, ap);
	va_end(ap);
	l->len += (size_t)n;
}

static inline void ws_log_bytes(struct ws_log *l, const uint8_t *p, size_t n)
{
	if (n <= 64) {
		for (size_t i = 0; i < n; i++)
			ws_logf(l, "%02x", p[i]);
	} else {
		uint64_t h = UINT64_C(0xcbf29ce484222325);
		for (size_t i = 0; i < n; i++)
			h = (h ^ p[i]) * UINT64_C(0x100000001b3);
		ws_logf(l, "#%016" PRIx64, h);
	}
}

static inline void ws_log_event(struct ws_log *l, const struct tw__ws_event *ev)
{
	switch (ev->type) {
	case TW__WS_EV_DATA:
		ws_logf(l,
			"data(op=%u,fin=%d,first=%d,len=%" PRIu64 ",msg=%" PRIu64 ",frags=%" PRIu64
			")",
			ev->opcode, ev->fin, ev->first, ev->length, ev->message_bytes,
			ev->fragments);
		break;
	case TW__WS_EV_MESSAGE_END:
		ws_logf(l, "end(len=%" PRIu64 ",frags=%" PRIu64 ",", ev->length, ev->fragments);
		ws_log_bytes(l, l->msg, l->msg_len);
		ws_logf(l, ")");
		l->msg_len = 0;
		break;
	case TW__WS_EV_PING:
	case TW__WS_EV_PONG:
		ws_logf(l, ev->type == TW__WS_EV_PING ? "ping(" : "pong(");
		ws_log_bytes(l, ev->payload, ev->payload_len);
		ws_logf(l, ")");
		break;
	case TW__WS_EV_CLOSE:
		ws_logf(l, "close(%u,", ev->code);
		ws_log_bytes(l, ev->payload, ev->payload_len);
		ws_logf(l, ")");
		break;
	default: ws_logf(l, "none()"); break;
	}
}

/* splitmix64 */
static inline uint64_t ws_rnd(uint64_t *s)
{
	uint64_t z = (*s += UINT64_C(0x9e3779b97f4a7c15));
	z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
	z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
	return z ^ (z >> 31);
}

/* Room for k more payload bytes in l->msg. */
static inline uint8_t *ws_log_room(struct ws_log *l, size_t k)
{
	if (l->msg_len + k > l->msg_cap) {
		size_t cap = 2 * (l->msg_len + k) + 64;
		uint8_t *m = realloc(l->msg, cap);
		if (m == NULL) {
			l->oom = 1;
			return NULL;
		}
		l->msg = m;
		l->msg_cap = cap;
	}
	return l->msg + l->msg_len;
}

/* Feed p[0..n) to d: header and control bytes through want/advance, data
 * payload read into l->msg (the caller's memory) and unmasked there by
 * payload_done. Each step takes at most one piece of input: all that is
 * wanted when max_piece is 0, else 1..max_piece bytes (1 when seed is
 * NULL, random from *seed otherwise). Stops at the end of the input, at an
 * error (logged, kept in l->rv) or after a close. Returns l->rv. */
static inline int ws_drive(struct tw__ws_dec *d, const uint8_t *p, size_t n, size_t max_piece,
			   uint64_t *seed, struct ws_log *l)
{
	size_t off = 0;
	while (!l->oom) {
		enum tw__ws_dec_phase ph = tw__ws_dec_phase(d);
		struct tw__ws_event ev;
		size_t piece = n - off, k;
		int rv;
		if (max_piece != 0) {
			size_t cap = seed != NULL ? 1 + (size_t)(ws_rnd(seed) % max_piece) : 1;
			if (piece > cap)
				piece = cap;
		}
		if (ph == TW__WS_DEC_BYTES) {
			uint8_t *dst;
			size_t want = tw__ws_dec_want(d, &dst);
			if (off == n)
				break;
			k = want < piece ? want : piece;
			memcpy(dst, p + off, k);
			rv = tw__ws_dec_advance(d, k, &ev);
		} else if (ph == TW__WS_DEC_PAYLOAD) {
			uint64_t room = tw__ws_dec_payload_room(d);
			uint8_t *dst = NULL;
			if (off == n && room > 0)
				break;
			k = room < piece ? (size_t)room : piece;
			if (k > 0) {
				if ((dst = ws_log_room(l, k)) == NULL)
					break;
				memcpy(dst, p + off, k);
			}
			l->msg_len += k;
			rv = tw__ws_dec_payload_done(d, dst, k, &ev);
		} else {
			break;
		}
		off += k;
		l->used += k;
		if (rv < 0) {
			const char *why = tw__ws_dec_error(d);
			ws_logf(l, "error(%u,%s)", tw__ws_dec_close_code(d), why ? why : "-");
			l->rv = rv;
			break;
		}
		if (rv == 1) {
			if (l->hook != NULL)
				l->hook(l->hook_arg, d, &ev);
			ws_log_event(l, &ev);
		}
	}
	return l->rv;
}

#endif
