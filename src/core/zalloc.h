/* SPDX-License-Identifier: BSD-3-Clause */
/* Zeroed allocation for objects made per message. */
#ifndef TW_CORE_ZALLOC_H
#define TW_CORE_ZALLOC_H

#include <stdlib.h>
#include <string.h>

/* malloc and memset rather than calloc: glibc's calloc bypasses the
 * per-thread cache, and an object made and freed per message then churns
 * the arena (malloc_consolidate showed in small-RPC profiles). */
static inline void *tw__zalloc(size_t size)
{
	void *p = malloc(size);
	if (p != NULL) {
		/* keep the compiler from folding the pair back into calloc */
		__asm__ volatile("" : : "r"(p) : "memory");
		memset(p, 0, size);
	}
	return p;
}

#endif
