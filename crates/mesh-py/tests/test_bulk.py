"""Bulk channels (protocol bulk) from Python against the Rust peer's bulk host ends, in another process: every size class (64 KiB, 1 MiB, 16 MiB) both ways, copying and in place, every word of every message checked with its sequence number; views given back or not, BufferError with a live export, a consumer killed holding a view, and a 16 MiB receive in place that allocates nothing."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

import meshd
from conftest import DEADLINE, Peer, python_ran_while

KiB, MiB = 1 << 10, 1 << 20
#: size class -> (channel, messages per test: several laps of the ring)
CLASSES = {64 * KiB: ("b64k", 200), 1 * MiB: ("b1m", 40), 16 * MiB: ("b16m", 6)}


def numbered(n: int, msg_size: int) -> np.ndarray:
    """Message `n` as the peer writes it: word 0 the number, word i `n ^ i` (every byte checked)."""
    words = np.arange(msg_size // 8, dtype=np.uint64) ^ np.uint64(n)
    words[0] = n
    return words


def check(view: object, n: int, msg_size: int) -> None:
    got = np.frombuffer(view, dtype=np.uint64)  # type: ignore[call-overload]
    assert got.size == msg_size // 8
    assert int(got[0]) == n, f"expected message {n}, got {int(got[0])}"
    assert np.array_equal(got, numbered(n, msg_size)), f"message {n}: a word differs"


@pytest.fixture
def bulk_path(tmp_path: Path, peer: Peer) -> Path:
    """Bulk channels of every size class (capacity 8, 4, 2: 16 MiB messages lap the ring every 2), a
    64 KiB bulk return channel and an ll channel, in a 64 MiB mailbox (the 16 MiB ring alone takes 32)."""
    path = tmp_path / "mailbox"
    peer.run(
        "mailbox", path, "--size", 64 * MiB,
        "b64k:65536:8:bulk", "b1m:1048576:4", "b16m:16777216:2", "back:65536:8:bulk", "small:256:8",
    )  # fmt: skip
    return path


def test_the_end_is_chosen_by_the_channels_protocol(bulk_path: Path) -> None:
    mb = meshd.Mailbox.open(bulk_path)
    with mb.producer("b1m") as tx, meshd.Consumer(mb, "b1m") as rx:
        assert (tx.protocol, rx.protocol, tx.msg_size, tx.capacity) == ("bulk", "bulk", MiB, 4)
        # The Rust host ends' choices by size (mesh-shm's CopyConfig::for_producer / for_msg_size), not
        # copies of them: at 1 MiB a producer streams with up to four threads, a consumer copies out with two.
        assert tx.copy_config == meshd.CopyConfig.for_producer(MiB)
        assert rx.copy_config == meshd.CopyConfig.for_msg_size(MiB)
        assert tx.copy_config.non_temporal and not rx.copy_config.non_temporal
        assert meshd.CopyConfig() == meshd.CopyConfig.default()
        assert "protocol=bulk" in repr(tx)
    with mb.producer("small") as tx, mb.consumer("small") as rx:
        assert (tx.protocol, tx.copy_config, rx.copy_config) == ("ll", None, None)
        with pytest.raises(ValueError, match="only bulk channels"):
            tx.send_view()
        with pytest.raises(ValueError, match="only bulk channels"):
            rx.try_recv_view()
    config = meshd.CopyConfig(threads=2, non_temporal=True)
    assert (config.threads, config.non_temporal, config.min_part) == (2, True, meshd.CopyConfig.default().min_part)
    with mb.producer("b64k", config) as tx:
        assert tx.copy_config == config
    assert meshd.MAX_BULK_MSG_SIZE == 16 * MiB


@pytest.mark.parametrize("mode", ["copy", "view"])
@pytest.mark.parametrize("size", list(CLASSES))
def test_python_to_rust_every_size_class(bulk_path: Path, peer: Peer, size: int, mode: str) -> None:
    channel, count = CLASSES[size]
    consumer = peer.start("consume", bulk_path, channel, count)  # checks every word and the sequence
    mb = meshd.Mailbox.open(bulk_path)
    with mb.producer(channel) as tx:
        for n in range(count):
            msg = numbered(n, size)
            if mode == "copy":
                tx.send(msg, timeout=DEADLINE)
            else:
                with tx.send_view(timeout=DEADLINE) as view:
                    assert view.nbytes == size and not view.readonly
                    np.frombuffer(view, dtype=np.uint64)[:] = msg
    assert peer.finish(consumer)["received"] == str(count)


@pytest.mark.parametrize("mode", ["copy", "view"])
@pytest.mark.parametrize("size", list(CLASSES))
def test_rust_to_python_every_size_class(bulk_path: Path, peer: Peer, size: int, mode: str) -> None:
    channel, count = CLASSES[size]
    producer = peer.start("produce", bulk_path, channel, count)
    mb = meshd.Mailbox.open(bulk_path)
    out = np.empty(size // 8, dtype=np.uint64)
    with mb.consumer(channel) as rx:
        for n in range(count):
            if mode == "copy":
                rx.recv_into(out, timeout=DEADLINE)
                check(out, n, size)
            else:
                slot = rx.recv_view(timeout=DEADLINE)
                assert slot.seq == n
                with slot as view:
                    assert view.readonly and view.nbytes == size
                    check(view, n, size)
                assert slot.done
        assert rx.try_recv() is None
    assert peer.finish(producer)["sent"] == str(count)


def test_bytes_memoryview_bytearray_and_short_messages(bulk_path: Path) -> None:
    mb = meshd.Mailbox.open(bulk_path)
    with mb.producer("b64k") as tx, mb.consumer("b64k") as rx:
        payload = os.urandom(65536)
        for msg in (payload, bytearray(payload), memoryview(payload), np.frombuffer(payload, np.uint8)):
            assert tx.try_send(msg)
            assert rx.recv(timeout=DEADLINE) == payload
        tx.send(b"short", timeout=DEADLINE)  # zero-padded, as the Rust end does
        assert rx.recv(timeout=DEADLINE) == b"short" + bytes(65536 - 5)
        records = np.stack([numbered(n, 65536) for n in range(5)])
        tx.send_batch(records, timeout=DEADLINE)
        got = np.empty((8, 65536 // 8), dtype=np.uint64)
        n = rx.recv_batch(got, timeout=DEADLINE)
        assert n == 5 and np.array_equal(got[:5], records)


def test_bad_sizes_and_buffers_are_refused(bulk_path: Path) -> None:
    mb = meshd.Mailbox.open(bulk_path)
    with mb.producer("b64k") as tx, mb.consumer("b64k") as rx:
        with pytest.raises(meshd.MessageSizeError) as e:
            tx.send(bytes(65536 + 16))
        assert (e.value.size, e.value.got) == (65536, 65536 + 16)
        with pytest.raises(BufferError, match="C-contiguous"):
            tx.send(np.zeros((128, 128), dtype=np.uint64)[:, ::2])
        tx.send(bytes(65536))
        with pytest.raises(meshd.MessageSizeError):
            rx.recv_into(bytearray(100))
        with pytest.raises(BufferError, match="read-only"):
            rx.recv_into(bytes(65536))
        with pytest.raises(meshd.MeshTimeoutError):
            tx.send_batch(np.zeros((9, 65536 // 8), np.uint64), timeout=0.05)  # 1 + 9 > 8
        with pytest.raises(meshd.MeshTimeoutError):
            tx.send_view(timeout=0.05)


def test_views_given_back_or_not(bulk_path: Path) -> None:
    mb = meshd.Mailbox.open(bulk_path)
    with mb.producer("b64k") as tx, mb.consumer("b64k") as rx:
        with pytest.raises(meshd.MeshTimeoutError):
            rx.recv_view(timeout=0.05)
        assert rx.try_recv_view() is None
        # A send view whose block raises is discarded: nothing published, the slot reused.
        with pytest.raises(RuntimeError):
            with tx.send_view() as view:
                np.frombuffer(view, np.uint64)[:] = numbered(99, 65536)
                raise RuntimeError("the producer changed its mind")
        assert rx.try_recv() is None
        # A send view never entered and dropped: not published, and the end is free again.
        slot = tx.try_send_view()
        assert slot is not None and slot.seq == 0
        del slot
        tx.send(numbered(0, 65536))
        # Published explicitly, without a with block.
        slot = tx.send_view()
        np.frombuffer(slot.view, np.uint64)[:] = numbered(1, 65536)
        slot.publish()
        assert slot.done
        with pytest.raises(ValueError, match="already given back"):
            slot.publish()
        # A receive view dropped unreleased: its message comes again.
        slot = rx.try_recv_view()
        assert slot is not None and slot.seq == 0
        del slot
        with rx.recv_view() as view:
            check(view, 0, 65536)
        # A view's memoryview is released with the slot; the view exports nothing more.
        with rx.recv_view() as view:
            check(view, 1, 65536)
            kept = view
            slot_obj = view.obj
        with pytest.raises(ValueError, match="released"):
            kept[0]
        with pytest.raises(BufferError, match="given back"):
            memoryview(slot_obj)
        # A consumer's block that raises still releases (the message is consumed).
        tx.send(numbered(2, 65536))
        with pytest.raises(KeyError):
            with rx.recv_view():
                raise KeyError("bad message")
        assert rx.try_recv() is None


def test_giving_back_a_view_with_a_live_export_raises_buffer_error(bulk_path: Path) -> None:
    mb = meshd.Mailbox.open(bulk_path)
    with mb.producer("b64k") as tx, mb.consumer("b64k") as rx:
        tx.send(numbered(0, 65536))
        tx.send(numbered(1, 65536))
        slot = rx.recv_view()
        with pytest.raises(BufferError, match="live export"):
            with slot as view:
                arr = np.frombuffer(view, dtype=np.uint64)  # lives past the block
        assert not slot.done and slot.exports == 1
        with pytest.raises(BufferError, match="still open"):
            rx.try_recv()  # the end is busy until the slot is given back
        with pytest.raises(BufferError):
            rx.close()
        assert int(arr[0]) == 0 and int(arr[-1]) == 0 ^ (65536 // 8 - 1)  # still valid memory
        del arr
        gc.collect()
        assert slot.exports == 0
        slot.release()
        with rx.recv_view() as view:
            check(view, 1, 65536)
        # The producer's side: a slice of the memoryview is an export too.
        slot = tx.send_view()
        with pytest.raises(BufferError):
            with slot as view:
                part = view[:64]
        with pytest.raises(BufferError):
            tx.send(b"x")
        del part
        slot.discard()
        tx.send(numbered(2, 65536))
        with rx.recv_view() as view:
            check(view, 2, 65536)


def test_a_consumer_killed_holding_a_view_leaves_the_message_to_the_next(bulk_path: Path, peer: Peer) -> None:
    peer.run("produce", bulk_path, "b1m", 4)
    child = textwrap.dedent(
        f"""
        import sys, time, numpy as np, meshd
        rx = meshd.Mailbox.open({str(bulk_path)!r}).consumer("b1m")
        out = np.empty(1 << 17, dtype=np.uint64)
        rx.recv_into(out, timeout=30)
        slot = rx.recv_view(timeout=30)
        view = slot.__enter__()
        arr = np.frombuffer(view, dtype=np.uint64)
        print("holding", int(arr[0]), flush=True)
        time.sleep(60)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().split() == ["holding", "1"]
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=DEADLINE)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    mb = meshd.Mailbox.open(bulk_path)
    assert mb.channel("b1m").tail == 1, "the held message was never released"
    with mb.consumer("b1m") as rx:  # the dead holder's claim is replaced
        for n in (1, 2, 3):
            with rx.recv_view(timeout=DEADLINE) as view:
                check(view, n, MiB)
        assert rx.try_recv_view() is None


def test_a_16_mib_receive_in_place_allocates_nothing(bulk_path: Path, peer: Peer) -> None:
    peer.run("produce", bulk_path, "b16m", 2)
    mb = meshd.Mailbox.open(bulk_path)
    with mb.consumer("b16m") as rx:
        # The control: a receive into new bytes allocates the message.
        tracemalloc.start()
        try:
            msg = rx.recv(timeout=DEADLINE)
            _, peak_bytes = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        check(msg, 0, 16 * MiB)
        del msg
        assert peak_bytes >= 16 * MiB
        tracemalloc.start()
        try:
            with rx.recv_view(timeout=DEADLINE) as view:
                arr = np.frombuffer(view, dtype=np.uint64)
                first, last = int(arr[0]), int(arr[-1])
                _, peak = tracemalloc.get_traced_memory()
                tracemalloc.stop()
                check(arr, 1, 16 * MiB)  # (allocates, untraced)
                del arr
        finally:
            tracemalloc.stop()
        assert (first, last) == (1, 1 ^ (2 * MiB - 1))
        assert peak < 64 * KiB, f"a receive in place allocated {peak} bytes at its peak"


def test_a_numpy_array_through_a_rust_bulk_echo_and_back(bulk_path: Path, peer: Peer) -> None:
    count = 50
    echo = peer.start("echo", bulk_path, "b64k", "back", count)
    assert echo.stdout is not None and echo.stdout.readline().strip() == "ready"
    mb = meshd.Mailbox.open(bulk_path)
    rng = np.random.default_rng(25)
    with mb.producer("b64k") as tx, mb.consumer("back") as rx:
        out = np.empty(65536 // 4, dtype=np.float32)
        for i in range(count):
            a = rng.standard_normal(65536 // 4).astype(np.float32)
            if i % 2:
                tx.send(a, timeout=DEADLINE)
                rx.recv_into(out, timeout=DEADLINE)
                assert np.array_equal(out, a)
            else:
                with tx.send_view(timeout=DEADLINE) as v:
                    np.frombuffer(v, np.float32)[:] = a
                with rx.recv_view(timeout=DEADLINE) as v:
                    assert np.array_equal(np.frombuffer(v, np.float32), a)
    assert peer.finish(echo)["echoed"] == str(count)


def test_blocking_bulk_calls_wake_for_signals(bulk_path: Path) -> None:
    mb = meshd.Mailbox.open(bulk_path)
    with mb.producer("b16m") as tx, mb.consumer("b16m") as rx:
        out = np.empty(2 * MiB, dtype=np.uint64)
        previous = signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            for call in (lambda: rx.recv_view(), lambda: rx.recv_into(out), lambda: rx.recv()):
                timer = threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT))
                timer.start()
                t = time.monotonic()
                with pytest.raises(KeyboardInterrupt):
                    call()
                assert time.monotonic() - t < 5
                timer.join()
            tx.send(b"x")
            tx.send(b"y")  # the ring (2 messages) is full now
            timer = threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT))
            timer.start()
            with pytest.raises(KeyboardInterrupt):
                tx.send_view()
            timer.join()
        finally:
            signal.signal(signal.SIGINT, previous)


def test_two_python_threads_stream_every_size_class_through_one_channel(bulk_path: Path) -> None:
    """The GPU rows' shape host -> host: a sender thread and a receiver in one process, the GIL shared
    (each blocking call waits and copies in one release of it), every call form, every word checked."""
    mb = meshd.Mailbox.open(bulk_path)
    for size, (channel, count) in CLASSES.items():
        with mb.producer(channel) as tx, mb.consumer(channel) as rx:
            failed: list[BaseException] = []

            def send() -> None:
                try:
                    n = 0
                    while n < count:
                        if n % 3 == 2 and n + 1 < count:  # two records in one call
                            tx.send_batch(np.stack([numbered(n, size), numbered(n + 1, size)]), timeout=DEADLINE)
                            n += 2
                        else:
                            tx.send(numbered(n, size), timeout=DEADLINE)
                            n += 1
                except BaseException as e:  # reported by the receiving thread, after the join
                    failed.append(e)

            sender = threading.Thread(target=send)
            sender.start()
            out = np.empty((2, size // 8), dtype=np.uint64)
            got = 0
            while got < count:
                if got % 2:
                    k = rx.recv_batch(out[: min(2, count - got)], timeout=DEADLINE)
                else:
                    rx.recv_into(out[0], timeout=DEADLINE)
                    k = 1
                for i in range(k):
                    check(out[i], got + i, size)
                got += k
            sender.join()
            assert not failed, failed
            assert rx.try_recv_view() is None


def test_a_bulk_send_waiting_for_room_lets_python_run_and_wakes_for_signals(bulk_path: Path) -> None:
    mb = meshd.Mailbox.open(bulk_path)
    with mb.producer("b1m") as tx, mb.consumer("b1m") as rx:
        records = np.stack([numbered(n, MiB) for n in range(6)])
        with pytest.raises(meshd.MeshTimeoutError) as e:
            tx.send_batch(records, timeout=0.05)  # capacity 4
        assert e.value.sent == 4
        def wait_for_room() -> None:
            with pytest.raises(meshd.MeshTimeoutError):
                tx.send(records[4], timeout=0.3)

        assert python_ran_while(wait_for_room) > 0, "another thread ran Python while send waited for room"
        previous = signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            for call in (lambda: tx.send(records[4]), lambda: tx.send_batch(records[4:])):
                timer = threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT))
                timer.start()
                with pytest.raises(KeyboardInterrupt):
                    call()
                timer.join()
        finally:
            signal.signal(signal.SIGINT, previous)
        # Nothing half-sent: the four messages that went, then the end still works.
        out = np.empty((4, MiB // 8), dtype=np.uint64)
        assert rx.recv_batch(out, timeout=DEADLINE) == 4
        for n in range(4):
            check(out[n], n, MiB)
        tx.send(records[4], timeout=DEADLINE)
        rx.recv_into(out[0], timeout=DEADLINE)
        check(out[0], 4, MiB)
