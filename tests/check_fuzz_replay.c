/* SPDX-License-Identifier: BSD-3-Clause */
/* Replays tests/fuzz/corpus/stream through the stream fuzz target
 * (tests/fuzz/fuzz_stream.c); `./tests/check_fuzz_replay FILE...` replays
 * given files (a libFuzzer crash) instead. */
#include "tests/fuzz/fuzz.h"
#include "tests/fuzz_replay.h"

int main(int argc, char **argv)
{
	static const struct fr_corpus stream[] = {{"stream", "stream", LLVMFuzzerTestOneInput}};
	return fr_main(argc, argv, "fuzz_replay", stream, 1);
}
