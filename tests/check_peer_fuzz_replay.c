/* SPDX-License-Identifier: BSD-3-Clause */
/* Replays tests/fuzz/corpus/handshake, corpus/server and
 * corpus/stream_dispatch through their fuzz targets
 * (tests/fuzz/fuzz_handshake.c and fuzz_server.c, built into this program
 * with -DTW_FUZZ_REPLAY): each file over a live loopback tcp comm;
 * `./tests/check_peer_fuzz_replay handshake|server|stream_dispatch FILE...`
 * replays given files (a libFuzzer crash) instead. */
#include "tests/fuzz/fuzz_peer.h"
#include "tests/fuzz_replay.h"

int main(int argc, char **argv)
{
	static const struct fr_corpus peer[] = {
		{"handshake", "handshake", peer_fuzz_handshake},
		{"server", "server", peer_fuzz_server},
		{"stream_dispatch", "stream_dispatch", peer_fuzz_stream}};
	return fr_main(argc, argv, "peer_fuzz_replay", peer, 3);
}
