/* SPDX-License-Identifier: BSD-3-Clause */
/* Fuzz target: the Dask handshake (protocol/handshake.c) on a live tcp
 * comm, both sides, fed by a raw peer (tests/fuzz/fuzz_peer.h).
 *
 * Byte 0: bit 0 the library's side (1: it accepted the connection and
 * writes first; 0: it connected and reads first), bit 1 its context
 * offers zstd. The rest is the peer's messages (fuzz_peer.h's layout):
 * the first is its handshake, the rest arrive after it (read and
 * dropped).
 *
 * Invariants (a broken one aborts): the handshake callback runs exactly
 * once, with 0, TW_EPROTO, or an error of the comm's for bad input (a
 * prelude's, TW_ETRUNCATED, TW_ECLOSED, TW_EIO); on
 * success pickle-protocol is within 0..5, the peer's codec is NULL, "zstd"
 * or "lz4", and the negotiated one is NULL or the codec offered; on
 * failure the comm says why. What the library wrote is whole, decodable
 * messages; every comm is freed and no block is left alive afterwards.
 * A crash, leak or hang is ASan's or libFuzzer's.
 *
 * Built by `CC=clang ./configure --enable-fuzzers && make` (see
 * tests/Makefile.inc); replayed over tests/fuzz/corpus/handshake by
 * tests/check_peer_fuzz_replay under `make check`. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <event2/event.h>

#include "tests/fuzz/fuzz.h"
#include "tests/fuzz/fuzz_peer.h"

static void check(int ok)
{
	if (!ok)
		abort();
}

struct hs_run {
	const char *offered;
	int calls, connected;
	tw_comm *comm;
};

static void on_recv(tw_comm *comm, tw_msg *msg, void *arg)
{
	(void)comm;
	(void)msg;
	(void)arg;
}

static void on_close(tw_comm *comm, int err, void *arg)
{
	(void)err;
	(void)arg;
	tw_comm_free(comm);
}

static void on_hs(tw_comm *comm, int err, const tw_handshake_info *info, void *arg)
{
	struct hs_run *r = arg;
	r->calls++;
	check(r->calls == 1);
	/* its own, or the comm's (a bad prelude, a cut message, a reset) */
	check(err == 0 || err == TW_EPROTO || err == TW_ECLOSED || err == TW_ENOFRAMES ||
	      err == TW_ETOOMANY || err == TW_ELENGTH || err == TW_ETOOBIG ||
	      err == TW_ETRUNCATED || err == TW_EIO);
	if (err != 0) {
		const char *why = tw_comm_last_error(comm);
		check(info == NULL && why != NULL && why[0] != '\0');
		tw_comm_free(comm);
		return;
	}
	check(info != NULL && info->pickle_protocol >= 0 && info->pickle_protocol <= 5);
	check(info->peer_compression == NULL || strcmp(info->peer_compression, "zstd") == 0 ||
	      strcmp(info->peer_compression, "lz4") == 0);
	check(info->compression == NULL ||
	      (r->offered != NULL && strcmp(info->compression, r->offered) == 0));
	check(tw_comm_compression(comm) == info->compression);
	check(tw_comm_set_callbacks(comm, on_recv, on_close, NULL, r) == 0);
}

/* The run under way (the listeners outlive runs). */
static struct hs_run *current;

static void on_accept(tw_listener *l, tw_comm *comm, void *arg)
{
	(void)l;
	(void)arg;
	check(current != NULL &&
	      tw_comm_handshake(comm, TW_HANDSHAKE_LISTENER, on_hs, current) == 0);
}

static void on_connect(tw_comm *comm, int err, void *arg)
{
	struct hs_run *r = arg;
	check(err == 0);
	r->connected = 1;
	check(tw_comm_handshake(comm, TW_HANDSHAKE_CONNECTOR, on_hs, arg) == 0);
}

struct side {
	tw_listener *l; /* the library listens (listener side) */
	char uri[64];
	int raw; /* the peer listens (connector side) */
	char raw_uri[64];
};

static struct side sides[2];

static void make_side(int i, tw_context *ctx)
{
	struct side *s = &sides[i];
	struct sockaddr_in sa;
	socklen_t sl = sizeof(sa);
	check(tw_listener_new(ctx, "tcp://127.0.0.1:0", on_accept, NULL, &s->l) == 0);
	check(tw_listener_address(s->l, s->uri, sizeof(s->uri)) == 0);
	s->raw = socket(AF_INET, SOCK_STREAM, 0);
	memset(&sa, 0, sizeof(sa));
	sa.sin_family = AF_INET;
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	check(bind(s->raw, (struct sockaddr *)&sa, sizeof(sa)) == 0 && listen(s->raw, 16) == 0 &&
	      getsockname(s->raw, (struct sockaddr *)&sa, &sl) == 0);
	snprintf(s->raw_uri, sizeof(s->raw_uri), "tcp://127.0.0.1:%u",
		 (unsigned)ntohs(sa.sin_port));
}

static struct side *side_of(int k)
{
	static int made;
	fp_once(&made, make_side);
	return &sides[k];
}

int peer_fuzz_handshake(const uint8_t *data, size_t size)
{
	struct fp_env *e = fp_env();
	int zstd = size > 0 && (data[0] & 2), listener_side = size > 0 && (data[0] & 1);
	struct side *s = side_of(zstd);
	tw_context *ctx = e->ctx[zstd];
	struct hs_run r = {zstd ? "zstd" : NULL, 0, 0, NULL};
	uint8_t *in = NULL;
	size_t n = 0, live = fp_live(ctx);
	tw_stats before, after;
	int fd;
	tw_stats_global(&before, sizeof(before));
	current = &r;
	if (size > 0)
		fp_wire(data + 1, size - 1, &in, &n);
	if (listener_side) {
		fd = fp_dial(s->uri);
	} else {
		check(tw_comm_connect(ctx, s->raw_uri, on_connect, &r) == 0);
		while (!r.connected)
			check(event_base_loop(e->base, EVLOOP_ONCE) == 0);
		check((fd = accept(s->raw, NULL, NULL)) >= 0);
	}
	fp_run(e, ctx, live, fd, in, n);
	check(r.calls == 1);
	current = NULL;
	free(in);
	tw_stats_global(&after, sizeof(after));
	check(after.blocks_live == before.blocks_live);
	return 0;
}

#ifndef TW_FUZZ_REPLAY
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	return peer_fuzz_handshake(data, size);
}
#endif
