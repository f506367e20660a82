/* SPDX-License-Identifier: BSD-3-Clause */
/* Found instead of Check's header when configure did not find Check
 * (configure.ac): the suites cannot build, and this says why. */
#error "make check needs Check: install the Debian package check (or run scripts/install-deps.sh as root), then re-run configure"
