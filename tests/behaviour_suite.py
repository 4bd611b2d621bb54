"""The behaviour suite: the engine's core tests, run on every way of running the banking app.

A test marked ``@pytest.mark.behaviour`` takes the ``app`` fixture (``tests/conftest.py``) and
is collected once per backend of :data:`BACKENDS` (or once per backend the marker names):

- ``memory``: the unit tier's app, in-memory store and scripted model;
- ``sqlite``, ``postgres``: the SQL stores, turns run in this process against them;
- ``openai``, ``anthropic``: the real model adapters, talking over HTTP to the local fake
  provider (``tests/fake_providers.py``), whose answers come from the same scripted rules;
- ``remote-memory``, ``remote-postgres``: remote agents (``engine.remote.client``) through a
  real uvicorn server, serving an in-memory app that runs turns itself, and a PostgreSQL app
  whose turns a worker pool runs.

Passing the same assertions everywhere means a store, an adapter or the wire loses nothing
the engine relies on. Each backend's cases carry the marker of the tier they belong to
(``integration``, ``acceptance``; ``postgres`` is added by ``tests/conftest.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, cast

import pytest

from engine.remote import create_app
from engine.remote.client import RemoteAgent, remote_agent
from examples.banking import ApprovalRequest, BankingApp, build
from stores import InMemorySessionStore
from tests.databases import sql_store
from tests.fake_providers import FakeAnthropic, FakeOpenAI, anthropic_model, openai_model
from tests.http_support import serve_in_loop
from workers import WorkerPool

#: The keys the tests' banking apps sign client state with.
TEST_STATE_KEYS = {"test-key": "test-secret-0123456789abcdef"}

Opener = Callable[[pytest.FixtureRequest], AbstractAsyncContextManager[BankingApp]]


@contextlib.asynccontextmanager
async def in_memory(request: pytest.FixtureRequest) -> AsyncIterator[BankingApp]:
    """A fresh banking example (own engine, own in-memory store, own transfer log)."""
    yield build(state_keys=TEST_STATE_KEYS)


def on_sql(kind: str) -> Opener:
    """The banking app on a fresh ``kind`` database, turns executed in this process."""

    @contextlib.asynccontextmanager
    async def opened(request: pytest.FixtureRequest) -> AsyncIterator[BankingApp]:
        async with sql_store(kind) as store:
            yield build(store=store, state_keys=TEST_STATE_KEYS, execution="inline")

    return opened


def on_adapter(provider: str) -> Opener:
    """The banking app on the ``provider`` adapter talking to its fake server; afterwards the
    server must have been asked (no silent fallback to the scripted model)."""

    @contextlib.asynccontextmanager
    async def opened(request: pytest.FixtureRequest) -> AsyncIterator[BankingApp]:
        server: FakeOpenAI | FakeAnthropic
        if provider == "openai":
            openai: FakeOpenAI = request.getfixturevalue("fake_openai")
            server, model = openai, openai_model(openai)
        else:
            anthropic: FakeAnthropic = request.getfixturevalue("fake_anthropic")
            server, model = anthropic, anthropic_model(anthropic)
        try:
            yield build(model=model, state_keys=TEST_STATE_KEYS)
        finally:
            await model.aclose()
        assert server.requests, f"the {provider} adapter never reached its fake server"

    return opened


@dataclass
class RemoteBankingApp:
    """What the behaviour tests use of a BankingApp, with remote agents."""

    banking_agent: RemoteAgent
    banking_agent_stateless: RemoteAgent
    #: The transfers the *server's* tool executed.
    transfers: list[Any]


def _remote(base: str, served: BankingApp, name: str) -> RemoteAgent:
    agent = remote_agent(f"{base}/api/{name}", interrupt_inputs={"userApproval": ApprovalRequest})
    # Read-only peeks at the server's store (how many turns a session has) for assertions.
    agent.store = served.ai.agents[name].store  # type: ignore[attr-defined]
    return agent


@contextlib.asynccontextmanager
async def _served(served: BankingApp, pool: WorkerPool | None) -> AsyncIterator[BankingApp]:
    stop = asyncio.Event()
    running = asyncio.create_task(pool.run(stop)) if pool is not None else None
    try:
        async with serve_in_loop(create_app(served.ai)) as base:
            remote = RemoteBankingApp(
                banking_agent=_remote(base, served, "bankingAgent"),
                banking_agent_stateless=_remote(base, served, "bankingAgentStateless"),
                transfers=served.transfers,
            )
            try:
                # Duck-typed: the suite uses only these three attributes of a BankingApp.
                yield cast(BankingApp, remote)
            finally:
                await remote.banking_agent.aclose()
                await remote.banking_agent_stateless.aclose()
    finally:
        stop.set()
        if running is not None:
            await running


@contextlib.asynccontextmanager
async def remote_in_memory(request: pytest.FixtureRequest) -> AsyncIterator[BankingApp]:
    """An in-memory banking app behind a real HTTP server, turns run in the server."""
    served = build(store=InMemorySessionStore(), state_keys=TEST_STATE_KEYS)
    async with _served(served, None) as remote:
        yield remote


@contextlib.asynccontextmanager
async def remote_on_postgres(request: pytest.FixtureRequest) -> AsyncIterator[BankingApp]:
    """A PostgreSQL banking app behind a real HTTP server, turns run by a worker pool."""
    async with sql_store("postgres") as store:
        served = build(store=store, state_keys=TEST_STATE_KEYS, execution="workers")
        pool = WorkerPool(served.ai, concurrency=2, poll_interval=0.2, scheduler=False)
        async with _served(served, pool) as remote:
            yield remote


@dataclass(frozen=True)
class Backend:
    """One way of running the banking app, and the tier marker of its cases (none: unit)."""

    open: Opener
    tier: str | None = None


#: Every backend, by the id its cases carry.
BACKENDS: dict[str, Backend] = {
    "memory": Backend(in_memory),
    "sqlite": Backend(on_sql("sqlite"), "integration"),
    "postgres": Backend(on_sql("postgres"), "integration"),
    "openai": Backend(on_adapter("openai"), "integration"),
    "anthropic": Backend(on_adapter("anthropic"), "integration"),
    "remote-memory": Backend(remote_in_memory, "acceptance"),
    "remote-postgres": Backend(remote_on_postgres, "acceptance"),
}


def parameters(names: Sequence[str]) -> list[object]:
    """The ``app`` parameters of a behaviour test: ``names`` (default: every backend)."""
    unknown = set(names) - set(BACKENDS)
    assert not unknown, f"no behaviour-suite backend {sorted(unknown)}"
    params: list[object] = []
    for name in names or BACKENDS:
        tier = BACKENDS[name].tier
        marks = [getattr(pytest.mark, tier)] if tier is not None else []
        params.append(pytest.param(name, id=name, marks=marks))
    return params
