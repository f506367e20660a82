# SPDX-License-Identifier: BSD-3-Clause
"""What the Python peers in tests/interop share (imported from the
script's own folder, which Python puts first on sys.path): the byte
pattern the C side writes and checks (tests/support/pattern.h), and the
command line of the WebSocket clients."""
import asyncio
import sys

PERIOD = bytes(range(251))


def pattern(n, seed=0):
    """n bytes, byte i = (i + seed) % 251, as ts_fill/ts_check."""
    seed %= 251
    period = PERIOD[seed:] + PERIOD[:seed]
    return (period * (n // 251 + 1))[:n]


def run_client(main, doc):
    """Exit with asyncio.run(main(ADDR [, CA, CERT, KEY])) from the command
    line; print doc and exit 2 on any other number of arguments."""
    if len(sys.argv) not in (2, 5):
        print(doc)
        sys.exit(2)
    sys.exit(asyncio.run(main(*sys.argv[1:])))
