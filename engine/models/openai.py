"""``OpenAIChatModel``: any OpenAI-compatible Chat Completions endpoint.

OpenAI itself, Azure OpenAI, vLLM, Ollama, LM Studio and the LiteLLM proxy all speak the same
``POST /chat/completions`` wire format, so one adapter built on the official ``openai`` SDK
serves them all; only ``base_url``, ``api_key`` and headers differ.

Mapping (Turnstile/Genkit → Chat Completions and back):

* ``system`` → ``{"role": "system"}``; ``user`` → ``{"role": "user"}``;
* ``model`` → ``{"role": "assistant", "content", "tool_calls": [{id: ref, function: {name,
  arguments}}]}``; ``tool`` → one ``{"role": "tool", "tool_call_id": ref}`` message per
  ``toolResponse`` (the output as JSON text);
* every tool (interrupts included: to the model an interrupt is an ordinary tool) →
  ``{"type": "function", "function": {name, description, parameters}}``;
* streamed ``delta.content`` goes to the chunk sink as it arrives; streamed
  ``delta.tool_calls[i].function.arguments`` fragments are joined per index and become complete
  ``toolRequest`` parts at the end of the stream (sent to the sink as one chunk);
* ``finish_reason``: ``stop``/``tool_calls`` → ``stop``, ``length`` → ``length``,
  ``content_filter`` → ``blocked``; ``usage`` → :class:`~engine.model.ModelUsage`.

The SDK is an optional extra (``pip install turnstile[openai]``) imported when a model is
constructed, so ``import engine`` works without it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from engine.conversation.parts import Message, Part
from engine.model import ChunkSink, ModelRequest, ModelResponse, ModelUsage, ToolSpec
from engine.models.common import (
    EMPTY_OBJECT_SCHEMA,
    ProviderModel,
    arguments_text,
    finish_reason,
    import_sdk,
    json_text,
    provider_config,
    request_part,
    streamed_response,
    tool_description,
)
from engine.status import FinishReason

__all__ = ["OpenAIChatModel"]

#: OpenAI's own endpoint, which refuses a request without a real key.
OPENAI_HOST = "api.openai.com"

_FINISH = {
    "stop": FinishReason.STOP,
    "tool_calls": FinishReason.STOP,
    "function_call": FinishReason.STOP,
    "length": FinishReason.LENGTH,
    "content_filter": FinishReason.BLOCKED,
}


@dataclass
class _PendingCall:
    """One tool call being assembled from stream fragments."""

    ref: str | None = None
    name: str = ""
    arguments: list[str] = field(default_factory=list)


class OpenAIChatModel(ProviderModel):
    """A :class:`~engine.model.Model` on an OpenAI-compatible Chat Completions endpoint.

    ``base_url`` points at the endpoint; ``api_key`` is its key. Either left out is the
    SDK's own default (its ``OPENAI_BASE_URL``, else OpenAI; its ``OPENAI_API_KEY``), and an
    endpoint other than OpenAI's that gets no key at all gets a placeholder (local servers
    need none). ``headers`` are sent with every request (Azure's ``api-key``, a proxy's
    routing header). ``config`` holds default request parameters (``temperature``, ...), which
    a request's own ``config`` overrides. ``stream=False`` asks for whole responses (for
    servers without streaming). ``max_retries`` is the SDK's own quick retry before an error
    reaches the engine, whose retries then back off per turn; ``stream_usage`` asks for the
    usage chunk of a stream (``stream_options.include_usage``; turn it off for servers that
    reject the option).
    """

    provider = "openai"
    provider_label = "OpenAI"
    sdk_error = "OpenAIError"

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
        stream_usage: bool = True,
        client: Any = None,
    ) -> None:
        self.model = model
        self.stream = stream
        self.stream_usage = stream_usage
        self.defaults = dict(config or {})
        self._sdk = import_sdk("openai", "OpenAIChatModel")
        if client is None:
            options: dict[str, Any] = {
                "base_url": base_url or None,
                "default_headers": dict(headers or {}),
                "timeout": timeout,
                "max_retries": max_retries,
            }
            try:
                # Without api_key / base_url the SDK reads its own OPENAI_API_KEY and
                # OPENAI_BASE_URL; this module reads no environment.
                client = self._sdk.AsyncOpenAI(api_key=api_key or None, **options)
            except self._sdk.OpenAIError:
                # No key anywhere. Ollama, vLLM and LM Studio accept any key, but the SDK
                # insists on one; OpenAI's own endpoint would refuse every request.
                client = self._sdk.AsyncOpenAI(api_key="not-needed", **options)
                if client.base_url.host == OPENAI_HOST:
                    raise ValueError(
                        "OpenAIChatModel needs an API key: pass api_key= or set OPENAI_API_KEY."
                    ) from None
        self.client = client

    # -- request --------------------------------------------------------------------

    def build_request(self, request: ModelRequest) -> dict[str, Any]:
        """The keyword arguments of ``chat.completions.create`` for ``request``."""
        params = provider_config(request.config, self.defaults)
        params["model"] = self.model
        params["messages"] = _messages(request.messages)
        if request.tools:
            params["tools"] = [_tool(spec) for spec in request.tools]
        return params

    # -- call -----------------------------------------------------------------------

    async def _whole(self, params: dict[str, Any]) -> ModelResponse:
        return _response(await self.client.chat.completions.create(**params))

    async def _streamed(self, params: dict[str, Any], on_chunk: ChunkSink) -> ModelResponse:
        params["stream"] = True
        if self.stream_usage:
            params["stream_options"] = {"include_usage": True}
        texts: list[str] = []
        calls: dict[int, _PendingCall] = {}
        finish: str | None = None
        refused = False
        usage: ModelUsage | None = None
        stream = await self.client.chat.completions.create(**params)
        async for chunk in stream:
            if getattr(chunk, "usage", None) is not None:
                usage = _usage(chunk.usage)
            for choice in chunk.choices or []:
                if choice.index != 0:  # n > 1 is not requested; ignore stray choices
                    continue
                delta = choice.delta
                if delta is not None and delta.content:
                    texts.append(delta.content)
                    await on_chunk([Part.of_text(delta.content)])
                if delta is not None and getattr(delta, "refusal", None):
                    # The model declined (OpenAI's refusal channel): show it, end blocked.
                    refused = True
                    texts.append(delta.refusal)
                    await on_chunk([Part.of_text(delta.refusal)])
                for fragment in (delta.tool_calls if delta is not None else None) or []:
                    _merge_fragment(calls, fragment)
                if choice.finish_reason:
                    finish = choice.finish_reason
        requests = [
            request_part(c.name, c.ref, "".join(c.arguments)) for _, c in sorted(calls.items())
        ]
        finished = FinishReason.BLOCKED if refused else finish_reason(_FINISH, finish)
        return await streamed_response("".join(texts), requests, on_chunk, finished, usage)

    def _error_type(self, exc: Exception, status: int | None, kind: str | None) -> str | None:
        if status is None and isinstance(exc, self._sdk.APIError):
            # An error object inside a 200 stream: the server broke off mid-answer.
            return kind or "server_error"
        return kind


# -- mapping helpers ----------------------------------------------------------------------


def _tool(spec: ToolSpec) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": spec.name,
            "description": tool_description(spec),
            "parameters": spec.input_schema or EMPTY_OBJECT_SCHEMA,
        },
    }


def _user_content(message: Message) -> str | list[dict[str, Any]]:
    """Plain text when the message is only text (what every compatible server accepts);
    content parts when it carries media."""
    if all(p.media is None for p in message.content):
        return message.text
    parts: list[dict[str, Any]] = []
    for part in message.content:
        if part.text:
            parts.append({"type": "text", "text": part.text})
        elif part.media is not None and part.media.get("url"):
            parts.append({"type": "image_url", "image_url": {"url": part.media["url"]}})
    return parts


def _messages(messages: list[Message]) -> list[dict[str, Any]]:
    wire: list[dict[str, Any]] = []
    for message in messages:
        if message.role == "system":
            wire.append({"role": "system", "content": message.text})
        elif message.role == "user":
            wire.append({"role": "user", "content": _user_content(message)})
        elif message.role == "model":
            calls = [
                {
                    "id": part.tool_request.ref,
                    "type": "function",
                    "function": {"name": part.tool_request.name, "arguments": arguments_text(part)},
                }
                for part in message.content
                if part.tool_request is not None
            ]
            # content may be null only when the message carries tool calls.
            entry: dict[str, Any] = {
                "role": "assistant",
                "content": message.text or (None if calls else ""),
            }
            if calls:
                entry["tool_calls"] = calls
            wire.append(entry)
        else:
            # Chat Completions has one tool message per call, matched by tool_call_id.
            for part in message.content:
                response = part.tool_response
                if response is not None:
                    wire.append(
                        {
                            "role": "tool",
                            "tool_call_id": response.ref,
                            "content": json_text(response.output),
                        }
                    )
    return wire


def _usage(usage: Any) -> ModelUsage:
    return ModelUsage(
        input_tokens=getattr(usage, "prompt_tokens", None),
        output_tokens=getattr(usage, "completion_tokens", None),
    )


def _response(completion: Any) -> ModelResponse:
    """A whole (non-streamed) completion as a :class:`ModelResponse`."""
    choice = completion.choices[0]
    content: list[Part] = []
    refusal = getattr(choice.message, "refusal", None)
    if choice.message.content or refusal:
        content.append(Part.of_text(str(choice.message.content or refusal)))
    for call in choice.message.tool_calls or []:
        content.append(request_part(call.function.name, call.id, call.function.arguments))
    finished = FinishReason.BLOCKED if refusal else finish_reason(_FINISH, choice.finish_reason)
    return ModelResponse(
        message=Message(role="model", content=content),
        finish_reason=finished,
        usage=_usage(completion.usage) if completion.usage is not None else None,
    )


def _merge_fragment(calls: dict[int, _PendingCall], fragment: Any) -> None:
    """Add one streamed tool-call fragment to the call it continues (or starts)."""
    index = getattr(fragment, "index", None)
    if index is None:  # a lax server: a new id starts a call, else continue one
        index = len(calls) if fragment.id or not calls else max(calls)
    pending = calls.setdefault(index, _PendingCall())
    if fragment.id:
        pending.ref = fragment.id
    function = fragment.function
    if function is not None:
        if function.name:
            # Sent whole in the first fragment; some servers repeat it.
            pending.name = function.name
        if function.arguments:
            pending.arguments.append(function.arguments)
