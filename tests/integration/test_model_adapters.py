"""The OpenAI and Anthropic adapters over real HTTP: mapping, streaming, errors, malformed calls.

Every test runs the real SDK against the local fake provider (``tests/fake_providers.py``),
for both providers, and checks both what the engine made of the answers and what the adapter
sent on the wire.
"""

from __future__ import annotations

import json
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import sqlalchemy as sa

from engine import FinishReason, TurnFailedError, TurnStatus
from engine.store import ToolCallStatus
from examples.banking import SYSTEM_PROMPT, BankingApp, build
from tests.conftest import TEST_STATE_KEYS
from tests.databases import sql_store
from tests.fake_providers import (
    Call,
    FakeAnthropic,
    FakeOpenAI,
    FakeProvider,
    Recorded,
    Reply,
    anthropic_model,
    openai_model,
)
from tests.support import request_in, store_of
from workers import WorkerPool

OPENAI_ERRORS: dict[str, tuple[int, dict[str, Any]]] = {
    "rate_limit": (
        429,
        {
            "message": "Rate limit reached for gpt-4o-mini in organization org-test on requests "
            "per min (RPM): Limit 3, Used 3, Requested 1. Please try again in 20s.",
            "type": "requests",
            "param": None,
            "code": "rate_limit_exceeded",
        },
    ),
    "server": (
        500,
        {
            "message": "The server had an error while processing your request. Sorry about that!",
            "type": "server_error",
            "param": None,
            "code": None,
        },
    ),
    "overloaded": (
        503,
        {
            "message": "The engine is currently overloaded, please try again later.",
            "type": "server_error",
            "param": None,
            "code": None,
        },
    ),
    "auth": (
        401,
        {
            "message": "Incorrect API key provided: sk-test. You can find your API key at "
            "https://platform.openai.com/account/api-keys.",
            "type": "invalid_request_error",
            "param": None,
            "code": "invalid_api_key",
        },
    ),
    "invalid": (
        400,
        {
            "message": "Invalid 'max_tokens': integer above maximum value. Expected a value <= "
            "16384, but got 100000 instead.",
            "type": "invalid_request_error",
            "param": "max_tokens",
            "code": "integer_above_max_value",
        },
    ),
    "policy": (
        400,
        {
            "message": "Your request was rejected as a result of our safety system. Your prompt "
            "may contain text that is not allowed by our safety system.",
            "type": "invalid_request_error",
            "param": None,
            "code": "content_policy_violation",
        },
    ),
}

ANTHROPIC_ERRORS: dict[str, tuple[int, dict[str, Any]]] = {
    "rate_limit": (
        429,
        {
            "type": "rate_limit_error",
            "message": "This request would exceed the rate limit for your organization of "
            "50 requests per minute.",
        },
    ),
    "server": (500, {"type": "api_error", "message": "Internal server error"}),
    "overloaded": (529, {"type": "overloaded_error", "message": "Overloaded"}),
    "auth": (401, {"type": "authentication_error", "message": "invalid x-api-key"}),
    "invalid": (
        400,
        {
            "type": "invalid_request_error",
            "message": "max_tokens: 100000 > 64000, which is the maximum allowed number of "
            "output tokens for claude-sonnet-4-5",
        },
    ),
    "policy": (
        400,
        {"type": "invalid_request_error", "message": "Output blocked by content filtering policy"},
    ),
}


@dataclass
class Provider:
    """One provider under test: its fake server, its adapter, and how to read its wire."""

    kind: str
    server: FakeProvider
    models: list[Any] = field(default_factory=list)

    def model(self, **options: Any) -> Any:
        maker = openai_model if self.kind == "openai" else anthropic_model
        model = maker(self.server, **options)  # type: ignore[arg-type]
        self.models.append(model)
        return model

    def app(self, *, max_attempts: int = 3, **options: Any) -> BankingApp:
        return build(
            model=self.model(**options), state_keys=TEST_STATE_KEYS, max_attempts=max_attempts
        )

    def error(self, name: str) -> Reply:
        table = OPENAI_ERRORS if self.kind == "openai" else ANTHROPIC_ERRORS
        status, inner = table[name]
        body = {"error": inner} if self.kind == "openai" else {"type": "error", "error": inner}
        return Reply(kind="error", status=status, body=body)

    def error_message(self, name: str) -> str:
        table = OPENAI_ERRORS if self.kind == "openai" else ANTHROPIC_ERRORS
        return str(table[name][1]["message"])

    # -- reading what was sent ------------------------------------------------------

    def system(self, sent: Recorded) -> str:
        if self.kind == "openai":
            first = sent.body["messages"][0]
            assert first["role"] == "system"
            return str(first["content"])
        return str(sent.body["system"])

    def tools(self, sent: Recorded) -> dict[str, tuple[str, dict[str, Any]]]:
        if self.kind == "openai":
            return {
                t["function"]["name"]: (t["function"]["description"], t["function"]["parameters"])
                for t in sent.body["tools"]
            }
        return {t["name"]: (t["description"], t["input_schema"]) for t in sent.body["tools"]}

    def calls(self, sent: Recorded) -> list[tuple[str, str, str]]:
        """``(id, name, arguments text)`` of every tool call in the history sent."""
        found: list[tuple[str, str, str]] = []
        for entry in sent.body["messages"]:
            if self.kind == "openai":
                for call in entry.get("tool_calls") or []:
                    function = call["function"]
                    found.append((call["id"], function["name"], function["arguments"]))
            elif entry["role"] == "assistant":
                for block in entry["content"]:
                    if block["type"] == "tool_use":
                        found.append((block["id"], block["name"], json.dumps(block["input"])))
        return found

    def results(self, sent: Recorded) -> list[tuple[str, Any, bool]]:
        """``(id, decoded content, is_error)`` of the tool results that end the history."""
        entries = sent.body["messages"]
        if self.kind == "openai":
            tail: list[tuple[str, Any, bool]] = []
            for entry in reversed(entries):
                if entry["role"] != "tool":
                    break
                tail.insert(0, (entry["tool_call_id"], json.loads(entry["content"]), False))
            return tail
        return [
            (b["tool_use_id"], json.loads(b["content"]), bool(b.get("is_error")))
            for b in entries[-1]["content"]
            if b["type"] == "tool_result"
        ]


@pytest.fixture(params=["openai", "anthropic"])
async def provider(
    request: pytest.FixtureRequest, fake_openai: FakeOpenAI, fake_anthropic: FakeAnthropic
) -> AsyncIterator[Provider]:
    """Each provider in turn; adapters' HTTP clients are closed after the test."""
    server: FakeProvider = fake_openai if request.param == "openai" else fake_anthropic
    side = Provider(request.param, server)
    yield side
    for model in side.models:
        await model.aclose()


TRANSFER = "Transfer $500 to my savings account."
RECEIPT = {"success": True, "transactionId": "txn-500-my-savings-account"}


@pytest.mark.parametrize("streamed", [True, False], ids=["stream", "whole"])
async def test_banking_flow_end_to_end(provider: Provider, streamed: bool) -> None:
    """Transfer → approval interrupt → resume approved → transferMoney → final text, with the
    system prompt, tool schemas, ids and results on the wire and usage on the turns."""
    app = provider.app(stream=streamed)
    chat = app.banking_agent.chat()
    if streamed:
        turn = chat.send_stream(TRANSFER)
        first_chunks = [c async for c in turn.stream]
        paused = await turn.response
        assert [request_in(p).ref for p in first_chunks[0].tool_requests] == ["approval-1"]
    else:
        paused = await chat.send(TRANSFER)
    assert paused.finish_reason is FinishReason.INTERRUPTED
    assert [(i.name, i.ref) for i in paused.interrupts] == [("userApproval", "approval-1")]
    approval = paused.interrupts[0]
    assert approval.input.details == "Transfer $500 to my savings account"

    respond = [approval.respond({"approved": True, "feedback": "ok"})]
    if streamed:
        turn = chat.resume_stream(respond=respond)
        texts = [c.text async for c in turn.stream if c.role == "model" and c.text]
        done = await turn.response
        assert texts == ["Done. ", "Transaction ", "txn-500-my-savings-account."]
    else:
        done = await chat.resume(respond=respond)
    assert done.text == "Done. Transaction txn-500-my-savings-account."
    assert [t.toAccount for _, t in app.transfers] == ["my savings account"]

    first, second, third = provider.server.requests
    assert provider.system(first) == SYSTEM_PROMPT
    assert bool(first.body.get("stream")) is streamed
    tools = provider.tools(first)
    assert set(tools) == {"userApproval", "transferMoney"}
    description, schema = tools["transferMoney"]
    assert description.startswith("Transfer money to a specified account.")
    assert "transactionId" in description  # the output schema, told to the model
    assert set(schema["properties"]) == {"amount", "toAccount"}
    assert set(tools["userApproval"][1]["properties"]) == {"action", "details"}
    assert provider.calls(second) == [
        (
            "approval-1",
            "userApproval",
            json.dumps(
                {"action": "transferMoney", "details": "Transfer $500 to my savings account"}
            )
            if provider.kind == "anthropic"
            else '{"action":"transferMoney","details":"Transfer $500 to my savings account"}',
        )
    ]
    assert provider.results(second) == [("approval-1", {"approved": True, "feedback": "ok"}, False)]
    assert provider.results(third) == [("transfer-1", RECEIPT, False)]

    store = store_of(app.banking_agent)
    paused_turn = await store.get_turn(str(paused.snapshot_id))
    done_turn = await store.get_turn(str(done.snapshot_id))
    assert paused_turn is not None and done_turn is not None
    # The fake reports 10 input tokens per message it received (the system prompt counted as
    # one) and 5 output tokens per answer: 2 messages, then 4 and 6 over the resume's two calls.
    assert (paused_turn.input_tokens, paused_turn.output_tokens) == (20, 5)
    assert (done_turn.input_tokens, done_turn.output_tokens) == (40 + 60, 10)


@pytest.mark.parametrize("streamed", [True, False], ids=["stream", "whole"])
async def test_parallel_tool_calls_with_arguments_split_across_many_chunks(
    provider: Provider, streamed: bool
) -> None:
    """Two calls in one response — streamed as 3-character argument fragments, interleaved —
    both run, and both results go back with their ids in the next request."""
    app = provider.app(stream=streamed)
    provider.server.script.extend(
        [
            Reply(
                kind="answer",
                calls=[
                    Call("call_a", "transferMoney", '{"amount": 10, "toAccount": "Alice"}'),
                    Call("call_b", "transferMoney", '{"amount": 20.5, "toAccount": "Bob"}'),
                ],
                arg_chunk=3,
                interleave=provider.kind == "openai",
            ),
            Reply(kind="answer", text="Both transfers are done."),
        ]
    )
    res = await app.banking_agent.chat().send("pay both")
    assert res.text == "Both transfers are done."
    assert sorted((t.amount, t.toAccount) for _, t in app.transfers) == [
        (10, "Alice"),
        (20.5, "Bob"),
    ]
    assert [request_in(p).ref for p in res.messages[1].content] == ["call_a", "call_b"]
    _, second = provider.server.requests
    assert provider.results(second) == [
        ("call_a", {"success": True, "transactionId": "txn-10-alice"}, False),
        ("call_b", {"success": True, "transactionId": "txn-20.5-bob"}, False),
    ]
    if provider.kind == "anthropic":  # both results travel in one user turn
        assert second.body["messages"][-1]["role"] == "user"
        assert len(second.body["messages"]) == 3


TRANSIENT = ["rate_limit", "server", "overloaded"]


@pytest.mark.parametrize("name", TRANSIENT)
async def test_transient_http_errors_are_retried(provider: Provider, name: str) -> None:
    """429, 500 and 503/529 are transient: the turn is retried with backoff and succeeds."""
    app = provider.app()
    provider.server.script.append(provider.error(name))
    res = await app.banking_agent.chat().send(TRANSFER)
    assert res.finish_reason is FinishReason.INTERRUPTED
    assert len(provider.server.requests) == 2
    turn = await store_of(app.banking_agent).get_turn(str(res.snapshot_id))
    assert turn is not None and turn.attempts == 2


async def test_an_error_event_inside_a_stream_is_transient(provider: Provider) -> None:
    """A stream that starts and then breaks off with an error event is retried."""
    app = provider.app()
    _, inner = (OPENAI_ERRORS if provider.kind == "openai" else ANTHROPIC_ERRORS)["overloaded"]
    body = inner if provider.kind == "openai" else {"type": "error", "error": inner}
    provider.server.script.append(Reply(kind="stream_error", body=body))
    res = await app.banking_agent.chat().send(TRANSFER)
    assert res.finish_reason is FinishReason.INTERRUPTED
    assert len(provider.server.requests) == 2


async def test_a_timeout_is_transient(provider: Provider) -> None:
    """A provider slower than the adapter's timeout is retried like a lost connection."""
    app = provider.app(timeout=0.5)
    provider.server.script.append(Reply(kind="hang", delay=1.5))
    res = await app.banking_agent.chat().send(TRANSFER)
    assert res.finish_reason is FinishReason.INTERRUPTED
    assert len(provider.server.requests) == 2


async def test_retries_exhausted_fail_with_unavailable_and_the_provider_message(
    provider: Provider,
) -> None:
    """A rate limit that persists through max_attempts fails the turn UNAVAILABLE, naming the
    provider's message."""
    app = provider.app(max_attempts=2)
    provider.server.script.extend([provider.error("rate_limit"), provider.error("rate_limit")])
    with pytest.raises(TurnFailedError) as failed:
        await app.banking_agent.chat().send(TRANSFER)
    assert failed.value.status == "UNAVAILABLE"
    assert provider.error_message("rate_limit") in failed.value.message
    assert "HTTP 429" in failed.value.message
    assert len(provider.server.requests) == 2


async def test_connection_refused_is_transient(provider: Provider) -> None:
    """Nothing listening at base_url: every attempt is made, then the turn fails UNAVAILABLE."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{closed_port}" + ("/v1" if provider.kind == "openai" else "")
    app = provider.app(max_attempts=2, base_url=url)
    with pytest.raises(TurnFailedError) as failed:
        await app.banking_agent.chat().send(TRANSFER)
    assert failed.value.status == "UNAVAILABLE"
    assert "connection failed" in failed.value.message
    turn = await store_of(app.banking_agent).get_turn(str(failed.value.snapshot_id))
    assert turn is not None and turn.attempts == 2


@pytest.mark.parametrize(
    ("name", "status", "kind"),
    [
        ("auth", "UNAUTHENTICATED", "ModelAuthenticationError"),
        ("invalid", "INVALID_ARGUMENT", "ModelRequestError"),
        ("policy", "FAILED_PRECONDITION", "ModelContentPolicyError"),
    ],
)
async def test_permanent_errors_fail_the_turn_at_once(
    provider: Provider, name: str, status: str, kind: str
) -> None:
    """401, 400 and content-policy refusals are not retried: the turn fails with the Genkit
    status and the provider's own message, and its error names the provider."""
    app = provider.app(max_attempts=3)
    provider.server.script.append(provider.error(name))
    with pytest.raises(TurnFailedError) as failed:
        await app.banking_agent.chat().send(TRANSFER)
    assert failed.value.status == status
    assert provider.error_message(name) in failed.value.message
    assert len(provider.server.requests) == 1
    snapshot = await app.banking_agent.get_snapshot(snapshot_id=failed.value.snapshot_id)
    assert snapshot is not None and snapshot.status is TurnStatus.FAILED
    turn = await store_of(app.banking_agent).get_turn(str(failed.value.snapshot_id))
    assert turn is not None and turn.error is not None
    assert turn.error.details["provider"] == (
        "OpenAI" if provider.kind == "openai" else "Anthropic"
    )
    assert turn.error.details["httpStatus"] == provider.error(name).status
    assert kind  # the class is documented in docs/models.md; status is what callers see


@pytest.mark.parametrize(
    ("arguments", "complaint"),
    [
        ('{"amount": 10, "toAccount": ', "not valid JSON"),
        ('{"amount": "ten", "toAccount": "Alice"}', "does not match its input schema"),
    ],
    ids=["not-json", "schema"],
)
async def test_a_malformed_tool_call_is_returned_to_the_model_which_corrects_it(
    provider: Provider, arguments: str, complaint: str
) -> None:
    """Bad arguments become a tool error sent back with the call's id; the model's corrected
    call then runs, and only that one."""
    app = provider.app()
    provider.server.script.extend(
        [
            Reply(kind="answer", calls=[Call("call_1", "transferMoney", arguments)], arg_chunk=4),
            Reply(
                kind="answer",
                calls=[Call("call_2", "transferMoney", '{"amount": 10, "toAccount": "Alice"}')],
            ),
            Reply(kind="answer", text="Sent."),
        ]
    )
    res = await app.banking_agent.chat().send("send 10 to Alice")
    assert res.text == "Sent."
    assert [(t.amount, t.toAccount) for _, t in app.transfers] == [(10, "Alice")]
    _, second, _ = provider.server.requests
    [(ref, content, is_error)] = provider.results(second)
    assert ref == "call_1" and complaint in content["error"]
    assert is_error is (provider.kind == "anthropic")  # Anthropic has a flag for it
    [(_, _, sent_back)] = provider.calls(second)
    if complaint == "not valid JSON" and provider.kind == "openai":
        assert sent_back == arguments  # the model sees the text it sent, verbatim
    elif complaint != "not valid JSON":
        assert json.loads(sent_back) == json.loads(arguments)
    calls = await store_of(app.banking_agent).list_calls(str(res.snapshot_id))
    assert [(c.ref, c.status) for c in calls] == [
        ("call_1", ToolCallStatus.FAILED),
        ("call_2", ToolCallStatus.DONE),
    ]


async def test_a_malformed_interrupt_call_does_not_pause_or_crash(provider: Provider) -> None:
    """userApproval called without its required input is answered with an error; the model's
    second, valid call pauses the turn as usual."""
    app = provider.app()
    good = '{"action": "transferMoney", "details": "Transfer $10 to Alice"}'
    provider.server.script.extend(
        [
            Reply(kind="answer", calls=[Call("call_1", "userApproval", '{"action": 1}')]),
            Reply(kind="answer", calls=[Call("call_2", "userApproval", good)]),
        ]
    )
    res = await app.banking_agent.chat().send("send 10 to Alice")
    assert [(i.name, i.ref) for i in res.interrupts] == [("userApproval", "call_2")]
    [(_, content, _)] = provider.results(provider.server.requests[1])
    assert "does not match its input schema" in content["error"]


@pytest.mark.parametrize("reason", ["length", "blocked"])
async def test_finish_reasons_are_mapped(provider: Provider, reason: str) -> None:
    """max_tokens/length ends a turn with finish reason length; a content filter or refusal
    ends it blocked (a completed turn, not an error)."""
    wire = {
        ("openai", "length"): "length",
        ("openai", "blocked"): "content_filter",
        ("anthropic", "length"): "max_tokens",
        ("anthropic", "blocked"): "refusal",
    }[(provider.kind, reason)]
    app = provider.app()
    provider.server.script.append(Reply(kind="answer", text="I was about to", finish=wire))
    res = await app.banking_agent.chat().send("tell me a long story")
    assert res.finish_reason is FinishReason(reason)
    assert res.text == "I was about to"


async def test_request_config_and_headers_reach_the_provider(provider: Provider) -> None:
    """Adapter defaults and extra headers are sent; Genkit config names are translated."""
    app = provider.app(headers={"X-Gateway-Route": "eu"}, config={"temperature": 0.2})
    provider.server.script.append(Reply(kind="answer", text="hi"))
    await app.banking_agent.chat().send("hello")
    [sent] = provider.server.requests
    assert sent.headers["x-gateway-route"] == "eu"
    assert sent.body["temperature"] == 0.2
    assert sent.body["model"] == (
        "gpt-4o-mini" if provider.kind == "openai" else "claude-sonnet-4-5"
    )
    if provider.kind == "openai":
        assert sent.headers["authorization"] == "Bearer sk-test"
        assert sent.body["stream_options"] == {"include_usage": True}
    else:
        assert sent.headers["x-api-key"] == "sk-ant-test"
        assert sent.body["max_tokens"] == 4096


@pytest.mark.parametrize("database", ["sqlite", "postgres"])
async def test_usage_reported_by_the_provider_is_visible_in_sql(
    provider: Provider, database: str
) -> None:
    """The provider's token counts of a durable turn land in turns.input_tokens/output_tokens."""
    async with sql_store(database) as store:
        app = build(
            model=provider.model(), store=store, state_keys=TEST_STATE_KEYS, execution="inline"
        )
        provider.server.script.append(Reply(kind="answer", text="Hello there.", usage=(321, 12)))
        res = await app.banking_agent.chat().send("hello")
        with store.db.engine.connect() as connection:
            row = connection.execute(
                sa.text("SELECT input_tokens, output_tokens FROM turns WHERE id = :id"),
                {"id": res.snapshot_id},
            ).one()
    assert tuple(row) == (321, 12)


async def test_the_worker_pool_retries_a_rate_limited_turn(provider: Provider) -> None:
    """A turn queued for workers and hit by a 429 is retried by the pool, then pauses."""
    app = provider.app()
    agent = app.ai.define_agent(
        name="queuedBanking",
        system=SYSTEM_PROMPT,
        tools=[app.user_approval, app.transfer_money],
        store=app.banking_agent.store,
        execution="workers",
        max_attempts=3,
    )
    provider.server.script.append(provider.error("rate_limit"))
    async with WorkerPool(app.ai, poll_interval=0.05, scheduler=False):
        res = await agent.chat().send(TRANSFER)
    assert res.finish_reason is FinishReason.INTERRUPTED
    assert len(provider.server.requests) == 2
    turn = await store_of(agent).get_turn(str(res.snapshot_id))
    assert turn is not None and turn.attempts == 2


@pytest.mark.parametrize("streamed", [True, False], ids=["stream", "whole"])
async def test_an_openai_refusal_ends_the_turn_blocked_with_its_text(
    fake_openai: FakeOpenAI, streamed: bool
) -> None:
    """OpenAI's refusal channel (no content, a refusal message) is shown and ends blocked."""
    model = openai_model(fake_openai, stream=streamed)
    app = build(model=model, state_keys=TEST_STATE_KEYS)
    fake_openai.script.append(Reply(kind="answer", refusal="I can't help with that."))
    res = await app.banking_agent.chat().send("do something bad")
    await model.aclose()
    assert res.finish_reason is FinishReason.BLOCKED
    assert res.text == "I can't help with that."


async def test_openai_compatible_tool_calls_without_an_index_still_assemble(
    fake_openai: FakeOpenAI,
) -> None:
    """A server that omits tool_calls[].index still yields one request per call, in order."""
    model = openai_model(fake_openai)
    app = build(model=model, state_keys=TEST_STATE_KEYS)
    fake_openai.script.extend(
        [
            Reply(
                kind="answer",
                calls=[
                    Call("call_a", "transferMoney", '{"amount": 1, "toAccount": "A"}'),
                    Call("call_b", "transferMoney", '{"amount": 2, "toAccount": "B"}'),
                ],
                omit_index=True,
            ),
            Reply(kind="answer", text="ok"),
        ]
    )
    res = await app.banking_agent.chat().send("pay")
    await model.aclose()
    assert res.text == "ok"
    assert sorted((t.amount, t.toAccount) for _, t in app.transfers) == [(1, "A"), (2, "B")]
    assert [request_in(p).ref for p in res.messages[1].content] == ["call_a", "call_b"]
