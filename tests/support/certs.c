/* SPDX-License-Identifier: BSD-3-Clause */
/* Test certificates (tests/support/certs.h). */
#include <stdio.h>
#include <stdlib.h>

#include "tests/support/certs.h"
#include "tests/support/loop.h"

static char cert_dir[128];

void ts_certs_make(void)
{
	const char *top = getenv("TW_TOP_SRCDIR");
	char cmd[1024];
	snprintf(cert_dir, sizeof(cert_dir), "/tmp/tw-tls-certs.XXXXXX");
	if (mkdtemp(cert_dir) == NULL) {
		perror("mkdtemp");
		exit(1);
	}
	/* ECDSA keys with TW_TEST_QUICK (valgrind: check_tls's reject tcase,
	 * all handshakes, took 86 s with RSA, 59 s with ECDSA); RSA otherwise */
	snprintf(cmd, sizeof(cmd), "TW_TEST_CERT_KEY=%s sh '%s/scripts/make-test-certs.sh' '%s'",
		 ts_quick() ? "ec" : "rsa", top ? top : ".", cert_dir);
	if (system(cmd) != 0) {
		fprintf(stderr, "make-test-certs.sh failed (TW_TOP_SRCDIR=%s)\n", top ? top : "");
		exit(1);
	}
}

void ts_certs_remove(void)
{
	char cmd[512];
	if (cert_dir[0] == '\0')
		return;
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", cert_dir);
	if (system(cmd) != 0)
		fprintf(stderr, "could not remove %s\n", cert_dir);
	cert_dir[0] = '\0';
}

const char *ts_cert(const char *name)
{
	static char buf[8][320];
	static unsigned next;
	char *b = buf[next++ % 8];
	snprintf(b, sizeof(buf[0]), "%s/%s", cert_dir, name);
	return b;
}
