/* SPDX-License-Identifier: BSD-3-Clause */
/* Relay (cut-through) of large frames over tcp (docs/design.md, Relay).
 *
 * A tcp comm with relay on stops reading a message at its first frame of
 * at least the relay threshold (frame 1 or later): the message is
 * delivered with the frames before it in memory and every frame from it
 * on as a *relay frame*, a slice of one placeholder block (address space
 * only, PROT_NONE: a stray read faults instead of reading garbage) whose
 * bytes are still in the source's socket. The source reads nothing more
 * until each relay frame is consumed, in order.
 *
 * A relay frame is single-use: a message written to another tcp comm may
 * carry it (one claim); that comm's writer moves its bytes socket -> pipe
 * -> socket with splice(2) when the source's cursor reaches it, so they
 * never enter user space.
 *
 * Pipes belong to the loop: each loop's context has a pool of at most 8
 * pipes of 1 MiB (POOL_PIPES in relay.c: 8 MiB of pipe buffers), made on
 * demand and kept until the context is freed (a context extension,
 * core/context.h), so relays one after another reuse one pipe instead of
 * making one each. A relay takes one only while
 * bytes sit in it (from the splice in to the splice out that empties it)
 * and gives it back at once; a relay that finds all 8 taken (their
 * destinations slow) moves its bytes with recv and send through a 64 KiB
 * buffer of its own until one is free, so any number of relays run at
 * once. Linux allows an unprivileged user 1 MiB pipes up to
 * fs/pipe-user-pages-soft (16384 pages, 64 MiB: 16 pipes) in all, after
 * which new pipes shrink to one page; a pipe per relay took them all at 16
 * relays. A frame whose claim is dropped unwritten (the
 * destination ended), or that nobody claimed by the time the placeholder
 * block is freed, is drained (read and dropped). When the source's bytes
 * end early, every claimant is woken and fails with the relay's error.
 *
 * Everything here runs on the loop thread of the source comm; the
 * destination comms must be on the same loop, and relay frames must be
 * freed there. */
#ifndef TW_TRANSPORT_RELAY_H
#define TW_TRANSPORT_RELAY_H

#include <stddef.h>
#include <stdint.h>

#include <event2/event.h>

#include <taskwire/buf.h>
#include <taskwire/context.h>
#include <taskwire/msg.h>

struct tw__relay;

/* Smallest relay threshold: above the largest read-ahead (16 KiB), so
 * bytes already read ahead lie within the first relay frame. */
#define TW__RELAY_MIN_BYTES ((uint64_t)64 << 10)

/* tw__relay_new: the relay of the n frames (lengths lens) that follow in
 * socket fd, of which the first prefix_len bytes were already read, to
 * prefix in prefix_block (held, not copied). Appends the n relay frames to m: each a placeholder
 * block of its own (address space in one PROT_NONE mapping). kick(kick_arg) runs (from a libevent
 * callback) when the relay is done or failed. Sets *r (the source's reference). 0 or TW_ENOMEM:
 * then nothing is set and m may hold some frames (free it).
 * min_rate (bytes/s; 0: off) and grace_ms: the source comm's minimum
 * receive rate (tw_context_set_min_receive_rate), applied by the same rule
 * to the bytes the relay takes from the socket: its clock runs while the
 * relay waits for the source (not while it waits for a destination), and
 * a source below it fails the relay with TW_ETIMEDOUT ("... below the
 * minimum of N bytes/s"), which every claimant and the source then end
 * with, as with any other message in progress. */
int tw__relay_new(tw_context *ctx, int fd, const uint64_t *lens, size_t n, tw_block *prefix_block,
		  const uint8_t *prefix, size_t prefix_len, void (*kick)(void *arg), void *kick_arg,
		  uint64_t min_rate, uint64_t grace_ms, tw_msg *m, struct tw__relay **r);

/* tw__relay_state: 0 while frames remain, 1 when every frame was
 * consumed or drained, or the negative TW_E* code it failed with. */
int tw__relay_state(const struct tw__relay *r);
/* tw__relay_error: the failure's text ("" while it has not failed). */
const char *tw__relay_error(const struct tw__relay *r);

/* tw__relay_detach: the source is done with r (err 0), or stops while
 * frames remain (err < 0: every claimant fails with it). The socket is
 * the source's again; drops the source's reference. */
void tw__relay_detach(struct tw__relay *r, int err, const char *why);

/* tw__relay_of: the relay whose frame s is, and its index in *i (SIZE_MAX
 * when s is not the whole frame), or NULL when s is no relay frame. */
struct tw__relay *tw__relay_of(const tw_slice *s, size_t *i);

/* tw__relay_in_msg: 1 when some frame of m is a relay frame. */
int tw__relay_in_msg(const tw_msg *m);
/* tw__relay_bytes: the bytes of m's relay frames (0 for most messages):
 * bytes in their source's socket, not in memory. */
uint64_t tw__relay_bytes(const tw_msg *m);

/* tw__relay_turn: 1 when frame i is the one r's source waits on (its
 * cursor, r still running): its claimant holds the source up until it
 * writes it. */
int tw__relay_turn(const struct tw__relay *r, size_t i);

/* tw__relay_claim: a destination takes frame i; wake(warg) runs (never
 * inside a call of the destination's) whenever it should pump again. 0,
 * or TW_EINVAL when the frame was claimed, consumed or drained before. */
int tw__relay_claim(struct tw__relay *r, size_t i, void (*wake)(void *warg), void *warg);
/* tw__relay_unclaim: the claimant gives frame i up (its write queue is
 * dropped); what it did not consume is drained. */
void tw__relay_unclaim(struct tw__relay *r, size_t i);

/* tw__relay_pump: move up to max bytes of frame i into socket dfd. Sets
 * *moved. Returns 0 (with *moved 0: wait for wake), TW_EAGAIN (dfd is
 * full and nothing moved: wait until it is writable), TW_EIO (writing dfd
 * failed: errno says why), or the relay's failure code (then
 * tw__relay_state is below 0: a source's reset is TW_EIO too). */
int tw__relay_pump(struct tw__relay *r, size_t i, int dfd, size_t max, size_t *moved);

#endif
