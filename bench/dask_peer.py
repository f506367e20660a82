#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""Python side of bench/dask-memory.sh.

  dask_peer.py send ADDR MIB KIND   send {"op": "put", "data": <MIB MiB bytes>}
                                    (KIND: random or compressible), then close
  dask_peer.py recv [SCHEME]        print "listening on ADDR" (tcp or ws,
                                    127.0.0.1), receive one message like
                                    Dask does, print peak RSS
"""
import asyncio
import os
import sys

from distributed.comm import connect, listen
from distributed.protocol import to_serialize


def status_kib(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def payload(mib, kind):
    n = mib << 20
    if kind == "random":
        return os.urandom(n)
    # 4 random bits a byte everywhere: zstd and lz4 keep about half.
    return os.urandom(n).translate(bytes(i & 0x0F for i in range(256)))


async def send(addr, mib, kind):
    data = payload(mib, kind)
    comm = await connect(addr)
    await comm.write({"op": "put", "data": to_serialize(data)})
    await comm.close()


def loopback_only():
    """Dask's ws listener binds every interface: keep it on 127.0.0.1."""
    from tornado.httpserver import HTTPServer

    listen = HTTPServer.listen

    def on_loopback(self, port, address="127.0.0.1", **kwargs):
        return listen(self, port, address, **kwargs)

    HTTPServer.listen = on_loopback


async def recv(scheme="tcp"):
    if scheme == "ws":
        loopback_only()
    done = asyncio.Event()
    idle = status_kib("VmRSS")

    async def handler(comm):
        msg = await comm.read()
        size = len(msg["data"])
        peak = status_kib("VmHWM") - idle
        print(f"dask: payload {size / 2**20:.1f} MiB, peak RSS above idle "
              f"{peak / 1024:.1f} MiB = {peak * 1024 / size:.3f}x payload", flush=True)
        await comm.close()
        done.set()

    listener = listen(f"{scheme}://127.0.0.1:0", handler)
    await listener.start()
    print("listening on", listener.contact_address, flush=True)
    await done.wait()
    listener.stop()


if __name__ == "__main__":
    if sys.argv[1] == "send":
        asyncio.run(send(sys.argv[2], int(sys.argv[3]), sys.argv[4]))
    else:
        asyncio.run(recv(*sys.argv[2:3]))
