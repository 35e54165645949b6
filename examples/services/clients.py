"""N client processes of service kv at once, each sending COUNT requests and checking every reply
(its first word plus one, the rest as sent)."""

import sys
from multiprocessing import Pool

import numpy as np

import meshd


def client(k: int, count: int) -> int:
    with meshd.Service.connect("kv") as svc:
        req = np.zeros(16, dtype=np.uint32)
        req[1] = k
        for i in range(count):
            req[0] = i
            reply = np.frombuffer(svc.request(req, timeout=10), np.uint32)
            assert reply[0] == i + 1 and reply[1] == k, f"client {k}, request {i}: {reply[:2]}"
    return count


if __name__ == "__main__":
    n, count = int(sys.argv[1]), int(sys.argv[2])
    with Pool(n) as pool:
        total = sum(pool.starmap(client, [(k, count) for k in range(n)]))
    print(f"{n} clients: {total} replies checked")
