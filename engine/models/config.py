"""Choosing a model from configuration: ``TURNSTILE_MODEL=provider:model``.

``TURNSTILE_MODEL`` names the provider and the model, e.g. ``openai:gpt-4o-mini`` or
``anthropic:claude-sonnet-4-5``; ``ollama:llama3.1`` is the OpenAI adapter pointed at a local
Ollama (``OPENAI_BASE_URL``, default ``http://localhost:11434/v1``). Credentials and endpoints
come from each SDK's usual variables: ``OPENAI_API_KEY``, ``OPENAI_BASE_URL``,
``ANTHROPIC_API_KEY``, ``ANTHROPIC_BASE_URL``. ``TURNSTILE_MODEL_HEADERS`` (a JSON object)
adds headers to every request, ``TURNSTILE_MODEL_TIMEOUT`` sets the request timeout in seconds.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from engine.model import Model

__all__ = ["DEFAULT_OLLAMA_URL", "PROVIDERS", "model_from_env", "model_from_spec"]

PROVIDERS = ("openai", "anthropic", "ollama")
DEFAULT_OLLAMA_URL = "http://localhost:11434/v1"


def model_from_spec(spec: str, *, env: Mapping[str, str] | None = None, **options: Any) -> Model:
    """The model named by ``spec`` (``provider:model``), configured from ``env``.

    ``options`` are passed to the adapter's constructor and win over the environment (e.g.
    ``model_from_spec("openai:gpt-4o", base_url=..., api_key=...)``). Raises ``ValueError``
    for a malformed spec or an unknown provider, ``ImportError`` naming the extra to install
    when the provider's SDK is missing.
    """
    env = os.environ if env is None else env
    provider, sep, name = spec.strip().partition(":")
    provider = provider.lower()
    if not sep or not name:
        raise ValueError(f"TURNSTILE_MODEL must look like 'provider:model', not {spec!r}.")
    if provider not in PROVIDERS:
        raise ValueError(
            f"Unknown model provider {provider!r} in {spec!r}; use one of {', '.join(PROVIDERS)}."
        )
    settings: dict[str, Any] = {}
    if env.get("TURNSTILE_MODEL_HEADERS"):
        headers = json.loads(env["TURNSTILE_MODEL_HEADERS"])
        if not isinstance(headers, dict):
            raise ValueError("TURNSTILE_MODEL_HEADERS must be a JSON object of header names.")
        settings["headers"] = {str(k): str(v) for k, v in headers.items()}
    if env.get("TURNSTILE_MODEL_TIMEOUT"):
        settings["timeout"] = float(env["TURNSTILE_MODEL_TIMEOUT"])
    if provider == "anthropic":
        from engine.models.anthropic import AnthropicModel

        settings["api_key"] = env.get("ANTHROPIC_API_KEY")
        settings["base_url"] = env.get("ANTHROPIC_BASE_URL")
        return AnthropicModel(name, **{**settings, **options})

    from engine.models.openai import OpenAIChatModel

    base_url = env.get("OPENAI_BASE_URL")
    if provider == "ollama":
        base_url = base_url or DEFAULT_OLLAMA_URL
    settings["base_url"] = base_url
    settings["api_key"] = env.get("OPENAI_API_KEY")
    return OpenAIChatModel(name, **{**settings, **options})


def model_from_env(env: Mapping[str, str] | None = None, **options: Any) -> Model | None:
    """The model ``TURNSTILE_MODEL`` names, or ``None`` when it is unset (use the scripted one).

    See :func:`model_from_spec` for the variables read and ``options``.
    """
    env = os.environ if env is None else env
    spec = env.get("TURNSTILE_MODEL", "").strip()
    if not spec:
        return None
    return model_from_spec(spec, env=env, **options)
