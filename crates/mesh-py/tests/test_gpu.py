"""On the GPU: meshd started from Python, the echo program loaded through the control client and driven from Python (numpy arrays byte for byte, a sequence-checked stream through the GPU), and bulk_echo driven through bulk channels (64 KiB to 16 MiB, copying and in place) in blink and MPS mode. Needs MESH_GPU_TESTS=1, a GPU, meshd (MESHD_BIN or on PATH) and echo.ptx, bulk_echo.ptx (MESH_PROGRAMS, else target/programs, where `cargo xtask ptx` builds them)."""

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


def echo_ptx(name: str = "echo") -> Path:
    # `cargo xtask ptx` builds the test programs' PTX there; a bundle's ./run sets MESH_PROGRAMS.
    return Path(os.environ.get("MESH_PROGRAMS", REPO / "target" / "programs")) / f"{name}.ptx"


@pytest.fixture
def gpu_meshd(tmp_path: Path) -> Iterator[meshd.Client]:
    yield from _meshd(tmp_path, [])


@pytest.fixture(params=["blink", "mps"])
def bulk_meshd(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[meshd.Client]:
    """meshd in either mode with a mailbox large enough for two 16 MiB bulk rings of 2 messages."""
    extra = ["--shm-size", "256M"]
    if request.param == "mps":
        extra += ["--isolation", "mps", "--pool", "2", "--mps-dir", str(tmp_path / "mps")]
    yield from _meshd(tmp_path, extra)


def _meshd(tmp_path: Path, extra: list[str]) -> Iterator[meshd.Client]:
    sock = tmp_path / "sock"
    # The mailbox on tmpfs, as meshd's default: the GPU registers only memory the driver can pin (a
    # mailbox under /tmp failed cuMemHostRegister on the H200).
    shm = Path(tempfile.mkdtemp(prefix="meshd-pytest-", dir="/dev/shm")) / "mailbox"
    args = [meshd_bin(), "--socket", str(sock), "run", "--shm", str(shm), "--fresh"]
    args += ["--state-dir", str(tmp_path / "state"), *extra]
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
        # An orderly stop (SIGTERM) first: a killed MPS meshd would leave its programs running
        # through the orphan grace, beside the next test's.
        if daemon.poll() is None:
            daemon.terminate()
            try:
                daemon.wait(timeout=20)
            except subprocess.TimeoutExpired:
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


def test_numpy_arrays_through_bulk_echo_copying_and_in_place(bulk_meshd: meshd.Client) -> None:
    """Every size class through bulk_echo (one block of 1024 threads), each message numbered and every
    word checked: copying (send / recv_into) and in place (send_view / recv_view) in turn, then a stream
    with the sender on its own thread."""
    client = bulk_meshd
    for size, capacity, count in ((64 << 10, 4, 64), (1 << 20, 4, 32), (16 << 20, 2, 8)):
        to, back = f"to{size}", f"back{size}"
        client.channel_create(to, msg_size=size, capacity=capacity, protocol="bulk")
        client.channel_create(back, msg_size=size, capacity=capacity, protocol="bulk")
        row = client.load(f"bulk-echo{size}", echo_ptx("bulk_echo"), block=1024, bind=[to, back])
        assert row["state"] == "running", row
        tx, rx = client.producer(to), client.consumer(back)
        assert (tx.protocol, rx.protocol) == ("bulk", "bulk")
        words = size // 8
        out = np.empty(words, dtype=np.uint64)

        def message(n: int) -> np.ndarray:
            m = np.arange(words, dtype=np.uint64) ^ np.uint64(n)
            m[0] = n
            return m

        for n in range(count):
            if n % 2:
                tx.send(message(n), timeout=DEADLINE)
                rx.recv_into(out, timeout=DEADLINE)
                assert np.array_equal(out, message(n)), f"{size} B message {n} (copying) differs"
            else:
                with tx.send_view(timeout=DEADLINE) as v:
                    np.frombuffer(v, dtype=np.uint64)[:] = message(n)
                with rx.recv_view(timeout=DEADLINE) as v:
                    got = np.frombuffer(v, dtype=np.uint64)
                    ok = np.array_equal(got, message(n))
                    del got
                assert ok, f"{size} B message {n} (in place) differs"

        def send_all() -> None:
            for n in range(count, 3 * count):
                tx.send(message(n), timeout=DEADLINE)

        sender = threading.Thread(target=send_all)
        sender.start()
        t = time.perf_counter()
        for n in range(count, 3 * count):
            rx.recv_into(out, timeout=DEADLINE)
            assert int(out[0]) == n and np.array_equal(out, message(n)), f"{size} B stream at {n}"
        secs = time.perf_counter() - t
        sender.join()
        print(f"{size} B through bulk_echo from Python: {2 * count * size / secs / 1e9:.2f} GB/s each way (checked)")
        tx.close()
        rx.close()
        client.unload(f"bulk-echo{size}")
    assert "libcuda" not in Path("/proc/self/maps").read_text(), "the Python process loaded the CUDA driver"
