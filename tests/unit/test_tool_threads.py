"""Synchronous tools run in daemon threads of their own: results, errors and context come
back as from ``asyncio.to_thread``, and an abandoned call does not hold its caller."""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time

import pytest

from engine.tools import ToolInterrupt, in_daemon_thread

REQUEST_ID: contextvars.ContextVar[str] = contextvars.ContextVar("REQUEST_ID", default="")


async def test_result_error_and_context_come_back() -> None:
    """The value, the exception (a pause included) and the caller's context variables."""

    def seen() -> tuple[str, bool]:
        return REQUEST_ID.get(), threading.current_thread().daemon

    REQUEST_ID.set("req-7")
    assert await in_daemon_thread(seen, name="tool seen") == ("req-7", True)

    def broken() -> None:
        raise ValueError("bad input")

    with pytest.raises(ValueError, match="bad input"):
        await in_daemon_thread(broken, name="tool broken")

    def pausing() -> None:
        raise ToolInterrupt({"why": "ask"})

    with pytest.raises(ToolInterrupt) as paused:
        await in_daemon_thread(pausing, name="tool pausing")
    assert paused.value.metadata == {"why": "ask"}


async def test_a_cancelled_call_returns_at_once_and_its_thread_finishes_alone() -> None:
    """Cancelling the await does not wait for the thread; the late result is dropped."""
    release = threading.Event()
    finished = threading.Event()

    def blocking() -> str:
        release.wait(5)
        finished.set()
        return "late"

    call = asyncio.create_task(in_daemon_thread(blocking, name="tool blocking"))
    await asyncio.sleep(0.05)
    started = time.monotonic()
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    assert time.monotonic() - started < 0.5
    release.set()
    assert await asyncio.to_thread(finished.wait, 5)
    await asyncio.sleep(0.05)  # the late result reaches a cancelled future: ignored
