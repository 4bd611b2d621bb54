"""Fixtures of the model-adapter tests: the fake OpenAI and Anthropic servers."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.fake_providers import FakeAnthropic, FakeOpenAI


@pytest.fixture(scope="session")
def _openai_server() -> Iterator[FakeOpenAI]:
    server = FakeOpenAI()
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def _anthropic_server() -> Iterator[FakeAnthropic]:
    server = FakeAnthropic()
    server.start()
    yield server
    server.stop()


@pytest.fixture
def fake_openai(_openai_server: FakeOpenAI) -> FakeOpenAI:
    """The fake OpenAI endpoint, with an empty script and recording."""
    _openai_server.reset()
    return _openai_server


@pytest.fixture
def fake_anthropic(_anthropic_server: FakeAnthropic) -> FakeAnthropic:
    """The fake Anthropic endpoint, with an empty script and recording."""
    _anthropic_server.reset()
    return _anthropic_server
