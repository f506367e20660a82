/* SPDX-License-Identifier: BSD-3-Clause */
/* The public relay settings (include/taskwire/relay.h). */
#include <taskwire/error.h>
#include <taskwire/relay.h>

#include "transport/comm_impl.h"
#include "transport/relay.h"

static int bad_bytes(uint64_t n)
{
	return n != 0 && n < TW__RELAY_MIN_BYTES;
}

int tw_context_set_relay_bytes(tw_context *ctx, uint64_t min_frame_bytes)
{
	if (ctx == NULL || bad_bytes(min_frame_bytes))
		return TW_EINVAL;
	ctx->limits.relay_min_bytes = min_frame_bytes;
	return 0;
}

int tw_comm_set_relay_bytes(tw_comm *comm, uint64_t min_frame_bytes)
{
	if (comm == NULL || bad_bytes(min_frame_bytes))
		return TW_EINVAL;
	comm->limits.relay_min_bytes = min_frame_bytes;
	return 0;
}

int tw_msg_frame_is_relay(const tw_msg *m, size_t i)
{
	const tw_slice *f = m != NULL ? tw_msg_frame(m, i) : NULL;
	size_t k;
	return f != NULL && tw__relay_of(f, &k) != NULL;
}
