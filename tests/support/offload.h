/* SPDX-License-Identifier: BSD-3-Clause */
/* Helpers for the offload suite (tests/check_offload*.c): Dask messages
 * whose decode is costly (a zstd payload built once per run), receivers
 * that record each decoded delivery (order, thread, bytes), and jobs that
 * hold or mark the offload pool's queue, so a test knows for certain
 * that a message sits in the pool. Everything but ox_init runs on the
 * test's thread, which drives the loop of a tests/support/harness.h harness. */
#ifndef TW_TESTS_SUPPORT_OFFLOAD_H
#define TW_TESTS_SUPPORT_OFFLOAD_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include <taskwire/taskwire.h>

#include "protocol/offload.h"
#include "tests/support/harness.h"

#define OX_MAX_MSGS    64
#define OX_MAX_COMMS   4
#define OX_SMALL_BYTES 10

/* Build the large payloads (slow: run once, in main, before Check forks).
 * TW_TEST_QUICK=1 makes them small and lowers the threshold to match. */
void ox_init(void);
void ox_fini(void);
/* Decompressed size of a large message's payload. */
size_t ox_large_bytes(void);
/* Offload threshold the suite uses (the default unless quick). */
uint64_t ox_threshold(void);

/* {"seq": seq, "data": payload}: large (zstd, decoded on the pool), small
 * (10 bytes, decoded inline), or large with its zstd blocks corrupted
 * (declared size intact, so it is offloaded and fails there). `op`, when
 * not NULL, adds "op": op (a tw_server request). */
tw_msg *ox_large(uint64_t seq, const char *op);
tw_msg *ox_small(uint64_t seq, const char *op);
tw_msg *ox_corrupt(uint64_t seq);

/* One decoded delivery. */
struct ox_got {
	uint64_t seq;
	int err;
	int ok;         /* payload matched byte for byte */
	size_t bytes;   /* payload bytes */
	uint64_t order; /* position among every callback of the test */
	char detail[160];
};

/* A comm with decoded callbacks. */
struct ox_rx {
	tw_comm *comm;
	struct tu_peer *owner; /* the harness peer that frees comm, or NULL */
	pthread_t loop;        /* the thread every callback must run on */
	size_t n;              /* decoded callbacks */
	struct ox_got got[OX_MAX_MSGS];
	int closed, close_err;
	uint64_t close_order;
	size_t after_close; /* decoded callbacks after the close callback */
	size_t off_thread;  /* callbacks on another thread */
	int free_in_close;  /* tw_comm_free inside the close callback */
};

/* The global callback clock (loop thread). */
uint64_t ox_clock(void);

/* Set decoded callbacks on c; callbacks must run on `loop`. */
int ox_rx_start(struct ox_rx *rx, tw_comm *c, pthread_t loop);
/* 1 when got[i] is message seq, intact and without error. */
int ox_rx_is(const struct ox_rx *rx, size_t i, uint64_t seq);

/* A harness with n client comms whose server ends receive decoded. */
struct ox {
	struct tu h;
	size_t n;
	struct tu_peer *cli[OX_MAX_COMMS];
	struct ox_rx rx[OX_MAX_COMMS];
};

/* threads 0: the default pool size. */
void ox_setup(struct ox *o, size_t ncomms, unsigned threads);
void ox_teardown(struct ox *o);
/* Write m on client i (the harness keeps the loop running while the
 * write queue is full). Takes m. */
void ox_send(struct ox *o, size_t i, tw_msg *m);
/* Wait until comm i's server end received n messages from the wire (they
 * are then decoding, queued or delivered). */
void ox_wait_received(struct ox *o, size_t i, uint64_t n);
/* Wait until comm i delivered n messages. */
void ox_wait_delivered(struct ox *o, size_t i, size_t n);
/* Forget comm i's server end (the test freed it or will). */
void ox_forget(struct ox *o, size_t i);

/* A context on its own loop thread, reached through tw_context_call:
 * n client comms and their server ends (rx, decoded, in accept order). */
struct ox_thr {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	tw_context *ctx;
	tw_listener *lis;
	pthread_t loop;
	tw_comm *cli[OX_MAX_COMMS]; /* no callbacks: they only write */
	struct ox_rx rx[OX_MAX_COMMS];
	size_t ncli, nsrv;
	int err;
};
/* threads 0: the default pool size. */
void ox_thr_start(struct ox_thr *t, size_t ncomms, unsigned threads);
/* Run fn(t, arg) on the loop thread and wait for it. */
void ox_thr_call(struct ox_thr *t, void (*fn)(struct ox_thr *t, void *arg), void *arg);
/* Wait until the server ends delivered (received from the wire) n
 * messages in all; returns 1, or 0 at the deadline. */
int ox_thr_wait_delivered(struct ox_thr *t, size_t n);
int ox_thr_wait_received(struct ox_thr *t, size_t n);
/* Free the comms and the listener on the loop, then the context. */
void ox_thr_stop(struct ox_thr *t);

/* Jobs on a context's pool. A gate holds its worker until ox_open, or
 * until tw_context_free starts (it aborts the context's objects before it
 * stops the pool, and a gate is one of them); a marker does nothing. With
 * one worker, jobs run in submission order and their results come back in
 * that order, so a marker's done means every job submitted before it is
 * done too. Submit on the loop thread. */
struct ox_job {
	struct tw__job job;
	struct tw__node node; /* opens a gate when the context is freed */
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int gate, open, ran; /* guarded by mu */
	int done;            /* done ran (loop thread) */
	int canceled;        /* as done saw it */
	int done_off_thread; /* done ran on another thread than `loop` */
	pthread_t loop;
};
struct ox_job *ox_gate(tw_context *ctx);
struct ox_job *ox_marker(tw_context *ctx);
void ox_open(struct ox_job *j);
int ox_ran(struct ox_job *j);
/* Wait (up to TU_WAIT_MS) until a worker has started j: a gate is then holding
 * its worker, not merely queued (a queued job is canceled by a context
 * free). Asserts it started. */
void ox_wait_started(struct ox_job *j);
void ox_job_free(struct ox_job *j);
/* Wait for j's done on the harness loop. */
void ox_wait_job(struct tu *h, struct ox_job *j);

/* A gated case: ox_setup of ncomms with one worker, which a gate
 * (returned) holds until ox_open. */
struct ox_job *ox_setup_gated(struct ox *o, size_t ncomms);
/* Its end: the gate's done ran; ox_teardown; the gate freed. */
void ox_teardown_gated(struct ox *o, struct ox_job *gate);

/* Offload worker threads of this process (named "tw-offload"). */
size_t ox_nthreads(void);

#endif
