#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
# The man pages make install installs, from doxygen's output: one page per
# public header, named taskwire_<header>.3 (doxygen's own names, such as
# comm.h.3 or index.3, would clash with other packages' pages), and for
# every tw_ function, type and TW_ constant a page of its own name that
# points to its header's page (or is the struct's page). Doxygen's pages
# for struct fields (len.3, offset.3 ...) and its index are left out.
#   docs/man-pages.sh DOXYGEN_MAN3_DIR OUT_DIR HEADER...
set -e
src=$1 out=$2
shift 2
mkdir -p "$out"
rm -f "$out"/*.3
for h in "$@"; do
	b=$(basename "$h")
	[ -f "$src/$b.3" ] || continue
	cp "$src/$b.3" "$out/taskwire_$b.3"
done
for f in "$src"/tw_*.3 "$src"/TW_*.3; do
	[ -f "$f" ] || continue
	sed 's|^\.so man3/\([a-z_]*\.h\)\.3$|.so man3/taskwire_\1.3|' "$f" >"$out/$(basename "$f")"
done
