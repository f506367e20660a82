/* SPDX-License-Identifier: BSD-3-Clause */
/* The work one loop pass may do across all its comms (issue 17).
 *
 * A comm reading or writing a large message stops after its own budget
 * (4 MiB) and leaves the rest of the socket to the next pass: epoll
 * reports it again (its events persist, level-triggered), after the comms
 * whose bytes arrived meanwhile. Alone that still lets 50 busy comms move
 * 50 x 4 MiB in one pass; so the pass has a budget too, shared by every
 * comm of the loop's thread: once it is spent a comm moves only a small
 * minimum, enough for small messages to keep flowing. The pass's budget
 * is also spent once the pass has run 2 ms: on a busy machine copying is
 * several times slower. A pass is told
 * apart by libevent's cached time, which the loop refreshes once a pass
 * (event_base_gettimeofday_cached); two passes in one microsecond count
 * as one, which only makes the bound tighter. */
#ifndef TW_CORE_PASS_H
#define TW_CORE_PASS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

struct event_base;

/* Bytes a comm of base may move now, at most want. Loop thread. */
size_t tw__pass_allow(struct event_base *base, size_t want);
/* tw__pass_allow for a comm's read, which its read callback ends with
 * tw__pass_close: pages it writes are counted (tw__pass_cold). */
size_t tw__pass_read(struct event_base *base, size_t want);
/* Count n bytes moved in this pass by a comm allowed `left` more: what
 * it may still move in this pass; 0 also when the pass's budget is spent
 * (bytes or time) and the comm had more than the minimum, or when
 * tw__pass_cold cut its last read short (it goes on next pass, once more
 * pages are faulted in off the loop). Loop thread. */
size_t tw__pass_spent(size_t left, size_t n);
/* Of want bytes about to be written to pages not faulted in yet (the
 * writer takes the page faults), how many this pass allows: the pass's
 * share of such bytes, and once that is spent one page (a reader always
 * moves on). Counts what it returns. Outside a comm's read (between
 * tw__pass_read and tw__pass_close: a reader not driven by the loop),
 * all of want. Loop thread. */
size_t tw__pass_cold(size_t want);
/* A comm's read ends (its read callback returns). */
void tw__pass_close(void);
/* The most one read or write call of a comm (tcp, tls, ws, wss) moves
 * of its allowance `allowed`. The pass's time is looked
 * at between calls (tw__pass_spent), so one call is what a pass cannot
 * cut short: whole 4 MiB allowances in one recv or send were in
 * budget-bench's longest passes at load 7-10 (5-13 ms of loop CPU
 * counted; a loopback send also runs the receiving socket's TCP in the
 * sender's thread). 1 MiB bounds that unit to a quarter, for 3 more
 * calls per 4 MiB. */
#define TW__PASS_CALL ((size_t)1 << 20)
static inline size_t tw__pass_call(size_t allowed)
{
	return allowed < TW__PASS_CALL ? allowed : TW__PASS_CALL;
}
/* Tests: from now on a comm moves at most `bytes` per wakeup (0: no cap
 * beyond the above), in every loop of the process, so that each read of
 * a comm ends on its allowance, as reads under load do when the pass's
 * time is up, however many bytes the socket holds. Any thread. */
void tw__pass_cap(size_t bytes);
/* 1 when a TLS handshake step may start now, counted; 0 when it must
 * wait for the next pass (issue 17, breaker17 b17-6). A step is one
 * SSL_do_handshake: an RSA-2048 signature alone is 1-2 ms of loop CPU,
 * and 200 clients connecting at once made one pass of 433 ms, during
 * which no comm was served. A step starts while the pass's time (the
 * same 2 ms as the bytes above) is not spent, and the pass's first step
 * always starts, so that handshakes progress however busy the loop is.
 * The pass is the one tw__pass_allow tells apart; a step's time counts
 * in it, so the bytes moved after a long step are the minimums. A step
 * that must wait is run again by its caller on a later pass, from a
 * timer of TW__PASS_NEXT_US: epoll does not report again what OpenSSL
 * already read, and event_active inside a pass runs in that same pass
 * (libevent 2.1). Loop thread. */
int tw__pass_step(struct event_base *base);
/* 1 when a comm's end may release its socket and TLS (or send its end)
 * now, counted; 0 when it must wait for a later pass (core/reap.h). As
 * for a handshake step: while the pass's time is not spent, and the
 * pass's first always, so that a comm ending alone is released at once.
 * Loop thread. */
int tw__pass_release(struct event_base *base);
/* The timeout (microseconds) of a timer that runs on the next pass, never
 * on this one: past libevent's cached time. A zero timeout fires on the
 * next loop iteration, which with the default coarse clock is most often
 * the same pass: the loop would spin until the clock moves. */
#define TW__PASS_NEXT_US 1
/* How long ago (ms, rounded down) the loop's pass began: libevent times
 * a timer from its cached clock, the pass's start, so a timeout that is
 * to run from now (a deadline's rest) is armed with this added; armed
 * late in a long pass without it, it fired that much early (breaker18
 * b18-7: a 20 ms connect timeout ended some connects at 16 ms). 0
 * outside the loop. Loop thread. */
uint32_t tw__pass_lag_ms(struct event_base *base);
/* Tests: from now on (on = 1) every pass's time counts as spent as soon
 * as it starts, in every loop of the process, as on a loaded machine:
 * comms move their minimum per wakeup and each pass starts one TLS
 * handshake step. 0: measured again. Any thread. */
void tw__pass_spend(int on);
/* Keep the first iovecs of iov[0..k-1] that hold at most cap bytes (cap >
 * 0): the count left. A comm asks the kernel for no more than its
 * allowance: one recv or writev of a socket buffer moves megabytes, and
 * budget-bench's passes moved 40-200 MB when only the calls were
 * counted. Any thread. */
int tw__iov_cap(struct iovec *iov, int k, size_t cap);

#endif
