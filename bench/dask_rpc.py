#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""Dask's side of bench/rpc-bench.sh: COUNT sequential rpc echo calls of a
10-byte payload against a distributed.core.Server.
  dask_rpc.py server        print "listening on ADDR", serve
  dask_rpc.py client ADDR COUNT [SIZE]   (SIZE bytes instead of 10; bench/report.sh)
"""
import asyncio
import sys
import time

from distributed.core import Server, rpc


async def serve():
    s = Server({})
    await s.listen("tcp://127.0.0.1:0")
    print("listening on", s.address, flush=True)
    await asyncio.Event().wait()


async def client(addr, count, size=10):
    lat = []
    data = (b"0123456789" * (size // 10 + 1))[:size]
    async with rpc(addr) as r:
        await r.echo(data=data)
        t0 = time.perf_counter()
        for _ in range(count):
            t = time.perf_counter()
            await r.echo(data=data)
            lat.append((time.perf_counter() - t) * 1e6)
        secs = time.perf_counter() - t0
    lat.sort()
    print("dask rpc: %.0f round trips/s, p50 %.1f us, p99 %.1f us, %.1f MB/s payload each way"
          % (count / secs, lat[len(lat) // 2], lat[len(lat) * 99 // 100],
             size * count / secs / 1e6), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "server":
        asyncio.run(serve())
    else:
        asyncio.run(client(sys.argv[2], int(sys.argv[3]),
                           int(sys.argv[4]) if len(sys.argv) > 4 else 10))
