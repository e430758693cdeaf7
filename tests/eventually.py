"""How a test waits: `eventually(check)` calls `check()` until it returns something true, and
returns that; after `timeout` seconds it fails with `what`. `eventually_async` is the same on the
event loop, for what the loop itself must bring about; its `check` may return an awaitable (e.g.
`asyncio.to_thread(...)` for a blocking probe).

The machine is shared and busy: timeouts are generous bounds, never a measure of speed (speed
goals live in bench/), and nothing waits by sleeping a fixed time instead of checking.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar, overload

__all__ = ["TIMEOUT", "eventually", "eventually_async"]

T = TypeVar("T")

TIMEOUT = 30.0  # seconds; a check that needs longer says so

# `what` names what was awaited; a callable is asked only on failure (e.g. what was recorded).
What = str | Callable[[], str]


def _failure(what: What, timeout: float) -> AssertionError:
    text = what() if callable(what) else what
    return AssertionError(f"not within {timeout:g} s: {text or 'the condition'}")


def eventually(
    check: Callable[[], T | None],
    what: What = "",
    *,
    timeout: float = TIMEOUT,
    interval: float = 0.05,
) -> T:
    """`check()`'s first true result, polled every `interval` s; AssertionError after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise _failure(what, timeout)
        time.sleep(interval)


@overload
async def eventually_async(
    check: Callable[[], Awaitable[T | None]],
    what: What = "",
    *,
    timeout: float = TIMEOUT,
    interval: float = 0.05,
) -> T: ...


@overload
async def eventually_async(
    check: Callable[[], T | None],
    what: What = "",
    *,
    timeout: float = TIMEOUT,
    interval: float = 0.05,
) -> T: ...


async def eventually_async(
    check: Callable[[], T | Awaitable[T | None] | None],
    what: What = "",
    *,
    timeout: float = TIMEOUT,
    interval: float = 0.05,
) -> T:
    """As `eventually`, sleeping on the event loop; an awaitable result is awaited first."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return result
        if time.monotonic() > deadline:
            raise _failure(what, timeout)
        await asyncio.sleep(interval)
