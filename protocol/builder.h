/* Internal builder helpers. */
#ifndef TW_PROTOCOL_BUILDER_H
#define TW_PROTOCOL_BUILDER_H

#include <taskwire/serial.h>

/* 1 while nothing has been packed into frame 0. */
int tw__builder_empty(const tw_builder *b);

#endif
