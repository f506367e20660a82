/* SPDX-License-Identifier: BSD-3-Clause */
/* The transports of the conformance suite (tests/support/tran.h). */
#include <stdio.h>
#include <string.h>

#include "tests/support/tls.h"
#include "tests/support/tran.h"
#include "transport/stream_codec.h"

static const char *const schemes[TS_NTRAN] = {"tcp", "tls", "ws", "wss"};

const char *ts_tran_scheme(int t)
{
	return t >= 0 && t < TS_NTRAN ? schemes[t] : "none";
}

int ts_tran_tls(int t)
{
	return t == TS_TLS || t == TS_WSS;
}

int ts_tran_ws(int t)
{
	return t == TS_WS || t == TS_WSS;
}

void ts_tran_init(struct tu *h, int t)
{
	tu_init(h);
	if (ts_tran_tls(t))
		tt_use_tls(h->ctx, "ca.pem", "cert.pem", "key.pem");
}

int ts_tran_listen_at(struct tu *h, int t, const char *host)
{
	char uri[128];
	snprintf(uri, sizeof(uri), strchr(host, ':') ? "%s://[%s]:0" : "%s://%s:0",
		 ts_tran_scheme(t), host);
	return tu_listen(h, uri);
}

void ts_tran_listen(struct tu *h, int t)
{
	ck_assert_int_eq(ts_tran_listen_at(h, t, "127.0.0.1"), 0);
}

struct tu_peer *ts_tran_connect(struct tu *h)
{
	struct tu_peer *cli;
	size_t nsrv = h->nsrv;
	int rv = tu_connect(h, h->addr, &cli);
	ck_assert_msg(rv == 0, "connect %s: %s: %s", h->addr, tw_strerror(rv),
		      tw_context_last_error(h->ctx));
	cli->keep = 1;
	/* The client's end can be up before the listener's (TLS 1.3: the
	 * server takes the client's Finished after the client is done, and
	 * handshake steps wait their turn in the context's queue): wait for
	 * the accept, so that h->srv[] holds the comms in the order the test
	 * made them (check_tls reject: a later accept took srv[0]). */
	ck_assert_msg(tu_wait_count(h, &h->nsrv, nsrv + 1, TU_WAIT_MS), "%s never accepted",
		      h->addr);
	return cli;
}

struct tu_peer *ts_tran_setup_echo(struct tu *h, int t)
{
	ts_tran_init(h, t);
	ts_tran_listen(h, t);
	return ts_tran_connect(h);
}

/* One WebSocket frame header (RFC 6455 section 5.2). */
static uint64_t ws_header(uint64_t len, int masked)
{
	return (len <= 125 ? 2 : len <= 0xffff ? 4 : 10) + (masked ? 4 : 0);
}

static uint64_t ws_wire(const size_t *lens, size_t nf, size_t shard, int masked)
{
	uint64_t n = ws_header(8, masked) + 8;
	for (size_t i = 0; i < nf; i++) {
		size_t left = lens[i];
		if (left == 0)
			n += ws_header(0, masked);
		while (left > 0) {
			size_t k = left < shard ? left : shard;
			n += ws_header(k, masked) + k;
			left -= k;
		}
	}
	return n;
}

uint64_t ts_tran_wire_bytes(int t, const size_t *lens, size_t nf, size_t shard, int from_client)
{
	uint64_t n = tw__stream_prelude_bytes(nf);
	if (ts_tran_ws(t))
		return ws_wire(lens, nf, shard, from_client);
	for (size_t i = 0; i < nf; i++)
		n += lens[i];
	return n;
}

static tw_stats comm_stats(tw_comm *c)
{
	tw_stats st;
	tw_comm_stats(c, &st, sizeof(st));
	return st;
}

void ts_tran_echo_wire(int t, struct tu_peer *cli, struct tu_peer *srv, const size_t *lens,
		       size_t nf, unsigned seed, size_t shard)
{
	tw_stats c0 = comm_stats(cli->comm), s0 = comm_stats(srv->comm), c1, s1;
	uint64_t up = ts_tran_wire_bytes(t, lens, nf, shard, 1);
	uint64_t down = ts_tran_wire_bytes(t, lens, nf, shard, 0);
	tu_echo_check(cli, lens, nf, seed, TU_WAIT_MS);
	c1 = comm_stats(cli->comm);
	s1 = comm_stats(srv->comm);
	ck_assert_uint_eq(c1.bytes_sent - c0.bytes_sent, up);
	ck_assert_uint_eq(s1.bytes_received - s0.bytes_received, up);
	ck_assert_uint_eq(s1.bytes_sent - s0.bytes_sent, down);
	ck_assert_uint_eq(c1.bytes_received - c0.bytes_received, down);
	ck_assert_uint_eq(c1.msgs_received - c0.msgs_received, 1);
}

TCase *ts_tran_tcase(int t, const TTest *const tests[], int timeout_s)
{
	TCase *tc = tcase_create(ts_tran_scheme(t));
	tcase_set_timeout(tc, timeout_s);
	for (size_t i = 0; tests[i] != NULL; i++)
		tcase_add_loop_test(tc, tests[i], t, t + 1);
	return tc;
}
