/* SPDX-License-Identifier: BSD-3-Clause */
/* The work one loop pass may do across all its comms (issue 17).
 *
 * A comm reading or writing a large message stops after its own budget
 * (4 MiB) and leaves the rest of the socket to the next pass: epoll
 * reports it again (its events persist, level-triggered), after the comms
 * whose bytes arrived meanwhile. Alone that still lets 50 busy comms move
 * 50 x 4 MiB in one pass; so the pass has a budget too, shared by every
 * comm of the loop's thread: once it is spent a comm moves only a small
 * minimum, enough for small messages to keep flowing. A pass is told
 * apart by libevent's cached time, which the loop refreshes once a pass
 * (event_base_gettimeofday_cached); two passes in one microsecond count
 * as one, which only makes the bound tighter. */
#ifndef TW_CORE_PASS_H
#define TW_CORE_PASS_H

#include <stddef.h>

struct event_base;

/* Bytes a comm of base may move now, at most want. Loop thread. */
size_t tw__pass_allow(struct event_base *base, size_t want);
/* Count n bytes moved in this pass. Loop thread. */
void tw__pass_spent(size_t n);

#endif
