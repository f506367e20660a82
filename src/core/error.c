/* SPDX-License-Identifier: BSD-3-Clause */
/* Error code names (include/taskwire/error.h). */
#include <taskwire/error.h>

const char *tw_strerror(int err)
{
	switch (err) {
	case TW_OK: return "success";
	case TW_EINVAL: return "invalid argument";
	case TW_ENOMEM: return "out of memory";
	case TW_EAGAIN:
		return "would block: the comm's write queue is at its high-water mark, or the "
		       "context's write budget is spent";
	case TW_ECLOSED: return "closed";
	case TW_EIO: return "I/O error";
	case TW_ETIMEDOUT: return "timed out";
	case TW_ECONNREFUSED: return "connection refused";
	case TW_EADDR: return "malformed or unresolvable address";
	case TW_ESCHEME: return "unknown URI scheme";
	case TW_EADDRINUSE: return "address in use";
	case TW_ENOFRAMES: return "message declares zero frames";
	case TW_ETOOMANY: return "message has more frames (or WebSocket fragments) than the limit";
	case TW_ELENGTH: return "frame lengths overflow or disagree with total";
	case TW_ETOOBIG: return "message larger than the limit";
	case TW_ETRUNCATED: return "peer closed in the middle of a message";
	case TW_EPROTO: return "protocol error";
	case TW_ECANCELED: return "canceled";
	case TW_ENOTSUP: return "not supported";
	case TW_ERANGE: return "out of range";
	case TW_ETLS: return "TLS handshake or certificate verification failed";
	case TW_EHANDSHAKE: return "the peer did not complete the Dask handshake";
	case TW_EREMOTE: return "the remote op failed";
	}
	return "unknown error";
}
