#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""Write the seed corpora of tests/fuzz/fuzz_ws_codec.c and
fuzz_ws_upgrade.c into corpus/ws_codec/ and corpus/ws_upgrade/.

ws_codec files: one setup byte (bit 0: client role; bits 1-2: message
limit default/64/1000/70000; bits 3-4: fragments limit default/1/3/16;
bit 7: script mode), then a stream of frames: valid shapes, and the bad
inputs of WebSocket bugs other projects shipped (64-bit lengths that overflow,
16-bit lengths read as signed, control frames over 125 bytes or between
fragments, reassembled messages past the limit, frames after CLOSE; RFC 6455
section 5) and the Autobahn test suite's cases 1.x-7.x. Client frames are
masked with 37 fa 21 3d (RFC 6455 section 5.7). ws_upgrade files: one setup
byte (bit 0: client; bits 1-2: header bytes default/64/256/1024; bits 3-4:
fields default/1/5/20), then a request (server) or a response (client with
RFC 6455's example nonce). Run it from anywhere; it rewrites the files it
owns and leaves others (crash reproducers added by hand) alone.
"""
import os
import struct

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")
KEY = bytes.fromhex("37fa213d")

SERVER, CLIENT = 0, 1


def setup(role=SERVER, msg=0, frags=0, script=False):
    return bytes([role | msg << 1 | frags << 3 | (0x80 if script else 0)])


def frame(op, payload=b"", fin=True, mask=True, rsv=0, length=None):
    n = len(payload) if length is None else length
    b0 = (0x80 if fin else 0) | rsv << 4 | op
    m = 0x80 if mask else 0
    if n <= 125:
        head = bytes([b0, m | n])
    elif n <= 0xFFFF:
        head = bytes([b0, m | 126]) + struct.pack(">H", n)
    else:
        head = bytes([b0, m | 127]) + struct.pack(">Q", n)
    if not mask:
        return head + payload
    return head + KEY + bytes(c ^ KEY[i % 4] for i, c in enumerate(payload))


def h(hexstr):
    return bytes.fromhex(hexstr.replace(" ", ""))


def close(code, reason=b"", mask=True):
    return frame(8, struct.pack(">H", code) + reason, mask=mask)


C = CLIENT
CODEC = {
    # valid, both roles
    "valid-hello-masked": setup() + h("82 85 37 fa 21 3d 7f 9f 4d 51 58"),
    "valid-hello-unmasked": setup(C) + h("82 05 48 65 6c 6c 6f"),
    "valid-empty": setup() + frame(2) + frame(2, b"x"),
    "valid-16bit": setup(C) + frame(2, bytes(range(256)) * 2, mask=False),
    "valid-non-minimal": setup() + h("82 fe 00 05 37 fa 21 3d 5f 9f 4d 51 58")
    + h("82 ff 00 00 00 00 00 00 00 05 37 fa 21 3d 5f 9f 4d 51 58"),
    "valid-fragments-ping": setup()
    + h("02 85 37 fa 21 3d 5f 9f 4d 51 58 89 80 37 fa 21 3d 80 85 37 fa 21 3d 40 95 53 51 53"),
    "valid-fragments-empty": setup() + frame(2, fin=False) + frame(0, fin=False) + frame(0),
    "valid-control": setup(C) + frame(9, b"ping", mask=False) + frame(10, mask=False)
    + frame(9, b"\x01" * 125, mask=False),
    "valid-close-3000": setup() + h("88 82 37 fa 21 3d 3c 42"),
    "valid-close-reason": setup(C) + close(1000, "bye é".encode(), mask=False),
    "valid-close-empty": setup() + frame(8),
    "valid-close-then-text": setup() + h("88 82 37 fa 21 3d 34 12 81 85 37 fa 21 3d 5f 9f 4d 51 58"),
    "valid-at-limit": setup(msg=1) + frame(2, b"a" * 40, fin=False) + frame(0, b"b" * 24),
    "valid-frags-limit": setup(frags=2) + frame(2, b"a", fin=False) + frame(0, fin=False) + frame(0),
    # bad
    "bad-rsv1": setup() + h("c2 80 37 fa 21 3d"),
    "bad-3.1-text-rsv": setup() + h("91 8d 37 fa 21 3d 7f 9f 4d 51 58 d6 01 4a 58 88 4d 59 16"),
    "bad-3.7-close-rsv": setup() + h("f8 82 37 fa 21 3d 34 12"),
    "bad-4.1.1-opcode-3": setup() + h("83 80 37 fa 21 3d"),
    "bad-4.2-opcode-11": setup(C) + frame(2, b"ok", mask=False) + frame(11, mask=False),
    "bad-5.1-fragmented-ping": setup() + h("09 82 37 fa 21 3d 56 98 80 82 37 fa 21 3d 54 9e"),
    "bad-2.5-ping-126": setup() + h("89 fe 00 7e 37 fa 21 3d") + h("c9 04 df c3") * 31 + h("c9 04"),
    "bad-bh27-close-126": setup() + frame(8, b"\x03\xe8" + b"r" * 124),
    "bad-bh23-len-2-63": setup() + h("82 ff 80 00 00 00 00 00 00 00 37 fa 21 3d"),
    "bad-bh23-len-max": setup() + h("82 ff ff ff ff ff ff ff ff ff 37 fa 21 3d 41"),
    "bad-bh24-1gib": setup(msg=3) + h("82 ff 00 00 00 00 40 00 00 00 37 fa 21 3d 41"),
    "bad-bh29-sum": setup(msg=1) + frame(2, b"a" * 40, fin=False) + frame(0, b"b" * 25),
    "bad-frags": setup(frags=2) + b"".join(frame(2 if i == 0 else 0, b"x", fin=False) for i in range(4)),
    "bad-bh35-unmasked": setup() + h("82 03 61 62 63"),
    "bad-bh35-masked-server": setup(C) + h("82 83 37 fa 21 3d 56 98 42"),
    "bad-5.9-stray-continuation": setup()
    + h("80 89 37 fa 21 3d 51 88 40 5a 5a 9f 4f 49 06 81 8d 37 fa 21 3d 7f 9f 4d 51 58 d6 01 4a 58 88 4d 59 16"),
    "bad-new-inside-fragmented": setup() + frame(2, b"a", fin=False) + frame(2, b"b"),
    "bad-bh37-text": setup()
    + h("81 94 37 fa 21 3d f9 40 c0 80 8e 35 a2 f3 8b 34 94 d0 97 7a 44 59 5e 8e 44 59"),
    "bad-7.3.2-close-1-byte": setup() + h("88 81 37 fa 21 3d 34"),
    "bad-7.9-close-1005": setup() + h("88 82 37 fa 21 3d 34 17"),
    "bad-bh36-close-999": setup() + h("88 82 37 fa 21 3d 34 1d"),
    "bad-bh36-reason-utf8": setup()
    + h("88 96 37 fa 21 3d 34 12 ef 87 d6 47 98 f2 b4 34 9d f3 82 17 81 bd 52 9e 48 49 52 9e"),
    "bad-close-5000": setup(C) + close(5000, mask=False),
    # script mode: op byte, key, length byte, payload
    "script-data-ping-close": setup(script=True)
    + bytes([0x04]) + KEY + bytes([5]) + b"hello"
    + bytes([0x01]) + KEY + bytes([3]) + b"abc"
    + bytes([0x03]) + KEY + bytes([2]) + h("03 e8") + b"ok",
    "script-fragments": setup(C, script=True)
    + bytes([0x00]) + KEY + bytes([7]) + b"fragone"
    + bytes([0x02]) + KEY + bytes([0])
    + bytes([0x04]) + KEY + bytes([3]) + b"end",
    "script-big": setup(script=True) + bytes([0x24]) + KEY + bytes([3]) + b"xyz",
    "script-wrong-mask": setup(script=True) + bytes([0xc4]) + KEY + bytes([2]) + b"hi",
}

REQ = (b"GET / HTTP/1.1\r\nHost: 127.0.0.1:8765\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
       b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")
RESP = (b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n")
S0 = bytes([0])
C0 = bytes([1])

UPGRADE = {
    "req-autobahn": S0 + REQ,
    "req-frames-after": S0 + REQ + h("82 83 37 fa 21 3d 56 98 42"),
    "req-lowercase-lf": S0 + REQ.lower().replace(b"\r\n", b"\n").replace(b"get / http/1.1", b"GET / HTTP/1.1")
    .replace(b"dghlihnhbxbszsbub25jzq==", b"dGhlIHNhbXBsZSBub25jZQ=="),
    "req-version-8": S0 + REQ.replace(b"Version: 13", b"Version: 8"),
    "req-bad-key": S0 + REQ.replace(b"dGhlIHNhbXBsZSBub25jZQ==", b"!!!!!!!!!!!!!!!!!!!!!!=="),
    "req-noncanonical-key": S0 + REQ.replace(b"dGhlIHNhbXBsZSBub25jZQ==", b"dGhlIHNhbXBsZSBub25jZR=="),
    "req-path": S0 + REQ.replace(b"GET / ", b"GET /x "),
    "req-origin-other": S0 + REQ.replace(b"\r\n\r\n", b"\r\nOrigin: http://evil.example\r\n\r\n"),
    "req-origin-same": S0 + REQ.replace(b"\r\n\r\n", b"\r\nOrigin: http://127.0.0.1:3000\r\n\r\n"),
    "req-post": S0 + REQ.replace(b"GET", b"POST"),
    "req-many-fields": bytes([3 << 3]) + REQ.replace(b"\r\n\r\n", b"\r\n" + b"X: y\r\n" * 30 + b"\r\n"),
    "req-too-big": bytes([2 << 1]) + REQ.replace(b"\r\n\r\n", b"\r\nX: " + b"a" * 300 + b"\r\n\r\n"),
    "req-folded": S0 + REQ.replace(b"\r\n\r\n", b"\r\nX: a\r\n b\r\n\r\n"),
    "resp-101": C0 + RESP,
    "resp-101-frames": C0 + RESP + h("82 03 61 62 63 89 00"),
    "resp-101-lower": C0 + RESP.lower().replace(b"s3ppLmbitxaq9kygzzhzrbk+xoo=".lower(), b"s3pPLMBiTxaQ9kYGzzhZRbK+xOo=")
    .replace(b"http/1.1", b"HTTP/1.1"),
    "resp-bad-accept": C0 + RESP.replace(b"s3pPLMBiTxaQ9kYGzzhZRbK+xOo=", b"AAAAAAAAAAAAAAAAAAAAAAAAAAA="),
    "resp-extension": C0 + RESP.replace(b"\r\n\r\n", b"\r\nSec-WebSocket-Extensions: permessage-deflate\r\n\r\n"),
    "resp-protocol": C0 + RESP.replace(b"\r\n\r\n", b"\r\nSec-WebSocket-Protocol: chat\r\n\r\n"),
    "resp-200": C0 + b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi",
    "resp-http10": C0 + RESP.replace(b"HTTP/1.1", b"HTTP/1.0"),
    "resp-too-many": bytes([1 | 2 << 3]) + RESP,
}


def write(sub, files):
    d = os.path.join(HERE, sub)
    os.makedirs(d, exist_ok=True)
    for name, data in files.items():
        with open(os.path.join(d, name), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    write("ws_codec", CODEC)
    write("ws_upgrade", UPGRADE)
