/* SPDX-License-Identifier: BSD-3-Clause */
/* Small helpers for the ops: replies to requests (tw_server's deferred
 * or immediate reply), requests to workers, stream messages. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "examples/common.h"
#include "examples/mini-scheduler/sched.h"

static void out_of_memory(void)
{
	fputs("tw-mini-scheduler: out of memory\n", stderr);
	exit(1);
}

tw_builder *reply_builder(tw_request *r)
{
	tw_builder *b = tw_request_reply_builder(r);
	if (b == NULL)
		out_of_memory();
	return b;
}

msgpack_packer *reply_packer(tw_request *r)
{
	return tw_builder_packer(reply_builder(r));
}

void reply_send(tw_request *r)
{
	int rv = tw_request_reply(r);
	if (rv != 0 && rv != TW_ECLOSED) /* ECLOSED: the requester left */
		say("reply not sent: %s\n", tw_strerror(rv));
}

void reply_error(tw_request *r, const char *text)
{
	int rv = tw_request_reply_error(r, text, "");
	if (rv != 0 && rv != TW_ECLOSED)
		say("error reply not sent: %s\n", tw_strerror(rv));
}

/* pickle.dumps(e, protocol=2) of an exception of a module-level type
 * ("builtins" unless e->type says "module.name") with the arguments
 * (text), or (errnum, text) for socket.gaierror: PROTO 2, GLOBAL module
 * name, [BININT errnum,] BINUNICODE text, TUPLE1 or TUPLE2, REDUCE, STOP
 * (Python's Lib/pickle.py opcodes; OSError's __reduce__ is the same
 * call, so the errno comes back too). */
static void pickle_exception(msgpack_sbuffer *sb, const struct exc *e, int with_errno)
{
	const char *dot = strchr(e->type, '.');
	size_t n = strlen(e->text);
	unsigned char len[4] = {(unsigned char)n, (unsigned char)(n >> 8), (unsigned char)(n >> 16),
				(unsigned char)(n >> 24)};
	uint32_t en = (uint32_t)e->errnum;
	unsigned char num[5] = {'J', (unsigned char)en, (unsigned char)(en >> 8),
				(unsigned char)(en >> 16), (unsigned char)(en >> 24)};
	static const char head[] = {'\x80', 2, 'c'}; /* PROTO 2, GLOBAL */
	msgpack_sbuffer_write(sb, head, sizeof(head));
	if (dot != NULL)
		msgpack_sbuffer_write(sb, e->type, (size_t)(dot - e->type));
	else
		msgpack_sbuffer_write(sb, "builtins", 8);
	msgpack_sbuffer_write(sb, "\n", 1);
	msgpack_sbuffer_write(sb, dot ? dot + 1 : e->type, strlen(dot ? dot + 1 : e->type));
	msgpack_sbuffer_write(sb, "\n", 1);
	if (with_errno)
		msgpack_sbuffer_write(sb, (const char *)num, 5);
	msgpack_sbuffer_write(sb, "X", 1);
	msgpack_sbuffer_write(sb, (const char *)len, 4);
	msgpack_sbuffer_write(sb, e->text, n);
	msgpack_sbuffer_write(sb, with_errno ? "\x86R." : "\x85R.", 3);
}

void reply_exc(tw_request *r, const struct exc *e)
{
	msgpack_packer *pk = reply_packer(r);
	msgpack_sbuffer sb;
	const char *name = strchr(e->type, '.') ? strchr(e->type, '.') + 1 : e->type;
	int with_errno = strcmp(e->type, "socket.gaierror") == 0;
	int q = strchr(e->text, '\'') != NULL && strchr(e->text, '"') == NULL;
	char num[16] = "";
	msgpack_sbuffer_init(&sb);
	pickle_exception(&sb, e, with_errno);
	if (with_errno)
		snprintf(num, sizeof(num), "%d, ", e->errnum);
	msgpack_pack_map(pk, 5);
	tw_msgpack_pack_str(pk, "status");
	tw_msgpack_pack_str(pk, "uncaught-error");
	tw_msgpack_pack_str(pk, "exception");
	msgpack_pack_bin(pk, sb.size);
	msgpack_pack_bin_body(pk, sb.data, sb.size);
	tw_msgpack_pack_str(pk, "traceback");
	msgpack_pack_nil(pk);
	tw_msgpack_pack_str(pk, "exception_text"); /* repr(e) */
	msgpack_pack_str(pk, strlen(name) + strlen(num) + strlen(e->text) + 4);
	msgpack_pack_str_body(pk, name, strlen(name));
	msgpack_pack_str_body(pk, "(", 1);
	msgpack_pack_str_body(pk, num, strlen(num));
	msgpack_pack_str_body(pk, q ? "\"" : "'", 1); /* Python's choice of quote */
	msgpack_pack_str_body(pk, e->text, strlen(e->text));
	msgpack_pack_str_body(pk, q ? "\")" : "')", 2);
	tw_msgpack_pack_str(pk, "traceback_text");
	tw_msgpack_pack_str(pk, "");
	msgpack_sbuffer_destroy(&sb);
	reply_send(r);
}

void reply_exception(tw_request *r, const char *type, const char *text)
{
	struct exc e = {.type = type};
	snprintf(e.text, sizeof(e.text), "%s", text);
	reply_exc(r, &e);
}

tw_builder *request_new(const char *op, uint32_t nargs)
{
	tw_builder *b;
	msgpack_packer *pk;
	if (tw_builder_new(NULL, &b) != 0)
		out_of_memory();
	pk = tw_builder_packer(b);
	msgpack_pack_map(pk, nargs + 2);
	tw_msgpack_pack_str(pk, "op");
	tw_msgpack_pack_str(pk, op);
	tw_msgpack_pack_str(pk, "reply");
	msgpack_pack_true(pk);
	return b;
}

tw_msg *builder_done(tw_builder *b)
{
	tw_msg *m;
	if (tw_builder_finish(b, &m) != 0)
		out_of_memory();
	tw_builder_free(b);
	return m;
}

void stream_send(tw_batched *out, const msgpack_sbuffer *sb)
{
	int rv = tw_batched_send(out, sb->data, sb->size);
	/* TW_EAGAIN: one map is always taken, and the scheduler sends few. */
	if (rv != 0 && rv != TW_ECLOSED)
		say("stream message not sent: %s\n", tw_strerror(rv));
}

void stream_send_op(tw_batched *out, const char *op, const char *field, const char *value, size_t n)
{
	int rv = tw_ex_batch_op(out, op, field, value, n);
	if (rv != 0 && rv != TW_ECLOSED)
		say("stream message not sent: %s\n", tw_strerror(rv));
}

int obj_str(const msgpack_object *o, const char **s, size_t *n)
{
	if (o == NULL)
		return -1;
	if (o->type == MSGPACK_OBJECT_STR) {
		*s = o->via.str.ptr;
		*n = o->via.str.size;
		return 0;
	}
	if (o->type == MSGPACK_OBJECT_BIN) {
		*s = o->via.bin.ptr;
		*n = o->via.bin.size;
		return 0;
	}
	return -1;
}

void pack_strn(msgpack_packer *pk, const char *s, size_t n)
{
	msgpack_pack_str(pk, n);
	msgpack_pack_str_body(pk, s, n);
}
