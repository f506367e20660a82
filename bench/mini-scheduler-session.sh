#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
# A user's Python session against tw-mini-scheduler with 4 real `dask
# worker` processes (Debian's python3-distributed), printed as the
# interactive transcript, over tcp, tls and ws (issue 16's first "must
# show" item); every claim of the transcript is asserted, and the exit
# status is nonzero when one fails (bench/mini_scheduler_session.py).
#   bench/mini-scheduler-session.sh BUILD_DIR [--transport tcp|tls|ws]...
#       [--ttl SECONDS (120)] [--mib 512] [--keys 100000] [--guard SECONDS]
# TLS certificates are made at run time; everything runs niced in a
# scratch directory (workers write dask-worker-space there), which is
# removed at the end, and every process it starts is killed, on failure too.
#   bench/mini-scheduler-session.sh BUILD_DIR --break [--transport tcp|tls|ws]
#       [--case NAME]...
# runs the cases of bench/mini_scheduler_session_break.py instead: what a
# user might do to break the scheduler, each beside what Dask does.
set -e
build=${1:?usage: mini-scheduler-session.sh BUILD_DIR [--transport tcp|tls|ws]... [--ttl S]}
shift
build=$(cd "$build" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
[ -x "$build/examples/tw-mini-scheduler" ] || { echo "no $build/examples/tw-mini-scheduler: build first" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$here/../scripts/make-test-certs.sh" "$tmp/certs" >/dev/null
cd "$tmp"
echo "# $(date -u '+%Y-%m-%d %H:%M:%S') UTC, taskwire $(git -C "$here" describe --always --dirty 2>/dev/null || echo '?'), $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)"
script=mini_scheduler_session.py
if [ "$1" = --break ]; then # the break cases instead (mini_scheduler_session_break.py)
	script=mini_scheduler_session_break.py
	shift
fi
# In the background, so that a signal to this script reaches the session
# (which then kills what it started) instead of only this shell.
nice /usr/bin/python3 "$here/$script" "$build/examples/tw-mini-scheduler" "$tmp/certs" "$@" &
pid=$!
trap 'kill -TERM "$pid" 2>/dev/null' INT TERM HUP
rc=0
wait "$pid" || rc=$?
while kill -0 "$pid" 2>/dev/null; do wait "$pid" || rc=$?; done
exit "$rc"
