/* SPDX-License-Identifier: BSD-3-Clause */
/* The Dask comm handshake (include/taskwire/handshake.h). */
#include <stdlib.h>
#include <string.h>

#include <taskwire/error.h>
#include <taskwire/handshake.h>
#include <taskwire/serial.h>

#include "core/pass.h"
#include "protocol/compress.h"
#include "protocol/pcomm.h"
#include "protocol/placement.h"

/* A handshake is a small map: its message may not be larger, so a peer
 * cannot make us buffer a gigabyte before it said who it is. */
#define HANDSHAKE_MAX_BYTES ((uint64_t)64 << 10)

struct hs {
	uint64_t max_message_bytes; /* the comm's limit, restored after */
	uint32_t bound_ms;          /* the timer: its own clock, or what the connect left */
	int by_connect;             /* bound_ms is the connect timeout's (a connector's) */
	enum tw_handshake_side side;
	tw_handshake_cb cb;
	void *arg;
};

int tw_context_set_compression(tw_context *ctx, const char *codec)
{
	enum tw__codec c;
	if (ctx == NULL)
		return TW_EINVAL;
	if (codec == NULL) {
		ctx->limits.compression = NULL;
		return 0;
	}
	if (tw__codec_parse(codec, strlen(codec), &c) != 0)
		return TW_ENOTSUP;
	ctx->limits.compression = tw__codec_name(c);
	return 0;
}

int tw_context_set_handshake_timeout_ms(tw_context *ctx, uint32_t ms)
{
	return TW__SET_LIMIT(ctx, handshake_timeout_ms, ms, ms > 0);
}

const char *tw_comm_compression(const tw_comm *comm)
{
	const struct tw__pcomm *p = tw__pcomm_find(comm);
	return p != NULL ? p->compression : NULL;
}

/* {"compression": ..., "python": [3, 11, 2], "pickle-protocol": 5} */
static int write_info(tw_comm *comm)
{
	const char *codec = tw__comm_limits(comm)->compression;
	tw_builder *b;
	msgpack_packer *pk;
	tw_msg *m;
	int rv;
	if (tw_builder_new(NULL, &b) != 0)
		return TW_ENOMEM;
	pk = tw_builder_packer(b);
	msgpack_pack_map(pk, 3);
	tw_msgpack_pack_str(pk, "compression");
	if (codec != NULL)
		tw_msgpack_pack_str(pk, codec);
	else
		msgpack_pack_nil(pk);
	tw_msgpack_pack_str(pk, "python");
	msgpack_pack_array(pk, 3);
	msgpack_pack_uint8(pk, 3);
	msgpack_pack_uint8(pk, 11);
	msgpack_pack_uint8(pk, 2);
	tw_msgpack_pack_str(pk, "pickle-protocol");
	msgpack_pack_uint8(pk, TW_PICKLE_PROTOCOL);
	rv = tw_builder_finish(b, &m);
	tw_builder_free(b);
	if (rv == 0 && (rv = tw__comm_write_unbudgeted(comm, m)) != 0)
		tw_msg_free(m);
	return rv;
}

/* The handshake's state is part of the comm's protocol state while it
 * runs, so a comm freed mid-handshake frees it too; `place` (NULL on
 * failure) is kept there afterwards. */
static void finish(tw_comm *comm, struct hs *h, int err, const tw_handshake_info *info,
		   struct tw__dask_place *place)
{
	struct tw__pcomm *p = tw__pcomm_find(comm);
	tw_handshake_cb cb = h->cb;
	void *arg = h->arg;
	p->handshake = NULL;
	p->hs_by_connect = err == TW_ETIMEDOUT && h->by_connect;
	tw__comm_limits(comm)->max_message_bytes = h->max_message_bytes;
	free(h);
	tw__comm_disarm_timeout(comm);
	tw__comm_detach(comm);
	if (err != 0) {
		tw__comm_end(comm, err); /* no callback: detached */
	} else {
		p->compression = info->compression;
		p->place = place;
		tw__comm_set_place(comm, tw__dask_place, place);
	}
	cb(comm, err, info, arg);
}

/* Read the peer's info: a map with `compression` (str or nil) and
 * `pickle-protocol` (int). */
static int parse_info(tw_comm *comm, const tw_msg *msg, tw_handshake_info *info)
{
	const msgpack_object *root, *c, *p;
	const char *offered = tw__comm_limits(comm)->compression;
	tw_decoded *d;
	enum tw__codec peer;
	/* the handshake's bound (HANDSHAKE_MAX_BYTES, set while it runs)
	 * covers what decoding allocates too: payloads the info map may
	 * reference are decompressed within it, not within 4 GiB */
	tw_decode_limits lim = {tw__comm_limits(comm)->max_message_bytes};
	char why[200];
	int rv = tw_decode(msg, &lim, &d, why, sizeof(why));
	if (rv != 0) {
		tw__comm_seterr(comm, "%s", why);
		return TW_EPROTO;
	}
	root = tw_decoded_root(d);
	c = tw_msgpack_map_get(root, "compression");
	p = tw_msgpack_map_get(root, "pickle-protocol");
	rv = TW_EPROTO;
	if (root->type != MSGPACK_OBJECT_MAP)
		tw__comm_seterr(comm, "handshake: not a map");
	else if (c == NULL || (c->type != MSGPACK_OBJECT_NIL && c->type != MSGPACK_OBJECT_STR &&
			       c->type != MSGPACK_OBJECT_BOOLEAN))
		/* Python sends False when pinned to no compression. */
		tw__comm_seterr(comm,
				"handshake: `compression` missing or not a str, nil or false");
	else if (p == NULL || p->type != MSGPACK_OBJECT_POSITIVE_INTEGER)
		tw__comm_seterr(comm, "handshake: `pickle-protocol` missing or not an int");
	else
		rv = 0;
	if (rv == 0) {
		int same = 0;
		info->pickle_protocol =
			p->via.u64 < TW_PICKLE_PROTOCOL ? (int)p->via.u64 : TW_PICKLE_PROTOCOL;
		info->peer_compression = NULL;
		if (c->type == MSGPACK_OBJECT_STR &&
		    tw__codec_parse(c->via.str.ptr, c->via.str.size, &peer) == 0) {
			info->peer_compression = tw__codec_name(peer);
			same = offered != NULL && strcmp(offered, info->peer_compression) == 0;
		}
		info->compression = same ? offered : NULL;
	}
	tw_decoded_free(d);
	return rv;
}

static void on_recv(tw_comm *comm, tw_msg *msg, void *arg)
{
	struct hs *h = arg;
	tw_handshake_info info;
	struct tw__dask_place *place;
	int rv = parse_info(comm, msg, &info);
	if (rv == 0 && h->side == TW_HANDSHAKE_CONNECTOR)
		rv = write_info(comm);
	if (rv == 0 && (place = calloc(1, sizeof(*place))) == NULL)
		rv = TW_ENOMEM;
	if (rv != 0) {
		finish(comm, h, rv, NULL, NULL);
		return;
	}
	finish(comm, h, 0, &info, place);
}

static void on_close(tw_comm *comm, int err, void *arg)
{
	struct hs *h = arg;
	tw_stats st;
	tw_comm_stats(comm, &st, sizeof(st));
	if (err == 0) {
		err = TW_ECLOSED;
		tw__comm_seterr(comm, "handshake: peer closed the comm");
	} else if (err == TW_ETIMEDOUT) {
		/* the connect timeout as set, as the TLS handshake's and the
		 * ws upgrade's texts give it: it ran from the connect's start,
		 * and the handshake had what it left */
		unsigned ms = h->by_connect ? (unsigned)tw__comm_limits(comm)->connect_timeout_ms
					    : (unsigned)h->bound_ms;
		const char *clock = h->by_connect ? "the connect timeout" : "the handshake timeout";
		char peer[128];
		/* a tcp:// connector's silent peer may be a tls:// listener,
		 * which waits for a TLS hello */
		int plain = h->side == TW_HANDSHAKE_CONNECTOR &&
			    tw_comm_peer_address(comm, peer, sizeof(peer)) == 0 &&
			    strncmp(peer, "tcp://", 6) == 0;
		if (st.bytes_received == 0)
			tw__comm_seterr(comm,
					"handshake timed out: no answer from the peer within %u ms "
					"(%s; %s)",
					ms, clock,
					plain ? "a tls:// listener, or not a Dask peer?"
					      : "not a Dask peer?");
		else
			tw__comm_seterr(comm,
					"handshake timed out: %llu bytes from the peer within %u "
					"ms, not a whole handshake (%s)",
					(unsigned long long)st.bytes_received, ms, clock);
	}
	finish(comm, h, err, NULL, NULL);
}

/* The bound counts from now, not from the start of the pass, whose TLS
 * step (2.5 ms of CPU, more at load) or upgrade may have handed the comm
 * over (core/pass.h, tw__pass_lag_ms). */
static uint32_t bound_from_now(tw_comm *comm, uint32_t ms)
{
	uint32_t lag = tw__pass_lag_ms(tw_context_base(tw_comm_context(comm)));
	return lag < UINT32_MAX - ms ? ms + lag : ms;
}

int tw_comm_handshake(tw_comm *comm, enum tw_handshake_side side, tw_handshake_cb cb, void *arg)
{
	struct tw__limits *lim;
	struct tw__pcomm *p;
	struct hs *h;
	int rv;
	/* once per comm: the placement state of the first stays with it */
	if (comm == NULL || cb == NULL || (tw__comm_state(comm) & TW__COMM_HAS_CALLBACKS) ||
	    (side != TW_HANDSHAKE_CONNECTOR && side != TW_HANDSHAKE_LISTENER))
		return TW_EINVAL;
	if ((p = tw__pcomm_find(comm)) != NULL && (p->handshake != NULL || p->place != NULL))
		return TW_EINVAL;
	if ((p = tw__pcomm_get(comm)) == NULL || (h = calloc(1, sizeof(*h))) == NULL)
		return TW_ENOMEM;
	lim = tw__comm_limits(comm);
	/* a connector's handshake is part of its connect: the connect
	 * timeout's time left bounds it too, the sooner winning (Dask's
	 * connect(): wait_for(comm.read(), time_left())) */
	h->bound_ms = side == TW_HANDSHAKE_CONNECTOR ? tw__comm_connect_left_ms(comm) : 0;
	h->by_connect = h->bound_ms != 0 && h->bound_ms < lim->handshake_timeout_ms;
	if (!h->by_connect)
		h->bound_ms = lim->handshake_timeout_ms;
	h->side = side;
	h->cb = cb;
	h->arg = arg;
	h->max_message_bytes = lim->max_message_bytes;
	if (lim->max_message_bytes > HANDSHAKE_MAX_BYTES)
		lim->max_message_bytes = HANDSHAKE_MAX_BYTES;
	p->handshake = h;
	if ((rv = tw__comm_attach(comm, on_recv, on_close, h)) != 0 ||
	    (rv = tw__comm_arm_timeout(comm, bound_from_now(comm, h->bound_ms))) != 0 ||
	    (side == TW_HANDSHAKE_LISTENER && (rv = write_info(comm)) != 0)) {
		tw__comm_detach(comm);
		p->handshake = NULL;
		lim->max_message_bytes = h->max_message_bytes;
		free(h);
		return rv;
	}
	return 0;
}
