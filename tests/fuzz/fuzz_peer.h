/* SPDX-License-Identifier: BSD-3-Clause */
/* A raw peer over loopback TCP for the fuzz targets that feed bytes to a
 * live comm (tests/fuzz/fuzz_handshake.c, fuzz_server.c,
 * fuzz_stream_dispatch.c): the library side is a real comm of a
 * tw_context on one event loop, the peer a plain socket that writes the
 * input, shuts its side, and reads everything the library writes back,
 * until the library closes the connection and every comm it made is
 * gone. Shared with tests/check_peer_fuzz_replay.c, which replays the
 * corpora through the same entry points under `make check`.
 *
 * Input layout (as tests/fuzz/fuzz_decode.c's, repeated): a list of
 * messages, each a byte n (frame count, bits 0-3; 0 makes a bad
 * prelude), n u16le frame lengths, then the frames (a length or frame cut
 * short by the end of the input is cut there). fp_wire turns it into the
 * stream framing (u64le total | u64le n | u64le lengths | frames), so the
 * fuzzer mutates the messages, not their lengths; framing itself is
 * fuzz_stream's. */
#ifndef TW_TESTS_FUZZ_PEER_H
#define TW_TESTS_FUZZ_PEER_H

#include <stddef.h>
#include <stdint.h>

#include <taskwire/taskwire.h>

/* The shared loop and two contexts: [0] offers no compression, [1] zstd;
 * made on first use, kept for the process. */
struct fp_env {
	struct event_base *base;
	tw_context *ctx[2];
};
struct fp_env *fp_env(void);
/* The first time (*made 0): make(i, ctx[i]) for both contexts, then
 * *made = 1. For what a target keeps for the process (listeners,
 * servers), one per context. */
void fp_once(int *made, void (*make)(int i, tw_context *ctx));

/* Append the wire bytes of the messages in p[0..n) to *buf (malloc'd,
 * *len bytes so far). Aborts when out of memory. */
void fp_wire(const uint8_t *p, size_t n, uint8_t **buf, size_t *len);
/* Append the wire bytes of one message of one frame, frame[0..n). */
void fp_wire_frame(const void *frame, size_t n, uint8_t **buf, size_t *len);
/* The msgpack bytes of a handshake offering `codec` (NULL: nil). */
void fp_handshake_frame(const char *codec, uint8_t **buf, size_t *len);

/* Objects (comms, listeners, connects) ctx tracks now. */
size_t fp_live(const tw_context *ctx);

/* A blocking connect to the listener at `uri` (tcp://127.0.0.1:PORT); the
 * socket, or aborts. */
int fp_dial(const char *uri);

/* Write in[0..n) on fd (the peer's socket, owned and closed here), shut
 * the write side, read what the library writes until it closes, running
 * the loop until then and until fp_live(ctx) is back to `live`. Checks
 * that what the library wrote parses as whole, decodable messages (the
 * last may be cut short by an abort). Returns the number of messages read. */
size_t fp_run(struct fp_env *e, tw_context *ctx, size_t live, int fd, const uint8_t *in, size_t n);

/* The entry points (each also the LLVMFuzzerTestOneInput of its target
 * unless TW_FUZZ_REPLAY is defined); each returns 0 and aborts on a broken
 * invariant. tests/fuzz/fuzz_handshake.c: */
int peer_fuzz_handshake(const uint8_t *data, size_t size);
/* tests/fuzz/fuzz_server.c: */
int peer_fuzz_server(const uint8_t *data, size_t size);
int peer_fuzz_stream(const uint8_t *data, size_t size);

#endif
