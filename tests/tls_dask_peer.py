#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""A Dask client over TLS against a taskwire comm-level echo server
(tests/check_tls_dask.c): distributed.comm.connect with the connection
arguments of distributed.security.Security (mutual TLS), then a few
messages, each checked against what comes back, among them 20 MB of
out-of-band bytes. Exits 0 and prints "OK n" when every echo matched.

    tls_dask_peer.py tls://127.0.0.1:PORT CA CERT KEY
"""
import asyncio
import os
import sys

from distributed.comm import connect
from distributed.protocol import to_serialize
from distributed.security import Security


def messages():
    small = bytes(range(256)) * 4
    big = os.urandom(20_000_000)
    return [
        ({"op": "hello", "n": 1}, {"op": "hello", "n": 1}),
        ({"op": "nested", "x": [1, 2.5, "é", None, True], "m": {"k": b"raw"}},
         {"op": "nested", "x": [1, 2.5, "é", None, True], "m": {"k": b"raw"}}),
        ({"op": "small", "data": to_serialize(small)}, {"op": "small", "data": small}),
        ({"op": "big", "data": to_serialize(big)}, {"op": "big", "data": big}),
        ([{"op": "a"}, {"op": "b", "data": to_serialize(b"xyz")}],
         [{"op": "a"}, {"op": "b", "data": b"xyz"}]),
    ]


def lists(v):
    """Dask's msgpack reads arrays as tuples: compare them as lists."""
    if isinstance(v, (list, tuple)):
        return [lists(x) for x in v]
    if isinstance(v, dict):
        return {k: lists(x) for k, x in v.items()}
    return v


def describe(v):
    if isinstance(v, (bytes, bytearray, memoryview)):
        return "%s of %d bytes" % (type(v).__name__, len(v))
    if isinstance(v, dict):
        return "{%s}" % ", ".join("%r: %s" % (k, describe(x)) for k, x in v.items())
    if isinstance(v, list):
        return "[%s]" % ", ".join(describe(x) for x in v)
    return repr(v)


async def main(addr, ca, cert, key):
    sec = Security(tls_ca_file=ca, tls_client_cert=cert, tls_client_key=key,
                   require_encryption=True)
    comm = await asyncio.wait_for(connect(addr, **sec.get_connection_args("client")), 30)
    n = 0
    for msg, want in messages():
        await comm.write(msg)
        got = await asyncio.wait_for(comm.read(), 60)
        if lists(got) != want:
            print("MISMATCH in message %d: got %s, want %s" % (n, describe(got), describe(want)))
            await comm.close()
            return 1
        n += 1
    await comm.close()
    print("OK", n)
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 5:
        print(__doc__)
        sys.exit(2)
    sys.exit(asyncio.run(main(*sys.argv[1:5])))
