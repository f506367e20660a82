#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
# examples/tw-mini-scheduler against real Dask peers (issue 16): 4
# `dask worker` processes and a distributed.Client (Debian's
# python3-distributed, /usr/bin/python3) over tcp, tls and ws; the
# assertions are in tests/interop/mini_scheduler.py, which kills every
# process it starts, on failure too. Certificates are made at test time.
# Besides the rounds: a broadcast of large (relayed) values to 4 workers, a
# worker SIGKILLed in the middle of a gather's 48 MiB value (it stops itself
# there: TW_MINI_STOP_AFTER), and a scatter sent before any worker.
# The small-key round is 100,000 keys over tcp and 40,000 over tls and ws
# (80,000+ frames per message: past the old 65,536-frame default on every
# transport, at less than half the time). Run alone:
#   make check TESTS=tests/check_mini_scheduler.sh
# TW_MINI_TRANSPORTS="tcp" picks transports; TW_MINI_KEYS sets the round's
# size; TW_MINI_WRAP="valgrind --error-exitcode=9" runs the schedulers under
# a tool (each must exit 0).
# On a failure, the transport's whole output and every worker's stderr are
# kept in a new directory ${TMPDIR:-/tmp}/tw-mini-scheduler-failed.XXXXXX
# (named at the end of the output; a rerun does not overwrite it), and the
# tail of each worker's log is printed.
# With tcp: tests/interop/mini_scheduler_memory.py, a scheduler with
# --memory-limit 256M --receive-budget 64M --write-budget 32M (relay off):
# honest scatters and gathers of 1-64 MiB arrays are never ended, a client
# that never reads its 320 MiB gather is (TW_ENOMEM), and only it; then
# relay on, --pause-limit 2000: a client reading a relayed 320 MiB gather
# while both workers are stopped (SIGSTOP) for 4 s gets all of it, and one
# that never reads its relayed gather is ended (TW_ETIMEDOUT), and only it.
set -e
build=${TW_TOP_BUILDDIR:?} src=${TW_TOP_SRCDIR:?}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$src/scripts/make-test-certs.sh" "$tmp/certs" >/dev/null
# libtool runs the tool on the real binary, not on its wrapper script.
[ -n "$TW_MINI_WRAP" ] && export TW_MINI_WRAP="$build/libtool --mode=execute $TW_MINI_WRAP"
# run NAME CMD...: CMD with its output and the workers' logs in
# $tmp/logs-NAME, kept in a new directory when it fails (then exit).
run() {
	name=$1
	shift
	logs="$tmp/logs-$name"
	mkdir -p "$logs/workers"
	rc=0
	TW_MINI_LOGDIR="$logs/workers" "$@" >"$logs/output.log" 2>&1 || rc=$?
	cat "$logs/output.log"
	if [ $rc != 0 ]; then
		keep=$(mktemp -d "${TMPDIR:-/tmp}/tw-mini-scheduler-failed.XXXXXX")
		cp -R "$logs/." "$keep/"
		echo "check_mini_scheduler: $name failed (exit $rc); its output and the workers' logs: $keep"
		exit $rc
	fi
}
for t in ${TW_MINI_TRANSPORTS:-tcp tls ws}; do
	echo "check_mini_scheduler: $t"
	[ "$t" = tcp ] && keys=100000 || keys=40000
	run "$t" env TW_MINI_KEYS="${TW_MINI_KEYS:-$keys}" /usr/bin/python3 \
		"$src/tests/interop/mini_scheduler.py" "$build/examples/tw-mini-scheduler" "$t" \
		"$tmp/certs"
done
case " ${TW_MINI_TRANSPORTS:-tcp} " in *" tcp "*)
	echo "check_mini_scheduler: tcp with a memory limit"
	run memory /usr/bin/python3 "$src/tests/interop/mini_scheduler_memory.py" \
		"$build/examples/tw-mini-scheduler"
	echo "check_mini_scheduler: tcp with a memory limit, relay on"
	run memory-relay /usr/bin/python3 "$src/tests/interop/mini_scheduler_memory.py" \
		"$build/examples/tw-mini-scheduler" relay
	;;
esac
