/* SPDX-License-Identifier: BSD-3-Clause */
/* Helpers for the RPC suites (tests/check_rpc*.c), on top of the TCP
 * harness (tests/support/harness.h): requests, calls through a tw_pool that
 * record their result, a tw_server with test ops, a raw Dask client comm,
 * and a black-hole listener. A relay that counts connections is the fault
 * proxy without a fault (FP_PASS, tests/support/fault_proxy.h).
 * Everything runs on the harness's loop (the test's thread); deadlines
 * only bound waits, no test asserts on time. */
#ifndef TW_TESTS_SUPPORT_RPC_H
#define TW_TESTS_SUPPORT_RPC_H

#include <stddef.h>
#include <stdint.h>

#include <taskwire/taskwire.h>

#include "tests/support/harness.h"

/* Requests: a map {"op": op, <nargs more pairs>}. */
tw_builder *rq_begin(const char *op, uint32_t nargs);
void rq_str(tw_builder *b, const char *key, const char *v);
void rq_bool(tw_builder *b, const char *key, int v);
void rq_double(tw_builder *b, const char *key, double v);
void rq_int(tw_builder *b, const char *key, int64_t v);
void rq_bin(tw_builder *b, const char *key, const void *p, size_t n);
/* Out-of-band raw bytes (the message references data). */
void rq_bytes(tw_builder *b, const char *key, const tw_slice *data);
tw_msg *rq_end(tw_builder *b);
tw_msg *rq_op(const char *op);
tw_msg *rq_echo_str(const char *s); /* echo(data=s) */
/* echo(data=<n pattern bytes of seed, out of band>): the reply is those
 * bytes, out of band (ru_assert_pattern). */
tw_msg *rq_echo_pattern(size_t n, unsigned seed);
tw_msg *rq_slow(double delay);
/* A message whose frame 0 is the msgpack value packed in p (n bytes). */
tw_msg *rq_raw(const void *p, size_t n);

/* One call through a pool, and what came back. */
struct rc {
	int done, err;
	tw_decoded *reply;
	unsigned seq; /* completion order (1, 2, ...) across all calls */
	int late;     /* the callback ran while *rc_forbid was set */
	tw_call *call;
	char why[256]; /* tw_call_error, as the callback saw it */
};
/* Set while no callback may run (e.g. after tw_pool_free returned). */
extern int rc_forbid;

void rc_start(tw_pool *p, const char *uri, tw_msg *req, uint32_t timeout_ms, struct rc *rc);
/* rc_start with tw_pool_call_flags. */
void rc_start_flags(tw_pool *p, const char *uri, tw_msg *req, uint32_t timeout_ms, unsigned flags,
		    struct rc *rc);
int rc_wait(struct tu *h, struct rc *rc, int ms);
/* Start, wait, return the error; the reply stays in rc. */
int rc_call(struct tu *h, tw_pool *p, const char *uri, tw_msg *req, uint32_t timeout_ms,
	    struct rc *rc);
void rc_clear(struct rc *rc);
/* Assert that the reply is the str s. */
void rc_assert_str(const struct rc *rc, const char *s);
/* rc_call of echo with s to uri (timeout_ms, 0 for none): asserts the call
 * succeeded and its reply is s. */
void rc_echo_ok(struct tu *h, tw_pool *p, const char *uri, const char *s, uint32_t timeout_ms);
/* Assert that the call's tw_call_error text contains part. */
void rc_assert_why(const struct rc *rc, const char *part);

/* A tw_server with test ops besides the built-ins:
 *   sum(data)     sum of float64 values (out-of-band or bin)
 *   nbytes(data)  length of data
 *   slow(delay)   "done" after delay seconds, from a timer
 *   fail()        an uncaught-error reply
 *   fail_late()   packs part of a reply, then replies with an error
 *   later()       held until rs_release (deferred reply)
 *   count()       counts, then replies "counted" (nothing with reply=false)
 * and the stream op "item": maps {"op": "item", "i": <next index>,
 * "name": "m<i>"} are counted and checked. */
#define RS_MAX_HELD 16
#define RS_MAX_SLOW 256
struct rs {
	tw_server *srv;
	struct event_base *base;
	char addr[128];
	tw_request *held[RS_MAX_HELD];
	size_t nheld;
	size_t counted;
	int count_wanted_reply;             /* tw_request_wants_reply of the last count */
	struct rs_timer *slow[RS_MAX_SLOW]; /* slow handlers waiting */
	struct rs_timer *rel[RS_MAX_HELD];  /* rs_release timers */
	size_t slow_peak, slow_now;         /* slow handlers in flight */
	/* Stream "item" maps. */
	size_t items, item_errors, item_msgs;
	int64_t next_item;
	uint32_t last_batch; /* maps in the last stream message */
	int last_reply_rv;   /* what the last tw_request_reply returned */
};

/* Start the server on ctx (on base) listening on uri (addr: bound URI). */
void rs_start(struct rs *s, tw_context *ctx, struct event_base *base, const char *uri);
/* Reply "later" to held request i from a 0 ms timer. */
void rs_release(struct rs *s, size_t i);
/* Predicates for tu_run_until (arg: the struct rs): a "later" request is
 * held; no slow handler is in flight. */
int rs_held_one(void *arg);
int rs_no_slow(void *arg);
/* Free the server; then reply to held and slow requests (orphans). */
void rs_stop(struct rs *s);

/* The usual fixture: the harness, the test server on tcp://127.0.0.1:0
 * on the harness's context, and a pool on the same context. */
struct rf {
	struct tu h;
	struct rs s;
	tw_pool *pool;
};
void rf_init(struct rf *f);
/* Free the pool, stop the server, free the harness. */
void rf_fini(struct rf *f);
/* f still serves: rc_echo_ok of s through f's pool (no deadline), and the
 * pool holds exactly one comm to f's server. */
void rf_serves_on(struct rf *f, const char *s);

/* A raw client comm: connect, Dask handshake, decoded messages kept. */
#define RW_MAX_MSGS 64
struct rw {
	struct tu *h;
	tw_comm *comm;
	int done, err, closed, close_err;
	tw_decoded *msgs[RW_MAX_MSGS];
	size_t n;
};
int rw_open(struct tu *h, tw_context *ctx, const char *uri, struct rw *w);
void rw_send(struct rw *w, tw_msg *m);
/* Message i, waiting for it; NULL when the comm closed first. */
const tw_decoded *rw_msg(struct rw *w, size_t i);
/* Message i, waited for, is the string s. */
void rw_assert_str(struct rw *w, size_t i, const char *s);
/* rf_init(f), then rw_open(w) to f's server (asserted). */
void rf_init_rw(struct rf *f, struct rw *w);
void rw_free(struct rw *w);

/* A listener that accepts and then never reads; on accept it writes
 * greet (may be NULL). */
#define BH_MAX 128
struct bh {
	int lfd;
	struct event *ev;
	int fds[BH_MAX];
	size_t n;
	const void *greet;
	size_t greet_len;
	char addr[64];
};
void bh_start(struct bh *b, struct event_base *base, const void *greet, size_t len);
void bh_stop(struct bh *b);

/* Send {"op": op, "i": i, "name": "m<i>"} on b. Asserts. */
void ru_send_item(tw_batched *b, const char *op, int64_t i);

/* A tcp:// address where nothing listens. */
void ru_refused_uri(char *buf, size_t len);
/* The bytes of a decoded value: an out-of-band payload of one frame or
 * inline bin. Returns 0 or -1. */
int ru_bytes(const tw_decoded *d, const msgpack_object *o, const uint8_t **p, size_t *n);
/* d's root is an out-of-band payload of one frame of n pattern bytes of
 * seed (the reply to rq_echo_pattern). Asserts. */
void ru_assert_pattern(const tw_decoded *d, size_t n, unsigned seed);

#endif
