/* SPDX-License-Identifier: BSD-3-Clause */
/* Entry points of the WebSocket fuzz targets under their own names, so one
 * program (tests/check_ws_fuzz_replay.c, built with -DTW_FUZZ_REPLAY) can
 * replay both corpora; each target also defines LLVMFuzzerTestOneInput
 * unless TW_FUZZ_REPLAY is defined. Each returns 0 and aborts on a broken
 * invariant. */
#ifndef TW_TESTS_FUZZ_WS_H
#define TW_TESTS_FUZZ_WS_H

#include <stddef.h>
#include <stdint.h>

/* tests/fuzz/fuzz_ws_codec.c */
int ws_fuzz_codec(const uint8_t *data, size_t size);
/* tests/fuzz/fuzz_ws_upgrade.c */
int ws_fuzz_upgrade(const uint8_t *data, size_t size);

#endif
