/* SPDX-License-Identifier: BSD-3-Clause */
/* Receiving one stream-framed message straight into its final blocks.
 *
 * Sans-I/O: the receiver asks tw__rx_want where the next bytes go (a list
 * of iovecs into the message's own blocks), reads into them with one
 * readv (or SSL_read), and reports the count with tw__rx_advance. No
 * payload byte is copied on the way.
 *
 * Placement: a message of at most `small_message_bytes` after its 16-byte
 * head (total, N) is read into one block, prelude and frames together.
 * Otherwise each frame is placed before its bytes are read: frames up to
 * `small_frame_bytes` share one slab block, in order, and each larger
 * frame gets an exact-size block of its own (or the hook's grouping), so
 * a kept small frame never pins a large neighbour. Small frames are placed
 * as soon as the lengths are known, so one readv spans many of them (a
 * message of 100,000 small frames takes some thousands of reads, not
 * 100,000); a large frame waits until the frames before it are complete,
 * for the hook to read their sub-headers.
 *
 * Read-ahead ("gulp"): once a comm has received a run of small messages
 * (request/response traffic), the read for the next head goes into one
 * block of the head plus about the last message's size, so a small
 * message arrives in one read of one buffer instead of two reads (head,
 * then body). The head is copied out of it (16 bytes); the bytes past it
 * are the carry: a small message wholly inside it becomes slices of it (no
 * copy); anything else, a misprediction, is copied out of it into its
 * usual place, and counted in payload_bytes_copied (at most gulp_max
 * bytes per message). Off unless gulp_max is set.
 *
 * Pipelined streams (gulp_pipe_max set): a read that fills its read-ahead
 * says more is waiting, so the next read-ahead block is twice as large, up
 * to gulp_pipe_max; a short read sizes the next one to what it got. One
 * read then brings many messages, each sliced from the block (no copy, no
 * block allocated per message; a pipelined stream's blocks are all
 * gulp_pipe_max bytes, so one that came back serves any read). While a
 * run of small messages lasts, a small body read on its own takes what
 * follows into its block's room too. A message cut at the block's end moves to
 * the start of the next read-ahead block (the same block when every
 * message sliced from it was freed): a split head is read on from there,
 * a split small body too, the read taking the messages after it along; the
 * bytes moved are counted in payload_bytes_copied (one small message per
 * block at most). A large message is read as before, into its own blocks:
 * only what the read-ahead took of it is copied (at most gulp_pipe_max).
 *
 * Over tcp none of those copies happen: the reader peeks into the
 * read-ahead block (tw__rx_reads_ahead, tw__rx_safe) and takes only the
 * rest of the message in progress and the whole small messages after it;
 * a large message, or one still arriving, stays in the socket and is read
 * from its head into its own blocks, and no message is ever cut at a
 * block's end. The price is a second, copy-free syscall per read-ahead
 * (MSG_TRUNC discards what was peeked). TLS cannot peek without
 * decrypting into OpenSSL's buffer and copying, so it keeps the copies
 * above, counted in payload_bytes_copied. */
#ifndef TW_TRANSPORT_FRAME_RX_H
#define TW_TRANSPORT_FRAME_RX_H

#include <sys/uio.h>

#include <taskwire/msg.h>

#include "core/context.h"
#include "transport/stream_codec.h"
#include "transport/upper.h"

/* tw__place_fn (the placement hook): transport/upper.h. */

enum tw__rx_phase { RX_HEAD, RX_SMALL, RX_LENGTHS, RX_FRAMES, RX_DONE, RX_ERROR };

struct tw__rx {
	struct tw__sdec dec;
	const struct tw__limits *limits; /* the comm's, read at each message */
	size_t small_message_bytes, small_frame_bytes;
	tw__place_fn place;
	void *place_arg;
	enum tw__rx_phase phase;
	int err;
	uint8_t head[16];
	size_t have;      /* bytes of head (RX_HEAD) or body (RX_SMALL) */
	uint8_t next[16]; /* RX_SMALL: the next message's head, read along */
	size_t next_have;
	tw_block *body;     /* RX_SMALL: lengths and frames (made by want) */
	size_t body_off;    /* where they start in body */
	size_t body_len;    /* their bytes */
	size_t gulp_max;    /* largest read-ahead; 0: none */
	size_t gulp_size;   /* read-ahead for the next head; 0: none */
	unsigned small_run; /* consecutive small messages up to gulp_max */
	tw_block *gulp;     /* read-ahead block offered by the last want */
	int gulping;        /* the last want offered it */
	tw_block *carry;    /* bytes read ahead, not yet consumed */
	size_t carry_off, carry_len;
	/* Pipelined streams (reads that fill the read-ahead): */
	size_t gulp_pipe_max; /* largest read-ahead then; 0: never more than gulp_max */
	size_t gulp_pipe;     /* block size the last reads ask for (0: none) */
	size_t gulp_prefix;   /* bytes of gulp's start read already (a split head) */
	size_t body_room;     /* RX_SMALL: body block bytes past the body, for read-ahead */
	size_t offered;       /* bytes the last read-ahead offered */
	tw_msg *msg;          /* frames placed so far */
	size_t cur;           /* frame being filled */
	size_t cur_have;      /* its bytes received */
	tw_block *slab;       /* default home of small frames */
	size_t slab_off;
	uint64_t copied; /* bytes tw__rx_feed copied */
	size_t peeked;   /* bytes the last peek saw (tw__rx_safe), 0: none */
	int plain;       /* no read-ahead for this message's head (a peek found no whole one) */
	/* Relay (transport/relay.h): with relay_min set, a message stops at
	 * its first frame i >= 1 of relay_min bytes or more, once frames
	 * 0..i-1 are complete: it is complete then (tw__rx_take gives frames
	 * 0..i-1), and relay_lens (the caller frees it) holds the lengths of
	 * the relay_n frames left in the socket; carry bytes, if any, are
	 * their first bytes (tw__rx_drop_carry once they are copied). */
	uint64_t relay_min;
	uint64_t *relay_lens;
	size_t relay_n;
};

/* tw__rx_drop_carry: forget the bytes read ahead (a relay took them). */
void tw__rx_drop_carry(struct tw__rx *rx);

void tw__rx_init(struct tw__rx *rx, const struct tw__limits *limits);
void tw__rx_fini(struct tw__rx *rx);
void tw__rx_set_place(struct tw__rx *rx, tw__place_fn fn, void *arg);

/* tw__rx_want: fill iov[0..max-1] with where the next bytes go; returns the
 * number of iovecs (>= 1), or the sticky error. While a small message's
 * body is read, a second iovec takes the next message's 16-byte head too:
 * then a read that comes back short tells the socket is drained, and a
 * second read that would only say EAGAIN is saved. With max 1 there is
 * no read-ahead. */
int tw__rx_want(struct tw__rx *rx, struct iovec *iov, int max);
/* tw__rx_advance: n bytes landed in the iovecs of the last want. Returns 1
 * when a message is complete (take it), 0 when more is needed, or a
 * negative code (those of tw__sdec_advance, TW_ENOMEM, or the hook's). */
int tw__rx_advance(struct tw__rx *rx, size_t n);
/* tw__rx_take: the completed message (caller owns it); the receiver starts
 * on the next message. */
tw_msg *tw__rx_take(struct tw__rx *rx);
/* tw__rx_check_head: run the checks on head bytes already held (carried
 * over from the last read); 0 or the sticky error. */
int tw__rx_check_head(struct tw__rx *rx);
/* tw__rx_pending: 1 while read-ahead bytes wait; replay them (below)
 * before reading again: the socket will not signal them. */
int tw__rx_pending(const struct tw__rx *rx);
/* tw__rx_replay: consume read-ahead bytes as if just read, up to the end
 * of a message. Same returns as tw__rx_advance. */
int tw__rx_replay(struct tw__rx *rx);
/* Read-ahead by peeking (a layer that can: tcp). tw__rx_reads_ahead: 1
 * when the last want's iovec (one) reaches past the message in progress.
 * Then the reader may peek into it instead of reading, and take only
 * tw__rx_safe's count of the n bytes it saw (the rest of the message in
 * progress, then whole small messages), then advance by that count: a
 * large message or one still arriving is left in the socket, and read
 * into its own blocks. 0 means no whole message was seen: want then
 * offers the head alone. */
int tw__rx_reads_ahead(const struct tw__rx *rx);
size_t tw__rx_safe(struct tw__rx *rx, const uint8_t *p, size_t n);
/* tw__rx_progress: bytes of the message in progress received so far,
 * prelude included (for error texts: a peer that closed mid-message). */
uint64_t tw__rx_progress(const struct tw__rx *rx);
/* tw__rx_idle: 1 when no byte of a next message has arrived. */
int tw__rx_idle(const struct tw__rx *rx);
/* tw__rx_feed: copy bytes in through want/advance, stopping after one
 * complete message (*used counts what was consumed); it never reads ahead.
 * For tests, fuzzing and replays; same returns as tw__rx_advance. */
int tw__rx_feed(struct tw__rx *rx, const uint8_t *p, size_t n, size_t *used);

#endif
