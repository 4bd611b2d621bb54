"""Pinned definitions over real HTTP: a v2 server refuses to resume, or to decide in its
inbox, a turn paused under v1's changed definition (FAILED_PRECONDITION naming the changes,
nothing written), and lists v1's open approval with its version.

The agent endpoint answers a refused resume as Genkit answers every failure before the turn
(genkit-wire.md: HTTP 200, ``finishReason: "failed"`` and the error, which Genkit's client
throws); the inbox's own endpoint answers 400."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
import pytest

from engine import Engine
from engine.remote.server import create_app
from engine.remote.ui import UiSettings
from stores import InMemorySessionStore
from tests.conftest import TEST_STATE_KEYS
from tests.http_support import serve_in_loop
from tests.support import ListModel, ask
from tests.unit.test_definition_versions import Approval, Transfer, TransferV2


@dataclass
class Rollout:
    """v1 in this process, v2 behind HTTP, one store."""

    store: InMemorySessionStore
    v1: Engine
    url: str
    http: httpx.AsyncClient


def _engine(store: InMemorySessionStore, version: str, model: ListModel) -> Engine:
    ai = Engine(model=model, version=version, state_keys=TEST_STATE_KEYS)
    name = "approve" if version == "v1" else "confirm"
    approval = ai.define_interrupt(name=name, output_schema=Approval)
    transfer = ai.define_tool(
        name="transfer",
        input_schema=Transfer if version == "v1" else TransferV2,
        fn=lambda _: {"ok": True},
    )
    ai.define_agent(name="bank", system="Move money.", tools=[approval, transfer], store=store)
    return ai


@pytest.fixture
async def rollout() -> AsyncIterator[Rollout]:
    store = InMemorySessionStore()
    v1 = _engine(store, "v1", ListModel([ask(("approve", "a1", {"amount": 5}))]))
    v2 = _engine(store, "v2", ListModel([]))
    served = create_app(v2, ui_settings=UiSettings(secret="versions-test-secret-0123456789abcd"))
    async with serve_in_loop(served) as url, httpx.AsyncClient(timeout=30) as http:
        yield Rollout(store=store, v1=v1, url=url, http=http)


async def test_a_v2_server_refuses_a_v1_resume_naming_the_changes(rollout: Rollout) -> None:
    """The resume fails before its turn with FAILED_PRECONDITION listing the changed tools;
    the session still ends at the paused turn."""
    paused = await rollout.v1.agents["bank"].chat().send("Move 5")
    body = {
        "data": {
            "resume": {
                "respond": [
                    {"toolResponse": {"name": "approve", "ref": "a1", "output": {"approved": True}}}
                ]
            }
        },
        "init": {"snapshotId": paused.snapshot_id},
    }
    reply = await rollout.http.post(f"{rollout.url}/api/bank", json=body)
    assert reply.status_code == 200, reply.text
    result = reply.json()["result"]
    assert result["finishReason"] == "failed"
    error = result["error"]
    assert error["status"] == "FAILED_PRECONDITION"
    assert "tools.approve removed" in error["message"]
    changed = {c["what"] for c in error["details"]["changes"]}
    assert changed == {"tools.approve", "tools.confirm", "tools.transfer.inputSchema"}
    latest = await rollout.store.latest_turn(paused.session_id)
    assert latest is not None and latest.id == paused.snapshot_id


async def test_the_inbox_lists_v1_s_approval_with_its_version_and_refuses_to_decide_it(
    rollout: Rollout,
) -> None:
    """GET /inbox shows the open v1 approval with ``appVersion``; deciding it from v2 is a
    400 FAILED_PRECONDITION and records nothing."""
    paused = await rollout.v1.agents["bank"].chat().send("Move 5")
    page = (await rollout.http.get(f"{rollout.url}/inbox")).json()
    (item,) = page["items"]
    assert (item["interrupt"], item["appVersion"]) == ("approve", "v1")
    reply = await rollout.http.post(
        f"{rollout.url}/inbox/{item['id']}/decision", json={"respond": {"approved": True}}
    )
    assert reply.status_code == 400, reply.text
    assert reply.json()["status"] == "FAILED_PRECONDITION"
    assert "tools.approve removed" in reply.json()["message"]
    (call,) = await rollout.store.list_calls(str(paused.snapshot_id))
    assert call.decided_at is None and call.answer is None


async def test_the_ui_shows_the_version_of_an_old_approval(rollout: Rollout) -> None:
    """The /ui inbox row and the approval page of v1's open approval name version v1, which
    the page marks as not the version served now (v2)."""
    paused = await rollout.v1.agents["bank"].chat().send("Move 5")
    inbox = await rollout.http.get(f"{rollout.url}/ui")
    assert inbox.status_code == 200, inbox.text
    assert 'title="application version">v1</span>' in inbox.text
    page = await rollout.http.get(f"{rollout.url}/ui/approvals/{paused.snapshot_id}:a1")
    assert page.status_code == 200, page.text
    assert (
        '<dd class="app-version">v1 <span class="muted">(not the version served now)</span></dd>'
        in page.text
    )


async def test_the_turn_page_shows_the_version(rollout: Rollout) -> None:
    """The /ui turn inspector names the version the turn is pinned to."""
    paused = await rollout.v1.agents["bank"].chat().send("Move 5")
    page = await rollout.http.get(f"{rollout.url}/ui/turns/{paused.snapshot_id}")
    assert page.status_code == 200, page.text
    assert '<dd class="app-version">v1</dd>' in page.text
