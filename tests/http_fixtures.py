"""The banking app behind a real HTTP server, for the HTTP tier's tests.

Nothing is mocked: requests go over TCP to uvicorn, turns run against a real store (the
in-memory one, or PostgreSQL through :func:`tests.databases.sql_store`), and the database is
read back with plain SQL.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

import httpx
import sqlalchemy as sa

from engine.remote.auth import Authenticator, BearerTokenAuth, InboxPolicy, Principal
from engine.remote.server import DEFAULT_MAX_BODY_BYTES, create_app
from engine.store import SessionStore
from examples.banking import SYSTEM_PROMPT, BankingApp, build
from stores import InMemorySessionStore, SqlSessionStore
from tests.conftest import TEST_STATE_KEYS
from tests.databases import sql_store
from tests.http_support import serve_in_loop

__all__ = [
    "AUDIT_AGENT",
    "TABLES",
    "TOKENS",
    "Served",
    "approval_resume",
    "bearer",
    "serve_banking",
    "token_auth",
]

#: A second store-backed agent next to ``bankingAgent`` (same tools, same store).
AUDIT_AGENT = "auditAgent"

#: alice and bob own sessions; carol holds the ``approver`` role.
TOKENS: dict[str, Principal | str] = {
    "tok-alice": "alice",
    "tok-bob": Principal("bob"),
    "tok-carol": Principal("carol", roles=frozenset({"approver"})),
}

#: The tables a request could write to; refused requests must leave all of them unchanged.
TABLES = ("sessions", "turns", "messages", "tool_calls")


def approval_resume(init: Mapping[str, Any], *approved: bool) -> dict[str, Any]:
    """A wire resume answering ``approval-1``, ``approval-2``, … with ``approved``."""
    respond = [
        {
            "toolResponse": {
                "name": "userApproval",
                "ref": f"approval-{n}",
                "output": {"approved": value},
            }
        }
        for n, value in enumerate(approved, start=1)
    ]
    return {"data": {"resume": {"respond": respond}}, "init": dict(init)}


def bearer(token: str) -> dict[str, str]:
    """The Authorization header for ``token``."""
    return {"authorization": f"Bearer {token}"}


@dataclass
class Served:
    """One banking app served over HTTP, with a client and a way into its database."""

    app: BankingApp
    url: str
    store: SessionStore
    http: httpx.AsyncClient

    @property
    def agent_url(self) -> str:
        return f"{self.url}/api/bankingAgent"

    async def send(
        self,
        text: str,
        *,
        token: str | None = None,
        init: Mapping[str, Any] | None = None,
        agent: str = "bankingAgent",
    ) -> dict[str, Any]:
        """One turn with a user message; the ``result`` object (asserts HTTP 200)."""
        body: dict[str, Any] = {
            "data": {"message": {"role": "user", "content": [{"text": text}]}},
            "init": dict(init or {}),
        }
        reply = await self.http.post(
            f"{self.url}/api/{agent}", json=body, headers=bearer(token) if token else {}
        )
        assert reply.status_code == 200, reply.text
        result: dict[str, Any] = reply.json()["result"]
        return result

    async def snapshot(self, snapshot_id: str, *, token: str | None = None) -> dict[str, Any]:
        """``getSnapshot`` by snapshot id (asserts HTTP 200)."""
        reply = await self.http.post(
            f"{self.agent_url}/getSnapshot",
            json={"data": {"snapshotId": snapshot_id}},
            headers=bearer(token) if token else {},
        )
        assert reply.status_code == 200, reply.text
        result: dict[str, Any] = reply.json()["result"]
        return result

    async def inbox(self, *, token: str | None = None, **params: Any) -> dict[str, Any]:
        """``GET /inbox`` (asserts HTTP 200)."""
        reply = await self.http.get(
            f"{self.url}/inbox", params=params, headers=bearer(token) if token else {}
        )
        assert reply.status_code == 200, reply.text
        page: dict[str, Any] = reply.json()
        return page

    async def decide(
        self, approval: str, decision: Any, *, token: str | None = None
    ) -> httpx.Response:
        """``POST /inbox/{id}/decision``."""
        return await self.http.post(
            f"{self.url}/inbox/{approval}/decision",
            json=decision,
            headers=bearer(token) if token else {},
        )

    @property
    def is_sql(self) -> bool:
        return isinstance(self.store, SqlSessionStore)

    def sql(self, query: str, **params: Any) -> list[sa.Row[Any]]:
        """Rows of a read-only SQL query on the store's database."""
        assert isinstance(self.store, SqlSessionStore)
        with self.store.db.autocommit() as connection:
            return list(connection.execute(sa.text(query), params).all())

    def row_counts(self) -> dict[str, int]:
        """Rows per table of :data:`TABLES`."""
        return {table: int(self.sql(f"SELECT count(*) FROM {table}")[0][0]) for table in TABLES}


@contextlib.asynccontextmanager
async def serve_banking(
    kind: str,
    *,
    auth: Authenticator | None = None,
    inbox_policy: InboxPolicy | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    execution: str = "inline",
) -> AsyncIterator[Served]:
    """The banking app on a ``memory`` or ``postgres`` store, served by uvicorn in this loop.

    By default turns run inline in the server process (no worker pool), so a resume enqueued
    by an inbox decision runs and settles before the decision answers; with
    ``execution="workers"`` they are queued for a worker pool the test runs.
    """
    async with contextlib.AsyncExitStack() as stack:
        store: SessionStore
        if kind == "memory":
            store = InMemorySessionStore()
        else:
            store = await stack.enter_async_context(sql_store(kind))
        app = build(store=store, state_keys=TEST_STATE_KEYS, execution=execution)
        # A second agent on the same store, so the inbox's agent filter has something to drop.
        app.ai.define_agent(
            name=AUDIT_AGENT,
            system=SYSTEM_PROMPT,
            tools=[app.user_approval, app.transfer_money],
            store=store,
            execution=execution,
        )
        served_app = create_app(
            app.ai, auth=auth, inbox_policy=inbox_policy, max_body_bytes=max_body_bytes
        )
        url = await stack.enter_async_context(serve_in_loop(served_app))
        http = await stack.enter_async_context(httpx.AsyncClient(timeout=30))
        yield Served(app=app, url=url, store=store, http=http)


def token_auth() -> BearerTokenAuth:
    """The bearer tokens of :data:`TOKENS`."""
    return BearerTokenAuth(TOKENS)
