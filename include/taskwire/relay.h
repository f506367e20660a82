/* SPDX-License-Identifier: BSD-3-Clause */
/* taskwire: relay (cut-through) of large frames between tcp comms.
 *
 * A process that only forwards payloads (a scheduler: a client's scatter
 * to workers, workers' get_data replies to a client's gather) need not
 * read them: with relay on, a received message is delivered as soon as
 * the frames before its first large frame are in, and that frame and
 * every one after it stay in the socket as *relay frames*. A message
 * written to another tcp comm may carry them; that comm's writer moves
 * their bytes socket -> pipe -> socket with splice(2) when their turn
 * comes, so they never enter user space (docs/design.md, Relay).
 *
 * Rules a user must keep:
 * - The source comm reads nothing more until every relay frame of the
 *   message is consumed (written) or dropped, in the source's order.
 *   Frames of one source may go to several comms (scatter), each comm
 *   taking them in increasing order; a comm waits for its frame's turn.
 * - A relay frame is written at most once, to a tcp comm on the same loop
 *   other than its source (tw_comm_write refuses it otherwise:
 *   TW_EINVAL; what the source writes waits until its relay frames are
 *   consumed, so one written back to it would never go: a tw_server's
 *   `echo` of a relayed payload answers "reply not sent: invalid
 *   argument").
 * - Its bytes cannot be read: tw_slice_data of a relay frame points at
 *   address space that faults. tw_msg_frame_is_relay tells them apart.
 * - A relay frame nobody writes is drained (read and dropped) once every
 *   reference to it is gone; one whose write is dropped (that comm ended)
 *   too, so the source goes on. Free relay frames on the loop thread.
 * - If the source's bytes end early, every comm that claimed one of its
 *   frames ends with the relay's error (its message is cut short on the
 *   wire), and the source ends with TW_ETRUNCATED.
 * - The source's minimum receive rate (tw_context_set_min_receive_rate)
 *   holds for its relayed frames too, by the same rule, on the bytes the
 *   relay takes from its socket: the clock runs while the relay waits for
 *   the source, not while it waits for a destination (a full socket, a
 *   frame not yet claimed). A source that stalls in the middle of a
 *   relayed frame, its kernel still acknowledging, ends with TW_ETIMEDOUT
 *   ("peer sent N bytes in S s while a relayed frame was in progress ...,
 *   below the minimum of R bytes/s"), and so does every comm that claimed
 *   one of its frames ("its message is corrupt: " and that text).
 * - Relay frames' bytes wait in their source's socket, not in memory: they
 *   count in neither budget (tw_context_set_receive_budget_bytes,
 *   tw_context_set_write_budget_bytes), nor in the memory limit
 *   (tw_context_set_memory_limit_bytes), nor in the destination's write
 *   high-water mark (tw_context_set_write_hwm_bytes: a relay frame as
 *   large as the mark refused every write until it drained, session 18),
 *   though tw_comm_queued_bytes
 *   counts them until written; and a comm whose writer waits for a relay
 *   frame's source is never ended by the memory limit for it (its peer
 *   took all there was). Before (session 17), a relayed 32 MiB frame
 *   counted 32 MiB in both, and a client whose relayed gather waited
 *   behind a worker's pause was ended by the limit.
 * - A comm whose peer takes none of a relay frame's bytes, or of the bytes
 *   queued before it, once the source waits for that frame, holds up the
 *   source, whose own peer's TCP timeout (Dask's 30 s) would end that
 *   connection: once its peer has acknowledged none of our bytes for the
 *   receive budget's pause limit (tw_context_set_receive_budget_pause_ms,
 *   20 s by default, looked at every eighth of it: ended at most 9/8 of
 *   it after the last ack; 0: never, and a limit set later applies
 *   within a second) while a relay frame of its queue is
 *   its source's next, the comm ends with TW_ETIMEDOUT ("its peer took
 *   none of our bytes for N ms while a relayed frame's source waited for
 *   it ..."), its socket is reset (SO_LINGER 0), its frame is drained
 *   and the source goes on.
 * tls, ws and wss comms ignore the setting (their bytes are decrypted or
 * unframed in user space anyway). */
#ifndef TASKWIRE_RELAY_H
#define TASKWIRE_RELAY_H

#include <stddef.h>
#include <stdint.h>

#include <taskwire/comm.h>
#include <taskwire/context.h>
#include <taskwire/msg.h>

#ifdef __cplusplus
extern "C" {
#endif

#pragma GCC visibility push(default)

/* tw_context_set_relay_bytes: relay frames of at least min_frame_bytes
 * (frame 1 or later of a message) on the tcp comms the context makes from
 * now on (accepted and connected); 0 (the default) turns it off.
 * Thread: the context's loop thread, or before it runs.
 * Source of the rule: Dask's scheduler forwards payloads as opaque
 * Serialized frames (scheduler.py scatter / gather, deserialize=False).
 * Returns 0, or:
 *   TW_EINVAL  ctx is NULL, or min_frame_bytes is not 0 and below 64 KiB
 *              (bytes read ahead, at most 16 KiB, must lie inside the
 *              first relay frame) */
int tw_context_set_relay_bytes(tw_context *ctx, uint64_t min_frame_bytes);

/* tw_comm_set_relay_bytes: the same for one comm, from its next message
 * on (a tls, ws or wss comm takes it and relays nothing). Thread: the
 * comm's loop thread.
 * Returns 0, or:
 *   TW_EINVAL  comm is NULL, or min_frame_bytes below 64 KiB and not 0 */
int tw_comm_set_relay_bytes(tw_comm *comm, uint64_t min_frame_bytes);

/* tw_msg_frame_is_relay: 1 when frame i of m is a relay frame (its bytes
 * still in its source's socket), 0 when it is an ordinary frame, m is
 * NULL or i is out of range (a flag, not a taskwire error code). Any
 * thread. */
int tw_msg_frame_is_relay(const tw_msg *m, size_t i);

/* The end of a relay (the frames of one received message that stayed in
 * its source's socket): err 0 when each of its frames was written out or
 * drained (a destination that failed does not fail the relay: its frames
 * are drained), else why its source's bytes did not all come, one of:
 *   TW_ETRUNCATED  the source's peer closed in the middle of a frame
 *   TW_EIO         ... or reset it (or another read error)
 *   TW_ETIMEDOUT   the source sent below its minimum receive rate
 *   TW_ECLOSED     the source comm was closed, aborted or freed first
 *   TW_ENOMEM      no memory for the relay's buffer
 *   TW_ECANCELED   the context was freed before the relay ended
 * why: the relay's text ("peer closed in the middle of a relayed frame:
 * frame F of N, after B of its L bytes", ...; "" when err is 0), valid
 * during the call. */
typedef void (*tw_relay_ended_fn)(int err, const char *why, void *arg);

/* tw_relay_watch_end: run fn(err, why, arg) once when the relay that
 * relay frame `frame` (all of it or a part: a tw_slice of a message, or a
 * tw_payload's frame) belongs to ends: on the loop thread of its source
 * comm, never inside this call nor inside the call that ended it (a
 * tw_comm_free); when it has already ended, on the next loop pass. A
 * watch that has not run when the context is freed runs from
 * tw_context_free (with the end, if it was known, else TW_ECANCELED), so
 * fn runs exactly once and may free arg. A forwarder learns this way that
 * a message it wrote with the frame was cut short on the wire (its
 * destination comm ended with the same error) and whose fault it was.
 * Any number of watches per relay; they outlive the frame.
 * Thread: the loop thread of the source comm's context, while it lives.
 * Returns 0, or:
 *   TW_EINVAL  frame or fn is NULL, or frame is no relay frame
 *   TW_ENOMEM  out of memory (fn never runs)
 * Source: Dask's Scheduler.gather removes a worker whose get_data failed
 * (scheduler.py gather, utils_comm.py gather_from_workers); a relayed
 * reply fails after the scheduler's own reply went out, and this is where
 * it learns of it. */
int tw_relay_watch_end(const tw_slice *frame, tw_relay_ended_fn fn, void *arg);

#pragma GCC visibility pop

#ifdef __cplusplus
}
#endif
#endif
