/* SPDX-License-Identifier: BSD-3-Clause */
/* UTF-8 validation (core/utf8.h), after RFC 3629 section 4's table of
 * well-formed byte sequences. */
#include <string.h>

#include "core/utf8.h"

int tw__utf8_valid(const uint8_t *p, size_t n)
{
	size_t i = 0;
	while (i < n) {
		uint8_t c = p[i];
		size_t k;
		uint8_t lo = 0x80, hi = 0xbf;
		if (c < 0x80) {
			/* ASCII, most strings: eight bytes per step (names and
			 * Dask keys in every sub-header: 4% of a scheduler's
			 * CPU forwarding 100,000 small values, issue 16) */
			uint64_t w;
			for (i++; n - i >= 8; i += 8) {
				memcpy(&w, p + i, 8);
				if (w & UINT64_C(0x8080808080808080))
					break;
			}
			continue;
		}
		if (c >= 0xc2 && c <= 0xdf) {
			k = 1;
		} else if (c >= 0xe0 && c <= 0xef) {
			k = 2;
			if (c == 0xe0)
				lo = 0xa0; /* overlong */
			else if (c == 0xed)
				hi = 0x9f; /* surrogates */
		} else if (c >= 0xf0 && c <= 0xf4) {
			k = 3;
			if (c == 0xf0)
				lo = 0x90; /* overlong */
			else if (c == 0xf4)
				hi = 0x8f; /* above U+10FFFF */
		} else {
			return 0; /* continuation byte, 0xc0, 0xc1, 0xf5-0xff */
		}
		if (n - i - 1 < k)
			return 0;
		if (p[i + 1] < lo || p[i + 1] > hi)
			return 0;
		for (size_t j = 2; j <= k; j++)
			if (p[i + j] < 0x80 || p[i + j] > 0xbf)
				return 0;
		i += k + 1;
	}
	return 1;
}
