"""The docs' Python: every ``<!-- run: python -->`` block of README.md and docs/**/*.md, and the example
scripts the docs include (examples/*/*.py), run against meshd's control plane over the stand-in backend
(the Rust peer's ``serve``), with the example programs they talk to played on the host.

A stand-in meshd runs no kernel, so this test plays each example program the docs load, by its name,
with host ends of the program's channels: ``hello`` (examples/hello/hello.cu: capital letters),
``scale`` (examples/tutorial/scale.cu: words 1 and up times 2, times 3 from the first upgrade on),
``bulk-echo`` (examples/bulk/bulk_echo.cu) and ``kv-server`` (examples/services/kv_server.cu: the first
word plus one, played by the peer's ``service-server``). The GPU run executes the same files against
the real programs (examples/*/run.sh). Image files a snippet names are stand-in PTX headers.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest

import meshd
from conftest import DEADLINE, REPO, Peer

PTX = b".version 8.0\n.target sm_80\n.address_size 64\n"

if not (REPO / "README.md").is_file():
    # A GPU bundle carries the package's tests without the repository's docs; they run from a checkout.
    pytest.skip(f"no docs here ({REPO / 'README.md'} is missing): the docs' Python runs from a checkout", allow_module_level=True)


#: The package's own page (meshd's docs test reads README.md and docs/ only): its Python blocks run
#: here with the others, and every block on it must be one of them or an include (checked below).
PACKAGE_README = REPO / "crates/mesh-py/README.md"


def _python_blocks() -> list[tuple[str, str]]:
    """(page:line, code) for every block marked ``<!-- run: python -->``."""
    pages = [REPO / "README.md", PACKAGE_README, *sorted((REPO / "docs").rglob("*.md"))]
    found = []
    for page in pages:
        lines = page.read_text().splitlines()
        i = 0
        while i < len(lines):
            if lines[i].lstrip().startswith("```"):
                above = next((l for l in reversed(lines[:i]) if l.strip()), "")
                j = i + 1
                while j < len(lines) and not lines[j].lstrip().startswith("```"):
                    j += 1
                if above.strip() == "<!-- run: python -->":
                    found.append((f"{page.relative_to(REPO)}:{i + 1}", "\n".join(lines[i + 1 : j]) + "\n"))
                i = j + 1
            else:
                i += 1
    return found


BLOCKS = _python_blocks()


def _upper(msg: bytes) -> bytes:
    return msg.upper()


class Player:
    """Plays the example programs a snippet loads, on host ends of their channels, until stopped."""

    PROGRAMS: dict[str, tuple[str, str, str]] = {
        # name: (its input channel, its output channel, what it does)
        "hello": ("to-gpu", "from-gpu", "upper"),
        "scale": ("requests", "replies", "scale"),
        "bulk-echo": ("to-gpu", "from-gpu", "echo"),
    }

    def __init__(self, socket: Path, peer: Peer) -> None:
        self.client = meshd.Client(socket)
        self.peer = peer
        self.stop = threading.Event()
        #: Messages answered so far, by program name.
        self.played: dict[str, int] = {}
        self.errors: list[BaseException] = []
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=DEADLINE)
        if self.errors:
            raise self.errors[0]

    def _run(self) -> None:
        try:
            self._play()
        except BaseException as e:  # noqa: BLE001 - handed to the test by close()
            self.errors.append(e)

    def _play(self) -> None:
        ends: dict[str, tuple[meshd.Consumer, meshd.Producer, str]] = {}
        servers: dict[str, subprocess.Popen[str]] = {}
        mailbox: meshd.Mailbox | None = None
        buf = bytearray()
        while not self.stop.is_set():
            try:
                programs = {p["name"]: p for p in self.client.ps()["programs"]}
            except meshd.MeshError:
                time.sleep(0.01)  # the snippet shut meshd down
                continue
            for name in list(ends):
                if name not in programs:  # unloaded: free its ends for the next program
                    rx, tx, _ = ends.pop(name)
                    rx.close()
                    tx.close()
            for name, row in programs.items():
                if name == "kv-server" and name not in servers:
                    servers[name] = self.peer.start_with_stdin("service-server", self.client.info()["mailbox"], "kv")
                if name in ends or name not in self.PROGRAMS:
                    continue
                if mailbox is None:
                    mailbox = meshd.Mailbox.open(self.client.info()["mailbox"])
                src, dst, what = self.PROGRAMS[name]
                ends[name] = (mailbox.consumer(src), mailbox.producer(dst), what)
            for name, (rx, tx, what) in ends.items():
                if len(buf) != rx.msg_size:
                    buf = bytearray(rx.msg_size)
                while rx.try_recv_into(buf):
                    if what == "upper":
                        out: bytes | bytearray = _upper(bytes(buf))
                    elif what == "scale":
                        words = np.frombuffer(buf, np.uint32).copy()
                        words[1:] *= 2 if programs[name]["generation"] == 1 else 3
                        out = words.tobytes()
                    else:
                        out = buf
                    tx.send(out, timeout=DEADLINE)
                    self.played[name] = self.played.get(name, 0) + 1
            time.sleep(0.001)
        for rx, tx, _ in ends.values():
            rx.close()
            tx.close()
        # The service servers end with the test's peer (its close kills what still runs).


@pytest.fixture
def stand_in(tmp_path: Path, peer: Peer) -> Iterator[tuple[Path, Player]]:
    """A stand-in meshd (the peer's ``serve``) and a player of the example programs."""
    socket = tmp_path / "meshd.sock"
    server = peer.start("serve", socket, tmp_path / "mailbox")
    assert server.stdout is not None and server.stdout.readline().strip() == "ready"
    player = Player(socket, peer)
    yield socket, player
    player.close()
    try:
        meshd.Client(socket).shutdown()
    except meshd.MeshError:
        pass  # the snippet shut it down itself
    server.wait(timeout=DEADLINE)


def _run(code: str | Path, socket: Path, cwd: Path, *args: str) -> str:
    """Runs a snippet (code) or a script (path) in a Python of its own, as a reader would; its stdout."""
    argv = [sys.executable, str(code), *args] if isinstance(code, Path) else [sys.executable, "-c", code]
    env = {"MESHD_SOCKET": str(socket), "PATH": "/usr/bin:/bin"}
    env.update({k: v for k, v in os.environ.items() if k.startswith(("PYTHON", "HOME", "VIRTUAL_ENV"))})
    out = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, f"{code if isinstance(code, Path) else 'snippet'} failed:\n{out.stdout}\n{out.stderr}"
    return out.stdout


def _stand_in_images(code: str, cwd: Path) -> None:
    """Writes a stand-in PTX file for every image path the snippet names."""
    for path in set(re.findall(r"[\"']([\w./-]+\.(?:ptx|cubin|fatbin))[\"']", code)):
        target = cwd / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(PTX)


def test_every_block_of_the_packages_readme_runs_here_or_is_an_include_that_matches() -> None:
    lines = PACKAGE_README.read_text().splitlines()
    opened = [i for i, l in enumerate(lines) if l.lstrip().startswith("```")][::2]
    assert len(opened) >= 3, "the package README shows its calls"
    bad = []
    for i in opened:
        above = next((l.strip() for l in reversed(lines[:i]) if l.strip()), "")
        end = next(j for j in range(i + 1, len(lines)) if lines[j].lstrip().startswith("```"))
        body = "\n".join(lines[i + 1 : end]) + "\n"
        if above == "<!-- run: python -->":
            continue
        include = re.fullmatch(r"<!-- include: (examples/[^ #]+) -->", above)
        if include is None:
            bad.append(f"line {i + 1}: no <!-- run: python --> or <!-- include: examples/... --> above it")
        elif (REPO / include[1]).read_text() != body:
            bad.append(f"line {i + 1}: differs from {include[1]}")
    assert not bad, f"{PACKAGE_README.relative_to(REPO)}: {bad}"
    assert any(w.startswith("crates/mesh-py/README.md") for w, _ in BLOCKS), "its Python blocks run here"


def test_the_docs_have_python_blocks() -> None:
    assert len(BLOCKS) >= 2, BLOCKS
    print(f"{len(BLOCKS)} Python blocks in README.md and docs/")


@pytest.mark.parametrize("where,code", BLOCKS, ids=[w for w, _ in BLOCKS])
def test_python_block_runs(where: str, code: str, stand_in: tuple[Path, Player], tmp_path: Path) -> None:
    socket, _ = stand_in
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    _stand_in_images(code, cwd)
    _run(code, socket, cwd)


def test_hello_answers_in_capitals(stand_in: tuple[Path, Player], tmp_path: Path) -> None:
    socket, _ = stand_in
    client = meshd.Client(socket)
    for name in ("to-gpu", "from-gpu"):
        client.channel_create(name, msg_size=64, capacity=16)
    (tmp_path / "hello.ptx").write_bytes(PTX)
    client.load("hello", tmp_path / "hello.ptx", bind=["to-gpu", "from-gpu"])
    tx, rx = client.producer("to-gpu"), client.consumer("from-gpu")
    tx.send(b"hello, gpu", timeout=DEADLINE)
    assert rx.recv(timeout=DEADLINE).rstrip(b"\0") == b"HELLO, GPU"


def test_the_tutorial_scripts_talk_to_scale_and_see_the_upgrade(stand_in: tuple[Path, Player], tmp_path: Path) -> None:
    socket, player = stand_in
    client = meshd.Client(socket)
    client.channel_create("requests", msg_size=64, capacity=16)
    client.channel_create("replies", msg_size=64, capacity=16)
    (tmp_path / "scale.ptx").write_bytes(PTX)
    client.load("scale", tmp_path / "scale.ptx", bind=["requests", "replies"])
    out = _run(REPO / "examples/tutorial/client.py", socket, tmp_path)
    assert "got [2 4 6 8]" in out, out
    stream = subprocess.Popen(
        [sys.executable, str(REPO / "examples/tutorial/stream.py"), "20000"],
        env={**os.environ, "MESHD_SOCKET": str(socket)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    # The upgrade lands in the middle of the stream: after a thousand replies, well before 20000.
    deadline = time.monotonic() + DEADLINE
    while player.played.get("scale", 0) < 1000 and time.monotonic() < deadline:
        time.sleep(0.01)
    client.upgrade("scale", tmp_path / "scale.ptx")
    out, err = stream.communicate(timeout=120)
    assert stream.returncode == 0, f"{out}\n{err}"
    counts = re.search(r"20000 replies in order, none lost: (\d+) doubled .* (\d+) tripled", out)
    assert counts and int(counts[1]) > 0 and int(counts[2]) > 0, f"the upgrade fell outside the stream: {out}"


def test_the_bulk_script_moves_arrays_through_bulk_echo(stand_in: tuple[Path, Player], tmp_path: Path) -> None:
    socket, _ = stand_in
    client = meshd.Client(socket)
    for name in ("to-gpu", "from-gpu"):
        client.channel_create(name, msg_size=1 << 20, capacity=2, protocol="bulk")
    (tmp_path / "bulk_echo.ptx").write_bytes(PTX)
    client.load("bulk-echo", tmp_path / "bulk_echo.ptx", block=1024, bind=["to-gpu", "from-gpu"])
    out = _run(REPO / "examples/bulk/arrays.py", socket, tmp_path)
    assert out.startswith("bulk") and "echoed twice, checked" in out, out


def test_the_service_clients_get_their_own_replies(stand_in: tuple[Path, Player], tmp_path: Path) -> None:
    socket, _ = stand_in
    client = meshd.Client(socket)
    client.service_create("kv", clients=64, msg_size=64, shards=4)
    (tmp_path / "kv_server.ptx").write_bytes(PTX)
    client.load("kv-server", tmp_path / "kv_server.ptx", grid=4, block=256, bind=["kv", "kv.replies"])
    out = _run(REPO / "examples/services/clients.py", socket, tmp_path, "8", "50")
    assert "8 clients: 400 replies checked" in out, out


def test_the_at_least_once_client_answers_every_request_once(stand_in: tuple[Path, Player], tmp_path: Path) -> None:
    socket, _ = stand_in
    client = meshd.Client(socket)
    client.channel_create("requests", msg_size=64, capacity=16)
    client.channel_create("replies", msg_size=64, capacity=16)
    (tmp_path / "scale.ptx").write_bytes(PTX)
    client.load("scale", tmp_path / "scale.ptx", bind=["requests", "replies"])
    out = _run(REPO / "examples/at-least-once/client.py", socket, tmp_path)
    assert "100 requests answered, each used once" in out, out


def test_the_deploy_yaml_parses_as_one_configmap_and_one_daemonset() -> None:
    yaml = pytest.importorskip("yaml", reason="PyYAML is not installed (meshd's docs test checks the flags)")
    docs = [d for d in yaml.safe_load_all((REPO / "deploy/k8s/meshd-daemonset.yaml").read_text()) if d]
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == ["ConfigMap", "DaemonSet"], kinds
    pod = next(d for d in docs if d["kind"] == "DaemonSet")["spec"]["template"]["spec"]
    assert pod["hostIPC"] is True
    assert any("meshd run" in d["data"]["entrypoint.sh"] for d in docs if d["kind"] == "ConfigMap")
