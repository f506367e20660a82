/* SPDX-License-Identifier: BSD-3-Clause */
/* fuzz_decode links the decoder's sources alone, without the transports:
 * a message it decodes never carries relay frames (transport/relay.c),
 * so the one relay query the decoder makes answers "no". */
#include <taskwire/relay.h>

int tw_msg_frame_is_relay(const tw_msg *m, size_t i)
{
	(void)m;
	(void)i;
	return 0;
}
