"""The scripted model follows docs/scripted-model.md rule by rule (first match wins)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from engine.conversation.parts import Message, Part
from engine.errors import TransientError
from engine.model import Model, ModelRequest, ModelResponse, TransientModelError
from engine.scripted import DEFAULT_SLOW_CHUNK_DELAY, ScriptedModel, slug, transaction_id

SYSTEM = Message(
    role="system",
    content=[
        Part.of_text(
            "You are a banking assistant. ALWAYS use the userApproval interrupt to "
            "confirm before executing transferMoney."
        )
    ],
)


class Recorder:
    """A chunk sink that keeps every delta it receives."""

    def __init__(self) -> None:
        self.chunks: list[list[Part]] = []

    async def __call__(self, parts: list[Part]) -> None:
        self.chunks.append(parts)

    def texts(self) -> list[str | None]:
        """The text of each chunk (every text chunk holds exactly one part)."""
        assert all(len(chunk) == 1 for chunk in self.chunks)
        return [chunk[0].text for chunk in self.chunks]

    def wire(self) -> list[list[dict[str, Any]]]:
        """Each chunk as wire JSON."""
        return [[part.to_wire() for part in chunk] for chunk in self.chunks]


async def run(
    *messages: Message, model: ScriptedModel | None = None
) -> tuple[ModelResponse, Recorder]:
    """Call ``model`` (a fresh one by default) with the system message plus ``messages``."""
    recorder = Recorder()
    response = await (model or ScriptedModel()).generate(
        ModelRequest(messages=[SYSTEM, *messages]), recorder
    )
    return response, recorder


def wire(response: ModelResponse) -> list[dict[str, Any]]:
    """The final message's parts as wire JSON."""
    return [part.to_wire() for part in response.message.content]


def tool(*parts: Part) -> Message:
    """A tool message holding ``parts``."""
    return Message(role="tool", content=list(parts))


def model_msg(*parts: Part) -> Message:
    """A model message holding ``parts``."""
    return Message(role="model", content=list(parts))


def approval_req(ref: str, details: str) -> dict[str, Any]:
    """The wire form of a userApproval request."""
    return {
        "toolRequest": {
            "name": "userApproval",
            "ref": ref,
            "input": {"action": "transferMoney", "details": details},
        }
    }


def transfer_req(ref: str, amount: int, to_account: str) -> dict[str, Any]:
    """The wire form of a transferMoney request."""
    return {
        "toolRequest": {
            "name": "transferMoney",
            "ref": ref,
            "input": {"amount": amount, "toAccount": to_account},
        }
    }


def approval_resp(ref: str | None, output: Any) -> Part:
    """A userApproval tool response."""
    return Part.of_response("userApproval", ref, output)


def transfer_resp(ref: str, txn: str) -> Part:
    """A transferMoney tool response."""
    return Part.of_response("transferMoney", ref, {"success": True, "transactionId": txn})


def assert_text(response: ModelResponse, text: str) -> None:
    """``response`` is a finished model message holding exactly one text part ``text``."""
    assert response.finish_reason == "stop"
    assert response.message.role == "model"
    assert wire(response) == [{"text": text}]


def assert_tool_answer(
    response: ModelResponse, recorder: Recorder, expected: list[dict[str, Any]]
) -> None:
    """``response`` holds ``expected`` requests, streamed as exactly one chunk of the same."""
    assert response.finish_reason == "stop"
    assert response.message.role == "model"
    assert wire(response) == expected
    assert recorder.wire() == [expected]


def transfer_history(user_text: str, *requests: Part) -> list[Message]:
    """A user turn asking for transfers followed by the model's approval requests."""
    return [Message.user(user_text), model_msg(*requests)]


# --- identity ---------------------------------------------------------------------------------


def test_name_and_protocol() -> None:
    """The model is named "scripted" and satisfies the Model protocol."""
    model = ScriptedModel()
    assert model.name == "scripted"
    assert isinstance(model, Model)


# --- (f) echo and chunking ----------------------------------------------------------------------


async def test_echo_streams_word_chunks() -> None:
    """Rule (f) answers "Echo: " + text, streamed as chunks split after every space."""
    response, recorder = await run(Message.user("hello world"))
    assert_text(response, "Echo: hello world")
    assert recorder.texts() == ["Echo: ", "hello ", "world"]


async def test_echo_chunks_keep_repeated_and_trailing_spaces() -> None:
    """Each space ends a chunk, so double spaces give a lone-space chunk and no empty chunk."""
    response, recorder = await run(Message.user("a  b "))
    assert_text(response, "Echo: a  b ")
    assert recorder.texts() == ["Echo: ", "a ", " ", "b "]
    assert "".join(t or "" for t in recorder.texts()) == "Echo: a  b "


async def test_echo_without_sink() -> None:
    """Without a chunk sink the model still returns the complete answer."""
    response = await ScriptedModel().generate(ModelRequest(messages=[Message.user("hi there")]))
    assert_text(response, "Echo: hi there")


async def test_last_user_text_concatenates_text_parts() -> None:
    """The last user text is the concatenation of the text parts of the latest user message."""
    user = Message(role="user", content=[Part.of_text("hello "), Part.of_text("again")])
    response, _ = await run(Message.user("older"), model_msg(Part.of_text("x")), user)
    assert_text(response, "Echo: hello again")


async def test_bare_retry_uses_latest_user_message() -> None:
    """When the last message is a model message (bare retry) the latest user text is used."""
    response, _ = await run(Message.user("first"), Message.user("second"), model_msg())
    assert_text(response, "Echo: second")


async def test_no_user_message_echoes_empty_text() -> None:
    """With no user message at all the last user text is empty and only "Echo: " is sent."""
    response, recorder = await run()
    assert_text(response, "Echo: ")
    assert recorder.texts() == ["Echo: "]


async def test_system_message_text_is_ignored() -> None:
    """Rules apply to the user's text, never to the system message."""
    system = Message(role="system", content=[Part.of_text("loop fail transfer $5 to x")])
    response = await ScriptedModel().generate(ModelRequest(messages=[system, Message.user("hi")]))
    assert_text(response, "Echo: hi")


# --- (a) one transfer --------------------------------------------------------------------------


async def test_single_transfer_requests_one_approval() -> None:
    """Rule (a) requests userApproval ref approval-1 with "Transfer $N to X" details."""
    response, recorder = await run(Message.user("Transfer $500 to my savings account."))
    expected = [approval_req("approval-1", "Transfer $500 to my savings account")]
    assert_tool_answer(response, recorder, expected)


async def test_single_transfer_is_case_insensitive_and_dollar_optional() -> None:
    """Rule (a) matches case-insensitively, anywhere in the text, with or without "$"."""
    response, recorder = await run(Message.user("please TRANSFER 007 TO Bob"))
    assert_tool_answer(response, recorder, [approval_req("approval-1", "Transfer $7 to Bob")])


async def test_account_names_are_cleaned() -> None:
    """Account names are trimmed and lose every trailing ".", "!" or "?"."""
    response, _ = await run(Message.user("transfer $5 to   Alice Smith .!?!  "))
    assert wire(response) == [approval_req("approval-1", "Transfer $5 to Alice Smith")]


async def test_account_stops_at_line_break() -> None:
    """As in JavaScript, "." in the patterns does not cross a line break."""
    response, _ = await run(Message.user("transfer $5 to Bob!\r\nthanks"))
    assert wire(response) == [approval_req("approval-1", "Transfer $5 to Bob")]


async def test_non_ascii_digits_do_not_count() -> None:
    """As in JavaScript, \\d only matches ASCII digits, so other digits fall through to echo."""
    response, _ = await run(Message.user("transfer $\u0665 to Bob"))
    assert_text(response, "Echo: transfer $\u0665 to Bob")


# --- (d) two transfers -------------------------------------------------------------------------


async def test_two_transfers_request_two_approvals() -> None:
    """Rule (d) requests two approvals, refs approval-1 and approval-2, in one chunk."""
    response, recorder = await run(Message.user("Transfer $100 to Alice and $200 to Bob."))
    expected = [
        approval_req("approval-1", "Transfer $100 to Alice"),
        approval_req("approval-2", "Transfer $200 to Bob"),
    ]
    assert_tool_answer(response, recorder, expected)


async def test_two_transfers_split_at_first_and() -> None:
    """Rule (d) ends the first account at the first " and $N to " (lazy match)."""
    response, _ = await run(Message.user("transfer 1 to a and 2 to b and 3 to c"))
    assert wire(response) == [
        approval_req("approval-1", "Transfer $1 to a"),
        approval_req("approval-2", "Transfer $2 to b and 3 to c"),
    ]


# --- (h) parallel ------------------------------------------------------------------------------


async def test_parallel_requests_transfer_and_approval_together() -> None:
    """Rule (h) requests transferMoney transfer-1 and userApproval approval-1 in one chunk."""
    response, recorder = await run(Message.user("Parallel transfer $50 to checking!"))
    expected = [
        transfer_req("transfer-1", 50, "checking"),
        approval_req("approval-1", "Transfer $50 to checking"),
    ]
    assert_tool_answer(response, recorder, expected)


# --- (i) loop ----------------------------------------------------------------------------------


async def test_loop_requests_transfer() -> None:
    """Rule (i) on a user message requests transferMoney {1, "loop"} with ref transfer-1."""
    response, recorder = await run(Message.user("Let's LOOP forever"))
    assert_tool_answer(response, recorder, [transfer_req("transfer-1", 1, "loop")])


async def test_loop_after_transfer_response_requests_again() -> None:
    """Rule (i) after a transferMoney response requests the same transfer again."""
    response, recorder = await run(
        Message.user("loop"),
        model_msg(Part.of_request("transferMoney", "transfer-1", {"amount": 1})),
        tool(transfer_resp("transfer-1", "txn-1-loop")),
    )
    assert_tool_answer(response, recorder, [transfer_req("transfer-1", 1, "loop")])


async def test_loop_needs_transfer_response_in_tool_branch() -> None:
    """With only a userApproval response, a "loop" user text does not trigger rule (i)."""
    response, _ = await run(
        Message.user("loop"), tool(approval_resp("approval-1", {"approved": False}))
    )
    assert_text(response, "Transfer cancelled: denied")


# --- (c) confirmation --------------------------------------------------------------------------


async def test_confirmation_text_per_transfer_response() -> None:
    """Rule (c) answers "Done. Transaction <id>." per transferMoney response, space-joined."""
    response, recorder = await run(
        Message.user("Transfer $1 to a and $2 to b"),
        tool(transfer_resp("transfer-1", "txn-1-a"), transfer_resp("transfer-2", "txn-2-b")),
    )
    text = "Done. Transaction txn-1-a. Done. Transaction txn-2-b."
    assert_text(response, text)
    assert recorder.texts() == [
        "Done. ",
        "Transaction ",
        "txn-1-a. ",
        "Done. ",
        "Transaction ",
        "txn-2-b.",
    ]


async def test_confirmation_wins_over_approval_answers() -> None:
    """Rule (c) is checked before rule (b) when both kinds of response are present."""
    response, _ = await run(
        Message.user("parallel transfer $5 to x"),
        tool(
            transfer_resp("transfer-1", "txn-5-x"), approval_resp("approval-1", {"approved": True})
        ),
    )
    assert_text(response, "Done. Transaction txn-5-x.")


# --- (b) approval answers ----------------------------------------------------------------------


async def test_approved_transfer_is_requested() -> None:
    """Rule (b) turns an approved approval-1 into transferMoney transfer-1 with its transfer."""
    history = transfer_history(
        "Transfer $500 to my savings account.",
        Part.of_request("userApproval", "approval-1", {}),
    )
    response, recorder = await run(*history, tool(approval_resp("approval-1", {"approved": True})))
    assert_tool_answer(response, recorder, [transfer_req("transfer-1", 500, "my savings account")])


@pytest.mark.parametrize(
    ("approved", "expected"),
    [
        (
            (True, True),
            [transfer_req("transfer-1", 100, "Alice"), transfer_req("transfer-2", 200, "Bob")],
        ),
        ((False, True), [transfer_req("transfer-2", 200, "Bob")]),
        ((True, False), [transfer_req("transfer-1", 100, "Alice")]),
    ],
)
async def test_only_approved_transfers_are_requested(
    approved: tuple[bool, bool], expected: list[dict[str, Any]]
) -> None:
    """Rule (b) requests exactly the approved transfers, all in one chunk."""
    response, recorder = await run(
        Message.user("Transfer $100 to Alice and $200 to Bob"),
        tool(
            approval_resp("approval-1", {"approved": approved[0]}),
            approval_resp("approval-2", {"approved": approved[1]}),
        ),
    )
    assert_tool_answer(response, recorder, expected)


async def test_k_comes_from_ref_prefix() -> None:
    """Rule (b) reads k from the ref prefix approval-k, even with a "~n" uniqueness suffix."""
    response, _ = await run(
        Message.user("Transfer $100 to Alice and $200 to Bob"),
        tool(approval_resp("approval-2~2", {"approved": True})),
    )
    assert wire(response) == [transfer_req("transfer-2", 200, "Bob")]


@pytest.mark.parametrize("ref", [None, "custom-ref"])
async def test_k_falls_back_to_position(ref: str | None) -> None:
    """Without a usable approval-k ref, k is the 1-based position among userApproval responses."""
    response, _ = await run(
        Message.user("Transfer $100 to Alice and $200 to Bob"),
        tool(
            approval_resp("approval-1", {"approved": False}),
            Part.of_response("otherTool", "x", {}),
            approval_resp(ref, {"approved": True}),
        ),
    )
    assert wire(response) == [transfer_req("transfer-2", 200, "Bob")]


async def test_transfers_come_from_latest_requesting_user_message() -> None:
    """Rule (b) parses the most recent user message that requests a transfer, skipping others."""
    response, _ = await run(
        Message.user("Transfer $1 to old"),
        Message.user("Transfer $9 to new."),
        Message.user("yes please"),
        tool(approval_resp("approval-1", {"approved": True})),
    )
    assert wire(response) == [transfer_req("transfer-1", 9, "new")]


async def test_parallel_transfer_is_used_for_approvals() -> None:
    """Rule (b) also understands a parallel request (rule h) as the transfer list."""
    response, _ = await run(
        Message.user("parallel transfer $5 to x"),
        tool(approval_resp("approval-1", {"approved": True})),
    )
    assert wire(response) == [transfer_req("transfer-1", 5, "x")]


async def test_unknown_transfer_is_skipped() -> None:
    """Rule (b) skips an approved k with no matching transfer and keeps the others."""
    response, _ = await run(
        Message.user("Transfer $100 to Alice"),
        tool(
            approval_resp("approval-3", {"approved": True}),
            approval_resp("approval-1", {"approved": True}),
        ),
    )
    assert wire(response) == [transfer_req("transfer-1", 100, "Alice")]


async def test_approved_without_any_transfer_is_unhandled() -> None:
    """If every approved k lacks a transfer, the answer is "Unhandled tool response."."""
    response, _ = await run(
        Message.user("nothing to see"), tool(approval_resp("approval-1", {"approved": True}))
    )
    assert_text(response, "Unhandled tool response.")


async def test_approved_must_be_exactly_true() -> None:
    """Only output.approved === true counts as approved."""
    response, _ = await run(
        Message.user("Transfer $100 to Alice"),
        tool(approval_resp("approval-1", {"approved": "true", "feedback": "nope"})),
    )
    assert_text(response, "Transfer cancelled: nope")


async def test_cancellation_uses_first_feedback() -> None:
    """With nothing approved the text is "Transfer cancelled: " + the first response's feedback."""
    response, recorder = await run(
        Message.user("Transfer $100 to Alice and $200 to Bob"),
        tool(
            approval_resp("approval-1", {"approved": False, "feedback": "Too much money"}),
            approval_resp("approval-2", {"approved": False, "feedback": "second"}),
        ),
    )
    assert_text(response, "Transfer cancelled: Too much money")
    assert recorder.texts() == ["Transfer ", "cancelled: ", "Too ", "much ", "money"]


@pytest.mark.parametrize(
    "output", [{"approved": False}, {"approved": False, "feedback": ""}, {}, None]
)
async def test_cancellation_feedback_defaults_to_denied(output: Any) -> None:
    """Missing, empty or unreadable feedback reads "denied"."""
    response, _ = await run(
        Message.user("Transfer $1 to a"), tool(approval_resp("approval-1", output))
    )
    assert_text(response, "Transfer cancelled: denied")


# --- unhandled ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "content",
    [[Part.of_response("otherTool", "r1", {"x": 1})], [Part.of_text("just text")], []],
)
async def test_unhandled_tool_response(content: list[Part]) -> None:
    """A tool message with neither transferMoney nor userApproval responses is unhandled."""
    response, recorder = await run(
        Message.user("Transfer $1 to a"), Message(role="tool", content=content)
    )
    assert_text(response, "Unhandled tool response.")
    assert recorder.texts() == ["Unhandled ", "tool ", "response."]


# --- (e) fail and (e2) flaky -------------------------------------------------------------------


async def test_fail_raises_plain_error() -> None:
    """Rule (e) raises a plain (non-transient) error "Scripted model failure"."""
    with pytest.raises(RuntimeError, match=r"^Scripted model failure$") as info:
        await run(Message.user("please FAIL now"))
    assert not isinstance(info.value, TransientError)


async def test_flaky_fails_once_then_echoes() -> None:
    """Rule (e2) raises a transient error the first time a text is seen, then falls through."""
    model = ScriptedModel()
    with pytest.raises(TransientModelError, match=r"^Scripted transient model failure$"):
        await run(Message.user("flaky request"), model=model)
    response, recorder = await run(Message.user("flaky request"), model=model)
    assert_text(response, "Echo: flaky request")
    assert recorder.texts() == ["Echo: ", "flaky ", "request"]


async def test_flaky_memory_is_per_text_and_per_instance() -> None:
    """Rule (e2) remembers exact texts per model instance."""
    model = ScriptedModel()
    with pytest.raises(TransientModelError):
        await run(Message.user("Flaky"), model=model)
    with pytest.raises(TransientModelError):
        await run(Message.user("flaky"), model=model)
    with pytest.raises(TransientModelError):
        await run(Message.user("Flaky"), model=ScriptedModel())
    response, _ = await run(Message.user("Flaky"), model=model)
    assert_text(response, "Echo: Flaky")


# --- (g) slow ----------------------------------------------------------------------------------


def test_default_slow_delay_is_300_ms() -> None:
    """The default wait before each slow chunk is 300 ms."""
    assert DEFAULT_SLOW_CHUNK_DELAY == 0.3


async def test_slow_echoes_with_delay_before_each_chunk() -> None:
    """Rule (g) streams like (f) but waits the delay before each of its chunks."""
    model = ScriptedModel(slow_chunk_delay=0.02)
    started = time.monotonic()
    response, recorder = await run(Message.user("go slow now"), model=model)
    assert time.monotonic() - started >= 4 * 0.02 * 0.9
    assert_text(response, "Echo: go slow now")
    assert recorder.texts() == ["Echo: ", "go ", "slow ", "now"]


async def test_slow_is_cancellable() -> None:
    """Cancelling the call during rule (g)'s wait aborts it before all chunks are sent."""
    model = ScriptedModel(slow_chunk_delay=0.05)
    recorder = Recorder()
    request = ModelRequest(messages=[Message.user("slow one two three four")])
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(model.generate(request, recorder), timeout=0.12)
    assert 1 <= len(recorder.chunks) < 6


async def test_only_slow_waits() -> None:
    """Rules other than (g) never wait, whatever the configured delay."""
    model = ScriptedModel(slow_chunk_delay=30)
    response = await asyncio.wait_for(
        model.generate(ModelRequest(messages=[Message.user("quick one")])), timeout=1
    )
    assert_text(response, "Echo: quick one")


# --- priority ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "first_request"),
    [
        ("parallel transfer $5 to A and $6 to B", transfer_req("transfer-1", 5, "A and $6 to B")),
        ("transfer $5 to A and $6 to B loop", approval_req("approval-1", "Transfer $5 to A")),
        ("transfer $5 to A loop fail", approval_req("approval-1", "Transfer $5 to A loop fail")),
        ("loop fail flaky slow", transfer_req("transfer-1", 1, "loop")),
    ],
)
async def test_first_matching_rule_wins_for_requests(
    text: str, first_request: dict[str, Any]
) -> None:
    """Rules h, d, a and i are tried in that order and the first match decides."""
    response, _ = await run(Message.user(text))
    assert wire(response)[0] == first_request


async def test_fail_beats_flaky_and_slow() -> None:
    """Rule (e) is tried before (e2) and (g)."""
    with pytest.raises(RuntimeError, match="Scripted model failure"):
        await run(Message.user("flaky slow fail"))


async def test_flaky_beats_slow_then_falls_through_to_slow() -> None:
    """Rule (e2) is tried before (g); once the text is seen, (g) answers it."""
    model = ScriptedModel(slow_chunk_delay=0.01)
    with pytest.raises(TransientModelError):
        await run(Message.user("slow flaky"), model=model)
    response, _ = await run(Message.user("slow flaky"), model=model)
    assert_text(response, "Echo: slow flaky")


async def test_streamed_parts_are_independent_of_final_message() -> None:
    """Mutating a streamed tool-request chunk does not change the returned message."""
    response, recorder = await run(Message.user("loop"))
    recorder.chunks[0][0].metadata = {"changed": True}
    assert response.message.content[0].metadata is None


# --- helpers -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("account", "expected"),
    [
        ("my savings account", "my-savings-account"),
        ("  --My Savings, Account!!-- ", "my-savings-account"),
        ("Café Nº 9", "caf-n-9"),
        ("!!!", ""),
    ],
)
def test_slug(account: str, expected: str) -> None:
    """slug lower-cases, turns runs outside [a-z0-9] into "-" and trims "-" at both ends."""
    assert slug(account) == expected


@pytest.mark.parametrize(
    ("amount", "expected"),
    [
        (500, "txn-500-my-savings-account"),
        (1.5, "txn-1.5-my-savings-account"),
        (2.0, "txn-2-my-savings-account"),
        (0.1 + 0.2, "txn-0.30000000000000004-my-savings-account"),
        (1e-6, "txn-0.000001-my-savings-account"),
        (1e-7, "txn-1e-7-my-savings-account"),
        (1.5e-7, "txn-1.5e-7-my-savings-account"),
        (1e20, "txn-100000000000000000000-my-savings-account"),
        (1e21, "txn-1e+21-my-savings-account"),
        (10**21, "txn-1e+21-my-savings-account"),
        (1.25e22, "txn-1.25e+22-my-savings-account"),
        (-0.5, "txn--0.5-my-savings-account"),
        (-0.0, "txn-0-my-savings-account"),
    ],
)
def test_transaction_id_renders_amount_like_javascript(amount: int | float, expected: str) -> None:
    """transaction_id is "txn-<amount>-<slug>" with the amount as JavaScript's String() has it."""
    assert transaction_id(amount, "My Savings Account.") == expected


# --- (r) rejected --------------------------------------------------------------------------


def refusal(name: str, ref: str, reason: str) -> Part:
    return Part.of_response(name, ref, {"rejected": True, "reason": reason, "by": "bob"})


async def test_a_rejected_transfer_is_reported_with_its_reason() -> None:
    """Rule (r): when every result is a refusal, the model says the transfer was rejected and
    why, instead of reporting a transaction."""
    response, _ = await run(
        Message.user("transfer $40 to carol"),
        tool(refusal("transferMoney", "transfer-1", "Over the limit.")),
    )
    assert_text(response, "The transfer was rejected: Over the limit.")


async def test_a_rejected_approval_is_reported_with_its_reason() -> None:
    """Rule (r) applies to a rejected interrupt too, before rule (b) reads it as a denial."""
    response, _ = await run(
        Message.user("transfer $40 to carol"),
        tool(refusal("userApproval", "approval-1", "Unknown payee.")),
    )
    assert_text(response, "The transfer was rejected: Unknown payee.")


async def test_refusals_beside_other_results_are_set_aside() -> None:
    """With a refusal and an approval in one message, the approval alone is answered."""
    history = transfer_history(
        "Transfer $1 to a and $2 to b", Part.of_request("userApproval", "approval-1", {})
    )
    response, recorder = await run(
        *history,
        tool(
            refusal("userApproval", "approval-1", "No."),
            approval_resp("approval-2", {"approved": True}),
        ),
    )
    assert_tool_answer(response, recorder, [transfer_req("transfer-2", 2, "b")])
