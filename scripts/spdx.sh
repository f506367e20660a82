#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
# Every source file names its license on its first line (after a #!
# line): `scripts/spdx.sh` adds the line where it is missing (`make
# format` runs it), `scripts/spdx.sh --check` lists the files without one
# and fails (`make format-check` runs it, so CI refuses such a file).
# Run from anywhere; it works on the files git tracks.
set -e
id="SPDX-License-Identifier: BSD-3-Clause"
cd "$(dirname "$0")/.."
files() {
	git ls-files --cached --others --exclude-standard '*.c' '*.h' '*.sh' '*.py' '*.inc' '*.am' '*.ac' '*.in' '.ci/run' |
		grep -v '^tests/fuzz/corpus/'
}
comment() {
	case "$1" in
	*.c | *.h) echo "/* $id */" ;;
	*) echo "# $id" ;;
	esac
}
if [ "$1" = --check ]; then
	bad=$(files | while read -r f; do
		head -n 2 "$f" | grep -q 'SPDX-License-Identifier:' || echo "$f"
	done)
	[ -z "$bad" ] && exit 0
	echo "spdx: these files have no '$id' line on their first line (after #!); run scripts/spdx.sh:" >&2
	echo "$bad" >&2
	exit 1
fi
files | while read -r f; do
	head -n 2 "$f" | grep -q 'SPDX-License-Identifier:' && continue
	line=$(comment "$f")
	if head -n 1 "$f" | grep -q '^#!'; then
		sed -i "1a\\$line" "$f"
	else
		sed -i "1i\\$line" "$f"
	fi
	echo "spdx: $f"
done
