#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
# The layers of the library, from its #include lines (docs/design.md,
# Layers and files): prints which folder of src/ includes which, with
# the public headers each layer uses, and fails when an arrow points up
# or sideways:
#   - core/ includes neither transport/ nor protocol/, and of the public
#     headers only core's own (buf msg stats error context limits);
#   - transport/ includes no protocol/ header, and of the public headers
#     none of the protocol's (handshake serial offload server rpc stream
#     merge);
#   - protocol/ reaches transport/ through transport/upper.h alone (the
#     hook table and calls: struct tw_comm stays opaque there), and
#     upper.h includes nothing else of transport/.
# `make format-check` runs it. Run from anywhere; `-q` prints only errors.
set -e
cd "$(dirname "$0")/.."
quiet=0
[ "$1" = -q ] && quiet=1

# file<TAB>included, for every quoted or taskwire/ include under src/
edges=$(find src -name '*.[ch]' | sort | while read -r f; do
	sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*[<"]\(\(core\|transport\|protocol\|taskwire\)\/[^">]*\)[">].*/\1/p' "$f" |
		while read -r inc; do printf '%s\t%s\n' "${f#src/}" "$inc"; done
done)

printf '%s\n' "$edges" | awk -F'\t' -v quiet="$quiet" '
function layer_of_public(h) {
	sub(/^taskwire\//, "", h)
	if (h ~ /^(buf|msg|stats|error|context|limits)\.h$/) return "core"
	if (h ~ /^(comm|tls|relay)\.h$/) return "transport"
	return "protocol"
}
BEGIN { rank["core"] = 0; rank["transport"] = 1; rank["protocol"] = 2; bad = 0 }
NF == 2 {
	from = $1; sub(/\/.*/, "", from)
	to = $2; sub(/\/.*/, "", to)
	if (to == "taskwire") {
		pub = layer_of_public($2)
		api[from, $2]++
		if (rank[pub] > rank[from]) {
			printf "layers: %s includes <%s>, a %s header\n", $1, $2, pub > "/dev/stderr"
			bad = 1
		}
		next
	}
	n[from, to]++
	if (rank[to] > rank[from]) {
		printf "layers: %s includes \"%s\": %s/ is above %s/\n", $1, $2, to, from > "/dev/stderr"
		bad = 1
	}
	if (from == "protocol" && to == "transport" && $2 != "transport/upper.h") {
		printf "layers: %s includes \"%s\": protocol/ sees transport/upper.h only\n", $1, $2 > "/dev/stderr"
		bad = 1
	}
	if ($1 == "transport/upper.h" && to == "transport") {
		printf "layers: transport/upper.h includes \"%s\": it stands alone above core/\n", $2 > "/dev/stderr"
		bad = 1
	}
	if (from == "protocol" && to == "transport") seam[$1] = 1
}
END {
	if (!quiet) {
		split("protocol transport core", order, " ")
		for (i = 1; i <= 3; i++) {
			f = order[i]
			line = sprintf("%-10s ->", f "/")
			for (j = i; j <= 3; j++) {
				t = order[j]
				if ((f, t) in n)
					line = line sprintf(" %s/ (%d)", t, n[f, t])
			}
			m = 0
			for (k in api) {
				split(k, kk, SUBSEP)
				if (kk[1] != f)
					continue
				h = kk[2]; sub(/^taskwire\//, "", h); sub(/\.h$/, "", h)
				for (p = ++m; p > 1 && hs[p - 1] > h; p--)
					hs[p] = hs[p - 1]
				hs[p] = h
			}
			pubs = ""
			for (p = 1; p <= m; p++)
				pubs = pubs " " hs[p]
			print line
			if (pubs != "")
				print "              public:" pubs
		}
		ns = 0
		for (s in seam) ns++
		printf "protocol/ -> transport/ only through transport/upper.h (%d files)\n", ns
		print (bad ? "layers: an arrow points up" : "layers: every arrow points down")
	}
	exit bad
}'
