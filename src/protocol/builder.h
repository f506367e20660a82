/* SPDX-License-Identifier: BSD-3-Clause */
/* Internal builder helpers. */
#ifndef TW_PROTOCOL_BUILDER_H
#define TW_PROTOCOL_BUILDER_H

#include <taskwire/serial.h>

#include "protocol/compress.h"
#include "protocol/packbuf.h"

/* Public as an opaque type; here so that a request can hold its reply's
 * builder (one allocation less per reply). */
struct tw_builder {
	struct tw__packbuf frame0;
	msgpack_packer pk;
	enum tw__codec codec;
	tw_msg *groups; /* frames 1..; made by the first payload group */
	int done;
};

/* tw_builder_new and tw_builder_free on caller memory: init returns 0 or
 * TW_ENOTSUP (unknown compression) and allocates nothing; fini frees
 * what the builder holds, not b. */
int tw__builder_init(tw_builder *b, const char *compression);
void tw__builder_fini(tw_builder *b);

/* 1 while nothing has been packed into frame 0. */
int tw__builder_empty(const tw_builder *b);

#endif
