"""asyncio forms of the blocking receive: polled from the event loop, so no thread per call.

A ring has no file descriptor to wait on, so waiting is polling: a few yields to the loop first
(a message already on its way arrives within microseconds), then sleeps that double up to 1 ms
(asyncio's timers round to about a millisecond anyway). Other tasks run between polls.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from . import _meshd

if TYPE_CHECKING:
    from ._meshd import Consumer

_YIELDS = 16
_MAX_NAP = 0.001


async def _poll(consumer: Consumer, attempt: Any, timeout: float | None) -> Any:
    if timeout is not None and not (timeout >= 0):
        raise ValueError(f"timeout {timeout}: expected None or a number of seconds >= 0")
    deadline = None if timeout is None else time.monotonic() + timeout
    polls = 0
    nap = 0.00005
    while True:
        got = attempt()
        if got is not None and got is not False:
            return got
        if deadline is not None and time.monotonic() >= deadline:
            raise _meshd._timeout_error(consumer.name, int(timeout * 1000))  # type: ignore[operator]
        polls += 1
        if polls <= _YIELDS:
            await asyncio.sleep(0)
        else:
            await asyncio.sleep(nap)
            nap = min(nap * 2, _MAX_NAP)


async def arecv(consumer: Consumer, timeout: float | None = None) -> bytes:
    """One message as bytes; raises MeshTimeoutError after ``timeout`` seconds (None: waits for ever)."""
    result: bytes = await _poll(consumer, consumer.try_recv, timeout)
    return result


async def arecv_into(consumer: Consumer, buffer: Any, timeout: float | None = None) -> None:
    """One message into ``buffer`` (writable, ``msg_size`` bytes)."""
    await _poll(consumer, lambda: consumer.try_recv_into(buffer), timeout)
