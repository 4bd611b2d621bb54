"""Resume validation: every bad resume is a typed error that writes nothing."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from engine import AgentError, Part, TurnStatus
from engine.chat import Chat
from engine.errors import (
    ApprovalNotPendingError,
    FailedPreconditionError,
    ResumeValidationError,
    SnapshotNotResumableError,
)
from examples.banking import ApprovalDecision, BankingApp, build
from tests.conftest import TEST_STATE_KEYS
from tests.support import request_in, response_in


async def paused_pair(app: BankingApp) -> tuple[Chat, Any]:
    """A chat paused at two approvals (approval-1, approval-2)."""
    chat = app.banking_agent.chat()
    res = await chat.send("Transfer $50 to Alice and $75 to Bob")
    return chat, res


async def turn_count(app: BankingApp, session_id: str) -> int:
    """How many turns the session has (a rejected resume must not add one)."""
    store = app.banking_agent.store
    assert store is not None
    latest = await store.latest_turn(session_id)
    count = 0
    while latest is not None:
        count += 1
        latest = await store.get_turn(latest.parent_id) if latest.parent_id else None
    return count


async def assert_still_resumable(app: BankingApp, chat: Chat, res: Any) -> None:
    """The paused snapshot is untouched: a correct resume still succeeds."""
    res2 = await chat.resume(respond=[i.respond({"approved": True}) for i in res.interrupts])
    assert res2.text.startswith("Done.")


#: Each invalid resume: how to build it from the paused response, its error and text.
CASES: dict[str, tuple[Callable[[Any], dict[str, Any]], type[AgentError], str]] = {
    "unknown ref": (
        lambda res: {
            "respond": [Part.of_response("userApproval", "approval-9", {"approved": True})]
        },
        ResumeValidationError,
        "resume.respond references tool 'userApproval' (ref: approval-9) which was not found "
        "in session history.",
    ),
    "unknown name": (
        lambda res: {"respond": [Part.of_response("nope", "approval-1", {"approved": True})]},
        ResumeValidationError,
        "resume.respond references tool 'nope' (ref: approval-1) which was not found",
    ),
    "restart with modified input": (
        lambda res: {
            "restart": [
                Part.of_request(
                    "userApproval",
                    "approval-1",
                    {"action": "transferMoney", "details": "Transfer $5000"},
                )
            ],
            "respond": [res.interrupts[1].respond({"approved": True})],
        },
        ResumeValidationError,
        "resume.restart for tool 'userApproval' (ref: approval-1) has modified inputs that do "
        "not match the original tool request in session history.",
    ),
    "output violating the schema": (
        lambda res: {"respond": [i.respond({"approved": "yes please"}) for i in res.interrupts]},
        ResumeValidationError,
        "resume.respond for tool 'userApproval' (ref: approval-1) has an output that does not "
        "match the tool's output schema",
    ),
    "output valid only by coercion": (
        # "yes" would pass pydantic's lax mode as True, but the model sees the answer verbatim.
        lambda res: {"respond": [i.respond({"approved": "yes"}) for i in res.interrupts]},
        ResumeValidationError,
        "resume.respond for tool 'userApproval' (ref: approval-1) has an output that does not "
        "match the tool's output schema",
    ),
    "one interrupt left unanswered": (
        lambda res: {"respond": [res.interrupts[0].respond({"approved": True})]},
        ResumeValidationError,
        "Unresolved tool request 'userApproval#approval-2' was not handled by the 'resume' "
        "argument.",
    ),
    "answered twice": (
        lambda res: {
            "respond": [i.respond({"approved": True}) for i in res.interrupts],
            "restart": [res.interrupts[0].restart()],
        },
        ResumeValidationError,
        "more than once",
    ),
}


@pytest.mark.behaviour
@pytest.mark.parametrize("case", sorted(CASES))
async def test_invalid_resume_is_rejected_and_writes_nothing(app: BankingApp, case: str) -> None:
    """Each invalid resume raises INVALID_ARGUMENT with Genkit's text and changes nothing."""
    build_resume, error_type, text = CASES[case]
    chat, res = await paused_pair(app)
    before = await turn_count(app, res.session_id)
    with pytest.raises(error_type) as caught:
        await chat.send(resume=build_resume(res))
    assert caught.value.status == "INVALID_ARGUMENT"
    assert text in caught.value.message
    assert await turn_count(app, res.session_id) == before
    assert chat.snapshot_id == res.snapshot_id
    assert app.transfers == []
    await assert_still_resumable(app, chat, res)


@pytest.mark.behaviour
async def test_resume_with_a_new_message_is_rejected(app: BankingApp) -> None:
    """A resume must not carry a new user message (FAILED_PRECONDITION, Genkit's text)."""
    chat, res = await paused_pair(app)
    with pytest.raises(FailedPreconditionError) as caught:
        await chat.send(
            "and also this",
            resume={"respond": [i.respond({"approved": True}) for i in res.interrupts]},
        )
    assert caught.value.message.startswith("Cannot 'resume' generation unless the previous message")
    await assert_still_resumable(app, chat, res)


@pytest.mark.behaviour
async def test_resume_of_a_snapshot_that_is_not_paused_is_rejected(app: BankingApp) -> None:
    """Resuming a snapshot without pending interrupts is FAILED_PRECONDITION."""
    chat = app.banking_agent.chat()
    await chat.send("hello")
    with pytest.raises(FailedPreconditionError):
        await chat.resume(
            respond=[Part.of_response("userApproval", "approval-1", {"approved": True})]
        )


@pytest.mark.behaviour
async def test_new_message_while_paused_is_rejected(app: BankingApp) -> None:
    """A paused snapshot only accepts a resume: a new message would leave a dangling request."""
    chat, res = await paused_pair(app)
    with pytest.raises(SnapshotNotResumableError) as caught:
        await chat.send("never mind")
    assert "userApproval#approval-1" in caught.value.message
    with pytest.raises(SnapshotNotResumableError):
        await chat.send()
    await assert_still_resumable(app, chat, res)


@pytest.mark.behaviour
async def test_an_interrupt_is_answered_only_once(app: BankingApp) -> None:
    """Resuming the same paused snapshot a second time is refused: one approval, one transfer."""
    chat, res = await paused_pair(app)
    await chat.resume(respond=[i.respond({"approved": True}) for i in res.interrupts])
    again = app.banking_agent.chat(snapshot_id=res.snapshot_id)
    with pytest.raises(ApprovalNotPendingError) as caught:
        await again.resume(respond=[i.respond({"approved": True}) for i in res.interrupts])
    assert caught.value.status == "ABORTED"
    assert len(app.transfers) == 2


def _satisfies_schema(output: Any) -> bool:
    try:
        # Strictly, as JSON: an answer is passed to the model verbatim, so "yes" is not True.
        ApprovalDecision.model_validate_json(json.dumps(output), strict=True)
    except ValidationError:
        return False
    return True


def _jsonish() -> st.SearchStrategy[Any]:
    return st.recursive(
        st.none() | st.booleans() | st.integers(-5, 5) | st.text(max_size=5),
        lambda inner: (
            st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
        ),
        max_leaves=6,
    )


entry = st.fixed_dictionaries(
    {
        "kind": st.sampled_from(["respond", "restart"]),
        "name": st.sampled_from(["userApproval", "transferMoney", "other"]),
        "ref": st.sampled_from(["approval-1", "approval-2", "approval-3", None]),
        "payload": st.one_of(
            st.just({"approved": True}),
            st.just({"approved": False, "feedback": "no"}),
            st.just({"approved": 1}),
            st.just({"approved": True, "feedback": None}),
            _jsonish(),
            st.just("original"),
        ),
    }
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(entries=st.lists(entry, max_size=4))
async def test_random_resumes_are_either_valid_or_rejected_cleanly(
    entries: list[dict[str, Any]],
) -> None:
    """Any resume is either exactly valid and runs, or is a typed error that leaves no trace."""
    app = build(state_keys=TEST_STATE_KEYS)
    chat, res = await paused_pair(app)
    originals = {i.ref: i for i in res.interrupts}
    respond: list[Part] = []
    restart: list[Part] = []
    for e in entries:
        if e["kind"] == "respond":
            respond.append(Part.of_response(e["name"], e["ref"], e["payload"]))
        else:
            original = originals.get(e["ref"])
            value = original.raw_input if e["payload"] == "original" and original else e["payload"]
            restart.append(Part.of_request(e["name"], e["ref"], value))
    # Valid: each paused call answered once, by a respond within the output schema or by a
    # restart with its original input (a pure interrupt restarted just asks again).
    answered = [str(p.tool_response.ref) for p in respond if p.tool_response] + [
        str(p.tool_request.ref) for p in restart if p.tool_request
    ]
    valid = (
        sorted(answered) == ["approval-1", "approval-2"]
        and all(response_in(p).name == "userApproval" for p in respond)
        and all(_satisfies_schema(response_in(p).output) for p in respond)
        and all(
            request_in(p).name == "userApproval"
            and request_in(p).input == originals[str(request_in(p).ref)].raw_input
            for p in restart
        )
    )
    before = await turn_count(app, res.session_id)
    try:
        after = await chat.send(resume={"respond": respond, "restart": restart})
    except AgentError as error:
        assert not valid, f"a valid resume was rejected: {error}"
        assert error.status in {"INVALID_ARGUMENT", "FAILED_PRECONDITION"}
        assert await turn_count(app, res.session_id) == before
        assert app.transfers == []
        snapshot = await app.banking_agent.get_snapshot(snapshot_id=res.snapshot_id)
        assert snapshot is not None and snapshot.status is TurnStatus.COMPLETED
        await assert_still_resumable(app, chat, res)
    else:
        assert valid, "an invalid resume was accepted"
        assert after.status is TurnStatus.COMPLETED
