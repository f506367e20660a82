/* SPDX-License-Identifier: BSD-3-Clause */
/* The reclaimer: one thread that unmaps large mappings for the others,
 * and faults in the pages receivers are about to fill (core/reclaim.h).
 * Freeing a decoded message of 2 GiB ran munmap on the loop thread for
 * 0.25 s, and no other comm was served meanwhile (issue 17); the zstd
 * bomb that inflates 65 KB to 2 GiB cost the loop 192 ms per message the
 * same way. The thread starts with the first large unmap or prefault and
 * lives as long as the process, as glibc's own helper threads do. */
#include <pthread.h>
#include <stdatomic.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>

#include "core/reclaim.h"

struct job {
	struct job *next;
	void *p;
	size_t len;
	int populate; /* tw__prefault's, else an unmap */
	uint32_t seq; /* a prefault's place in the order of prefaults */
};

static struct {
	pthread_mutex_t lock;
	pthread_cond_t work, idle;
	struct job *head, **tail;
	int state; /* 0: no thread yet, 1: running, -1: could not start */
	int busy;  /* the thread is unmapping a batch taken off the queue */
	int atfork;
	uint32_t seq; /* the last prefault queued (tw__prefault's number) */
} r = {PTHREAD_MUTEX_INITIALIZER,
       PTHREAD_COND_INITIALIZER,
       PTHREAD_COND_INITIALIZER,
       NULL,
       &r.head,
       0,
       0,
       0,
       0};

/* The last prefault done (jobs run in order: every one before it too). */
static _Atomic uint32_t done_seq;

/* munmap holds the process's mmap lock while it frees the pages, and the
 * loop's mprotect (tw__block_commit), mmap and page faults wait for it:
 * one munmap of 2 GiB, even here, stalled the loop 0.3-0.6 s. In steps
 * of 4 MiB (about 0.5 ms each, more on a busy machine) the loop gets the
 * lock in between. */
#define STEP_BYTES ((size_t)4 << 20)
/* Prefaulting holds the lock for reading: the loop's mprotect waits for
 * one step of it. */
#define POPULATE_STEP ((size_t)256 << 10)

/* Bytes handed to the reclaimer and not unmapped yet: still resident,
 * so the receive budgets count them (tw__reclaim_pending). */
static _Atomic uint64_t pending;

static void unmap_in_steps(uint8_t *p, size_t len)
{
	for (size_t off = 0; off < len; off += STEP_BYTES) {
		size_t n = len - off < STEP_BYTES ? len - off : STEP_BYTES;
		munmap(p + off, n);
		atomic_fetch_sub_explicit(&pending, n, memory_order_relaxed);
	}
}

/* Fault the pages in, writable, without touching their bytes; a page
 * already there is left as it is, so a writer racing us loses nothing.
 * Errors (the range unmapped or made inaccessible meanwhile) only mean
 * the writer faults the pages in itself. */
static void populate_in_steps(uint8_t *p, size_t len)
{
	for (size_t off = 0; off < len; off += POPULATE_STEP) {
		size_t n = len - off < POPULATE_STEP ? len - off : POPULATE_STEP;
		if (madvise(p + off, n, MADV_POPULATE_WRITE) != 0)
			return;
	}
}

uint64_t tw__reclaim_pending(void)
{
	return atomic_load_explicit(&pending, memory_order_relaxed);
}

static void *reclaimer(void *arg)
{
	(void)arg;
	pthread_mutex_lock(&r.lock);
	for (;;) {
		struct job *j;
		r.busy = 0;
		while (r.head == NULL) {
			pthread_cond_broadcast(&r.idle);
			pthread_cond_wait(&r.work, &r.lock);
		}
		j = r.head;
		r.head = NULL;
		r.tail = &r.head;
		r.busy = 1;
		pthread_mutex_unlock(&r.lock);
		while (j != NULL) {
			struct job *next = j->next;
			if (j->populate) {
				populate_in_steps(j->p, j->len);
				atomic_store_explicit(&done_seq, j->seq, memory_order_release);
			} else
				unmap_in_steps(j->p, j->len);
			free(j);
			j = next;
		}
		pthread_mutex_lock(&r.lock);
	}
	return NULL;
}

/* fork waits until the reclaimer is idle, holding r.lock across the
 * fork: a batch the thread had taken off the queue lives only on its
 * stack, which the child does not get (valgrind saw the jobs as
 * definitely lost in forked test children). */
static void before_fork(void)
{
	pthread_mutex_lock(&r.lock);
	while (r.state == 1 && (r.head != NULL || r.busy))
		pthread_cond_wait(&r.idle, &r.lock);
}

static void after_fork_parent(void)
{
	pthread_mutex_unlock(&r.lock);
}

/* A child of fork has no reclaimer: what its parent had queued is
 * unmapped in the child at once, and the next large unmap starts a new
 * thread. */
static void after_fork_child(void)
{
	struct job *j = r.head;
	pthread_mutex_init(&r.lock, NULL);
	pthread_cond_init(&r.work, NULL);
	pthread_cond_init(&r.idle, NULL);
	r.head = NULL;
	r.tail = &r.head;
	r.state = 0;
	r.busy = 0;
	/* the parent's prefaults left undone: their writers fault pages in */
	atomic_store_explicit(&done_seq, r.seq, memory_order_relaxed);
	while (j != NULL) {
		struct job *next = j->next;
		if (!j->populate) {
			munmap(j->p, j->len);
			atomic_fetch_sub_explicit(&pending, j->len, memory_order_relaxed);
		}
		free(j);
		j = next;
	}
}

/* Start the thread; r.lock held. Signals stay with the application's
 * threads: the reclaimer blocks them all. */
static void start(void)
{
	pthread_t t;
	pthread_attr_t a;
	sigset_t all, old;
	if (!r.atfork) {
		pthread_atfork(before_fork, after_fork_parent, after_fork_child);
		r.atfork = 1;
	}
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	pthread_attr_init(&a);
	pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
	r.state = pthread_create(&t, &a, reclaimer, NULL) == 0 ? 1 : -1;
	pthread_attr_destroy(&a);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (r.state == 1)
		pthread_setname_np(t, "tw-reclaim");
}

/* Queue a job for the thread (started on first use): 0, or -1 when it
 * cannot run (no memory, no thread): the caller does the work itself. A
 * prefault's number goes to *seq. */
static int queue(void *p, size_t len, int populate, uint32_t *seq)
{
	struct job *j = malloc(sizeof(*j));
	if (j == NULL)
		return -1;
	j->next = NULL;
	j->p = p;
	j->len = len;
	j->populate = populate;
	pthread_mutex_lock(&r.lock);
	if (r.state == 0)
		start();
	if (r.state < 0) {
		pthread_mutex_unlock(&r.lock);
		free(j);
		return -1;
	}
	if (!populate)
		atomic_fetch_add_explicit(&pending, len, memory_order_relaxed);
	else
		j->seq = *seq = ++r.seq ? r.seq : ++r.seq; /* 0: none */
	*r.tail = j;
	r.tail = &j->next;
	pthread_cond_signal(&r.work);
	pthread_mutex_unlock(&r.lock);
	return 0;
}

void tw__unmap(void *p, size_t len, size_t used)
{
	if (used < TW__RECLAIM_MIN_BYTES || queue(p, len, 0, NULL) != 0)
		munmap(p, len);
}

uint32_t tw__prefault(void *p, size_t len)
{
	uint32_t seq = 0;
	return queue(p, len, 1, &seq) == 0 ? seq : 0;
}

int tw__prefault_done(uint32_t seq)
{
	/* wraps after 2^32 prefaults: compare as a difference */
	return seq != 0 &&
	       (int32_t)(atomic_load_explicit(&done_seq, memory_order_acquire) - seq) >= 0;
}

void tw__reclaim_wait(void)
{
	pthread_mutex_lock(&r.lock);
	while (r.state == 1 && (r.head != NULL || r.busy))
		pthread_cond_wait(&r.idle, &r.lock);
	pthread_mutex_unlock(&r.lock);
}
