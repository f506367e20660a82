#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""A Python `websockets` client (Debian's 10.4, asyncio API) that speaks
the taskwire WebSocket mapping by hand to a taskwire comm-level echo
server (tests/check_ws_peers.c): a message of N frames is an 8-byte
little-endian N, then N binary messages. One frame goes out as a
fragmented message (an async iterator of chunks, which websockets sends
as fragments) with a ping between fragments, whose pong must come back
while the message is still open; more pings between messages. The client
offers permessage-deflate (websockets' default), which taskwire must
decline. Every echo is checked byte for byte; exits 0 and prints "OK n"
when all matched and the close was a clean 1000.

    ws_client.py ws://127.0.0.1:PORT
    ws_client.py wss://127.0.0.1:PORT CA CERT KEY
"""
import asyncio
import ssl
import struct

import websockets

from peer_common import pattern, run_client

# (frames, index of the frame sent fragmented or None)
MESSAGES = [
    ([b"hello", pattern(300_000, 1), b""], 1),
    ([pattern(20 << 20, 2)], None),
    ([pattern(i * 37 % 1000, i) for i in range(50)], 7),
]


async def fragments(ws, data, size):
    for i in range(0, len(data), size):
        if i:
            pong = await ws.ping(b"mid %d" % i)
            await asyncio.wait_for(pong, 10)
        yield data[i:i + size]


async def send_msg(ws, frames, fragmented):
    await ws.send(struct.pack("<Q", len(frames)))
    for j, frame in enumerate(frames):
        if j == fragmented:
            await ws.send(fragments(ws, frame, 65536 if len(frame) > 65536 else 7))
        else:
            await ws.send(frame)


async def recv_msg(ws):
    head = await ws.recv()
    if not isinstance(head, bytes) or len(head) != 8:
        raise ValueError("bad count message %r" % head[:16])
    n = struct.unpack("<Q", head)[0]
    return [await ws.recv() for _ in range(n)]


def tls_context(ca, cert, key):
    ctx = ssl.create_default_context(cafile=ca)
    ctx.load_cert_chain(cert, key)
    ctx.check_hostname = False
    return ctx


async def main(uri, ca=None, cert=None, key=None):
    ctx = tls_context(ca, cert, key) if uri.startswith("wss://") else None
    async with websockets.connect(uri, ssl=ctx, max_size=None, ping_interval=None) as ws:
        if ws.extensions:
            print("FAIL extensions accepted:", ws.extensions)
            return 1
        for k, (frames, fragmented) in enumerate(MESSAGES):
            pong = await ws.ping(b"before %d" % k)
            await asyncio.wait_for(pong, 10)
            await send_msg(ws, frames, fragmented)
            got = await asyncio.wait_for(recv_msg(ws), 60)
            if got != frames:
                print("FAIL message %d: %d frames back, lengths %s" %
                      (k, len(got), [len(f) for f in got][:8]))
                return 1
            print("ok message %d" % k, flush=True)
        await ws.close()
        if ws.close_code != 1000:
            print("FAIL close code", ws.close_code)
            return 1
    print("OK", len(MESSAGES))
    return 0


if __name__ == "__main__":
    run_client(main, __doc__)
