"""The client against the golden files meshd's Rust test writes (crates/meshd/tests/golden_protocol.rs): the same request bytes, every answer parsed."""

from __future__ import annotations

import typing
from typing import Any

import pytest

import meshd
from meshd.control import (
    PROGRAM_STATES,
    ChannelRow,
    Info,
    NativeRow,
    ProgramRow,
    RecoveryRow,
    decode_response,
    encode_request,
    state_name,
)
from conftest import GOLDEN

IMAGE = b".version 8.0\n.target sm_90\n"


class Recorder(meshd.Client):
    """A client that records what it would send, answering every request with a golden response."""

    def __init__(self, answer: str = "ok") -> None:
        super().__init__("/nonexistent")
        self.sent: bytes = b""
        self.answer = answer

    def call(self, request: dict[str, Any], image: bytes = b"") -> dict[str, Any]:
        self.sent = encode_request(request, image)
        return decode_response((GOLDEN / f"{self.answer}.response").read_bytes())


REQUESTS = {
    "load": lambda c: c.load("echo", IMAGE, bind=["to-gpu", "from-gpu"]),
    "load_shaped": lambda c: c.load("wide", IMAGE, grid=(4, 2), block=128, shared_mem=1024, sms=16),
    "upgrade": lambda c: c.upgrade("echo", IMAGE),
    "unload": lambda c: c.unload("echo"),
    "ps": lambda c: c.ps(),
    "info": lambda c: c.info(),
    "shutdown": lambda c: c.shutdown(),
    "channel_create": lambda c: c.channel_create("to-gpu", msg_size=64, capacity=16),
    "channel_create_utf8": lambda c: c.channel_create("entrée-é", msg_size=8),
    "channel_create_device": lambda c: c.channel_create("g2g", msg_size=64, capacity=16, placement="device"),
    "channel_create_index": lambda c: c.channel_create("h2h", msg_size=8, protocol="index"),
    "channel_create_parts": lambda c: c.channel_create("wide", msg_size=1 << 20, capacity=4, parts=32),
    "spawn": lambda c: c.spawn(
        "worker", ["./native-cuda", "--iterations", "3"], bind=["to-gpu", "from-gpu"], ready_timeout=2.5
    ),
    "stop": lambda c: c.stop("worker"),
    "metrics": lambda c: c.metrics(),
}
ANSWERS = {
    "load": "load",
    "load_shaped": "load",
    "upgrade": "load",
    "ps": "ps",
    "info": "info",
    "spawn": "spawn",
    "stop": "spawn",
    "metrics": "metrics",
}
CASES = sorted(p.name.removesuffix(".request") for p in GOLDEN.glob("*.request"))


def test_every_golden_request_has_a_client_call() -> None:
    assert len(CASES) >= 11, "the golden files are missing (crates/meshd/tests/golden_protocol.rs writes them)"
    missing = set(CASES) - set(REQUESTS)
    assert not missing, f"requests meshd has and the Python client cannot send: {sorted(missing)}"


@pytest.mark.parametrize("case", CASES)
def test_requests_are_byte_for_byte_the_clis(case: str) -> None:
    client = Recorder(ANSWERS.get(case, "ok"))
    REQUESTS[case](client)
    assert client.sent == (GOLDEN / f"{case}.request").read_bytes()


def keys(t: type) -> set[str]:
    return set(typing.get_type_hints(t))


def test_answers_parse_into_the_typed_rows() -> None:
    ps = Recorder("ps").ps()
    assert [p["name"] for p in ps["programs"]] == ["echo", "fault"]
    for p in ps["programs"]:
        assert set(p) <= keys(ProgramRow), f"fields the client does not describe: {set(p) - keys(ProgramRow)}"
    assert ps["programs"][1]["stopped_why"].startswith("caused a GPU fault")
    assert set(ps["natives"][0]) == keys(NativeRow)
    assert Recorder("ps_empty").ps() == {"programs": [], "natives": []}
    info = Recorder("info").info()
    assert set(info) <= keys(Info) and info["mailbox"] == "/dev/shm/meshd.mailbox"
    assert set(info["channels"][0]) <= keys(ChannelRow) and info["channels"][1]["name"] == "entrée-é"
    assert info["pool"]["recent"][0]["program"] == "echo"
    client = Recorder("load")
    row = client.load("echo", IMAGE)
    assert (row["name"], row["worker_pid"], client.last_backend_us) == ("echo", 4242, None)
    assert decode_response((GOLDEN / "load.response").read_bytes())["backend_us"] == 125000
    assert Recorder("spawn").spawn("worker", ["x"])["pid"] == 31337


def test_a_program_held_by_a_recovery_in_place_reads_as_recovering() -> None:
    ps = Recorder("ps_recovering").ps()
    echo, bystander = ps["programs"]
    assert set(echo) <= keys(ProgramRow), f"fields the client does not describe: {set(echo) - keys(ProgramRow)}"
    assert echo["state"] == "recovering" and state_name(echo["state"]) in PROGRAM_STATES
    assert set(echo["recovery"]) == keys(RecoveryRow)
    assert echo["recovery"]["reason"] == "the worker of bystander2 died (signal 9)"
    assert (echo["recovery"]["since_unix_ms"], echo["recovery"]["elapsed_ms"]) == (1764748800000, 812)
    assert bystander["state"] == "running" and "recovery" not in bystander, "only a held program carries one"
    assert [state_name(s) for s in ("exited(3)", "faulted: CUDA_ERROR_ILLEGAL_ADDRESS", "recovering")] == [
        "exited",
        "faulted",
        "recovering",
    ]


def test_a_refusal_raises_with_meshds_reason() -> None:
    with pytest.raises(meshd.MeshdRefused) as e:
        Recorder("refused").unload("zzz")
    assert e.value.reason == 'program "zzz": no such program' and e.value.backend_us == 87


def test_malformed_answers_are_protocol_errors() -> None:
    with pytest.raises(meshd.MeshdProtocolError, match="malformed"):
        decode_response(b"not json")
    with pytest.raises(meshd.MeshdProtocolError, match="malformed"):
        decode_response(b'{"programs": []}')


class Answering(meshd.Client):
    """A client that records its request and answers with the given line."""

    def __init__(self, answer: bytes) -> None:
        super().__init__("/nonexistent")
        self.answer = answer
        self.sent = b""

    def call(self, request: dict[str, Any], image: bytes = b"") -> dict[str, Any]:
        self.sent = encode_request(request, image)
        return decode_response(self.answer)


def test_metrics_and_the_optional_fields_newer_meshds_take() -> None:
    # Pinned byte for byte by golden files once meshd's golden test has a metrics case; until then
    # the shape of the request and the answer, as meshd's protocol declares them.
    c = Answering(b'{"ok":true,"metrics":"# TYPE meshd_up gauge\\nmeshd_up 1\\n"}')
    assert c.metrics() == "# TYPE meshd_up gauge\nmeshd_up 1\n" and c.sent == b'{"op":"metrics"}\n'
    with pytest.raises(meshd.MeshdProtocolError):
        Answering(b'{"ok":true}').metrics()
    # Fields with serde defaults go only when set, in the protocol's order, so an older meshd reads the rest.
    c = Answering(b'{"ok":true,"programs":[{"name":"x"}]}')
    c.load("x", IMAGE, no_readiness=True)
    assert c.sent.split(b"\n")[0].endswith(b',"sms":null,"no_readiness":true}')
    c.channel_create("d", msg_size=8, capacity=2, placement="device")
    assert c.sent == b'{"op":"channel_create","name":"d","msg_size":8,"capacity":2,"placement":"device"}\n'
