"""Adapters for real LLM providers, choosing one by name (``provider:model``), and
:class:`FunctionModel`, the offline model you program yourself.

``OpenAIChatModel`` (any OpenAI-compatible Chat Completions endpoint) and ``AnthropicModel``
(the Messages API) implement :class:`engine.model.Model`. Their SDKs are optional extras
(``pip install turnstile[openai]`` / ``[anthropic]``), imported only when a model is built:
importing this package needs neither. See ``docs/models.md``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from engine.models.config import model_from_spec, parse_model_spec
from engine.models.errors import (
    ModelAuthenticationError,
    ModelContentPolicyError,
    ModelError,
    ModelNotFoundError,
    ModelPermissionError,
    ModelRequestError,
)
from engine.models.function import FunctionModel, ModelFunction, ModelOutputError

if TYPE_CHECKING:
    from engine.models.anthropic import AnthropicModel
    from engine.models.openai import OpenAIChatModel

__all__ = [
    "AnthropicModel",
    "FunctionModel",
    "ModelAuthenticationError",
    "ModelContentPolicyError",
    "ModelError",
    "ModelFunction",
    "ModelNotFoundError",
    "ModelOutputError",
    "ModelPermissionError",
    "ModelRequestError",
    "OpenAIChatModel",
    "model_from_spec",
    "parse_model_spec",
]


def __getattr__(name: str) -> Any:
    # The adapter modules are light (their SDKs load in the constructors), but loading them
    # on first use keeps `import engine.models` free of httpx as well.
    if name == "OpenAIChatModel":
        from engine.models.openai import OpenAIChatModel

        return OpenAIChatModel
    if name == "AnthropicModel":
        from engine.models.anthropic import AnthropicModel

        return AnthropicModel
    raise AttributeError(f"module 'engine.models' has no attribute {name!r}")
