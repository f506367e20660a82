/* SPDX-License-Identifier: BSD-3-Clause */
/* libFuzzer entry points, shared by the fuzz targets and by
 * tests/check_fuzz_replay.c, which replays the corpora under `make check`. */
#ifndef TW_TESTS_FUZZ_H
#define TW_TESTS_FUZZ_H

#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#endif
