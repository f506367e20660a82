#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""A Python Dask client over ws:// or wss:// (distributed.comm.connect,
Debian's python3-distributed) against a taskwire comm-level echo server
(tests/check_ws_peers.c): the handshake, then out-of-band bytes of 0, 3,
20,000 bytes and 70 MiB (which Dask splits into 8 MiB shards on ws, each
its own WebSocket message), byte i of each = (i + seed) % 251, each echo
checked. Exits 0 and prints "OK n" when all matched.

    ws_dask_client.py ws://127.0.0.1:PORT
    ws_dask_client.py wss://127.0.0.1:PORT CA CERT KEY
"""
import asyncio

from distributed.comm import connect
from distributed.protocol import to_serialize
from distributed.security import Security

from peer_common import pattern, run_client

SIZES = [0, 3, 20_000, 70 << 20]


def data_of(msg):
    data = msg["data"]
    if type(data).__name__ == "Serialize":
        data = data.data
    return bytes(data)


async def main(addr, ca=None, cert=None, key=None):
    args = {}
    if addr.startswith("wss://"):
        sec = Security(tls_ca_file=ca, tls_client_cert=cert, tls_client_key=key,
                       require_encryption=True)
        args = sec.get_connection_args("client")
    comm = await asyncio.wait_for(connect(addr, **args), 30)
    if comm.handshake_options.get("pickle-protocol") != 5:
        print("FAIL handshake", comm.handshake_options)
        return 1
    for k, n in enumerate(SIZES):
        want = pattern(n, k)
        await comm.write({"op": "echo", "seq": k, "data": to_serialize(want)})
        got = await asyncio.wait_for(comm.read(), 120)
        if got.get("seq") != k or data_of(got) != want:
            print("FAIL echo of %d bytes" % n)
            return 1
        print("ok %d bytes" % n, flush=True)
    await comm.close()
    print("OK", len(SIZES))
    return 0


if __name__ == "__main__":
    run_client(main, __doc__)
