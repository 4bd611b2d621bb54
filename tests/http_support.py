"""Real HTTP servers for tests: uvicorn in the test's event loop, or `turnstile serve` processes.

Nothing is mocked: requests go over TCP on 127.0.0.1 to a real uvicorn server.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path

import httpx
import uvicorn
from starlette.applications import Starlette

__all__ = [
    "csrf_of",
    "free_port",
    "serve_in_loop",
    "serve_process",
    "signed_in_with",
    "worker_process",
]

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextlib.asynccontextmanager
async def serve_in_loop(app: Starlette) -> AsyncIterator[str]:
    """Serve ``app`` with uvicorn in the running loop; yields the base URL."""
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    )
    task = asyncio.create_task(server.serve())
    for _ in range(200):
        if server.started or task.done():
            break
        await asyncio.sleep(0.02)
    if task.done():
        task.result()  # raises the startup failure
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task


#: A signing key for the processes' client-managed agents: `serve` and `worker` refuse the
#: example's published key, the suite's and a missing or short one without --dev, as they
#: would in production, so the key is made for this run and written nowhere.
DEPLOYABLE_STATE_KEYS = f"test-run:{secrets.token_urlsafe(32)}"


def _env(db_url: str, extra: dict[str, str] | None) -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("TURNSTILE_STATE_KEYS", DEPLOYABLE_STATE_KEYS)
    env["TURNSTILE_DATABASE_URL"] = db_url
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


def _turnstile(*args: str) -> list[str]:
    return [sys.executable, "-m", "workers.cli", *args]


def run_turnstile(
    *args: str, db_url: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """A ``turnstile`` command run to its end with the processes' environment for ``db_url``
    (``env`` overriding it)."""
    return subprocess.run(
        _turnstile(*args),
        cwd=ROOT,
        env=_env(db_url, env),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextlib.contextmanager
def serve_process(
    db_url: str,
    *,
    app: str = "examples.banking:ai",
    workers: int | None = 0,
    args: Sequence[str] = (),
    env: dict[str, str] | None = None,
    log: Path | None = None,
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """``turnstile serve`` in its own process; yields ``(base_url, process)`` once it answers
    (``workers=None``: no ``--workers`` flag, the server's default)."""
    port = free_port()
    out = open(log, "wb") if log else subprocess.DEVNULL  # noqa: SIM115 - closed below
    process = subprocess.Popen(
        _turnstile(
            "serve",
            "--app",
            app,
            "--db",
            db_url,
            "--port",
            str(port),
            *(["--workers", str(workers)] if workers is not None else []),
            "--log-level",
            "WARNING",
            *args,
        ),
        cwd=ROOT,
        env=_env(db_url, env),
        stdout=out,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"turnstile serve exited with {process.returncode}")
            try:
                httpx.post(f"{base}/api/-/getSnapshot", json={}, timeout=1)
                break
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        yield base, process
    finally:
        _stop(process)
        if log:
            out.close()  # type: ignore[union-attr]


@contextlib.contextmanager
def worker_process(
    db_url: str,
    *,
    app: str = "examples.banking:ai",
    concurrency: int = 2,
    env: dict[str, str] | None = None,
) -> Iterator[subprocess.Popen[bytes]]:
    """``turnstile worker`` in its own process (stopped with SIGTERM, or killed by the test)."""
    process = subprocess.Popen(
        _turnstile(
            "worker",
            "--app",
            app,
            "--db",
            db_url,
            "--concurrency",
            str(concurrency),
            "--poll-interval",
            "0.2",
            "--log-level",
            "WARNING",
        ),
        cwd=ROOT,
        env=_env(db_url, env),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        yield process
    finally:
        _stop(process)


@contextlib.contextmanager
def closing_all(sockets: list[socket.socket]) -> Iterator[list[socket.socket]]:
    """``sockets``, each closed when the block ends however it ends."""
    try:
        yield sockets
    finally:
        for sock in sockets:
            sock.close()


def csrf_of(page: str) -> str:
    """The CSRF token of the first form on an inbox UI ``page``."""
    found = re.search(r'name="csrf_token" value="([^"]+)"', page)
    assert found is not None, "the page has no form"
    return found.group(1)


async def signed_in_with(base: str, token: str) -> httpx.AsyncClient:
    """A browser-like client of the server at ``base``, signed in to the inbox UI with
    ``token`` through its login form (the caller closes it)."""
    client = httpx.AsyncClient(base_url=base)
    login = await client.get("/ui/login")
    signed = await client.post(
        "/ui/login", data={"csrf_token": csrf_of(login.text), "token": token, "next": "/ui"}
    )
    assert signed.status_code == 303 and signed.headers["location"] == "/ui"
    return client
