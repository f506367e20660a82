/* SPDX-License-Identifier: BSD-3-Clause */
/* Gathering the small pieces of a write (transport/transport.h). */
#include <string.h>

#include "core/stats.h"
#include "transport/gather.h"

int tw__gather_small(struct iovec *iov, int k, uint8_t *buf)
{
	size_t len = 0;
	int n = 0;
	while (n < k && iov[n].iov_len <= TW__GATHER_MAX - len)
		len += iov[n++].iov_len;
	if (n < 2)
		return k; /* nothing gained: copy nothing */
	len = 0;
	for (int i = 0; i < n; i++) {
		memcpy(buf + len, iov[i].iov_base, iov[i].iov_len);
		len += iov[i].iov_len;
	}
	TW__ADD(&tw__global_stats, write_bytes_gathered, len);
	iov[0].iov_base = buf;
	iov[0].iov_len = len;
	memmove(&iov[1], &iov[n], (size_t)(k - n) * sizeof(*iov));
	return k - n + 1;
}
