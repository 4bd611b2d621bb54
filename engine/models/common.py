"""Pieces both provider adapters share: the call itself (:class:`ProviderModel`), loading the
optional SDK, tool arguments, tool descriptions, request config."""

from __future__ import annotations

import importlib
import json
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any, ClassVar

import httpx

from engine.conversation.parts import MALFORMED_INPUT, TOOL_ERROR, Part
from engine.model import ChunkSink, ModelRequest, ModelResponse, ToolSpec

__all__ = [
    "EMPTY_OBJECT_SCHEMA",
    "GENKIT_CONFIG_KEYS",
    "ProviderModel",
    "arguments_text",
    "import_sdk",
    "is_tool_error",
    "json_text",
    "provider_config",
    "request_part",
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

    @abstractmethod
    def _classify(self, exc: Exception) -> Exception:
        """The engine error for an SDK or transport error."""
