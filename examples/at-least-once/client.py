"""A client that survives at-least-once delivery: every request numbered, every reply matched by its
number, repeats dropped. Talks to the tutorial's scale program (word 0 is the request's number)."""

import numpy as np

import meshd

client = meshd.Client()
tx, rx = client.producer("requests"), client.consumer("replies")
request, reply = np.zeros(16, dtype=np.uint32), np.empty(16, dtype=np.uint32)
answered = set()
next_id = 0
for value in range(1, 101):
    request[0], request[1:] = next_id, value
    tx.send(request, timeout=5)
    while next_id not in answered:
        rx.recv_into(reply, timeout=5)
        rid = int(reply[0])
        if rid in answered:
            continue  # a repeat after a crash: already handled
        assert rid <= next_id, f"reply {rid} to a request not sent yet"
        answered.add(rid)
    next_id += 1
print(f"{len(answered)} requests answered, each used once")
