/* SPDX-License-Identifier: BSD-3-Clause */
/* taskwire: an embeddable RPC transport for cluster schedulers.
 * Umbrella header; see README.md and docs/ for an overview. */
#ifndef TASKWIRE_H
#define TASKWIRE_H

#include <taskwire/error.h>
#include <taskwire/buf.h>
#include <taskwire/stats.h>
#include <taskwire/msg.h>
#include <taskwire/limits.h>
#include <taskwire/context.h>
#include <taskwire/comm.h>
#include <taskwire/merge.h>
#include <taskwire/serial.h>
#include <taskwire/handshake.h>
#include <taskwire/server.h>
#include <taskwire/rpc.h>
#include <taskwire/stream.h>
#include <taskwire/offload.h>
#include <taskwire/tls.h>
#include <taskwire/relay.h>

#endif
