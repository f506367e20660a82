/* SPDX-License-Identifier: BSD-3-Clause */
/* The limits core keeps for every layer, and their defaults. The values
 * are the public TW_DEFAULT_* (taskwire/limits.h, the one place they are
 * written); a context starts with them (tw__limits_init) and every comm
 * copies its context's when it is made, so a setter applies to comms made
 * after it. */
#ifndef TW_CORE_LIMITS_H
#define TW_CORE_LIMITS_H

#include <stddef.h>
#include <stdint.h>

#include <taskwire/limits.h>

/* The limits a comm copies when it is made; each field's setter and
 * default are in taskwire/limits.h. */
struct tw__limits {
	uint64_t max_message_bytes;
	uint64_t max_frames;
	uint32_t connect_timeout_ms;
	uint32_t tcp_timeout_ms;  /* TCP_USER_TIMEOUT and keepalive; 0: the kernel's */
	uint32_t close_linger_ms; /* a closing comm's bytes stand still this long: abort */
	size_t write_hwm_bytes;
	size_t small_frame_bytes;
	uint32_t handshake_timeout_ms;
	uint32_t tls_handshake_timeout_ms;
	size_t ws_shard_bytes;            /* WebSocket fragments we send */
	uint64_t ws_max_fragments;        /* WebSocket fragments of one received message */
	uint32_t ws_min_ping_interval_ms; /* pings received closer are early; 0: off */
	uint32_t ws_ping_strikes;         /* early pings in a row forgiven; 0: off */
	uint32_t min_rate_bytes;          /* per second, while a message arrives; 0: off */
	uint32_t min_rate_grace_ms;       /* before it applies */
	uint32_t budget_pause_ms; /* a holder stands still this long past the budget: cut; 0: never
				   */
	const char *compression;  /* codec offered in handshakes (static), or NULL */
	uint64_t relay_min_bytes; /* tcp: relay frames this large (transport/relay.h); 0: off */
};

/* Every field at its default (compression none, relay off). */
void tw__limits_init(struct tw__limits *l);

#endif
