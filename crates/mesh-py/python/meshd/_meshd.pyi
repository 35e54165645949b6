"""Type stubs of the extension module ``meshd._meshd`` (the mailbox's host side, in Rust)."""

from collections.abc import Awaitable
from os import PathLike
from pathlib import Path
from types import TracebackType
from typing import Final

from typing_extensions import Buffer, Self

#: The mailbox layout version this build reads (a file of another version is refused).
LAYOUT_VERSION: Final[int]
#: The largest message size a channel of protocol ll or index may have (64 KiB).
MAX_MSG_SIZE: Final[int]
#: The largest message size a channel of protocol bulk may have (16 MiB).
MAX_BULK_MSG_SIZE: Final[int]

class CopyConfig:
    """How a bulk end copies messages (mesh-shm's ``CopyConfig``); a field left out takes
    ``CopyConfig.default()``'s value. ``threads`` is 1 to 64 (ValueError otherwise). An end claimed
    without one uses the Rust host end's choice by message size: a producer ``for_producer``, a
    consumer ``for_msg_size``."""

    def __init__(
        self, threads: int | None = None, min_part: int | None = None, non_temporal: bool | None = None
    ) -> None: ...
    @staticmethod
    def default() -> CopyConfig:
        """mesh-shm's ``CopyConfig::default()``."""
    @staticmethod
    def for_msg_size(msg_size: int) -> CopyConfig:
        """What a consumer claimed without a ``copy_config`` uses (``CopyConfig::for_msg_size``)."""
    @staticmethod
    def for_producer(msg_size: int) -> CopyConfig:
        """What a producer claimed without a ``copy_config`` uses (``CopyConfig::for_producer``: four
        streaming threads from 256 KiB to 4 MiB, otherwise as ``for_msg_size``)."""
    @property
    def threads(self) -> int:
        """Threads copying one message together, the caller's included."""
    @property
    def min_part(self) -> int:
        """The smallest share of a message worth another thread, in bytes."""
    @property
    def non_temporal(self) -> bool:
        """Streaming stores into the ring (the producer's copy)."""

class SlotView:
    """A bulk ring's slot lent to Python: ``with`` gives a memoryview of it, writable for a
    producer's slot (which holds whatever a message a lap ago left there, not zeros) and read-only
    for a consumer's message. Given back when the block ends: a producer's published (discarded
    when the block raises), a consumer's released. Giving it back while an export of the view lives
    (an array from ``numpy.frombuffer``, another memoryview) raises BufferError and keeps it lent;
    drop them, then call ``publish``/``discard``/``release``. Dropped without being given back: a
    producer's is not published, a consumer's not released (its message comes again)."""

    def __enter__(self) -> memoryview: ...
    def __exit__(
        self, t: type[BaseException] | None, v: BaseException | None, tb: TracebackType | None
    ) -> bool: ...
    def __buffer__(self, flags: int, /) -> memoryview: ...
    def __release_buffer__(self, view: memoryview, /) -> None: ...
    @property
    def view(self) -> memoryview:
        """The memoryview ``__enter__`` gives."""
    def publish(self) -> None:
        """A producer's slot: published as the next message."""
    def discard(self) -> None:
        """A producer's slot: given back unpublished (the next send reuses it)."""
    def release(self) -> None:
        """A consumer's slot: handed back to the producer."""
    @property
    def seq(self) -> int:
        """The message's sequence number in its channel."""
    @property
    def nbytes(self) -> int:
        """Bytes in the slot: the channel's ``msg_size``."""
    @property
    def readonly(self) -> bool:
        """True for a consumer's message (read-only), False for a producer's slot."""
    @property
    def done(self) -> bool:
        """Whether the slot was given back."""
    @property
    def exports(self) -> int:
        """Live exports (the memoryview ``__enter__`` gave included)."""

class ChannelInfo:
    """A channel as the mailbox's table describes it, with a snapshot of its indices and claims."""

    @property
    def index(self) -> int:
        """Its index in the mailbox's channel table (what a program binds)."""
    @property
    def name(self) -> str:
        """The channel's name."""
    @property
    def msg_size(self) -> int:
        """Bytes per message."""
    @property
    def capacity(self) -> int:
        """Messages the ring holds (a power of two)."""
    @property
    def head(self) -> int:
        """Messages ever sent, when this snapshot was taken."""
    @property
    def tail(self) -> int:
        """Messages ever received, when this snapshot was taken."""
    @property
    def producer_pid(self) -> int | None:
        """The live process holding the producer end, or None."""
    @property
    def consumer_pid(self) -> int | None:
        """The live process holding the consumer end, or None."""

class Mailbox:
    """A mapped mailbox file."""

    @staticmethod
    def open(path: str | PathLike[str]) -> Mailbox:
        """Maps the mailbox at ``path`` after validating it; LayoutVersionError names --fresh."""
    @property
    def path(self) -> Path:
        """The mailbox file."""
    @property
    def owner_pid(self) -> int | None:
        """The meshd that owns the mailbox (its pid), or None when none is recorded."""
    def channels(self) -> list[ChannelInfo]:
        """Every live channel, in table order."""
    def channel(self, name: str) -> ChannelInfo:
        """The live channel called ``name`` (NoSuchChannelError when none is)."""
    def producer(self, name: str, copy_config: CopyConfig | None = None) -> Producer:
        """The producer end of ``name``, whatever its protocol."""
    def consumer(self, name: str, copy_config: CopyConfig | None = None) -> Consumer:
        """The consumer end of ``name``, whatever its protocol."""

class Producer:
    """The sending end of a channel of any protocol, claimed for this process until closed.

    Timeouts are seconds: None or ``math.inf`` waits for ever, 0 tries once, a negative or NaN one
    raises ValueError. One end serves one thread at a time: a call from a second thread while
    another's call runs raises RuntimeError ("Already borrowed"); guard a shared end with a lock.
    After ``fork()`` the child's copy refuses every call with ClaimedError (the parent holds the
    claim) and releases nothing when dropped; a child claims its own ends."""

    def __init__(self, mailbox: Mailbox, name: str, copy_config: CopyConfig | None = None) -> None: ...
    @property
    def protocol(self) -> str:
        """``"ll"``, ``"bulk"`` or ``"index"``."""
    @property
    def copy_config(self) -> CopyConfig | None:
        """A bulk end's copy settings (None for ll and index)."""
    def send_view(self, timeout: float | None = None) -> SlotView:
        """Bulk channels: the next slot in place, waiting for room (MeshTimeoutError after ``timeout``
        seconds); published when its ``with`` ends, discarded when the block raises. The slot holds
        whatever a message a lap ago left there, not zeros: write every byte the consumer reads."""
    def try_send_view(self) -> SlotView | None:
        """``send_view`` without waiting: None when full. The slot holds whatever a message a lap ago
        left there."""
    @property
    def name(self) -> str:
        """The channel's name."""
    @property
    def msg_size(self) -> int:
        """Bytes per message: a message may be shorter (it is zero-padded), not longer."""
    @property
    def capacity(self) -> int:
        """Messages the ring holds."""
    @property
    def closed(self) -> bool:
        """Whether the end was closed (every call but ``close`` then raises ValueError)."""
    def try_send(self, msg: Buffer) -> bool:
        """One message of at most ``msg_size`` bytes (zero-padded); False when full. Keeps the GIL."""
    def send(self, msg: Buffer, timeout: float | None = None) -> None:
        """One message, waiting for room (GIL released); MeshTimeoutError after ``timeout`` seconds."""
    def try_send_batch(self, msgs: Buffer) -> int:
        """As many ``msg_size``-byte records as fit, published once; how many."""
    def send_batch(self, msgs: Buffer, timeout: float | None = None) -> None:
        """Every record, waiting for room; on timeout the exception's ``sent`` says how many went."""
    def close(self) -> None:
        """Releases the claim; BufferError while a view it lent is exported."""
    def __enter__(self) -> Self: ...
    def __exit__(
        self, t: type[BaseException] | None, v: BaseException | None, tb: TracebackType | None
    ) -> bool: ...

class Consumer:
    """The receiving end of a channel of any protocol, claimed for this process until closed.
    Timeouts, threads and ``fork()``: as :class:`Producer`."""

    def __init__(self, mailbox: Mailbox, name: str, copy_config: CopyConfig | None = None) -> None: ...
    @property
    def protocol(self) -> str:
        """``"ll"``, ``"bulk"`` or ``"index"``."""
    @property
    def copy_config(self) -> CopyConfig | None:
        """A bulk end's copy settings (None for ll and index)."""
    def recv_view(self, timeout: float | None = None) -> SlotView:
        """Bulk channels: the next message in place, read-only; released when its ``with`` ends."""
    def try_recv_view(self) -> SlotView | None:
        """``recv_view`` without waiting: None when no message is whole."""
    @property
    def name(self) -> str:
        """The channel's name."""
    @property
    def msg_size(self) -> int:
        """Bytes per message: every message received is exactly this long."""
    @property
    def capacity(self) -> int:
        """Messages the ring holds."""
    @property
    def closed(self) -> bool:
        """Whether the end was closed (every call but ``close`` then raises ValueError)."""
    def try_recv(self) -> bytes | None:
        """One message, or None when none is waiting. Keeps the GIL."""
    def recv(self, timeout: float | None = None) -> bytes:
        """One message, waiting (GIL released); MeshTimeoutError after ``timeout`` seconds."""
    def try_recv_into(self, buffer: Buffer) -> bool:
        """One message into a writable ``msg_size``-byte buffer; False when none is waiting."""
    def recv_into(self, buffer: Buffer, timeout: float | None = None) -> None:
        """One message into a writable buffer of exactly ``msg_size`` bytes, waiting (GIL released);
        MeshTimeoutError after ``timeout`` seconds (None: no limit). No bytes object is made: the
        fastest receive of large messages into a reused buffer (a bytearray, a numpy array)."""
    def try_recv_batch(self, buffer: Buffer) -> int:
        """As many messages as wait and fit in ``buffer`` (a non-zero multiple of ``msg_size``, else
        MessageSizeError); how many."""
    def recv_batch(self, buffer: Buffer, timeout: float | None = None) -> int:
        """At least one message into ``buffer``, waiting; how many."""
    def arecv(self, timeout: float | None = None) -> Awaitable[bytes]:
        """``recv`` for asyncio: polled from the event loop, no thread."""
    def arecv_into(self, buffer: Buffer, timeout: float | None = None) -> Awaitable[None]:
        """``recv_into`` for asyncio: polled from the event loop, no thread."""
    def close(self) -> None:
        """Releases the claim; BufferError while a view it lent is exported."""
    def __enter__(self) -> Self: ...
    def __exit__(
        self, t: type[BaseException] | None, v: BaseException | None, tb: TracebackType | None
    ) -> bool: ...

class FanInSender:
    """A service client's request end (a fan-in channel): every request carries the client's id.
    Claims nothing (many clients send into one channel). ``meshd.Service`` wraps it."""

    def __init__(self, mailbox: Mailbox, name: str, id: int) -> None: ...
    @property
    def name(self) -> str:
        """The service's fan-in channel."""
    @property
    def msg_size(self) -> int:
        """Bytes per request: a request may be shorter (it is zero-padded), not longer."""
    @property
    def capacity(self) -> int:
        """Requests the fan-in ring holds (each shard's, with shards)."""
    @property
    def id(self) -> int:
        """The client id (``slot | epoch << 16``) every request carries."""
    @property
    def closed(self) -> bool:
        """Whether the end was closed."""
    def try_send(self, msg: Buffer) -> bool:
        """One request of at most ``msg_size`` bytes (zero-padded); False when full. Keeps the GIL."""
    def send(self, msg: Buffer, timeout: float | None = None) -> None:
        """One request, waiting for room (GIL released); MeshTimeoutError after ``timeout`` seconds."""
    def close(self) -> None:
        """Closes the end (nothing is claimed, so nothing is released)."""
    def __enter__(self) -> Self: ...
    def __exit__(
        self, t: type[BaseException] | None, v: BaseException | None, tb: TracebackType | None
    ) -> bool: ...

class GroupClient:
    """A service client's reply ring in the service's channel group, claimed for this process until
    closed (ClaimedError while a live process holds it). ``meshd.Service`` wraps it."""

    def __init__(self, mailbox: Mailbox, name: str, id: int) -> None: ...
    @property
    def name(self) -> str:
        """The service's reply group."""
    @property
    def msg_size(self) -> int:
        """Bytes per reply: every reply received is exactly this long."""
    @property
    def capacity(self) -> int:
        """Replies the client's ring holds."""
    @property
    def id(self) -> int:
        """The client id (``slot | epoch << 16``) the replies are addressed to."""
    @property
    def closed(self) -> bool:
        """Whether the end was closed."""
    def try_recv(self) -> bytes | None:
        """One reply, or None when none is waiting. Keeps the GIL."""
    def recv(self, timeout: float | None = None, *, unanswered: int = 1) -> bytes:
        """One reply, waiting (GIL released); MeshTimeoutError after ``timeout`` seconds.
        ``unanswered``: the caller's requests in flight; above 1 the wait yields the CPU from the first
        poll instead of spinning first (it is streaming)."""
    def try_recv_into(self, buffer: Buffer) -> bool:
        """One reply into a writable ``msg_size``-byte buffer; False when none is waiting."""
    def recv_into(self, buffer: Buffer, timeout: float | None = None, *, unanswered: int = 1) -> None:
        """One reply into a writable ``msg_size``-byte buffer, waiting (GIL released);
        ``unanswered`` as for ``recv``."""
    def arecv(self, timeout: float | None = None) -> Awaitable[bytes]:
        """``recv`` for asyncio: polled from the event loop, no thread."""
    def arecv_into(self, buffer: Buffer, timeout: float | None = None) -> Awaitable[None]:
        """``recv_into`` for asyncio: polled from the event loop, no thread."""
    def close(self) -> None:
        """Releases the ring's claim."""
    def __enter__(self) -> Self: ...
    def __exit__(
        self, t: type[BaseException] | None, v: BaseException | None, tb: TracebackType | None
    ) -> bool: ...

def _timeout_error(channel: str, waited_ms: int, op: str = "recv") -> BaseException: ...
def _default_socket() -> str:
    """The control socket a client uses when given none: ``$MESHD_SOCKET``, else the meshd of
    ``$MESHD_DEVICE``'s GPU (a whole UUID), else ``/tmp/meshd.sock``; ValueError for another
    ``$MESHD_DEVICE``."""
