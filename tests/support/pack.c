/* SPDX-License-Identifier: BSD-3-Clause */
/* Msgpack packed by hand (tests/support/pack.h). */
#include <check.h>

#include "tests/support/pack.h"

msgpack_packer *ts_pack_start(struct ts_pack *p)
{
	msgpack_sbuffer_init(&p->sb);
	msgpack_packer_init(&p->pk, &p->sb, msgpack_sbuffer_write);
	return &p->pk;
}

void ts_pack_append(struct ts_pack *p, tw_msg *msg)
{
	ck_assert_int_eq(tw_msg_append_copy(msg, p->sb.data, p->sb.size), 0);
	msgpack_sbuffer_destroy(&p->sb);
}

msgpack_packer *ts_builder_map(tw_builder **b, uint32_t n)
{
	msgpack_packer *pk;
	ck_assert_int_eq(tw_builder_new(NULL, b), 0);
	pk = tw_builder_packer(*b);
	msgpack_pack_map(pk, n);
	return pk;
}

const uint8_t ts_handshake_info[42] = {0x83, 0xab, 'c',  'o',  'm', 'p', 'r', 'e', 's', 's', 'i',
				       'o',  'n',  0xc0, 0xa6, 'p', 'y', 't', 'h', 'o', 'n', 0x93,
				       0x03, 0x0b, 0x02, 0xaf, 'p', 'i', 'c', 'k', 'l', 'e', '-',
				       'p',  'r',  'o',  't',  'o', 'c', 'o', 'l', 0x05};

void ts_pack_handshake_info(msgpack_packer *pk, uint32_t extra)
{
	msgpack_pack_map(pk, 3 + extra);
	/* the three entries, after the map's first byte */
	ck_assert_int_eq(pk->callback(pk->data, (const char *)ts_handshake_info + 1,
				      sizeof(ts_handshake_info) - 1),
			 0);
}
