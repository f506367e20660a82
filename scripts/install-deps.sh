#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
# Install the Debian packages taskwire needs to build, test and benchmark;
# the python3-* packages are the real Dask peers the interop tests run,
# libzmq3-dev and libnng-dev the benchmarks' baselines; abigail-tools runs
# make abi-check, doxygen makes the reference manual (man pages, HTML), gnuplot-nox
# the plots of make bench.
# Idempotent: quiet and quick when everything is present. Run as root.
set -e
PKGS="build-essential autoconf automake libtool pkg-config
libevent-dev libssl-dev libzstd-dev liblz4-dev libmsgpack-dev check
clang libclang-rt-14-dev valgrind clang-format python3 openssl
python3-distributed python3-msgpack python3-zstandard python3-lz4 python3-websockets
python3-numpy
libzmq3-dev libnng-dev
abigail-tools doxygen gnuplot-nox"

missing=""
for p in $PKGS; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
		missing="$missing $p"
done
[ -z "$missing" ] && exit 0

echo "install-deps: installing$missing (this can take a few minutes)"
if [ "$(id -u)" != 0 ]; then
	echo "install-deps: run as root (or: sudo $0)" >&2
	exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# shellcheck disable=SC2086
apt-get install -y -qq --no-install-recommends $missing >/dev/null
