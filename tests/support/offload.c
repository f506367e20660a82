/* SPDX-License-Identifier: BSD-3-Clause */
/* Helpers for the offload suite (tests/support/offload.h). */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <check.h>
#define ZSTD_STATIC_LINKING_ONLY
#include <zstd.h>

#include "tests/support/offload.h"

#define MiB ((size_t)1 << 20)

/* The large payload: 4 random bits a byte, so zstd halves it and its
 * decode takes real time (about 0.15 s for 64 MiB here). */
static struct {
	tw_block *payload;
	size_t bytes;
	tw_msg *tmpl;    /* {"seq": 0, "data": payload}, compressed */
	tw_slice broken; /* its compressed frame, corrupted */
} big;

static uint64_t clock_now;

static void fill_random_nibbles(uint8_t *p, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		uint64_t z = (uint64_t)(i + 1) * UINT64_C(0x9e3779b97f4a7c15);
		z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
		p[i] = (uint8_t)((z ^ (z >> 27)) >> 60);
	}
}

static void pack_str(msgpack_packer *pk, const char *s)
{
	msgpack_pack_str(pk, strlen(s));
	msgpack_pack_str_body(pk, s, strlen(s));
}

/* The map keys before "data": "op" (when given) and "seq". */
static void pack_head(msgpack_packer *pk, uint64_t seq, const char *op)
{
	msgpack_pack_map(pk, op != NULL ? 3 : 2);
	if (op != NULL) {
		pack_str(pk, "op");
		pack_str(pk, op);
	}
	pack_str(pk, "seq");
	msgpack_pack_uint64(pk, seq);
	pack_str(pk, "data");
}

static tw_msg *build_small(uint64_t seq, const char *op, const tw_slice *data)
{
	tw_builder *b;
	tw_msg *m;
	ck_assert_int_eq(tw_builder_new(NULL, &b), 0);
	pack_head(tw_builder_packer(b), seq, op);
	ck_assert_int_eq(tw_builder_pack_bytes(b, data), 0);
	ck_assert_int_eq(tw_builder_finish(b, &m), 0);
	tw_builder_free(b);
	return m;
}

/* ox_init runs before any test, where Check's asserts cannot report. */
#define INIT_REQUIRE(expr)                                                                         \
	do {                                                                                       \
		if (!(expr)) {                                                                     \
			fprintf(stderr, "%s:%d: ox_init: %s\n", __FILE__, __LINE__, #expr);        \
			abort();                                                                   \
		}                                                                                  \
	} while (0)

/* XOR the body of the first compressed block of the zstd frame at p. */
static void corrupt_first_block(uint8_t *p, size_t n)
{
	size_t off = ZSTD_frameHeaderSize(p, n);
	INIT_REQUIRE(!ZSTD_isError(off));
	while (off + 3 <= n) {
		uint32_t bh = p[off] | (uint32_t)p[off + 1] << 8 | (uint32_t)p[off + 2] << 16;
		uint32_t type = (bh >> 1) & 3, size = bh >> 3;
		off += 3;
		if (type == 2) {
			for (uint32_t i = 0; i < size; i++)
				p[off + i] ^= 0x5a;
			return;
		}
		INIT_REQUIRE(!(bh & 1)); /* a compressed block before the last */
		off += type == 1 ? 1 : size;
	}
	INIT_REQUIRE(!"zstd frame ended early");
}

static tw_msg *build_template(void)
{
	tw_builder *b;
	tw_msg *m = NULL;
	INIT_REQUIRE(tw_builder_new("zstd", &b) == 0);
	pack_head(tw_builder_packer(b), 0, NULL);
	INIT_REQUIRE(tw_builder_pack_bytes(b, &(tw_slice){big.payload, 0, big.bytes}) == 0);
	INIT_REQUIRE(tw_builder_finish(b, &m) == 0);
	tw_builder_free(b);
	return m;
}

static void make_broken(void)
{
	const tw_slice *f = tw_msg_frame(big.tmpl, 2);
	big.broken = (tw_slice){NULL, 0, f->len};
	INIT_REQUIRE(tw_block_new(f->len, &big.broken.block) == 0);
	memcpy(tw_block_data(big.broken.block), tw_slice_data(f), f->len);
	corrupt_first_block(tw_block_data(big.broken.block), f->len);
}

void ox_init(void)
{
	big.bytes = ts_quick() ? 2 * MiB : 64 * MiB;
	INIT_REQUIRE(tw_block_new(big.bytes, &big.payload) == 0);
	fill_random_nibbles(tw_block_data(big.payload), big.bytes);
	big.tmpl = build_template();
	INIT_REQUIRE(tw_msg_nframes(big.tmpl) == 3);
	INIT_REQUIRE(tw_msg_frame(big.tmpl, 2)->len < big.bytes); /* compressed */
	make_broken();
}

void ox_fini(void)
{
	tw_msg_free(big.tmpl);
	tw_block_free(big.payload);
	tw_block_free(big.broken.block);
	memset(&big, 0, sizeof(big));
}

size_t ox_large_bytes(void)
{
	return big.bytes;
}

uint64_t ox_threshold(void)
{
	return ts_quick() ? MiB : TW_DEFAULT_OFFLOAD_THRESHOLD_BYTES;
}

/* Frame 0 made here, the payload group's frames shared with the
 * template (no copy, no compression per message). */
static tw_msg *large_with(uint64_t seq, const char *op, const tw_slice *payload_frame)
{
	msgpack_sbuffer sb;
	msgpack_packer pk;
	tw_msg *m;
	msgpack_sbuffer_init(&sb);
	msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
	pack_head(&pk, seq, op);
	msgpack_pack_map(&pk, 1);
	pack_str(&pk, "__Serialized__");
	msgpack_pack_uint64(&pk, 1);
	ck_assert_int_eq(tw_msg_new(&m), 0);
	ck_assert_int_eq(tw_msg_append_copy(m, sb.data, sb.size), 0);
	ck_assert_int_eq(tw_msg_append(m, tw_msg_frame(big.tmpl, 1)), 0);
	ck_assert_int_eq(tw_msg_append(m, payload_frame), 0);
	msgpack_sbuffer_destroy(&sb);
	return m;
}

tw_msg *ox_large(uint64_t seq, const char *op)
{
	return large_with(seq, op, tw_msg_frame(big.tmpl, 2));
}

tw_msg *ox_corrupt(uint64_t seq)
{
	return large_with(seq, NULL, &big.broken);
}

tw_msg *ox_small(uint64_t seq, const char *op)
{
	tw_slice s = {NULL, 0, OX_SMALL_BYTES};
	tw_msg *m;
	ck_assert_int_eq(tw_block_new(OX_SMALL_BYTES, &s.block), 0);
	ts_fill(tw_block_data(s.block), OX_SMALL_BYTES, (unsigned)seq);
	m = build_small(seq, op, &s);
	tw_block_free(s.block);
	return m;
}

/* Receivers. */

uint64_t ox_clock(void)
{
	return clock_now;
}

static int payload_matches(const tw_slice *f, uint64_t seq)
{
	if (f->len == big.bytes)
		return memcmp(tw_slice_data(f), tw_block_data(big.payload), big.bytes) == 0;
	return f->len == OX_SMALL_BYTES &&
	       ts_check(tw_slice_data(f), OX_SMALL_BYTES, (unsigned)seq) == -1;
}

static void check_message(const tw_decoded *d, struct ox_got *g)
{
	const msgpack_object *root = tw_decoded_root(d);
	const msgpack_object *seq = tw_msgpack_map_get(root, "seq"),
			     *data = tw_msgpack_map_get(root, "data");
	const tw_payload *p = data != NULL ? tw_decoded_payload(d, data) : NULL;
	if (seq == NULL || seq->type != MSGPACK_OBJECT_POSITIVE_INTEGER || p == NULL ||
	    p->nframes != 1)
		return;
	g->seq = seq->via.u64;
	g->bytes = p->frames[0].len;
	g->ok = payload_matches(&p->frames[0], g->seq);
}

static void note_thread(struct ox_rx *rx)
{
	if (!pthread_equal(pthread_self(), rx->loop))
		rx->off_thread++;
}

static void on_decoded(tw_comm *c, tw_decoded *d, int err, const char *detail, void *arg)
{
	struct ox_rx *rx = arg;
	struct ox_got *g = &rx->got[rx->n < OX_MAX_MSGS ? rx->n : OX_MAX_MSGS - 1];
	note_thread(rx);
	if (rx->closed || c != rx->comm)
		rx->after_close++;
	rx->n++;
	memset(g, 0, sizeof(*g));
	g->err = err;
	g->order = ++clock_now;
	if (err != 0)
		snprintf(g->detail, sizeof(g->detail), "%s", detail != NULL ? detail : "");
	else if (d != NULL)
		check_message(d, g);
	g->ok = g->ok && (err == 0) == (d != NULL);
	tw_decoded_free(d);
}

static void on_close(tw_comm *c, int err, void *arg)
{
	struct ox_rx *rx = arg;
	note_thread(rx);
	rx->closed++;
	rx->close_err = err;
	rx->close_order = ++clock_now;
	if (!rx->free_in_close)
		return;
	tw_comm_free(c);
	rx->comm = NULL;
	if (rx->owner != NULL)
		rx->owner->comm = NULL;
}

int ox_rx_start(struct ox_rx *rx, tw_comm *c, pthread_t loop)
{
	rx->comm = c;
	rx->loop = loop;
	return tw_comm_set_decoded_callbacks(c, on_decoded, on_close, NULL, rx);
}

int ox_rx_is(const struct ox_rx *rx, size_t i, uint64_t seq)
{
	const struct ox_got *g = &rx->got[i];
	return i < rx->n && g->err == 0 && g->ok && g->seq == seq;
}

/* The harness. */

void ox_setup(struct ox *o, size_t ncomms, unsigned threads)
{
	memset(o, 0, sizeof(*o));
	ck_assert_uint_le(ncomms, OX_MAX_COMMS);
	tu_init(&o->h);
	ck_assert_int_eq(tw_context_set_offload_threshold_bytes(o->h.ctx, ox_threshold()), 0);
	ck_assert_int_eq(tw_context_set_write_hwm_bytes(o->h.ctx, (size_t)1 << 30), 0);
	if (threads > 0)
		ck_assert_int_eq(tw_context_set_offload_threads(o->h.ctx, threads), 0);
	o->h.sopts.no_callbacks = 1;
	ck_assert_int_eq(tu_listen(&o->h, "tcp://127.0.0.1:0"), 0);
	for (size_t i = 0; i < ncomms; i++) {
		struct tu_peer *srv;
		ck_assert_int_eq(tu_connect(&o->h, o->h.addr, &o->cli[i]), 0);
		srv = tu_server_peer(&o->h, i);
		ck_assert_ptr_nonnull(srv);
		ck_assert_int_eq(ox_rx_start(&o->rx[i], srv->comm, pthread_self()), 0);
		o->rx[i].owner = srv;
	}
	o->n = ncomms;
}

void ox_teardown(struct ox *o)
{
	tu_fini(&o->h);
}

void ox_send(struct ox *o, size_t i, tw_msg *m)
{
	for (int tries = 0;; tries++) {
		int rv = tw_comm_write(o->cli[i]->comm, m);
		if (rv == 0)
			return;
		ck_assert_msg(rv == TW_EAGAIN, "write: %s", tw_strerror(rv));
		ck_assert_msg(tries < TU_WAIT_MS / 10, "write queue never drained");
		tu_run_for(&o->h, 10);
	}
}

struct recv_wait {
	const struct ox_rx *rx;
	uint64_t n;
};

static int received(void *arg)
{
	struct recv_wait *w = arg;
	tw_stats st;
	tw_comm_stats(w->rx->comm, &st, sizeof(st));
	return st.msgs_received >= w->n;
}

void ox_wait_received(struct ox *o, size_t i, uint64_t n)
{
	struct recv_wait w = {&o->rx[i], n};
	ck_assert_msg(tu_run_until(&o->h, received, &w, TU_WAIT_MS), "comm %zu: not received", i);
}

void ox_wait_delivered(struct ox *o, size_t i, size_t n)
{
	ck_assert_msg(tu_wait_count(&o->h, &o->rx[i].n, n, TU_WAIT_MS),
		      "comm %zu: %zu of %zu delivered", i, o->rx[i].n, n);
}

void ox_forget(struct ox *o, size_t i)
{
	if (o->rx[i].owner != NULL)
		o->rx[i].owner->comm = NULL;
	o->rx[i].comm = NULL;
}

/* Jobs. */

static void job_run(struct tw__job *job)
{
	struct ox_job *j = (struct ox_job *)job;
	pthread_mutex_lock(&j->mu);
	j->ran = 1;
	while (j->gate && !j->open)
		pthread_cond_wait(&j->cv, &j->mu);
	pthread_mutex_unlock(&j->mu);
}

static void job_done(struct tw__job *job)
{
	struct ox_job *j = (struct ox_job *)job;
	if (!pthread_equal(pthread_self(), j->loop))
		j->done_off_thread = 1;
	j->canceled = job->canceled;
	j->done++;
}

static void open_on_free(struct tw__node *n)
{
	ox_open((struct ox_job *)((char *)n - offsetof(struct ox_job, node)));
}

static struct ox_job *submit(tw_context *ctx, int gate)
{
	struct ox_job *j = calloc(1, sizeof(*j));
	ck_assert_ptr_nonnull(j);
	pthread_mutex_init(&j->mu, NULL);
	pthread_cond_init(&j->cv, NULL);
	j->gate = gate;
	j->loop = pthread_self();
	j->job.run = job_run;
	j->job.done = job_done;
	ck_assert_int_eq(tw__offload_submit(ctx, &j->job), 0);
	if (gate)
		tw__ctx_track(ctx, &j->node, open_on_free);
	return j;
}

struct ox_job *ox_gate(tw_context *ctx)
{
	return submit(ctx, 1);
}

struct ox_job *ox_marker(tw_context *ctx)
{
	return submit(ctx, 0);
}

void ox_open(struct ox_job *j)
{
	pthread_mutex_lock(&j->mu);
	j->open = 1;
	pthread_cond_broadcast(&j->cv);
	pthread_mutex_unlock(&j->mu);
}

int ox_ran(struct ox_job *j)
{
	int ran;
	pthread_mutex_lock(&j->mu);
	ran = j->ran;
	pthread_mutex_unlock(&j->mu);
	return ran;
}

void ox_wait_started(struct ox_job *j)
{
	/* a hang guard only: a loaded machine may start the worker late */
	for (int i = 0; i < TU_WAIT_MS && !ox_ran(j); i++)
		usleep(1000);
	ck_assert_msg(ox_ran(j), "job not started by a worker in %d s", TU_WAIT_MS / 1000);
}

void ox_job_free(struct ox_job *j)
{
	if (j == NULL)
		return;
	tw__ctx_untrack(&j->node); /* the context is gone or keeps no pointer */
	pthread_cond_destroy(&j->cv);
	pthread_mutex_destroy(&j->mu);
	free(j);
}

void ox_wait_job(struct tu *h, struct ox_job *j)
{
	ck_assert_msg(tu_wait_flag(h, &j->done, TU_WAIT_MS), "job never finished");
}

struct ox_job *ox_setup_gated(struct ox *o, size_t ncomms)
{
	ox_setup(o, ncomms, 1);
	return ox_gate(o->h.ctx);
}

void ox_teardown_gated(struct ox *o, struct ox_job *gate)
{
	ox_wait_job(&o->h, gate);
	ox_teardown(o);
	ox_job_free(gate);
}

/* Threads named "tw-offload": a sanitizer's own threads (TSan starts a
 * background one when it likes) are not counted. */
size_t ox_nthreads(void)
{
	DIR *d = opendir("/proc/self/task");
	struct dirent *e;
	size_t n = 0;
	ck_assert_ptr_nonnull(d);
	while ((e = readdir(d)) != NULL) {
		char path[300], name[32] = "";
		FILE *f;
		if (e->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "/proc/self/task/%s/comm", e->d_name);
		if ((f = fopen(path, "r")) == NULL)
			continue; /* it ended meanwhile */
		if (fgets(name, sizeof(name), f) != NULL && strcmp(name, "tw-offload\n") == 0)
			n++;
		fclose(f);
	}
	closedir(d);
	return n;
}

/* A context on its own loop thread. */

struct thr_call {
	struct ox_thr *t;
	void (*fn)(struct ox_thr *t, void *arg);
	void *arg;
	int done;
};

static void thr_tramp(void *arg)
{
	struct thr_call *c = arg;
	c->fn(c->t, c->arg);
	pthread_mutex_lock(&c->t->mu);
	c->done = 1;
	pthread_cond_broadcast(&c->t->cv);
	pthread_mutex_unlock(&c->t->mu);
}

void ox_thr_call(struct ox_thr *t, void (*fn)(struct ox_thr *t, void *arg), void *arg)
{
	struct thr_call c = {t, fn, arg, 0};
	struct timespec ts;
	int rv = 0;
	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += TU_WAIT_MS / 1000;
	ck_assert_int_eq(tw_context_call(t->ctx, thr_tramp, &c), 0);
	pthread_mutex_lock(&t->mu);
	while (!c.done && rv == 0)
		rv = pthread_cond_timedwait(&t->cv, &t->mu, &ts);
	pthread_mutex_unlock(&t->mu);
	ck_assert_msg(c.done, "the loop thread did not run a call");
}

static void thr_accept(tw_listener *l, tw_comm *c, void *arg)
{
	struct ox_thr *t = arg;
	(void)l;
	if (t->nsrv == OX_MAX_COMMS || ox_rx_start(&t->rx[t->nsrv], c, t->loop) != 0) {
		t->err = TW_EINVAL;
		tw_comm_free(c);
		return;
	}
	t->nsrv++;
}

static void thr_connected(tw_comm *c, int err, void *arg)
{
	struct ox_thr *t = arg;
	if (err != 0 || t->ncli == OX_MAX_COMMS) {
		t->err = err != 0 ? err : TW_EINVAL;
		tw_comm_free(c);
		return;
	}
	t->cli[t->ncli++] = c;
}

static void thr_listen(struct ox_thr *t, void *arg)
{
	size_t n = *(size_t *)arg;
	char addr[128];
	t->loop = pthread_self();
	t->err = tw_listener_new(t->ctx, "tcp://127.0.0.1:0", thr_accept, t, &t->lis);
	if (t->err == 0)
		t->err = tw_listener_address(t->lis, addr, sizeof(addr));
	for (size_t i = 0; i < n && t->err == 0; i++)
		t->err = tw_comm_connect(t->ctx, addr, thr_connected, t);
}

static void thr_count(struct ox_thr *t, void *arg)
{
	size_t *out = arg;
	out[0] = t->ncli < t->nsrv ? t->ncli : t->nsrv;
	out[1] = out[2] = 0;
	for (size_t i = 0; i < t->nsrv; i++) {
		tw_stats st = {0};
		if (t->rx[i].comm != NULL)
			tw_comm_stats(t->rx[i].comm, &st, sizeof(st));
		out[1] += t->rx[i].n;
		out[2] += st.msgs_received;
	}
}

/* Poll the loop's counters (comms up, messages delivered). */
static int thr_wait(struct ox_thr *t, size_t which, size_t n)
{
	for (int i = 0; i < TU_WAIT_MS / 5; i++) {
		size_t got[3];
		ox_thr_call(t, thr_count, got);
		if (got[which] >= n || t->err != 0)
			return got[which] >= n;
		usleep(5000);
	}
	return 0;
}

void ox_thr_start(struct ox_thr *t, size_t ncomms, unsigned threads)
{
	memset(t, 0, sizeof(*t));
	pthread_mutex_init(&t->mu, NULL);
	pthread_cond_init(&t->cv, NULL);
	ck_assert_int_eq(tw_context_new(NULL, &t->ctx), 0);
	ck_assert_int_eq(tw_context_set_offload_threshold_bytes(t->ctx, ox_threshold()), 0);
	ck_assert_int_eq(tw_context_set_write_hwm_bytes(t->ctx, (size_t)1 << 30), 0);
	if (threads > 0)
		ck_assert_int_eq(tw_context_set_offload_threads(t->ctx, threads), 0);
	ox_thr_call(t, thr_listen, &ncomms);
	ck_assert_msg(thr_wait(t, 0, ncomms), "comms not up: %s", tw_strerror(t->err));
	ck_assert_int_eq(t->err, 0);
}

int ox_thr_wait_delivered(struct ox_thr *t, size_t n)
{
	return thr_wait(t, 1, n);
}

int ox_thr_wait_received(struct ox_thr *t, size_t n)
{
	return thr_wait(t, 2, n);
}

static void thr_free_comms(struct ox_thr *t, void *arg)
{
	(void)arg;
	for (size_t i = 0; i < t->ncli; i++)
		tw_comm_free(t->cli[i]);
	for (size_t i = 0; i < t->nsrv; i++)
		tw_comm_free(t->rx[i].comm);
	tw_listener_free(t->lis);
	t->ncli = t->nsrv = 0;
	t->lis = NULL;
}

void ox_thr_stop(struct ox_thr *t)
{
	ox_thr_call(t, thr_free_comms, NULL);
	tw_context_free(t->ctx);
	pthread_cond_destroy(&t->cv);
	pthread_mutex_destroy(&t->mu);
}
