"""The SessionStore contract on payloads: JSON values a careless encoding would change
come back exactly, and records a caller may mutate are copies.

Every test runs on each store of
:data:`~tests.integration.store_support.STORE_FACTORIES` (the ``store`` fixture).
"""

from __future__ import annotations

from typing import Any

from engine.conversation.parts import Message, Part
from engine.store import (
    InterruptAnswer,
    RoundRecord,
    SessionStore,
    ToolCallStatus,
    Transition,
    TurnError,
    TurnInput,
)
from tests.integration.store_support import (
    ABORTED,
    AGENT,
    FAILED,
    PENDING,
    asks,
    calls_by_ref,
    claim,
    model_says,
    new_turn,
    paused_turn,
    tool_call,
    turn_in,
    wire,
    wire_parts,
)

# -- copies ------------------------------------------------------------------------------


#: A payload whose every value a careless JSON path changes: integers beyond 64 bits (2**100
#: + 1 has no float form; 2**63 is one past the signed range), a float that is not an
#: integer, a string of digits, text beyond ASCII, nesting and null.
EXACT_PAYLOAD = {
    "big": 2**100 + 1,
    "negative": -(2**70) - 1,
    "edge": 2**63,
    "float": 0.1,
    "digits": "12345678901234567890123",
    "text": "Überweisung ✓ \u2028",
    "nested": [[{"none": None, "yes": True}]],
}


async def test_json_payloads_come_back_exactly(store: SessionStore) -> None:
    """A round's messages and journal rows come back exactly as written, through the reads a
    worker and a client make: big integers stay integers, floats floats, text text."""
    token = (await turn_in(store, PENDING)).lease_token
    request = Message(role="model", content=[Part.of_request("transferMoney", "r1", EXACT_PAYLOAD)])
    await store.save_round(
        "t1",
        lease_token=token,
        round=RoundRecord(round=1, messages=[request], committed=True),
        calls=[tool_call("t1", 1, "r1", output=EXACT_PAYLOAD)],
    )

    def exact(value: Any) -> bool:
        return value == EXACT_PAYLOAD and all(
            type(value[key]) is type(written) for key, written in EXACT_PAYLOAD.items()
        )

    conversation = await store.load_conversation("t1")
    request_part = conversation[-1].content[0].tool_request
    assert request_part is not None and exact(request_part.input)
    assert exact((await store.list_calls("t1"))[0].output)
    progress = await store.read_progress("t1")
    assert progress is not None
    assert exact(progress.journal[0].output)
    saved = progress.rounds[-1].messages[0].content[0].tool_request
    assert saved is not None and exact(saved.input)


async def test_returned_messages_and_rows_are_copies(store: SessionStore) -> None:
    """Mutating messages, rounds or journal rows a store returned does not change the store."""
    token = (await turn_in(store, PENDING)).lease_token
    await store.record_call(
        "t1", lease_token=token, call=tool_call("t1", 1, "r1", output={"ids": [1]})
    )
    conversation = wire(await store.load_conversation("t1"))

    loaded = await store.load_conversation("t1")
    loaded[0].content[0].text = "tampered"
    loaded[0].content.append(Part.of_text("extra"))
    loaded.append(model_says("extra"))
    rounds = await store.load_rounds("t1")
    rounds[0].messages[0].content[0].text = "tampered"
    rounds[0].committed = False
    rows = await store.list_calls("t1")
    rows[0].output["ids"].append(2)
    rows[0].status = ToolCallStatus.FAILED

    assert wire(await store.load_conversation("t1")) == conversation
    assert [r.committed for r in await store.load_rounds("t1")] == [True]
    assert [(c.status, c.output) for c in await store.list_calls("t1")] == [
        (ToolCallStatus.DONE, {"ids": [1]})
    ]


async def test_returned_turn_and_session_records_are_copies(store: SessionStore) -> None:
    """Assigning fields of a returned TurnRecord or SessionRecord does not change the store."""
    created = await store.create_turn(new_turn("t1", owner="alice"))
    created.status = FAILED
    created.attempts = 99
    claimed = await claim(store, "t1")
    claimed.lease_owner = "thief"
    claimed.lease_token = 42
    read = await store.get_turn("t1")
    assert read is not None
    read.status = ABORTED
    session = await store.get_session("s1")
    assert session is not None
    session.agent = "other"
    session.owner = "mallory"

    current = await store.get_turn("t1")
    assert current is not None
    assert (current.status, current.attempts, current.lease_owner, current.lease_token) == (
        PENDING,
        1,
        "w1",
        1,
    )
    again = await store.get_session("s1")
    assert again is not None and (again.agent, again.owner) == (AGENT, "alice")


async def test_nested_values_of_returned_records_are_copies(store: SessionStore) -> None:
    """Mutating the input or error inside a returned TurnRecord does not change the store."""
    created = await store.create_turn(new_turn("t1", messages=[Message.user("hi")]))
    assert created.input.message is not None
    created.input.message.content[0].text = "tampered"
    read = await store.get_turn("t1")
    assert read is not None
    read.input.respond.append(Part.of_text("injected"))
    token = (await claim(store, "t1")).lease_token
    error = TurnError(status="INTERNAL", message="boom", details={"trace": ["a"]})
    failed = await store.transition(
        "t1", Transition(expected={PENDING}, new=FAILED, lease_token=token, error=error)
    )
    assert failed.error is not None
    failed.error.details["trace"].append("tampered")
    error.message = "changed by the caller"

    current = await store.get_turn("t1")
    assert current is not None and current.input.message is not None
    assert current.input.message.to_wire() == Message.user("hi").to_wire()
    assert current.input.respond == []
    assert current.error == TurnError(status="INTERNAL", message="boom", details={"trace": ["a"]})


async def test_store_does_not_alias_the_new_turn_it_was_given(store: SessionStore) -> None:
    """Mutating the NewTurn after create_turn does not change the stored turn."""
    turn = new_turn("t1", messages=[Message.user("hi")])
    await store.create_turn(turn)

    assert turn.input.message is not None
    turn.input.message.content[0].text = "tampered"
    turn.initial_messages[0].content[0].text = "tampered"

    current = await store.get_turn("t1")
    assert current is not None and current.input.message is not None
    assert current.input.message.to_wire() == Message.user("hi").to_wire()
    assert wire(await store.load_conversation("t1")) == wire([Message.user("hi")])


# -- payload fidelity --------------------------------------------------------------------


NESTED = {
    "name": "Zoë Ångström — 日本語 🚀",
    "amounts": [0, -1, 2.5, 10**12],
    "flags": {"on": True, "off": False, "none": None},
    "empty": {"list": [], "dict": {}, "text": ""},
    "deep": [[{"k": ['"quoted"', "back\\slash", "new\nline", "tab\t"]}]],
}


async def test_tool_call_payloads_round_trip_exactly(store: SessionStore) -> None:
    """Journal payloads (None and falsy outputs, nested unicode JSON) read back exactly."""
    token = (await turn_in(store, PENDING)).lease_token
    outputs: dict[str, Any] = {
        "a-none": None,
        "b-false": False,
        "c-zero": 0,
        "d-empty-text": "",
        "e-empty-list": [],
        "f-nested": NESTED,
    }
    rows = [
        tool_call(
            "t1",
            1,
            ref,
            input=NESTED,
            output=output,
            interrupt={"question": "Überweisen?", "default": None},
            resumed={"approved": True, "note": None},
            error=TurnError(status="INTERNAL", message="ünïcode", details=NESTED),
        )
        for ref, output in outputs.items()
    ]
    await store.save_round(
        "t1",
        lease_token=token,
        round=RoundRecord(round=1, messages=[asks(*outputs)], committed=False),
        calls=rows[:3],
    )
    for row in rows[3:]:
        await store.record_call("t1", lease_token=token, call=row)

    loaded = await store.list_calls("t1")

    assert [c.model_copy(update={"created_at": None}) for c in loaded] == rows
    assert [c.output for c in loaded] == list(outputs.values())
    assert loaded[0].output is None and loaded[1].output is False


async def test_answers_round_trip_exactly(store: SessionStore) -> None:
    """An interrupt answer holding None and nested unicode JSON reads back exactly."""
    await paused_turn(store, "p1")
    decision = {"restart": {"approved": None, "payload": NESTED}}

    await store.create_turn(
        new_turn("t2", kind="resume", parent_id="p1"),
        answers=[InterruptAnswer(turn_id="p1", round=1, ref="r1", answer=decision)],
    )

    assert (await calls_by_ref(store, "p1"))["r1"].answer == decision


async def test_message_payloads_round_trip_exactly(store: SessionStore) -> None:
    """Messages keep every key that was set, including explicit nulls such as pendingOutput."""
    paused_request = Part.of_request(
        "transferMoney",
        "r1",
        NESTED,
        {"interrupt": {"why": "größer als 100 €"}, "pendingOutput": None},
    )
    model = Message(
        role="model",
        content=[Part.of_text("Überweisung 🚀"), paused_request],
        metadata={"pendingOutput": None, "nested": NESTED},
    )
    tool = Message(role="tool", content=[Part.of_response("transferMoney", "r0", None)])
    user = Message(role="user", content=[Part.of_text("日本語")], metadata={"pendingOutput": None})
    await store.create_turn(new_turn("t1", messages=[user]))
    token = (await claim(store, "t1")).lease_token
    await store.save_round(
        "t1", lease_token=token, round=RoundRecord(round=1, messages=[model, tool], committed=True)
    )

    loaded = await store.load_conversation("t1")

    assert wire(loaded) == wire([user, model, tool])
    assert wire((await store.load_rounds("t1"))[1].messages) == wire([model, tool])
    assert loaded[0].metadata == {"pendingOutput": None}
    assert loaded[1].metadata is not None and "pendingOutput" in loaded[1].metadata
    part_metadata = loaded[1].content[1].metadata
    assert part_metadata is not None and "pendingOutput" in part_metadata
    assert part_metadata["pendingOutput"] is None
    response = loaded[2].content[0].tool_response
    assert response is not None and "output" in response.to_wire()
    turn = await store.get_turn("t1")
    assert turn is not None and turn.input.message is not None
    assert turn.input.message.to_wire() == user.to_wire()


async def test_turn_input_round_trips_exactly(store: SessionStore) -> None:
    """A resume input's respond and restart parts, with metadata and null outputs, read back."""
    respond = [Part.of_response("transferMoney", "r1", None, {"note": "ok ✓"})]
    restart = [Part.of_request("transferMoney", "r2", NESTED, {"resumed": {"approved": None}})]
    turn = new_turn("t1", kind="resume", messages=[])
    turn.input = TurnInput(kind="resume", respond=respond, restart=restart)

    await store.create_turn(turn)

    stored = await store.get_turn("t1")
    assert stored is not None
    assert (stored.input.kind, stored.input.message) == ("resume", None)
    assert wire_parts(stored.input.respond) == wire_parts(respond)
    assert wire_parts(stored.input.restart) == wire_parts(restart)
