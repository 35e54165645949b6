"""The control client against meshd's control plane over a stand-in backend (the peer's `serve`), and messages through the mailbox that `info` names."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Iterator

import pytest

import meshd
from conftest import DEADLINE, Peer

PTX = b".version 8.0\n.target sm_90\n"


@pytest.fixture
def daemon(tmp_path: Path, peer: Peer) -> Iterator[tuple[meshd.Client, subprocess.Popen[str]]]:
    socket = tmp_path / "sock"
    child = peer.start("serve", socket, tmp_path / "mailbox")
    assert child.stdout is not None and child.stdout.readline().strip() == "ready"
    yield meshd.Client(socket, timeout=DEADLINE), child


def test_every_request_is_served_and_refusals_carry_meshds_reason(
    daemon: tuple[meshd.Client, subprocess.Popen[str]], tmp_path: Path, peer: Peer
) -> None:
    client, child = daemon
    info = client.info()
    assert (info["mode"], info["device"], info["channels"]) == ("blink", "stand-in (no GPU)", [])
    client.channel_create("to-gpu", msg_size=64, capacity=16)
    client.channel_create("from-gpu", msg_size=64, capacity=16)
    with pytest.raises(meshd.MeshdRefused) as e:
        client.channel_create("odd", msg_size=12, capacity=8)
    assert "multiple of 8" in e.value.reason and str(e.value) == e.value.reason
    assert [c["name"] for c in client.info()["channels"]] == ["to-gpu", "from-gpu"]

    row = client.load("echo", PTX, grid=2, block=(64,), bind=["to-gpu", "from-gpu"])
    assert (row["name"], row["grid"], row["block"], row["generation"]) == ("echo", [2, 1, 1], [64, 1, 1], 1)
    assert client.last_backend_us is not None
    image = tmp_path / "echo.ptx"
    image.write_bytes(PTX)
    with pytest.raises(meshd.MeshdRefused, match="already loaded"):
        client.load("echo", image)
    with pytest.raises(meshd.MeshdRefused, match="neither PTX"):
        client.load("junk", b"junk")
    assert client.upgrade("echo", image)["generation"] == 2
    ps = client.ps()
    assert [p["name"] for p in ps["programs"]] == ["echo"] and ps["natives"] == []
    client.unload("echo")
    assert client.ps()["programs"] == []
    with pytest.raises(meshd.MeshdRefused):
        client.unload("echo")
    with pytest.raises(meshd.MeshdRefused):
        client.stop("no-such-worker")

    # Messages go through the mailbox info names, as `meshd send` and `meshd recv` do.
    with client.producer("to-gpu") as tx, client.consumer("to-gpu") as rx:
        tx.send(b"hello from python", timeout=DEADLINE)
        assert rx.recv(timeout=DEADLINE).rstrip(b"\0") == b"hello from python"
    assert client.info()["channels"][0]["head"] == 1

    client.shutdown()
    assert peer.finish(child)["stopped"] == "clean=true"
    with pytest.raises(meshd.MeshdUnreachable) as e2:
        client.ps()
    assert isinstance(e2.value, ConnectionError) and "is `meshd run` running?" in str(e2.value)


def test_an_index_channel_carries_messages_between_host_ends_and_no_program_binds_it(
    daemon: tuple[meshd.Client, subprocess.Popen[str]],
) -> None:
    client, _ = daemon
    client.channel_create("h2h", msg_size=8, capacity=64, protocol="index")
    with pytest.raises(meshd.MeshdRefused) as e:
        client.channel_create("odd", msg_size=12, capacity=8, protocol="index")
    assert "odd" in e.value.reason or "12" in e.value.reason, e.value.reason
    [row] = client.info()["channels"]
    assert (row["name"], row["protocol"]) == ("h2h", "index"), row
    with pytest.raises(meshd.MeshdRefused) as e:
        client.load("echo", PTX, bind=["h2h"])
    assert "h2h" in e.value.reason, e.value.reason
    assert client.ps()["programs"] == [], "a refused load leaves nothing behind"
    # Sequence-checked through the ring (more messages than slots: it wraps many times).
    with client.producer("h2h") as tx, client.consumer("h2h") as rx:
        for i in range(1000):
            tx.send(i.to_bytes(8, "little"), timeout=DEADLINE)
            assert int.from_bytes(rx.recv(timeout=DEADLINE), "little") == i
    assert client.info()["channels"][0]["head"] == 1000


def test_bad_arguments_are_refused_before_sending(daemon: tuple[meshd.Client, subprocess.Popen[str]]) -> None:
    client, _ = daemon
    with pytest.raises(ValueError, match="grid"):
        client.load("x", PTX, grid=(1, 2, 3, 4))
    with pytest.raises(ValueError, match="ready_timeout"):
        client.spawn("w", ["true"], ready_timeout=0)
    with pytest.raises(meshd.MeshdRefused, match="image"):
        client.load("x", "/nonexistent/image.ptx")
    with pytest.raises(meshd.MeshdRefused, match="larger than 256 MiB"):
        client.load("x", "/dev/zero")


def test_the_default_socket_follows_the_cli(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MESHD_SOCKET", raising=False)
    monkeypatch.delenv("MESHD_DEVICE", raising=False)
    assert str(meshd.Client().socket) == "/tmp/meshd.sock"
    # A meshd started for one GPU (`meshd --device GPU-… run`) listens on /tmp/meshd-<its UUID>.sock.
    monkeypatch.setenv("MESHD_DEVICE", "GPU-5F3A0011-2233-4455-6677-8899AABBCCDD")
    assert str(meshd.Client().socket) == "/tmp/meshd-GPU-5f3a0011-2233-4455-6677-8899aabbccdd.sock"
    # An ordinal needs the driver to become a UUID: the client says what to set instead.
    monkeypatch.setenv("MESHD_DEVICE", "1")
    with pytest.raises(ValueError, match=r"MESHD_DEVICE=1.*MESHD_SOCKET"):
        meshd.Client()
    monkeypatch.setenv("MESHD_SOCKET", "/run/x.sock")
    assert str(meshd.Client().socket) == "/run/x.sock"


def test_a_deleted_channel_or_service_frees_its_room_and_its_name(
    daemon: tuple[meshd.Client, subprocess.Popen[str]],
) -> None:
    client, _ = daemon
    empty = client.info()["arena"]
    client.channel_create("jobs", msg_size=64, capacity=16)
    assert client.info()["arena"]["descriptors_in_use"] == empty["descriptors_in_use"] + 1
    with client.producer("jobs") as tx:
        with pytest.raises(meshd.MeshdRefused) as e:
            client.channel_delete("jobs", discard=True)
        assert "producer" in e.value.reason, e.value.reason
        tx.send(b"one", timeout=DEADLINE)
        tx.send(b"two", timeout=DEADLINE)
    with pytest.raises(meshd.MeshdRefused, match="2 message"):
        client.channel_delete("jobs")
    assert client.channel_delete("jobs", discard=True) == 2
    assert client.info()["arena"] == empty
    client.channel_create("jobs", msg_size=4096, capacity=4)  # the name again, another size
    assert client.channel_delete("jobs") == 0

    client.service_create("kv", clients=2, msg_size=64)
    with client.service("kv") as svc:
        with pytest.raises(meshd.MeshdRefused) as refused:
            client.service_delete("kv")
        assert f"pid {os.getpid()}" in refused.value.reason and "attached" in refused.value.reason
        assert svc.id >= 0
    assert client.service_delete("kv") == 0
    assert client.info()["arena"] == empty
    with pytest.raises(meshd.MeshdRefused, match="kv"):
        client.service_delete("kv")
