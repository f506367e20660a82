/* SPDX-License-Identifier: BSD-3-Clause */
/* Test certificates, made at run time: ts_certs_make runs
 * $TW_TOP_SRCDIR/scripts/make-test-certs.sh into a fresh temporary
 * directory once per process (the suite's main, before Check forks);
 * ts_cert names a file in it: "ca.pem", "cert.pem", "key.pem",
 * "other-ca.pem", "other-cert.pem", "other-key.pem", "expired-cert.pem",
 * "expired-key.pem". */
#ifndef TW_TESTS_SUPPORT_CERTS_H
#define TW_TESTS_SUPPORT_CERTS_H

/* Exits the process when the script fails. */
void ts_certs_make(void);
void ts_certs_remove(void);
/* The path of name in the certificate directory (static storage, one of
 * a few rotating buffers). */
const char *ts_cert(const char *name);

#endif
