/* SPDX-License-Identifier: BSD-3-Clause */
/* taskwire: error codes.
 *
 * Every taskwire function returns 0 on success or one of these negative
 * codes. Details (OS errno, TLS reason, offending byte offset) stay on the
 * object that failed, e.g. tw_comm_last_error(); never in a global. */
#ifndef TASKWIRE_ERROR_H
#define TASKWIRE_ERROR_H

#ifdef __cplusplus
extern "C" {
#endif

/* The library is built with hidden visibility; the API is exported. */
#pragma GCC visibility push(default)

enum tw_error {
	TW_OK = 0,
	TW_EINVAL = -1,       /* invalid argument (programmer error) */
	TW_ENOMEM = -2,       /* out of memory */
	TW_EAGAIN = -3,       /* would block: queue at high-water mark, or write budget spent */
	TW_ECLOSED = -4,      /* comm or listener closed */
	TW_EIO = -5,          /* socket error; errno text on the object */
	TW_ETIMEDOUT = -6,    /* a bounded wait (connect, handshake, TCP timeout) expired */
	TW_ECONNREFUSED = -7, /* the peer refused the connection */
	TW_EADDR = -8,        /* malformed URI or address, or a name that does not resolve */
	TW_ESCHEME = -9,      /* URI scheme with no transport */
	TW_EADDRINUSE = -10,  /* listen address already in use */
	TW_ENOFRAMES = -11,   /* prelude declares N = 0 frames */
	TW_ETOOMANY = -12,    /* more frames (prelude) or WebSocket fragments than the limit */
	TW_ELENGTH = -13,     /* frame lengths overflow or disagree with total */
	TW_ETOOBIG = -14,     /* message above the message-size limit */
	TW_ETRUNCATED = -15,  /* peer closed in the middle of a message */
	TW_EPROTO = -16,      /* other protocol violation by the peer */
	TW_ECANCELED = -17,   /* operation canceled */
	TW_ENOTSUP = -18,     /* feature not built in */
	TW_ERANGE = -19,      /* index or offset out of range */
	TW_ETLS = -20,        /* TLS handshake or certificate verification failed */
	TW_EHANDSHAKE = -21,  /* the peer did not complete the Dask handshake */
	TW_EREMOTE = -22,     /* the remote op failed (uncaught-error reply) */
};

/* tw_strerror: a constant, human-readable name for `err` (a TW_E* code or
 * 0). Unknown codes give "unknown error". Never returns NULL; the string is
 * static and must not be freed. Any thread. */
const char *tw_strerror(int err);

#pragma GCC visibility pop

#ifdef __cplusplus
}
#endif
#endif
