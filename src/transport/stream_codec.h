/* SPDX-License-Identifier: BSD-3-Clause */
/* Stream framing for tcp and tls (docs/design.md, Receive path (tcp)):
 *
 *   u64 total | u64 N | u64 len_0 .. len_N-1 | frame_0 .. frame_N-1
 *
 * all little-endian, total = 8 + 8N + sum(len_i). Sans-I/O: the decoder
 * takes prelude bytes in any pieces and validates each field before
 * anything is allocated from it; frames are not its business (the
 * receiver places them, see frame_rx.h). Errors are sticky. */
#ifndef TW_TRANSPORT_STREAM_CODEC_H
#define TW_TRANSPORT_STREAM_CODEC_H

#include <stddef.h>
#include <stdint.h>

#include <taskwire/buf.h>

/* Smallest valid message on the wire: total, N = 1, len_0 = 0. */
#define TW__STREAM_MIN_WIRE 24

enum tw__sdec_state { SDEC_TOTAL, SDEC_COUNT, SDEC_LENGTHS, SDEC_DONE, SDEC_ERROR };

struct tw__sdec {
	uint64_t max_message_bytes, max_frames;
	enum tw__sdec_state state;
	int err;         /* sticky TW_E* once state is SDEC_ERROR */
	uint8_t word[8]; /* TOTAL and COUNT fields */
	size_t have;     /* bytes of the current field(s) received */
	uint64_t total;  /* bytes after the total field */
	uint64_t n;      /* frames */
	uint64_t sum;    /* lengths summed so far */
	uint64_t *lens;  /* n lengths, host order once SDEC_DONE */
	size_t checked;  /* lengths validated so far */
	/* Room for the lengths of most messages, which then cost no
	 * allocation (small RPCs); never copy a decoder by value. */
	uint64_t lens_inline[8];
};

void tw__sdec_init(struct tw__sdec *d, uint64_t max_message_bytes, uint64_t max_frames);
void tw__sdec_fini(struct tw__sdec *d);
/* Start over for the next message (keeps the limits). */
void tw__sdec_reset(struct tw__sdec *d);

/* tw__sdec_want: where the next prelude bytes go and how many the current
 * field still needs (never 0 before SDEC_DONE). */
void tw__sdec_want(struct tw__sdec *d, uint8_t **dst, size_t *len);
/* tw__sdec_advance: `n` bytes were written at the place tw__sdec_want gave
 * (n <= its len). Returns 1 when the prelude is complete, 0 when more is
 * needed, or a negative code: TW_ETOOBIG (total above the limit),
 * TW_ENOFRAMES (N = 0), TW_ETOOMANY (N above the limit), TW_ELENGTH
 * (total too small for N, lengths overflowing or not adding up to total),
 * TW_ENOMEM. */
int tw__sdec_advance(struct tw__sdec *d, size_t n);
/* tw__sdec_feed: copy up to `n` bytes from p through want/advance; sets
 * *used to the bytes consumed (the rest belongs to the frames). Same
 * returns as tw__sdec_advance. */
int tw__sdec_feed(struct tw__sdec *d, const uint8_t *p, size_t n, size_t *used);

/* Bytes of payload (sum of frame lengths) once the prelude is done. */
static inline uint64_t tw__sdec_payload(const struct tw__sdec *d)
{
	return d->total - 8 - 8 * d->n;
}

/* tw__stream_prelude_bytes: size of the prelude of n frames (total, N and
 * n lengths): 8 * (n + 2). */
static inline size_t tw__stream_prelude_bytes(size_t n)
{
	return 8 * (n + 2);
}

/* tw__stream_encode_prelude: write the prelude of `n` frames into out,
 * which holds tw__stream_prelude_bytes(n) bytes. */
void tw__stream_encode_prelude(const tw_slice *frames, size_t n, uint8_t *out);

#endif
