#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
# Realistic networks (issue 17): loopback's 64 KiB MTU hides segmentation,
# so run the transport suites once more with client and server in two
# network namespaces joined by a veth pair with MTU 1500, segmentation
# offload off (every packet on the link is at most one MTU), and the fault
# proxy (tests/check_faults) in between. The test binaries run in
# namespace A (10.200.0.1); their servers and the proxy listen in
# namespace B (10.200.0.2): tests/support/harness.h, TW_TEST_HOST and
# TW_TEST_LISTEN_NETNS. The addresses exist only inside the namespaces.
#
# Usage: tests/netns-check.sh [BUILD_DIR]   (default: the current directory)
# Needs root (CI runs as root) and network namespaces; without them it
# says why and exits 77 (automake's SKIP). The namespaces and the veth
# pair are removed on every exit, failures and signals included.
# Run: the Check cases that move bytes over the link or end comms in the
# middle of them: echo (every size, many clients) and check_faults' proxy;
# the close contract over tcp, tls, ws and wss (check_close); and, from
# the errors and close cases of check_tcp, check_tls and check_ws, the
# tests of ends in the middle of a message (the counts their texts give),
# resets before accept and closes with data queued (TW_TEST_ONLY, so the
# step stays short). Each run logs to BUILD/tests/netns-SUITE[-CASE].log
# and says its wall time.
# TW_NETNS_CASES overrides the Check cases run (CK_RUN_CASE, one name), in
# check_tcp, check_tls, check_ws and check_faults.
set -u
build=$(cd "${1:-${TW_TOP_BUILDDIR:-.}}" && pwd)
top=$(cd "$(dirname "$0")/.." && pwd)
a=twA$$
b=twB$$
va=twva$$
vb=twvb$$

skip() {
	echo "netns-check: SKIP: $*"
	exit 77
}

[ "$(id -u)" = 0 ] || skip "not root (network namespaces need CAP_SYS_ADMIN)"
command -v ip >/dev/null 2>&1 || skip "no ip(8) (iproute2)"
for t in check_tcp check_tls check_ws check_faults check_close; do
	[ -x "$build/tests/$t" ] || { echo "netns-check: $build/tests/$t not built" >&2; exit 1; }
done

cleanup() {
	ip netns del "$a" 2>/dev/null
	ip netns del "$b" 2>/dev/null # deleting a namespace deletes its end of the veth pair
	ip link del "$va" 2>/dev/null
	return 0
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP

ip netns add "$a" 2>/dev/null || skip "cannot make network namespaces here"
ip netns add "$b" || exit 1
ip link add "$va" type veth peer name "$vb" 2>/dev/null || skip "cannot make a veth pair here"
set -e
ip link set "$va" netns "$a"
ip link set "$vb" netns "$b"
for ns in "$a:$va:10.200.0.1" "$b:$vb:10.200.0.2"; do
	n=${ns%%:*}
	rest=${ns#*:}
	dev=${rest%%:*}
	addr=${rest#*:}
	ip -n "$n" addr add "$addr/24" dev "$dev"
	# gso_max_segs 1: TCP hands the link one MTU-sized segment at a
	# time (no 64 KiB super-packets crossing the veth unsplit)
	ip -n "$n" link set "$dev" mtu 1500 gso_max_segs 1 up
	ip -n "$n" link set lo up
done
set +e

# One suite (its Check case $2, "" for all; the tests named in $3, ""
# for all) in namespace A against servers in namespace B.
status=0
run() {
	suite=$1
	case=$2
	only=${3:-}
	log="$build/tests/netns-$suite${case:+-$case}.log"
	t0=$(date +%s)
	unset=""
	[ -n "$case" ] || unset="-u CK_RUN_CASE"
	# check_faults' payloads are small; its quick mode means valgrind
	[ "$suite" != check_faults ] || unset="$unset -u TW_TEST_QUICK"
	# shellcheck disable=SC2086 # $unset: words on purpose
	if ip netns exec "$a" env $unset ${case:+CK_RUN_CASE="$case"} TW_TEST_ONLY="$only" \
		TW_TOP_SRCDIR="$top" TW_TEST_HOST=10.200.0.2 TW_TEST_LISTEN_NETNS="/run/netns/$b" \
		CK_DEFAULT_TIMEOUT=120 \
		"$build/tests/$suite" >"$log" 2>&1; then
		echo "netns-check: $suite (${case:-all}): $(grep -h '^[0-9]*%' "$log") ($(($(date +%s) - t0)) s)"
	else
		echo "netns-check: $suite (${case:-all}): FAILED ($(($(date +%s) - t0)) s)"
		tail -20 "$log"
		status=1
	fi
}

if [ -n "${TW_NETNS_CASES:-}" ]; then
	for s in check_tcp check_tls check_ws check_faults; do run "$s" "$TW_NETNS_CASES"; done
else
	run check_tcp echo
	run check_tcp errors "peer_closes_mid_message peer_address_kept_from_accept \
		close_after_write write_to_reset_peer"
	run check_tls echo
	run check_tls close "close_right_after_write close_with_full_queue \
		reset_before_handshake_named peer_ends_mid_message mid_message_counts \
		close_notify_with_data"
	run check_ws echo
	run check_ws wire "peer_closes_mid_message reset_before_upgrade_named data_after_close \
		ping_pong_close"
	run check_close ""
	run check_faults ""
fi

# The link really carried MTU-sized packets: bytes per packet on it.
ip -n "$a" -s link show "$va" | awk -v dev="$va" '
	/RX:/ { getline; rxb = $1; rxp = $2 }
	/TX:/ { getline; txb = $1; txp = $2 }
	END {
		p = rxp + txp
		printf "netns-check: %s carried %d packets, %.0f bytes each on average\n", dev, p, p ? (rxb + txb) / p : 0
		if (p == 0 || (rxb + txb) / p > 1514) exit 1
	}' || { echo "netns-check: packets larger than the MTU crossed the link" >&2; status=1; }
exit $status
