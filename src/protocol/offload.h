/* SPDX-License-Identifier: BSD-3-Clause */
/* The offload pool: worker threads that run heavy jobs (decoding large
 * messages) and post each result back to the loop thread. */
#ifndef TW_PROTOCOL_OFFLOAD_H
#define TW_PROTOCOL_OFFLOAD_H

#include "core/context.h"

struct tw__job {
	struct tw__job *next;
	void (*run)(struct tw__job *job);  /* on a worker */
	void (*done)(struct tw__job *job); /* on the loop thread, after run */
	struct tw__call call;              /* posts done without allocating */
	int canceled;                      /* set when the pool stopped before run */
};

/* tw__offload_submit: queue job; starts the pool on first use. done runs
 * exactly once on the loop thread (with canceled set, without run, when
 * the context is freed first). Returns 0, TW_ENOMEM or TW_EIO (no thread
 * could be started; job untouched). */
int tw__offload_submit(tw_context *ctx, struct tw__job *job);
/* Messages whose decode costs this much go to the pool
 * (tw_context_set_offload_threshold_bytes). Loop thread. */
uint64_t tw__offload_threshold(const tw_context *ctx);
/* 1 once ctx's pool has started its workers. Loop thread. */
int tw__offload_started(const tw_context *ctx);

#endif
