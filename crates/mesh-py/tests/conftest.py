"""Fixtures of the meshd package's tests: the Rust peer (crates/mesh-py/examples/peer.rs) and mailboxes it makes."""

from __future__ import annotations

import functools
import json
import os
import socket as _socket
import subprocess
import threading
from pathlib import Path
from typing import Callable, Iterator

import pytest

REPO = Path(__file__).resolve().parents[3]
#: The control protocol's golden file (crates/meshd/tests/golden_protocol.rs writes it): each case's
#: exact bytes as a string, by name (``load.request``, ``ps.response``, ``default_capacity.json``, ...).
GOLDEN_FILE = Path(__file__).resolve().parent / "golden" / "protocol.json"
#: A deadline for things that take milliseconds (never a measurement).
DEADLINE = 30.0


@functools.cache
def _golden_cases() -> dict[str, str]:
    cases = json.loads(GOLDEN_FILE.read_text(encoding="utf-8"))
    if not isinstance(cases, dict) or not all(isinstance(v, str) for v in cases.values()):
        raise ValueError(f"{GOLDEN_FILE}: not a JSON object of strings")
    return cases


def golden(name: str) -> bytes:
    """The exact bytes of golden case ``name`` (``load.request``, ``ps.response``, ...)."""
    cases = _golden_cases()
    if name not in cases:
        raise KeyError(f"{GOLDEN_FILE}: no case {name!r} (crates/meshd/tests/golden_protocol.rs writes them)")
    return cases[name].encode("utf-8")


def golden_names(suffix: str) -> list[str]:
    """The golden cases whose names end in ``suffix`` (``.request``), without it, sorted."""
    return sorted(n.removesuffix(suffix) for n in _golden_cases() if n.endswith(suffix))


def _find_peer() -> Path:
    if os.environ.get("MESH_PY_PEER"):
        return Path(os.environ["MESH_PY_PEER"])
    target = Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))
    for profile in ("release", "debug"):
        p = target / profile / "examples" / "peer"
        if p.exists():
            return p
    raise FileNotFoundError(
        f"the Rust peer is not built under {target}: run `cargo build --release -p mesh-py --example peer` "
        "(or set MESH_PY_PEER to its path)"
    )


def python_ran_while(call: Callable[[], object]) -> int:
    """How many times another thread ran a Python loop step while `call()` ran (it may raise: the
    count is taken either way). More than 0 means `call` released the GIL while it waited."""
    ticks = 0
    stop = threading.Event()

    def count() -> None:
        nonlocal ticks
        while not stop.is_set():
            ticks += 1

    t = threading.Thread(target=count)
    t.start()
    try:
        call()
    finally:
        seen = ticks
        stop.set()
        t.join()
    return seen


class StandInMeshd:
    """A stand-in control socket, for what meshd itself never answers or to record what a client
    sends: ``info`` is answered with ``mailbox`` (and no channels), every other request line with
    :meth:`answer`; every connection's lines are kept in ``connections``, in order."""

    def __init__(self, mailbox: Path, socket: Path) -> None:
        self.mailbox, self.socket = mailbox, socket
        self.connections: list[list[bytes]] = []
        self.listener = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        self.listener.bind(str(socket))
        self.listener.listen(8)
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self.listener.close()

    def answer(self, op: str | None, n: int) -> bytes | None:
        """The answer line to request ``op``, line ``n`` of its connection; None closes the
        connection unanswered."""
        raise NotImplementedError

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            lines: list[bytes] = []
            self.connections.append(lines)
            with conn, conn.makefile("rb") as reader:
                for line in reader:  # until the client closes its end, or an answer is None
                    lines.append(line)
                    op = json.loads(line).get("op")
                    if op == "info":
                        info = {"ok": True, "info": {"mailbox": str(self.mailbox), "channels": []}}
                        answer: bytes | None = json.dumps(info).encode() + b"\n"
                    else:
                        answer = self.answer(op, len(lines) - 1)
                    if answer is None:
                        break
                    conn.sendall(answer)


@pytest.fixture(scope="session")
def peer_bin() -> Path:
    return _find_peer()


class Peer:
    """Runs the Rust peer's subcommands."""

    def __init__(self, exe: Path) -> None:
        self.exe = exe
        self.children: list[subprocess.Popen[str]] = []

    def run(self, *args: object) -> dict[str, str]:
        """Runs one subcommand to its end; its `key value` lines (fails the test on a non-zero exit)."""
        out = subprocess.run(
            [str(self.exe), *map(str, args)], capture_output=True, text=True, timeout=120, check=False
        )
        assert out.returncode == 0, f"peer {args} failed ({out.returncode}):\n{out.stdout}\n{out.stderr}"
        return self.parse(out.stdout)

    def start(self, *args: object) -> subprocess.Popen[str]:
        """Starts a subcommand in the background (killed at the end of the test if still running)."""
        child = subprocess.Popen(
            [str(self.exe), *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        self.children.append(child)
        return child

    def start_with_stdin(self, *args: object) -> subprocess.Popen[str]:
        """`start` with a pipe for stdin: a subcommand that runs until its stdin closes (`finish` closes it)."""
        child = subprocess.Popen(
            [str(self.exe), *map(str, args)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.children.append(child)
        return child

    def finish(self, child: subprocess.Popen[str]) -> dict[str, str]:
        out, err = child.communicate(timeout=120)
        assert child.returncode == 0, f"peer failed ({child.returncode}):\n{out}\n{err}"
        return self.parse(out)

    @staticmethod
    def parse(stdout: str) -> dict[str, str]:
        return dict(line.split(" ", 1) for line in stdout.splitlines() if " " in line)

    def close(self) -> None:
        for c in self.children:
            if c.poll() is None:
                c.kill()
            c.communicate()


@pytest.fixture
def peer(peer_bin: Path) -> Iterator[Peer]:
    p = Peer(peer_bin)
    yield p
    p.close()


@pytest.fixture
def mailbox_path(tmp_path: Path, peer: Peer) -> Path:
    """A mailbox with channels `small` (8 B x 1024), `vec` (256 B x 64), `big` (64 KiB x 16), `back` (256 B x 64)."""
    path = tmp_path / "mailbox"
    peer.run("mailbox", path, "small:8:1024", "vec:256:64", "big:65536:16", "back:256:64")
    return path
