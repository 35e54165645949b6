"""The mailbox from Python against the Rust peer in another process: sequence-checked streams both ways, numpy round trips byte for byte, a peer killed mid-stream, blocking, signals, asyncio and every refusal."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import meshd
from conftest import DEADLINE, Peer, golden, python_ran_while


def numbered(first: int, count: int, msg_size: int) -> np.ndarray:
    """Messages `first..first+count` as the peer writes them: word 0 the number, word i number ^ i."""
    n = np.arange(first, first + count, dtype=np.uint64)[:, None]
    words = n ^ np.arange(msg_size // 8, dtype=np.uint64)[None, :]
    words[:, 0] = n[:, 0]
    return np.ascontiguousarray(words)


def wait_until(predicate, what: str) -> None:
    """Waits for `predicate` with a deadline (a guard against hanging, not a measurement)."""
    end = time.monotonic() + DEADLINE
    while not predicate():
        assert time.monotonic() < end, f"gave up waiting for {what}"
        time.sleep(0.005)


def test_open_lists_channels_and_claims(mailbox_path: Path) -> None:
    mb = meshd.Mailbox.open(mailbox_path)
    assert str(mb.path) == str(mailbox_path)
    names = {c.name: c for c in mb.channels()}
    assert set(names) == {"small", "vec", "big", "back"}
    assert (names["big"].msg_size, names["big"].capacity) == (65536, 16)
    with mb.producer("vec") as tx:
        assert (tx.name, tx.msg_size, tx.capacity) == ("vec", 256, 64)
        assert mb.channel("vec").producer_pid == os.getpid()
        with pytest.raises(meshd.ClaimedError) as e:
            mb.producer("vec")
        assert e.value.pid == os.getpid() and e.value.end == "producer"
        assert str(e.value) == f'channel "vec": producer end already claimed by pid {os.getpid()}'
    assert tx.closed and mb.channel("vec").producer_pid is None
    with pytest.raises(ValueError, match="closed"):
        tx.try_send(b"x")
    with pytest.raises(meshd.NoSuchChannelError) as e:
        mb.consumer("nope")
    assert str(e.value) == 'channel "nope": no such channel' and e.value.channel == "nope"


def test_missing_and_foreign_files_are_refused_with_their_reason(tmp_path: Path) -> None:
    with pytest.raises(meshd.MailboxIOError) as e:
        meshd.Mailbox.open(tmp_path / "absent")
    assert isinstance(e.value, OSError) and e.value.errno == 2 and "open" in str(e.value)
    junk = tmp_path / "junk"
    junk.write_bytes(b"\0" * 8192)
    with pytest.raises(meshd.MailboxInvalidError, match="magic"):
        meshd.Mailbox.open(junk)


def test_another_layout_version_is_refused_with_meshds_own_error(mailbox_path: Path, peer: Peer) -> None:
    found = int(peer.run("bump-version", mailbox_path)["version"])
    assert found == meshd.LAYOUT_VERSION + 1
    with pytest.raises(meshd.LayoutVersionError) as e:
        meshd.Mailbox.open(mailbox_path)
    template = golden("layout_version_error.txt").decode().rstrip("\n")
    expected = template.replace("{path}", str(mailbox_path)).replace("{found}", str(found))
    assert str(e.value) == expected.replace("{expected}", str(meshd.LAYOUT_VERSION))
    assert "--fresh" in str(e.value)


def test_bad_buffers_and_sizes_are_refused(mailbox_path: Path) -> None:
    mb = meshd.Mailbox.open(mailbox_path)
    tx, rx = mb.producer("vec"), mb.consumer("vec")
    with pytest.raises(meshd.MessageSizeError) as e:
        tx.try_send(bytes(257))
    assert str(e.value) == 'channel "vec": message of 257 bytes, the channel carries 256-byte messages'
    assert (e.value.size, e.value.got) == (256, 257)
    with pytest.raises(BufferError, match="not C-contiguous"):
        tx.try_send(np.zeros((8, 8), dtype=np.float64)[:, ::2])
    with pytest.raises(TypeError):
        tx.try_send("text is not a buffer")
    assert tx.try_send(b"short")
    with pytest.raises(BufferError, match="read-only"):
        rx.try_recv_into(bytes(256))
    with pytest.raises(meshd.MessageSizeError):
        rx.try_recv_into(bytearray(255))
    out = bytearray(256)
    assert rx.try_recv_into(out)
    assert bytes(out) == b"short" + bytes(251), "a short message arrives zero-padded"
    with pytest.raises(ValueError, match="timeout"):
        rx.recv(timeout=-1)
    with pytest.raises(meshd.MessageSizeError):
        tx.try_send_batch(bytes(300))


def test_numpy_arrays_round_trip_byte_for_byte_through_the_rust_peer(mailbox_path: Path, peer: Peer) -> None:
    rng = np.random.default_rng(19)
    arrays = [
        rng.standard_normal(32).astype(np.float64),
        rng.integers(-(2**31), 2**31, size=64, dtype=np.int32),
        rng.standard_normal((4, 16)).astype(np.float32),
        rng.integers(0, 256, size=256, dtype=np.uint8),
        np.frombuffer(rng.bytes(256), dtype=np.complex128),
    ]
    echo = peer.start("echo", mailbox_path, "vec", "back", len(arrays) + 3)
    assert echo.stdout is not None and echo.stdout.readline().strip() == "ready"
    mb = meshd.Mailbox.open(mailbox_path)
    tx, rx = mb.producer("vec"), mb.consumer("back")
    for a in arrays:
        assert a.nbytes == 256
        tx.send(a, timeout=DEADLINE)
        out = np.empty_like(a)
        rx.recv_into(out, timeout=DEADLINE)
        assert out.tobytes() == a.tobytes() and out.dtype == a.dtype
    # bytes, bytearray and a memoryview slice go as they are; recv returns bytes.
    for msg in (bytes(range(256)), bytearray(b"\xff" * 256), memoryview(bytes(range(256)) * 2)[256:]):
        tx.send(msg, timeout=DEADLINE)
        assert rx.recv(timeout=DEADLINE) == bytes(msg)
    assert peer.finish(echo)["echoed"] == str(len(arrays) + 3)


def test_a_million_messages_from_the_rust_peer_arrive_in_sequence(mailbox_path: Path, peer: Peer) -> None:
    count = 2_000_000
    child = peer.start("produce", mailbox_path, "small", count)
    rx = meshd.Consumer(meshd.Mailbox.open(mailbox_path), "small")
    buf = np.empty(256, dtype=np.uint64)
    got = 0
    while got < count:
        n = rx.recv_batch(buf[: min(256, count - got)], timeout=DEADLINE)
        expect = np.arange(got, got + n, dtype=np.uint64)
        assert np.array_equal(buf[:n], expect), f"out of sequence after {got} messages"
        got += n
    assert rx.try_recv() is None
    assert peer.finish(child)["sent"] == str(count)


def test_single_message_calls_keep_the_sequence(mailbox_path: Path, peer: Peer) -> None:
    count = 200_000
    child = peer.start("produce", mailbox_path, "small", count)
    rx = meshd.Mailbox.open(mailbox_path).consumer("small")
    out = np.empty(1, dtype=np.uint64)
    for i in range(count):
        if i % 2:
            rx.recv_into(out, timeout=DEADLINE)
            assert int(out[0]) == i
        else:
            assert int.from_bytes(rx.recv(timeout=DEADLINE), "little") == i
    peer.finish(child)


def test_a_million_messages_to_the_rust_peer_arrive_in_sequence(mailbox_path: Path, peer: Peer) -> None:
    count = 1_000_000
    child = peer.start("consume", mailbox_path, "small", count)
    tx = meshd.Mailbox.open(mailbox_path).producer("small")
    chunk = 4096
    for first in range(0, count, chunk):
        tx.send_batch(numbered(first, min(chunk, count - first), 8), timeout=DEADLINE)
    assert peer.finish(child)["received"] == str(count)


def test_a_producer_killed_mid_stream_leaves_a_clean_sequence_and_its_end_to_a_new_one(
    mailbox_path: Path, peer: Peer
) -> None:
    mb = meshd.Mailbox.open(mailbox_path)
    child = peer.start("produce", mailbox_path, "small", 1_000_000)
    rx = mb.consumer("small")
    buf = np.empty(100, dtype=np.uint64)
    assert rx.recv_batch(buf, timeout=DEADLINE) >= 1
    got = int(buf[0]) + 1
    assert int(buf[0]) == 0
    # Stop reading until the ring is full: the producer is then waiting for room, not writing, when it dies.
    wait_until(lambda: mb.channel("small").head - mb.channel("small").tail == 1024, "a full ring")
    child.kill()
    child.wait()
    # Whatever it sent is whole and in order; then nothing more comes.
    tail = mb.channel("small").tail
    while (n := rx.try_recv_batch(buf)) > 0:
        assert np.array_equal(buf[:n], np.arange(tail, tail + n, dtype=np.uint64))
        tail += n
    with pytest.raises(meshd.MeshTimeoutError) as e:
        rx.recv(timeout=0.1)
    assert str(e.value) == 'channel "small": recv timed out after 100 ms' and isinstance(e.value, TimeoutError)
    # The dead producer's claim is taken over, and the stream goes on where it stopped.
    assert mb.channel("small").producer_pid == child.pid
    again = peer.start("produce", mailbox_path, "small", 5000, "--from-head")
    for i in range(tail, tail + 5000):
        assert int.from_bytes(rx.recv(timeout=DEADLINE), "little") == i
    assert peer.finish(again)["first"] == str(tail)
    assert got >= 1


def test_a_consumer_killed_mid_stream_is_replaced_and_the_sequence_goes_on(mailbox_path: Path, peer: Peer) -> None:
    mb = meshd.Mailbox.open(mailbox_path)
    tx = mb.producer("vec")
    child = peer.start("consume", mailbox_path, "vec", 1_000_000)
    sent = 0
    wait_until(lambda: mb.channel("vec").consumer_pid == child.pid, "the consumer")
    for _ in range(50):
        tx.send_batch(numbered(sent, 64, 256), timeout=DEADLINE)
        sent += 64
    child.kill()
    child.wait()
    # With nobody reading, the ring fills and a send with a deadline says so, with how many went.
    with pytest.raises(meshd.MeshTimeoutError) as e:
        tx.send_batch(numbered(sent, 128, 256), timeout=0.05)
    assert e.value.op == "send" and 0 <= e.value.sent <= 64
    sent += e.value.sent
    # A new consumer resumes at the published tail (messages read but not acknowledged come again).
    tail = mb.channel("vec").tail
    again = peer.start("consume", mailbox_path, "vec", sent - tail + 640, "--from-tail")
    for _ in range(10):
        tx.send_batch(numbered(sent, 64, 256), timeout=DEADLINE)
        sent += 64
    assert peer.finish(again)["received"] == str(sent - tail)


def test_blocking_calls_release_the_gil(mailbox_path: Path) -> None:
    mb = meshd.Mailbox.open(mailbox_path)
    tx, rx = mb.producer("small"), mb.consumer("small")
    def wait_for_a_message() -> None:
        with pytest.raises(meshd.MeshTimeoutError):
            rx.recv(timeout=0.3)

    assert python_ran_while(wait_for_a_message) > 0, "another thread ran Python while recv waited"
    # The other way round: a thread blocked in recv gets a message sent from this one.
    result: list[bytes] = []
    t = threading.Thread(target=lambda: result.append(rx.recv(timeout=DEADLINE)))
    t.start()
    tx.send(b"12345678", timeout=DEADLINE)
    t.join()
    assert result == [b"12345678"]


def test_ctrl_c_interrupts_a_blocking_receive(mailbox_path: Path) -> None:
    rx = meshd.Mailbox.open(mailbox_path).consumer("small")
    # Python's own Ctrl-C handler, whatever this process inherited: a shell starts background jobs
    # with SIGINT ignored, and Python then installs no handler.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            rx.recv(timeout=DEADLINE)
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, previous)
    # The consumer is still usable afterwards.
    assert rx.try_recv() is None


def test_try_calls_report_full_and_empty(mailbox_path: Path) -> None:
    mb = meshd.Mailbox.open(mailbox_path)
    tx, rx = mb.producer("big"), mb.consumer("big")
    msg = np.arange(65536 // 4, dtype=np.uint32)
    for _ in range(16):
        assert tx.try_send(msg)
    assert not tx.try_send(msg), "a full ring refuses without blocking"
    assert tx.try_send_batch(msg.tobytes() * 2) == 0
    out = np.empty(16 * 65536, dtype=np.uint8)
    assert rx.try_recv_batch(out) == 16
    assert np.array_equal(out.view(np.uint32).reshape(16, -1)[15], msg)
    assert rx.try_recv() is None and not rx.try_recv_into(out[:65536])
    with pytest.raises(meshd.MeshTimeoutError) as e:
        rx.recv_batch(out, timeout=0)
    assert e.value.waited_ms == 0


def test_asyncio_receive_waits_without_blocking_the_loop(mailbox_path: Path) -> None:
    mb = meshd.Mailbox.open(mailbox_path)
    tx, rx = mb.producer("vec"), mb.consumer("vec")

    async def main() -> tuple[bytes, np.ndarray, list[str]]:
        order: list[str] = []

        async def sender() -> None:
            order.append("sender ran")
            await asyncio.sleep(0.01)
            tx.send(b"a" * 256, timeout=DEADLINE)
            tx.send(np.full(32, 7.0), timeout=DEADLINE)

        task = asyncio.create_task(sender())
        first = await rx.arecv(timeout=DEADLINE)
        order.append("received")
        out = np.empty(32)
        await rx.arecv_into(out, timeout=DEADLINE)
        await task
        with pytest.raises(meshd.MeshTimeoutError):
            await rx.arecv(timeout=0.02)
        return first, out, order

    first, out, order = asyncio.run(main())
    assert first == b"a" * 256 and np.array_equal(out, np.full(32, 7.0))
    assert order == ["sender ran", "received"], "the sender ran on the loop while arecv waited"


def test_the_package_creates_no_cuda_context(mailbox_path: Path) -> None:
    mb = meshd.Mailbox.open(mailbox_path)
    with mb.producer("small") as tx, mb.consumer("small") as rx:
        tx.send(b"12345678")
        assert rx.recv(timeout=DEADLINE) == b"12345678"
    maps = Path("/proc/self/maps").read_text()
    assert "libcuda" not in maps, "the meshd package loaded the CUDA driver"
