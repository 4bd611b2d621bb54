"""The engine's behaviour suite over each model: scripted, OpenAI and Anthropic adapters.

The test functions are the unit tier's (imported, so pytest collects them here too). The
``app`` fixture below overrides the default one: the banking app runs on the scripted model
directly, and on :class:`~engine.models.OpenAIChatModel` and
:class:`~engine.models.AnthropicModel` talking over real HTTP to the local fake provider,
whose answers come from the same scripted rules. Passing the same suite means the adapters'
mapping (messages, tools, ids, streaming) loses nothing the engine relies on.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from examples.banking import BankingApp, build
from tests.behaviour_suite import *  # noqa: F403 - the suite, collected again here
from tests.conftest import TEST_STATE_KEYS
from tests.fake_providers import FakeAnthropic, FakeOpenAI, anthropic_model, openai_model


@pytest.fixture(params=["scripted", "openai", "anthropic"])
async def app(
    request: pytest.FixtureRequest, fake_openai: FakeOpenAI, fake_anthropic: FakeAnthropic
) -> AsyncIterator[BankingApp]:
    """The banking app on each model (the adapters' HTTP clients closed afterwards)."""
    model: Any = None
    if request.param == "openai":
        model = openai_model(fake_openai)
    elif request.param == "anthropic":
        model = anthropic_model(fake_anthropic)
    yield build(model=model, state_keys=TEST_STATE_KEYS)
    if model is not None:
        await model.aclose()


@pytest.fixture(autouse=True)
def _went_over_http(
    request: pytest.FixtureRequest, fake_openai: FakeOpenAI, fake_anthropic: FakeAnthropic
) -> Iterator[None]:
    """After each adapter run, the fake provider must have been asked (no silent fallback)."""
    yield None
    kind = request.node.callspec.params.get("app")
    server = {"openai": fake_openai, "anthropic": fake_anthropic}.get(kind)
    if server is not None:
        assert server.requests, f"the {kind} adapter never reached its fake server"
