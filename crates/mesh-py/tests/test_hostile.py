"""Careless and hostile input to the package, as a new user writes it: each case must raise the right exception, naming the thing and the reason, in time (no hang, no PanicException, no silently wrong result)."""

from __future__ import annotations

import math
import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import meshd
from conftest import StandInMeshd
from test_service import Kv, kv, daemon  # noqa: F401 - fixtures


def test_timeouts_inf_waits_nan_and_negative_are_refused(mailbox_path: Path) -> None:
    mb = meshd.Mailbox.open(mailbox_path)
    with mb.producer("vec") as tx, mb.consumer("vec") as rx:
        tx.send(b"one", timeout=math.inf)  # as None: for ever (asyncio's forms read it so too)
        assert rx.recv(timeout=math.inf).rstrip(b"\0") == b"one"
        for bad in (-1.0, -math.inf, math.nan):
            with pytest.raises(ValueError, match=r"timeout .*expected None"):
                rx.recv(timeout=bad)
        start = time.monotonic()
        with pytest.raises(meshd.MeshTimeoutError):
            rx.recv(timeout=0)
        assert time.monotonic() - start < 1.0


def test_batch_buffers_that_hold_no_whole_message_are_refused_at_once(mailbox_path: Path) -> None:
    mb = meshd.Mailbox.open(mailbox_path)
    with mb.producer("vec") as tx, mb.consumer("vec") as rx:
        start = time.monotonic()
        # An empty buffer can never receive: refused, not waited on (with timeout=None: for ever).
        for call in (lambda: rx.recv_batch(bytearray(0)), lambda: rx.try_recv_batch(bytearray(0))):
            with pytest.raises(meshd.MessageSizeError, match="0 bytes holds no message") as e:
                call()
            assert (e.value.channel, e.value.size, e.value.got) == ("vec", 256, 0)
        assert time.monotonic() - start < 1.0
        # The odd size named as the buffer's, not as a message of its remainder.
        with pytest.raises(meshd.MessageSizeError, match="buffer of 300 bytes is not a whole number") as e:
            rx.recv_batch(bytearray(300), timeout=0)
        assert e.value.got == 300
        with pytest.raises(meshd.MessageSizeError, match="send_batch: a buffer of 300 bytes"):
            tx.send_batch(bytes(300), timeout=0)
        tx.send_batch(b"", timeout=0)  # nothing to send is done at once
        assert rx.try_recv() is None


def test_copy_config_threads_out_of_range_are_value_errors() -> None:
    for bad in (0, 65, 10**6):
        with pytest.raises(ValueError, match=f"threads {bad}: expected 1 to 64"):
            meshd.CopyConfig(threads=bad)
    assert meshd.CopyConfig(threads=64).threads == 64


def test_client_ids_past_u32_are_value_errors(mailbox_path: Path) -> None:
    mb = meshd.Mailbox.open(mailbox_path)
    for cls in (meshd.FanInSender, meshd.GroupClient):
        for bad in (-1, 2**32, 2**64):
            with pytest.raises(ValueError, match=f"client id {bad}: expected 0 <= id < 2\\*\\*32"):
                cls(mb, "vec", bad)
        with pytest.raises(TypeError):
            cls(mb, "vec", 1.5)


def test_control_arguments_are_checked_before_anything_is_sent(tmp_path: Path) -> None:
    # No meshd there: every refusal below comes before the connection, or it would be MeshdUnreachable.
    client = meshd.Client(tmp_path / "nobody.sock")
    with pytest.raises(TypeError, match="bind 'to-gpu': expected a list of str, got one str"):
        client.load("echo", b"x", bind="to-gpu")  # list("to-gpu") would be its letters
    with pytest.raises(TypeError, match="command 'true': expected a list of str"):
        client.spawn("w", "true")
    with pytest.raises(TypeError, match="channel name None: expected a str"):
        client.channel_create(None, 64, 8)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="msg_size 18446744073709551616: expected an int from 0 to 2\\*\\*32 - 1"):
        client.channel_create("c", 2**64, 8)
    with pytest.raises(TypeError, match="capacity nan: expected an int"):
        client.channel_create("c", 64, math.nan)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="clients -1"):
        client.service_create("kv", clients=-1, msg_size=64)
    with pytest.raises(TypeError, match="service name None"):
        meshd.Service.connect(None, tmp_path / "nobody.sock")  # type: ignore[arg-type]
    for bad in (0, -1, math.nan):
        with pytest.raises(ValueError, match=f"timeout {bad}: expected None"):
            meshd.Client(tmp_path / "nobody.sock", timeout=bad)
    assert meshd.Client(tmp_path / "nobody.sock", timeout=math.inf).timeout is None
    with pytest.raises(meshd.MeshdUnreachable):
        client.channel_create("c", 64, 8)


class Silent(StandInMeshd):
    """A meshd that takes requests and never answers them."""

    def answer(self, op: str | None, n: int) -> bytes | None:
        time.sleep(2)
        return None


def test_a_meshd_that_does_not_answer_is_a_timeout_naming_the_request(tmp_path: Path) -> None:
    silent = Silent(tmp_path / "mailbox", tmp_path / "sock")
    try:
        start = time.monotonic()
        with pytest.raises(meshd.MeshdTimeout, match="meshd did not answer ps within 0.2 s") as e:
            meshd.Client(tmp_path / "sock", timeout=0.2).ps()
        assert isinstance(e.value, TimeoutError) and e.value.op == "ps"
        assert time.monotonic() - start < 1.5
    finally:
        silent.close()


def test_a_forked_child_may_not_use_or_release_its_parents_ends(mailbox_path: Path) -> None:
    mb = meshd.Mailbox.open(mailbox_path)
    tx, rx = mb.producer("vec"), mb.consumer("vec")
    pid = os.fork()
    if pid == 0:  # the child: its copies refuse, and dropping them (exit with GC) releases nothing
        code = 0
        try:
            tx.send(b"from the child", timeout=0)
            code = 10
        except meshd.ClaimedError as e:
            code = 0 if (e.pid == os.getppid() and "fork()" in str(e)) else 11
        except BaseException:  # noqa: BLE001 - anything else is the failure being tested for
            code = 12
        if code == 0:
            try:
                rx.try_recv()
                code = 13
            except meshd.ClaimedError:
                pass
        del tx, rx
        import gc

        gc.collect()
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    # The child's drop released nothing: the parent still holds both ends, and they still work.
    info = mb.channel("vec")
    assert (info.producer_pid, info.consumer_pid) == (os.getpid(), os.getpid())
    assert rx.try_recv() is None, "the child sent nothing"
    tx.send(b"from the parent", timeout=1)
    assert rx.recv(timeout=1).rstrip(b"\0") == b"from the parent"
    tx.close()
    rx.close()


def test_one_end_called_from_two_threads_at_once_raises_instead_of_racing(mailbox_path: Path) -> None:
    # An end serves one thread at a time (its Rust state is borrowed for the call): a second thread's
    # call while the first waits raises RuntimeError at once, never two receives on one ring.
    mb = meshd.Mailbox.open(mailbox_path)
    with mb.consumer("vec") as rx:
        started = threading.Event()
        errors: list[BaseException] = []

        def wait() -> None:
            started.set()
            try:
                rx.recv(timeout=1.0)
            except BaseException as e:  # noqa: BLE001
                errors.append(e)

        t = threading.Thread(target=wait)
        t.start()
        started.wait()
        time.sleep(0.1)
        with pytest.raises(RuntimeError, match="borrowed"):
            rx.try_recv()
        t.join()
        assert len(errors) == 1 and isinstance(errors[0], meshd.MeshTimeoutError)


def test_request_into_a_wrong_buffer_sends_nothing(kv: Kv) -> None:  # noqa: F811
    daemon, _server = kv
    with daemon.client.service("kv") as svc:
        for bad, err in ((bytearray(3), meshd.MessageSizeError), (bytes(64), BufferError)):
            with pytest.raises(err, match="request_into"):
                svc.request_into(b"\x01", bad, timeout=1.0)
        # Had a request gone, its reply would be waiting now.
        time.sleep(0.2)
        assert svc.try_recv() is None
        out = np.zeros(16, dtype=np.uint32)
        svc.request_into(np.array([41] + [0] * 15, dtype=np.uint32), out, timeout=5.0)
        assert out[0] == 42
        assert svc.request(b"\x07", timeout=math.inf)[0] == 8
