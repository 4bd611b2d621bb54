"""Pieces both provider adapters share: the call itself (:class:`ProviderModel`), loading the
optional SDK, tool arguments, tool descriptions, request config, finish reasons and the
response a stream builds."""

from __future__ import annotations

import importlib
import json
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any, ClassVar

import httpx

from engine.conversation.parts import MALFORMED_INPUT, TOOL_ERROR, Message, Part
from engine.model import ChunkSink, ModelRequest, ModelResponse, ModelUsage, ToolSpec
from engine.models.errors import ProviderFailure, classify, provider_message
from engine.status import FinishReason

__all__ = [
    "EMPTY_OBJECT_SCHEMA",
    "GENKIT_CONFIG_KEYS",
    "ProviderModel",
    "arguments_text",
    "finish_reason",
    "import_sdk",
    "is_tool_error",
    "json_text",
    "provider_config",
    "request_part",
    "streamed_response",
    "tool_description",
]

#: Offered as the parameters of a tool declared without an input schema: both providers
#: require an object schema there.
EMPTY_OBJECT_SCHEMA: dict[str, Any] = {"type": "object", "properties": {}}

#: Genkit's generation-config names and the Chat Completions parameter for each (the
#: Anthropic adapter overrides ``stopSequences``).
GENKIT_CONFIG_KEYS: Mapping[str, str] = {
    "temperature": "temperature",
    "maxOutputTokens": "max_tokens",
    "topP": "top_p",
    "topK": "top_k",
    "stopSequences": "stop",
}


def json_text(value: Any) -> str:
    """``value`` as compact JSON text (tool outputs travel as strings on both wires)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def request_part(name: str, ref: str | None, arguments: str | None) -> Part:
    """A ``toolRequest`` part from a tool call's JSON argument text.

    Arguments that are not JSON (a model's slip, or a stream cut short) do not raise: the raw
    text is kept as the input and the part is marked ``malformedInput`` with the parse error,
    so the runner answers the model with a tool error it can correct.
    """
    text = arguments if arguments is not None else ""
    if not text.strip():
        return Part.of_request(name, ref, {})
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        return Part.of_request(name, ref, text, {MALFORMED_INPUT: str(exc)})
    return Part.of_request(name, ref, value)


def arguments_text(part: Part) -> str:
    """The argument text to send back for a request part (the raw text if it was malformed)."""
    request = part.tool_request
    assert request is not None
    if MALFORMED_INPUT in part.meta() and isinstance(request.input, str):
        return request.input
    return json_text(request.input if request.input is not None else {})


def is_tool_error(part: Part) -> bool:
    """Whether a ``toolResponse`` part carries an error for the model (see ``TOOL_ERROR``)."""
    return bool(part.meta().get(TOOL_ERROR))


def tool_description(spec: ToolSpec) -> str:
    """The tool's description, plus its output schema when it has one.

    Neither provider has a slot for what a tool returns; telling the model in the description
    lets it read the result it will get back.
    """
    text = spec.description or spec.name
    if spec.output_schema:
        text += "\n\nReturns JSON matching this schema: " + json_text(spec.output_schema)
    return text


def provider_config(
    config: Mapping[str, Any],
    defaults: Mapping[str, Any],
    names: Mapping[str, str] = GENKIT_CONFIG_KEYS,
) -> dict[str, Any]:
    """Request parameters: the adapter's defaults, then the request's config on top.

    Genkit's names (``maxOutputTokens``, ``topP``, ...) are translated; any other key is
    passed through unchanged, so provider-specific options still reach the provider.
    """
    merged = {names.get(key, key): value for key, value in defaults.items()}
    for key, value in config.items():
        merged[names.get(key, key)] = value
    return merged


def finish_reason(reasons: Mapping[str, FinishReason], reason: str | None) -> FinishReason:
    """Our finish reason for the provider's ``reason``, as its table ``reasons`` maps it
    (``unknown`` when it gave none, ``other`` for one the table does not know)."""
    if not reason:
        return FinishReason.UNKNOWN
    return reasons.get(reason, FinishReason.OTHER)


async def streamed_response(
    text: str,
    requests: list[Part],
    on_chunk: ChunkSink,
    finish: FinishReason,
    usage: ModelUsage | None,
) -> ModelResponse:
    """The response a stream built: its ``text`` (already sent to ``on_chunk`` delta by
    delta), then the tool ``requests``, which are complete only now and go to ``on_chunk``
    as one chunk."""
    if requests:
        await on_chunk([p.model_copy(deep=True) for p in requests])
    content = [Part.of_text(text)] if text else []
    content.extend(requests)
    return ModelResponse(
        message=Message(role="model", content=content), finish_reason=finish, usage=usage
    )


def import_sdk(module: str, adapter: str) -> Any:
    """The provider SDK ``module``, or an ImportError naming the extra that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(
            f"{adapter} needs the {module} SDK: pip install 'turnstile[{module}]'"
        ) from exc


class ProviderModel(ABC):
    """One model call on a provider SDK, the same for every provider: build the request,
    stream (or not), and classify the SDK's errors into transient and permanent ones."""

    #: ``<provider>`` in :attr:`name`, and the SDK module (and extra) that provides it.
    provider: ClassVar[str]
    #: The provider's name in error messages and error details.
    provider_label: ClassVar[str]
    #: The SDK's base exception class, by name within its module.
    sdk_error: ClassVar[str]

    model: str
    stream: bool
    # Typed loosely on purpose: the SDK is optional, and its request TypedDicts would add
    # nothing here that the tests against the wire format do not check.
    client: Any
    _sdk: Any

    @property
    def name(self) -> str:
        """``<provider>:<model>``."""
        return f"{self.provider}:{self.model}"

    async def aclose(self) -> None:
        """Close the HTTP client's connections (call it before the event loop ends)."""
        await self.client.close()

    async def generate(
        self, request: ModelRequest, on_chunk: ChunkSink | None = None
    ) -> ModelResponse:
        """Call the provider, streaming text deltas to ``on_chunk``; see the module docs."""
        params = self.build_request(request)
        try:
            if self.stream and on_chunk is not None:
                return await self._streamed(params, on_chunk)
            response = await self._whole(params)
        except (getattr(self._sdk, self.sdk_error), httpx.TransportError) as exc:
            # httpx errors escape the SDK when a connection breaks in the middle of a stream.
            raise self._classify(exc) from exc
        if on_chunk is not None and response.message.content:
            # Not streamed: the whole answer is one chunk, so stream consumers still see it.
            await on_chunk([p.model_copy(deep=True) for p in response.message.content])
        return response

    @abstractmethod
    def build_request(self, request: ModelRequest) -> dict[str, Any]:
        """The keyword arguments of the SDK's create call for ``request``."""

    @abstractmethod
    async def _whole(self, params: dict[str, Any]) -> ModelResponse:
        """One non-streamed call."""

    @abstractmethod
    async def _streamed(self, params: dict[str, Any], on_chunk: ChunkSink) -> ModelResponse:
        """One streamed call, text deltas to ``on_chunk`` as they arrive."""

    def _classify(self, exc: Exception) -> Exception:
        """The engine error for an SDK or transport error (both SDKs name their errors
        alike): transient for timeouts and lost connections, else as the status and the
        error body say (see :func:`~engine.models.errors.classify`)."""
        sdk = self._sdk
        label = self.provider_label
        fallback = str(exc) or type(exc).__name__
        if isinstance(exc, sdk.APITimeoutError | httpx.TimeoutException):
            return classify(ProviderFailure(label, fallback, timeout=True))
        if isinstance(exc, sdk.APIConnectionError | httpx.TransportError):
            return classify(ProviderFailure(label, fallback, connection=True))
        message, kind, code = provider_message(
            getattr(exc, "body", None), getattr(exc, "message", fallback)
        )
        status = exc.status_code if isinstance(exc, sdk.APIStatusError) else None
        kind = self._error_type(exc, status, kind)
        return classify(
            ProviderFailure(label, message, http_status=status, error_type=kind, code=code)
        )

    def _error_type(self, exc: Exception, status: int | None, kind: str | None) -> str | None:
        """The error type :meth:`_classify` judges ``exc`` by: the body's ``kind`` unless
        the provider knows better."""
        return kind
