"""A program's user words (``Client.user_words``) and a channel's default capacity (``channel_create`` without one), against meshd's control plane over the stand-in backend (the peer's ``serve``) and the golden file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import pytest

import meshd
from meshd.control import BULK_CAPACITY_BUDGET, USER_WORDS, decode_response, default_capacity
from conftest import DEADLINE, Peer, golden

PTX = b".version 8.0\n.target sm_90\n"


@pytest.fixture
def daemon(tmp_path: Path, peer: Peer) -> Iterator[tuple[meshd.Client, Path]]:
    socket = tmp_path / "sock"
    mailbox = tmp_path / "mailbox"
    child = peer.start("serve", socket, mailbox)
    assert child.stdout is not None and child.stdout.readline().strip() == "ready"
    client = meshd.Client(socket, timeout=DEADLINE)
    yield client, mailbox
    client.shutdown()
    peer.finish(child)


def test_a_programs_user_words_are_read_from_its_slot(daemon: tuple[meshd.Client, Path], peer: Peer) -> None:
    client, mailbox = daemon
    slot = client.load("counter", PTX)["slot"]
    assert client.user_words("counter") == [0] * USER_WORDS, "a fresh slot's words are zero"
    peer.run("user-store", mailbox, slot, "0=7", f"1={0xDEADBEEF}", "31=5")
    words = client.user_words("counter")
    assert len(words) == USER_WORDS
    assert (words[0], words[1], words[2], words[31]) == (7, 0xDEADBEEF, 0, 5)
    # Read now, not cached: a later store shows.
    peer.run("user-store", mailbox, slot, "0=8")
    assert client.user_words("counter")[0] == 8
    assert client.ps()["programs"][0]["user"] == client.user_words("counter")
    with pytest.raises(meshd.MeshdRefused) as e:
        client.user_words("nothing")
    assert e.value.reason == 'program "nothing": not loaded (loaded: counter)'


class Answering(meshd.Client):
    """A client whose every request is answered with the golden answer ``answer``."""

    def __init__(self, answer: str) -> None:
        super().__init__("/nonexistent")
        self.answer = answer

    def call(self, request: dict[str, Any], image: bytes = b"") -> dict[str, Any]:
        return decode_response(golden(f"{self.answer}.response"))


def test_user_words_parse_from_the_golden_answer_and_a_held_program_has_none() -> None:
    words = Answering("ps_user").user_words("counter")
    assert words[:2] == [7, 0xDEADBEEF] and len(words) == USER_WORDS
    with pytest.raises(meshd.MeshdRefused, match="meshd sent no user words"):
        Answering("ps").user_words("echo")


def test_the_default_capacity_is_meshds_by_message_size_and_protocol() -> None:
    table = json.loads(golden("default_capacity.json"))
    assert len(table) >= 10, "crates/meshd/tests/golden_protocol.rs writes the table"
    for msg_size, protocol, capacity in table:
        assert default_capacity(msg_size, protocol) == capacity, (msg_size, protocol)
    for msg_size in (16, 65552, 1 << 20, 16 << 20):
        c = default_capacity(msg_size, "bulk")
        assert c & (c - 1) == 0 and 2 <= c <= 1024
        assert c * msg_size <= max(BULK_CAPACITY_BUDGET, 2 * msg_size)


def test_a_bulk_channel_without_a_capacity_fits_and_too_large_a_ring_says_what_it_needs(
    daemon: tuple[meshd.Client, Path],
) -> None:
    client, _ = daemon
    # The stand-in's mailbox is 16 MiB: 1024 messages of 64 KiB + 16 would ask for 64 MiB.
    with pytest.raises(meshd.MeshdRefused) as e:
        client.channel_create("huge", msg_size=65552, capacity=1024)
    assert "mailbox full" in e.value.reason and "needs" in e.value.reason and "free" in e.value.reason
    client.channel_create("big", msg_size=65552)
    [row] = client.info()["channels"]
    assert (row["name"], row["protocol"], row["capacity"]) == ("big", "bulk", 128)
    with pytest.raises(meshd.MeshdRefused, match="a power of two"):
        client.channel_create("odd", msg_size=65552, capacity=3)


def test_the_cli_default_and_the_python_default_agree(daemon: tuple[meshd.Client, Path]) -> None:
    """The request a default ``channel_create`` sends carries the rule's capacity, for every protocol."""
    client, _ = daemon
    client.channel_create("ll", msg_size=64)
    client.channel_create("idx", msg_size=8, protocol="index")
    client.channel_create("blk", msg_size=1 << 16, protocol="bulk")
    caps = {c["name"]: c["capacity"] for c in client.info()["channels"]}
    assert caps == {"ll": 1024, "idx": 1024, "blk": 256}
