"""A client of a service: requests into the service's fan-in channel, replies on a ring of its own.

A *service* ``NAME`` is a fan-in channel ``NAME`` (requests from any number of host clients, each
carrying its sender's id) and a channel group ``NAME.replies`` (one reply ring per client). meshd
binds a client to an entry of the group over the control socket (``service_attach``) and answers its
id; that connection stays open for the client's whole session: it is the client's *lease*. Closing
it (``close``, or the process dying, kill -9 included) makes meshd take the entry back, completing
whatever send the client left half done, so the server sees a skip and never a torn request.

A restart of meshd (a crash, ``systemctl restart``, ``meshd handoff``) ends the lease but not the
client: the new meshd finds the entry still bound and watches the process, and requests and replies
go on through the mailbox. ``close`` then takes the lease back from the meshd serving the socket now
(``service_resume``) and detaches on it.

The messages themselves never touch the socket: they go through the mailbox, as for every channel.
"""

from __future__ import annotations

import contextlib
import os
import socket as _socket
import threading
import time
from types import TracebackType
from typing import TYPE_CHECKING, Any

from . import _aio, _meshd, control
from ._errors import MeshdProtocolError, MeshdRefused, MessageSizeError, WindowFullError
from ._meshd import FanInSender, GroupClient, Mailbox
from .control import Client, _connect, decode_response, encode_request

if TYPE_CHECKING:
    from collections.abc import Iterator

    from typing_extensions import Buffer, Self

__all__ = ["Service"]

#: How long ``close`` waits for meshd to acknowledge a detach before it just closes the socket
#: (which takes the client's entry back too).
DETACH_TIMEOUT = 5.0


def _remaining(deadline: float | None) -> float | None:
    return None if deadline is None else max(0.0, deadline - time.monotonic())


class Service:
    """A client of service ``name``: ``send`` requests, ``recv`` replies, or ``request`` for both.

    Made by :meth:`connect` (or :meth:`Client.service`). One client is one entry of the service's
    table and one reply ring: replies come in the order the server sends them, and ``request``
    pairs a send with the next reply (a reply that comes after its request timed out is the next
    ``recv``'s).

    **Threads**: a ``Service`` may be shared. Sends are serialised among themselves and receives
    among themselves (a thread waiting in ``send`` or ``recv`` holds that side, with ``timeout``
    bounding the wait for it too), so one thread may send while another receives; ``request`` holds
    the receiving side from its send to its reply, so concurrent ``request`` calls are answered each
    with its own reply (one at a time). Bare ``send`` / ``recv`` pairs from several threads get the
    replies in the order the requests went out, whoever receives them. The ``try_`` calls and the
    asyncio forms do not wait for a side another thread holds: they find nothing to do now.
    Blocking calls release the GIL and wake for Ctrl-C; ``arequest``, ``asend``, ``arecv`` are the
    asyncio forms (polled from the event loop, no thread).

    **The window**: a client keeps at most its reply ring's capacity of requests unanswered
    (:attr:`window`, :attr:`unanswered`). A reply past it would find the ring full, and a program
    answering in order (every loop in mesh.cuh) would wait there, serving no other client until this
    one reads. So at the window ``try_send`` says False and the blocking sends (``send``, ``request``
    and their asyncio forms) raise :class:`WindowFullError` at once: only this client's receives open
    it. :meth:`set_window` narrows it, or lifts it (None) for a program that does not answer each
    request exactly once.

    After ``fork()`` the child's copy is not a client: its calls raise :class:`ClaimedError`
    (the parent holds the reply ring and the id), and its ``close`` only closes its copy of the
    lease, leaving the parent attached. A child connects a ``Service`` of its own.
    """

    def __init__(
        self, name: str, lease: _socket.socket, mailbox: Mailbox, client: dict[str, Any], socket: str | None = None
    ) -> None:
        """Internal: use :meth:`connect`. Takes over ``lease`` (the attached connection) to the meshd
        listening on ``socket``."""
        self._name = name
        self._socket = socket
        self._pid = os.getpid()
        self._lease: _socket.socket | None = lease
        self._mailbox = mailbox
        try:
            ident, requests, replies = client["id"], client["requests"], client["replies"]
            if not (isinstance(ident, int) and 0 <= ident < 2**32 and isinstance(requests, str) and isinstance(replies, str)):
                raise TypeError
        except (KeyError, TypeError):
            self._detach_quietly()
            raise MeshdProtocolError(f"meshd answered service_attach with a malformed client: {client!r}") from None
        self._id: int = ident
        try:
            self._tx = FanInSender(mailbox, requests, ident)
            self._rx = GroupClient(mailbox, replies, ident)
        except BaseException:
            self._detach_quietly()
            raise
        # The window (see the class): requests sent, replies received, and the limit.
        self._sent = 0
        self._received = 0
        self._window: int | None = self._rx.capacity
        # Each side's lock (see the class), made again in a fork()ed child (a lock a parent's thread
        # held at the fork would stay held there for ever; the child's calls then raise ClaimedError).
        self._lock_pid = os.getpid()
        self._send_lock = threading.RLock()
        self._recv_lock = threading.RLock()

    def _sides(self) -> tuple[threading.RLock, threading.RLock]:
        if self._lock_pid != os.getpid():
            self._send_lock, self._recv_lock, self._lock_pid = threading.RLock(), threading.RLock(), os.getpid()
        return self._send_lock, self._recv_lock

    @staticmethod
    @contextlib.contextmanager
    def _if_free(lock: threading.RLock) -> Iterator[bool]:
        # The try_ calls: the side if no other thread holds it now (False: another thread does).
        free = lock.acquire(blocking=False)
        try:
            yield free
        finally:
            if free:
                lock.release()

    @contextlib.contextmanager
    def _holding(self, lock: threading.RLock, deadline: float | None, timeout: float | None, op: str) -> Iterator[None]:
        # Another thread's send or receive holds this side: wait for it, within `timeout`.
        wait = -1.0 if deadline is None else max(0.0, deadline - time.monotonic())
        if wait > threading.TIMEOUT_MAX:
            wait = -1.0  # `math.inf`: for ever
        if not lock.acquire(timeout=wait):
            name = self._tx.name if op == "send" else self._rx.name
            raise _meshd._timeout_error(name, int((timeout or 0) * 1000), op)  # type: ignore[attr-defined]
        try:
            yield
        finally:
            lock.release()

    # ---- making one ----

    @classmethod
    def connect(
        cls, name: str, socket: str | os.PathLike[str] | None = None, *, timeout: float | None = None
    ) -> Service:
        """Attaches to service ``name`` of the meshd on ``socket`` (default as :class:`Client`'s:
        ``$MESHD_SOCKET``, else ``$MESHD_DEVICE``'s meshd, else ``/tmp/meshd.sock``), maps its mailbox
        and opens both ends.

        ``timeout``: seconds to wait for meshd's answers (None: as long as it takes). A service that
        does not exist, or one whose entries are all bound, raises :class:`MeshdRefused` with meshd's
        reason; no meshd there raises :class:`MeshdUnreachable`.
        """
        return Client(socket, timeout=timeout).service(name)

    @classmethod
    def _attach(cls, client: Client, name: str) -> Service:
        mailbox = client.mailbox()
        lease = _connect(client)
        try:
            try:
                lease.sendall(encode_request({"op": "service_attach", "service": name}))
            except OSError:
                pass  # meshd's answer, if any, says why
            line = Client._read_line(lease, "service_attach")
            if not line:
                raise MeshdProtocolError("meshd closed the connection without answering service_attach")
            resp = decode_response(line)
            # The lease is held, not read, from now on: a blocking socket, no timeout.
            lease.settimeout(None)
        except BaseException:
            lease.close()
            raise
        client_row = resp.get("client")
        if not isinstance(client_row, dict):
            lease.close()
            raise MeshdProtocolError(f"meshd answered service_attach without the client: {resp!r}")
        return cls(name, lease, mailbox, client_row, socket=str(client.socket))

    # ---- what it is ----

    @property
    def name(self) -> str:
        """The service's name."""
        return self._name

    @property
    def id(self) -> int:
        """This client's id (``slot | epoch << 16``): what every request carries."""
        return self._id

    @property
    def requests(self) -> str:
        """The fan-in channel requests go to."""
        return self._tx.name

    @property
    def replies(self) -> str:
        """The channel group whose ring this client reads."""
        return self._rx.name

    @property
    def msg_size(self) -> int:
        """Bytes per request (shorter ones are zero-padded)."""
        return self._tx.msg_size

    @property
    def reply_size(self) -> int:
        """Bytes per reply (``recv_into`` takes a buffer of exactly this size)."""
        return self._rx.msg_size

    @property
    def mailbox(self) -> Mailbox:
        """The mailbox the service's channels live in."""
        return self._mailbox

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._lease is None

    def __repr__(self) -> str:
        state = ", closed" if self.closed else ""
        return (
            f"Service({self._name!r}, id={self._id:#x}, msg_size={self._tx.msg_size}, "
            f"reply_size={self._rx.msg_size}{state})"
        )

    # ---- the window ----

    @property
    def window(self) -> int | None:
        """How many requests may be unanswered at once: the reply ring's capacity unless
        :meth:`set_window` said otherwise (None: no limit)."""
        return self._window

    @property
    def unanswered(self) -> int:
        """Requests sent whose replies this client has not received."""
        return max(0, self._sent - self._received)

    def set_window(self, window: int | None) -> None:
        """Sets the window: 1 to the reply ring's capacity, or None for a program that does not
        answer each request exactly once (then a client that sends more than its ring holds before
        reading can hold up every other client of a program that answers in order)."""
        capacity = self._rx.capacity
        whole = isinstance(window, int) and not isinstance(window, bool)
        if window is not None and not (whole and 1 <= window <= capacity):
            raise ValueError(
                f"service {self._name!r}: a window of {window!r} requests: it must be 1 to the reply ring's "
                f"capacity, {capacity} (or None)"
            )
        self._window = window

    def _got_reply(self) -> None:
        # Never more than were sent: a reply the program repeated (after its crash) opens nothing.
        self._received = min(self._received + 1, self._sent)

    def _window_open(self) -> bool:
        return self._window is None or self.unanswered < self._window

    def _check_window(self) -> None:
        if not self._window_open():
            raise WindowFullError(
                f"service {self._name!r}: {self.unanswered} requests unanswered, the client's window "
                f"({self._window} replies, what its reply ring holds): receive replies before sending more",
                service=self._name,
                unanswered=self.unanswered,
                window=self._window,
            )

    # ---- requests and replies ----

    def send(self, msg: Buffer, timeout: float | None = None) -> None:
        """One request (any C-contiguous buffer of at most ``msg_size`` bytes), waiting for room
        (GIL released); MeshTimeoutError after ``timeout`` seconds (None: waits for ever);
        WindowFullError at once when the window is full."""
        deadline = _aio._check_timeout(timeout)
        with self._holding(self._sides()[0], deadline, timeout, "send"):
            self._check_window()
            self._tx.send(msg, _remaining(deadline))
            self._sent += 1

    def try_send(self, msg: Buffer) -> bool:
        """One request if there is room now; False when the ring or the window is full. Keeps the GIL."""
        with self._if_free(self._sides()[0]) as free:
            if not free or not self._window_open():
                return False
            sent = self._tx.try_send(msg)
            self._sent += sent
            return sent

    def recv(self, timeout: float | None = None) -> bytes:
        """The next reply as bytes (``reply_size`` long), waiting (GIL released)."""
        deadline = _aio._check_timeout(timeout)
        with self._holding(self._sides()[1], deadline, timeout, "recv"):
            # The requests in flight pick the wait (mesh-shm's PollPause::for_replies: a spin for the
            # only one, a yield at once when streaming, which leaves CPUs to other clients).
            reply = self._rx.recv(_remaining(deadline), unanswered=self.unanswered)
            self._got_reply()
            return reply

    def recv_into(self, buffer: Buffer, timeout: float | None = None) -> None:
        """The next reply into ``buffer`` (writable, exactly ``reply_size`` bytes), waiting."""
        deadline = _aio._check_timeout(timeout)
        with self._holding(self._sides()[1], deadline, timeout, "recv"):
            self._rx.recv_into(buffer, _remaining(deadline), unanswered=self.unanswered)
            self._got_reply()

    def try_recv(self) -> bytes | None:
        """The next reply, or None when none is waiting. Keeps the GIL."""
        with self._if_free(self._sides()[1]) as free:
            if not free:
                return None
            reply = self._rx.try_recv()
            if reply is not None:
                self._got_reply()
            return reply

    def try_recv_into(self, buffer: Buffer) -> bool:
        """The next reply into ``buffer``; False when none is waiting. Keeps the GIL."""
        with self._if_free(self._sides()[1]) as free:
            if not free:
                return False
            got = self._rx.try_recv_into(buffer)
            if got:
                self._got_reply()
            return got

    def request(self, msg: Buffer, timeout: float | None = None) -> bytes:
        """Sends ``msg`` and returns the next reply; ``timeout`` bounds both together.
        WindowFullError at once, nothing sent, when the window is full."""
        deadline = _aio._check_timeout(timeout)
        # The receiving side from the send to the reply: no other thread takes this request's reply.
        with self._holding(self._sides()[1], deadline, timeout, "recv"):
            self.send(msg, _remaining(deadline))
            return self.recv(_remaining(deadline))

    def request_into(self, msg: Buffer, out: Buffer, timeout: float | None = None) -> None:
        """:meth:`request` with the reply written into ``out`` (exactly ``reply_size`` bytes, writable:
        checked before the send, so that a wrong buffer sends nothing, whose reply would be left for
        the next receive)."""
        deadline = _aio._check_timeout(timeout)
        with memoryview(out) as view:
            if view.readonly:
                raise BufferError("request_into: the buffer is read-only")
            if view.nbytes != self._rx.msg_size:
                name = self._rx.name
                raise MessageSizeError(
                    f'channel "{name}": request_into: a buffer of {view.nbytes} bytes for a '
                    f"{self._rx.msg_size}-byte reply (nothing was sent)",
                    channel=name,
                    size=self._rx.msg_size,
                    got=view.nbytes,
                )
        with self._holding(self._sides()[1], deadline, timeout, "recv"):
            self.send(msg, _remaining(deadline))
            self.recv_into(out, _remaining(deadline))

    # ---- asyncio ----

    async def asend(self, msg: Buffer, timeout: float | None = None) -> None:
        """:meth:`send` for asyncio."""
        self._check_window()
        await _aio._poll_until(self._tx.name, lambda: self.try_send(msg), _aio._check_timeout(timeout), timeout, "send")

    async def arecv(self, timeout: float | None = None) -> bytes:
        """:meth:`recv` for asyncio."""
        reply: bytes = await _aio._poll_until(self._rx.name, self.try_recv, _aio._check_timeout(timeout), timeout)
        return reply

    async def arecv_into(self, buffer: Buffer, timeout: float | None = None) -> None:
        """:meth:`recv_into` for asyncio."""
        await _aio._poll_until(
            self._rx.name, lambda: self.try_recv_into(buffer), _aio._check_timeout(timeout), timeout
        )

    async def arequest(self, msg: Buffer, timeout: float | None = None) -> bytes:
        """:meth:`request` for asyncio: ``timeout`` bounds the send and the reply together."""
        deadline = _aio._check_timeout(timeout)
        self._check_window()
        await _aio._poll_until(self._tx.name, lambda: self.try_send(msg), deadline, timeout, "send")
        reply: bytes = await _aio._poll_until(self._rx.name, self.try_recv, deadline, timeout)
        return reply

    # ---- leaving ----

    def close(self) -> None:
        """Leaves the service: releases the reply ring, then detaches (meshd takes the entry back,
        and the server is told of the departure). Further calls raise ValueError; a second close
        does nothing. A lease that ended with a previous meshd is taken back from the one serving
        the socket now, and the detach sent on it. A meshd that is gone has nothing to give back:
        that is not an error; a refusal raises :class:`MeshdRefused` (the socket is closed all the
        same, which meshd also takes as leaving)."""
        lease, self._lease = self._lease, None
        if lease is None:
            return
        if getattr(self, "_pid", None) != os.getpid():
            # A child of fork(): the lease and the ends are the parent's. Closing this copy of the
            # socket leaves the connection (and the parent's entry) alone; a detach would not.
            lease.close()
            return
        for end in (getattr(self, "_tx", None), getattr(self, "_rx", None)):
            if end is not None:
                end.close()
        try:
            lease.settimeout(DETACH_TIMEOUT)
            try:
                lease.sendall(encode_request({"op": "detach"}))
                line = Client._read_line(lease)
            except (OSError, MeshdProtocolError):
                line = b""
            if not line:
                # The lease is closed: it ended with a previous meshd (the entry stayed bound), or meshd
                # is gone. Take it back from whatever meshd serves the socket now, and detach there.
                line = self._detach_on_lease_taken_back()
            if line:
                decode_response(line)
        finally:
            lease.close()

    def _detach_on_lease_taken_back(self) -> bytes:
        # `service_resume` on a new connection, then `detach` on it: meshd's answer to the detach, or
        # b"" when there is nothing to take back (no meshd there, the client departed already, or
        # the old lease is still held: meshd takes the entry back when it sees that one close).
        if self._socket is None:
            return b""
        conn = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        try:
            conn.settimeout(DETACH_TIMEOUT)
            conn.connect(self._socket)
            conn.sendall(encode_request({"op": "service_resume", "service": self._name, "client": self._id}))
            taken = Client._read_line(conn, "service_resume")
            if not taken:
                return b""
            decode_response(taken)
            conn.sendall(encode_request({"op": "detach"}))
            return Client._read_line(conn, "detach")
        except (OSError, MeshdProtocolError, MeshdRefused):
            return b""
        finally:
            conn.close()

    def _detach_quietly(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - the error being raised is the one that matters
            pass

    def __enter__(self) -> Self:
        return self

    def __exit__(self, t: type[BaseException] | None, v: BaseException | None, tb: TracebackType | None) -> bool:
        self.close()
        return False

    def __del__(self) -> None:
        # Collected while attached: closing the socket is enough for meshd to take the entry back.
        lease = getattr(self, "_lease", None)
        if lease is not None:
            lease.close()


# `Client.service` attaches through this: control.py, beneath this module, does not import it.
control._service_attach = Service._attach
