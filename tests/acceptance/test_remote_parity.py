"""The engine's behaviour suite, re-run through HTTP with the Python remote client.

The test functions are the unit tier's (imported, so pytest collects them here too). The
``app`` fixture below serves a banking app with a real uvicorn server and hands the tests
*remote* agents (``engine.remote.client.remote_agent``) in place of the local ones, so the
same assertions hold for a local chat and a remote chat: texts, statuses, interrupts, typed
errors, the full conversation, transfers executed once. Two servers: an in-memory store with
turns run in the server, and PostgreSQL with turns run by a worker pool.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest

from engine.remote import create_app
from engine.remote.client import RemoteAgent, remote_agent
from examples.banking import ApprovalRequest, BankingApp, build
from stores import InMemorySessionStore
from tests.behaviour_suite import *  # noqa: F403 - the suite, collected again here
from tests.conftest import TEST_STATE_KEYS
from tests.databases import sql_store
from tests.http_support import serve_in_loop
from tests.unit.test_client_state import (  # noqa: F401
    test_state_blob_alone_carries_the_session_through_an_approval,
    test_state_from_chat_follows_each_turn,
    test_wire_round_trip_of_blob_and_respond_still_resumes,
)
from workers import WorkerPool


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
async def _served(served: BankingApp, pool: WorkerPool | None) -> AsyncIterator[RemoteBankingApp]:
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
                yield remote
            finally:
                await remote.banking_agent.aclose()
                await remote.banking_agent_stateless.aclose()
    finally:
        stop.set()
        if running is not None:
            await running


@pytest.fixture(params=["memory-inline", "postgres-workers"])
async def app(request: pytest.FixtureRequest) -> AsyncIterator[RemoteBankingApp]:
    """A banking app behind a real HTTP server, seen through remote agents."""
    if request.param == "memory-inline":
        served = build(store=InMemorySessionStore(), state_keys=TEST_STATE_KEYS)
        async with _served(served, None) as remote:
            yield remote
        return
    async with sql_store("postgres") as store:
        served = build(store=store, state_keys=TEST_STATE_KEYS, execution="workers")
        pool = WorkerPool(served.ai, concurrency=2, poll_interval=0.2, scheduler=False)
        async with _served(served, pool) as remote:
            yield remote


@pytest.fixture
def bank(app: RemoteBankingApp) -> RemoteBankingApp:
    """The client-state tests call the app ``bank``."""
    return app
