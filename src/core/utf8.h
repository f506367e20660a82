/* SPDX-License-Identifier: BSD-3-Clause */
/* UTF-8 validation, shared by msgpack str checks and WebSocket close
 * reasons. */
#ifndef TW_CORE_UTF8_H
#define TW_CORE_UTF8_H

#include <stddef.h>
#include <stdint.h>

/* tw__utf8_valid: 1 when p[0..n) is well-formed UTF-8 (RFC 3629: no
 * overlong forms, no surrogates, nothing above U+10FFFF), else 0. */
int tw__utf8_valid(const uint8_t *p, size_t n);

#endif
