"""Fixtures of the meshd package's tests: the Rust peer (crates/mesh-py/examples/peer.rs) and mailboxes it makes."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Iterator

import pytest

REPO = Path(__file__).resolve().parents[3]
GOLDEN = Path(__file__).resolve().parent / "golden"
#: A deadline for things that take milliseconds (never a measurement).
DEADLINE = 30.0


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
