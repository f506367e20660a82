#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""A Python `websockets` echo server (Debian's 10.4, asyncio API) for a
taskwire client (tests/check_ws_peers.c): every message is sent back as
it came, so a taskwire message (count, then one message per frame) comes
back whole. It pings every 50 ms (a client that does not answer is closed
after 10 s), takes messages of any size, and prints one line per
connection when it ends: "closed code=C messages=M".

    ws_echo_server.py                   prints "listening on ws://127.0.0.1:PORT"
    ws_echo_server.py CA CERT KEY       wss, client certificates required
"""
import asyncio
import ssl
import sys

import websockets


async def echo(ws):
    n = 0
    try:
        async for msg in ws:
            await ws.send(msg)
            n += 1
    except websockets.ConnectionClosed:
        pass
    print("closed code=%s messages=%d" % (ws.close_code, n), flush=True)


def tls_context(ca, cert, key):
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=ca)
    ctx.load_cert_chain(cert, key)
    ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


async def main(ca=None, cert=None, key=None):
    ctx = tls_context(ca, cert, key) if ca else None
    async with websockets.serve(echo, "127.0.0.1", 0, ssl=ctx, max_size=None,
                                ping_interval=0.05, ping_timeout=10) as server:
        port = server.sockets[0].getsockname()[1]
        print("listening on %s://127.0.0.1:%d" % ("wss" if ctx else "ws", port), flush=True)
        await asyncio.Future()


if __name__ == "__main__":
    if len(sys.argv) not in (1, 4):
        print(__doc__)
        sys.exit(2)
    asyncio.run(main(*sys.argv[1:]))
