"""On the GPU: meshd started from Python, the echo program loaded through the control client and driven from Python (numpy arrays byte for byte, a sequence-checked stream through the GPU). Needs MESH_GPU_TESTS=1, a GPU, meshd (MESHD_BIN or on PATH) and echo.ptx (MESH_PROGRAMS, else tests/programs)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest

import meshd
from conftest import DEADLINE, REPO

pytestmark = pytest.mark.skipif(
    os.environ.get("MESH_GPU_TESTS") != "1",
    reason="GPU test: set MESH_GPU_TESTS=1 on a machine with a GPU (tests/gpu-run.sh does) to run it",
)


def meshd_bin() -> str:
    found = os.environ.get("MESHD_BIN") or shutil.which("meshd")
    if not found:
        pytest.fail("meshd not found: set MESHD_BIN or put meshd on PATH")
    return found


def echo_ptx() -> Path:
    return Path(os.environ.get("MESH_PROGRAMS", REPO / "tests" / "programs")) / "echo.ptx"


@pytest.fixture
def gpu_meshd(tmp_path: Path) -> Iterator[meshd.Client]:
    sock = tmp_path / "sock"
    # The mailbox on tmpfs, as meshd's default: the GPU registers only memory the driver can pin (a
    # mailbox under /tmp failed cuMemHostRegister on the H200).
    shm = Path(tempfile.mkdtemp(prefix="meshd-pytest-", dir="/dev/shm")) / "mailbox"
    args = [meshd_bin(), "--socket", str(sock), "run", "--shm", str(shm), "--fresh"]
    args += ["--state-dir", str(tmp_path / "state")]
    log = open(tmp_path / "meshd.log", "w")
    daemon = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    client = meshd.Client(sock, timeout=120)
    try:
        end = time.monotonic() + DEADLINE
        while True:
            try:
                client.info()
                break
            except meshd.MeshdUnreachable:
                assert daemon.poll() is None, f"meshd exited: {(tmp_path / 'meshd.log').read_text()}"
                assert time.monotonic() < end, "meshd did not answer"
                time.sleep(0.05)
        yield client
        client.shutdown()
        assert daemon.wait(timeout=DEADLINE) == 0
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()
        log.close()
        shutil.rmtree(shm.parent, ignore_errors=True)


def test_the_echo_program_driven_from_python(gpu_meshd: meshd.Client) -> None:
    client = gpu_meshd
    client.channel_create("to-gpu", msg_size=256, capacity=64)
    client.channel_create("from-gpu", msg_size=256, capacity=64)
    row = client.load("echo", echo_ptx(), bind=["to-gpu", "from-gpu"])
    assert row["name"] == "echo" and row["state"] == "running", row
    print(f"echo loaded in {client.last_backend_us} µs of backend time on {client.info()['device']}")
    tx, rx = client.producer("to-gpu"), client.consumer("from-gpu")

    rng = np.random.default_rng(19)
    for a in (rng.standard_normal(32), rng.integers(0, 2**31, 64, dtype=np.int32), rng.bytes(256)):
        tx.send(a, timeout=DEADLINE)
        out = bytearray(256)
        rx.recv_into(out, timeout=DEADLINE)
        assert bytes(out) == (a if isinstance(a, bytes) else a.tobytes()), "the GPU's answer differs"

    # A stream through the GPU: one thread sends while this one receives (both release the GIL).
    count, batch = 200_000, 64

    def send_all() -> None:
        for first in range(0, count, batch):
            msgs = np.zeros((batch, 32), dtype=np.uint64)
            msgs[:, 0] = np.arange(first, first + batch, dtype=np.uint64)
            msgs[:, 31] = ~msgs[:, 0]
            tx.send_batch(msgs, timeout=DEADLINE)

    sender = threading.Thread(target=send_all)
    sender.start()
    buf = np.empty((batch, 32), dtype=np.uint64)
    got = 0
    t = time.perf_counter()
    while got < count:
        n = rx.recv_batch(buf, timeout=DEADLINE)
        assert np.array_equal(buf[:n, 0], np.arange(got, got + n, dtype=np.uint64)), f"out of order at {got}"
        assert np.array_equal(buf[:n, 31], ~buf[:n, 0])
        got += n
    secs = time.perf_counter() - t
    sender.join()
    print(f"{count} messages of 256 B through the GPU echo from Python: {count / secs / 1e6:.2f} M msg/s")
    ps = client.ps()["programs"]
    assert ps[0]["heartbeat"] > 0, "the program ran"
    client.unload("echo")
    assert "libcuda" not in Path("/proc/self/maps").read_text(), "the Python process loaded the CUDA driver"
