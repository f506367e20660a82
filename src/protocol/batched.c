/* SPDX-License-Identifier: BSD-3-Clause */
/* The batched sender (include/taskwire/stream.h): maps written within one
 * interval leave as one array message, like Dask's BatchedSend, with the
 * payload groups the maps reference as the message's later frames. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>

#include <taskwire/error.h>
#include <taskwire/stream.h>

#include <taskwire/handshake.h>

#include "core/msg.h"
#include "protocol/builder.h"
#include "protocol/packbuf.h"
#include "protocol/mpcheck.h"
#include "transport/upper.h"

struct tw_batched {
	tw_comm *comm; /* NULL once freed (by its server, say) */
	struct tw__watch watch;
	struct event *timer;
	struct timeval interval;
	/* The batch: frame 0 holds the queued maps back to back (the array
	 * header goes in front at flush), groups their payloads, whose
	 * placeholders number frames from 1 as the sent message will. */
	tw_builder bld;
	const char *codec;    /* the comm's negotiated compression */
	uint64_t group_bytes; /* payload bytes in the batch */
	uint32_t n;
	int open;     /* tw_batched_begin without commit or abandon yet */
	size_t mark0; /* frame 0's size at begin */
	size_t markg; /* payload frames at begin */
	int refused;  /* a send got TW_EAGAIN: drain_cb is owed */
	tw_batched_drain_fn drain_cb;
	void *drain_arg;
};

static tw_batched *batched_of(struct tw__watch *w)
{
	return (tw_batched *)((char *)w - offsetof(tw_batched, watch));
}

static int flush(tw_batched *b, int force);

static size_t ngroups(const tw_batched *b)
{
	return b->bld.groups != NULL ? tw_msg_nframes(b->bld.groups) : 0;
}

/* An empty batch (the builder again as new). */
static void batch_reset(tw_batched *b)
{
	tw__builder_fini(&b->bld);
	tw__builder_init(&b->bld, b->codec); /* known codec: cannot fail */
	b->group_bytes = 0;
	b->n = 0;
}

/* The comm is being closed (by its server at close-stream, say): what is
 * queued goes first, as tw_batched_free would send it; sends after it say
 * TW_ECLOSED. */
static void comm_closing(struct tw__watch *w)
{
	flush(batched_of(w), 1);
}

/* The comm was freed under us (a server frees its stream comms when they
 * close): sends now say TW_ECLOSED, and a refused sender is told from the
 * timer, outside the free. */
static void comm_gone(struct tw__watch *w)
{
	tw_batched *b = batched_of(w);
	b->comm = NULL;
	if (!b->open) /* else commit or abandon empties it */
		batch_reset(b);
	if (b->refused)
		event_active(b->timer, EV_TIMEOUT, 0);
	else
		evtimer_del(b->timer);
}

/* The comm takes no more writes (ended or closing). */
static int no_writes(const tw_comm *c)
{
	return (tw__comm_state(c) & (TW__COMM_ENDED | TW__COMM_CLOSING)) != 0;
}

/* The batch and the comm's write queue leave room for len more bytes
 * (one map alone always goes). */
static int room(const tw_batched *b, uint64_t batch_bytes, size_t len)
{
	uint64_t queued = batch_bytes + tw__comm_queued_held(b->comm);
	return queued == 0 || queued + len <= tw__comm_limits(b->comm)->write_hwm_bytes;
}

static uint64_t batch_bytes(const tw_batched *b)
{
	return b->bld.frame0.size + b->group_bytes;
}

/* Flush; a refused sender is told when all it queued went to the kernel,
 * as the comm's drain callback would tell it (that one may be someone
 * else's), checked each interval. */
static void on_timer(evutil_socket_t fd, short what, void *arg)
{
	tw_batched *b = arg;
	(void)fd;
	(void)what;
	tw_batched_flush(b);
	if (!b->refused)
		return;
	if (b->comm != NULL && !(tw__comm_state(b->comm) & TW__COMM_ENDED) &&
	    (b->n > 0 || tw_comm_queued_bytes(b->comm) > 0)) {
		if (!evtimer_pending(b->timer, NULL))
			evtimer_add(b->timer, &b->interval);
		return;
	}
	b->refused = 0;
	if (b->drain_cb != NULL)
		b->drain_cb(b, b->drain_arg); /* last: it may free b */
}

int tw_batched_new(tw_comm *comm, uint32_t interval_ms, tw_batched **out)
{
	tw_batched *b;
	if (comm == NULL || out == NULL)
		return TW_EINVAL;
	if (interval_ms == 0)
		interval_ms = TW_DEFAULT_BATCH_INTERVAL_MS;
	if ((b = calloc(1, sizeof(*b))) == NULL)
		return TW_ENOMEM;
	if ((b->timer = evtimer_new(tw_context_base(tw_comm_context(comm)), on_timer, b)) == NULL) {
		free(b);
		return TW_ENOMEM;
	}
	b->comm = comm;
	b->codec = tw_comm_compression(comm);
	if (tw__builder_init(&b->bld, b->codec) != 0) {
		event_free(b->timer);
		free(b);
		return TW_EINVAL;
	}
	b->watch.gone = comm_gone;
	b->watch.closing = comm_closing;
	tw__comm_watch(comm, &b->watch);
	b->interval.tv_sec = (time_t)(interval_ms / 1000);
	b->interval.tv_usec = (suseconds_t)(interval_ms % 1000) * 1000;
	*out = b;
	return 0;
}

static int is_map(const uint8_t *p)
{
	return (p[0] & 0xf0) == 0x80 || p[0] == 0xde || p[0] == 0xdf;
}

void tw_batched_set_drain_cb(tw_batched *b, tw_batched_drain_fn fn, void *arg)
{
	if (b == NULL)
		return;
	b->drain_cb = fn;
	b->drain_arg = arg;
}

static void arm(tw_batched *b)
{
	if (!evtimer_pending(b->timer, NULL))
		evtimer_add(b->timer, &b->interval);
}

/* Writers are told to wait, as tw_comm_write tells them: the batch and
 * the comm's write queue together stay under the high-water mark (one
 * map alone always goes). */
static int refuse(tw_batched *b)
{
	b->refused = 1;
	arm(b);
	return TW_EAGAIN;
}

int tw_batched_send(tw_batched *b, const void *packed, size_t len)
{
	const char *why;
	if (b == NULL || b->open || packed == NULL || tw__mp_check(packed, len, NULL, &why) != 0 ||
	    !is_map(packed))
		return TW_EINVAL;
	/* a closing comm writes nothing more: the map could never go out */
	if (b->comm == NULL || no_writes(b->comm))
		return TW_ECLOSED;
	if (!room(b, batch_bytes(b), len))
		return refuse(b);
	if (tw__packbuf_write(&b->bld.frame0, packed, len) != 0) {
		tw__packbuf_truncate(&b->bld.frame0, b->bld.frame0.size);
		return TW_ENOMEM;
	}
	b->n++;
	arm(b);
	return 0;
}

tw_builder *tw_batched_begin(tw_batched *b)
{
	if (b == NULL || b->open)
		return NULL;
	b->open = 1;
	b->mark0 = b->bld.frame0.size;
	b->markg = ngroups(b);
	return &b->bld;
}

/* Forget what was packed since begin. */
static void roll_back(tw_batched *b)
{
	b->open = 0;
	if (b->comm == NULL) { /* gone meanwhile: nothing can be sent */
		batch_reset(b);
		return;
	}
	tw__packbuf_truncate(&b->bld.frame0, b->mark0);
	if (b->bld.groups != NULL)
		tw__msg_truncate(b->bld.groups, b->markg);
}

void tw_batched_abandon(tw_batched *b)
{
	if (b != NULL && b->open)
		roll_back(b);
}

int tw_batched_commit(tw_batched *b)
{
	const uint8_t *p;
	const char *why;
	size_t len;
	uint64_t payload = 0;
	if (b == NULL || !b->open)
		return TW_EINVAL;
	if (b->bld.frame0.failed) {
		roll_back(b);
		return TW_ENOMEM;
	}
	p = b->bld.frame0.data + b->mark0;
	len = b->bld.frame0.size - b->mark0;
	if (len == 0 || tw__mp_check(p, len, NULL, &why) != 0 || !is_map(p)) {
		roll_back(b);
		return TW_EINVAL;
	}
	if (b->comm == NULL || no_writes(b->comm)) {
		roll_back(b);
		return TW_ECLOSED;
	}
	if (1 + ngroups(b) > tw__comm_limits(b->comm)->max_frames) {
		roll_back(b); /* flush, then commit it alone */
		return TW_ETOOBIG;
	}
	for (size_t i = b->markg; i < ngroups(b); i++)
		payload += tw_msg_frame(b->bld.groups, i)->len;
	if (!room(b, b->mark0 + b->group_bytes, len + payload)) {
		roll_back(b);
		return refuse(b);
	}
	b->open = 0;
	b->group_bytes += payload;
	b->n++;
	arm(b);
	return 0;
}

/* Write the queued maps as one array message. With `force`, neither the
 * write queue's high-water mark nor the context's write budget refuses it (the last batch, from
 * tw_batched_free, has no later interval to retry in). */
static int flush(tw_batched *b, int force)
{
	struct tw__packbuf head;
	msgpack_packer pk;
	tw_msg *m;
	struct tw__limits *lim;
	size_t hwm, ng;
	int rv;
	if (b->comm == NULL)
		return TW_ECLOSED;
	if (b->n == 0)
		return 0;
	if (b->open) { /* a map half packed: the next interval */
		arm(b);
		return 0;
	}
	tw__packbuf_init(&head);
	tw__packbuf_packer(&head, &pk);
	msgpack_pack_array(&pk, b->n);
	/* Frame 0 is the array header then the maps: one buffer, so the
	 * header goes in front of the maps once (payloads are not copied:
	 * the message references their frames). */
	tw__packbuf_write(&head, (const char *)b->bld.frame0.data, b->bld.frame0.size);
	ng = ngroups(b);
	if (tw_msg_new(&m) != 0) {
		tw__packbuf_fini(&head);
		return TW_ENOMEM;
	}
	if (tw__msg_reserve(m, 1 + ng) != 0 || tw__packbuf_append(m, &head) != 0) {
		tw__packbuf_fini(&head);
		tw_msg_free(m);
		return TW_ENOMEM;
	}
	for (size_t i = 0; i < ng; i++)
		tw_msg_append(m, tw_msg_frame(b->bld.groups, i)); /* room reserved */
	lim = tw__comm_limits(b->comm);
	hwm = lim->write_hwm_bytes;
	if (force)
		lim->write_hwm_bytes = SIZE_MAX;
	rv = force ? tw__comm_write_unbudgeted(b->comm, m) : tw_comm_write(b->comm, m);
	lim->write_hwm_bytes = hwm;
	if (rv != 0) {
		tw_msg_free(m);
		if (rv == TW_EAGAIN)
			evtimer_add(b->timer, &b->interval);
		return rv;
	}
	batch_reset(b);
	return 0;
}

int tw_batched_flush(tw_batched *b)
{
	if (b != NULL && b->open)
		return TW_EINVAL;
	return flush(b, 0);
}

void tw_batched_free(tw_batched *b)
{
	if (b == NULL)
		return;
	tw_batched_abandon(b);
	if (b->comm != NULL && !(tw__comm_state(b->comm) & TW__COMM_ENDED))
		flush(b, 1);
	tw__comm_unwatch(&b->watch);
	event_free(b->timer);
	tw__builder_fini(&b->bld);
	free(b);
}
