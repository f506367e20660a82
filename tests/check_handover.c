/* SPDX-License-Identifier: BSD-3-Clause */
/* Comms a scheduler keeps (issue 16): a stream handler's comm held past
 * its end (tw_comm_hold, tw_comm_watch_end), with the peer a real Python
 * Dask process killed with SIGKILL, or a raw socket cut in the middle of a
 * message. The held comm answers (peer address, TW_ECLOSED on write) and
 * the end watch runs once with the reason. Run under ASan and valgrind
 * (scripts/valgrind-check.sh): before comms had references, the server
 * freed the comm at the end and these reads were a use-after-free. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <check.h>

#include "tests/support/dask.h"
#include "tests/support/pack.h"
#include "tests/support/rpc.h"
#include "tests/support/harness.h"
#include "tests/support/suite.h"

static struct ts_proc peer;

static void stop_procs(void)
{
	ts_proc_stop(&peer);
}

/* What the "hello" stream handler and the end watch saw. */
struct keep {
	tw_comm *comm; /* held from the hello handler on */
	char peer[128];
	size_t hellos;
	int ended; /* end watch runs */
	int ended_err;
	char ended_text[256];
	int in_call; /* set while tw_comm_watch_end runs: fn must not run then */
	int ran_in_call;
};

static void on_ended(tw_comm *comm, int err, void *arg)
{
	struct keep *k = arg;
	char addr[128];
	k->ended++;
	k->ended_err = err;
	k->ran_in_call |= k->in_call;
	snprintf(k->ended_text, sizeof(k->ended_text), "%s", tw_comm_last_error(comm));
	/* valid here even when nobody holds it but the watch */
	ck_assert_int_eq(tw_comm_peer_address(comm, addr, sizeof(addr)), 0);
}

static void on_hello(tw_comm *comm, const tw_decoded *d, const msgpack_object *m, void *arg)
{
	struct keep *k = arg;
	(void)d;
	(void)m;
	k->hellos++;
	tw_comm_hold(comm);
	k->comm = comm;
	ck_assert_int_eq(tw_comm_peer_address(comm, k->peer, sizeof(k->peer)), 0);
	k->in_call = 1;
	ck_assert_int_eq(tw_comm_watch_end(comm, on_ended, k, NULL), 0);
	k->in_call = 0;
}

static tw_server *start_server(struct tu *h, struct keep *k, char *addr, size_t len)
{
	tw_server *s;
	ck_assert_int_eq(tw_server_new(h->ctx, &s), 0);
	ck_assert_int_eq(tw_server_add_stream_op(s, "hello", on_hello, k), 0);
	ck_assert_int_eq(tw_server_listen(s, "tcp://127.0.0.1:0"), 0);
	ck_assert_int_eq(tw_server_address(s, 0, addr, len), 0);
	return s;
}

static void start_peer(const char *mode, const char *addr)
{
	char script[512];
	char *env[] = {"PYTHONNOUSERSITE=1", "DASK_DISTRIBUTED__COMM__COMPRESSION=False", NULL};
	char *argv[] = {TS_PYTHON, script, (char *)mode, (char *)addr, NULL};
	ts_script("handover_peer.py", script, sizeof(script));
	ck_assert_int_eq(ts_spawn(&peer, argv, env), 0);
}

/* Everything a held, ended comm must still answer. */
static void use_ended(struct keep *k)
{
	char addr[128], local[128];
	tw_msg *m = rq_op("identity");
	tw_stats st;
	ck_assert_int_eq(tw_comm_peer_address(k->comm, addr, sizeof(addr)), 0);
	ck_assert_str_eq(addr, k->peer);
	ck_assert_int_eq(tw_comm_local_address(k->comm, local, sizeof(local)), 0);
	ck_assert(strncmp(local, "tcp://127.0.0.1:", 16) == 0);
	ck_assert_int_eq(tw_comm_write(k->comm, m), TW_ECLOSED);
	tw_msg_free(m); /* refused: still ours */
	ck_assert_uint_eq(tw_comm_queued_bytes(k->comm), 0);
	tw_comm_stats(k->comm, &st, sizeof(st));
	ck_assert_uint_ge(st.msgs_received, 2);
	tw_comm_pause(k->comm); /* no-ops on an ended comm */
	tw_comm_resume(k->comm);
	tw_comm_close(k->comm);
	tw_comm_abort(k->comm);
	ck_assert_str_eq(tw_comm_last_error(k->comm), k->ended_text);
}

static int got_hello(void *arg)
{
	return ((struct keep *)arg)->hellos > 0;
}

static int ended_twice(void *arg)
{
	return ((struct keep *)arg)->ended >= 2;
}

START_TEST(held_comm_after_peer_killed)
{
	struct tu h;
	struct keep k = {0};
	char addr[128];
	tw_server *s;
	tu_init(&h);
	s = start_server(&h, &k, addr, sizeof(addr));
	start_peer("stream", addr);
	ck_assert_msg(tu_run_until(&h, got_hello, &k, DU_WAIT_MS), "no hello from the peer");
	ck_assert_int_eq(kill(-peer.pid, SIGKILL), 0);
	ck_assert(tu_wait_flag(&h, &k.ended, DU_WAIT_MS));
	ck_assert_int_eq(k.ran_in_call, 0);
	/* the kernel closed the killed peer's socket between messages */
	ck_assert_int_eq(k.ended_err, 0);
	use_ended(&k);
	/* a watch set on an ended comm runs on a later loop pass, not inside */
	k.in_call = 1;
	ck_assert_int_eq(tw_comm_watch_end(k.comm, on_ended, &k, NULL), 0);
	k.in_call = 0;
	ck_assert_int_eq(k.ended, 1);
	/* wait on progress: a fixed 20 ms of loop could pass with no loop
	 * pass at all on a loaded machine under valgrind */
	ck_assert(tu_run_until(&h, ended_twice, &k, DU_WAIT_MS));
	ck_assert_int_eq(k.ended, 2);
	ck_assert_int_eq(k.ran_in_call, 0);
	use_ended(&k);
	tw_comm_release(k.comm);
	tw_server_free(s);
	ts_proc_stop(&peer);
	tu_fini(&h);
}
END_TEST

/* A Dask stream message packed for the wire (handshake first). */
static uint8_t *wire(tw_msg *m, size_t *len)
{
	uint8_t *p = du_encode(m, len);
	tw_msg_free(m);
	return p;
}

static tw_msg *handshake_msg(void)
{
	tw_builder *b;
	tw_msg *m;
	ck_assert_int_eq(tw_builder_new(NULL, &b), 0);
	ts_pack_handshake_info(tw_builder_packer(b), 0);
	ck_assert_int_eq(tw_builder_finish(b, &m), 0);
	tw_builder_free(b);
	return m;
}

static void raw_send_msg(struct tu *h, int fd, tw_msg *m, size_t cut)
{
	size_t len;
	uint8_t *p = wire(m, &len);
	if (cut > 0)
		len = cut < len ? cut : len - 1;
	ck_assert_uint_eq(tu_raw_send(h, fd, p, len), len);
	free(p);
}

/* The peer dies in the middle of a message: the watch says TW_ETRUNCATED
 * and the comm's text says so; two watches, one cancelled. */
START_TEST(held_comm_end_reason_truncated)
{
	struct tu h;
	struct keep k = {0}, other = {0};
	tw_comm_watch *w;
	char addr[128];
	tw_server *s;
	tw_builder *b;
	int fd;
	tu_init(&h);
	s = start_server(&h, &k, addr, sizeof(addr));
	fd = ts_raw_connect(addr);
	ck_assert_int_ge(fd, 0);
	raw_send_msg(&h, fd, handshake_msg(), 0);
	b = rq_begin("connection_stream", 1);
	rq_bool(b, "reply", 0);
	raw_send_msg(&h, fd, rq_end(b), 0);
	raw_send_msg(&h, fd, rq_op("hello"), 0);
	ck_assert(tu_run_until(&h, got_hello, &k, TU_WAIT_MS));
	ck_assert_int_eq(tw_comm_watch_end(k.comm, on_ended, &other, &w), 0);
	tw_comm_unwatch(w);                       /* cancelled: never runs */
	raw_send_msg(&h, fd, rq_op("hello"), 12); /* part of a second one */
	shutdown(fd, SHUT_WR);
	ck_assert(tu_wait_flag(&h, &k.ended, TU_WAIT_MS));
	close(fd);
	ck_assert_int_eq(k.ended_err, TW_ETRUNCATED);
	ck_assert_msg(strstr(k.ended_text, "12") != NULL, "text: %s", k.ended_text);
	use_ended(&k);
	tu_run_for(&h, 20);
	ck_assert_int_eq(k.ended, 1);
	ck_assert_int_eq(other.ended, 0);
	tw_comm_release(k.comm);
	tw_server_free(s);
	tu_fini(&h);
}
END_TEST

/* A scheduler's registry of one worker and one client (Dask's
 * Scheduler.add_worker / handle_worker and add_client). */
struct sched {
	tw_comm *worker, *client; /* held by tw_request_keep_stream */
	char worker_peer[128];
	int reg_reply_flag; /* tw_request_wants_reply of register-worker */
	int double_keep;    /* second tw_request_keep_stream's result */
	tw_batched *to_worker;
	size_t keep_alives, status_changes, heartbeats;
	int comm_matches; /* stream handlers got the kept comm */
	char status[32];
	struct tu_ended worker_end, client_end;
	int push_at_register; /* a batch right behind the register reply */
};

static void pack_kv_str(msgpack_packer *pk, const char *k, const char *v)
{
	tw_msgpack_pack_str(pk, k);
	tw_msgpack_pack_str(pk, v);
}

static void push_batch(struct sched *sc);

/* register-worker: the reply map on the same comm, then its stream. */
static void op_register_worker(tw_request *r, void *arg)
{
	struct sched *sc = arg;
	msgpack_packer *pk;
	tw_comm *again;
	sc->reg_reply_flag = tw_request_wants_reply(r);
	ck_assert_int_eq(tw_request_peer_address(r, sc->worker_peer, sizeof(sc->worker_peer)), 0);
	ck_assert_int_eq(tw_request_peer_address(r, sc->worker_peer, 4), TW_ERANGE);
	ck_assert_int_eq(tw_request_keep_stream(r, &sc->worker), 0);
	ck_assert_ptr_eq(sc->worker, tw_request_comm(r));
	sc->double_keep = tw_request_keep_stream(r, &again);
	ck_assert_int_eq(tw_comm_watch_end(sc->worker, tu_ended_cb, &sc->worker_end, NULL), 0);
	ck_assert_int_eq(tw_batched_new(sc->worker, 0, &sc->to_worker), 0);
	pk = tw_builder_packer(tw_request_reply_builder(r));
	msgpack_pack_map(pk, 4);
	pack_kv_str(pk, "status", "OK");
	tw_msgpack_pack_str(pk, "time");
	msgpack_pack_double(pk, 1.5);
	tw_msgpack_pack_str(pk, "heartbeat-interval");
	msgpack_pack_double(pk, 0.5);
	tw_msgpack_pack_str(pk, "worker-plugins");
	msgpack_pack_map(pk, 0);
	ck_assert_int_eq(tw_request_reply(r), 0);
	if (sc->push_at_register)
		push_batch(sc);
}

static void op_register_client(tw_request *r, void *arg)
{
	struct sched *sc = arg;
	msgpack_packer *pk;
	ck_assert_int_eq(tw_request_wants_reply(r), 0);
	ck_assert_int_eq(tw_request_keep_stream(r, &sc->client), 0);
	ck_assert_int_eq(tw_comm_watch_end(sc->client, tu_ended_cb, &sc->client_end, NULL), 0);
	pk = tw_builder_packer(tw_request_reply_builder(r));
	msgpack_pack_array(pk, 1);
	msgpack_pack_map(pk, 1);
	pack_kv_str(pk, "op", "stream-start");
	ck_assert_int_eq(tw_request_reply(r), 0);
}

static void batch_send(tw_batched *b, void (*pack)(msgpack_packer *pk))
{
	msgpack_sbuffer sb;
	msgpack_packer pk;
	msgpack_sbuffer_init(&sb);
	msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
	pack(&pk);
	ck_assert_int_eq(tw_batched_send(b, sb.data, sb.size), 0);
	msgpack_sbuffer_destroy(&sb);
}

static void pack_compute(msgpack_packer *pk)
{
	msgpack_pack_map(pk, 3);
	pack_kv_str(pk, "op", "compute-task");
	pack_kv_str(pk, "key", "x");
	tw_msgpack_pack_str(pk, "n");
	msgpack_pack_int(pk, 2);
}

static void pack_free_keys(msgpack_packer *pk)
{
	msgpack_pack_map(pk, 2);
	pack_kv_str(pk, "op", "free-keys");
	tw_msgpack_pack_str(pk, "keys");
	msgpack_pack_array(pk, 1);
	tw_msgpack_pack_str(pk, "y");
}

static void pack_close_stream(msgpack_packer *pk)
{
	msgpack_pack_map(pk, 1);
	pack_kv_str(pk, "op", "close-stream");
}

/* compute-task, free-keys, close-stream, then a compute-task the worker
 * must drop; one message, written right behind the register reply. */
static void push_batch(struct sched *sc)
{
	batch_send(sc->to_worker, pack_compute);
	batch_send(sc->to_worker, pack_free_keys);
	batch_send(sc->to_worker, pack_close_stream);
	batch_send(sc->to_worker, pack_compute);
	ck_assert_int_eq(tw_batched_flush(sc->to_worker), 0);
}

static void sop_keep_alive(tw_comm *comm, const tw_decoded *d, const msgpack_object *m, void *arg)
{
	struct sched *sc = arg;
	(void)d;
	(void)m;
	sc->keep_alives++;
	sc->comm_matches += comm == sc->worker;
}

static void sop_status(tw_comm *comm, const tw_decoded *d, const msgpack_object *m, void *arg)
{
	struct sched *sc = arg;
	const msgpack_object *st = tw_msgpack_map_get(m, "status");
	(void)d;
	sc->status_changes++;
	sc->comm_matches += comm == sc->worker;
	ck_assert(st != NULL && st->type == MSGPACK_OBJECT_STR && st->via.str.size < 32);
	memcpy(sc->status, st->via.str.ptr, st->via.str.size);
	/* the scheduler answers on the worker's stream, batched */
	batch_send(sc->to_worker, pack_compute);
	batch_send(sc->to_worker, pack_free_keys);
}

static void sop_heartbeat_client(tw_comm *comm, const tw_decoded *d, const msgpack_object *m,
				 void *arg)
{
	struct sched *sc = arg;
	tw_builder *b;
	tw_msg *out;
	(void)d;
	(void)m;
	sc->heartbeats++;
	ck_assert_ptr_eq(comm, sc->client);
	ck_assert_int_eq(tw_builder_new(NULL, &b), 0);
	msgpack_pack_array(tw_builder_packer(b), 1);
	msgpack_pack_map(tw_builder_packer(b), 2);
	pack_kv_str(tw_builder_packer(b), "op", "client-heartbeat-seen");
	pack_kv_str(tw_builder_packer(b), "client", "Client-1");
	ck_assert_int_eq(tw_builder_finish(b, &out), 0);
	tw_builder_free(b);
	ck_assert_int_eq(tw_comm_write(comm, out), 0);
}

static int proc_exited(void *arg)
{
	struct ts_proc *p = arg;
	if (!p->exited && waitpid(p->pid, &p->status, WNOHANG) == p->pid)
		p->exited = 1;
	return p->exited;
}

static void expect_ok(struct tu *h, const char *ok)
{
	char tail[2048];
	ck_assert_msg(tu_run_until(h, proc_exited, &peer, DU_WAIT_MS), "peer did not finish: %s",
		      ts_proc_log_tail(&peer, tail, sizeof(tail)));
	ck_assert_msg(WIFEXITED(peer.status) && WEXITSTATUS(peer.status) == 0, "status %d: %s",
		      peer.status, ts_proc_log_tail(&peer, tail, sizeof(tail)));
	ck_assert_msg(strstr(ts_proc_log_tail(&peer, tail, sizeof(tail)), ok) != NULL, "log: %s",
		      tail);
}

static tw_server *start_sched(struct tu *h, struct sched *sc, char *addr, size_t len)
{
	tw_server *s;
	ck_assert_int_eq(tw_server_new(h->ctx, &s), 0);
	ck_assert_int_eq(tw_server_add_op(s, "register-worker", op_register_worker, sc), 0);
	ck_assert_int_eq(tw_server_add_op(s, "register-client", op_register_client, sc), 0);
	ck_assert_int_eq(tw_server_add_stream_op(s, "keep-alive", sop_keep_alive, sc), 0);
	ck_assert_int_eq(tw_server_add_stream_op(s, "worker-status-change", sop_status, sc), 0);
	ck_assert_int_eq(tw_server_add_stream_op(s, "heartbeat-client", sop_heartbeat_client, sc),
			 0);
	ck_assert_int_eq(tw_server_listen(s, "tcp://127.0.0.1:0"), 0);
	ck_assert_int_eq(tw_server_address(s, 0, addr, len), 0);
	return s;
}

/* A real Python peer registers as Dask's worker does: reply:false, one
 * reply map on the same comm, then that comm is its stream both ways,
 * until it sends close-stream. */
START_TEST(register_worker_keeps_stream)
{
	struct tu h;
	struct sched sc = {0};
	char addr[128], peer_addr[128];
	tw_server *s;
	tu_init(&h);
	s = start_sched(&h, &sc, addr, sizeof(addr));
	start_peer("register-worker", addr);
	expect_ok(&h, "ALL OK register-worker");
	ck_assert(tu_wait_flag(&h, &sc.worker_end.n, DU_WAIT_MS));
	ck_assert_int_eq(sc.reg_reply_flag, 0);
	ck_assert_int_eq(sc.double_keep, TW_EINVAL);
	ck_assert_uint_eq(sc.keep_alives, 1);
	ck_assert_uint_eq(sc.status_changes, 1);
	ck_assert_int_eq(sc.comm_matches, 2);
	ck_assert_str_eq(sc.status, "paused");
	ck_assert_int_eq(sc.worker_end.err, 0); /* close-stream: an orderly end */
	ck_assert_int_eq(tw_comm_peer_address(sc.worker, peer_addr, sizeof(peer_addr)), 0);
	ck_assert_str_eq(peer_addr, sc.worker_peer);
	ck_assert_int_eq(tw_batched_send(sc.to_worker, "\x80", 1), TW_ECLOSED);
	tw_batched_free(sc.to_worker);
	tw_comm_release(sc.worker);
	tw_server_free(s);
	ts_proc_stop(&peer);
	tu_fini(&h);
}
END_TEST

/* register-client gets [{"op": "stream-start"}] though it said
 * reply:false, and its comm is the client's stream. */
START_TEST(register_client_keeps_stream)
{
	struct tu h;
	struct sched sc = {0};
	char addr[128];
	tw_server *s;
	tu_init(&h);
	s = start_sched(&h, &sc, addr, sizeof(addr));
	start_peer("register-client", addr);
	expect_ok(&h, "ALL OK register-client");
	ck_assert(tu_wait_flag(&h, &sc.client_end.n, DU_WAIT_MS));
	ck_assert_uint_eq(sc.heartbeats, 1);
	ck_assert_int_eq(sc.client_end.err, 0);
	tw_comm_release(sc.client);
	tw_server_free(s);
	ts_proc_stop(&peer);
	tu_fini(&h);
}
END_TEST

/* A worker written in C: register-worker, the reply read in the decoded
 * callback, then the same comm dispatched by op (Dask's
 * Worker._register_with_scheduler, then handle_scheduler). */
struct worker {
	tw_comm *comm;
	tw_stream_ops *ops;
	int done, err;
	int replied, dispatch_rv, again_rv;
	int old_close_ran;
	size_t computes, frees;
	int64_t n;
	struct tu_ended end;
};

static void wk_compute(tw_comm *comm, const tw_decoded *d, const msgpack_object *m, void *arg)
{
	struct worker *w = arg;
	const msgpack_object *n = tw_msgpack_map_get(m, "n");
	(void)d;
	ck_assert_ptr_eq(comm, w->comm);
	ck_assert(tw_msgpack_str_eq(tw_msgpack_map_get(m, "key"), "x"));
	ck_assert(n != NULL && n->type == MSGPACK_OBJECT_POSITIVE_INTEGER);
	w->n = (int64_t)n->via.u64;
	w->computes++;
}

static void wk_free_keys(tw_comm *comm, const tw_decoded *d, const msgpack_object *m, void *arg)
{
	struct worker *w = arg;
	const msgpack_object *keys = tw_msgpack_map_get(m, "keys");
	(void)comm;
	(void)d;
	ck_assert(keys != NULL && keys->type == MSGPACK_OBJECT_ARRAY && keys->via.array.size == 1);
	ck_assert(tw_msgpack_str_eq(&keys->via.array.ptr[0], "y"));
	w->frees++;
}

static void wk_old_close(tw_comm *comm, int err, void *arg)
{
	(void)comm;
	(void)err;
	((struct worker *)arg)->old_close_ran = 1;
}

static void wk_reply(tw_comm *comm, tw_decoded *d, int err, const char *detail, void *arg)
{
	struct worker *w = arg;
	ck_assert_msg(err == 0, "decode: %s", detail);
	ck_assert(tw_msgpack_str_eq(tw_msgpack_map_get(tw_decoded_root(d), "status"), "OK"));
	tw_decoded_free(d);
	w->replied++;
	w->dispatch_rv = tw_comm_dispatch_stream(comm, w->ops, tu_ended_cb, &w->end);
	w->again_rv = tw_comm_dispatch_stream(comm, w->ops, tu_ended_cb, &w->end);
}

static void wk_handshake(tw_comm *comm, int err, const tw_handshake_info *info, void *arg)
{
	struct worker *w = arg;
	tw_builder *b;
	(void)info;
	w->comm = comm;
	if (err == 0)
		err = tw_comm_set_decoded_callbacks(comm, wk_reply, wk_old_close, NULL, w);
	if (err == 0) {
		b = rq_begin("register-worker", 3);
		rq_bool(b, "reply", 0);
		rq_str(b, "address", "tcp://127.0.0.1:1234");
		rq_int(b, "nthreads", 1);
		err = tw_comm_write(comm, rq_end(b));
	}
	w->err = err;
	w->done = 1;
}

START_TEST(worker_side_dispatches_by_op)
{
	struct tu h;
	struct sched sc = {.push_at_register = 1};
	struct worker w = {0};
	char addr[128];
	tw_server *s;
	tu_init(&h);
	s = start_sched(&h, &sc, addr, sizeof(addr));
	ck_assert_int_eq(tw_stream_ops_new(&w.ops), 0);
	ck_assert_int_eq(tw_stream_ops_add(w.ops, "compute-task", wk_compute, &w), 0);
	ck_assert_int_eq(tw_stream_ops_add(w.ops, "free-keys", wk_free_keys, &w), 0);
	ck_assert_int_eq(tw_stream_ops_add(w.ops, "free-keys", NULL, &w), TW_EINVAL);
	ck_assert_int_eq(tu_connect_handshake(h.ctx, addr, wk_handshake, &w), 0);
	ck_assert(tu_wait_flag(&h, &w.done, TU_WAIT_MS));
	ck_assert_int_eq(w.err, 0);
	ck_assert(tu_wait_flag(&h, &w.end.n, TU_WAIT_MS));
	ck_assert_int_eq(w.replied, 1);
	ck_assert_int_eq(w.dispatch_rv, 0);
	ck_assert_int_eq(w.again_rv, TW_EINVAL);
	ck_assert_uint_eq(w.computes, 1); /* the one after close-stream is dropped */
	ck_assert_int_eq(w.n, 2);
	ck_assert_uint_eq(w.frees, 1);
	ck_assert_int_eq(w.end.err, 0);
	ck_assert_int_eq(w.old_close_ran, 0);
	/* the scheduler sees the worker's stream end too */
	ck_assert(tu_wait_flag(&h, &sc.worker_end.n, TU_WAIT_MS));
	tu_run_for(&h, 20);
	ck_assert_int_eq(w.end.n, 1);
	ck_assert_int_eq(tw_comm_dispatch_stream(w.comm, w.ops, tu_ended_cb, &w.end), TW_ECLOSED);
	tw_comm_free(w.comm);
	tw_stream_ops_free(w.ops);
	tw_batched_free(sc.to_worker);
	tw_comm_release(sc.worker);
	tw_server_free(s);
	tu_fini(&h);
}
END_TEST

/* Batched maps with out-of-band payloads (Dask's BatchedSend), read by a
 * real Python peer: sizes as in handover_peer.py, byte j of payload i is
 * (j + i) % 251. */
static const size_t batch_sizes[] = {1, 1000, 65536, 1 << 20, 7, 100};
#define NSIZES (sizeof(batch_sizes) / sizeof(batch_sizes[0]))

struct bsend {
	tw_comm *comm;
	tw_batched *b;
	uint64_t copied_before, copied_after;
	int64_t got;
	int bad_rv; /* commit of a non-map */
};

static void pack_plain(tw_batched *b, int64_t i)
{
	msgpack_sbuffer sb;
	msgpack_packer pk;
	msgpack_sbuffer_init(&sb);
	msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
	msgpack_pack_map(&pk, 2);
	pack_kv_str(&pk, "op", "plain");
	tw_msgpack_pack_str(&pk, "i");
	msgpack_pack_int64(&pk, i);
	ck_assert_int_eq(tw_batched_send(b, sb.data, sb.size), 0);
	msgpack_sbuffer_destroy(&sb);
}

static void pack_data(tw_batched *b, int64_t i, size_t size)
{
	tw_builder *bld = tw_batched_begin(b);
	tw_block *blk;
	uint8_t *p;
	ck_assert_ptr_nonnull(bld);
	ck_assert_ptr_null(tw_batched_begin(b)); /* one at a time */
	ck_assert_int_eq(tw_block_new(size, &blk), 0);
	p = tw_block_data(blk);
	ts_fill(p, size, (unsigned)i);
	msgpack_pack_map(tw_builder_packer(bld), 3);
	pack_kv_str(tw_builder_packer(bld), "op", "data");
	tw_msgpack_pack_str(tw_builder_packer(bld), "i");
	msgpack_pack_int64(tw_builder_packer(bld), i);
	tw_msgpack_pack_str(tw_builder_packer(bld), "value");
	ck_assert_int_eq(tw_builder_pack_bytes(bld, &(tw_slice){blk, 0, size}), 0);
	tw_block_free(blk); /* the batch holds its own reference */
	ck_assert_int_eq(tw_batched_commit(b), 0);
}

static void op_take_batch(tw_request *r, void *arg)
{
	struct bsend *bs = arg;
	tw_stats st;
	tw_builder *bld;
	ck_assert_int_eq(tw_request_keep_stream(r, &bs->comm), 0);
	ck_assert_int_eq(tw_request_reply(r), 0); /* reply:false, nothing packed: nothing */
	ck_assert_int_eq(tw_batched_new(bs->comm, 60000, &bs->b), 0);
	tw_stats_global(&st, sizeof(st));
	bs->copied_before = st.payload_bytes_copied;
	for (size_t i = 0; i < NSIZES; i++) {
		pack_data(bs->b, (int64_t)i, batch_sizes[i]);
		/* an abandoned map and a bad one leave no trace */
		bld = tw_batched_begin(bs->b);
		msgpack_pack_map(tw_builder_packer(bld), 1);
		pack_kv_str(tw_builder_packer(bld), "op", "never");
		tw_batched_abandon(bs->b);
		bld = tw_batched_begin(bs->b);
		msgpack_pack_array(tw_builder_packer(bld), 0);
		bs->bad_rv = tw_batched_commit(bs->b);
		pack_plain(bs->b, (int64_t)i);
	}
	ck_assert_int_eq(tw_batched_flush(bs->b), 0);
	tw_stats_global(&st, sizeof(st));
	bs->copied_after = st.payload_bytes_copied;
}

static void sop_got(tw_comm *comm, const tw_decoded *d, const msgpack_object *m, void *arg)
{
	struct bsend *bs = arg;
	const msgpack_object *n = tw_msgpack_map_get(m, "n");
	(void)comm;
	(void)d;
	ck_assert(n != NULL && n->type == MSGPACK_OBJECT_POSITIVE_INTEGER);
	bs->got = (int64_t)n->via.u64;
}

static int got_answer(void *arg)
{
	return ((struct bsend *)arg)->got >= 0;
}

START_TEST(batched_payloads_to_python)
{
	struct tu h;
	struct bsend bs = {.got = -1};
	char addr[128];
	tw_server *s;
	tu_init(&h);
	ck_assert_int_eq(tw_server_new(h.ctx, &s), 0);
	ck_assert_int_eq(tw_server_add_op(s, "take-batch", op_take_batch, &bs), 0);
	ck_assert_int_eq(tw_server_add_stream_op(s, "got", sop_got, &bs), 0);
	ck_assert_int_eq(tw_server_listen(s, "tcp://127.0.0.1:0"), 0);
	ck_assert_int_eq(tw_server_address(s, 0, addr, sizeof(addr)), 0);
	start_peer("read-batch", addr);
	expect_ok(&h, "ALL OK read-batch");
	ck_assert(tu_run_until(&h, got_answer, &bs, TU_WAIT_MS));
	ck_assert_int_eq(bs.got, (int64_t)(2 * NSIZES));
	ck_assert_int_eq(bs.bad_rv, TW_EINVAL);
	ck_assert_uint_eq(bs.copied_after, bs.copied_before); /* zero-copy */
	tw_batched_free(bs.b);
	tw_comm_release(bs.comm);
	tw_server_free(s);
	ts_proc_stop(&peer);
	tu_fini(&h);
}
END_TEST

/* ---- attack16: misuse and faults on the issue-16 API ---- */
struct atk {
	tw_server *s;
	tw_stream_ops *ops;
	tw_comm *comm;
	tw_request *held; /* a deferred register reply */
	int dispatch_rv, keep_rv, reply_rv;
	int ended, ended_err;
	int free_comm_in_ended;
	size_t maps, registered;
	int free_server_at; /* a stream handler frees the server at this map */
	tw_comm_watch *w_other;
	int w1_ran, w2_ran;
};

static void atk_ended(tw_comm *comm, int err, void *arg)
{
	struct atk *a = arg;
	a->ended++;
	a->ended_err = err;
	if (a->free_comm_in_ended)
		tw_comm_free(comm); /* stream.h: "You still own the comm" */
}

static void atk_map(tw_comm *comm, const tw_decoded *d, const msgpack_object *m, void *arg)
{
	struct atk *a = arg;
	(void)comm;
	(void)d;
	(void)m;
	if (++a->maps == (size_t)a->free_server_at) {
		tw_server_free(a->s);
		a->s = NULL;
	}
}

/* keep_stream, then the kept comm handed to tw_comm_dispatch_stream */
static void atk_register_dispatch(tw_request *r, void *arg)
{
	struct atk *a = arg;
	a->registered++;
	ck_assert_int_eq(tw_request_keep_stream(r, &a->comm), 0);
	a->dispatch_rv = tw_comm_dispatch_stream(a->comm, a->ops, atk_ended, a);
	a->reply_rv = tw_request_reply(r);
}

static void atk_register_defer(tw_request *r, void *arg)
{
	struct atk *a = arg;
	a->registered++;
	a->held = r;
}

static tw_server *atk_server(struct tu *h, struct atk *a, tw_op_fn reg, char *addr, size_t len)
{
	ck_assert_int_eq(tw_server_new(h->ctx, &a->s), 0);
	ck_assert_int_eq(tw_server_add_op(a->s, "register-worker", reg, a), 0);
	ck_assert_int_eq(tw_server_add_stream_op(a->s, "hello", atk_map, a), 0);
	ck_assert_int_eq(tw_server_listen(a->s, "tcp://127.0.0.1:0"), 0);
	ck_assert_int_eq(tw_server_address(a->s, 0, addr, len), 0);
	return a->s;
}

static int atk_raw_register(struct tu *h, const char *addr)
{
	tw_builder *b;
	int fd = ts_raw_connect(addr);
	ck_assert_int_ge(fd, 0);
	raw_send_msg(h, fd, handshake_msg(), 0);
	b = rq_begin("register-worker", 1);
	rq_bool(b, "reply", 0);
	raw_send_msg(h, fd, rq_end(b), 0);
	return fd;
}

static int atk_registered(void *arg)
{
	return ((struct atk *)arg)->registered > 0;
}

/* A scheduler author hands the kept comm to tw_comm_dispatch_stream and
 * would free it in `ended`, as stream.h allows for comms one owns. The
 * server owns it: refused (TW_EINVAL), and its maps keep going to the
 * server's stream ops. Before, the dispatch was taken, the server never
 * heard of the end, and tw_server_free read the freed comm (ASan:
 * heap-use-after-free in tw_comm_free <- conn_free <- server_destroy). */
static int atk_one_map(void *arg)
{
	return ((struct atk *)arg)->maps > 0;
}

START_TEST(atk_dispatch_kept_comm)
{
	struct tu h;
	struct atk a = {.free_comm_in_ended = 1};
	char addr[128];
	int fd;
	tu_init(&h);
	ck_assert_int_eq(tw_stream_ops_new(&a.ops), 0);
	ck_assert_int_eq(tw_stream_ops_add(a.ops, "other", atk_map, &a), 0);
	atk_server(&h, &a, atk_register_dispatch, addr, sizeof(addr));
	fd = atk_raw_register(&h, addr);
	ck_assert(tu_run_until(&h, atk_registered, &a, TU_WAIT_MS));
	ck_assert_int_eq(a.dispatch_rv, TW_EINVAL);
	ck_assert_int_eq(a.reply_rv, 0);
	raw_send_msg(&h, fd, rq_op("hello"), 0); /* the server's stream op */
	ck_assert(tu_run_until(&h, atk_one_map, &a, TU_WAIT_MS));
	close(fd);
	ck_assert_int_eq(tw_comm_watch_end(a.comm, atk_ended, &a, NULL), 0);
	ck_assert(tu_wait_flag(&h, &a.ended, TU_WAIT_MS));
	ck_assert_int_eq(a.ended, 1);
	tw_comm_release(a.comm);
	tw_server_free(a.s);
	tw_stream_ops_free(a.ops);
	tu_fini(&h);
}
END_TEST

/* A stream handler frees the server in the middle of an array of maps,
 * while the scheduler holds the comm with an end watch. */
static void atk_watch_release(tw_comm *comm, int err, void *arg)
{
	struct atk *a = arg;
	a->ended++;
	a->ended_err = err;
	tw_comm_release(comm); /* the hold from keep_stream, inside fn */
	if (a->w_other != NULL) {
		tw_comm_unwatch(a->w_other); /* another pending watch, same comm */
		a->w_other = NULL;
	}
}

static void atk_w2(tw_comm *comm, int err, void *arg)
{
	(void)comm;
	(void)err;
	((struct atk *)arg)->w2_ran++;
}

static void atk_register_keep(tw_request *r, void *arg)
{
	struct atk *a = arg;
	a->registered++;
	ck_assert_int_eq(tw_request_keep_stream(r, &a->comm), 0);
	ck_assert_int_eq(tw_comm_watch_end(a->comm, atk_watch_release, a, NULL), 0);
	ck_assert_int_eq(tw_comm_watch_end(a->comm, atk_w2, a, &a->w_other), 0);
	a->reply_rv = tw_request_reply(r);
}

START_TEST(atk_stream_handler_frees_server)
{
	struct tu h;
	struct atk a = {.free_server_at = 2};
	char addr[128];
	msgpack_sbuffer sb;
	msgpack_packer pk;
	int fd;
	tu_init(&h);
	atk_server(&h, &a, atk_register_keep, addr, sizeof(addr));
	fd = atk_raw_register(&h, addr);
	msgpack_sbuffer_init(&sb);
	msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
	msgpack_pack_array(&pk, 4);
	for (int i = 0; i < 4; i++) {
		msgpack_pack_map(&pk, 1);
		pack_kv_str(&pk, "op", "hello");
	}
	raw_send_msg(&h, fd, rq_raw(sb.data, sb.size), 0);
	msgpack_sbuffer_destroy(&sb);
	ck_assert(tu_wait_flag(&h, &a.ended, TU_WAIT_MS));
	ck_assert_uint_eq(a.maps, 2);
	ck_assert_int_eq(a.ended_err, TW_ECANCELED);
	ck_assert_int_eq(a.w2_ran, 0);
	tu_run_for(&h, 20);
	ck_assert_int_eq(a.ended, 1);
	ck_assert_int_eq(a.w2_ran, 0);
	close(fd);
	tu_fini(&h);
}
END_TEST

/* keep_stream with the reply deferred; the peer resets first. */
START_TEST(atk_keep_then_reset)
{
	struct tu h;
	struct atk a = {0};
	struct linger lg = {1, 0};
	char addr[128];
	tw_msg *m = rq_op("identity");
	int fd;
	tu_init(&h);
	atk_server(&h, &a, atk_register_defer, addr, sizeof(addr));
	fd = atk_raw_register(&h, addr);
	ck_assert(tu_run_until(&h, atk_registered, &a, TU_WAIT_MS));
	ck_assert_int_eq(tw_request_keep_stream(a.held, &a.comm), 0);
	ck_assert_int_eq(tw_comm_watch_end(a.comm, atk_ended, &a, NULL), 0);
	ck_assert_int_eq(setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg)), 0);
	close(fd);
	tu_run_for(&h, 20); /* paused while the handler has it: no read */
	msgpack_pack_map(tw_builder_packer(tw_request_reply_builder(a.held)), 0);
	a.reply_rv = tw_request_reply(a.held);
	ck_assert(a.reply_rv == 0 || a.reply_rv == TW_ECLOSED);
	ck_assert(tu_wait_flag(&h, &a.ended, TU_WAIT_MS));
	ck_assert_int_ne(a.ended_err, 0);
	ck_assert_int_eq(tw_comm_write(a.comm, m), TW_ECLOSED);
	tw_msg_free(m);
	tw_comm_release(a.comm);
	tw_server_free(a.s);
	tu_fini(&h);
}
END_TEST

/* keep_stream on a request whose comm then gets garbage behind it. */
START_TEST(atk_keep_after_bad_input)
{
	struct tu h;
	struct atk a = {0};
	char addr[128];
	int fd;
	tu_init(&h);
	atk_server(&h, &a, atk_register_defer, addr, sizeof(addr));
	fd = atk_raw_register(&h, addr);
	raw_send_msg(&h, fd, rq_raw("\xc1", 1), 0); /* never-used msgpack byte */
	ck_assert(tu_run_until(&h, atk_registered, &a, TU_WAIT_MS));
	tu_run_for(&h, 50);
	a.keep_rv = tw_request_keep_stream(a.held, &a.comm);
	if (a.keep_rv == 0)
		ck_assert_int_eq(tw_comm_watch_end(a.comm, atk_ended, &a, NULL), 0);
	msgpack_pack_map(tw_builder_packer(tw_request_reply_builder(a.held)), 0);
	a.reply_rv = tw_request_reply(a.held);
	ck_assert(tu_raw_wait_closed(&h, fd, TU_WAIT_MS));
	if (a.keep_rv == 0) {
		ck_assert(tu_wait_flag(&h, &a.ended, TU_WAIT_MS));
		ck_assert_int_eq(a.ended_err, TW_EPROTO);
		tw_comm_release(a.comm);
	}
	close(fd);
	tw_server_free(a.s);
	tu_fini(&h);
}
END_TEST

/* watch_end on an ended, held comm, then the context freed before the
 * loop runs again. */
START_TEST(atk_watch_then_context_free)
{
	struct tu h;
	struct atk a = {0};
	char addr[128];
	int fd;
	tu_init(&h);
	atk_server(&h, &a, atk_register_keep, addr, sizeof(addr));
	fd = atk_raw_register(&h, addr);
	ck_assert(tu_run_until(&h, atk_registered, &a, TU_WAIT_MS));
	tw_comm_hold(a.comm); /* atk_watch_release drops one */
	close(fd);
	ck_assert(tu_wait_flag(&h, &a.ended, TU_WAIT_MS));
	ck_assert_int_eq(tw_comm_watch_end(a.comm, atk_ended, &a, NULL), 0);
	ck_assert_int_eq(tw_comm_watch_end(a.comm, atk_ended, &a, NULL), 0);
	tw_server_free(a.s);
	tu_fini(&h); /* frees the context: the watches never run */
	ck_assert_int_eq(a.ended, 1);
}
END_TEST

/* Many kept comms, each held with an end watch, all ended at once. */
struct many {
	size_t registered, ended, bad;
	tw_comm *comms[4096];
};

static void many_ended(tw_comm *comm, int err, void *arg)
{
	struct many *m = arg;
	char a[128];
	m->bad += err != TW_ECANCELED || tw_comm_peer_address(comm, a, sizeof(a)) != 0;
	m->ended++;
	tw_comm_release(comm);
}

static void many_register(tw_request *r, void *arg)
{
	struct many *m = arg;
	tw_comm *c;
	ck_assert_int_eq(tw_request_keep_stream(r, &c), 0);
	ck_assert_int_eq(tw_comm_watch_end(c, many_ended, m, NULL), 0);
	m->comms[m->registered++] = c;
	ck_assert_int_eq(tw_request_reply(r), 0);
}

START_TEST(atk_many_watches)
{
	struct tu h;
	struct many m = {0};
	size_t n = ts_quick() ? 200 : 2000;
	char addr[128];
	tw_server *s;
	int *fds = calloc(n, sizeof(int));
	tu_init(&h);
	ck_assert_int_eq(tw_server_new(h.ctx, &s), 0);
	ck_assert_int_eq(tw_server_add_op(s, "register-worker", many_register, &m), 0);
	ck_assert_int_eq(tw_server_listen(s, "tcp://127.0.0.1:0"), 0);
	ck_assert_int_eq(tw_server_address(s, 0, addr, sizeof(addr)), 0);
	for (size_t i = 0; i < n; i++)
		fds[i] = atk_raw_register(&h, addr);
	ck_assert(tu_wait_count(&h, &m.registered, n, TU_WAIT_MS));
	tw_server_free(s);
	ck_assert(tu_wait_count(&h, &m.ended, n, TU_WAIT_MS));
	ck_assert_uint_eq(m.bad, 0);
	for (size_t i = 0; i < n; i++)
		close(fds[i]);
	free(fds);
	tu_fini(&h);
}
END_TEST

/* Client side (tw_comm_dispatch_stream) against a raw peer. */
struct cl {
	tw_comm *comm;
	tw_stream_ops *ops;
	int done, err, dispatch_rv, again_rv, setcb_rv;
	size_t maps;
	size_t free_at; /* a handler frees the comm and the table at this map */
	int free_in_ended;
	int ended, ended_err;
};

static void cl_ended(tw_comm *comm, int err, void *arg)
{
	struct cl *c = arg;
	c->ended++;
	c->ended_err = err;
	if (c->free_in_ended) {
		tw_comm_free(comm);
		tw_stream_ops_free(c->ops);
		c->ops = NULL;
		c->comm = NULL;
	}
}

static void cl_nop_decoded(tw_comm *comm, tw_decoded *d, int err, const char *detail, void *arg)
{
	(void)comm;
	(void)err;
	(void)detail;
	(void)arg;
	tw_decoded_free(d);
}

static void cl_nop_close(tw_comm *comm, int err, void *arg)
{
	(void)comm;
	(void)err;
	(void)arg;
}

static void cl_hello(tw_comm *comm, const tw_decoded *d, const msgpack_object *m, void *arg)
{
	struct cl *c = arg;
	(void)d;
	(void)m;
	c->maps++;
	if (c->maps == 1) {
		c->again_rv = tw_comm_dispatch_stream(comm, c->ops, cl_ended, c);
		c->setcb_rv =
			tw_comm_set_decoded_callbacks(comm, cl_nop_decoded, cl_nop_close, NULL, c);
	}
	if (c->maps == c->free_at) {
		tw_comm_free(comm);
		tw_stream_ops_free(c->ops);
		c->ops = NULL;
		c->comm = NULL;
	}
}

static void cl_handshake(tw_comm *comm, int err, const tw_handshake_info *info, void *arg)
{
	struct cl *c = arg;
	(void)info;
	c->comm = comm;
	if (err == 0)
		err = c->dispatch_rv = tw_comm_dispatch_stream(comm, c->ops, cl_ended, c);
	c->err = err;
	c->done = 1;
}

struct acc {
	int lfd, fd;
};

static int raw_accepted(void *arg)
{
	struct acc *a = arg;
	if (a->fd < 0)
		a->fd = accept4(a->lfd, NULL, NULL, 0);
	return a->fd >= 0;
}

/* Connect c to a raw peer, handshake both ways; returns the peer's fd. */
static int cl_start(struct tu *h, struct cl *c)
{
	struct acc acc;
	char uri[64];
	int lfd = ts_raw_listen("tcp", 4, SOCK_NONBLOCK, uri, sizeof(uri)), fd;
	ck_assert_int_eq(tw_stream_ops_new(&c->ops), 0);
	ck_assert_int_eq(tw_stream_ops_add(c->ops, "hello", cl_hello, c), 0);
	ck_assert_int_eq(tu_connect_handshake(h->ctx, uri, cl_handshake, c), 0);
	acc.lfd = lfd;
	acc.fd = -1;
	ck_assert(tu_run_until(h, raw_accepted, &acc, TU_WAIT_MS));
	fd = acc.fd;
	close(lfd);
	raw_send_msg(h, fd, handshake_msg(), 0);
	ck_assert(tu_wait_flag(h, &c->done, TU_WAIT_MS));
	ck_assert_int_eq(c->err, 0);
	return fd;
}

/* ops: a list of op names, NULL-terminated, one map each, in one array */
static void raw_send_ops(struct tu *h, int fd, const char *const *ops)
{
	msgpack_sbuffer sb;
	msgpack_packer pk;
	size_t n = 0;
	while (ops[n] != NULL)
		n++;
	msgpack_sbuffer_init(&sb);
	msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
	msgpack_pack_array(&pk, n);
	for (size_t i = 0; i < n; i++) {
		msgpack_pack_map(&pk, 1);
		pack_kv_str(&pk, "op", ops[i]);
	}
	raw_send_msg(h, fd, rq_raw(sb.data, sb.size), 0);
	msgpack_sbuffer_destroy(&sb);
}

static int cl_maps(void *arg)
{
	return ((struct cl *)arg)->maps >= 2;
}

/* A stream handler frees its comm and the op table in mid-array; a
 * handler re-dispatches (refused). */
START_TEST(atk_client_handler_frees_comm)
{
	struct tu h;
	struct cl c = {.free_at = 2};
	static const char *const ops[] = {"hello", "hello", "hello", NULL};
	int fd;
	tu_init(&h);
	fd = cl_start(&h, &c);
	raw_send_ops(&h, fd, ops);
	ck_assert(tu_run_until(&h, cl_maps, &c, TU_WAIT_MS));
	ck_assert(tu_raw_wait_closed(&h, fd, TU_WAIT_MS));
	tu_run_for(&h, 20);
	ck_assert_uint_eq(c.maps, 2);
	ck_assert_int_eq(c.again_rv, TW_EINVAL);
	ck_assert_int_eq(c.setcb_rv, TW_EINVAL);
	ck_assert_int_eq(c.ended, 0);
	close(fd);
	tu_fini(&h);
}
END_TEST

/* close-stream in mid-array, then more maps and another message: all
 * dropped; the end is orderly; ended frees the comm and the table. */
START_TEST(atk_client_close_stream_then_more)
{
	struct tu h;
	struct cl c = {.free_in_ended = 1};
	static const char *const ops1[] = {"hello", "close-stream", "hello", NULL};
	static const char *const ops2[] = {"hello", NULL};
	int fd;
	tu_init(&h);
	fd = cl_start(&h, &c);
	raw_send_ops(&h, fd, ops1);
	raw_send_ops(&h, fd, ops2);
	ck_assert(tu_raw_wait_closed(&h, fd, TU_WAIT_MS));
	close(fd);
	ck_assert(tu_wait_flag(&h, &c.ended, TU_WAIT_MS));
	tu_run_for(&h, 20);
	ck_assert_uint_eq(c.maps, 1);
	ck_assert_int_eq(c.ended, 1);
	ck_assert_int_eq(c.ended_err, 0);
	ck_assert_ptr_eq(c.comm, NULL);
	tu_fini(&h);
}
END_TEST

/* Two comms' watches: the first to run unwatches the other's, and
 * releases its own hold; the cancelled one never runs. */
struct pair {
	tw_comm *c[2];       /* the first comm to register, the second */
	tw_comm_watch *w[2]; /* their watches */
	int ran[2];
};

static void pair_fn(tw_comm *comm, int err, void *arg)
{
	struct pair *p = arg;
	int me = comm == p->c[1], other = !me;
	(void)err;
	p->ran[me]++;
	if (p->w[other] != NULL) {
		tw_comm_unwatch(p->w[other]);
		p->w[other] = NULL;
		tw_comm_release(p->c[other]);
	}
	p->w[me] = NULL;
	tw_comm_release(comm);
}

static void pair_register(tw_request *r, void *arg)
{
	struct pair *p = arg;
	int k = p->c[0] != NULL;
	tw_comm *c;
	ck_assert_int_eq(tw_request_keep_stream(r, &c), 0);
	p->c[k] = c;
	ck_assert_int_eq(tw_comm_watch_end(c, pair_fn, p, &p->w[k]), 0);
	ck_assert_int_eq(tw_request_reply(r), 0);
}

static int pair_one_ran(void *arg)
{
	struct pair *p = arg;
	return p->ran[0] + p->ran[1] > 0;
}

static int pair_has_a(void *arg)
{
	return ((struct pair *)arg)->c[0] != NULL;
}

static int pair_both(void *arg)
{
	struct pair *p = arg;
	return p->c[1] != NULL;
}

START_TEST(atk_unwatch_other_comm)
{
	struct tu h;
	struct pair p = {0};
	char addr[128];
	tw_server *s;
	int fa, fb;
	tu_init(&h);
	ck_assert_int_eq(tw_server_new(h.ctx, &s), 0);
	ck_assert_int_eq(tw_server_add_op(s, "register-worker", pair_register, &p), 0);
	ck_assert_int_eq(tw_server_listen(s, "tcp://127.0.0.1:0"), 0);
	ck_assert_int_eq(tw_server_address(s, 0, addr, sizeof(addr)), 0);
	fa = atk_raw_register(&h, addr);
	ck_assert(tu_run_until(&h, pair_has_a, &p, TU_WAIT_MS));
	fb = atk_raw_register(&h, addr);
	ck_assert(tu_run_until(&h, pair_both, &p, TU_WAIT_MS));
	tw_server_free(s); /* both end at once */
	ck_assert(tu_run_until(&h, pair_one_ran, &p, TU_WAIT_MS));
	tu_run_for(&h, 20);
	ck_assert_int_eq(p.ran[0] + p.ran[1], 1);
	close(fa);
	close(fb);
	tu_fini(&h);
}
END_TEST

/* A watch's fn that cancels its own watch: a no-op, not a double free
 * (attack16: unlinked twice and freed twice under ASan before). */
struct self_unwatch {
	tw_comm_watch *w;
	size_t ran;
};

static void unwatch_self(tw_comm *c, int err, void *arg)
{
	struct self_unwatch *u = arg;
	(void)c;
	(void)err;
	tw_comm_unwatch(u->w);
	u->ran++;
}

START_TEST(unwatch_inside_own_callback)
{
	struct tu h;
	struct tu_peer *sp;
	struct self_unwatch u = {0};
	int fd;
	tu_init(&h);
	ck_assert_int_eq(tu_listen(&h, "tcp://127.0.0.1:0"), 0);
	fd = ts_raw_connect(h.addr);
	ck_assert_int_ge(fd, 0);
	ck_assert_ptr_nonnull(sp = tu_server_peer(&h, 0));
	ck_assert_int_eq(tw_comm_watch_end(sp->comm, unwatch_self, &u, &u.w), 0);
	close(fd);
	ck_assert(tu_wait_count(&h, &u.ran, 1, TU_WAIT_MS));
	ck_assert_uint_eq(u.ran, 1);
	tu_fini(&h);
}
END_TEST

int main(void)
{
	TCase *life = ts_tcase("lifetime", 120, NULL), *ho = ts_tcase("handover", 120, NULL);
	tcase_add_checked_fixture(life, NULL, stop_procs);
	ts_add(life, TS_TESTS(held_comm_after_peer_killed, held_comm_end_reason_truncated));
	tcase_add_checked_fixture(ho, NULL, stop_procs);
	ts_add(ho, TS_TESTS(register_worker_keeps_stream, register_client_keeps_stream,
			    worker_side_dispatches_by_op, batched_payloads_to_python));
	return ts_main(
		"handover", TS_NO_SIGPIPE,
		TS_CASES(life, ho,
			 ts_tcase("attack16", 120,
				  TS_TESTS(atk_dispatch_kept_comm, atk_stream_handler_frees_server,
					   atk_keep_then_reset, atk_keep_after_bad_input,
					   atk_watch_then_context_free, atk_many_watches,
					   atk_client_handler_frees_comm,
					   atk_client_close_stream_then_more,
					   atk_unwatch_other_comm, unwatch_inside_own_callback))));
}
