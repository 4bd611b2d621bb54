"""Client-managed (signed) state is pinned to its definition like a stored turn: the blob
carries the app version, the fingerprint and an outline of the definition, all signed; a
resume across a definition change is refused with the diff or migrated, while a plain
message on an older blob continues under the new definitions."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from pydantic import BaseModel

from engine import Engine, FinishReason
from engine.conversation.parts import Message, Part
from engine.errors import FailedPreconditionError, InvalidStateError
from engine.response import AgentResponse
from engine.state.client_state import PIN_FIELD
from engine.state.signing import SIGNATURE_FIELD
from engine.state.versioning import (
    DefinitionChangedError,
    PausedTurn,
    diff_definitions,
    outline_definition,
)
from tests.support import ListModel, ask, say

KEYS = {"k1": "secret-one-0123456789"}
SECRET_PROMPT = "You move money. Internal rule: never mention the fee table."


class Approval(BaseModel):
    approved: bool


class Transfer(BaseModel):
    amount: int


class TransferV2(BaseModel):
    amount: int
    currency: str = "EUR"


def _engine(
    answers: list[Message],
    *,
    version: str | None,
    system: str = SECRET_PROMPT,
    interrupt: str = "approve",
    transfer_schema: type[BaseModel] = Transfer,
    moved: list[Any] | None = None,
) -> Engine:
    """The client-managed agent ``bank`` at one version of its definition."""
    ai = Engine(model=ListModel(answers), version=version, state_keys=KEYS)
    approve = ai.define_interrupt(name=interrupt, output_schema=Approval)
    sink = moved if moved is not None else []

    def transfer(request: Any) -> dict[str, bool]:
        sink.append(request)
        return {"ok": True}

    move = ai.define_tool(name="transfer", input_schema=transfer_schema, fn=transfer)
    ai.define_agent(name="bank", system=system, tools=[approve, move])
    return ai


async def _paused_under_v1() -> tuple[Engine, AgentResponse]:
    """A client-managed session paused at v1's ``approve`` interrupt."""
    v1 = _engine([ask(("approve", "a1", {"amount": 5}))], version="v1")
    res = await v1.agents["bank"].chat().send("Move 5 to savings")
    assert res.finish_reason is FinishReason.INTERRUPTED and res.state is not None
    return v1, res


def _respond(name: str = "approve", ref: str = "a1") -> Part:
    return Part.of_response(name, ref, {"approved": True})


# -- the blob ---------------------------------------------------------------------------


async def test_the_blob_carries_its_version_fingerprint_and_outline() -> None:
    """The signed blob names v1, the agent's fingerprint and an outline of its definition
    that does not disclose the system prompt or the tool schemas."""
    v1, res = await _paused_under_v1()
    assert res.state is not None
    pin = res.state[PIN_FIELD]
    agent = v1.agents["bank"]
    assert pin["appVersion"] == "v1" and pin["fingerprint"] == agent.fingerprint
    assert pin["definition"] == outline_definition(agent.definition)
    text = json.dumps(res.state[PIN_FIELD])
    assert "fee table" not in text and "amount" not in text
    assert set(res.state) == {"sessionId", "messages", "artifacts", PIN_FIELD, SIGNATURE_FIELD}


@pytest.mark.parametrize(
    "tamper",
    [
        lambda pin: pin.update(appVersion="v2"),
        lambda pin: pin.update(fingerprint="def-0000000000000000"),
        lambda pin: pin["definition"].update(system=None),
        lambda pin: pin.clear(),
    ],
    ids=["version", "fingerprint", "outline", "emptied"],
)
async def test_a_tampered_pin_is_refused(tamper: Any) -> None:
    """Editing any part of the pin, e.g. to pass a v1 pause off as v2's, breaks the
    signature: INVALID_ARGUMENT, and the transfer does not run."""
    _, res = await _paused_under_v1()
    moved: list[Any] = []
    v2 = _engine([say("Moved.")], version="v2", system="New rules.", moved=moved)
    forged = copy.deepcopy(res.state)
    assert forged is not None
    tamper(forged[PIN_FIELD])
    with pytest.raises(InvalidStateError, match="signature does not match"):
        v2.agents["bank"].chat(state=forged)
    assert moved == []


async def test_removing_the_pin_is_refused() -> None:
    """A blob stripped of its pin (to pass as one signed before blobs were pinned) no
    longer matches its signature."""
    _, res = await _paused_under_v1()
    v2 = _engine([], version="v2", system="New rules.")
    stripped = {k: v for k, v in (res.state or {}).items() if k != PIN_FIELD}
    with pytest.raises(InvalidStateError, match="signature does not match"):
        v2.agents["bank"].chat(state=stripped)


async def test_a_malformed_pin_under_a_valid_signature_is_invalid_state() -> None:
    """A pin of the wrong shape, even signed by the server's key, is INVALID_ARGUMENT."""
    v1, res = await _paused_under_v1()
    blob = copy.deepcopy(res.state)
    assert blob is not None
    blob[PIN_FIELD] = {"appVersion": 1}
    resigned = v1.signer.sign(blob, agent="bank")
    with pytest.raises(InvalidStateError, match="malformed 'pin'"):
        await v1.agents["bank"].chat(state=resigned).resume(respond=[_respond()])


def test_outlines_diff_like_the_descriptions() -> None:
    """Diffing two outlines names the same elements as diffing the full descriptions, and a
    full description diffs against an outline as an outline."""
    before = _engine([], version="v1").agents["bank"].definition
    after = (
        _engine([], version="v2", system="New.", interrupt="confirm", transfer_schema=TransferV2)
        .agents["bank"]
        .definition
    )
    full = [(c.what, c.change) for c in diff_definitions(before, after)]
    assert full == [
        ("system", "changed"),
        ("tools.approve", "removed"),
        ("tools.confirm", "added"),
        ("tools.transfer.inputSchema", "changed"),
    ]
    outlined = diff_definitions(outline_definition(before), outline_definition(after))
    assert [(c.what, c.change) for c in outlined] == full
    mixed = diff_definitions(outline_definition(before), after)
    assert [(c.what, c.change) for c in mixed] == full
    assert diff_definitions(outline_definition(before), before) == []


# -- continuing across versions -----------------------------------------------------------


async def test_a_resume_of_a_v1_blob_by_a_changed_v2_agent_is_refused_with_the_diff() -> None:
    """v2 rewrote the prompt and changed the transfer's schema: resuming v1's paused blob
    there is the stored turns' DefinitionChangedError naming both, and nothing runs."""
    _, res = await _paused_under_v1()
    moved: list[Any] = []
    v2 = _engine(
        [ask(("transfer", "t1", {"amount": 5}))],
        version="v2",
        system="New rules.",
        transfer_schema=TransferV2,
        moved=moved,
    )
    with pytest.raises(DefinitionChangedError) as refused:
        await v2.agents["bank"].chat(state=res.state).resume(respond=[_respond()])
    assert isinstance(refused.value, FailedPreconditionError)
    assert refused.value.status == "FAILED_PRECONDITION"
    message = refused.value.message
    assert message.startswith("The client-managed state paused under version 'v1'")
    assert "'v2'" in message and "turnstile turns migrate" not in message
    assert "system changed" in message and "tools.transfer.inputSchema changed" in message
    assert {c["what"] for c in refused.value.details["changes"]} == {
        "system",
        "tools.transfer.inputSchema",
    }
    assert refused.value.details["fromVersion"] == "v1"
    assert refused.value.snapshot_id is None
    assert "New rules." not in json.dumps(refused.value.details)
    assert moved == []


async def test_a_restart_of_a_v1_blob_by_a_changed_v2_agent_is_refused_too() -> None:
    """Restarting the paused call is a resume as well: refused across the change."""
    _, res = await _paused_under_v1()
    v2 = _engine([say("Restarted.")], version="v2", interrupt="confirm")
    chat = v2.agents["bank"].chat(state=res.state)
    with pytest.raises(DefinitionChangedError, match=r"tools\.approve removed"):
        await chat.resume(restart=[res.interrupts[0].restart()])


async def test_a_registered_migration_resumes_a_v1_blob_under_v2() -> None:
    """v2 renamed the interrupt and registers a migration from v1: the resume runs under
    v2, the model sees the new name, and the new blob is pinned to v2."""
    _, res = await _paused_under_v1()
    v2 = _engine([say("Moved under the new rules.")], version="v2", interrupt="confirm")
    seen: list[tuple[str, str]] = []

    @v2.migrate(from_version="v1")
    def rename_approval(state: PausedTurn) -> PausedTurn:
        seen.append((state.from_version, state.to_version))
        for part in state.messages[-1].content:
            if part.tool_request is not None and part.tool_request.name == "approve":
                part.tool_request.name = "confirm"
        for part in state.respond:
            if part.tool_response is not None:
                part.tool_response.name = "confirm"
        return state

    out = await v2.agents["bank"].chat(state=res.state).resume(respond=[_respond()])
    assert out.text == "Moved under the new rules."
    assert seen == [("v1", "v2")]
    assert out.state is not None
    assert out.state[PIN_FIELD]["appVersion"] == "v2"
    assert out.state[PIN_FIELD]["fingerprint"] == v2.agents["bank"].fingerprint
    model = v2.agents["bank"].model
    assert isinstance(model, ListModel)
    shown = model.requests[-1].messages
    assert [p.tool_request.name for m in shown for p in m.content if p.tool_request] == ["confirm"]


async def test_the_same_definition_under_a_new_label_keeps_the_paused_version() -> None:
    """Only the version label changed: the resume runs and its blob stays pinned to v1."""
    _, res = await _paused_under_v1()
    v2 = _engine([say("Moved.")], version="v2")
    out = await v2.agents["bank"].chat(state=res.state).resume(respond=[_respond()])
    assert out.text == "Moved." and out.state is not None
    assert out.state[PIN_FIELD]["appVersion"] == "v1"


async def test_a_new_message_on_a_settled_v1_blob_continues_under_v2() -> None:
    """No interrupt is pending: a new message on v1's blob is accepted by a changed v2,
    and the conversation goes on pinned to v2."""
    v1 = _engine([say("Hello.")], version="v1")
    first = await v1.agents["bank"].chat().send("Hi")
    assert first.state is not None and first.state[PIN_FIELD]["appVersion"] == "v1"
    v2 = _engine([say("Hello again.")], version="v2", system="New rules.")
    out = await v2.agents["bank"].chat(state=first.state).send("Hi again")
    assert out.text == "Hello again." and out.state is not None
    assert out.state[PIN_FIELD]["appVersion"] == "v2"
    assert out.state[PIN_FIELD]["fingerprint"] == v2.agents["bank"].fingerprint
    assert len(out.messages) == 4


async def test_a_paused_blob_signed_before_pinning_resumes_unpinned() -> None:
    """A blob without a pin (signed before blobs carried one) is accepted like an unpinned
    stored turn: the resume runs under the current definitions."""
    v1, res = await _paused_under_v1()
    legacy = {k: v for k, v in (res.state or {}).items() if k not in (PIN_FIELD, SIGNATURE_FIELD)}
    signed_before = v1.signer.sign(legacy, agent="bank")
    v2 = _engine([say("Moved.")], version="v2", system="New rules.")
    out = await v2.agents["bank"].chat(state=signed_before).resume(respond=[_respond()])
    assert out.text == "Moved." and out.state is not None
    assert out.state[PIN_FIELD]["appVersion"] == "v2"
