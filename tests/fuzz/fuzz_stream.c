/* SPDX-License-Identifier: BSD-3-Clause */
/* Fuzz target: the stream frame receiver (transport/frame_rx.c and the
 * prelude codec under it).
 *
 * The input is a byte stream from a peer. It goes through tw__rx_feed until
 * an error or its end, and every completed message is checked and freed.
 * Three receivers read it, and must agree:
 *   A  default placement (64 KiB small frames), the input in one piece;
 *   B  16-byte small frames (nearly every message takes the large path),
 *      one byte at a time;
 *   C  like B with a placement hook that groups frames, in pieces of
 *      1..97 bytes.
 * Same messages (frame lengths and bytes) from all three; B and C end with
 * the same code; when A fails, B fails with the same code (A may still be
 * waiting for the rest of a small message that B has already rejected).
 *
 * More read it as stream_comm.c's on_readable does, through
 * tw__rx_want / tw__rx_advance with read-ahead on (gulp_max 4096), up to
 * 64 iovecs a read, read-ahead bytes (the carry) replayed with
 * tw__rx_replay before each read, tw__rx_check_head after each message:
 *   D  A's placement; the peer writes one message at a time (request /
 *      response: each read can end at a message's end, so read-ahead is
 *      offered), each read's size taken from the input itself (its bytes
 *      from the end backwards: a few bytes, up to 4 KiB, or all that
 *      fits), so reads stop anywhere;
 *   E  A's placement; the peer writes 1..8 messages at a time (as the
 *      input's bytes say), every read takes all that fits: pipelined
 *      messages land in the read-ahead block (the carry), wholly or in
 *      part;
 *   F  C's placement and hook; two messages a write, read sizes from the
 *      input (from the start): a read-ahead block holds the start of a
 *      large message more often than not;
 *   G  A's placement, the whole stream written at once, reads take all
 *      that fits (a head read along with each small body);
 *   H, I  D and G with a pipelined stream's read-ahead on too
 *      (gulp_pipe_max 16 KiB: reads that fill it double it, a message cut
 *      at a block's end moves to the next block's start); their frames
 *      may pin a 16 KiB block, and what they copy is bounded by it;
 *   J, K  D and I reading ahead as tcp does (stream_comm.c read_ahead):
 *      a read that may read ahead peeks instead (the bytes land in the
 *      block, nothing leaves the socket), then takes only tw__rx_safe's
 *      count of them (the rest of the message in progress and whole
 *      small messages after it); 0 taken means the next want offers the
 *      head alone. K with tcp's 64 KiB pipelined read-ahead. They must
 *      copy nothing at all (payload_bytes_copied stays 0 over tcp).
 * D, E and G must equal A exactly (same messages byte for byte, same
 * count, same first error code, same idle state at the end, the same
 * frames in blocks of exactly their size: read-ahead never changes where
 * a large message's frames land), F must equal C; none may copy more
 * than 4096 bytes for one message, or more than the read-ahead took in
 * all, no frame may keep a block much larger than its message alive, and
 * after tw__rx_fini no block of any receiver is left (blocks_live back
 * where it was). A leak, a use after free or an overflow is ASan's.
 *
 * A disagreement or a broken invariant aborts. Limits: 1 MiB messages,
 * 1,024 frames.
 *
 * Built by `CC=clang ./configure --enable-fuzzers && make` (see
 * tests/Makefile.inc); replayed over tests/fuzz/corpus/stream by
 * tests/check_fuzz_replay under `make check`. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include <taskwire/msg.h>

#include "core/context.h"
#include "core/stats.h"
#include "tests/fuzz/fuzz.h"
#include "transport/frame_rx.h"

#define FNV_OFFSET UINT64_C(0xcbf29ce484222325)
#define FNV_PRIME  UINT64_C(0x100000001b3)

struct outcome {
	size_t msgs;
	uint64_t hash;  /* over every message's frame lengths and bytes */
	int err;        /* 0 when the input ended without an error */
	int idle;       /* no byte of a next message was pending at the end */
	uint64_t place; /* which frames have a block of exactly their size */
};

#define GULP_MAX 4096

static void check(int ok)
{
	if (!ok)
		abort();
}

static void fnv(uint64_t *h, const void *p, size_t n)
{
	const uint8_t *b = p;
	for (size_t i = 0; i < n; i++)
		*h = (*h ^ b[i]) * FNV_PRIME;
}

/* Take, check and free the completed message. Read-ahead receivers may
 * hold bytes of the next message (carry, or a head read along). */
/* The largest block a small message's frame may pin (run_gulp sets it). */
static size_t pin_max = 16 + GULP_MAX;

static void take_any(struct tw__rx *rx, struct outcome *o, int expect_idle)
{
	tw_msg *m = tw__rx_take(rx);
	size_t n;
	uint64_t sum = 0;
	check(m != NULL);
	n = tw_msg_nframes(m);
	check(n >= 1 && n <= 1024);
	fnv(&o->hash, &n, sizeof(n));
	for (size_t i = 0; i < n; i++) {
		const tw_slice *f = tw_msg_frame(m, i);
		uint64_t len = f->len;
		if (f->block == NULL)
			check(f->len == 0);
		else
			check(f->offset <= tw_block_size(f->block) &&
			      f->len <= tw_block_size(f->block) - f->offset);
		fnv(&o->hash, &len, sizeof(len));
		if (f->len > 0)
			fnv(&o->hash, tw_slice_data(f), f->len);
		sum += f->len;
		/* placement: read-ahead must not change where a large
		 * message's frames land (the hash covers this per receiver
		 * configuration: equal for equal placement settings) */
		{
			uint8_t own = f->block != NULL && f->offset == 0 &&
				      f->len == tw_block_size(f->block);
			fnv(&o->place, &own, 1);
			/* a frame never pins a block much larger than its
			 * message: at most the read-ahead block (head and
			 * GULP_MAX, or a pipelined stream's), or a slab */
			if (f->block != NULL && tw_block_size(f->block) > pin_max)
				check(tw_block_size(f->block) <= tw_msg_bytes(m) + 8 * (n + 1));
		}
	}
	check(sum == tw_msg_bytes(m));
	if (expect_idle)
		check(tw__rx_idle(rx));
	o->msgs++;
	tw_msg_free(m);
}

static void take(struct tw__rx *rx, struct outcome *o)
{
	take_any(rx, o, 1);
}

/* Receiver C's hook: frames 0..i-1 are complete; group some frames. */
static int group(void *arg, const tw_msg *msg, const uint64_t *lens, size_t n, size_t i)
{
	(void)arg;
	(void)lens;
	check(tw_msg_nframes(msg) == i && i < n);
	if (i == 0 && n <= 4)
		return (int)n;
	return i % 3 == 1 && n - i >= 2 ? 2 : 0;
}

static uint64_t next(uint64_t *s)
{
	*s = *s * UINT64_C(6364136223846793005) + UINT64_C(1442695040888963407);
	return *s >> 33;
}

/* Feed p[off..end) to rx, taking each message; returns the error or 0. */
static int feed_piece(struct tw__rx *rx, const uint8_t *p, size_t off, size_t end,
		      struct outcome *o)
{
	while (off < end) {
		size_t used = 0;
		int rv = tw__rx_feed(rx, p + off, end - off, &used);
		check(used <= end - off);
		if (rv < 0)
			return rv;
		check(rv == 1 || used == end - off);
		off += used;
		if (rv == 1)
			take(rx, o);
	}
	return 0;
}

/* One receiver over the whole input, in pieces of 1..max_piece bytes
 * (the rest of the input in one piece when max_piece is 0). */
static struct outcome run(const uint8_t *data, size_t size, size_t small_frame_bytes,
			  size_t max_piece, tw__place_fn place)
{
	struct tw__limits l = {0};
	struct outcome o = {0, FNV_OFFSET, 0, 0, FNV_OFFSET};
	struct tw__rx rx;
	uint64_t seed = size;
	size_t off = 0, used = 1;
	l.max_message_bytes = (uint64_t)1 << 20;
	l.max_frames = 1024;
	l.small_frame_bytes = small_frame_bytes;
	tw__rx_init(&rx, &l);
	tw__rx_set_place(&rx, place, NULL);
	while (off < size && o.err == 0) {
		size_t piece = max_piece == 0 ? size - off : 1 + next(&seed) % max_piece;
		size_t end = piece < size - off ? off + piece : size;
		o.err = feed_piece(&rx, data, off, end, &o);
		off = end;
	}
	if (o.err != 0) {
		check(tw__rx_feed(&rx, data, size, &used) == o.err && used == 0);
		check(tw__rx_take(&rx) == NULL);
	}
	o.idle = tw__rx_idle(&rx);
	tw__rx_fini(&rx);
	return o;
}

/* How a read-ahead receiver's socket fills and is read. The peer writes
 * the stream in bursts of `burst` messages (as their totals say; 0: all
 * of it at once), or of 1..8 messages as the input's bytes say when
 * burst is -1; a read never goes past the bytes written so far, so with
 * one message a burst (request/response) each read ends at a message's
 * end and read-ahead is offered. Each read is capped by the input's bytes
 * too when `capped` (a few bytes, up to about 4 KiB, or all that fits);
 * the control bytes are read from the end of the input backwards when
 * `backwards`, else from the start. */
struct reads {
	const uint8_t *p;
	size_t n, k;
	int burst, capped, backwards;
	size_t written; /* bytes of the stream the peer has written so far */
};

static uint8_t control(struct reads *r)
{
	size_t i;
	if (r->n == 0)
		return 0xff;
	i = r->k++ % r->n;
	return r->p[r->backwards ? r->n - 1 - i : i];
}

/* The wire size of the message at off (8 + its total), clamped. */
static size_t wire_at(const uint8_t *p, size_t size, size_t off)
{
	uint64_t total = 0;
	if (size - off < 8)
		return size - off;
	for (int i = 7; i >= 0; i--)
		total = total << 8 | p[off + (size_t)i];
	if (total > size - off - 8)
		return size - off;
	/* a bad head (total below 16): the smallest message's 24 bytes */
	return (size_t)total + 8 < 24 ? 24 : (size_t)total + 8;
}

/* The peer writes its next burst once everything before it was read. */
static void peer_writes(struct reads *r, const uint8_t *p, size_t size, size_t off)
{
	int msgs;
	if (off < r->written)
		return;
	if (r->burst == 0) {
		r->written = size;
		return;
	}
	msgs = r->burst > 0 ? r->burst : 1 + control(r) % 8;
	for (int i = 0; i < msgs && r->written < size; i++) {
		size_t w = wire_at(p, size, r->written);
		r->written += w < size - r->written ? w : size - r->written;
	}
}

static size_t read_cap(struct reads *r, size_t room)
{
	size_t cap = room;
	uint8_t b;
	if (r->capped) {
		b = control(r);
		if (b < 0x30)
			cap = 1 + b % 24;
		else if (b < 0x60)
			cap = 1 + (size_t)(b - 0x30) * 86;
	}
	return cap < room ? cap : room;
}

static uint64_t live_blocks(void)
{
	return atomic_load(&tw__global_stats.blocks_live);
}

/* One read-ahead receiver over the whole input, read as on_readable
 * reads a socket that holds it: replay the carry first, else one readv
 * of at most 64 iovecs; take each message, then check a head read along
 * with it. */
static struct outcome run_gulp(const uint8_t *data, size_t size, size_t small_frame_bytes,
			       tw__place_fn place, struct reads *r, size_t pipe, int peek)
{
	size_t bound = pipe > 0 ? pipe : GULP_MAX;
	struct tw__limits l = {0};
	struct outcome o = {0, FNV_OFFSET, 0, 0, FNV_OFFSET};
	struct tw__rx rx;
	struct iovec iov[64];
	size_t off = 0;
	uint64_t live0 = live_blocks(), carried = 0, copied_at = 0;
	int rv = 0;
	l.max_message_bytes = (uint64_t)1 << 20;
	l.max_frames = 1024;
	l.small_frame_bytes = small_frame_bytes;
	tw__rx_init(&rx, &l);
	tw__rx_set_place(&rx, place, NULL);
	rx.gulp_max = GULP_MAX;
	rx.gulp_pipe_max = pipe;
	pin_max = 16 + bound;
	while (rv == 0 && (off < size || tw__rx_pending(&rx))) {
		if (tw__rx_pending(&rx)) {
			/* a carry is only ever made by a read that offered
			 * read-ahead (a small body's room, too, when pipelined) */
			check((pipe > 0 || carried > 0) && rx.carry != NULL &&
			      rx.carry_len <= bound);
			rv = tw__rx_replay(&rx);
		} else {
			size_t room = 0, n, moved = 0, head_room;
			int k = tw__rx_want(&rx, iov, 64);
			if (k < 0) {
				rv = k;
				break;
			}
			check(k >= 1 && k <= 64);
			for (int i = 0; i < k; i++) {
				check(iov[i].iov_base != NULL && iov[i].iov_len > 0);
				room += iov[i].iov_len;
			}
			/* read-ahead: one block, the 16-byte head then the rest */
			if (rx.gulping)
				check(k == 1 && rx.gulp != NULL && iov[0].iov_len > 16 &&
				      iov[0].iov_len <= 16 + bound &&
				      iov[0].iov_base == tw_block_data(rx.gulp) + rx.gulp_prefix);
			head_room = rx.gulping ? 16 - rx.gulp_prefix : iov[0].iov_len;
			peer_writes(r, data, size, off);
			n = read_cap(r, room < r->written - off ? room : r->written - off);
			check(n >= 1);
			if (peek && k == 1 && tw__rx_reads_ahead(&rx)) {
				/* the peek: n bytes seen, then only `safe` taken */
				size_t safe;
				memcpy(iov[0].iov_base, data + off, n);
				safe = tw__rx_safe(&rx, iov[0].iov_base, n);
				check(safe <= n);
				if (safe == 0)
					continue; /* no whole message seen: the head alone next */
				if (rx.gulping && safe > head_room)
					carried += safe - head_room;
				off += safe;
				rv = tw__rx_advance(&rx, safe);
				goto advanced;
			}
			for (int i = 0; i < k && moved < n; i++) {
				size_t c = iov[i].iov_len < n - moved ? iov[i].iov_len : n - moved;
				memcpy(iov[i].iov_base, data + off + moved, c);
				moved += c;
			}
			if (rx.gulping && n > head_room)
				carried += n - head_room;
			off += n;
			rv = tw__rx_advance(&rx, n);
		}
	advanced:
		if (rv == 1) {
			take_any(&rx, &o, 0);
			/* a misprediction copies at most the read-ahead size */
			check(rx.copied - copied_at <= bound);
			copied_at = rx.copied;
			rv = tw__rx_check_head(&rx);
		}
		check(rv <= 0);
	}
	/* what was copied came out of the carry (a pipelined stream's carry
	 * comes from small bodies' room too, not counted here) */
	check(pipe > 0 || rx.copied <= carried);
	check(!peek || rx.copied == 0); /* a peek takes nothing it must move */
	o.err = rv;
	if (rv < 0) {
		/* sticky: every entry point gives the same code, nothing is
		 * pending, nothing to take */
		check(tw__rx_want(&rx, iov, 64) == rv);
		check(tw__rx_advance(&rx, 0) == rv);
		check(tw__rx_replay(&rx) == rv);
		check(tw__rx_check_head(&rx) == rv);
		check(!tw__rx_pending(&rx));
		check(tw__rx_take(&rx) == NULL);
	} else {
		check(off == size && !tw__rx_pending(&rx) && rx.carry_len == 0);
	}
	o.idle = tw__rx_idle(&rx);
	tw__rx_fini(&rx);
	pin_max = 16 + GULP_MAX;
	check(live_blocks() == live0);
	return o;
}

static void check_same(const struct outcome *x, const struct outcome *y)
{
	check(x->msgs == y->msgs);
	check(x->hash == y->hash);
	check(x->err == y->err);
	check(x->err != 0 || x->idle == y->idle);
	check(x->place == y->place);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	size_t step = size <= ((size_t)64 << 10) ? 1 : 64;
	uint64_t live0 = live_blocks();
	struct reads rd = {data, size, 0, 1, 1, 1, 0}, re = {data, size, 0, -1, 0, 0, 0};
	struct reads rf = {data, size, 0, 2, 1, 0, 0}, rg = {data, size, 0, 0, 0, 0, 0};
	struct reads rh = {data, size, 0, 1, 1, 1, 0}, ri = {data, size, 0, 0, 0, 0, 0};
	struct reads rj = {data, size, 0, 1, 1, 1, 0}, rk = {data, size, 0, 0, 0, 0, 0};
	struct outcome a = run(data, size, TW_DEFAULT_SMALL_FRAME_BYTES, 0, NULL);
	struct outcome b = run(data, size, 16, step, NULL);
	struct outcome c = run(data, size, 16, 97, group);
	struct outcome d = run_gulp(data, size, TW_DEFAULT_SMALL_FRAME_BYTES, NULL, &rd, 0, 0);
	struct outcome e = run_gulp(data, size, TW_DEFAULT_SMALL_FRAME_BYTES, NULL, &re, 0, 0);
	struct outcome f = run_gulp(data, size, 16, group, &rf, 0, 0);
	struct outcome g = run_gulp(data, size, TW_DEFAULT_SMALL_FRAME_BYTES, NULL, &rg, 0, 0);
	struct outcome h = run_gulp(data, size, TW_DEFAULT_SMALL_FRAME_BYTES, NULL, &rh, 16384, 0);
	struct outcome i = run_gulp(data, size, TW_DEFAULT_SMALL_FRAME_BYTES, NULL, &ri, 16384, 0);
	struct outcome j = run_gulp(data, size, TW_DEFAULT_SMALL_FRAME_BYTES, NULL, &rj, 0, 1);
	struct outcome kk = run_gulp(data, size, TW_DEFAULT_SMALL_FRAME_BYTES, NULL, &rk, 65536, 1);
	check(a.msgs == b.msgs && b.msgs == c.msgs);
	check(a.hash == b.hash && b.hash == c.hash);
	check(b.err == c.err);
	check(a.err == 0 || a.err == b.err);
	check_same(&a, &d);
	check_same(&a, &e);
	check_same(&c, &f);
	check_same(&a, &g);
	check_same(&a, &h);
	check_same(&a, &i);
	check_same(&a, &j);
	check_same(&a, &kk);
	check(live_blocks() == live0);
	return 0;
}
