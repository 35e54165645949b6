"""A service client in a process of its own, for test_service.py: attaches, then streams sequence-checked requests.

    python3 service_client.py SOCKET SERVICE COUNT [WINDOW]

Prints ``id N`` once attached, ``done K`` every 100 round trips, and ``ok COUNT`` at the end (COUNT 0:
for ever, until killed). Request ``k`` carries ``k`` in its first u32 word, the client's id in the second
and a pattern of ``k`` and the id in every further byte; the reply must be the same bytes with the first
word ``k + 1`` (what the peer's ``service-server`` answers), in order. Any other reply exits with status 3.
"""

from __future__ import annotations

import struct
import sys

import meshd


def request(k: int, ident: int, size: int) -> bytes:
    head = struct.pack("<II", k & 0xFFFFFFFF, ident)
    body = bytes((k * 7 + ident + i) & 0xFF for i in range(size - len(head)))
    return head + body


def expected(k: int, ident: int, size: int) -> bytes:
    msg = request(k, ident, size)
    return struct.pack("<I", (k + 1) & 0xFFFFFFFF) + msg[4:]


def main() -> int:
    socket, name, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    window = int(sys.argv[4]) if len(sys.argv) > 4 else 4
    svc = meshd.Service.connect(name, socket, timeout=30)
    print(f"id {svc.id}", flush=True)
    size = min(svc.msg_size, svc.reply_size)
    sent = got = 0
    while count == 0 or got < count:
        while sent - got < window and (count == 0 or sent < count):
            svc.send(request(sent, svc.id, svc.msg_size), timeout=30)
            sent += 1
        reply = svc.recv(timeout=30)
        want = expected(got, svc.id, svc.msg_size)
        if reply[:size] != want[:size]:
            print(f"bad reply {got}: {reply[:16].hex()} expected {want[:16].hex()}", flush=True)
            return 3
        got += 1
        if got % 100 == 0:
            print(f"done {got}", flush=True)
    svc.close()
    print(f"ok {got}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
