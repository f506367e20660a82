/* SPDX-License-Identifier: BSD-3-Clause */
/* Receiving a stream-framed message into its final blocks
 * (transport/frame_rx.h). */
#include <endian.h>
#include <stdlib.h>
#include <string.h>

#include <taskwire/error.h>

#include "core/block.h"
#include "core/msg.h"
#include "core/stats.h"
#include "transport/frame_rx.h"

void tw__rx_init(struct tw__rx *rx, const struct tw__limits *limits)
{
	memset(rx, 0, sizeof(*rx));
	rx->limits = limits;
	tw__sdec_init(&rx->dec, limits->max_message_bytes, limits->max_frames);
	rx->small_frame_bytes = limits->small_frame_bytes;
	rx->small_message_bytes = limits->small_frame_bytes;
}

static void reset(struct tw__rx *rx)
{
	tw__sdec_fini(&rx->dec);
	/* Limits may change between messages (a handshake allows less). */
	tw__sdec_init(&rx->dec, rx->limits->max_message_bytes, rx->limits->max_frames);
	tw_block_free(rx->body);
	tw_block_free(rx->slab);
	tw_msg_free(rx->msg);
	rx->body = rx->slab = NULL;
	rx->msg = NULL;
	rx->phase = RX_HEAD;
	rx->have = rx->cur = rx->cur_have = rx->slab_off = 0;
	rx->body_off = rx->body_len = rx->body_room = 0;
}

void tw__rx_fini(struct tw__rx *rx)
{
	free(rx->relay_lens);
	rx->relay_lens = NULL;
	reset(rx);
	tw__sdec_fini(&rx->dec);
	tw_block_free(rx->gulp);
	tw_block_free(rx->carry);
	rx->gulp = rx->carry = NULL;
	rx->carry_len = rx->gulp_prefix = 0;
}

void tw__rx_set_place(struct tw__rx *rx, tw__place_fn fn, void *arg)
{
	rx->place = fn;
	rx->place_arg = arg;
}

static int fail(struct tw__rx *rx, int err)
{
	rx->phase = RX_ERROR;
	rx->err = err;
	return err;
}

/* Small message: lengths and frames arrived in one block; the frames are
 * slices of it. */
static int finish_small(struct tw__rx *rx)
{
	const uint8_t *p = tw_block_data(rx->body) + rx->body_off;
	size_t used, off;
	int rv = tw__sdec_feed(&rx->dec, p, rx->body_len, &used);
	if (rv < 0)
		return fail(rx, rv);
	if (tw_msg_new(&rx->msg) != 0 || tw__msg_reserve(rx->msg, rx->dec.n) != 0)
		return fail(rx, TW_ENOMEM);
	off = rx->body_off + used;
	for (size_t i = 0; i < rx->dec.n; i++) {
		size_t len = rx->dec.lens[i];
		tw__msg_append_owned(rx->msg, (tw_slice){tw_block_hold(rx->body), off, len});
		off += len;
	}
	rx->phase = RX_DONE;
	return 1;
}

/* The total field is in: check it at once, so a peer that sends an
 * oversized total and then nothing is refused now, not when N arrives. */
static int got_head(struct tw__rx *rx);

static int got_total(struct tw__rx *rx)
{
	size_t used;
	int rv;
	/* The limits in force when the message starts (a handshake allows
	 * less than the comm does afterwards). */
	rx->dec.max_message_bytes = rx->limits->max_message_bytes;
	rx->dec.max_frames = rx->limits->max_frames;
	rv = tw__sdec_feed(&rx->dec, rx->head, 8, &used);
	return rv < 0 ? fail(rx, rv) : 0;
}

int tw__rx_check_head(struct tw__rx *rx)
{
	int rv;
	if (rx->phase == RX_ERROR)
		return rx->err;
	if (rx->phase != RX_HEAD)
		return 0;
	if (rx->have >= 8 && rx->dec.state == SDEC_TOTAL && (rv = got_total(rx)) < 0)
		return rv;
	return rx->have == 16 ? got_head(rx) : 0;
}

/* The 16-byte head (total, N) is in: validate N, then read the rest into
 * one block if it is small, else read the lengths on their own. */
static int got_head(struct tw__rx *rx)
{
	size_t used;
	int rv = tw__sdec_feed(&rx->dec, rx->head + 8, 8, &used);
	if (rv < 0)
		return fail(rx, rv);
	rx->have = 0;
	if (rx->dec.total - 8 <= rx->small_message_bytes) {
		/* Its block comes from the read-ahead, or from want. */
		rx->body_len = rx->dec.total - 8;
		rx->phase = RX_SMALL;
	} else {
		rx->phase = RX_LENGTHS;
	}
	return 0;
}

static int place_slab(struct tw__rx *rx, size_t i)
{
	size_t len = rx->dec.lens[i];
	if (rx->slab == NULL) {
		uint64_t need = 0;
		for (size_t k = i; k < rx->dec.n; k++)
			if (rx->dec.lens[k] <= rx->small_frame_bytes)
				need += rx->dec.lens[k];
		if (tw__block_new_lazy(need, &rx->slab) != 0)
			return TW_ENOMEM;
	}
	tw__msg_append_owned(rx->msg, (tw_slice){tw_block_hold(rx->slab), rx->slab_off, len});
	rx->slab_off += len;
	return 0;
}

/* Place frames i..i+span-1 in one new block of their summed size. */
static int place_block(struct tw__rx *rx, size_t i, size_t span)
{
	uint64_t sum = 0, off = 0;
	tw_block *b;
	for (size_t k = i; k < i + span; k++)
		sum += rx->dec.lens[k];
	if (tw__block_new_lazy(sum, &b) != 0)
		return TW_ENOMEM;
	for (size_t k = i; k < i + span; k++) {
		tw__msg_append_owned(rx->msg, (tw_slice){tw_block_hold(b), off, rx->dec.lens[k]});
		off += rx->dec.lens[k];
	}
	tw_block_free(b);
	return 0;
}

/* Frame i may be placed before the frames ahead of it are complete:
 * always without a hook; with one, when it is small (the hook groups the
 * shards of a split payload, and a group starts with a full shard, so a
 * small frame only ever starts a group of small frames, which the slab
 * keeps adjacent anyway) and not frame 0 (the hook's call for frame 0
 * starts its message). */
static int place_early(const struct tw__rx *rx, size_t i)
{
	if (rx->relay_min > 0 && i > 0 && rx->dec.lens[i] >= rx->relay_min)
		return 0; /* it may start the relay: wait for the frames before it */
	return rx->place == NULL || (i > 0 && rx->dec.lens[i] <= rx->small_frame_bytes);
}

/* The message stops at frame i (relay_min): frames i.. stay in the socket. */
static int relay_cut(struct tw__rx *rx, size_t i)
{
	size_t n = rx->dec.n - i;
	if ((rx->relay_lens = malloc(n * sizeof(*rx->relay_lens))) == NULL)
		return fail(rx, TW_ENOMEM);
	memcpy(rx->relay_lens, rx->dec.lens + i, n * sizeof(*rx->relay_lens));
	rx->relay_n = n;
	rx->phase = RX_DONE;
	return 1;
}

/* Place frame i (and the frames the hook groups with it; the hook is
 * asked only about frames it may group). */
static int place_one(struct tw__rx *rx, size_t i)
{
	uint64_t len = rx->dec.lens[i];
	int span = 0;
	if (rx->place != NULL && !place_early(rx, i)) {
		span = rx->place(rx->place_arg, rx->msg, rx->dec.lens, rx->dec.n, i);
		if (span < 0)
			return span;
		if ((size_t)span > rx->dec.n - i)
			return TW_EPROTO;
	}
	if (span > 0)
		return place_block(rx, i, (size_t)span);
	if (len == 0) {
		tw__msg_append_owned(rx->msg, (tw_slice){NULL, 0, 0});
		return 0;
	}
	if (len <= rx->small_frame_bytes)
		return place_slab(rx, i);
	return place_block(rx, i, 1);
}

/* Place what is needed and step over complete frames until a frame needs
 * bytes (0) or the message is complete (1). Frames placed early let one
 * readv span many of them: a message of 100,000 small frames (a Dask
 * gather of small results) is read in gulps, not one recv per frame. */
static int settle(struct tw__rx *rx)
{
	int rv;
	while (rx->cur < rx->dec.n) {
		size_t placed = tw_msg_nframes(rx->msg);
		if (rx->cur == placed || (placed < rx->dec.n && place_early(rx, placed))) {
			if (rx->cur == placed && placed > 0 && rx->relay_min > 0 &&
			    rx->dec.lens[placed] >= rx->relay_min)
				return relay_cut(rx, placed);
			if ((rv = place_one(rx, placed)) != 0)
				return fail(rx, rv);
			continue;
		}
		if (rx->cur_have < rx->dec.lens[rx->cur])
			return 0;
		rx->cur++;
		rx->cur_have = 0;
	}
	rx->phase = RX_DONE;
	return 1;
}

static int got_lengths(struct tw__rx *rx)
{
	if (tw_msg_new(&rx->msg) != 0 || tw__msg_reserve(rx->msg, rx->dec.n) != 0)
		return fail(rx, TW_ENOMEM);
	rx->phase = RX_FRAMES;
	return settle(rx);
}

/* Where the frames' next bytes go, as far as their blocks' memory is
 * committed, and at most one step of newly committed memory per read (a
 * frame's memory follows its bytes: core/block.h). */
static int want_frames(struct tw__rx *rx, struct iovec *iov, int max)
{
	const tw_slice *f = tw__msg_frames(rx->msg);
	size_t placed = tw_msg_nframes(rx->msg), have = rx->cur_have;
	uint8_t *base;
	int k = 0;
	for (size_t i = rx->cur; i < placed && k < max; i++, have = 0) {
		size_t len = f[i].len - have;
		if (len == 0)
			continue;
		int rv = tw__block_commit(f[i].block, f[i].offset + have, &len);
		if (rv < 0)
			return fail(rx, rv);
		base = tw_slice_data(&f[i]) + have;
		/* Frames adjacent in memory (the slab's small frames, in
		 * order) share one iovec: a message of 100,000 small frames
		 * is read in reads of what the socket holds, not 64 frames. */
		if (k > 0 && (uint8_t *)iov[k - 1].iov_base + iov[k - 1].iov_len == base)
			iov[k - 1].iov_len += len;
		else {
			iov[k].iov_base = base;
			iov[k++].iov_len = len;
		}
		if (rv == 1 || len < f[i].len - have)
			break; /* one step of new memory per read */
	}
	return k;
}

/* At a message's start, after a run of small messages and with nothing
 * read ahead: offer one block for the head and the rest of the message
 * (one buffer: tcp reads it with recv, not readv). */
static size_t gulp_block_size(const struct tw__rx *rx)
{
	size_t size = sizeof(rx->head) + rx->gulp_size;
	return rx->gulp_pipe > size ? rx->gulp_pipe : size;
}

/* The size of read-ahead blocks: a pipelined stream's are all of the
 * largest size, so one comes back for every read whatever its length
 * (reads vary; a block of each length was a 16 KiB malloc per read). */
static size_t gulp_alloc_size(const struct tw__rx *rx)
{
	return rx->gulp_pipe > 0 ? rx->gulp_pipe_max : gulp_block_size(rx);
}

static size_t min_size(size_t a, size_t b)
{
	return a < b ? a : b;
}

static int offer_gulp(struct tw__rx *rx, struct iovec *iov)
{
	size_t size = gulp_alloc_size(rx);
	rx->gulping = 0;
	if (rx->have != rx->gulp_prefix || rx->gulp_size == 0 || rx->carry_len != 0 || rx->plain)
		return 0;
	/* The last read-ahead block comes back once the messages made of it
	 * are freed (a request answered, a reply taken): reuse it then. A
	 * block that starts with a split head (gulp_prefix) is read on. */
	if (rx->gulp != NULL && rx->gulp_prefix == 0 &&
	    (tw_block_size(rx->gulp) != size || !tw__block_sole(rx->gulp))) {
		tw_block_free(rx->gulp);
		rx->gulp = NULL;
	}
	if (rx->gulp == NULL && tw_block_new(size, &rx->gulp) != 0)
		return 0; /* read the head alone */
	iov->iov_base = tw_block_data(rx->gulp) + rx->gulp_prefix;
	iov->iov_len = min_size(tw_block_size(rx->gulp), gulp_block_size(rx)) - rx->gulp_prefix;
	rx->offered = iov->iov_len;
	rx->gulping = 1;
	return 1;
}

/* A small body's block. In a run of small messages over a comm that
 * reads pipelined streams, the read takes what follows too (frame_rx.h):
 * the block has room for it (the read-ahead block when it came back). */
static int new_body(struct tw__rx *rx, int max)
{
	/* no larger than the largest read-ahead block, so a frame pins no
	 * more than one (a pipelined stream's are all of one size) */
	size_t cap = rx->gulp_pipe > 0 ? rx->gulp_pipe_max : sizeof(rx->head) + rx->gulp_max;
	size_t room = 0, size;
	if (max > 1 && rx->gulp_pipe_max > 0 && rx->gulp_size > 0 && cap >= rx->body_len + 64)
		room = min_size(gulp_block_size(rx), cap - rx->body_len);
	size = room > 0 && rx->gulp_pipe > 0 ? cap : rx->body_len + room;
	rx->body_room = room;
	if (room > 0 && rx->gulp != NULL && rx->gulp_prefix == 0 && tw__block_sole(rx->gulp) &&
	    tw_block_size(rx->gulp) >= size) {
		rx->body = rx->gulp;
		rx->gulp = NULL;
		return 0;
	}
	return tw_block_new(size, &rx->body);
}

int tw__rx_want(struct tw__rx *rx, struct iovec *iov, int max)
{
	uint8_t *dst;
	size_t len;
	int rv;
	if (rx->phase == RX_HEAD && rx->have >= 8 && (rv = tw__rx_check_head(rx)) < 0)
		return rv;
	switch (rx->phase) {
	case RX_HEAD:
		if (max > 1 && offer_gulp(rx, &iov[0]))
			return 1; /* a caller asking for one place never reads ahead */
		iov[0].iov_base = rx->head + rx->have;
		iov[0].iov_len = 16 - rx->have;
		return 1;
	case RX_SMALL:
		if (rx->body == NULL && new_body(rx, max) != 0)
			return fail(rx, TW_ENOMEM);
		iov[0].iov_base = tw_block_data(rx->body) + rx->body_off + rx->have;
		iov[0].iov_len = rx->body_len - rx->have;
		if (max < 2)
			return 1;
		if (rx->body_room > 0) { /* a pipelined stream: read on in the block */
			iov[0].iov_len += rx->body_room;
			rx->offered = iov[0].iov_len;
			return 1;
		}
		iov[1].iov_base = rx->next + rx->next_have;
		iov[1].iov_len = sizeof(rx->next) - rx->next_have;
		return 2;
	case RX_LENGTHS:
		tw__sdec_want(&rx->dec, &dst, &len);
		iov[0].iov_base = dst;
		iov[0].iov_len = len;
		return 1;
	case RX_FRAMES: return want_frames(rx, iov, max);
	case RX_DONE: return TW_EINVAL;
	default: return rx->err;
	}
}

/* n bytes landed across the frames from cur on. */
static int advance_frames(struct tw__rx *rx, size_t n)
{
	const tw_slice *f = tw__msg_frames(rx->msg);
	while (n > 0) {
		size_t room = f[rx->cur].len - rx->cur_have;
		size_t k = n < room ? n : room;
		rx->cur_have += k;
		n -= k;
		if (rx->cur_have == f[rx->cur].len && n > 0) {
			rx->cur++;
			rx->cur_have = 0;
		}
	}
	return settle(rx);
}

/* n bytes landed in the read-ahead block: the head is copied out, and
 * the bytes past it are the carry, consumed before anything else is
 * read. */
/* A pipelined stream's next read-ahead: twice what a read that filled
 * its room got, or what a read that came back short got (rounded up to
 * 64 bytes); no more than one message's read-ahead ends the stream. */
static void learn(struct tw__rx *rx, size_t filled, int full)
{
	size_t want = full ? 2 * filled : filled;
	if (rx->gulp_pipe_max == 0)
		return;
	want = (want + 63) & ~(size_t)63;
	if (want <= sizeof(rx->head) + rx->gulp_size)
		rx->gulp_pipe = 0;
	else
		rx->gulp_pipe = want < rx->gulp_pipe_max ? want : rx->gulp_pipe_max;
}

/* Learn from a read-ahead of n bytes (filled: with what came before it
 * in the block); a peek's (tw__rx_safe) from what the socket held, not
 * from what was taken of it. */
static void learn_read(struct tw__rx *rx, size_t filled, size_t n)
{
	if (rx->peeked > 0) {
		filled += rx->peeked - n;
		n = rx->peeked;
		rx->peeked = 0;
	}
	learn(rx, filled, n == rx->offered);
}

static int took_gulp(struct tw__rx *rx, size_t n)
{
	size_t h;
	int rv;
	learn_read(rx, n + rx->gulp_prefix, n);
	n += rx->gulp_prefix;
	rx->gulp_prefix = 0;
	h = n < sizeof(rx->head) ? n : sizeof(rx->head);
	memcpy(rx->head, tw_block_data(rx->gulp), h);
	rx->have = h;
	if (n > h) {
		rx->carry = rx->gulp;
		rx->gulp = NULL;
		rx->carry_off = h;
		rx->carry_len = n - h;
	}
	rv = tw__rx_check_head(rx);
	return rv == 0 && rx->carry_len > 0 ? tw__rx_replay(rx) : rv;
}

int tw__rx_advance(struct tw__rx *rx, size_t n)
{
	int rv;
	switch (rx->phase) {
	case RX_HEAD:
		if (rx->gulping) {
			rx->gulping = 0;
			return took_gulp(rx, n);
		}
		rx->have += n;
		return tw__rx_check_head(rx);
	case RX_SMALL: {
		size_t left = rx->body_len - rx->have;
		if (rx->body_room > 0) {
			learn_read(rx, n, n);
			if (n > left) { /* read ahead into the body's block */
				rx->carry = tw_block_hold(rx->body);
				rx->carry_off = rx->body_off + rx->body_len;
				rx->carry_len = n - left;
				n = left;
			}
		} else if (n > left) { /* the rest is the next message's head */
			rx->next_have += n - left;
			n = left;
		}
		rx->have += n;
		return rx->have < rx->body_len ? 0 : finish_small(rx);
	}
	case RX_LENGTHS:
		rv = tw__sdec_advance(&rx->dec, n);
		if (rv < 0)
			return fail(rx, rv);
		return rv == 1 ? got_lengths(rx) : 0;
	case RX_FRAMES: return advance_frames(rx, n);
	case RX_DONE: return 1;
	default: return rx->err;
	}
}

/* Read ahead for the next message once two small ones came in a row
 * (request/response traffic), about as much as the last one. */
static void predict(struct tw__rx *rx)
{
	size_t len = rx->body_len; /* 0 unless the message was small */
	if (rx->gulp_max > 0 && len > 0 && len <= rx->gulp_max)
		rx->small_run += rx->small_run < 2;
	else
		rx->small_run = 0;
	len = (len + 63) & ~(size_t)63;
	rx->gulp_size = rx->small_run >= 2 ? (len < rx->gulp_max ? len : rx->gulp_max) : 0;
	if (rx->gulp_size == 0)
		rx->gulp_pipe = 0; /* a large message ends the stream's run */
}

tw_msg *tw__rx_take(struct tw__rx *rx)
{
	tw_msg *m = rx->msg;
	size_t carried = rx->next_have;
	if (rx->phase != RX_DONE)
		return NULL;
	rx->msg = NULL;
	rx->plain = 0;
	predict(rx);
	reset(rx);
	/* Head bytes read along with the body start the next message; they
	 * are checked by tw__rx_check_head, after the message is delivered
	 * (whose handling may change the limits). */
	rx->next_have = 0;
	if (carried > 0) {
		memcpy(rx->head, rx->next, carried);
		rx->have = carried;
	}
	return m;
}

int tw__rx_reads_ahead(const struct tw__rx *rx)
{
	return rx->gulping || (rx->phase == RX_SMALL && rx->body_room > 0);
}

static uint64_t le64(const uint8_t *p)
{
	uint64_t v;
	memcpy(&v, p, 8);
	return le64toh(v);
}

/* The bytes of p[0..n) (seen at the start of the last want's iovec) that
 * belong to the message in progress, then to whole small messages: a
 * read-ahead takes nothing of a large message nor of one still arriving,
 * so it never has bytes to copy to where they belong (frame_rx.h). */
size_t tw__rx_safe(struct tw__rx *rx, const uint8_t *p, size_t n)
{
	size_t off = rx->phase == RX_SMALL ? rx->body_len - rx->have : 0;
	if (off >= n) {
		rx->peeked = 0;
		return n;
	}
	while (n - off >= 16) {
		/* total: the bytes after it (N, the lengths, the frames) */
		uint64_t total = le64(p + off) - 8;
		if (total > rx->small_message_bytes || total + 16 > n - off)
			break; /* large (or below 8: bad, left to the head's checks) */
		off += (size_t)total + 16;
	}
	rx->peeked = off > 0 ? n : 0;
	if (off == 0)
		rx->plain = 1; /* read the head alone, then the rest in place */
	return off;
}

uint64_t tw__rx_progress(const struct tw__rx *rx)
{
	uint64_t got = 16;
	switch (rx->phase) {
	case RX_HEAD: return rx->have + rx->carry_len;
	case RX_SMALL: return 16 + rx->have;
	case RX_LENGTHS: return 16 + rx->dec.have;
	case RX_FRAMES:
	case RX_DONE:
		got += 8 * rx->dec.n + rx->cur_have;
		for (size_t i = 0; i < rx->cur; i++)
			got += tw__msg_frames(rx->msg)[i].len;
		return got;
	default: return 0;
	}
}

int tw__rx_idle(const struct tw__rx *rx)
{
	return rx->phase == RX_HEAD && rx->have == 0 && rx->carry_len == 0;
}

int tw__rx_pending(const struct tw__rx *rx)
{
	return rx->carry_len > 0 && rx->phase != RX_ERROR;
}

static void use_carry(struct tw__rx *rx, size_t n)
{
	rx->carry_off += n;
	if ((rx->carry_len -= n) == 0) {
		/* kept for offer_gulp to reuse: the newest block, which the
		 * messages just made of it give back first */
		tw_block_free(rx->gulp);
		rx->gulp = rx->carry;
		rx->carry = NULL;
	}
}

/* Copy read-ahead bytes into the places want gives. */
static size_t copy_carry(struct tw__rx *rx, const struct iovec *iov, int k)
{
	const uint8_t *p = tw_block_data(rx->carry) + rx->carry_off;
	size_t moved = 0;
	for (int i = 0; i < k && moved < rx->carry_len; i++) {
		size_t c = iov[i].iov_len < rx->carry_len - moved ? iov[i].iov_len
								  : rx->carry_len - moved;
		memcpy(iov[i].iov_base, p + moved, c);
		moved += c;
	}
	return moved;
}

/* The carry's bytes (a split head or small body at the end of a read)
 * moved to the start of a block of `size` bytes: the carry's own when
 * nothing else holds it, else a new one. NULL when out of memory. */
static tw_block *stash(struct tw__rx *rx, size_t size)
{
	tw_block *b = rx->carry;
	if (tw__block_sole(b) && tw_block_size(b) >= size) {
		memmove(tw_block_data(b), tw_block_data(b) + rx->carry_off, rx->carry_len);
	} else if (tw_block_new(size, &b) == 0) {
		memcpy(tw_block_data(b), tw_block_data(rx->carry) + rx->carry_off, rx->carry_len);
		tw_block_free(rx->carry);
	} else {
		return NULL;
	}
	rx->carry = NULL;
	rx->carry_off = rx->carry_len = 0;
	return b;
}

/* A pipelined stream's read ended inside a message: a split head goes to
 * the start of the next read-ahead block, a split small body to the start
 * of a block with room for the messages after it (frame_rx.h). Returns 1
 * when the carry was moved so (read on), 0 to copy it out as usual, or
 * the sticky error of a bad total. */
static int stash_split(struct tw__rx *rx)
{
	size_t size = gulp_alloc_size(rx), len = rx->carry_len;
	tw_block *b;
	if (rx->gulp_pipe == 0)
		return 0;
	if (rx->phase == RX_HEAD && rx->have == 0 && len < sizeof(rx->head) && rx->gulp_size > 0) {
		if ((b = stash(rx, size)) == NULL)
			return 0;
		tw_block_free(rx->gulp);
		rx->gulp = b;
		rx->gulp_prefix = len;
		/* mirrored in head, so an oversized total is refused now,
		 * not when the rest of the head comes */
		memcpy(rx->head, tw_block_data(b), len);
		rx->have = len;
		return tw__rx_check_head(rx) < 0 ? rx->err : 1;
	}
	if (rx->phase == RX_SMALL && rx->body == NULL && len < rx->body_len &&
	    rx->body_len + 64 <= size) {
		if ((b = stash(rx, size)) == NULL)
			return 0;
		rx->body = b;
		rx->body_off = 0;
		rx->have = len;
		rx->body_room = min_size(tw_block_size(b) - rx->body_len, gulp_block_size(rx));
		rx->copied += len;
		TW__ADD(&tw__global_stats, payload_bytes_copied, len);
		return 1;
	}
	return 0;
}

void tw__rx_drop_carry(struct tw__rx *rx)
{
	if (rx->carry_len > 0)
		use_carry(rx, rx->carry_len);
}

int tw__rx_replay(struct tw__rx *rx)
{
	int rv = rx->phase == RX_DONE ? 1 : rx->phase == RX_ERROR ? rx->err : 0;
	while (rv == 0 && rx->carry_len > 0) {
		struct iovec iov[16];
		size_t moved;
		int k;
		if ((rv = stash_split(rx)) != 0)
			return rv < 0 ? rv : 0;
		if (rx->phase == RX_SMALL && rx->body == NULL && rx->carry_len >= rx->body_len) {
			/* Wholly read ahead: its frames are slices of the carry. */
			rx->body = tw_block_hold(rx->carry);
			rx->body_off = rx->carry_off;
			rx->have = rx->body_len;
			use_carry(rx, rx->body_len);
			return finish_small(rx);
		}
		/* One iovec for a small body: stop at the message's end. */
		if ((k = tw__rx_want(rx, iov, rx->phase == RX_SMALL ? 1 : 16)) < 0)
			return k;
		moved = copy_carry(rx, iov, k);
		if (rx->phase == RX_SMALL || rx->phase == RX_FRAMES) {
			rx->copied += moved;
			TW__ADD(&tw__global_stats, payload_bytes_copied, moved);
		}
		use_carry(rx, moved);
		rv = tw__rx_advance(rx, moved);
	}
	return rv;
}

int tw__rx_feed(struct tw__rx *rx, const uint8_t *p, size_t n, size_t *used)
{
	struct iovec iov[16];
	int rv = rx->phase == RX_DONE ? 1 : rx->phase == RX_ERROR ? rx->err : 0;
	*used = 0;
	while (rv == 0 && *used < n) {
		/* One iovec for a head or a small body: feeding stops exactly
		 * at the end of the message, as its callers expect, and never
		 * reads ahead (bytes taken past the message would be lost). */
		int one = rx->phase == RX_HEAD || rx->phase == RX_SMALL;
		int k = tw__rx_want(rx, iov, one ? 1 : 16);
		size_t moved = 0;
		if (k < 0)
			return k;
		for (int i = 0; i < k && *used + moved < n; i++) {
			size_t c = iov[i].iov_len < n - *used - moved ? iov[i].iov_len
								      : n - *used - moved;
			memcpy(iov[i].iov_base, p + *used + moved, c);
			moved += c;
		}
		*used += moved;
		if (rx->phase == RX_FRAMES)
			rx->copied += moved;
		rv = tw__rx_advance(rx, moved);
	}
	return rv;
}
