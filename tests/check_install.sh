#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
# make install into a temporary DESTDIR, build tests/install/hello.c
# against the installed copy with `pkg-config --cflags --libs taskwire`
# alone, and run it.
set -e
build=${TW_TOP_BUILDDIR:?} src=${TW_TOP_SRCDIR:?}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
make -s -C "$build" install DESTDIR="$tmp" >/dev/null
prefix=$(sed -n 's/^prefix=//p' "$build/taskwire.pc")
pcdir=$(find "$tmp$prefix" -name taskwire.pc -printf '%h\n' | head -1)
[ -n "$pcdir" ] || { echo "check_install: taskwire.pc was not installed" >&2; exit 1; }
for f in taskwire.h comm.h serial.h server.h; do
	[ -f "$tmp$prefix/include/taskwire/$f" ] || { echo "check_install: $f missing" >&2; exit 1; }
done
[ -x "$tmp$prefix/bin/tw-echo-server" ] || { echo "check_install: examples missing" >&2; exit 1; }
# The reference manual's man pages, when configure found doxygen.
if [ -d "$build/docs/man3" ]; then
	[ -f "$tmp$prefix/share/man/man3/tw_comm_write.3" ] &&
		MANPATH="$tmp$prefix/share/man" man -w tw_comm_write >/dev/null 2>&1 ||
		{ echo "check_install: man page tw_comm_write(3) missing" >&2; exit 1; }
fi
flags=$(PKG_CONFIG_PATH="$pcdir" PKG_CONFIG_SYSROOT_DIR="$tmp" pkg-config --cflags --libs taskwire)
# shellcheck disable=SC2086
${CC:-cc} $TW_LDFLAGS -o "$tmp/hello" "$src/tests/install/hello.c" $flags
LD_LIBRARY_PATH="$(dirname "$(find "$tmp$prefix" -name 'libtaskwire.so' | head -1)")" "$tmp/hello"
