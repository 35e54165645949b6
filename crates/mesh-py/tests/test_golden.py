"""The client against the golden file (tests/golden/protocol.json) that meshd's Rust test writes (crates/meshd/tests/golden_protocol.rs): the same request bytes, every answer parsed."""

from __future__ import annotations

import typing
from pathlib import Path
from typing import Any

import pytest

import meshd
from meshd.control import (
    PROGRAM_STATES,
    ArenaRow,
    ChannelRow,
    Info,
    NativeRow,
    ProgramRow,
    RecoveryRow,
    ServiceClientRow,
    ServiceEvents,
    ServiceHold,
    ServiceRow,
    decode_response,
    encode_request,
    state_name,
)
from conftest import DEADLINE, Peer, StandInMeshd, golden, golden_names

IMAGE = b".version 8.0\n.target sm_90\n"


class Recorder(meshd.Client):
    """A client that records what it would send, answering every request with a golden response."""

    def __init__(self, answer: str = "ok") -> None:
        super().__init__("/nonexistent")
        self.sent: bytes = b""
        self.answer = answer

    def call(self, request: dict[str, Any], image: bytes = b"") -> dict[str, Any]:
        self.sent = encode_request(request, image)
        return decode_response(golden(f"{self.answer}.response"))


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
    "service_create": lambda c: c.service_create("kv", clients=8, msg_size=64),
    "service_create_replies": lambda c: c.service_create(
        "kv", clients=4, msg_size=64, capacity=64, reply_size=256, reply_capacity=4
    ),
    "service_create_shards": lambda c: c.service_create("kv", clients=8, msg_size=64, shards=4),
    "channel_delete": lambda c: c.channel_delete("to-gpu"),
    "channel_delete_discard": lambda c: c.channel_delete("to-gpu", discard=True),
    "service_delete": lambda c: c.service_delete("kv"),
    "service_delete_discard": lambda c: c.service_delete("kv", discard=True),
}
#: The requests a :class:`meshd.Service` sends on its lease (its own connection, not ``Client.call``):
#: checked against a stand-in meshd by ``test_the_lease_requests_are_byte_for_byte_the_clis``.
LEASE_REQUESTS = ("service_attach", "detach")
#: What a :class:`meshd.Service` sends to take back a lease that ended with a previous meshd, on a
#: connection of its own, before its ``detach``: checked by ``test_a_lease_taken_back_is_byte_for_byte_the_clis``.
RESUME_REQUESTS = ("service_resume",)
ANSWERS = {
    "load": "load",
    "load_shaped": "load",
    "upgrade": "load",
    "ps": "ps",
    "info": "info",
    "spawn": "spawn",
    "stop": "spawn",
    "metrics": "metrics",
    "service_create": "service_create",
    "service_create_replies": "service_create",
    "service_create_shards": "service_create",
    "channel_delete": "delete",
    "channel_delete_discard": "delete",
    "service_delete": "delete",
    "service_delete_discard": "delete",
}
CASES = golden_names(".request")


def test_every_golden_request_has_a_client_call() -> None:
    assert len(CASES) >= 11, "the golden cases are missing (crates/meshd/tests/golden_protocol.rs writes them)"
    missing = set(CASES) - set(REQUESTS) - set(LEASE_REQUESTS) - set(RESUME_REQUESTS)
    assert not missing, f"requests meshd has and the Python client cannot send: {sorted(missing)}"
    assert set(LEASE_REQUESTS) <= set(CASES), "the lease's golden requests are missing"


@pytest.mark.parametrize("case", [c for c in CASES if c not in LEASE_REQUESTS + RESUME_REQUESTS])
def test_requests_are_byte_for_byte_the_clis(case: str) -> None:
    client = Recorder(ANSWERS.get(case, "ok"))
    REQUESTS[case](client)
    assert client.sent == golden(f"{case}.request")


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
    assert decode_response(golden("load.response"))["backend_us"] == 125000
    assert Recorder("spawn").spawn("worker", ["x"])["pid"] == 31337


def test_service_answers_parse_into_the_typed_rows() -> None:
    assert Recorder("service_create").service_create("kv", clients=8, msg_size=64) is None
    assert decode_response(golden("service_create.response"))["backend_us"] == 1830
    info = Recorder("info_services").info()
    assert set(info) <= keys(Info), f"fields the client does not describe: {set(info) - keys(Info)}"
    for channel in info["channels"]:
        unknown = set(channel) - keys(ChannelRow)
        assert not unknown, f"fields the client does not describe: {unknown}"
    assert [(c["name"], c["protocol"], c.get("parts")) for c in info["channels"][:2]] == [
        ("kv", "fanin", None),
        ("kv.replies", "group", 8),
    ]
    kv, idle, torn = info["services"]
    for row in (kv, idle, torn):
        assert set(row) <= keys(ServiceRow), f"fields the client does not describe: {set(row) - keys(ServiceRow)}"
    assert (kv["name"], kv["entries"], kv["bound"], kv["awaiting_ack"]) == ("kv", 8, 2, 1)
    for client_row in kv["clients"]:
        assert set(client_row) == keys(ServiceClientRow)
    assert [(c["id"], c["pid"]) for c in kv["clients"]] == [(0x10000, 41), (0x20003, 42)]
    held = kv["held_by"]
    assert ServiceHold.__required_keys__ <= set(held) <= keys(ServiceHold)
    assert (held["client"], held["pid"], held["seq"], held["since_ms"], held["stopped"]) == (0x20003, 42, 7, 120, True)
    # An answer without shards (one ring, or a meshd before them): no `shards`, no `holds`, `shard` 0.
    assert "shards" not in kv and "holds" not in kv and held.get("shard", 0) == 0
    assert idle["clients"] == [] and "held_by" not in idle and "error" not in idle, "only a held ring carries one"
    assert set(kv["events"]) == keys(ServiceEvents) and "events" not in idle, "events only once something happened"
    ev = kv["events"]
    assert (ev["attached"], ev["detached"], ev["died"], ev["skipped"]) == (5, 1, 2, 1)
    assert (ev["stall_revoked"], ev["stall_killed"]) == (3, 1)
    assert torn["error"].startswith('channel "torn.replies": service group: entry 1')


def test_a_sharded_service_reads_its_shards_and_every_shard_s_hold() -> None:
    # meshd's encoding of a service of 4 fan-in shards, two of them held at once (shard 0 and shard 3).
    info = Recorder("info_services_shards").info()
    fanin, group = info["channels"]
    assert (fanin["name"], fanin["protocol"], fanin["parts"]) == ("wide", "fanin", 4), "a fan-in channel's shards"
    assert (group["protocol"], group["parts"]) == ("group", 8)
    [wide] = info["services"]
    assert set(wide) <= keys(ServiceRow), f"fields the client does not describe: {set(wide) - keys(ServiceRow)}"
    assert (wide["name"], wide["shards"], wide["bound"]) == ("wide", 4, 3)
    for hold in [wide["held_by"], *wide["holds"]]:
        assert ServiceHold.__required_keys__ <= set(hold) <= keys(ServiceHold)
    # Every hold by shard; shard 0 leaves its `shard` out; `held_by` is the first.
    assert [(h.get("shard", 0), h["client"], h["seq"], h["stopped"]) for h in wide["holds"]] == [
        (0, 0x10000, 9, True),
        (3, 0x10003, 2, False),
    ]
    assert wide["held_by"] == wide["holds"][0]


class LeaseRecorder(StandInMeshd):
    """A stand-in meshd that records every line each connection sends and answers with the golden
    answers: ``info`` names ``mailbox``, ``service_attach`` gets ``service_attach.response``, and
    the lease's ``detach`` ``ok.response`` (what meshd answers a detach)."""

    ANSWERS = {"service_attach": "service_attach", "detach": "ok"}

    def answer(self, op: str | None, n: int) -> bytes | None:
        return golden(f"{self.ANSWERS.get(op or '', 'refused')}.response")


def test_the_lease_requests_are_byte_for_byte_the_clis(tmp_path: Path, peer: Peer) -> None:
    # The service's channels, made by meshd's control plane (the peer's `serve`) from the golden
    # request's values: replies of 256 bytes to requests of 64, 4 client slots.
    daemon = peer.start("serve", tmp_path / "sock", tmp_path / "mailbox")
    assert daemon.stdout is not None and daemon.stdout.readline().strip() == "ready"
    client = meshd.Client(tmp_path / "sock", timeout=DEADLINE)
    REQUESTS["service_create_replies"](client)
    assert isinstance(client.last_backend_us, int), "a service create is a change: its answer says the backend's time"
    fake = LeaseRecorder(tmp_path / "mailbox", tmp_path / "fake.sock")
    try:
        svc = meshd.Service.connect("kv", fake.socket, timeout=DEADLINE)
        # The golden answer, read by the client: its id, its channels, and the sizes they have in the mailbox.
        assert (svc.id, svc.requests, svc.replies) == (0x10002, "kv", "kv.replies")
        assert (svc.msg_size, svc.reply_size) == (64, 256)
        svc.close()
    finally:
        fake.close()
    info, lease = fake.connections
    assert info == [golden("info.request")]
    assert lease == [golden(f"{case}.request") for case in LEASE_REQUESTS]


class RestartedLeaseRecorder(LeaseRecorder):
    """A :class:`LeaseRecorder` whose lease ends unanswered at the detach, as when meshd restarted
    since the attach; a ``service_resume`` then gets ``service_attach.response``."""

    ANSWERS = {**LeaseRecorder.ANSWERS, "service_resume": "service_attach"}

    def answer(self, op: str | None, n: int) -> bytes | None:
        if op == "detach" and len(self.connections) == 2:
            return None  # the lease (the second connection, after `info`) died with that meshd
        return super().answer(op, n)


def test_a_lease_taken_back_is_byte_for_byte_the_clis(tmp_path: Path, peer: Peer) -> None:
    daemon = peer.start("serve", tmp_path / "sock", tmp_path / "mailbox")
    assert daemon.stdout is not None and daemon.stdout.readline().strip() == "ready"
    REQUESTS["service_create_replies"](meshd.Client(tmp_path / "sock", timeout=DEADLINE))
    fake = RestartedLeaseRecorder(tmp_path / "mailbox", tmp_path / "fake.sock")
    try:
        svc = meshd.Service.connect("kv", fake.socket, timeout=DEADLINE)
        assert svc.id == 0x10002
        svc.close()
    finally:
        fake.close()
    _info, lease, resumed = fake.connections
    assert lease == [golden(f"{case}.request") for case in LEASE_REQUESTS], "the detach went on the old lease first"
    assert resumed == [golden("service_resume.request"), golden("detach.request")]


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


def test_a_delete_returns_the_count_meshd_answers_and_refuses_a_discard_that_is_no_bool() -> None:
    assert Recorder("delete").channel_delete("to-gpu", discard=True) == 3
    assert Recorder("delete").service_delete("kv") == 3
    assert Recorder("ok").channel_delete("to-gpu") == 0, "a meshd that sends no count dropped nothing"
    with pytest.raises(TypeError, match="discard"):
        Recorder("delete").channel_delete("to-gpu", discard=1)  # type: ignore[arg-type]
    info = Recorder("info").info()
    assert set(info["arena"]) == keys(ArenaRow), info["arena"]
