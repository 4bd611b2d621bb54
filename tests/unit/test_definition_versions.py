"""Definitions pinned per turn: the fingerprint of an agent's definition, the version a turn
records, and resuming across a definition change (refused with a diff, or migrated)."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
from pydantic import BaseModel

from engine import Engine, FinishReason
from engine.conversation.parts import Message, Part
from engine.errors import FailedPreconditionError
from engine.state.versioning import (
    DefinitionChangedError,
    PausedTurn,
    describe_definition,
    diff_definitions,
    fingerprint_of,
    interface_changes,
    tools_version_of,
)
from engine.store.memory import list_events
from stores import InMemorySessionStore
from stores.settings import read_settings
from tests.support import ListModel, ask, say


class Approval(BaseModel):
    approved: bool


class ApprovalWithNote(BaseModel):
    approved: bool
    note: str


class Transfer(BaseModel):
    amount: int


class TransferV2(BaseModel):
    amount: int
    currency: str = "EUR"


def _engine(
    store: InMemorySessionStore,
    answers: list[Message],
    *,
    version: str | None = None,
    system: str = "You move money.",
    interrupt: str = "approve",
    transfer_schema: type[BaseModel] = Transfer,
    approval_schema: type[BaseModel] = Approval,
    max_turns: int = 5,
    transfer_description: str = "",
) -> Engine:
    """The banking agent ``bank`` at one version of its definition, on ``store``."""
    ai = Engine(model=ListModel(answers), version=version)
    approve = ai.define_interrupt(name=interrupt, output_schema=approval_schema)
    move = ai.define_tool(
        name="transfer",
        description=transfer_description,
        input_schema=transfer_schema,
        fn=lambda t: {"ok": True},
    )
    ai.define_agent(
        name="bank", system=system, tools=[approve, move], store=store, max_turns=max_turns
    )
    return ai


def _description(**changes: Any) -> dict[str, Any]:
    ai = _engine(InMemorySessionStore(), [], **changes)
    return ai.agents["bank"].definition


# -- the fingerprint -------------------------------------------------------------------


def test_the_fingerprint_ignores_dict_ordering() -> None:
    """Two descriptions equal but for the order of their keys hash the same."""
    description = _description()
    reordered = {key: description[key] for key in reversed(list(description))}
    reordered["tools"] = {k: description["tools"][k] for k in reversed(description["tools"])}
    assert list(reordered) != list(description)
    assert fingerprint_of(reordered) == fingerprint_of(description)


def test_the_fingerprint_is_stable_across_processes() -> None:
    """Another interpreter, with another hash seed, computes the same fingerprint."""
    here = _engine(InMemorySessionStore(), []).agents["bank"].fingerprint
    code = (
        "from tests.unit.test_definition_versions import _engine;"
        "from stores import InMemorySessionStore;"
        "print(_engine(InMemorySessionStore(), []).agents['bank'].fingerprint)"
    )
    there = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONHASHSEED": "12345", "PATH": ""},
    ).stdout.strip()
    assert there == here and here.startswith("def-")


@pytest.mark.parametrize(
    ("change", "what"),
    [
        ({"system": "You move money carefully."}, "system"),
        ({"interrupt": "confirm"}, "tools.approve"),
        ({"transfer_schema": TransferV2}, "tools.transfer.inputSchema"),
        ({"approval_schema": ApprovalWithNote}, "tools.approve.outputSchema"),
        ({"max_turns": 7}, "maxTurns"),
    ],
)
def test_each_element_changes_the_fingerprint_and_shows_in_the_diff(
    change: dict[str, Any], what: str
) -> None:
    """The prompt, an interrupt's name, a tool's schema and max_turns each change the
    fingerprint, and the diff names the element that changed."""
    before, after = _description(), _description(**change)
    assert fingerprint_of(before) != fingerprint_of(after)
    assert what in [c.what for c in diff_definitions(before, after)]


@pytest.mark.parametrize(
    "change",
    [
        {"system": "You move money carefully."},
        {"max_turns": 7},
        {"transfer_description": "Moves money between accounts."},
    ],
)
def test_what_the_model_is_told_keeps_the_tools_version(change: dict[str, Any]) -> None:
    """A prompt, max_turns or a tool description changes the fingerprint but not the
    version an app without a declared one pins its turns to."""
    before, after = _description(), _description(**change)
    assert fingerprint_of(before) != fingerprint_of(after)
    assert tools_version_of(before) == tools_version_of(after)
    assert interface_changes(diff_definitions(before, after)) == []


@pytest.mark.parametrize(
    ("change", "what"),
    [
        ({"interrupt": "confirm"}, "tools.approve"),
        ({"transfer_schema": TransferV2}, "tools.transfer.inputSchema"),
        ({"approval_schema": ApprovalWithNote}, "tools.approve.outputSchema"),
    ],
)
def test_a_tool_or_schema_change_changes_the_tools_version(
    change: dict[str, Any], what: str
) -> None:
    """A renamed interrupt or a changed schema is another tools version, and the diff
    counts it among the interface changes lenient pinning still refuses."""
    before, after = _description(), _description(**change)
    assert tools_version_of(before) != tools_version_of(after)
    assert what in [c.what for c in interface_changes(diff_definitions(before, after))]


def test_a_model_change_keeps_the_tools_version() -> None:
    """Another model id is another fingerprint, not another tools version."""
    tools = _engine(InMemorySessionStore(), []).agents["bank"].tools
    one = describe_definition(agent="bank", model="m1", system=None, tools=tools, max_turns=5)
    two = describe_definition(agent="bank", model="m2", system=None, tools=tools, max_turns=5)
    assert tools_version_of(one) == tools_version_of(two)


def test_the_model_id_changes_the_fingerprint() -> None:
    """Another model id is another definition."""
    tools = _engine(InMemorySessionStore(), []).agents["bank"].tools
    one = describe_definition(agent="bank", model="m1", system=None, tools=tools, max_turns=5)
    two = describe_definition(agent="bank", model="m2", system=None, tools=tools, max_turns=5)
    assert fingerprint_of(one) != fingerprint_of(two)
    (change,) = diff_definitions(one, two)
    assert change.line() == "model: 'm1' -> 'm2'"


def test_the_version_is_declared_or_the_tools_version(monkeypatch: pytest.MonkeyPatch) -> None:
    """Engine(version=) pins turns to it, else to each agent's tools version; the engine
    reads no TURNSTILE_APP_VERSION of its own, the settings hand it over."""
    monkeypatch.setenv("TURNSTILE_APP_VERSION", "from-env")
    assert _engine(InMemorySessionStore(), [], version="v7").agents["bank"].version == "v7"
    agent = _engine(InMemorySessionStore(), []).agents["bank"]
    assert agent.version == tools_version_of(agent.definition)
    assert agent.version.startswith("tools-")
    handed = read_settings().engine_options()["version"]
    assert _engine(InMemorySessionStore(), [], version=handed).agents["bank"].version == "from-env"


# -- resuming across versions -----------------------------------------------------------


async def _paused_under_v1(store: InMemorySessionStore) -> tuple[str, str]:
    """A session paused at v1's ``approve`` interrupt: (session id, snapshot id)."""
    v1 = _engine(store, [ask(("approve", "a1", {"to": "savings"}))], version="v1")
    res = await v1.agents["bank"].chat().send("Move 5 to savings")
    assert res.finish_reason is FinishReason.INTERRUPTED
    turn = await store.get_turn(str(res.snapshot_id))
    assert turn is not None and turn.app_version == "v1"
    assert turn.definition_fingerprint == v1.agents["bank"].fingerprint
    return res.session_id, str(res.snapshot_id)


async def test_a_resume_across_a_definition_change_is_refused_with_the_diff() -> None:
    """v2 renamed the interrupt and rewrote the prompt: resuming v1's paused turn there is
    FAILED_PRECONDITION naming both changes, and nothing is written."""
    store = InMemorySessionStore()
    session_id, paused = await _paused_under_v1(store)
    v2 = _engine(store, [], version="v2", interrupt="confirm", system="New rules.")
    chat = v2.agents["bank"].chat(snapshot_id=paused)
    with pytest.raises(DefinitionChangedError) as refused:
        await chat.resume(respond=[_respond("approve", "a1")])
    assert isinstance(refused.value, FailedPreconditionError)
    assert refused.value.status == "FAILED_PRECONDITION"
    message = refused.value.message
    assert "'v1'" in message and "'v2'" in message
    assert "system changed" in message and "tools.approve removed" in message
    assert "tools.confirm added" in message
    changed = {c["what"] for c in refused.value.details["changes"]}
    assert changed == {"system", "tools.approve", "tools.confirm"}
    latest = await store.latest_turn(session_id)
    assert latest is not None and latest.id == paused


async def test_the_same_definition_under_a_new_version_inherits_the_paused_version() -> None:
    """Only the version label changed: the resume runs, pinned to the paused turn's v1."""
    store = InMemorySessionStore()
    _, paused = await _paused_under_v1(store)
    v2 = _engine(store, [say("Moved.")], version="v2")
    res = (
        await v2.agents["bank"].chat(snapshot_id=paused).resume(respond=[_respond("approve", "a1")])
    )
    assert res.text == "Moved."
    turn = await store.get_turn(str(res.snapshot_id))
    assert turn is not None and turn.app_version == "v1"


async def test_a_registered_migration_moves_the_paused_turn_onto_the_new_definition() -> None:
    """v2 registers a migration from v1 renaming the paused call and its answer: the resume
    runs under v2, records v2 and a note naming the move, and the model sees the new name."""
    store = InMemorySessionStore()
    _, paused = await _paused_under_v1(store)
    model_answers = [say("Moved under the new rules.")]
    v2 = _engine(store, model_answers, version="v2", interrupt="confirm", system="New rules.")
    seen: list[PausedTurn] = []

    @v2.migrate(from_version="v1")
    def rename_approval(state: PausedTurn) -> PausedTurn:
        seen.append(state)
        last = state.messages[-1]
        for part in last.content:
            if part.tool_request is not None and part.tool_request.name == "approve":
                part.tool_request.name = "confirm"
        for part in state.respond:
            if part.tool_response is not None:
                part.tool_response.name = "confirm"
        return state

    res = (
        await v2.agents["bank"].chat(snapshot_id=paused).resume(respond=[_respond("approve", "a1")])
    )
    assert res.text == "Moved under the new rules."
    assert [(s.from_version, s.to_version) for s in seen] == [("v1", "v2")]
    turn = await store.get_turn(str(res.snapshot_id))
    assert turn is not None
    assert turn.app_version == "v2" and turn.input.migrated_from == "v1"
    assert turn.definition_fingerprint == v2.agents["bank"].fingerprint
    note = list_events(store, turn.id)[0].note
    assert note is not None and "migrated from version v1 to v2" in note
    asked = res.messages[1].content[0].tool_request
    assert asked is not None and asked.name == "confirm"
    model = v2.agents["bank"].model
    assert isinstance(model, ListModel)
    shown = model.requests[-1].messages
    asked_names = [p.tool_request.name for m in shown for p in m.content if p.tool_request]
    assert asked_names == ["confirm"]


async def test_a_migration_may_not_rewrite_the_history() -> None:
    """A migration that changes a message before the paused one is refused; nothing is
    written."""
    store = InMemorySessionStore()
    session_id, paused = await _paused_under_v1(store)
    v2 = _engine(store, [], version="v2", system="New rules.")

    @v2.migrate(from_version="v1")
    def rewrite(state: PausedTurn) -> PausedTurn:
        state.messages[0] = Message.user("something else")
        return state

    with pytest.raises(FailedPreconditionError, match="before the paused message"):
        await v2.agents["bank"].chat(snapshot_id=paused).resume(respond=[_respond("approve", "a1")])
    latest = await store.latest_turn(session_id)
    assert latest is not None and latest.id == paused


def _respond(name: str, ref: str) -> Part:
    return Part.of_response(name, ref, {"approved": True})
