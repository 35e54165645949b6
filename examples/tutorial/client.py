"""Asks the scale program to double a few numbers: one request, one reply."""

import numpy as np

import meshd

client = meshd.Client()  # the meshd at $MESHD_SOCKET, else /tmp/meshd.sock
tx, rx = client.producer("requests"), client.consumer("replies")

request = np.arange(16, dtype=np.uint32)  # word 0: our number for it; words 1-15: the values
tx.send(request, timeout=5)
reply = np.empty(16, dtype=np.uint32)
rx.recv_into(reply, timeout=5)
print("sent", request[1:5], "got", reply[1:5])  # sent [1 2 3 4] got [2 4 6 8]
assert reply[0] == request[0] and (reply[1:] == request[1:] * 2).all()
