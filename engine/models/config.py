"""Choosing a model by name: ``provider:model``, e.g. ``openai:gpt-4o-mini``.

``openai:`` and ``anthropic:`` are the two adapters; ``ollama:llama3.1`` is the OpenAI adapter
pointed at a local Ollama (``http://localhost:11434/v1`` unless a ``base_url`` is given).
Everything else — key, endpoint, headers, timeout — is passed in as the adapter's keyword
arguments: this module reads no environment. ``stores.settings.Settings.build_model`` is
what turns ``TURNSTILE_MODEL`` and the provider variables into such a call.
"""

from __future__ import annotations

from typing import Any

from engine.model import Model

__all__ = ["DEFAULT_OLLAMA_URL", "PROVIDERS", "model_from_spec", "parse_model_spec"]

PROVIDERS = ("openai", "anthropic", "ollama")
DEFAULT_OLLAMA_URL = "http://localhost:11434/v1"


def parse_model_spec(spec: str) -> tuple[str, str]:
    """``(provider, model)`` of ``spec``; raises ``ValueError`` for a spec that is not
    ``provider:model`` or names an unknown provider."""
    provider, sep, name = spec.strip().partition(":")
    provider = provider.lower()
    if not sep or not name:
        raise ValueError(f"A model must be named as 'provider:model', not {spec!r}.")
    if provider not in PROVIDERS:
        raise ValueError(
            f"Unknown model provider {provider!r} in {spec!r}; use one of {', '.join(PROVIDERS)}."
        )
    return provider, name


def model_from_spec(spec: str, **options: Any) -> Model:
    """The model named by ``spec`` (``provider:model``), built with ``options``: the
    adapter's keyword arguments (``api_key``, ``base_url``, ``headers``, ``timeout``, ...).

    Options not given keep the adapter's defaults (whose SDK reads its own key variable).
    Raises ``ValueError`` for a malformed spec, an unknown provider or a missing key,
    ``ImportError`` naming the extra to install when the provider's SDK is missing.
    """
    provider, name = parse_model_spec(spec)
    if provider == "anthropic":
        from engine.models.anthropic import AnthropicModel

        return AnthropicModel(name, **options)

    from engine.models.openai import OpenAIChatModel

    if provider == "ollama" and not options.get("base_url"):
        options = {**options, "base_url": DEFAULT_OLLAMA_URL}
    return OpenAIChatModel(name, **options)
