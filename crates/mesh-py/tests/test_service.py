"""Services from Python: ``meshd.Service`` and its two ends, attached through meshd's control plane.

The control side is meshd's own (the peer's ``serve``: meshd's control plane over a stand-in backend),
which binds each client over the socket and takes it back at its detach, at the lease's end or at its
death. The server is the peer's ``service-server``: each reply is its request with the first u32 word
plus one. Several clients in threads and in processes check every reply in order; one client process
is killed with SIGKILL while the others go on. What a meshd never answers (malformed attach answers)
comes from :class:`FakeMeshd`, a stand-in control socket written here.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
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
from conftest import DEADLINE, Peer, StandInMeshd, python_ran_while

HERE = Path(__file__).resolve().parent
CLIENT = HERE / "service_client.py"


class FakeMeshd(StandInMeshd):
    """A control socket that answers ``info`` with a mailbox and ``service_attach`` with whatever a test says."""

    def __init__(self, mailbox: Path, socket: Path, attach_answer: dict[str, Any]) -> None:
        self.attach_answer = attach_answer
        super().__init__(mailbox, socket)

    def answer(self, op: str | None, n: int) -> bytes | None:
        # The attach; the lease's next line (a detach, if the client took it) closes it unanswered.
        return json.dumps(self.attach_answer).encode() + b"\n" if n == 0 else None


class Daemon:
    """meshd's control plane (the peer's ``serve``) on a socket of its own."""

    def __init__(self, peer: Peer, tmp: Path) -> None:
        self.socket, self.mailbox = tmp / "sock", tmp / "mailbox"
        self.child = peer.start("serve", self.socket, self.mailbox)
        assert self.child.stdout is not None and self.child.stdout.readline().strip() == "ready"
        self.client = meshd.Client(self.socket, timeout=DEADLINE)

    def service_row(self, name: str) -> dict[str, Any]:
        [row] = [s for s in self.client.info().get("services", []) if s["name"] == name]
        return dict(row)

    def settled(self, name: str) -> bool:
        """No client bound, and every departure acknowledged by the server."""
        row = self.service_row(name)
        return row["bound"] == 0 and row["awaiting_ack"] == 0

    def bound(self, name: str) -> list[tuple[int, int]]:
        """The clients meshd holds bound: (id, pid)."""
        return [(c["id"], c["pid"]) for c in self.service_row(name)["clients"]]


@pytest.fixture
def daemon(tmp_path: Path, peer: Peer) -> Daemon:
    return Daemon(peer, tmp_path)


@pytest.fixture
def kv(daemon: Daemon, peer: Peer) -> Iterator[tuple[Daemon, subprocess.Popen[str]]]:
    """Service ``kv`` (8 clients, 64-byte requests and replies) with the peer's server running."""
    daemon.client.service_create("kv", clients=8, msg_size=64, capacity=64)
    server = peer.start_with_stdin("service-server", daemon.mailbox, "kv")
    assert server.stdout is not None and server.stdout.readline().strip() == "ready"
    yield daemon, server
    if server.poll() is None:
        server.kill()


def stop_server(peer: Peer, server: subprocess.Popen[str], daemon: Daemon | None = None, name: str = "kv") -> dict[str, int]:
    """Ends the peer's server (its stdin closed) and returns its counts; with ``daemon``, once the
    server has acknowledged every departure."""
    if daemon is not None:
        wait_until(lambda: daemon.settled(name), "the server's acknowledgement of every departure")
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


Kv = tuple[Daemon, "subprocess.Popen[str]"]


# ---- one client ----


def test_a_client_attaches_sends_any_buffer_and_gets_its_replies_in_order(kv: Kv, peer: Peer) -> None:
    daemon, server = kv
    with meshd.Service.connect("kv", daemon.socket, timeout=DEADLINE) as svc:
        assert (svc.name, svc.requests, svc.replies) == ("kv", "kv", "kv.replies")
        assert (svc.msg_size, svc.reply_size) == (64, 64) and not svc.closed
        assert daemon.bound("kv") == [(svc.id, os.getpid())] and f"id={svc.id:#x}" in repr(svc)
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
    assert svc.closed and daemon.bound("kv") == []
    svc.close()  # a second close does nothing
    with pytest.raises(ValueError, match="closed"):
        svc.try_send(b"x")
    with pytest.raises(ValueError, match="closed"):
        svc.recv(timeout=0)
    stats = stop_server(peer, server, daemon)
    assert (stats["taken"], stats["replied"], stats["skipped"], stats["departed"]) == (103, 103, 0, 1)


def test_the_window_keeps_at_most_the_reply_rings_capacity_unanswered(kv: Kv, peer: Peer) -> None:
    # Replies waiting in the ring count until received: sixteen sent and none received fill it.
    daemon, server = kv
    with meshd.Service.connect("kv", daemon.socket, timeout=DEADLINE) as svc:
        assert (svc.window, svc.unanswered) == (16, 0)
        for k in range(16):
            assert svc.try_send(req(k, svc.id))
        assert not svc.try_send(req(16, svc.id)), "the window is full"
        with pytest.raises(meshd.WindowFullError, match="16 requests unanswered") as e:
            svc.send(req(16, svc.id), timeout=DEADLINE)
        assert (e.value.service, e.value.unanswered, e.value.window) == ("kv", 16, 16)
        with pytest.raises(meshd.WindowFullError):
            svc.request(req(16, svc.id), timeout=DEADLINE)
        with pytest.raises(meshd.WindowFullError):
            asyncio.run(svc.arequest(req(16, svc.id), timeout=DEADLINE))
        for bad in (0, 17, True, 2.0):
            with pytest.raises(ValueError, match="1 to the reply ring's capacity, 16"):
                svc.set_window(bad)  # type: ignore[arg-type]
        assert svc.recv(timeout=DEADLINE) == rsp(0, svc.id) and svc.unanswered == 15
        svc.send(req(16, svc.id), timeout=DEADLINE)
        for k in range(1, 17):
            assert svc.recv(timeout=DEADLINE) == rsp(k, svc.id)
        # Narrowed to one; then lifted: twenty out before any reply is read.
        svc.set_window(1)
        assert svc.request(req(17, svc.id), timeout=DEADLINE) == rsp(17, svc.id)
        assert svc.try_send(req(18, svc.id)) and not svc.try_send(req(19, svc.id))
        assert asyncio.run(svc.arecv(timeout=DEADLINE)) == rsp(18, svc.id)
        svc.set_window(None)
        for k in range(19, 39):
            svc.send(req(k, svc.id), timeout=DEADLINE)
        assert svc.unanswered == 20
        for k in range(19, 39):
            assert svc.recv(timeout=DEADLINE) == rsp(k, svc.id)
        assert svc.unanswered == 0
    stats = stop_server(peer, server, daemon)
    assert (stats["taken"], stats["replied"]) == (39, 39), "exactly the requests the window let out"


def test_one_service_shared_by_threads_pairs_each_request_with_its_reply(kv: Kv, peer: Peer) -> None:
    # Eight threads call request on one Service: each gets the reply to its own request (requests
    # numbered apart per thread). Then one thread sends while another receives, within the window.
    daemon, server = kv
    with meshd.Service.connect("kv", daemon.socket, timeout=DEADLINE) as svc:
        errors: list[str] = []

        def requester(t: int) -> None:
            for i in range(50):
                k = t * 1000 + i
                try:
                    reply = svc.request(req(k, svc.id), timeout=DEADLINE)
                except BaseException as e:  # noqa: BLE001
                    errors.append(f"thread {t} request {i}: {e!r}")
                    return
                if reply != rsp(k, svc.id):
                    errors.append(f"thread {t} request {i}: the reply to {struct.unpack_from('<I', reply)[0] - 1}")
                    return

        threads = [threading.Thread(target=requester, args=(t,)) for t in range(8)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert errors == [] and svc.unanswered == 0, errors

        got: list[bytes] = []

        def receiver() -> None:
            for _ in range(200):
                got.append(svc.recv(timeout=DEADLINE))

        th = threading.Thread(target=receiver)
        th.start()
        for k in range(200):
            while not svc.try_send(req(10_000 + k, svc.id)):  # the window (or the other side) is full
                time.sleep(0.0005)
        th.join()
        assert got == [rsp(10_000 + k, svc.id) for k in range(200)]
    stats = stop_server(peer, server, daemon)
    assert (stats["taken"], stats["replied"]) == (600, 600)


def test_a_service_that_does_not_exist_is_refused_with_meshds_reason(kv: Kv) -> None:
    daemon, _ = kv
    with pytest.raises(meshd.MeshdRefused) as e:
        meshd.Service.connect("nope", daemon.socket, timeout=DEADLINE)
    assert '"nope"' in e.value.reason and "no such service" in e.value.reason, e.value.reason
    daemon.client.channel_create("plain", msg_size=64, capacity=16)
    with pytest.raises(meshd.MeshdRefused, match="not a service"):
        meshd.Service.connect("plain", daemon.socket, timeout=DEADLINE)
    with pytest.raises(meshd.MeshdUnreachable):
        meshd.Service.connect("kv", daemon.socket.with_name("absent.sock"), timeout=DEADLINE)
    with pytest.raises(meshd.MeshdRefused, match="already exists"):
        daemon.client.service_create("kv", clients=8, msg_size=64)
    assert daemon.bound("kv") == []


def test_the_ends_refuse_the_wrong_channels_and_ids_with_typed_errors(kv: Kv) -> None:
    daemon, _ = kv
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
    with meshd.FanInSender(mb, "kv", 5) as tx:
        assert (tx.name, tx.id, tx.msg_size, tx.capacity) == ("kv", 5, 64, 64)
    with pytest.raises(ValueError, match="closed"):
        tx.send(b"x")


def test_malformed_and_refused_attach_answers_leave_nothing_open(daemon: Daemon, tmp_path: Path) -> None:
    daemon.client.service_create("kv", clients=2, msg_size=64)
    cases: list[tuple[dict[str, Any], type[Exception], str]] = [
        ({"ok": True, "client": {"id": "seven", "requests": "kv", "replies": "kv.replies"}}, meshd.MeshdProtocolError, "malformed client"),
        ({"ok": True, "client": {"id": 2**32, "requests": "kv", "replies": "kv.replies"}}, meshd.MeshdProtocolError, "malformed client"),
        ({"ok": True}, meshd.MeshdProtocolError, "without the client"),
        ({"ok": False, "error": "all 2 client slots are bound"}, meshd.MeshdRefused, "all 2 client slots"),
        # Channels that are no service's: the ends refuse, and the lease is given back.
        ({"ok": True, "client": {"id": 1, "requests": "kv.replies", "replies": "kv"}}, meshd.ProtocolMismatchError, "kv"),
    ]
    for answer, error, text in cases:
        fake = FakeMeshd(daemon.mailbox, tmp_path / "fake.sock", answer)
        try:
            with pytest.raises(error, match=text):
                meshd.Service.connect("kv", fake.socket, timeout=DEADLINE)
        finally:
            fake.close()
            (tmp_path / "fake.sock").unlink()
    assert daemon.bound("kv") == []


# ---- many clients ----


def stream_checked(svc: meshd.Service, n: int, rounds: int, window: int, errors: list[str]) -> None:
    """Sends `rounds` requests with up to `window` in flight and checks every reply, in order (client
    `n` in what it appends to `errors` at its first wrong reply)."""
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


def test_clients_in_threads_each_get_their_own_replies_in_order(kv: Kv, peer: Peer) -> None:
    daemon, server = kv
    rounds, window = 300, 6
    errors: list[str] = []
    ids: list[int] = []

    def client(n: int) -> None:
        try:
            with meshd.Service.connect("kv", daemon.socket, timeout=DEADLINE) as svc:
                ids.append(svc.id)
                stream_checked(svc, n, rounds, window, errors)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(f"client {n}: {e!r}")

    threads = [threading.Thread(target=client, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert errors == [] and len(set(ids)) == 6
    stats = stop_server(peer, server, daemon)
    assert (stats["taken"], stats["replied"], stats["skipped"], stats["departed"]) == (6 * rounds, 6 * rounds, 0, 6)


def test_a_service_of_two_shards_serves_clients_in_both_and_info_says_so(daemon: Daemon, peer: Peer) -> None:
    client = daemon.client
    client.service_create("wide", clients=4, msg_size=64, capacity=16, shards=2)
    row = daemon.service_row("wide")
    assert (row["shards"], row["entries"], row["bound"]) == (2, 4, 0)
    [fanin] = [c for c in client.info()["channels"] if c["name"] == "wide"]
    assert (fanin["protocol"], fanin["parts"], fanin["capacity"]) == ("fanin", 2, 16), "the fan-in channel's shards"
    # A service of one shard says nothing of shards (the field left out, as before them).
    client.service_create("one", clients=2, msg_size=64, capacity=16)
    assert "shards" not in daemon.service_row("one")
    # A shard count that is not a power of two up to 64: refused with the value and the rule, nothing made.
    for bad in (3, 128, 0):
        with pytest.raises(meshd.MeshdRefused, match=f"{bad} shards: the fan-in channel has a power of two"):
            client.service_create(f"bad{bad}", clients=2, msg_size=64, shards=bad)
    assert not [s for s in client.info().get("services", []) if s["name"].startswith("bad")]
    # The peer's host server takes round-robin over the shards; four clients (slots 0-3: shards 0, 1,
    # 0, 1) stream at once, more requests each than a shard holds, every reply checked in order.
    server = peer.start_with_stdin("service-server", daemon.mailbox, "wide")
    assert server.stdout is not None and server.stdout.readline().strip() == "ready"
    rounds, window = 200, 6
    errors: list[str] = []
    ids: list[int] = []
    # Every client attached before any streams: info is looked at between the two waits.
    attached = threading.Barrier(5, timeout=DEADLINE)

    def stream(n: int) -> None:
        try:
            with meshd.Service.connect("wide", daemon.socket, timeout=DEADLINE) as svc:
                ids.append(svc.id)
                attached.wait()
                attached.wait()
                stream_checked(svc, n, rounds, window, errors)
        except Exception as e:  # noqa: BLE001 - reported below
            attached.abort()
            errors.append(f"client {n}: {e!r}")

    threads = [threading.Thread(target=stream, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    attached.wait()
    row = daemon.service_row("wide")
    assert (row["shards"], row["bound"]) == (2, 4) and "holds" not in row, row
    attached.wait()
    for t in threads:
        t.join(timeout=120)
    assert errors == [], errors
    assert sorted(i & 0xFFFF for i in ids) == [0, 1, 2, 3], "slots 0-3: two clients in each shard"
    stats = stop_server(peer, server, daemon, "wide")
    assert (stats["taken"], stats["replied"], stats["skipped"], stats["departed"]) == (4 * rounds, 4 * rounds, 0, 4)
    assert daemon.service_row("wide")["shards"] == 2


def client_process(socket: Path, count: int, window: int = 4) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.Popen(
        [sys.executable, str(CLIENT), str(socket), "kv", str(count), str(window)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def test_client_processes_go_on_while_one_is_killed_mid_stream(kv: Kv, peer: Peer) -> None:
    daemon, server = kv
    victim = client_process(daemon.socket, 0, window=8)
    survivors = [client_process(daemon.socket, 3000) for _ in range(3)]
    try:
        assert victim.stdout is not None
        victim_id = int(victim.stdout.readline().split()[1])
        assert (victim_id, victim.pid) in daemon.bound("kv")
        # Every client streaming (the victim's requests interleave with the others'), then the kill.
        for p in [victim, *survivors]:
            assert p.stdout is not None
            line = p.stdout.readline()
            while not line.startswith("done"):
                assert line.startswith("id "), line
                line = p.stdout.readline()
        victim.send_signal(signal.SIGKILL)
        victim.wait(timeout=DEADLINE)
        # meshd sees the lease end and the process gone: it completes its sends and departs it.
        wait_until(lambda: all(i != victim_id for i, _ in daemon.bound("kv")), "the killed client's departure")
        for s in survivors:
            assert s.stdout is not None and s.stderr is not None
            # The rest through the file object the readline()s above read from: its buffer may already
            # hold all of it (communicate() reads the pipe beneath, and would miss that).
            out = s.stdout.read()
            s.wait(timeout=180)
            err = s.stderr.read()
            assert s.returncode == 0, f"{out}\n{err}"
            assert out.splitlines()[-1] == "ok 3000", out
    finally:
        for p in [victim, *survivors]:
            if p.poll() is None:
                p.kill()
                p.communicate()
    stats = stop_server(peer, server, daemon)
    # A send cut off by the kill is a skip, never a torn request; at most one per send in flight.
    assert stats["skipped"] <= 1, stats
    assert stats["departed"] == 4, stats
    assert stats["taken"] >= 3 * 3000 + 100, stats


def test_detach_and_reconnect_reuses_entries_once_the_server_has_acknowledged(daemon: Daemon, peer: Peer) -> None:
    client = daemon.client
    client.service_create("duo", clients=2, msg_size=16, capacity=8, reply_size=32, reply_capacity=4)
    # No server yet: entries are bound, then departed without an ack.
    a, b = client.service("duo"), meshd.Service.connect("duo", daemon.socket)
    assert (a.msg_size, a.reply_size) == (16, 32) and {a.id & 0xFFFF, b.id & 0xFFFF} == {0, 1}
    with pytest.raises(meshd.MeshdRefused, match="all 2 client slot"):
        client.service("duo")
    a_id = a.id
    a.close()
    with pytest.raises(meshd.MeshdRefused, match="acknowledged"):
        client.service("duo")
    assert daemon.service_row("duo")["awaiting_ack"] == 1
    server = peer.start_with_stdin("service-server", daemon.mailbox, "duo")  # killed at the end if need be
    assert server.stdout is not None and server.stdout.readline().strip() == "ready"
    c = client.service("duo")  # meshd waits a moment for the server's ack
    # The same entry, the next epoch: a new id, and a's replies never reach it.
    assert c.id & 0xFFFF == a_id & 0xFFFF and c.id != a_id
    for svc in (b, c):
        for k in range(20):
            assert svc.request(req(k, svc.id, 16), timeout=DEADLINE) == rsp(k, svc.id, 16) + bytes(16)
    b.close()
    c.close()
    stats = stop_server(peer, server, daemon, "duo")
    assert stats["departed"] == 3 and stats["replied"] == 40, stats


def test_a_client_closes_after_meshd_restarted_by_taking_its_lease_back(daemon: Daemon, peer: Peer) -> None:
    daemon.client.service_create("kv", clients=2, msg_size=64, capacity=64)
    svc = meshd.Service.connect("kv", daemon.socket, timeout=DEADLINE)
    daemon.child.kill()  # SIGKILL: the lease dies with it, the client stays bound in the mailbox
    daemon.child.wait()
    again = peer.start("serve-again", daemon.socket, daemon.mailbox)
    assert again.stdout is not None and again.stdout.readline().strip() == "ready"
    assert daemon.bound("kv") == [(svc.id, os.getpid())], "the new meshd finds the client still bound"
    svc.close()
    assert daemon.bound("kv") == [], "the close took the lease back from the new meshd and detached there"
    events = daemon.service_row("kv")["events"]
    assert (events["detached"], events["died"]) == (1, 0), events


def test_asyncio_clients_share_one_loop(kv: Kv, peer: Peer) -> None:
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
    stats = stop_server(peer, server, daemon)
    assert (stats["replied"], stats["departed"]) == (404, 4)


def test_a_service_left_unclosed_is_taken_back_when_collected(kv: Kv) -> None:
    daemon, _ = kv
    svc = meshd.Service.connect("kv", daemon.socket, timeout=DEADLINE)
    assert len(daemon.bound("kv")) == 1
    del svc
    wait_until(lambda: daemon.bound("kv") == [], "the lease's end")


def test_close_after_meshd_is_gone_is_quiet(daemon: Daemon, peer: Peer) -> None:
    daemon.client.service_create("kv", clients=2, msg_size=64)
    svc = meshd.Service.connect("kv", daemon.socket, timeout=DEADLINE)
    daemon.client.shutdown()
    peer.finish(daemon.child)
    svc.close()
    assert svc.closed


def test_blocking_calls_release_the_gil_wake_for_ctrl_c_and_time_out_on_a_full_ring(daemon: Daemon) -> None:
    # No server: requests stay in the fan-in ring, no reply comes.
    daemon.client.service_create("slow", clients=2, msg_size=8, capacity=4)
    with meshd.Service.connect("slow", daemon.socket, timeout=DEADLINE) as svc:
        def interrupted_request() -> None:
            previous = signal.signal(signal.SIGINT, signal.default_int_handler)
            timer = threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT))
            timer.start()
            try:
                with pytest.raises(KeyboardInterrupt):
                    svc.request(b"12345678", timeout=DEADLINE)
            finally:
                timer.cancel()
                signal.signal(signal.SIGINT, previous)

        assert python_ran_while(interrupted_request) > 10, "another thread ran Python while the request waited"
        for _ in range(3):
            assert svc.try_send(b"x")
        assert not svc.try_send(b"x"), "capacity 4: full without blocking"
        with pytest.raises(meshd.MeshTimeoutError) as e:
            svc.send(b"x", timeout=0.05)
        assert (e.value.channel, e.value.op) == ("slow", "send")
        with pytest.raises(meshd.MeshTimeoutError) as e:
            asyncio.run(svc.asend(b"x", timeout=0.05))
        assert (e.value.channel, e.value.op) == ("slow", "send")
        with pytest.raises(meshd.MeshTimeoutError) as e:
            asyncio.run(svc.arequest(b"x", timeout=0.05))
        assert e.value.op == "send"
        assert svc.try_recv() is None
