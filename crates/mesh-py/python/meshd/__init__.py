"""meshd from Python: the mailbox's channels and the control socket.

* :class:`Mailbox`, :class:`Producer`, :class:`Consumer`: the mailbox's host side (host memory
  only: importing this never creates a CUDA context). ``send`` reads any C-contiguous buffer in
  place; ``recv_into`` fills a writable one; blocking calls release the GIL and wake for Ctrl-C;
  ``await consumer.arecv()`` is the asyncio form.
* :class:`Client`: the control socket (load, upgrade, unload, ps, info, channel create, spawn,
  stop, shutdown, metrics), speaking the same protocol as the ``meshd`` command line.
* Errors: :class:`MeshError` and one subclass per kind (``meshd._errors``), with meshd's texts.
"""

from __future__ import annotations

from ._errors import (
    ChannelConfigError,
    ChannelExistsError,
    ClaimedError,
    CorruptError,
    DevicePlacementError,
    LayoutVersionError,
    MailboxConfigError,
    MailboxExistsError,
    MailboxFullError,
    MailboxInvalidError,
    MailboxIOError,
    MeshdProtocolError,
    MeshdRefused,
    MeshdUnreachable,
    MeshError,
    MeshTimeoutError,
    MessageSizeError,
    NoDeviceRingError,
    NoSuchChannelError,
    NoSuchSlotError,
    TooManyBindingsError,
)
from ._meshd import LAYOUT_VERSION, MAX_MSG_SIZE, ChannelInfo, Consumer, Mailbox, Producer
from .control import Client

__all__ = [
    "LAYOUT_VERSION",
    "MAX_MSG_SIZE",
    "ChannelInfo",
    "Client",
    "Consumer",
    "Mailbox",
    "Producer",
    "ChannelConfigError",
    "ChannelExistsError",
    "ClaimedError",
    "CorruptError",
    "DevicePlacementError",
    "LayoutVersionError",
    "MailboxConfigError",
    "MailboxExistsError",
    "MailboxFullError",
    "MailboxInvalidError",
    "MailboxIOError",
    "MeshdProtocolError",
    "MeshdRefused",
    "MeshdUnreachable",
    "MeshError",
    "MeshTimeoutError",
    "MessageSizeError",
    "NoDeviceRingError",
    "NoSuchChannelError",
    "NoSuchSlotError",
    "TooManyBindingsError",
]
