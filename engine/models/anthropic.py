"""``AnthropicModel``: Claude through the Anthropic Messages API.

Mapping (Turnstile/Genkit → Messages API and back):

* ``system`` messages → the request's top-level ``system`` text;
* ``user`` → ``{"role": "user", "content": [text blocks]}``; ``model`` → ``{"role":
  "assistant", "content": [text blocks, {"type": "tool_use", id: ref, name, input}]}``;
  ``tool`` → a user turn of ``{"type": "tool_result", tool_use_id: ref, content}`` blocks
  (``is_error`` for a tool error the runner returned). Consecutive turns of one role are merged,
  since the API wants user and assistant to alternate;
* every tool (interrupts included) → ``{name, description, input_schema}``;
* streamed ``text_delta`` events go to the chunk sink as they arrive; ``input_json_delta``
  fragments are joined per content block and become complete ``toolRequest`` parts when the
  stream ends (sent to the sink as one chunk);
* ``stop_reason``: ``end_turn``/``tool_use``/``stop_sequence`` → ``stop``, ``max_tokens`` →
  ``length``, ``refusal`` → ``blocked``; ``usage`` (input from ``message_start``, output from the
  last ``message_delta``) → :class:`~engine.model.ModelUsage`.

Tool-use ids must match ``^[a-zA-Z0-9_-]+$``; a ref the runner made unique (``ref~2``) is sent
with the other characters replaced by ``_`` (the same function maps the request and its result,
so they still pair up).

The SDK is an optional extra (``pip install turnstile[anthropic]``) imported when a model is
constructed, so ``import engine`` works without it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from engine.conversation.parts import MALFORMED_INPUT, Message, Part
from engine.model import ChunkSink, ModelRequest, ModelResponse, ModelUsage, ToolSpec
from engine.models.common import (
    EMPTY_OBJECT_SCHEMA,
    GENKIT_CONFIG_KEYS,
    ProviderModel,
    finish_reason,
    import_sdk,
    is_tool_error,
    json_text,
    provider_config,
    request_part,
    streamed_response,
    tool_description,
)
from engine.status import FinishReason

__all__ = ["AnthropicModel", "tool_use_id"]

#: The API requires max_tokens; a generous default that callers override with config.
DEFAULT_MAX_TOKENS = 4096

_FINISH = {
    "end_turn": FinishReason.STOP,
    "tool_use": FinishReason.STOP,
    "stop_sequence": FinishReason.STOP,
    "max_tokens": FinishReason.LENGTH,
    "refusal": FinishReason.BLOCKED,
    "pause_turn": FinishReason.OTHER,
}


_NAMES = {**GENKIT_CONFIG_KEYS, "stopSequences": "stop_sequences"}
_ID_UNSAFE = re.compile(r"[^a-zA-Z0-9_-]")


def tool_use_id(ref: str | None) -> str:
    """The ``tool_use`` id sent for ``ref`` (the API's pattern is ``^[a-zA-Z0-9_-]+$``)."""
    return _ID_UNSAFE.sub("_", ref or "") or "call"


@dataclass
class _Block:
    """One content block being assembled from stream events."""

    kind: str
    text: list[str] = field(default_factory=list)
    ref: str | None = None
    name: str = ""
    partial_json: list[str] = field(default_factory=list)
    start_input: Any = None


class AnthropicModel(ProviderModel):
    """A :class:`~engine.model.Model` on the Anthropic Messages API.

    ``api_key`` and ``base_url`` left out are the SDK's own defaults (its
    ``ANTHROPIC_API_KEY``; its ``ANTHROPIC_BASE_URL``, else Anthropic's); no key at all is a
    ``ValueError``. ``headers`` are sent with every request (a beta flag, a gateway's routing).
    ``config`` holds default request parameters (``max_tokens`` defaults to 4096), which a
    request's own ``config`` overrides. ``stream=False`` asks for whole responses.
    ``max_retries`` is the SDK's own quick retry before an error reaches the engine.
    """

    provider = "anthropic"
    provider_label = "Anthropic"
    sdk_error = "AnthropicError"

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        headers: Mapping[str, str] | None = None,
        config: Mapping[str, Any] | None = None,
        timeout: float = 120.0,
        max_retries: int = 2,
        stream: bool = True,
        client: Any = None,
    ) -> None:
        self.model = model
        self.stream = stream
        self.defaults = {"max_tokens": DEFAULT_MAX_TOKENS, **(config or {})}
        self._sdk = import_sdk("anthropic", "AnthropicModel")
        if client is None:
            # Without api_key / base_url the SDK reads its own ANTHROPIC_API_KEY and
            # ANTHROPIC_BASE_URL; this module reads no environment.
            client = self._sdk.AsyncAnthropic(
                api_key=api_key or None,
                base_url=base_url or None,
                default_headers=dict(headers or {}),
                timeout=timeout,
                max_retries=max_retries,
            )
            if not client.api_key:
                raise ValueError(
                    "AnthropicModel needs an API key: pass api_key= or set ANTHROPIC_API_KEY."
                )
        self.client = client

    # -- request --------------------------------------------------------------------

    def build_request(self, request: ModelRequest) -> dict[str, Any]:
        """The keyword arguments of ``messages.create`` for ``request``."""
        params = provider_config(request.config, self.defaults, _NAMES)
        params["model"] = self.model
        system = "\n\n".join(m.text for m in request.messages if m.role == "system" and m.text)
        if system:
            params["system"] = system
        params["messages"] = _messages([m for m in request.messages if m.role != "system"])
        if request.tools:
            params["tools"] = [_tool(spec) for spec in request.tools]
        return params

    # -- call -----------------------------------------------------------------------

    async def _whole(self, params: dict[str, Any]) -> ModelResponse:
        return _response(await self.client.messages.create(**params))

    async def _streamed(self, params: dict[str, Any], on_chunk: ChunkSink) -> ModelResponse:
        blocks: dict[int, _Block] = {}
        stop: str | None = None
        input_tokens: int | None = None
        output_tokens: int | None = None
        stream = await self.client.messages.create(stream=True, **params)
        async for event in stream:
            kind = event.type
            if kind == "message_start":
                usage = event.message.usage
                input_tokens = _input_tokens(usage)
                output_tokens = getattr(usage, "output_tokens", None)
            elif kind == "content_block_start":
                block = event.content_block
                started = _Block(kind=block.type)
                if block.type == "tool_use":
                    started.ref, started.name = block.id, block.name
                    started.start_input = block.input
                elif block.type == "text" and block.text:
                    started.text.append(block.text)
                    await on_chunk([Part.of_text(block.text)])
                blocks[event.index] = started
            elif kind == "content_block_delta":
                delta = event.delta
                target = blocks.setdefault(event.index, _Block(kind="text"))
                if delta.type == "text_delta":
                    target.text.append(delta.text)
                    await on_chunk([Part.of_text(delta.text)])
                elif delta.type == "input_json_delta":
                    target.partial_json.append(delta.partial_json)
            elif kind == "message_delta":
                stop = event.delta.stop_reason or stop
                if event.usage is not None:
                    # Counts here are cumulative, not deltas. Some Anthropic-compatible
                    # gateways report the prompt only here (0 in message_start).
                    if event.usage.output_tokens is not None:
                        output_tokens = event.usage.output_tokens
                    input_tokens = _input_tokens(event.usage) or input_tokens
        text = "".join("".join(b.text) for _, b in sorted(blocks.items()) if b.kind == "text")
        requests = [_request_of(b) for _, b in sorted(blocks.items()) if b.kind == "tool_use"]
        usage = None
        if input_tokens is not None or output_tokens is not None:
            usage = ModelUsage(input_tokens=input_tokens, output_tokens=output_tokens)
        finished = finish_reason(_FINISH, stop)
        return await streamed_response(text, requests, on_chunk, finished, usage)


# -- mapping helpers ----------------------------------------------------------------------


def _tool(spec: ToolSpec) -> dict[str, Any]:
    schema = spec.input_schema or EMPTY_OBJECT_SCHEMA
    if schema.get("type") != "object":
        # The API only takes object schemas; a tool without one is offered as taking {}.
        schema = EMPTY_OBJECT_SCHEMA
    return {"name": spec.name, "description": tool_description(spec), "input_schema": schema}


def _blocks(message: Message) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    for part in message.content:
        if part.text:  # the API rejects empty text blocks
            blocks.append({"type": "text", "text": part.text})
        elif part.tool_request is not None:
            request = part.tool_request
            value = request.input
            if MALFORMED_INPUT in part.meta() or not isinstance(value, dict):
                # tool_use input must be an object: the raw text travels in the error result.
                value = {}
            blocks.append(
                {
                    "type": "tool_use",
                    "id": tool_use_id(request.ref),
                    "name": request.name,
                    "input": value,
                }
            )
        elif part.tool_response is not None:
            response = part.tool_response
            result: dict[str, Any] = {
                "type": "tool_result",
                "tool_use_id": tool_use_id(response.ref),
                "content": json_text(response.output),
            }
            if is_tool_error(part):
                result["is_error"] = True
            blocks.append(result)
        elif part.media is not None and str(part.media.get("url", "")).startswith("http"):
            blocks.append({"type": "image", "source": {"type": "url", "url": part.media["url"]}})
    return blocks


def _messages(messages: list[Message]) -> list[dict[str, Any]]:
    wire: list[dict[str, Any]] = []
    for message in messages:
        role = "assistant" if message.role == "model" else "user"
        blocks = _blocks(message)
        if not blocks:
            continue
        if wire and wire[-1]["role"] == role:
            if role == "user" and any(b["type"] == "tool_result" for b in blocks):
                # tool_result blocks must come first in their user turn.
                wire[-1]["content"] = blocks + wire[-1]["content"]
            else:
                wire[-1]["content"].extend(blocks)
        else:
            wire.append({"role": role, "content": blocks})
    return wire


def _input_tokens(usage: Any) -> int | None:
    """Prompt tokens including those served from or written to the prompt cache."""
    counts = [
        getattr(usage, name, None)
        for name in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
    ]
    reported = [c for c in counts if c is not None]
    return sum(reported) if reported else None


def _response(message: Any) -> ModelResponse:
    """A whole (non-streamed) message as a :class:`ModelResponse`."""
    content: list[Part] = []
    text = "".join(block.text for block in message.content if block.type == "text")
    if text:
        content.append(Part.of_text(text))
    for block in message.content:
        if block.type == "tool_use":
            content.append(Part.of_request(block.name, block.id, block.input))
    stop = message.stop_reason
    usage = message.usage
    return ModelResponse(
        message=Message(role="model", content=content),
        finish_reason=finish_reason(_FINISH, stop),
        usage=ModelUsage(
            input_tokens=_input_tokens(usage), output_tokens=getattr(usage, "output_tokens", None)
        )
        if usage is not None
        else None,
    )


def _request_of(block: _Block) -> Part:
    """The tool request a streamed ``tool_use`` block made: its input from the JSON deltas,
    or, when none came, from the block's start."""
    if block.partial_json:
        return request_part(block.name, block.ref, "".join(block.partial_json))
    return Part.of_request(block.name, block.ref, block.start_input or {})
