#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
# make install into a temporary DESTDIR, build tests/install/hello.c
# against the installed copy with `pkg-config --cflags --libs taskwire`
# alone, and run it; build README.md's C examples the same way, and run
# the first where its port is taken.
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
# README.md's C examples build the same way, warning-free.
n=0
awk -v dir="$tmp" '/^```c$/ { on = 1; f = sprintf("%s/readme%d.c", dir, ++k); next }
/^```/ { on = 0 } on { print > f }' "$src/README.md"
for c in "$tmp"/readme*.c; do
	[ -f "$c" ] || continue
	# shellcheck disable=SC2086
	${CC:-cc} -std=c11 -Wall -Wextra -Wpedantic -Werror $TW_LDFLAGS -o "${c%.c}" "$c" $flags ||
		{ echo "check_install: README.md's example $(basename "$c") does not build" >&2; exit 1; }
	n=$((n + 1))
done
[ "$n" -ge 2 ] || { echo "check_install: found $n C examples in README.md, expected 2 or more" >&2; exit 1; }
echo "check_install: README.md's $n C examples build"
# The first (an echo server on port 8786) says why when it cannot listen:
# two copies at once, and the one that finds the port taken (by the
# other, or by anyone) prints "address in use" and exits 1.
export LD_LIBRARY_PATH="$(dirname "$(find "$tmp$prefix" -name 'libtaskwire.so' | head -1)")"
"$tmp/readme1" 2>"$tmp/a.err" &
a=$!
rc=0
timeout 3 "$tmp/readme1" 2>"$tmp/b.err" || rc=$?
kill "$a" 2>/dev/null || true
wait "$a" 2>/dev/null || true
# (whichever lost: its exit status may be LeakSanitizer's, not 1)
grep -h "address in use" "$tmp/a.err" "$tmp/b.err" || {
	echo "check_install: README.md's first example, port 8786 taken: exit $rc, said: $(cat "$tmp/a.err" "$tmp/b.err")" >&2
	exit 1
}
