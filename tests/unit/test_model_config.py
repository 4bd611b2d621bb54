"""Choosing a model from TURNSTILE_MODEL, and the optional SDKs staying optional."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from engine.models import AnthropicModel, OpenAIChatModel, model_from_spec
from engine.models.config import DEFAULT_OLLAMA_URL
from stores.settings import InvalidSettingsError, Settings, read_settings

ROOT = Path(__file__).resolve().parents[2]


def python(code: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter at the project root."""
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=False
    )


@pytest.fixture(autouse=True)
def no_model_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    """No model, key or endpoint comes from the test's own environment."""
    for variable in Settings.variables():
        if "MODEL" in variable or variable.startswith(("OPENAI_", "ANTHROPIC_")):
            monkeypatch.delenv(variable, raising=False)


async def test_unset_means_no_model(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without TURNSTILE_MODEL the caller keeps its default (the scripted model)."""
    assert read_settings().build_model() is None
    monkeypatch.setenv("TURNSTILE_MODEL", "  ")
    assert read_settings().build_model() is None


async def test_openai_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """openai:<model> builds the OpenAI adapter with the key, base URL and headers given."""
    for variable, value in {
        "TURNSTILE_MODEL": "openai:gpt-4o-mini",
        "OPENAI_API_KEY": "sk-env",
        "OPENAI_BASE_URL": "http://127.0.0.1:9/v1",
        "TURNSTILE_MODEL_HEADERS": '{"X-Team": "payments"}',
        "TURNSTILE_MODEL_TIMEOUT": "7",
    }.items():
        monkeypatch.setenv(variable, value)
    model = read_settings().build_model()
    assert isinstance(model, OpenAIChatModel) and model.name == "openai:gpt-4o-mini"
    assert str(model.client.base_url) == "http://127.0.0.1:9/v1/"
    assert model.client.api_key == "sk-env"
    assert model.client.default_headers["X-Team"] == "payments"
    assert model.client.timeout == 7
    await model.aclose()


async def test_anthropic_and_ollama_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """anthropic:<model> uses ANTHROPIC_API_KEY; ollama:<model> is the OpenAI adapter on the
    local Ollama endpoint, needing no key."""
    monkeypatch.setenv("TURNSTILE_MODEL", "anthropic:claude-sonnet-4-5")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-env")
    claude = read_settings().build_model()
    assert isinstance(claude, AnthropicModel) and claude.name == "anthropic:claude-sonnet-4-5"
    assert claude.client.api_key == "sk-ant-env"
    monkeypatch.setenv("TURNSTILE_MODEL", "ollama:llama3.1")
    llama = read_settings().build_model()
    assert isinstance(llama, OpenAIChatModel) and llama.model == "llama3.1"
    assert str(llama.client.base_url) == DEFAULT_OLLAMA_URL + "/"
    await claude.aclose()
    await llama.aclose()


async def test_options_win_over_the_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keyword arguments of build_model() replace what the variables configure."""
    monkeypatch.setenv("TURNSTILE_MODEL", "openai:gpt-4o-mini")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env")
    model = read_settings().build_model(api_key="sk-given", base_url="http://127.0.0.1:9/v1")
    assert isinstance(model, OpenAIChatModel)
    assert model.client.api_key == "sk-given"
    await model.aclose()


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("gpt-4o", "must be named as 'provider:model'"),
        ("gemini:pro", "Unknown model provider 'gemini'"),
        ("openai:gpt-4o", "OPENAI_API_KEY"),
        ("anthropic:claude-sonnet-4-5", "ANTHROPIC_API_KEY"),
    ],
)
def test_bad_configuration_is_refused_clearly(spec: str, message: str) -> None:
    """A malformed spec, an unknown provider or a missing key is a ValueError saying so."""
    with pytest.raises(ValueError, match=message):
        model_from_spec(spec)


def test_a_bad_model_variable_is_refused_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    """TURNSTILE_MODEL naming no known provider is refused when the settings are read."""
    monkeypatch.setenv("TURNSTILE_MODEL", "gemini:pro")
    with pytest.raises(InvalidSettingsError, match="TURNSTILE_MODEL='gemini:pro': Unknown"):
        read_settings()


def test_importing_the_adapters_loads_no_sdk() -> None:
    """engine and engine.models import without the openai and anthropic SDKs being loaded."""
    out = python(
        "import sys, engine, engine.models, engine.models.openai, engine.models.anthropic; "
        "print(sorted({'openai', 'anthropic'} & set(sys.modules)))"
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_a_missing_sdk_names_the_extra_to_install() -> None:
    """Building an adapter without its SDK raises ImportError naming the pip extra."""
    out = python(
        "import sys; sys.modules['openai'] = None; sys.modules['anthropic'] = None\n"
        "from engine.models import OpenAIChatModel, AnthropicModel\n"
        "for cls in (OpenAIChatModel, AnthropicModel):\n"
        "    try:\n"
        "        cls('m', api_key='k')\n"
        "    except ImportError as exc:\n"
        "        print(exc)\n"
    )
    assert out.returncode == 0, out.stderr
    assert "pip install 'turnstile[openai]'" in out.stdout
    assert "pip install 'turnstile[anthropic]'" in out.stdout


def test_the_banking_example_uses_the_configured_model() -> None:
    """examples.banking runs on the scripted model unless TURNSTILE_MODEL names another."""
    probe = "import examples.banking as b; print(b.ai.model.name)"
    base = {"PATH": "/usr/bin:/bin", "TURNSTILE_DATABASE_URL": "sqlite://"}
    plain = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, env=base
    )
    assert plain.stdout.strip() == "scripted", plain.stderr
    env = {**base, "TURNSTILE_MODEL": "openai:gpt-4o-mini", "OPENAI_API_KEY": "sk-x"}
    real = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, env=env
    )
    assert real.stdout.strip() == "openai:gpt-4o-mini", real.stderr
