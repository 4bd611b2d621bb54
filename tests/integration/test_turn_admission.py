"""Turns in flight per principal (``create_app(..., max_turns_per_principal=N)``), over real
HTTP: uvicorn on TCP, real stores (in-memory and PostgreSQL), a real worker pool.

Turns are queued for workers; with no pool running they stay ``pending``, so each admitted
request holds one place until it is aborted or a pool settles it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from engine.remote.admission import RETRY_AFTER_SECONDS, ActiveTurnReader
from engine.remote.auth import Authenticator
from engine.remote.server import create_app
from engine.store import SessionStore
from examples.banking import build
from stores import InMemorySessionStore, SqlSessionStore
from stores.admission import _ACTIVE_OF_OWNER
from tests.conftest import TEST_STATE_KEYS
from tests.databases import sql_store
from tests.http_fixtures import Served, bearer, token_auth
from tests.http_support import serve_in_loop
from workers.pool import WorkerPool

ALICE, BOB = "tok-alice", "tok-bob"
LIMIT = 3
TRANSFER = {"role": "user", "content": [{"text": "Transfer $500 to my savings account."}]}


@contextlib.asynccontextmanager
async def serve_limited(
    kind: str, *, limit: int = LIMIT, auth: Authenticator | None = None
) -> AsyncIterator[Served]:
    """The banking app (turns queued for workers) behind a server admitting ``limit`` turns
    in flight per principal."""
    async with contextlib.AsyncExitStack() as stack:
        store: SessionStore
        if kind == "memory":
            store = InMemorySessionStore()
        else:
            store = await stack.enter_async_context(sql_store(kind))
        app = build(store=store, state_keys=TEST_STATE_KEYS, execution="workers")
        served_app = create_app(app.ai, auth=auth, max_turns_per_principal=limit)
        url = await stack.enter_async_context(serve_in_loop(served_app))
        http = await stack.enter_async_context(httpx.AsyncClient(timeout=30))
        yield Served(app=app, url=url, store=store, http=http)


@pytest.fixture(params=["memory", "postgres"])
async def served(request: pytest.FixtureRequest) -> AsyncIterator[Served]:
    """Behind bearer tokens (alice, bob, carol), on each store."""
    async with serve_limited(request.param, auth=token_auth()) as one:
        yield one


async def detach(
    served: Served,
    token: str | None,
    *,
    key: str | None = None,
    agent: str = "bankingAgent",
) -> httpx.Response:
    """A detached turn request (answered as soon as the turn is queued)."""
    headers = bearer(token) if token else {}
    if key is not None:
        headers["idempotency-key"] = key
    body = {"data": {"message": TRANSFER, "detach": True}, "init": {}}
    return await served.http.post(f"{served.url}/api/{agent}", json=body, headers=headers)


async def abort(served: Served, token: str | None, snapshot_id: str) -> None:
    reply = await served.http.post(
        f"{served.agent_url}/abort",
        json={"data": {"snapshotId": snapshot_id}},
        headers=bearer(token) if token else {},
    )
    assert reply.status_code == 200, reply.text


async def in_flight(served: Served, owner: str | None) -> list[str]:
    """The owner's pending and aborting turns, as the store reports them to admission."""
    assert isinstance(served.store, ActiveTurnReader)
    return await served.store.active_turn_ids(owner, limit=100)


def assert_too_many(reply: httpx.Response, who: str) -> None:
    """A Genkit-shaped 429: ``{status, message, details}`` and ``Retry-After``."""
    assert reply.status_code == 429, reply.text
    assert reply.headers["retry-after"] == str(RETRY_AFTER_SECONDS)
    body = reply.json()
    assert body["status"] == "RESOURCE_EXHAUSTED"
    assert body["details"] == {"type": "TooManyTurnsError"}
    assert who in body["message"] and f"{LIMIT} turn(s) in flight" in body["message"]


def snapshot_of(reply: httpx.Response) -> str:
    assert reply.status_code == 200, reply.text
    result: dict[str, Any] = reply.json()["result"]
    assert result["finishReason"] == "detached"
    return str(result["snapshotId"])


async def test_a_flooding_principal_is_held_to_the_limit_and_another_gets_through(
    served: Served,
) -> None:
    """Alice sends twelve turns at once: three are queued, nine get 429 and write nothing;
    Bob's turn is admitted all the same."""
    replies = await asyncio.gather(*(detach(served, ALICE) for _ in range(12)))
    admitted = [r for r in replies if r.status_code == 200]
    assert len(admitted) == LIMIT
    for refused in (r for r in replies if r.status_code != 200):
        assert_too_many(refused, "Principal 'alice'")
    assert len(await in_flight(served, "alice")) == LIMIT
    if served.is_sql:
        assert served.sql("SELECT count(*) FROM turns")[0][0] == LIMIT
    snapshot_of(await detach(served, BOB))


async def test_a_place_comes_back_when_a_turn_settles(served: Served) -> None:
    """At the limit, aborting one of Alice's turns lets exactly one more in."""
    ids = [snapshot_of(await detach(served, ALICE)) for _ in range(LIMIT)]
    assert_too_many(await detach(served, ALICE), "Principal 'alice'")
    await abort(served, ALICE, ids[0])
    snapshot_of(await detach(served, ALICE))
    assert_too_many(await detach(served, ALICE), "Principal 'alice'")


async def test_a_retry_of_a_turn_in_flight_is_not_refused(served: Served) -> None:
    """At the limit, the same request under the same Idempotency-Key answers with the turn
    the first one queued (it is counted once); a new key is refused."""
    ids = [snapshot_of(await detach(served, ALICE, key=f"k{n}")) for n in range(LIMIT)]
    assert snapshot_of(await detach(served, ALICE, key="k0")) == ids[0]
    assert_too_many(await detach(served, ALICE, key="k-new"), "Principal 'alice'")


async def test_a_refused_stream_gets_the_error_before_any_frame(served: Served) -> None:
    """A streaming request over the limit: a JSON 429, not a 200 stream with an error frame."""
    for _ in range(LIMIT):
        snapshot_of(await detach(served, ALICE))
    reply = await served.http.post(
        served.agent_url,
        json={"data": {"message": TRANSFER}, "init": {}},
        headers={**bearer(ALICE), "accept": "text/event-stream"},
    )
    assert_too_many(reply, "Principal 'alice'")


async def test_client_managed_turns_count_too(served: Served) -> None:
    """The limit covers every agent: with three stored turns in flight, Alice's turn on the
    client-managed agent is refused; below the limit it runs, and gives its place back."""
    ids = [snapshot_of(await detach(served, ALICE)) for _ in range(LIMIT)]
    body = {"data": {"message": TRANSFER}, "init": {}}
    stateless = f"{served.url}/api/bankingAgentStateless"
    assert_too_many(
        await served.http.post(stateless, json=body, headers=bearer(ALICE)), "Principal 'alice'"
    )
    await abort(served, ALICE, ids[0])
    reply = await served.http.post(stateless, json=body, headers=bearer(ALICE))
    assert reply.status_code == 200 and reply.json()["result"]["finishReason"] == "interrupted"
    snapshot_of(await detach(served, ALICE))


async def test_an_abandoned_stream_gives_its_place_back(served: Served) -> None:
    """A client that closes a streaming turn early holds no place once its turn is over:
    after aborting everything, the whole limit is free again."""
    async with (
        httpx.AsyncClient(timeout=30) as other,
        other.stream(
            "POST",
            served.agent_url,
            json={"data": {"message": TRANSFER}, "init": {}},
            headers={**bearer(ALICE), "accept": "text/event-stream"},
        ) as stream,
    ):
        assert stream.status_code == 200
        # The stream waits for a worker that never comes; the client gives up.
    await asyncio.sleep(0.2)
    for turn_id in await in_flight(served, "alice"):
        await abort(served, ALICE, turn_id)
    ids = [snapshot_of(await detach(served, ALICE)) for _ in range(LIMIT)]
    assert len(ids) == LIMIT


@pytest.mark.parametrize("kind", ["memory", "postgres"])
async def test_unauthenticated_callers_share_one_budget(kind: str) -> None:
    """On an open server every caller is the same principal: the limit bounds them together."""
    async with serve_limited(kind) as served:
        for _ in range(LIMIT):
            snapshot_of(await detach(served, None))
        assert_too_many(await detach(served, None), "Unauthenticated callers (together)")


async def test_the_other_principal_is_served_while_the_flood_waits() -> None:
    """With a worker pool running, Bob's turn is settled while Alice keeps flooding: the queue
    never holds more than the limit of hers ahead of it."""
    async with serve_limited("postgres", auth=token_auth()) as served:
        assert isinstance(served.store, SqlSessionStore)

        async def flood() -> list[int]:
            codes = []
            for _ in range(6):
                replies = await asyncio.gather(*(detach(served, ALICE) for _ in range(5)))
                codes += [r.status_code for r in replies]
                # However the flood and the pool interleave, never more than the limit queued.
                assert len(await in_flight(served, "alice")) <= LIMIT
            return codes

        async with WorkerPool(served.app.ai, served.store, concurrency=2, poll_interval=0.05):
            flooding = asyncio.create_task(flood())
            reply = await served.http.post(
                served.agent_url,
                json={"data": {"message": TRANSFER}, "init": {}},
                headers=bearer(BOB),
            )
            codes = await flooding
        assert reply.status_code == 200, reply.text
        assert reply.json()["result"]["finishReason"] == "interrupted"
        assert 429 in codes


async def test_the_postgres_read_uses_the_partial_index_of_active_turns() -> None:
    """The admission read starts from ``ux_turns_one_active_per_session``, even in a generic
    plan (a prepared statement run often): the status predicate is the index's own literals."""
    async with sql_store("postgres") as store:
        with store.db.autocommit() as connection:
            sql = str(_ACTIVE_OF_OWNER.compile(dialect=connection.dialect))
            sql = sql.replace("%(owner)s", "$1").replace("%(limit)s", "$2")
            connection.exec_driver_sql("SET enable_seqscan = off")
            connection.exec_driver_sql("SET plan_cache_mode = force_generic_plan")
            connection.exec_driver_sql(f"PREPARE admission_read(text, bigint) AS {sql}")
            plan = "\n".join(
                str(row[0])
                for row in connection.exec_driver_sql("EXPLAIN EXECUTE admission_read('a', 4)")
            )
            connection.exec_driver_sql("DEALLOCATE admission_read")
        assert "ux_turns_one_active_per_session" in plan, plan
