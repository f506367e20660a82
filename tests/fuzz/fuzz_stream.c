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
 * A disagreement or a broken invariant aborts. Limits: 1 MiB messages,
 * 1,024 frames.
 *
 * Built by `CC=clang ./configure --enable-fuzzers && make` (see
 * tests/Makefile.inc); replayed over tests/fuzz/corpus/stream by
 * tests/check_fuzz_replay under `make check`. */
#include <stdlib.h>

#include <taskwire/msg.h>

#include "core/context.h"
#include "tests/fuzz/fuzz.h"
#include "transport/frame_rx.h"

#define FNV_OFFSET UINT64_C(0xcbf29ce484222325)
#define FNV_PRIME  UINT64_C(0x100000001b3)

struct outcome {
	size_t msgs;
	uint64_t hash; /* over every message's frame lengths and bytes */
	int err;       /* 0 when the input ended without an error */
};

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

/* Take, check and free the completed message. */
static void take(struct tw__rx *rx, struct outcome *o)
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
	}
	check(sum == tw_msg_bytes(m));
	check(tw__rx_idle(rx));
	o->msgs++;
	tw_msg_free(m);
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
	struct outcome o = {0, FNV_OFFSET, 0};
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
	tw__rx_fini(&rx);
	return o;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	size_t step = size <= ((size_t)64 << 10) ? 1 : 64;
	struct outcome a = run(data, size, TW_DEFAULT_SMALL_FRAME_BYTES, 0, NULL);
	struct outcome b = run(data, size, 16, step, NULL);
	struct outcome c = run(data, size, 16, 97, group);
	check(a.msgs == b.msgs && b.msgs == c.msgs);
	check(a.hash == b.hash && b.hash == c.hash);
	check(b.err == c.err);
	check(a.err == 0 || a.err == b.err);
	return 0;
}
