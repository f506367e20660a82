/* SPDX-License-Identifier: BSD-3-Clause */
/* Replays tests/fuzz/corpus/decode through the tw_decode fuzz target
 * (tests/fuzz/fuzz_decode.c); `./tests/check_fuzz_decode_replay FILE...`
 * replays given files (a libFuzzer crash) instead. */
#include "tests/fuzz/fuzz.h"
#include "tests/fuzz_replay.h"

int main(int argc, char **argv)
{
	static const struct fr_corpus decode[] = {{"decode", "decode", LLVMFuzzerTestOneInput}};
	return fr_main(argc, argv, "fuzz_decode_replay", decode, 1);
}
