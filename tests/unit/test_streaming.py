"""Streaming: chunks carry model deltas as produced; the final response matches send()."""

from __future__ import annotations

from typing import Any

import pytest

from engine import AgentResponse
from examples.banking import BankingApp, build
from tests.conftest import TEST_STATE_KEYS
from tests.support import request_in, response_in


def transcript(res: AgentResponse) -> list[dict[str, Any]]:
    """The conversation as wire JSON (ids aside, two equal runs produce equal transcripts)."""
    return [m.to_wire() for m in res.messages]


@pytest.mark.behaviour
async def test_send_stream_yields_word_chunks_then_the_response(app: BankingApp) -> None:
    """Text arrives word by word, and the final response holds the whole text."""
    turn = app.banking_agent.chat().send_stream("hello wide world")
    chunks = [chunk async for chunk in turn.stream]
    assert [c.text for c in chunks] == ["Echo: ", "hello ", "wide ", "world"]
    assert {(c.role, c.index) for c in chunks} == {("model", 0)}
    res = await turn.response
    assert res.text == "".join(c.text for c in chunks)


@pytest.mark.behaviour
async def test_tool_request_streams_as_one_chunk(app: BankingApp) -> None:
    """A tool-requesting answer streams as one chunk holding its toolRequest parts."""
    turn = app.banking_agent.chat().send_stream("Transfer $50 to Alice and $75 to Bob")
    chunks = [chunk async for chunk in turn.stream]
    assert len(chunks) == 1
    assert [request_in(p).ref for p in chunks[0].tool_requests] == ["approval-1", "approval-2"]
    res = await turn
    assert len(res.interrupts) == 2


async def test_resume_stream_starts_with_the_tool_responses() -> None:
    """A resumed turn streams its answers first (role tool, index 0), then the next rounds."""
    app = build(state_keys=TEST_STATE_KEYS)
    chat = app.banking_agent.chat()
    res = await chat.send("Transfer $500 to my savings account.")
    turn = chat.resume_stream(respond=[res.interrupts[0].respond({"approved": True})])
    chunks = [chunk async for chunk in turn.stream]
    assert [(c.role, c.index) for c in chunks] == [
        ("tool", 0),
        ("model", 1),
        ("tool", 2),
        ("model", 3),
        ("model", 3),
        ("model", 3),
    ]
    assert response_in(chunks[0].content[0]).output == {"approved": True}
    assert request_in(chunks[1].tool_requests[0]).name == "transferMoney"
    assert "".join(c.text for c in chunks[3:]) == "Done. Transaction txn-500-my-savings-account."
    final = await turn.response
    assert final.text == "Done. Transaction txn-500-my-savings-account."


async def test_streaming_and_plain_calls_give_the_same_response() -> None:
    """The streamed flow and the plain flow end with identical conversations."""
    plain_app = build(state_keys=TEST_STATE_KEYS)
    stream_app = build(state_keys=TEST_STATE_KEYS)
    plain = plain_app.banking_agent.chat()
    streamed = stream_app.banking_agent.chat()

    a = await plain.send("Transfer $50 to Alice and $75 to Bob")
    turn = streamed.send_stream("Transfer $50 to Alice and $75 to Bob")
    _ = [c async for c in turn.stream]
    b = await turn.response
    assert transcript(a) == transcript(b)
    assert (a.finish_reason, [i.ref for i in a.interrupts]) == (
        b.finish_reason,
        [i.ref for i in b.interrupts],
    )

    a = await plain.resume(respond=[i.respond({"approved": True}) for i in a.interrupts])
    turn = streamed.resume_stream(respond=[i.respond({"approved": True}) for i in b.interrupts])
    _ = [c async for c in turn.stream]
    b = await turn.response
    assert transcript(a) == transcript(b)
    assert a.text == b.text == "Done. Transaction txn-50-alice. Done. Transaction txn-75-bob."


@pytest.mark.behaviour
async def test_stream_of_a_stateless_agent_carries_state_in_the_response(app: BankingApp) -> None:
    """Client-managed agents stream too; the final response carries the signed state."""
    turn = app.banking_agent_stateless.chat().send_stream("hi there")
    chunks = [c.text async for c in turn.stream]
    res = await turn.response
    assert chunks == ["Echo: ", "hi ", "there"]
    assert (
        res.state is not None
        and res.state["messages"][-1]["content"][0]["text"] == "Echo: hi there"
    )
