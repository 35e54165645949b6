"""Streams numbered requests to the scale program and checks every reply: none lost, none repeated,
none out of order, each scaled by 2 (version 1) or 3 (version 2), and never 2 again once 3 was seen."""

import sys

import numpy as np

import meshd

COUNT = int(sys.argv[1]) if len(sys.argv) > 1 else 200_000
WINDOW = 8  # requests in flight at once (the channels hold 16)

client = meshd.Client()
tx, rx = client.producer("requests"), client.consumer("replies")
request, reply = np.zeros(16, dtype=np.uint32), np.empty(16, dtype=np.uint32)
sent = received = 0
seen = {2: 0, 3: 0}
while received < COUNT:
    while sent < COUNT and sent - received < WINDOW:
        request[0], request[1:] = sent, sent % 1000 + 1
        tx.send(request, timeout=10)
        sent += 1
    rx.recv_into(reply, timeout=10)
    assert reply[0] == received, f"expected reply {received}, got {reply[0]}"
    factor = int(reply[1]) // (received % 1000 + 1)
    assert factor in seen and (reply[1:] == (received % 1000 + 1) * factor).all(), f"reply {received}: {reply}"
    assert not (factor == 2 and seen[3]), f"reply {received} doubled after a tripled one"
    seen[factor] += 1
    received += 1
print(f"{received} replies in order, none lost: {seen[2]} doubled (version 1), {seen[3]} tripled (version 2)")
