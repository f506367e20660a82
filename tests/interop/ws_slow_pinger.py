# SPDX-License-Identifier: BSD-3-Clause
"""A tornado WebSocket client (Dask's ws comm is tornado's) that pings
often and reads slowly: it sends one taskwire message ("go"), then reads
N messages of one SIZE-byte frame (byte i of message k is
((k % 251 + i) * 131 + 7) % 251) with a pause after each, so the server's
writes block while pongs are due. Prints OK, or BAD and why.

usage: ws_slow_pinger.py URI [CA CERT KEY] N SIZE PING_S DELAY_S
"""
import asyncio
import ssl
import sys
import time

from tornado.httpclient import HTTPRequest
from tornado.websocket import websocket_connect

args = sys.argv[1:]
uri = args.pop(0)
opts = None
if uri.startswith("wss"):
    ca, cert, key = args[:3]
    args = args[3:]
    opts = ssl.create_default_context(cafile=ca)
    opts.load_cert_chain(cert, key)
    opts.check_hostname = False
n, size, ping, delay = int(args[0]), int(args[1]), float(args[2]), float(args[3])
P = bytes(((i * 131 + 7) % 251) for i in range(size + 260))
COUNT = (1).to_bytes(8, "little")


async def main():
    origin = uri.replace("wss", "https").replace("ws", "http")
    req = HTTPRequest(uri, ssl_options=opts, headers={"Origin": origin})
    conn = await websocket_connect(req, ping_interval=ping, ping_timeout=60,
                                   max_message_size=1 << 31)
    await conn.write_message(COUNT, binary=True)
    await conn.write_message(b"go", binary=True)
    t0 = time.monotonic()
    for k in range(n):
        c = await conn.read_message()
        if c != COUNT:
            print("BAD count of message %d: %r" % (k, c[:16] if c else c))
            return 3
        f = await conn.read_message()
        if f is None or f != P[k % 251:k % 251 + size]:
            print("BAD frame of message %d: %s bytes" % (k, None if f is None else len(f)))
            return 3
        await asyncio.sleep(delay)
    print("OK %d messages of %d bytes in %.1f s" % (n, size, time.monotonic() - t0))
    conn.close()
    return 0


sys.exit(asyncio.run(main()))
