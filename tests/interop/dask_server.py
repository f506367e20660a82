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
  get_data  Worker.get_data's exchange (distributed/worker.py): for keys
            containing "busy" it returns {"status": "busy"}; otherwise it
            writes {"status": "OK", "data": {key: key * 2, ...}} itself,
            then reads the next message on the comm and asserts it is
            "OK" (Dask's get_data_from_worker writes it) before the comm
            serves another request.
Pin the codec with DASK_DISTRIBUTED__COMM__COMPRESSION (zstd, lz4, False).
"""
import asyncio
import signal
import sys

from distributed.core import Server, Status
from distributed.protocol import to_serialize


def fail():
    raise RuntimeError("taskwire test error")


def echo_oob(data=None):
    return to_serialize(data)


async def get_data(comm, keys=(), who=None, max_connections=None):
    if any("busy" in k for k in keys):
        return {"status": "busy"}
    data = {k: to_serialize((k * 2).encode()) for k in keys}
    await comm.write({"status": "OK", "data": data})
    response = await comm.read()
    assert response == "OK", response
    return Status.dont_reply


async def main():
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    server = Server(
        {"raise": fail, "echo_oob": echo_oob, "get_data": get_data}, deserialize=True
    )
    await server.listen("tcp://127.0.0.1:0")
    print("listening on", server.address, flush=True)
    await stop.wait()
    await server.close()


if __name__ == "__main__":
    asyncio.run(main())
    sys.exit(0)
