/* SPDX-License-Identifier: BSD-3-Clause */
/* Replays the WebSocket fuzz corpora tests/fuzz/corpus/ws_codec and
 * ws_upgrade through their targets (tests/fuzz/fuzz_ws_codec.c and
 * fuzz_ws_upgrade.c, built into this program with -DTW_FUZZ_REPLAY);
 * `./tests/check_ws_fuzz_replay codec|upgrade FILE...` replays given files
 * (a libFuzzer crash) instead. */
#include "tests/fuzz/fuzz_ws.h"
#include "tests/fuzz_replay.h"

int main(int argc, char **argv)
{
	static const struct fr_corpus ws[] = {{"codec", "ws_codec", ws_fuzz_codec},
					      {"upgrade", "ws_upgrade", ws_fuzz_upgrade}};
	return fr_main(argc, argv, "ws_fuzz_replay", ws, 2);
}
