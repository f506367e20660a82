# SPDX-License-Identifier: BSD-3-Clause
"""A Python Dask peer for tests/check_handover.c, speaking as a real worker
or client does (distributed.comm.connect, the Dask handshake):

  stream ADDR           connection_stream, one {"op": "hello"} map, then
                        prints SENT and waits to be killed.
  register-worker ADDR  Dask's Worker._register_with_scheduler: writes
                        register-worker (reply: false), reads the one reply
                        map on the same comm, then uses that comm as its
                        stream both ways (handle_scheduler): writes
                        [keep-alive, worker-status-change], reads the
                        scheduler's batch, answers with close-stream.
  register-client ADDR  Client._ensure_connected: register-client (reply:
                        false), expects [{"op": "stream-start"}], then
                        writes a heartbeat-client map and reads the
                        scheduler's answer on the stream.
  read-batch ADDR       asks the server (take-batch, reply: false) to write
                        one batch of maps with out-of-band bytes payloads
                        (tw_batched_begin/commit) between plain maps
                        (tw_batched_send), checks every map and payload
                        in order, and answers [{"op": "got", "n": N}].
Prints "ALL OK <mode>" on success; any failure raises (exit status 1).
"""
import asyncio
import sys

from distributed.comm import connect
from distributed.comm.core import CommClosedError

from peer_common import pattern


async def stream(addr):
    comm = await connect(addr)
    await comm.write({"op": "connection_stream", "reply": False})
    await comm.write({"op": "hello", "n": 1})
    print("SENT", flush=True)
    await asyncio.sleep(3600)


async def register_worker(addr):
    comm = await connect(addr)
    await comm.write({"op": "register-worker", "reply": False,
                      "address": "tcp://127.0.0.1:1234", "status": "running",
                      "nthreads": 2, "name": "w1", "now": 0.0,
                      "resources": {}, "memory_limit": 1 << 30,
                      "local_directory": "/tmp", "services": {},
                      "nanny": None, "pid": 1, "versions": {}, "metrics": {},
                      "extra": {}, "server_id": "w1", "types": {},
                      "nbytes": {}, "stimulus_id": "s1"})
    reply = await comm.read()
    assert reply["status"] == "OK", reply
    assert reply["heartbeat-interval"] == 0.5, reply
    # the comm is now the worker's stream both ways (Dask's BatchedSend)
    await comm.write([{"op": "keep-alive"},
                      {"op": "worker-status-change", "status": "paused",
                       "stimulus_id": "s2"}])
    batch = await comm.read()
    # Dask's msgpack reads arrays as tuples (use_list=False)
    assert isinstance(batch, (list, tuple)), batch
    assert list(batch) == [{"op": "compute-task", "key": "x", "n": 2},
                           {"op": "free-keys", "keys": ("y",)}], batch
    await comm.write([{"op": "close-stream"}])
    try:
        extra = await comm.read()
        raise AssertionError("comm still open: %r" % (extra,))
    except CommClosedError:
        pass
    print("ALL OK register-worker", flush=True)


async def register_client(addr):
    comm = await connect(addr)
    await comm.write({"op": "register-client", "client": "Client-1",
                      "reply": False, "versions": {}})
    msg = await comm.read()
    assert list(msg) == [{"op": "stream-start"}], msg
    await comm.write([{"op": "heartbeat-client"}])
    msg = await comm.read()
    assert list(msg) == [{"op": "client-heartbeat-seen", "client": "Client-1"}], msg
    await comm.close()
    print("ALL OK register-client", flush=True)


SIZES = [1, 1000, 65536, 1 << 20, 7, 100]


async def read_batch(addr):
    comm = await connect(addr)
    await comm.write({"op": "take-batch", "reply": False})
    batch = await comm.read()
    assert isinstance(batch, (list, tuple)), type(batch)
    assert len(batch) == 2 * len(SIZES), len(batch)
    for i, size in enumerate(SIZES):
        data, plain = batch[2 * i], batch[2 * i + 1]
        assert data["op"] == "data" and data["i"] == i, data.keys()
        assert isinstance(data["value"], bytes), type(data["value"])
        assert data["value"] == pattern(size, i), (i, len(data["value"]))
        assert plain == {"op": "plain", "i": i}, plain
    await comm.write([{"op": "got", "n": len(batch)}])
    await comm.close()
    print("ALL OK read-batch", flush=True)


MODES = {"read-batch": read_batch, "stream": stream, "register-worker": register_worker,
         "register-client": register_client}

if __name__ == "__main__":
    asyncio.run(MODES[sys.argv[1]](sys.argv[2]))
