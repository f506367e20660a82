/* SPDX-License-Identifier: BSD-3-Clause */
/* The offload pool (protocol/offload.h, include/taskwire/offload.h). The
 * queue is guarded by one mutex; results go back through the context's
 * cross-thread call queue (event_active under libevent's pthread locks). */
#include <pthread.h>
#include <stdlib.h>

#include <taskwire/error.h>
#include <taskwire/offload.h>

#include "protocol/offload.h"

struct pool {
	tw_context *ctx;
	pthread_mutex_t lock;
	pthread_cond_t more;
	struct tw__job *head, **tail; /* guarded by lock */
	int stopping;                 /* guarded by lock */
	pthread_t *threads;
	unsigned nthreads;
};

static void post_done(void *arg)
{
	struct tw__job *job = arg;
	job->done(job);
}

static void *worker(void *arg)
{
	struct pool *p = arg;
	for (;;) {
		struct tw__job *job;
		pthread_mutex_lock(&p->lock);
		while (p->head == NULL && !p->stopping)
			pthread_cond_wait(&p->more, &p->lock);
		if (p->stopping) {
			/* queued jobs are pool_free's to cancel, not ours to run */
			pthread_mutex_unlock(&p->lock);
			return NULL;
		}
		job = p->head;
		if ((p->head = job->next) == NULL)
			p->tail = &p->head;
		pthread_mutex_unlock(&p->lock);
		job->run(job);
		job->call.fn = post_done;
		job->call.arg = job;
		job->call.owned = 0;
		tw__context_post(p->ctx, &job->call);
	}
}

/* Workers take no more jobs (a running one finishes). Idempotent. */
static void pool_stop(void *arg)
{
	struct pool *p = arg;
	pthread_mutex_lock(&p->lock);
	p->stopping = 1;
	pthread_cond_broadcast(&p->more);
	pthread_mutex_unlock(&p->lock);
}

/* Stop the workers (a running job finishes and posts its result), then
 * finish the jobs no worker took as canceled. */
static void pool_free(void *arg)
{
	struct pool *p = arg;
	struct tw__job *job;
	pool_stop(p);
	for (unsigned i = 0; i < p->nthreads; i++)
		pthread_join(p->threads[i], NULL);
	while ((job = p->head) != NULL) {
		p->head = job->next;
		job->canceled = 1;
		job->done(job);
	}
	pthread_cond_destroy(&p->more);
	pthread_mutex_destroy(&p->lock);
	free(p->threads);
	free(p);
}

static int pool_start(tw_context *ctx)
{
	struct pool *p = calloc(1, sizeof(*p));
	if (p == NULL || (p->threads = calloc(ctx->offload_threads, sizeof(pthread_t))) == NULL) {
		free(p);
		return TW_ENOMEM;
	}
	p->ctx = ctx;
	p->tail = &p->head;
	pthread_mutex_init(&p->lock, NULL);
	pthread_cond_init(&p->more, NULL);
	for (; p->nthreads < ctx->offload_threads; p->nthreads++) {
		if (pthread_create(&p->threads[p->nthreads], NULL, worker, p) != 0)
			break;
		/* named for top, gdb and /proc (at most 15 characters) */
		pthread_setname_np(p->threads[p->nthreads], "tw-offload");
	}
	if (p->nthreads == 0) {
		pool_free(p);
		return TW_EIO;
	}
	ctx->offload = p;
	ctx->offload_stop = pool_stop;
	ctx->offload_release = pool_free;
	return 0;
}

int tw__offload_submit(tw_context *ctx, struct tw__job *job)
{
	struct pool *p;
	int rv;
	if (ctx->offload == NULL && (rv = pool_start(ctx)) != 0)
		return rv;
	p = ctx->offload;
	job->next = NULL;
	job->canceled = 0;
	pthread_mutex_lock(&p->lock);
	*p->tail = job;
	p->tail = &job->next;
	pthread_cond_signal(&p->more);
	pthread_mutex_unlock(&p->lock);
	return 0;
}

int tw_context_set_offload_threads(tw_context *ctx, unsigned threads)
{
	if (ctx == NULL || threads == 0 || ctx->offload != NULL)
		return TW_EINVAL;
	ctx->offload_threads = threads;
	return 0;
}

int tw_context_set_offload_threshold_bytes(tw_context *ctx, uint64_t bytes)
{
	if (ctx == NULL)
		return TW_EINVAL;
	ctx->offload_threshold = bytes;
	return 0;
}
