/* SPDX-License-Identifier: BSD-3-Clause */
/* The offload pool (protocol/offload.h, include/taskwire/offload.h). The
 * queue is guarded by one mutex; results go back through the context's
 * cross-thread call queue (event_active under libevent's pthread locks). */
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

#include <taskwire/error.h>
#include <taskwire/offload.h>

#include "protocol/offload.h"

/* A context's pool, its extension (core/context.h): made by the first
 * setter or job, its workers started by the first job. */
struct pool {
	tw_context *ctx;
	unsigned want_threads; /* tw_context_set_offload_threads */
	uint64_t threshold;    /* tw_context_set_offload_threshold_bytes */
	pthread_mutex_t lock;
	pthread_cond_t more;
	struct tw__job *head, **tail; /* guarded by lock */
	int stopping;                 /* guarded by lock */
	pthread_t *threads;           /* NULL until started */
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

/* The online CPUs minus one, at least 1; a loop thread's context
 * (tw_context_set_loop_threads) gets its share. */
static unsigned default_threads(const tw_context *ctx)
{
	long n = sysconf(_SC_NPROCESSORS_ONLN);
	unsigned t = n > 2 ? (unsigned)(n - 1) : 1;
	if (ctx->main != NULL && ctx->main->nloops > 1)
		t /= ctx->main->nloops;
	return t > 0 ? t : 1;
}

static struct pool *pool_new(unsigned want_threads, uint64_t threshold)
{
	struct pool *p = calloc(1, sizeof(*p));
	if (p == NULL)
		return NULL;
	p->want_threads = want_threads;
	p->threshold = threshold;
	p->tail = &p->head;
	pthread_mutex_init(&p->lock, NULL);
	pthread_cond_init(&p->more, NULL);
	return p;
}

/* A loop thread's context gets a pool of its own, with its share of the
 * threads (tw_context_set_loop_threads), started when it needs one. */
static void *pool_hold(void *arg, unsigned nloops)
{
	const struct pool *p = arg;
	unsigned n = p->want_threads / nloops;
	return pool_new(n > 0 ? n : 1, p->threshold);
}

static const struct tw__ext_ops pool_ops = {
	.stop = pool_stop,
	.release = pool_free,
	.hold = pool_hold,
};

/* ctx's pool, made on first use (not started); NULL: out of memory. */
static struct pool *pool_of(tw_context *ctx)
{
	struct pool *p = tw__ctx_ext(ctx, &pool_ops);
	if (p == NULL &&
	    (p = pool_new(default_threads(ctx), TW_DEFAULT_OFFLOAD_THRESHOLD_BYTES)) != NULL &&
	    tw__ctx_set_ext(ctx, &pool_ops, p) != 0) {
		pool_free(p);
		p = NULL;
	}
	return p;
}

static int pool_start(tw_context *ctx, struct pool *p)
{
	if ((p->threads = calloc(p->want_threads, sizeof(pthread_t))) == NULL)
		return TW_ENOMEM;
	p->ctx = ctx;
	for (; p->nthreads < p->want_threads; p->nthreads++) {
		if (pthread_create(&p->threads[p->nthreads], NULL, worker, p) != 0)
			break;
		/* named for top, gdb and /proc (at most 15 characters) */
		pthread_setname_np(p->threads[p->nthreads], "tw-offload");
	}
	if (p->nthreads == 0) {
		free(p->threads);
		p->threads = NULL;
		return TW_EIO;
	}
	return 0;
}

uint64_t tw__offload_threshold(const tw_context *ctx)
{
	const struct pool *p = tw__ctx_ext(ctx, &pool_ops);
	return p != NULL ? p->threshold : TW_DEFAULT_OFFLOAD_THRESHOLD_BYTES;
}

int tw__offload_started(const tw_context *ctx)
{
	const struct pool *p = tw__ctx_ext(ctx, &pool_ops);
	return p != NULL && p->threads != NULL;
}

int tw__offload_submit(tw_context *ctx, struct tw__job *job)
{
	struct pool *p = pool_of(ctx);
	int rv;
	if (p == NULL)
		return TW_ENOMEM;
	if (p->threads == NULL && (rv = pool_start(ctx, p)) != 0)
		return rv;
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
	struct pool *p;
	if (ctx == NULL || threads == 0 || tw__offload_started(ctx))
		return TW_EINVAL;
	if ((p = pool_of(ctx)) == NULL)
		return TW_ENOMEM;
	p->want_threads = threads;
	return 0;
}

int tw_context_set_offload_threshold_bytes(tw_context *ctx, uint64_t bytes)
{
	struct pool *p;
	if (ctx == NULL)
		return TW_EINVAL;
	if ((p = pool_of(ctx)) == NULL)
		return TW_ENOMEM;
	p->threshold = bytes;
	return 0;
}
