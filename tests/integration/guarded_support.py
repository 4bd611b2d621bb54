"""The guarded transfer app (examples/guarded_banking.py) paused on a transfer, in process
and served over real HTTP: what the edit-before-approve and reject tests share."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest

from engine.approval_policy import role
from engine.approvals.decide import find_approval
from engine.conversation.parts import Message
from engine.remote import BearerTokenAuth, Principal, RoleInboxPolicy, create_app
from engine.remote.ui import UiSettings
from engine.status import FinishReason
from engine.store import PendingApproval, SessionStore, TurnInput
from engine.turns.request import TurnRequest
from examples.guarded_banking import GuardedApp, build
from tests.databases import sql_store
from tests.http_support import csrf_of, serve_in_loop, signed_in_with

__all__ = [
    "ALICE",
    "BOB",
    "CAROL",
    "MALLORY",
    "ask_transfer",
    "client_of",
    "csrf_of",
    "paused",
    "served",
    "served_guarded",
    "served_quorum",
    "signed_in",
]

APPROVER = frozenset({"approver"})
BOB = Principal("bob", roles=APPROVER)
CAROL = Principal("carol", roles=APPROVER)
ALICE = Principal("alice", roles=APPROVER)  # the requester
MALLORY = Principal("mallory")  # no approver role

TOKENS = {
    "alice": "alice-token",
    "bob": "bob-token",
    "carol": "carol-token",
    "mallory": "mallory-token",
}
AUTH = BearerTokenAuth(
    {
        token: Principal(id=who, roles=APPROVER if who != "mallory" else frozenset())
        for who, token in TOKENS.items()
    }
)
SETTINGS = UiSettings(secret="guarded-pages-secret-0123456789abcdef", poll_seconds=1)


async def paused(store: SessionStore, **options: Any) -> tuple[GuardedApp, PendingApproval]:
    """alice asks for a transfer of $40 to carol; the guarded tool pauses the turn."""
    app = build(store=store, execution="inline", **options)
    response = await app.agent.run_turn(
        TurnRequest(
            input=TurnInput(kind="message", message=Message.user("transfer $40 to carol")),
            owner="alice",
        )
    )
    assert response.finish_reason is FinishReason.INTERRUPTED
    assert response.snapshot_id is not None
    found = await find_approval(store, response.snapshot_id, "transfer-1")
    assert found is not None and found[1]
    return app, found[0]


@asynccontextmanager
async def served_guarded(backend: str, **options: Any) -> AsyncIterator[tuple[GuardedApp, str]]:
    """The guarded transfer app on ``backend`` (turns run inline) behind a real HTTP server,
    and its base URL; approvers hold a role. ``options``: more of ``build``'s."""
    async with sql_store(backend) as store:
        app = build(store=store, execution="inline", approvers=role("approver"), **options)
        server = create_app(
            app.ai, auth=AUTH, inbox_policy=RoleInboxPolicy("approver"), ui_settings=SETTINGS
        )
        async with serve_in_loop(server) as base:
            yield app, base


@pytest.fixture
async def served() -> AsyncIterator[tuple[GuardedApp, str]]:
    """The served app on PostgreSQL."""
    async with served_guarded("postgres") as app_and_base:
        yield app_and_base


@pytest.fixture
async def served_quorum() -> AsyncIterator[tuple[GuardedApp, str]]:
    """The served app on PostgreSQL, whose transfers need two approvers."""
    async with served_guarded("postgres", required_approvals=2) as app_and_base:
        yield app_and_base


def client_of(base: str, who: str) -> httpx.AsyncClient:
    """An API client holding ``who``'s bearer token."""
    return httpx.AsyncClient(base_url=base, headers={"Authorization": f"Bearer {TOKENS[who]}"})


async def ask_transfer(base: str) -> str:
    """alice asks for $40 to carol; the id of the approval the guarded tool opens."""
    async with client_of(base, "alice") as api:
        started = await api.post(
            "/api/guardedAgent",
            json={
                "data": {
                    "message": {"role": "user", "content": [{"text": "transfer $40 to carol"}]}
                }
            },
        )
    assert started.status_code == 200, started.text
    assert started.json()["result"]["finishReason"] == "interrupted"
    return f"{started.json()['result']['snapshotId']}:transfer-1"


async def signed_in(base: str, who: str) -> httpx.AsyncClient:
    """A client signed in to the UI as ``who``."""
    return await signed_in_with(base, TOKENS[who])
