/* SPDX-License-Identifier: BSD-3-Clause */
/* Echo shapes that every stream transport must carry, shared by the tcp
 * and tls suites: each takes the client peer of an echo server that the
 * suite set up (tu_setup_echo, tt_setup_echo) and checks every byte that
 * comes back. The suites pass what differs: the sizes around their own
 * thresholds (small-frame limit, TLS record size). */
#ifndef TW_TESTS_ECHO_SHAPES_H
#define TW_TESTS_ECHO_SHAPES_H

#include <stddef.h>

#include "tests/support/harness.h"

/* A frame of 0 bytes, then a message of three empty frames. */
void es_empty_frames(struct tu_peer *cli);
/* One byte, of pattern seed 5. */
void es_one_byte(struct tu_peer *cli);
/* One message of 1,000 frames of varied sizes: every tenth is one of the
 * ten `edges`, the others 0..4999 bytes. */
void es_1000_frames(struct tu_peer *cli, const size_t edges[10]);
/* 1,000 two-frame messages written at once: all come back in order and
 * intact, and the comm stays open. */
void es_1000_pipelined(struct tu *h, struct tu_peer *cli, const size_t edges[10]);
/* One frame of `len` bytes, waiting at most `ms`. */
void es_one_frame(struct tu_peer *cli, size_t len, int ms);
/* Frames of many sizes in one message (`edge` and edge + 1 among them),
 * then a small frame right behind a large one. */
void es_mixed(struct tu_peer *cli, size_t edge);

#endif
