/* SPDX-License-Identifier: BSD-3-Clause */
/* Replaying fuzz corpora as Check tests, so `make check` runs every seed
 * and every saved crash through the fuzz targets' own entry points. A
 * target that finds a broken invariant aborts, which fails the test of
 * that file. */
#ifndef TW_TESTS_FUZZ_REPLAY_H
#define TW_TESTS_FUZZ_REPLAY_H

#include <stddef.h>
#include <stdint.h>

struct fr_corpus {
	const char *name; /* on the command line */
	const char *dir;  /* under $TW_TOP_SRCDIR/tests/fuzz/corpus/ */
	int (*entry)(const uint8_t *data, size_t size);
};

/* fr_main: with no arguments, replay every file of each corpus directory
 * (found through TW_TOP_SRCDIR, set by TESTS_ENVIRONMENT; at least 10 files
 * each, so a missing directory cannot pass as an empty replay); with
 * arguments, replay those files instead (a libFuzzer crash, without
 * building the fuzzer): `FILE...` when there is one corpus, `NAME FILE...`
 * when there are several. Returns the exit status. */
int fr_main(int argc, char **argv, const char *suite, const struct fr_corpus *corpora, int n);

#endif
