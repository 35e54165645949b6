"""meshd from Python: the mailbox's channels and the control socket.

* :class:`Mailbox`, :class:`Producer`, :class:`Consumer`: the mailbox's host side (host memory
  only: importing this never creates a CUDA context). One class per direction for every protocol
  (ll, index, bulk: the end reads the channel's). ``send`` reads any C-contiguous buffer in place;
  ``recv_into`` fills a writable one; blocking calls release the GIL and wake for Ctrl-C;
  ``await consumer.arecv()`` is the asyncio form. Bulk channels also lend a slot in place
  (``send_view``, ``recv_view``: a :class:`SlotView`), and copy as a :class:`CopyConfig` says.
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
from ._meshd import (
    LAYOUT_VERSION,
    MAX_BULK_MSG_SIZE,
    MAX_MSG_SIZE,
    ChannelInfo,
    Consumer,
    CopyConfig,
    Mailbox,
    Producer,
    SlotView,
)
from .control import Client

__all__ = [
    "LAYOUT_VERSION",
    "MAX_BULK_MSG_SIZE",
    "MAX_MSG_SIZE",
    "ChannelInfo",
    "Client",
    "Consumer",
    "CopyConfig",
    "Mailbox",
    "Producer",
    "SlotView",
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
