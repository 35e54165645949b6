"""meshd from Python: the mailbox's channels and the control socket.

* :class:`Mailbox`, :class:`Producer`, :class:`Consumer`: the mailbox's host side (host memory
  only: importing this never creates a CUDA context). One class per direction for every protocol
  (ll, index, bulk: the end reads the channel's). ``send`` reads any C-contiguous buffer in place;
  ``recv_into`` fills a writable one; blocking calls release the GIL and wake for Ctrl-C;
  ``await consumer.arecv()`` is the asyncio form. Bulk channels also lend a slot in place
  (``send_view``, ``recv_view``: a :class:`SlotView`), and copy as a :class:`CopyConfig` says.
* :class:`Client`: the control socket (load, upgrade, unload, ps, a program's user words, info,
  channel create, service create, spawn, stop, shutdown, metrics), speaking the same protocol as the
  ``meshd`` command line.
* :class:`Service`: a client of a service (many clients, one server): ``Service.connect(name)``
  attaches through the control socket (the connection stays open as the client's lease), then
  ``request``/``send``/``recv`` go through the mailbox (a fan-in channel of requests, a reply ring of
  its own); :class:`FanInSender` and :class:`GroupClient` are its two ends.
* Errors: :class:`MeshError` and one subclass per kind (``meshd._errors``), with meshd's texts.
"""

from __future__ import annotations

from ._errors import (
    ChannelConfigError,
    ChannelExistsError,
    ClaimedError,
    CorruptError,
    DevicePlacementError,
    FanInCorruptError,
    LayoutVersionError,
    MailboxConfigError,
    MailboxExistsError,
    MailboxFullError,
    MailboxInvalidError,
    MailboxIOError,
    MeshdProtocolError,
    MeshdRefused,
    MeshdTimeout,
    MeshdUnreachable,
    MeshError,
    MeshTimeoutError,
    MessageSizeError,
    NoDeviceRingError,
    NoSuchChannelError,
    NoSuchSlotError,
    ProtocolMismatchError,
    ServiceGroupError,
    TooManyBindingsError,
    WindowFullError,
)
from ._meshd import (
    LAYOUT_VERSION,
    MAX_BULK_MSG_SIZE,
    MAX_MSG_SIZE,
    ChannelInfo,
    Consumer,
    CopyConfig,
    FanInSender,
    GroupClient,
    Mailbox,
    Producer,
    SlotView,
)
from .control import Client
from .service import Service

__all__ = [
    "LAYOUT_VERSION",
    "MAX_BULK_MSG_SIZE",
    "MAX_MSG_SIZE",
    "ChannelInfo",
    "Client",
    "Consumer",
    "CopyConfig",
    "FanInSender",
    "GroupClient",
    "Mailbox",
    "Producer",
    "Service",
    "SlotView",
    "ChannelConfigError",
    "ChannelExistsError",
    "ClaimedError",
    "CorruptError",
    "DevicePlacementError",
    "FanInCorruptError",
    "LayoutVersionError",
    "MailboxConfigError",
    "MailboxExistsError",
    "MailboxFullError",
    "MailboxInvalidError",
    "MailboxIOError",
    "MeshdProtocolError",
    "MeshdRefused",
    "MeshdTimeout",
    "MeshdUnreachable",
    "MeshError",
    "MeshTimeoutError",
    "MessageSizeError",
    "NoDeviceRingError",
    "NoSuchChannelError",
    "NoSuchSlotError",
    "ProtocolMismatchError",
    "ServiceGroupError",
    "TooManyBindingsError",
    "WindowFullError",
]
