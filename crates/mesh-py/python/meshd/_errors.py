"""The exceptions of the meshd package: one class per mesh-shm error kind, and the control socket's.

Every exception carries the text that mesh-shm (or meshd) wrote, and the values it names as
attributes (``channel``, ``pid``, ``size``, ...). All derive from :class:`MeshError`; where a builtin
class means the same thing (a timeout, a bad value, a missing file) they derive from it too.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "MeshError",
    "MailboxIOError",
    "MailboxExistsError",
    "MailboxInvalidError",
    "LayoutVersionError",
    "MailboxConfigError",
    "NoSuchChannelError",
    "ChannelExistsError",
    "ChannelConfigError",
    "MailboxFullError",
    "ClaimedError",
    "MessageSizeError",
    "MeshTimeoutError",
    "CorruptError",
    "NoSuchSlotError",
    "TooManyBindingsError",
    "DevicePlacementError",
    "NoDeviceRingError",
    "ProtocolMismatchError",
    "FanInCorruptError",
    "ServiceGroupError",
    "MeshdRefused",
    "MeshdUnreachable",
    "MeshdProtocolError",
    "MeshdTimeout",
    "WindowFullError",
]


class MeshError(Exception):
    """Base class of every error the meshd package raises. ``str(e)`` is the reason."""

    def __init__(self, message: str, **fields: Any) -> None:
        super().__init__(message)
        self.message = message
        for key, value in fields.items():
            setattr(self, key, value)

    def __str__(self) -> str:
        return self.message


class MailboxIOError(MeshError, OSError):
    """A system call on the mailbox file failed (``path``, ``op``, ``errno``)."""


class MailboxExistsError(MeshError, FileExistsError):
    """A mailbox file already exists there (``path``)."""


class MailboxInvalidError(MeshError, ValueError):
    """The file is no valid mailbox (``path``, ``field``: the header field or table at fault)."""


class LayoutVersionError(MailboxInvalidError):
    """The mailbox was made by a meshd of another layout version; meshd's own refusal, naming --fresh."""


class MailboxConfigError(MeshError, ValueError):
    """A mailbox creation parameter is out of range."""


class NoSuchChannelError(MeshError, LookupError):
    """No live channel has that name (``channel``)."""


class ChannelExistsError(MeshError):
    """A live channel already has that name (``channel``)."""


class ChannelConfigError(MeshError, ValueError):
    """A channel's message size or capacity is out of range (``channel``)."""


class MailboxFullError(MeshError):
    """The channel table or the ring arena has no room left (``channel``)."""


class ClaimedError(MeshError):
    """A live process holds that end of the channel (``channel``, ``end``, ``pid``)."""


class MessageSizeError(MeshError, ValueError):
    """A message or buffer of the wrong size (``channel``, ``size``: the channel's, ``got``)."""


class MeshTimeoutError(MeshError, TimeoutError):
    """A send or receive ran out of time (``channel``, ``op``, ``waited_ms``; ``sent`` for send_batch)."""


class CorruptError(MeshError):
    """The ring's shared indices are impossible (``channel``, ``head``, ``tail``, ``capacity``)."""


class NoSuchSlotError(MeshError, LookupError):
    """A program slot index past the table (``index``, ``count``)."""


class TooManyBindingsError(MeshError, ValueError):
    """Too many channel bindings for one program (``index``, ``count``, ``max``)."""


class DevicePlacementError(MeshError):
    """The channel's ring is in GPU memory (``--placement device``): only GPU programs use its ends (``channel``)."""


class NoDeviceRingError(MeshError):
    """A device channel's ring has no address in the launching context (``channel``)."""


class ProtocolMismatchError(MeshError, ValueError):
    """An end of one protocol was asked for on a channel of another (``channel``, ``protocol``: the
    channel's, ``wanted``: the end's), e.g. a ``FanInSender`` on an ll channel."""


class FanInCorruptError(MeshError):
    """A service's fan-in ring holds what no sender or receiver leaves (``channel``): a buggy writer
    or a corrupted mailbox; reported, never followed."""


class ServiceGroupError(MeshError):
    """A service's channel group refused a call or holds an impossible word (``channel``): e.g. a
    client id beyond its table, or an entry's word in a state no meshd writes."""


class MeshdRefused(MeshError):
    """meshd answered the request with a refusal; ``reason`` is its text."""

    def __init__(self, message: str, **fields: Any) -> None:
        super().__init__(message, **fields)
        self.reason = message


class MeshdUnreachable(MeshError, ConnectionError):
    """No meshd answers on the control socket (``socket``)."""


class MeshdProtocolError(MeshError):
    """meshd's answer could not be read (closed early, or not the protocol's JSON)."""


class MeshdTimeout(MeshdProtocolError, TimeoutError):
    """meshd did not answer within the client's ``timeout`` (``op``: the request, ``timeout``: seconds)."""


class WindowFullError(MeshError):
    """A service client already has its window of requests unanswered (``service``, ``unanswered``,
    ``window``): receive replies first. Raised at once by the blocking sends, which cannot wait for
    it: only this client's own receives open it."""
