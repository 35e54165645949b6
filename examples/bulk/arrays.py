"""Arrays of one message each through the bulk_echo program: one copy in, one copy out, then in place."""

import numpy as np

import meshd

client = meshd.Client()
tx, rx = client.producer("to-gpu"), client.consumer("from-gpu")
print(tx.protocol)  # bulk

batch = np.random.default_rng(0).standard_normal(tx.msg_size // 4).astype(np.float32)  # one message
tx.send(batch, timeout=5)  # one copy into the ring
out = np.empty_like(batch)
rx.recv_into(out, timeout=5)  # one copy out of it
assert np.array_equal(out, batch)

with tx.send_view(timeout=5) as slot:  # write straight into the ring's next slot
    np.multiply(batch, 2, out=np.frombuffer(slot, np.float32))
with rx.recv_view(timeout=5) as slot:  # read straight from the ring
    back = np.frombuffer(slot, np.float32)  # no copy
    assert np.array_equal(back, batch * 2)
    del back  # before the slot goes back to the ring
print(f"{batch.nbytes} bytes echoed twice, checked")
