# SPDX-License-Identifier: BSD-3-Clause
"""A small Dask RPC server for tests/check_dask.c.

    /usr/bin/python3 dask_server.py

Listens on tcp://127.0.0.1 (ephemeral port) with
distributed.core.Server(handlers, deserialize=True), prints
"listening on tcp://127.0.0.1:PORT" and serves until SIGTERM. Besides the
built-in ops (identity, echo, close) it has:
  raise     raises RuntimeError("taskwire test error"), so the reply is an
            uncaught-error map;
  echo_oob  returns `data` wrapped in to_serialize, so the reply carries it
            out of band (split into 64 MiB shards, and compressed when the
            handshake agreed on a codec).
Pin the codec with DASK_DISTRIBUTED__COMM__COMPRESSION (zstd, lz4, False).
"""
import asyncio
import signal
import sys

from distributed.core import Server
from distributed.protocol import to_serialize


def fail():
    raise RuntimeError("taskwire test error")


def echo_oob(data=None):
    return to_serialize(data)


async def main():
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    server = Server({"raise": fail, "echo_oob": echo_oob}, deserialize=True)
    await server.listen("tcp://127.0.0.1:0")
    print("listening on", server.address, flush=True)
    await stop.wait()
    await server.close()


if __name__ == "__main__":
    asyncio.run(main())
    sys.exit(0)
