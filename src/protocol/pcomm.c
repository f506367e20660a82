/* SPDX-License-Identifier: BSD-3-Clause */
/* The protocol layer's state of one comm, and the hooks through which the
 * transport reaches it (transport/upper.h). */
#include <stdlib.h>

#include "protocol/pcomm.h"
#include "protocol/placement.h"

static void owner_gone(tw_comm *c, void *up)
{
	struct tw__pcomm *p = up;
	(void)c;
	if (p->deliver != NULL)
		tw__deliver_detach(p->deliver);
	p->deliver = NULL;
}

static void pcomm_free(void *up)
{
	struct tw__pcomm *p = up;
	free(p->handshake);
	tw__dask_place_free(p->place);
	if (p->deliver != NULL)
		tw__deliver_detach(p->deliver);
	free(p);
}

static void resume(tw_comm *c, void *up)
{
	struct tw__pcomm *p = up;
	if (p->deliver != NULL)
		tw__deliver_resume(p->deliver);
	else
		(void)tw__comm_start(c);
}

static int backlog(const tw_comm *c, const void *up)
{
	const struct tw__pcomm *p = up;
	(void)c;
	return p->deliver != NULL && tw__deliver_backlog(p->deliver);
}

static const struct tw__upper_ops pcomm_ops = {
	.owner_gone = owner_gone,
	.free = pcomm_free,
	.resume = resume,
	.backlog = backlog,
};

struct tw__pcomm *tw__pcomm_find(const tw_comm *c)
{
	return tw__comm_upper(c, &pcomm_ops);
}

struct tw__pcomm *tw__pcomm_get(tw_comm *c)
{
	struct tw__pcomm *p = tw__pcomm_find(c);
	if (p == NULL && (p = calloc(1, sizeof(*p))) != NULL)
		tw__comm_set_upper(c, &pcomm_ops, p);
	return p;
}
