"""The adapters' request mapping and the error classification, without a server."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from engine.conversation.parts import MALFORMED_INPUT, TOOL_ERROR, Message, Part
from engine.model import ModelRequest, ModelResponse, ToolSpec, TransientModelError
from engine.models import (
    AnthropicModel,
    ModelAuthenticationError,
    ModelContentPolicyError,
    ModelNotFoundError,
    ModelPermissionError,
    ModelRequestError,
    OpenAIChatModel,
)
from engine.models.errors import ProviderFailure, classify
from engine.status import FinishReason


@pytest.fixture
async def models() -> AsyncIterator[tuple[Any, Any]]:
    """Both adapters (never called: only their request building is exercised)."""
    openai = OpenAIChatModel("gpt-4o-mini", api_key="k", base_url="http://127.0.0.1:9/v1")
    anthropic = AnthropicModel("claude-sonnet-4-5", api_key="k", base_url="http://127.0.0.1:9")
    yield openai, anthropic
    await openai.aclose()
    await anthropic.aclose()


def conversation() -> list[Message]:
    """System, user, a model turn with a re-numbered ref and a malformed call, their results
    (one a tool error), then a new user message."""
    return [
        Message(role="system", content=[Part.of_text("Be brief.")]),
        Message.user("pay twice"),
        Message(
            role="model",
            content=[
                Part.of_text(""),
                Part.of_request("pay", "call~2", {"n": 1}),
                Part.of_request("pay", "call_b", '{"n": ', {MALFORMED_INPUT: "Expecting value"}),
            ],
        ),
        Message(
            role="tool",
            content=[
                Part.of_response("pay", "call~2", {"ok": True}),
                Part.of_response("pay", "call_b", {"error": "bad"}, {TOOL_ERROR: True}),
            ],
        ),
        Message.user("and now?"),
    ]


def request(**config: Any) -> ModelRequest:
    return ModelRequest(
        messages=conversation(),
        tools=[ToolSpec(name="pay", description="Pay.", output_schema={"type": "object"})],
        config=config,
    )


def test_openai_request_mapping(models: tuple[Any, Any]) -> None:
    """Roles, ids, raw malformed arguments, one tool message per result, tools and config."""
    body = models[0].build_request(request(maxOutputTokens=50, stopSequences=["x"]))
    roles = [m["role"] for m in body["messages"]]
    assert roles == ["system", "user", "assistant", "tool", "tool", "user"]
    assistant = body["messages"][2]
    assert assistant["content"] is None
    assert [(c["id"], c["function"]["arguments"]) for c in assistant["tool_calls"]] == [
        ("call~2", '{"n":1}'),
        ("call_b", '{"n": '),
    ]
    assert [(m["tool_call_id"], m["content"]) for m in body["messages"][3:5]] == [
        ("call~2", '{"ok":true}'),
        ("call_b", '{"error":"bad"}'),
    ]
    [tool] = body["tools"]
    assert tool["function"]["parameters"] == {"type": "object", "properties": {}}
    assert "Returns JSON matching this schema" in tool["function"]["description"]
    assert (body["max_tokens"], body["stop"]) == (50, ["x"])


def test_anthropic_request_mapping(models: tuple[Any, Any]) -> None:
    """System on top, alternating turns (tool results first in the merged user turn), safe
    ids paired on both sides, is_error on the tool error, no empty text blocks."""
    body = models[1].build_request(request(stopSequences=["x"]))
    assert body["system"] == "Be brief."
    assert [m["role"] for m in body["messages"]] == ["user", "assistant", "user"]
    uses = body["messages"][1]["content"]
    assert [(b["type"], b["id"], b["input"]) for b in uses] == [
        ("tool_use", "call_2", {"n": 1}),
        ("tool_use", "call_b", {}),
    ]
    results = body["messages"][2]["content"]
    assert [(b["type"], b.get("tool_use_id"), b.get("is_error")) for b in results] == [
        ("tool_result", "call_2", None),
        ("tool_result", "call_b", True),
        ("text", None, None),
    ]
    assert body["tools"][0]["input_schema"] == {"type": "object", "properties": {}}
    assert (body["max_tokens"], body["stop_sequences"]) == (4096, ["x"])


@pytest.mark.parametrize(
    ("failure", "expected", "status"),
    [
        (ProviderFailure("P", "slow down", http_status=429), TransientModelError, None),
        (ProviderFailure("P", "busy", http_status=529), TransientModelError, None),
        (ProviderFailure("P", "oops", http_status=502), TransientModelError, None),
        (ProviderFailure("P", "late", http_status=408), TransientModelError, None),
        (ProviderFailure("P", "reset", connection=True), TransientModelError, None),
        (ProviderFailure("P", "timed out", timeout=True), TransientModelError, None),
        (
            ProviderFailure("P", "Overloaded", http_status=200, error_type="overloaded_error"),
            TransientModelError,
            None,
        ),
        (
            ProviderFailure("P", "bad key", http_status=401),
            ModelAuthenticationError,
            "UNAUTHENTICATED",
        ),
        (
            ProviderFailure("P", "no access", http_status=403),
            ModelPermissionError,
            "PERMISSION_DENIED",
        ),
        (ProviderFailure("P", "no model", http_status=404), ModelNotFoundError, "NOT_FOUND"),
        (ProviderFailure("P", "too big", http_status=413), ModelRequestError, "INVALID_ARGUMENT"),
        (
            ProviderFailure("P", "filtered", http_status=400, code="content_filter"),
            ModelContentPolicyError,
            "FAILED_PRECONDITION",
        ),
    ],
)
def test_classification(failure: ProviderFailure, expected: type, status: str | None) -> None:
    """Each failure lands in its class; permanent ones name the provider and its message."""
    error = classify(failure)
    assert type(error) is expected
    assert failure.message in str(error) and "P " in str(error)
    if status is not None:
        assert getattr(error, "status", None) == status


@pytest.mark.parametrize(
    ("given", "read"),
    [
        ("length", FinishReason.LENGTH),
        (FinishReason.BLOCKED, FinishReason.BLOCKED),
        ("end_turn", FinishReason.OTHER),
        ("", FinishReason.OTHER),
    ],
)
def test_a_model_response_reads_its_finish_reason_as_genkits(
    given: str, read: FinishReason
) -> None:
    """A model may name its finish reason as a string: Genkit's are read as such, any
    other (a provider's own word) as ``other``."""
    response = ModelResponse(message=Message(role="model", content=[]), finish_reason=given)
    assert response.finish_reason is read
