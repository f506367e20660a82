# SPDX-License-Identifier: BSD-3-Clause
"""A Dask comm client for tests/check_dask.c: talks to a comm-level echo
server (one that writes back every message it reads, like
examples/tw-echo-server) and checks what comes back.

    /usr/bin/python3 dask_client.py tcp://127.0.0.1:PORT

Connects with distributed.comm.connect (which runs the handshake), then
writes each message below and reads its echo: inline bytes, out-of-band
bytes of 0, 3 and 20,000 bytes and of 70 MiB (which Dask splits into
64 MiB shards), and nested messages with several out-of-band payloads.
The 70 MiB payload is byte i = i % 251, which the C side checks too.
Pin the codec with DASK_DISTRIBUTED__COMM__COMPRESSION. Prints one line
per message; exits 0 when every echo matched, 1 otherwise.
"""
import asyncio
import sys

from distributed.comm import connect
from distributed.protocol import to_serialize

from peer_common import pattern

BIG = 70 << 20
def plain(obj):
    """The value a message stands for: payloads as bytes, lists as lists
    (Dask reads msgpack arrays as tuples)."""
    if isinstance(obj, dict):
        return {k: plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [plain(v) for v in obj]
    if type(obj).__name__ == "Serialize":
        return plain(obj.data)
    if isinstance(obj, (bytearray, memoryview)):
        return bytes(obj)
    return obj


def messages():
    yield "inline bytes", {"op": "echo", "data": b"taskwire \x00\xff inline"}
    for n in (0, 3, 20_000):
        yield f"out-of-band {n} B", {"op": "echo", "data": to_serialize(pattern(n, 7))}
    yield "out-of-band 70 MiB", {"op": "echo", "data": to_serialize(pattern(BIG))}
    yield "nested payloads", {
        "op": "nested",
        "a": [to_serialize(pattern(5, 1)), {"b": to_serialize(pattern(30_000, 2))}],
        "c": {"d": [1, "two", 3.5, None, to_serialize(b"")], "e": {"f": to_serialize(b"x")}},
        "g": "text",
    }
    yield "many payloads", {"op": "many", "xs": [to_serialize(pattern(i, i)) for i in range(40)]}


def describe(v):
    if isinstance(v, bytes) and len(v) > 64:
        return f"<{len(v)} bytes>"
    return repr(v)[:200]


async def run(addr):
    comm = await connect(addr)
    failures = 0
    opts = comm.handshake_options
    remote = comm.remote_info
    if opts.get("pickle-protocol") != 5 or tuple(remote.get("python", ())) != (3, 11, 2):
        print(f"FAIL handshake: options {opts}, remote {remote}")
        failures += 1
    else:
        print(f"ok handshake: compression {opts.get('compression')}")
    for name, msg in messages():
        want = plain(msg)
        await comm.write(msg)
        got = plain(await comm.read())
        if got != want:
            print(f"FAIL {name}: got {describe(got)}")
            failures += 1
        else:
            print(f"ok {name}")
    await comm.close()
    return failures


def main():
    failures = asyncio.run(asyncio.wait_for(run(sys.argv[1]), 120))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
