"""Pieces both provider adapters share: tool arguments, tool descriptions, request config."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from engine.model import ToolSpec
from engine.parts import MALFORMED_INPUT, TOOL_ERROR, Part

__all__ = [
    "EMPTY_OBJECT_SCHEMA",
    "GENKIT_CONFIG_KEYS",
    "arguments_text",
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
