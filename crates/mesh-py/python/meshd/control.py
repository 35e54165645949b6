"""The control socket's client: the requests of the ``meshd`` command line, from Python.

One request per connection, as the CLI does: a JSON line (plus the image's bytes for ``load`` and
``upgrade``), then one JSON line back (but ``service_attach``, whose connection stays open as the
client's lease: :class:`meshd.Service`). The encoding is byte for byte the CLI's (serde_json's
compact form, fields in the protocol's order); a golden file written by meshd's Rust tests keeps
the two in step (``tests/golden/protocol.json``). A refusal raises :class:`MeshdRefused` with meshd's reason; no
meshd on the socket raises :class:`MeshdUnreachable`.

Messages do not go through the socket: :meth:`Client.producer` and :meth:`Client.consumer` ask
``info`` for the mailbox and claim a channel's end there, as ``meshd send`` and ``meshd recv`` do.
"""

from __future__ import annotations

import json
import math
import os
import socket as _socket
from pathlib import Path
from typing import Any, Callable, Sequence, TypedDict, Union

from ._errors import MeshdProtocolError, MeshdRefused, MeshdTimeout, MeshdUnreachable
from ._meshd import Consumer, CopyConfig, Mailbox, Producer, _default_socket

__all__ = [
    "Client",
    "DEFAULT_SOCKET",
    "ProgramRow",
    "RecoveryRow",
    "PROGRAM_STATES",
    "state_name",
    "NativeRow",
    "ChannelRow",
    "ServiceEvents",
    "ServiceRow",
    "ServiceClientRow",
    "ServiceHold",
    "Info",
    "Ps",
    "encode_request",
    "decode_response",
]

#: The socket meshd listens on without --socket (and MESHD_SOCKET unset).
DEFAULT_SOCKET = "/tmp/meshd.sock"
#: The longest response line read (as the CLI: a broken peer cannot make the client grow without end).
MAX_RESPONSE = 64 << 20

#: What :meth:`Client.service` attaches with: ``Service._attach``, set by ``meshd.service`` when it is
#: imported (``import meshd`` imports it). service.py builds on this module, so this module names
#: nothing of it: the package's imports go one way.
_service_attach: Callable[[Client, str], Any] | None = None

Image = Union[bytes, bytearray, memoryview, str, "os.PathLike[str]"]


#: What a program's ``state`` says, without its detail (see :func:`state_name`). ``recovering``: a
#: recovery in place (after a GPU fault or a dead MPS worker) has stopped it and not yet relaunched
#: it; its row's ``recovery`` then says from what and for how long.
PROGRAM_STATES = ("running", "recovering", "stopped", "exited", "faulted")


#: The ``slot`` a program held back shows in ``ps`` (it holds none).
HELD_SLOT = 0xFFFF_FFFF
#: How many user words a program slot holds (mesh.cuh's ``MESH_SLOT_USER_WORDS``).
USER_WORDS = 32
#: The capacity of a channel created without one, for ll and index (and the most bulk gets).
DEFAULT_CAPACITY = 1024
#: The slot bytes a bulk channel created without a capacity is sized to (16 MiB).
BULK_CAPACITY_BUDGET = 16 << 20
#: Above this message size a channel whose protocol is not given is bulk (64 KiB).
_LL_MAX = 64 << 10


def default_capacity(msg_size: int, protocol: str | None = None) -> int:
    """The capacity :meth:`Client.channel_create` (and ``meshd channel create``) gives a channel
    created without one: :data:`DEFAULT_CAPACITY` (1024) for ll and index; for bulk, as many
    messages as fit in :data:`BULK_CAPACITY_BUDGET` (16 MiB) of slots, rounded down to a power of
    two, at least 2 and at most 1024: 2 of 16 MiB, 16 of 1 MiB, 1024 of 16 KiB or less. Two is the
    least that lets a producer fill one slot while the consumer reads the other. ``protocol`` None
    goes by size, as meshd does: bulk above 64 KiB."""
    if protocol is None:
        protocol = "bulk" if msg_size > _LL_MAX else "ll"
    if protocol != "bulk":
        return DEFAULT_CAPACITY
    fit = min(max(BULK_CAPACITY_BUDGET // max(msg_size, 1), 2), DEFAULT_CAPACITY)
    return 1 << (fit.bit_length() - 1)


def state_name(state: str) -> str:
    """A state without its detail, as meshd's metrics label it: ``exited(3)`` → ``exited``, ``faulted: …`` → ``faulted``."""
    for i, c in enumerate(state):
        if c in "(: ":
            return state[:i]
    return state


class RecoveryRow(TypedDict):
    """The recovery in place that holds a program (a ``recovering`` row's ``recovery``)."""

    reason: str
    since_unix_ms: int
    elapsed_ms: int


class ProgramRow(TypedDict, total=False):
    """A program's row (``ps``, and the answer to ``load`` and ``upgrade``)."""

    name: str
    slot: int
    #: running, recovering, stopped, exited(N) or faulted: … (:data:`PROGRAM_STATES`, :func:`state_name`)
    state: str
    generation: int
    heartbeat: int
    worker_pid: int | None
    sms: int | None
    kind: str
    grid: list[int]
    block: list[int]
    restarts: int
    last_fault: str
    last_fault_unix_ms: int
    stopped_why: str
    recovery: RecoveryRow
    #: The :data:`USER_WORDS` words the program's kernel stored with ``mesh_user_store`` (0 where it
    #: stored none), read from its slot when ``ps`` answered; absent for a program held back (no slot).
    user: list[int]


class NativeRow(TypedDict):
    """A native GPU worker's row (``ps``, ``spawn``, ``stop``)."""

    name: str
    pid: int
    state: str
    bind: list[str]
    command: str
    isolation: str


class ChannelRow(TypedDict, total=False):
    """A channel's row in ``info`` (``placement`` and ``lost`` where the meshd reports them;
    ``protocol``; ``parts`` only for a bulk channel of more than one part, a fan-in channel of more
    than one shard, or a group, whose parts are its client slots)."""

    name: str
    msg_size: int
    capacity: int
    head: int
    tail: int
    placement: str
    protocol: str
    parts: int
    lost: int


class ServiceClientRow(TypedDict):
    """A client attached to a service (``info``'s ``services``): its id and its process."""

    id: int
    pid: int


class _ServiceHoldFields(TypedDict):
    """:class:`ServiceHold`'s fields that every meshd sends."""

    client: int
    pid: int
    seq: int
    since_ms: int
    stopped: bool


# A total=False subclass for the optional field, not NotRequired: under `from __future__ import
# annotations` Python 3.11's TypedDict cannot see NotRequired in a string annotation and would count
# `shard` as required.
class ServiceHold(_ServiceHoldFields, total=False):
    """A client holding a service's fan-in ring in the middle of writing a request, for longer than
    meshd's ``--client-stall-ms`` (``info``'s ``held_by`` and ``holds``): its id, its process, the
    request's sequence number (in its shard's ring), for how long (ms), whether the process is
    stopped, and the fan-in shard it holds (``shard``: absent for shard 0, and from a meshd before
    shards; read it with ``hold.get("shard", 0)``)."""

    shard: int


class ServiceEvents(TypedDict):
    """What happened to a service's clients since meshd started (``info``'s ``events``, absent while
    nothing has): clients attached; left alive (``detached``: a detach, or a live process closing its
    lease); departed because their process was gone (``died``); requests cut off by a death, which the
    program takes as skips (``skipped``); reservations the stall watcher revoked from a live client
    (``stall_revoked``: sent again) and clients it killed (``stall_killed``, also counted in ``died``)."""

    attached: int
    detached: int
    died: int
    skipped: int
    stall_revoked: int
    stall_killed: int


class ServiceRow(TypedDict, total=False):
    """A service in ``info``: its client slots (``entries``), the clients attached now (``bound``,
    ``clients``), its fan-in channel's shards (``shards``: absent when 1, as from a meshd before
    shards), the slots waiting for the server to acknowledge a departure (``awaiting_ack``), the
    clients holding its fan-in ring mid-send (only while one does: ``holds``, one per shard held, by
    shard; ``held_by``, the first of them, all a meshd before ``holds`` sends), ``error`` where
    its state could not be read, and its clients' ``events`` since meshd started."""

    name: str
    entries: int
    bound: int
    shards: int
    awaiting_ack: int
    clients: list[ServiceClientRow]
    held_by: ServiceHold
    holds: list[ServiceHold]
    error: str
    events: ServiceEvents


class ArenaRow(TypedDict):
    """The mailbox's room for channels in ``info``: the ring arena's bytes in use, free, and in the
    longest free run (a channel whose ring is longer is refused as fragmented, however many bytes
    are free in all), and the channel descriptors in use out of the total (a service takes two)."""

    in_use_bytes: int
    free_bytes: int
    largest_free_bytes: int
    descriptors_in_use: int
    descriptors_total: int


class Info(TypedDict, total=False):
    """The daemon's description of itself (``info``); ``pool`` in MPS mode; ``services`` and
    ``arena`` where the meshd has them."""

    mode: str
    mailbox: str
    device: str
    host_atomics: bool
    channels: list[ChannelRow]
    services: list[ServiceRow]
    arena: ArenaRow
    device_uuid: str
    device_selector: str
    pool: dict[str, Any]


class Ps(TypedDict):
    """``ps``: the programs, and the native GPU workers beside them."""

    programs: list[ProgramRow]
    natives: list[NativeRow]


def encode_request(request: dict[str, Any], image: bytes = b"") -> bytes:
    """A request as it goes on the wire: the JSON line (serde_json's compact form) and the image."""
    return json.dumps(request, separators=(",", ":"), ensure_ascii=False).encode() + b"\n" + bytes(image)


def decode_response(line: bytes) -> dict[str, Any]:
    """One response line as a dict; raises MeshdRefused when meshd refused the request."""
    try:
        resp = json.loads(line)
    except ValueError as e:
        raise MeshdProtocolError(f"malformed response from meshd: {e}") from None
    if not isinstance(resp, dict) or not isinstance(resp.get("ok"), bool):
        raise MeshdProtocolError(f"malformed response from meshd: {line[:200]!r}")
    if not resp["ok"]:
        reason = resp.get("error") or "refused"
        raise MeshdRefused(reason, backend_us=resp.get("backend_us"))
    return resp


# meshd's limit for an image (crates/meshd/src/protocol.rs, MAX_IMAGE).
MAX_IMAGE = 256 << 20


def _image_bytes(image: Image) -> bytes:
    if isinstance(image, (bytes, bytearray, memoryview)):
        data = bytes(image)
        if len(data) > MAX_IMAGE:
            raise MeshdRefused(f"image of {len(data)} bytes: larger than {MAX_IMAGE >> 20} MiB, meshd's limit")
        return data
    path = Path(image)
    try:
        with path.open("rb") as f:
            data = f.read(MAX_IMAGE + 1)  # a larger file (or /dev/zero) is refused without being read whole
    except OSError as e:
        raise MeshdRefused(f"image {path}: {e.strerror or e}") from None
    if len(data) > MAX_IMAGE:
        raise MeshdRefused(f"image {path}: larger than {MAX_IMAGE >> 20} MiB, meshd's limit for an image")
    return data


def _name(value: object, what: str) -> str:
    """A name argument: a str (meshd says what is wrong with its content); TypeError for anything else."""
    if not isinstance(value, str):
        raise TypeError(f"{what} {value!r}: expected a str, got {type(value).__name__}")
    return value


def _u32(value: object, what: str) -> int:
    """A count or size argument as meshd reads it (a u32): TypeError for what is no int (a bool
    included), ValueError out of range, before anything is sent (JSON would carry 2**64 as a float,
    and NaN as no JSON at all)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} {value!r}: expected an int, got {type(value).__name__}")
    if not 0 <= value < 2**32:
        raise ValueError(f"{what} {value}: expected an int from 0 to 2**32 - 1")
    return value


def _names(value: object, what: str) -> list[str]:
    """A sequence of names; a lone str is refused (``list("to-gpu")`` would be its letters)."""
    if isinstance(value, (str, bytes)):
        raise TypeError(f"{what} {value!r}: expected a list of str, got one {type(value).__name__} (write [{value!r}])")
    try:
        items = list(value)  # type: ignore[call-overload]
    except TypeError:
        raise TypeError(f"{what} {value!r}: expected a list of str, got {type(value).__name__}") from None
    return [_name(v, f"{what} item") for v in items]


def _timeout(value: float | None, what: str = "timeout") -> float | None:
    """A socket timeout: None (no limit, as inf) or seconds > 0; 0 would make the socket non-blocking."""
    if value is None or value == math.inf:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{what} {value!r}: expected None or a number of seconds")
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{what} {value}: expected None (no limit) or a number of seconds > 0")
    return float(value)


def _connect(client: Client) -> _socket.socket:
    """A connection to ``client``'s meshd: connected within its timeout (5 s when it has none),
    then set to that timeout for the answer; MeshdUnreachable when nothing answers there."""
    conn = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        conn.settimeout(client.timeout if client.timeout is not None else 5.0)
        conn.connect(str(client.socket))
    except OSError as e:
        conn.close()
        raise MeshdUnreachable(
            f"cannot reach meshd at {client.socket} (is `meshd run` running?): {e.strerror or e}",
            socket=str(client.socket),
        ) from None
    except BaseException:
        conn.close()
        raise
    conn.settimeout(client.timeout)
    return conn


def _dim3(value: int | Sequence[int], what: str) -> list[int]:
    dims = [value] if isinstance(value, int) else list(value)
    if not 1 <= len(dims) <= 3 or not all(isinstance(d, int) and 0 < d < 2**32 for d in dims):
        raise ValueError(f"{what} {value!r}: expected 1 to 3 positive integers")
    return dims + [1] * (3 - len(dims))


class Client:
    """A client of one meshd's control socket.

    ``socket``: the socket's path; default ``$MESHD_SOCKET``, else the meshd of ``$MESHD_DEVICE``'s GPU
    (``/tmp/meshd-GPU-….sock``; it must then be the GPU's whole UUID, as ``nvidia-smi -L`` shows it, or
    ValueError says what to set), else ``/tmp/meshd.sock`` (as the CLI).
    ``timeout``: seconds to wait for an answer (None or inf: as long as meshd takes; a load links
    first); a positive number, else ValueError. An answer that does not come in time raises
    :class:`MeshdTimeout` (a :class:`TimeoutError`).

    Requests are checked before they are sent: a name that is not a str, a size or count that is
    not an int from 0 to 2**32 - 1, and a lone str where a list of names is wanted raise TypeError
    or ValueError; meshd refuses the rest with its reason (:class:`MeshdRefused`).
    """

    def __init__(self, socket: str | os.PathLike[str] | None = None, timeout: float | None = None) -> None:
        self.socket = Path(socket if socket is not None else _default_socket())
        self.timeout = _timeout(timeout)
        #: Microseconds meshd's backend spent on the last change (load, upgrade, unload, channel create).
        self.last_backend_us: int | None = None
        self._mailbox: Mailbox | None = None

    def __repr__(self) -> str:
        return f"Client({str(self.socket)!r})"

    # ---- the wire ----

    def call(self, request: dict[str, Any], image: bytes = b"") -> dict[str, Any]:
        """Sends one request (a dict in the protocol's field order) and returns meshd's answer."""
        conn = _connect(self)
        try:
            # meshd may refuse before reading everything (a line too long) and close: the write then
            # fails, but its answer is there to read, and it says why.
            write_error: OSError | None = None
            try:
                conn.sendall(encode_request(request, image))
            except OSError as e:
                write_error = e
            line = self._read_line(conn, request.get("op"))
            if not line:
                why = f": {write_error}" if write_error else ""
                raise MeshdProtocolError(f"meshd closed the connection without answering{why}")
        finally:
            conn.close()
        resp = decode_response(line)
        self.last_backend_us = resp.get("backend_us")
        return resp

    @staticmethod
    def _read_line(conn: _socket.socket, op: object = None) -> bytes:
        chunks: list[bytes] = []
        size = 0
        while True:
            try:
                chunk = conn.recv(1 << 16)
            except TimeoutError:
                raise MeshdTimeout(
                    f"meshd did not answer {op or 'the request'} within {conn.gettimeout()} s",
                    op=op,
                    timeout=conn.gettimeout(),
                ) from None
            except OSError as e:
                raise MeshdProtocolError(f"reading meshd's answer: {e}") from None
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
            size += len(chunk)
            if b"\n" in chunk:
                return b"".join(chunks).split(b"\n", 1)[0]
            if size > MAX_RESPONSE:
                raise MeshdProtocolError(f"meshd's answer is longer than {MAX_RESPONSE} bytes")

    # ---- programs ----

    def load(
        self,
        name: str,
        image: Image,
        *,
        grid: int | Sequence[int] = 1,
        block: int | Sequence[int] = 32,
        shared_mem: int = 0,
        bind: Sequence[str] = (),
        sms: int | None = None,
        no_readiness: bool = False,
    ) -> ProgramRow:
        """Loads a program (PTX, LTO-IR, cubin or fatbin bytes, or a path to one); its row.

        ``no_readiness``: meshd's readiness check ignores this program's heartbeat (one that beats
        rarely by design); sent only when true, as the CLI does (a meshd without it ignores it).
        """
        req = {
            "op": "load",
            "name": _name(name, "program name"),
            "image_len": 0,
            "grid": _dim3(grid, "grid"),
            "block": _dim3(block, "block"),
            "shared_mem": _u32(shared_mem, "shared_mem"),
            "bind": _names(bind, "bind"),
            "sms": None if sms is None else _u32(sms, "sms"),
        }
        data = _image_bytes(image)
        req["image_len"] = len(data)
        if no_readiness:
            req["no_readiness"] = True
        return self._program(self.call(req, data))

    def upgrade(self, name: str, image: Image) -> ProgramRow:
        """Replaces a program's image; its row."""
        name = _name(name, "program name")
        data = _image_bytes(image)
        return self._program(self.call({"op": "upgrade", "name": name, "image_len": len(data)}, data))

    def unload(self, name: str) -> None:
        """Stops a program and frees its slot."""
        self.call({"op": "unload", "name": _name(name, "program name")})

    def ps(self) -> Ps:
        """Every program's status, and the native GPU workers."""
        resp = self.call({"op": "ps"})
        return {"programs": resp.get("programs") or [], "natives": resp.get("natives") or []}

    def user_words(self, name: str) -> list[int]:
        """Program ``name``'s :data:`USER_WORDS` user words: what its kernel stored with
        ``mesh_user_store`` (0 where it stored none), read from its slot now (``meshd user NAME``).
        MeshdRefused when no program has that name, or when it is held back (it holds no slot)."""
        name = _name(name, "program name")
        programs = self.ps()["programs"]
        row = next((p for p in programs if p.get("name") == name), None)
        # The texts are the CLI's (meshd's `protocol::user_words`).
        quoted = json.dumps(name, ensure_ascii=False)
        if row is None:
            loaded = ", ".join(str(p.get("name")) for p in programs) or "none"
            raise MeshdRefused(f"program {quoted}: not loaded (loaded: {loaded})")
        words = row.get("user")
        if not words:
            if row.get("slot") == HELD_SLOT:
                raise MeshdRefused(f"program {quoted}: held back, it holds no slot and so no user words")
            raise MeshdRefused(f"program {quoted}: meshd sent no user words (a meshd older than `meshd user`)")
        return [int(w) for w in words]

    @staticmethod
    def _program(resp: dict[str, Any]) -> ProgramRow:
        programs = resp.get("programs") or []
        if not programs:
            raise MeshdProtocolError("meshd answered without the program's row")
        row: ProgramRow = programs[0]
        return row

    # ---- the daemon and its channels ----

    def info(self) -> Info:
        """The daemon's mode, mailbox path, device and channels."""
        info = self.call({"op": "info"}).get("info")
        if not isinstance(info, dict):
            raise MeshdProtocolError("meshd sent no info")
        result: Info = info  # type: ignore[assignment]
        return result

    def channel_create(
        self,
        name: str,
        msg_size: int = 64,
        capacity: int | None = None,
        *,
        placement: str | None = None,
        protocol: str | None = None,
        parts: int | None = None,
    ) -> None:
        """Creates a channel of ``capacity`` messages of ``msg_size`` bytes (the CLI's defaults).

        ``capacity``: a power of two up to 2**24. Left out, :func:`default_capacity` picks it: 1024
        for ll and index, and for bulk as many as fit in 16 MiB of slots (2 to 1024: 2 messages of
        16 MiB, 16 of 1 MiB), so that a default bulk ring fits a default (64 MiB) mailbox. A ring
        the mailbox has no room for is refused (MeshdRefused: "mailbox full", with the bytes it needs
        and the bytes free).

        ``placement`` (``"host"`` or ``"device"``), where the meshd has it: sent only when given.
        ``protocol`` (``"ll"``, ``"bulk"`` or ``"index"``; meshd picks by size when not given: ll up
        to 64 KiB, bulk above): ``"index"`` is for channels whose both ends are host processes (the
        fastest host to host; no GPU program can bind it); ``"bulk"`` for messages of 16 B to 16 MiB
        (multiples of 16), moved with wide copies. :meth:`producer` and :meth:`consumer` give the
        end of whichever protocol the channel has, with the same copying calls (``send``,
        ``recv_into``, the batch forms); only bulk channels lend a slot in place (``send_view``,
        ``recv_view``: ll and index refuse them, their slots are not the message as sent), and
        only bulk ends take a ``copy_config``.

        ``parts`` (bulk only; a power of two from 1 to 32, ``msg_size`` a multiple of 16 × parts):
        every message is split into that many equal parts, each with its own flag and indices, so
        that as many GPU blocks serve each end of the one channel (``meshd channel create --parts``).
        Sent only when above 1: one part is the format every bulk channel had before. The host ends
        serve every part, with the same calls.
        """
        req: dict[str, Any] = {
            "op": "channel_create",
            "name": _name(name, "channel name"),
            "msg_size": _u32(msg_size, "msg_size"),
            "capacity": _u32(
                default_capacity(msg_size, protocol) if capacity is None else capacity, "capacity"
            ),
        }
        if placement:
            req["placement"] = _name(placement, "placement")
        if protocol:
            req["protocol"] = _name(protocol, "protocol")
        if parts is not None and parts != 1:
            req["parts"] = _u32(parts, "parts")
        self.call(req)

    def service_create(
        self,
        name: str,
        clients: int,
        msg_size: int,
        capacity: int = 256,
        reply_size: int | None = None,
        reply_capacity: int = 16,
        shards: int = 1,
    ) -> None:
        """Creates service ``name``: a fan-in channel ``name`` of ``capacity`` requests of ``msg_size``
        bytes (over all clients), and a channel group ``name.replies`` of ``clients`` reply rings of
        ``reply_capacity`` replies of ``reply_size`` bytes (None: ``msg_size``). Clients attach with
        :meth:`service` (or :meth:`Service.connect`); a program binds the two channels.

        ``shards`` (a power of two from 1 to 64; ``meshd service create --shards``) is for more
        clients sending in parallel: the fan-in channel becomes that many rings of ``capacity``
        requests each, every one with its own reservation cursor, and a client sends into shard
        (its slot mod ``shards``), so clients contend only with the clients of their shard (one
        shared cursor caps the senders near 3 M requests/s), and a program can serve them a warp
        each (``tests/programs/service.cu`` loaded with ``block=256`` serves 8 shards with 8 warps:
        12.6 M requests/s from 16 clients on the H200). A client's requests stay in order;
        across clients of different shards there is no order. Clients attach and send as to any
        service. Sent only when not 1: one ring is the format of every service before shards. A
        program built before shards refuses the binding (an unknown protocol), as does a meshd or
        client built before them; ``info`` shows the count (its service row's ``shards``).
        """
        req: dict[str, Any] = {
            "op": "service_create",
            "name": _name(name, "service name"),
            "clients": _u32(clients, "clients"),
            "msg_size": _u32(msg_size, "msg_size"),
            "capacity": _u32(capacity, "capacity"),
            "reply_size": None if reply_size is None else _u32(reply_size, "reply_size"),
            "reply_capacity": _u32(reply_capacity, "reply_capacity"),
        }
        if reply_size is None:
            del req["reply_size"]  # as the CLI: absent means msg_size
        if shards != 1:
            req["shards"] = _u32(shards, "shards")  # absent means one ring, which any meshd reads
        self.call(req)

    def channel_delete(self, name: str, discard: bool = False) -> int:
        """Deletes channel ``name`` (``meshd channel delete``): its ring's bytes are reused by the
        next channel created (a device ring's GPU memory is freed), and the name can be created
        again at once, with any size. Returns how many messages it held that were dropped.

        Refused (MeshdRefused, naming the holder) while a program binds the channel (unload it
        first) or a process holds one of its ends (a :meth:`producer` or :meth:`consumer` open,
        ``meshd send``, ``meshd recv``), and while it holds messages unless ``discard``. A service's
        two channels are deleted with the service (:meth:`service_delete`).
        """
        return self._delete("channel_delete", _name(name, "channel name"), discard)

    def service_delete(self, name: str, discard: bool = False) -> int:
        """Deletes service ``name`` (``meshd service delete``): its fan-in channel ``name`` and its
        group ``name.replies``, whose bytes are reused by the next channel created; the name can be
        created again at once. Returns how many requests and replies were dropped.

        Refused (MeshdRefused, naming the client's process) while a client is attached (a
        :class:`meshd.Service` open), while a program binds either channel, and while requests or
        replies are queued unless ``discard``.
        """
        return self._delete("service_delete", _name(name, "service name"), discard)

    def _delete(self, op: str, name: str, discard: bool) -> int:
        if not isinstance(discard, bool):
            raise TypeError(f"discard {discard!r}: expected a bool, got {type(discard).__name__}")
        req: dict[str, Any] = {"op": op, "name": name}
        if discard:
            req["discard"] = True  # absent means false, which any meshd reads
        discarded = self.call(req).get("discarded", 0)
        if isinstance(discarded, bool) or not isinstance(discarded, int):
            raise MeshdProtocolError(f"meshd answered {op} with discarded {discarded!r}, not a count")
        return discarded

    def service(self, name: str) -> Any:
        """Attaches to service ``name`` as a new client: a :class:`meshd.Service`, whose
        connection stays open as the client's lease until its ``close``."""
        if _service_attach is None:
            raise RuntimeError("meshd.service is not imported (`import meshd` imports it)")
        return _service_attach(self, _name(name, "service name"))

    def metrics(self) -> str:
        """meshd's Prometheus exposition (what its ``/metrics`` endpoint serves), from its snapshot."""
        text = self.call({"op": "metrics"}).get("metrics")
        if not isinstance(text, str):
            raise MeshdProtocolError("meshd answered metrics without the exposition")
        return text

    def shutdown(self) -> None:
        """Stops every program; meshd exits."""
        self.call({"op": "shutdown"})

    # ---- native GPU workers ----

    def spawn(
        self, name: str, command: Sequence[str], *, bind: Sequence[str] = (), ready_timeout: float = 30.0
    ) -> NativeRow:
        """Starts a native GPU worker (meshd's child); answered once it is ready."""
        if not (ready_timeout > 0 and ready_timeout != float("inf")):
            raise ValueError(f"ready_timeout {ready_timeout}: expected a positive number of seconds")
        if command is None:
            raise ValueError("command: expected the program and its arguments, got nothing")
        argv = _names(command, "command")
        if not argv:
            raise ValueError("command: expected the program and its arguments, got nothing")
        req = {
            "op": "spawn",
            "name": _name(name, "worker name"),
            "bind": _names(bind, "bind"),
            "command": argv,
            "ready_timeout_ms": math.ceil(ready_timeout * 1000),
        }
        return self._native(self.call(req))

    def stop(self, name: str) -> NativeRow:
        """Ends a native GPU worker: SIGTERM, then SIGKILL after the grace period."""
        return self._native(self.call({"op": "stop", "name": _name(name, "worker name")}))

    @staticmethod
    def _native(resp: dict[str, Any]) -> NativeRow:
        natives = resp.get("natives") or []
        if not natives:
            raise MeshdProtocolError("meshd answered without the worker's row")
        row: NativeRow = natives[0]
        return row

    # ---- messages, through the mailbox ----

    def mailbox(self) -> Mailbox:
        """The mailbox ``info`` names, mapped once per client."""
        if self._mailbox is None:
            self._mailbox = Mailbox.open(self.info()["mailbox"])
        return self._mailbox

    def producer(self, channel: str, copy_config: CopyConfig | None = None) -> Producer:
        """Claims the producer end of ``channel`` in this meshd's mailbox, whatever its protocol.

        ``copy_config``: a bulk channel's copy settings (None: the Rust host end's choice by message
        size, ``CopyConfig.for_producer``).
        """
        return self.mailbox().producer(channel, copy_config)

    def consumer(self, channel: str, copy_config: CopyConfig | None = None) -> Consumer:
        """Claims the consumer end of ``channel`` in this meshd's mailbox, whatever its protocol."""
        return self.mailbox().consumer(channel, copy_config)
