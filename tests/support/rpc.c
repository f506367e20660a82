/* SPDX-License-Identifier: BSD-3-Clause */
/* Helpers for the RPC suites (tests/support/rpc.h). */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <check.h>
#include <event2/event.h>

#include "tests/support/rpc.h"

/* Requests. */

static void pack_str(msgpack_packer *pk, const char *s)
{
	msgpack_pack_str(pk, strlen(s));
	msgpack_pack_str_body(pk, s, strlen(s));
}

tw_builder *rq_begin(const char *op, uint32_t nargs)
{
	tw_builder *b;
	ck_assert_int_eq(tw_builder_new(NULL, &b), 0);
	msgpack_pack_map(tw_builder_packer(b), 1 + nargs);
	pack_str(tw_builder_packer(b), "op");
	pack_str(tw_builder_packer(b), op);
	return b;
}

void rq_str(tw_builder *b, const char *key, const char *v)
{
	pack_str(tw_builder_packer(b), key);
	pack_str(tw_builder_packer(b), v);
}

void rq_bool(tw_builder *b, const char *key, int v)
{
	pack_str(tw_builder_packer(b), key);
	if (v)
		msgpack_pack_true(tw_builder_packer(b));
	else
		msgpack_pack_false(tw_builder_packer(b));
}

void rq_double(tw_builder *b, const char *key, double v)
{
	pack_str(tw_builder_packer(b), key);
	msgpack_pack_double(tw_builder_packer(b), v);
}

void rq_int(tw_builder *b, const char *key, int64_t v)
{
	pack_str(tw_builder_packer(b), key);
	msgpack_pack_int64(tw_builder_packer(b), v);
}

void rq_bin(tw_builder *b, const char *key, const void *p, size_t n)
{
	pack_str(tw_builder_packer(b), key);
	msgpack_pack_bin(tw_builder_packer(b), n);
	msgpack_pack_bin_body(tw_builder_packer(b), p, n);
}

void rq_bytes(tw_builder *b, const char *key, const tw_slice *data)
{
	pack_str(tw_builder_packer(b), key);
	ck_assert_int_eq(tw_builder_pack_bytes(b, data), 0);
}

tw_msg *rq_end(tw_builder *b)
{
	tw_msg *m;
	ck_assert_int_eq(tw_builder_finish(b, &m), 0);
	tw_builder_free(b);
	return m;
}

tw_msg *rq_op(const char *op)
{
	return rq_end(rq_begin(op, 0));
}

tw_msg *rq_echo_str(const char *s)
{
	tw_builder *b = rq_begin("echo", 1);
	rq_str(b, "data", s);
	return rq_end(b);
}

tw_msg *rq_echo_pattern(size_t n, unsigned seed)
{
	tw_slice data = ts_pattern_slice(n, seed);
	tw_builder *b = rq_begin("echo", 1);
	rq_bytes(b, "data", &data);
	tw_block_free(data.block); /* the message holds its own reference */
	return rq_end(b);
}

tw_msg *rq_slow(double delay)
{
	tw_builder *b = rq_begin("slow", 1);
	rq_double(b, "delay", delay);
	return rq_end(b);
}

tw_msg *rq_raw(const void *p, size_t n)
{
	tw_msg *m;
	ck_assert_int_eq(tw_msg_new(&m), 0);
	ck_assert_int_eq(tw_msg_append_copy(m, p, n), 0);
	return m;
}

/* Calls. */

int rc_forbid;
static unsigned rc_clock;

static void rc_done(tw_call *call, int err, tw_decoded *reply, void *arg)
{
	struct rc *rc = arg;
	ck_assert_ptr_eq(call, rc->call);
	ck_assert_int_eq(rc->done, 0);
	rc->done = 1;
	rc->err = err;
	rc->reply = reply;
	rc->seq = ++rc_clock;
	rc->late = rc_forbid;
	snprintf(rc->why, sizeof(rc->why), "%s", tw_call_error(call));
	if (err == 0)
		ck_assert_str_eq(rc->why, "");
	if (err != 0 && err != TW_EREMOTE)
		ck_assert_ptr_null(reply);
}

void rc_start(tw_pool *p, const char *uri, tw_msg *req, uint32_t timeout_ms, struct rc *rc)
{
	rc_start_flags(p, uri, req, timeout_ms, 0, rc);
}

void rc_start_flags(tw_pool *p, const char *uri, tw_msg *req, uint32_t timeout_ms, unsigned flags,
		    struct rc *rc)
{
	int rv;
	memset(rc, 0, sizeof(*rc));
	rv = tw_pool_call_flags(p, uri, req, timeout_ms, flags, rc_done, rc, &rc->call);
	ck_assert_msg(rv == 0, "tw_pool_call: %s", tw_strerror(rv));
	ck_assert_int_eq(rc->done, 0); /* never from inside tw_pool_call */
}

static int rc_finished(void *arg)
{
	return ((struct rc *)arg)->done;
}

int rc_wait(struct tu *h, struct rc *rc, int ms)
{
	return tu_run_until(h, rc_finished, rc, ms);
}

int rc_call(struct tu *h, tw_pool *p, const char *uri, tw_msg *req, uint32_t timeout_ms,
	    struct rc *rc)
{
	rc_start(p, uri, req, timeout_ms, rc);
	ck_assert_msg(rc_wait(h, rc, TU_WAIT_MS), "call to %s hung", uri);
	return rc->err;
}

void rc_clear(struct rc *rc)
{
	tw_decoded_free(rc->reply);
	memset(rc, 0, sizeof(*rc));
}

void rc_assert_str(const struct rc *rc, const char *s)
{
	const msgpack_object *o;
	ck_assert_msg(rc->done && rc->err == 0, "call: %s", tw_strerror(rc->err));
	o = tw_decoded_root(rc->reply);
	ck_assert_msg(tw_msgpack_str_eq(o, s), "reply is not \"%s\" (type %d)", s, (int)o->type);
}

void rc_echo_ok(struct tu *h, tw_pool *p, const char *uri, const char *s, uint32_t timeout_ms)
{
	struct rc rc;
	ck_assert_int_eq(rc_call(h, p, uri, rq_echo_str(s), timeout_ms, &rc), 0);
	rc_assert_str(&rc, s);
	rc_clear(&rc);
}

void rc_assert_why(const struct rc *rc, const char *part)
{
	ck_assert_msg(strstr(rc->why, part) != NULL, "tw_call_error \"%s\" lacks \"%s\"", rc->why,
		      part);
}

/* The test server. */

struct rs_timer {
	struct rs *s;
	struct event *ev;
	tw_request *req;
	size_t slot;
	const char *text; /* the reply */
};

int ru_bytes(const tw_decoded *d, const msgpack_object *o, const uint8_t **p, size_t *n)
{
	const tw_payload *pl = o != NULL ? tw_decoded_payload(d, o) : NULL;
	if (pl != NULL && pl->nframes == 1) {
		*p = tw_slice_data(&pl->frames[0]);
		*n = pl->frames[0].len;
		return 0;
	}
	if (o != NULL && pl == NULL && o->type == MSGPACK_OBJECT_BIN) {
		*p = (const uint8_t *)o->via.bin.ptr;
		*n = o->via.bin.size;
		return 0;
	}
	return -1;
}

void ru_assert_pattern(const tw_decoded *d, size_t n, unsigned seed)
{
	const tw_payload *pl = tw_decoded_payload(d, tw_decoded_root(d));
	ck_assert_ptr_nonnull(pl);
	ck_assert_uint_eq(pl->nframes, 1);
	ck_assert_uint_eq(pl->frames[0].len, n);
	ck_assert_int_eq(ts_check(tw_slice_data(&pl->frames[0]), n, seed), -1);
}

static int reply_str(tw_request *r, const char *s)
{
	tw_builder *b = tw_request_reply_builder(r);
	if (b != NULL)
		pack_str(tw_builder_packer(b), s);
	return tw_request_reply(r);
}

static void op_sum(tw_request *r, void *arg)
{
	const uint8_t *p;
	size_t n;
	double sum = 0, v;
	(void)arg;
	if (ru_bytes(tw_request_decoded(r), tw_request_arg(r, "data"), &p, &n) != 0 || n % 8) {
		tw_request_reply_error(r, "sum: `data` must be bytes of float64 values", NULL);
		return;
	}
	for (size_t i = 0; i < n; i += 8) {
		memcpy(&v, p + i, 8);
		sum += v;
	}
	msgpack_pack_double(tw_builder_packer(tw_request_reply_builder(r)), sum);
	tw_request_reply(r);
}

static void op_nbytes(tw_request *r, void *arg)
{
	const uint8_t *p;
	size_t n;
	(void)arg;
	if (ru_bytes(tw_request_decoded(r), tw_request_arg(r, "data"), &p, &n) != 0) {
		tw_request_reply_error(r, "nbytes: `data` must be bytes", NULL);
		return;
	}
	msgpack_pack_uint64(tw_builder_packer(tw_request_reply_builder(r)), n);
	tw_request_reply(r);
}

static void op_fail(tw_request *r, void *arg)
{
	(void)arg;
	tw_request_reply_error(r, "fail: this op always fails", "support/rpc.c op_fail");
}

/* Starts a reply, then fails: the error reply replaces what was packed. */
static void op_fail_late(tw_request *r, void *arg)
{
	msgpack_packer *pk = tw_builder_packer(tw_request_reply_builder(r));
	(void)arg;
	msgpack_pack_map(pk, 2);
	pack_str(pk, "partial");
	tw_request_reply_error(r, "fail_late: gave up halfway", NULL);
}

static void op_count(tw_request *r, void *arg)
{
	struct rs *s = arg;
	s->counted++;
	s->count_wanted_reply = tw_request_wants_reply(r);
	s->last_reply_rv = reply_str(r, "counted");
}

static void op_later(tw_request *r, void *arg)
{
	struct rs *s = arg;
	ck_assert_uint_lt(s->nheld, RS_MAX_HELD);
	s->held[s->nheld++] = r;
}

static void on_slow(evutil_socket_t fd, short what, void *arg)
{
	struct rs_timer *t = arg;
	(void)fd;
	(void)what;
	t->s->slow[t->slot] = NULL;
	t->s->slow_now--;
	t->s->last_reply_rv = reply_str(t->req, "done");
	event_free(t->ev);
	free(t);
}

static size_t free_slot(struct rs_timer **tab, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (tab[i] == NULL)
			return i;
	ck_abort_msg("no free slot");
	return 0;
}

static struct rs_timer *timer_new(struct rs *s, tw_request *r, event_callback_fn fn, double delay)
{
	struct rs_timer *t = calloc(1, sizeof(*t));
	struct timeval tv = {(time_t)delay, (suseconds_t)((delay - (double)(time_t)delay) * 1e6)};
	ck_assert_ptr_nonnull(t);
	t->s = s;
	t->req = r;
	t->ev = evtimer_new(s->base, fn, t);
	ck_assert_ptr_nonnull(t->ev);
	evtimer_add(t->ev, &tv);
	return t;
}

static void op_slow(tw_request *r, void *arg)
{
	struct rs *s = arg;
	const msgpack_object *d = tw_request_arg(r, "delay");
	double delay = d != NULL && d->type == MSGPACK_OBJECT_FLOAT64 ? d->via.f64 : 1.0;
	struct rs_timer *t;
	size_t slot = free_slot(s->slow, RS_MAX_SLOW);
	t = timer_new(s, r, on_slow, delay);
	t->slot = slot;
	s->slow[slot] = t;
	if (++s->slow_now > s->slow_peak)
		s->slow_peak = s->slow_now;
}

/* Stream maps {"op": "item", "i": next, "name": "m<next>"}. */
static void stream_item(tw_comm *comm, const tw_decoded *d, const msgpack_object *m, void *arg)
{
	struct rs *s = arg;
	const msgpack_object *root = tw_decoded_root(d);
	const msgpack_object *i = tw_msgpack_map_get(m, "i");
	char name[32];
	ck_assert_ptr_nonnull(comm);
	if (m == root || (root->type == MSGPACK_OBJECT_ARRAY && m == &root->via.array.ptr[0])) {
		s->item_msgs++;
		s->last_batch = m == root ? 1 : root->via.array.size;
	}
	snprintf(name, sizeof(name), "m%lld", (long long)s->next_item);
	if (i == NULL || i->type != MSGPACK_OBJECT_POSITIVE_INTEGER ||
	    i->via.u64 != (uint64_t)s->next_item ||
	    !tw_msgpack_str_eq(tw_msgpack_map_get(m, "name"), name))
		s->item_errors++;
	s->next_item++;
	s->items++;
}

void rs_start(struct rs *s, tw_context *ctx, struct event_base *base, const char *uri)
{
	char buf[256];
	int saved;
	memset(s, 0, sizeof(*s));
	s->base = base;
	ck_assert_int_eq(tw_server_new(ctx, &s->srv), 0);
	ck_assert_int_eq(tw_server_add_op(s->srv, "sum", op_sum, s), 0);
	ck_assert_int_eq(tw_server_add_op(s->srv, "nbytes", op_nbytes, s), 0);
	ck_assert_int_eq(tw_server_add_op(s->srv, "slow", op_slow, s), 0);
	ck_assert_int_eq(tw_server_add_op(s->srv, "fail", op_fail, s), 0);
	ck_assert_int_eq(tw_server_add_op(s->srv, "fail_late", op_fail_late, s), 0);
	ck_assert_int_eq(tw_server_add_op(s->srv, "later", op_later, s), 0);
	ck_assert_int_eq(tw_server_add_op(s->srv, "count", op_count, s), 0);
	ck_assert_int_eq(tw_server_add_stream_op(s->srv, "item", stream_item, s), 0);
	saved = tu_ns_enter(); /* tests/netns-check.sh */
	ck_assert_int_eq(tw_server_listen(s->srv, tu_uri_host(uri, buf, sizeof(buf))), 0);
	tu_ns_leave(saved);
	ck_assert_int_eq(tw_server_address(s->srv, 0, s->addr, sizeof(s->addr)), 0);
}

static void on_release(evutil_socket_t fd, short what, void *arg)
{
	struct rs_timer *t = arg;
	(void)fd;
	(void)what;
	t->s->rel[t->slot] = NULL;
	t->s->held[t->slot] = NULL;
	t->s->last_reply_rv = reply_str(t->req, "later");
	event_free(t->ev);
	free(t);
}

void rs_release(struct rs *s, size_t i)
{
	struct rs_timer *t;
	ck_assert_ptr_nonnull(s->held[i]);
	ck_assert_ptr_null(s->rel[i]);
	t = timer_new(s, s->held[i], on_release, 0);
	t->slot = i;
	s->rel[i] = t;
}

int rs_held_one(void *arg)
{
	return ((struct rs *)arg)->nheld >= 1;
}

int rs_no_slow(void *arg)
{
	return ((struct rs *)arg)->slow_now == 0;
}

/* Reply to a request whose server is gone: the reply is dropped. */
static void reply_orphan(tw_request *r, const char *s)
{
	ck_assert_int_eq(reply_str(r, s), TW_ECLOSED);
}

void rs_stop(struct rs *s)
{
	tw_server_free(s->srv);
	s->srv = NULL;
	for (size_t i = 0; i < RS_MAX_SLOW; i++) {
		if (s->slow[i] == NULL)
			continue;
		reply_orphan(s->slow[i]->req, "done");
		event_free(s->slow[i]->ev);
		free(s->slow[i]);
		s->slow[i] = NULL;
	}
	for (size_t i = 0; i < RS_MAX_HELD; i++) {
		if (s->rel[i] != NULL) {
			event_free(s->rel[i]->ev);
			free(s->rel[i]);
			s->rel[i] = NULL;
		}
		if (s->held[i] != NULL)
			reply_orphan(s->held[i], "later");
		s->held[i] = NULL;
	}
}

void rf_init(struct rf *f)
{
	tu_init(&f->h);
	rs_start(&f->s, f->h.ctx, f->h.base, "tcp://127.0.0.1:0");
	ck_assert_int_eq(tw_pool_new(f->h.ctx, &f->pool), 0);
}

void rf_fini(struct rf *f)
{
	tw_pool_free(f->pool);
	f->pool = NULL;
	rs_stop(&f->s);
	tu_fini(&f->h);
}

void rf_serves_on(struct rf *f, const char *s)
{
	rc_echo_ok(&f->h, f->pool, f->s.addr, s, 0);
	ck_assert_uint_eq(tw_pool_open_comms(f->pool, f->s.addr), 1);
}

/* The raw client comm. */

static void rw_recv(tw_comm *c, tw_msg *m, void *arg)
{
	struct rw *w = arg;
	char why[200] = "";
	int rv;
	(void)c;
	ck_assert_uint_lt(w->n, RW_MAX_MSGS);
	rv = tw_decode(m, NULL, &w->msgs[w->n], why, sizeof(why));
	ck_assert_msg(rv == 0, "decode: %s: %s", tw_strerror(rv), why);
	w->n++;
}

static void rw_close(tw_comm *c, int err, void *arg)
{
	struct rw *w = arg;
	(void)c;
	w->closed = 1;
	w->close_err = err;
}

static void rw_handshake(tw_comm *c, int err, const tw_handshake_info *info, void *arg)
{
	struct rw *w = arg;
	(void)info;
	w->comm = c;
	if (err == 0)
		err = tw_comm_set_callbacks(c, rw_recv, rw_close, NULL, w);
	w->err = err;
	w->done = 1;
}

int rw_open(struct tu *h, tw_context *ctx, const char *uri, struct rw *w)
{
	memset(w, 0, sizeof(*w));
	w->h = h;
	ck_assert_int_eq(tu_connect_handshake(ctx, uri, rw_handshake, w), 0);
	ck_assert_msg(tu_wait_flag(h, &w->done, TU_WAIT_MS), "connect to %s hung", uri);
	return w->err;
}

void rw_send(struct rw *w, tw_msg *m)
{
	int rv = tw_comm_write(w->comm, m);
	ck_assert_msg(rv == 0, "write: %s", tw_strerror(rv));
}

const tw_decoded *rw_msg(struct rw *w, size_t i)
{
	ck_assert_msg(tu_wait_count_or(w->h, &w->n, i + 1, &w->closed, TU_WAIT_MS),
		      "no message %zu", i);
	return i < w->n ? w->msgs[i] : NULL;
}

void rw_assert_str(struct rw *w, size_t i, const char *s)
{
	const tw_decoded *d = rw_msg(w, i);
	ck_assert_msg(d != NULL && tw_msgpack_str_eq(tw_decoded_root(d), s),
		      "message %zu is not \"%s\"", i, s);
}

void rf_init_rw(struct rf *f, struct rw *w)
{
	rf_init(f);
	ck_assert_int_eq(rw_open(&f->h, f->h.ctx, f->s.addr, w), 0);
}

void rw_free(struct rw *w)
{
	for (size_t i = 0; i < w->n; i++)
		tw_decoded_free(w->msgs[i]);
	tw_comm_free(w->comm);
	memset(w, 0, sizeof(*w));
}

/* Sockets. */

void ru_refused_uri(char *buf, size_t len)
{
	snprintf(buf, len, "tcp://127.0.0.1:%u", ts_free_port());
}

static void bh_accept(evutil_socket_t lfd, short what, void *arg)
{
	struct bh *b = arg;
	int fd;
	(void)what;
	while ((fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC)) >= 0) {
		ck_assert_uint_lt(b->n, BH_MAX);
		b->fds[b->n++] = fd;
		if (b->greet_len > 0)
			ck_assert_int_eq(send(fd, b->greet, b->greet_len, MSG_NOSIGNAL),
					 (ssize_t)b->greet_len);
	}
}

void bh_start(struct bh *b, struct event_base *base, const void *greet, size_t len)
{
	memset(b, 0, sizeof(*b));
	b->lfd = ts_raw_listen("tcp", 256, SOCK_NONBLOCK, b->addr, sizeof(b->addr));
	b->greet = greet;
	b->greet_len = len;
	b->ev = event_new(base, b->lfd, EV_READ | EV_PERSIST, bh_accept, b);
	ck_assert_ptr_nonnull(b->ev);
	event_add(b->ev, NULL);
}

void bh_stop(struct bh *b)
{
	if (b->ev != NULL)
		event_free(b->ev);
	for (size_t i = 0; i < b->n; i++)
		close(b->fds[i]);
	if (b->lfd > 0)
		close(b->lfd);
	memset(b, 0, sizeof(*b));
}

/* {"op": op, "i": i, "name": "m<i>"} packed. */
void ru_send_item(tw_batched *b, const char *op, int64_t i)
{
	msgpack_sbuffer sb;
	msgpack_packer pk;
	char name[32];
	int len = snprintf(name, sizeof(name), "m%lld", (long long)i);
	msgpack_sbuffer_init(&sb);
	msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
	msgpack_pack_map(&pk, 3);
	msgpack_pack_str(&pk, 2);
	msgpack_pack_str_body(&pk, "op", 2);
	msgpack_pack_str(&pk, strlen(op));
	msgpack_pack_str_body(&pk, op, strlen(op));
	msgpack_pack_str(&pk, 1);
	msgpack_pack_str_body(&pk, "i", 1);
	msgpack_pack_int64(&pk, i);
	msgpack_pack_str(&pk, 4);
	msgpack_pack_str_body(&pk, "name", 4);
	msgpack_pack_str(&pk, (size_t)len);
	msgpack_pack_str_body(&pk, name, (size_t)len);
	ck_assert_int_eq(tw_batched_send(b, sb.data, sb.size), 0);
	msgpack_sbuffer_destroy(&sb);
}
