"""Services (issue 26) from Python: ``meshd.Service`` and its two ends against the Rust peer's host server.

The control side is a stand-in meshd written here (:class:`FakeMeshd`): it speaks the wire contract
(``info``, ``service_create``, ``service_attach`` with the connection kept as the lease, ``detach``) and
does meshd's part through the peer (``service-connect`` for the id, ``service-depart`` on detach or once
the client's process is gone). The server is the peer's ``service-server``: each reply is its request
with the first u32 word plus one. Several clients in threads and in processes check every reply in
order; one client process is killed with SIGKILL while the others go on.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket as _socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest

import meshd
from conftest import DEADLINE, Peer

HERE = Path(__file__).resolve().parent
CLIENT = HERE / "service_client.py"


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie has exited: it stores nothing more)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X", "x")


class FakeMeshd:
    """meshd's control socket for services, as the contract says, over the peer's ServiceOwner commands."""

    def __init__(self, peer: Peer, mailbox: Path, socket: Path) -> None:
        self.peer, self.mailbox, self.socket = peer, mailbox, socket
        #: ServiceOwner is one per mailbox: one peer command at a time.
        self.owner = threading.Lock()
        #: What each request did, for the tests to check (``attach ID``, ``detach ID``, ``dead ID``).
        self.log: list[str] = []
        #: A test's override of the next service_attach answer (a dict sent as it is).
        self.attach_answer: dict[str, Any] | None = None
        self.listener = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        self.listener.bind(str(socket))
        self.listener.listen(64)
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.listener.close()

    def _owner_cmd(self, *args: object) -> tuple[bool, str]:
        with self.owner:
            out = subprocess.run(
                [str(self.peer.exe), *map(str, args)], capture_output=True, text=True, timeout=60, check=False
            )
        if out.returncode != 0:
            errors = [ln.removeprefix("Error: ") for ln in out.stderr.splitlines() if ln.startswith("Error: ")]
            return False, (errors or ["peer failed"])[0]
        return True, out.stdout

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: _socket.socket) -> None:
        with conn, conn.makefile("rb") as lines:
            line = lines.readline()
            if not line:
                return
            req = json.loads(line)

            def answer(resp: dict[str, Any]) -> None:
                conn.sendall(json.dumps(resp, separators=(",", ":")).encode() + b"\n")

            op = req.get("op")
            if op == "info":
                answer({"ok": True, "info": {"mode": "fake", "mailbox": str(self.mailbox), "channels": []}})
            elif op == "service_create":
                ok, text = self._owner_cmd(
                    "service-create",
                    self.mailbox,
                    req["name"],
                    req["clients"],
                    req["msg_size"],
                    req["capacity"],
                    req["reply_size"],
                    req["reply_capacity"],
                )
                answer({"ok": True} if ok else {"ok": False, "error": text})
            elif op == "service_attach":
                self._attach(conn, lines, req["service"], answer)
            else:
                answer({"ok": False, "error": f"unknown op {op!r}"})

    def _attach(self, conn: _socket.socket, lines: Any, name: str, answer: Any) -> None:
        if self.attach_answer is not None:
            answer(self.attach_answer)
            return
        creds = conn.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, struct.calcsize("3i"))
        pid = struct.unpack("3i", creds)[0]
        ok, text = self._owner_cmd("service-connect", self.mailbox, name, pid)
        if not ok:
            answer({"ok": False, "error": text})
            return
        ident = int(Peer.parse(text)["id"])
        self.log.append(f"attach {ident}")
        answer({"ok": True, "client": {"id": ident, "requests": name, "replies": f"{name}.replies"}})
        line = lines.readline()  # the lease: a detach, or the end of the connection
        if line and json.loads(line).get("op") == "detach":
            ok, text = self._owner_cmd("service-depart", self.mailbox, name, ident, "detach")
            self.log.append(f"detach {ident}")
            answer({"ok": True} if ok else {"ok": False, "error": text})
            return
        # Closed: a process that died closes its sockets on its way out, so give it a moment to be gone
        # (its last store is then final, as meshd's pidfd says); one still alive just closed the socket.
        end = time.monotonic() + 1.0
        while _alive(pid) and time.monotonic() < end:
            time.sleep(0.002)
        how = "detach" if _alive(pid) else "dead"
        self._owner_cmd("service-depart", self.mailbox, name, ident, how)
        self.log.append(f"{how} {ident}")


@pytest.fixture
def daemon(tmp_path: Path, peer: Peer) -> Iterator[FakeMeshd]:
    mailbox = tmp_path / "mailbox"
    peer.run("mailbox", mailbox)
    fake = FakeMeshd(peer, mailbox, tmp_path / "sock")
    yield fake
    fake.close()


@pytest.fixture
def kv(daemon: FakeMeshd, peer: Peer) -> Iterator[tuple[FakeMeshd, Any]]:
    """Service ``kv`` (8 clients, 64-byte requests and replies) with the peer's server running."""
    meshd.Client(daemon.socket, timeout=DEADLINE).service_create("kv", clients=8, msg_size=64, capacity=64)
    server = peer.start_with_stdin("service-server", daemon.mailbox, "kv")
    assert server.stdout is not None and server.stdout.readline().strip() == "ready"
    yield daemon, server
    if server.poll() is None:
        server.kill()


def stop_server(peer: Peer, server: subprocess.Popen[str]) -> dict[str, int]:
    """Ends the peer's server (its stdin closed) and returns its counts."""
    return {k: int(v) for k, v in peer.finish(server).items()}


def req(k: int, ident: int, size: int = 64) -> bytes:
    head = struct.pack("<II", k & 0xFFFFFFFF, ident)
    return head + bytes((k * 7 + ident + i) & 0xFF for i in range(size - len(head)))


def rsp(k: int, ident: int, size: int = 64) -> bytes:
    return struct.pack("<I", (k + 1) & 0xFFFFFFFF) + req(k, ident, size)[4:]


def wait_until(predicate: Any, what: str) -> None:
    end = time.monotonic() + DEADLINE
    while not predicate():
        assert time.monotonic() < end, f"gave up waiting for {what}"
        time.sleep(0.005)


# ---- one client ----


def test_a_client_attaches_sends_any_buffer_and_gets_its_replies_in_order(
    kv: tuple[FakeMeshd, Any], peer: Peer
) -> None:
    daemon, server = kv
    with meshd.Service.connect("kv", daemon.socket, timeout=DEADLINE) as svc:
        assert (svc.name, svc.requests, svc.replies) == ("kv", "kv", "kv.replies")
        assert (svc.msg_size, svc.reply_size) == (64, 64) and not svc.closed
        assert daemon.log == [f"attach {svc.id}"] and f"id={svc.id:#x}" in repr(svc)
        assert svc.try_recv() is None
        for k in range(100):
            assert svc.request(req(k, svc.id), timeout=DEADLINE) == rsp(k, svc.id)
        # Any C-contiguous buffer is a request: numpy, bytearray, memoryview; shorter ones are zero-padded.
        arr = np.frombuffer(req(100, svc.id), dtype=np.uint32).copy()
        svc.send(arr, timeout=DEADLINE)
        out = np.zeros(16, dtype=np.uint32)
        svc.recv_into(out, timeout=DEADLINE)
        assert out.tobytes() == rsp(100, svc.id)
        assert svc.try_send(bytearray(b"\x07\0\0\0short"))
        wait_until(lambda: svc.try_recv_into(out), "the short request's reply")
        assert out.tobytes() == b"\x08\0\0\0short" + bytes(55)
        buf = bytearray(64)
        svc.request_into(memoryview(req(101, svc.id)), buf, timeout=DEADLINE)
        assert bytes(buf) == rsp(101, svc.id)
        # Refusals: typed, with the channel's name; nothing is sent.
        with pytest.raises(meshd.MessageSizeError) as e:
            svc.send(bytes(65))
        assert (e.value.channel, e.value.size, e.value.got) == ("kv", 64, 65)
        with pytest.raises(meshd.MessageSizeError):
            svc.recv_into(bytearray(63), timeout=0)
        with pytest.raises(BufferError, match="C-contiguous"):
            svc.send(np.zeros((8, 8), dtype=np.uint8)[:, ::2])
        with pytest.raises(BufferError, match="read-only"):
            svc.recv_into(bytes(64), timeout=0)
        with pytest.raises(ValueError, match="timeout"):
            svc.recv(timeout=-1)
        with pytest.raises(meshd.MeshTimeoutError) as t:
            svc.recv(timeout=0.05)
        assert isinstance(t.value, TimeoutError) and (t.value.channel, t.value.op) == ("kv.replies", "recv")
        ident = svc.id
    assert svc.closed and daemon.log == [f"attach {ident}", f"detach {ident}"]
    svc.close()  # a second close does nothing
    with pytest.raises(ValueError, match="closed"):
        svc.try_send(b"x")
    with pytest.raises(ValueError, match="closed"):
        svc.recv(timeout=0)
    stats = stop_server(peer, server)
    assert (stats["taken"], stats["replied"], stats["skipped"], stats["departed"]) == (103, 103, 0, 1)


def test_a_service_that_does_not_exist_is_refused_with_meshds_reason(kv: tuple[FakeMeshd, Any]) -> None:
    daemon, _ = kv
    with pytest.raises(meshd.MeshdRefused) as e:
        meshd.Service.connect("nope", daemon.socket, timeout=DEADLINE)
    assert "nope" in e.value.reason, e.value.reason
    with pytest.raises(meshd.MeshdUnreachable):
        meshd.Service.connect("kv", daemon.socket.with_name("absent.sock"), timeout=DEADLINE)
    assert daemon.log == []


def test_the_ends_refuse_the_wrong_channels_and_ids_with_typed_errors(kv: tuple[FakeMeshd, Any], peer: Peer) -> None:
    daemon, _ = kv
    peer.run("mailbox", daemon.mailbox.with_name("other"), "plain:64:16")
    mb = meshd.Mailbox.open(daemon.mailbox)
    with pytest.raises(meshd.ProtocolMismatchError) as e:
        meshd.FanInSender(mb, "kv.replies", 0)
    assert e.value.channel == "kv.replies" and isinstance(e.value, ValueError)
    with pytest.raises(meshd.ProtocolMismatchError):
        meshd.GroupClient(mb, "kv", 0)
    with pytest.raises(meshd.ProtocolMismatchError):
        mb.producer("kv")
    with pytest.raises(meshd.ServiceGroupError) as g:
        meshd.GroupClient(mb, "kv.replies", 8)  # entry 8 of 8
    assert g.value.channel == "kv.replies" and "beyond" in str(g.value)
    with pytest.raises(ValueError, match="client id"):
        meshd.FanInSender(mb, "kv", -1)
    with pytest.raises(ValueError, match="client id"):
        meshd.GroupClient(mb, "kv.replies", 2**32)
    with pytest.raises(meshd.NoSuchChannelError):
        meshd.FanInSender(mb, "absent", 0)
    with meshd.GroupClient(mb, "kv.replies", 3) as rx:
        assert (rx.name, rx.id, rx.msg_size, rx.capacity) == ("kv.replies", 3, 64, 16)
        with pytest.raises(meshd.ClaimedError) as c:
            meshd.GroupClient(mb, "kv.replies", 3)
        assert c.value.pid == os.getpid() and c.value.channel == "kv.replies[3]"
    assert rx.closed


def test_malformed_and_refused_attach_answers_leave_nothing_open(kv: tuple[FakeMeshd, Any]) -> None:
    daemon, _ = kv
    daemon.attach_answer = {"ok": True, "client": {"id": "seven", "requests": "kv", "replies": "kv.replies"}}
    with pytest.raises(meshd.MeshdProtocolError, match="malformed client"):
        meshd.Service.connect("kv", daemon.socket, timeout=DEADLINE)
    daemon.attach_answer = {"ok": True}
    with pytest.raises(meshd.MeshdProtocolError, match="without the client"):
        meshd.Service.connect("kv", daemon.socket, timeout=DEADLINE)
    daemon.attach_answer = {"ok": False, "error": "all 8 entries are bound to clients"}
    with pytest.raises(meshd.MeshdRefused, match="all 8 entries"):
        meshd.Service.connect("kv", daemon.socket, timeout=DEADLINE)
    # An answer naming channels that are no service's: the ends refuse, and the lease is given back.
    daemon.attach_answer = {"ok": True, "client": {"id": 1, "requests": "kv.replies", "replies": "kv"}}
    with pytest.raises(meshd.ProtocolMismatchError):
        meshd.Service.connect("kv", daemon.socket, timeout=DEADLINE)


# ---- many clients ----


def test_clients_in_threads_each_get_their_own_replies_in_order(kv: tuple[FakeMeshd, Any], peer: Peer) -> None:
    daemon, server = kv
    rounds, window = 300, 6
    errors: list[str] = []

    def client(n: int) -> None:
        try:
            with meshd.Service.connect("kv", daemon.socket, timeout=DEADLINE) as svc:
                sent = got = 0
                while got < rounds:
                    while sent - got < window and sent < rounds:
                        svc.send(req(sent, svc.id), timeout=DEADLINE)
                        sent += 1
                    reply = svc.recv(timeout=DEADLINE)
                    if reply != rsp(got, svc.id):
                        errors.append(f"client {n} reply {got}: {reply[:8].hex()}")
                        return
                    got += 1
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(f"client {n}: {e!r}")

    threads = [threading.Thread(target=client, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert errors == []
    stats = stop_server(peer, server)
    assert (stats["taken"], stats["replied"], stats["skipped"], stats["departed"]) == (6 * rounds, 6 * rounds, 0, 6)
    assert len({line.split()[1] for line in daemon.log if line.startswith("attach")}) == 6


def client_process(socket: Path, count: int, window: int = 4) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.Popen(
        [sys.executable, str(CLIENT), str(socket), "kv", str(count), str(window)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def test_client_processes_go_on_while_one_is_killed_mid_stream(kv: tuple[FakeMeshd, Any], peer: Peer) -> None:
    daemon, server = kv
    victim = client_process(daemon.socket, 0, window=8)
    survivors = [client_process(daemon.socket, 2000) for _ in range(3)]
    try:
        assert victim.stdout is not None
        victim_id = int(victim.stdout.readline().split()[1])
        # Let it stream for a while (its requests interleave with the others'), then kill it mid-stream.
        for _ in range(3):
            line = victim.stdout.readline()
            assert line.startswith("done"), line
        victim.send_signal(signal.SIGKILL)
        victim.wait(timeout=DEADLINE)
        for s in survivors:
            out, err = s.communicate(timeout=180)
            assert s.returncode == 0, f"{out}\n{err}"
            assert out.splitlines()[-1] == "ok 2000", out
    finally:
        for p in [victim, *survivors]:
            if p.poll() is None:
                p.kill()
                p.communicate()
    wait_until(lambda: f"dead {victim_id}" in daemon.log, "meshd's departure of the killed client")
    stats = stop_server(peer, server)
    # A send cut off by the kill is a skip, never a torn request; at most one per send in flight.
    assert stats["skipped"] <= 1, stats
    assert stats["departed"] == 4, stats
    assert stats["taken"] >= 3 * 2000 + 300, stats


def test_detach_and_reconnect_reuses_entries_once_the_server_has_acknowledged(
    daemon: FakeMeshd, peer: Peer
) -> None:
    client = meshd.Client(daemon.socket, timeout=DEADLINE)
    client.service_create("duo", clients=2, msg_size=16, capacity=8, reply_size=32, reply_capacity=4)
    with pytest.raises(meshd.MeshdRefused):
        client.service_create("duo", clients=2, msg_size=16)
    # No server yet: entries are bound, then departed without an ack.
    a, b = client.service("duo"), client.service("duo")
    assert (a.msg_size, a.reply_size) == (16, 32) and {a.id & 0xFFFF, b.id & 0xFFFF} == {0, 1}
    with pytest.raises(meshd.MeshdRefused, match="all 2 entries"):
        client.service("duo")
    a_id = a.id
    a.close()
    with pytest.raises(meshd.MeshdRefused, match="acknowledged"):
        client.service("duo")
    server = peer.start_with_stdin("service-server", daemon.mailbox, "duo")
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        deadline = time.monotonic() + DEADLINE
        while True:
            try:
                c = client.service("duo")
                break
            except meshd.MeshdRefused:
                assert time.monotonic() < deadline, "the server never acknowledged a's departure"
                time.sleep(0.01)
        # The same entry, the next epoch: a new id, and a's replies never reach it.
        assert c.id & 0xFFFF == a_id & 0xFFFF and c.id != a_id
        for svc in (b, c):
            for k in range(20):
                assert svc.request(req(k, svc.id, 16), timeout=DEADLINE) == rsp(k, svc.id, 16) + bytes(16)
        b.close()
        c.close()
    finally:
        stats = stop_server(peer, server)
    assert stats["departed"] == 3 and stats["replied"] == 40, stats


def test_asyncio_clients_share_one_loop(kv: tuple[FakeMeshd, Any], peer: Peer) -> None:
    daemon, server = kv
    services = [meshd.Service.connect("kv", daemon.socket, timeout=DEADLINE) for _ in range(4)]

    async def stream(svc: meshd.Service, rounds: int) -> int:
        for k in range(rounds):
            reply = await svc.arequest(req(k, svc.id), timeout=DEADLINE)
            assert reply == rsp(k, svc.id)
        await svc.asend(req(rounds, svc.id), timeout=DEADLINE)
        buf = bytearray(64)
        await svc.arecv_into(buf, timeout=DEADLINE)
        assert bytes(buf) == rsp(rounds, svc.id)
        return rounds + 1

    async def main() -> list[int]:
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.001)

        tick = asyncio.create_task(ticker())
        done = await asyncio.gather(*(stream(s, 100) for s in services))
        # Nothing waiting: the loop keeps running while a receive polls, and the timeout is typed.
        with pytest.raises(meshd.MeshTimeoutError) as e:
            await services[0].arecv(timeout=0.05)
        assert e.value.op == "recv"
        tick.cancel()
        assert ticks > 10
        return done

    try:
        assert asyncio.run(main()) == [101] * 4
    finally:
        for s in services:
            s.close()
    stats = stop_server(peer, server)
    assert (stats["replied"], stats["departed"]) == (404, 4)


def test_a_service_left_unclosed_is_taken_back_when_collected(kv: tuple[FakeMeshd, Any]) -> None:
    daemon, _ = kv
    svc = meshd.Service.connect("kv", daemon.socket, timeout=DEADLINE)
    ident = svc.id
    del svc
    wait_until(lambda: f"detach {ident}" in daemon.log, "the lease's end")
