"""Pinned client-managed state over real HTTP: a v2 server refuses to resume a blob paused
under v1's changed definition as it refuses a stored v1 turn (HTTP 200, Genkit's
failure-before-the-turn result naming the changes, the blob echoed back unchanged)."""

from __future__ import annotations

from typing import Any

import httpx

from engine import Engine
from engine.remote.server import create_app
from engine.remote.ui import UiSettings
from engine.state.client_state import PIN_FIELD
from tests.conftest import TEST_STATE_KEYS
from tests.http_support import serve_in_loop
from tests.support import ListModel, ask
from tests.unit.test_definition_versions import Approval, Transfer, TransferV2


def _engine(version: str, model: ListModel) -> Engine:
    """The client-managed agent ``bank`` at ``version``: v2 renamed the approval interrupt
    and changed the transfer's input."""
    ai = Engine(model=model, version=version, state_keys=TEST_STATE_KEYS)
    name = "approve" if version == "v1" else "confirm"
    approval = ai.define_interrupt(name=name, output_schema=Approval)
    transfer = ai.define_tool(
        name="transfer",
        input_schema=Transfer if version == "v1" else TransferV2,
        fn=lambda _: {"ok": True},
    )
    ai.define_agent(name="bank", system="Move money.", tools=[approval, transfer])
    return ai


async def test_a_v2_server_refuses_a_v1_blob_naming_the_changes() -> None:
    """The resume fails before its turn with FAILED_PRECONDITION listing each change in
    ``details``, no session id, and the client's blob echoed back as it was sent."""
    v1 = _engine("v1", ListModel([ask(("approve", "a1", {"amount": 5}))]))
    paused = await v1.agents["bank"].chat().send("Move 5")
    assert paused.state is not None and paused.state[PIN_FIELD]["appVersion"] == "v1"
    v2 = _engine("v2", ListModel([]))
    served = create_app(v2, ui_settings=UiSettings(secret="versions-test-secret-0123456789abcd"))
    answer = {"toolResponse": {"name": "approve", "ref": "a1", "output": {"approved": True}}}
    body: dict[str, Any] = {
        "data": {"resume": {"respond": [answer]}},
        "init": {"state": paused.state},
    }
    async with serve_in_loop(served) as url, httpx.AsyncClient(timeout=30) as http:
        reply = await http.post(f"{url}/api/bank", json=body)
    assert reply.status_code == 200, reply.text
    result = reply.json()["result"]
    assert result["finishReason"] == "failed"
    error = result["error"]
    assert error["status"] == "FAILED_PRECONDITION"
    assert error["message"].startswith("The client-managed state paused under version 'v1'")
    changed = {(c["what"], c["change"]) for c in error["details"]["changes"]}
    assert changed == {
        ("tools.approve", "removed"),
        ("tools.confirm", "added"),
        ("tools.transfer.inputSchema", "changed"),
    }
    assert "sessionId" not in result and "snapshotId" not in result
    assert result["state"] == paused.state
