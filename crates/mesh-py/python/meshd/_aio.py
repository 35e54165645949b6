"""asyncio forms of the blocking calls: polled from the event loop, so no thread per call.

A ring has no file descriptor to wait on, so waiting is polling: a few yields to the loop first
(a message already on its way arrives within microseconds), then sleeps that double up to 1 ms
(asyncio's timers round to about a millisecond anyway). Other tasks run between polls.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable

from . import _meshd

_YIELDS = 16
_MAX_NAP = 0.001


def _check_timeout(timeout: float | None) -> float | None:
    if timeout is not None and not (timeout >= 0):
        raise ValueError(f"timeout {timeout}: expected None or a number of seconds >= 0")
    return None if timeout is None else time.monotonic() + timeout


async def _poll_until(
    name: str, attempt: Callable[[], Any], deadline: float | None, timeout: float | None, op: str = "recv"
) -> Any:
    """``attempt()`` until it gives something other than None or False; MeshTimeoutError at ``deadline``."""
    polls = 0
    nap = 0.00005
    while True:
        got = attempt()
        if got is not None and got is not False:
            return got
        if deadline is not None and time.monotonic() >= deadline:
            raise _meshd._timeout_error(name, int((timeout or 0) * 1000), op)  # type: ignore[operator]
        polls += 1
        if polls <= _YIELDS:
            await asyncio.sleep(0)
        else:
            await asyncio.sleep(nap)
            nap = min(nap * 2, _MAX_NAP)


async def _poll(end: Any, attempt: Callable[[], Any], timeout: float | None, op: str = "recv") -> Any:
    return await _poll_until(end.name, attempt, _check_timeout(timeout), timeout, op)


async def arecv(consumer: Any, timeout: float | None = None) -> bytes:
    """One message as bytes; raises MeshTimeoutError after ``timeout`` seconds (None: waits for ever)."""
    result: bytes = await _poll(consumer, consumer.try_recv, timeout)
    return result


async def arecv_into(consumer: Any, buffer: Any, timeout: float | None = None) -> None:
    """One message into ``buffer`` (writable, ``msg_size`` bytes)."""
    await _poll(consumer, lambda: consumer.try_recv_into(buffer), timeout)


async def asend(producer: Any, msg: Any, timeout: float | None = None) -> None:
    """One message, polling for room; raises MeshTimeoutError after ``timeout`` seconds."""
    await _poll(producer, lambda: producer.try_send(msg), timeout, "send")
