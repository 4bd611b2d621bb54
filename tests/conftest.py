"""Shared fixtures, the behaviour suite's parametrisation, and the tier markers.

Markers (registered in pyproject.toml) are applied here, not by hand: ``integration``,
``acceptance`` and ``perf`` by directory (and per backend for the behaviour suite, see
``tests/behaviour_suite.py``); ``postgres`` to every test that opens a PostgreSQL database
(:func:`tests.databases.uses_postgres`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Generator, Iterator
from pathlib import Path

import pytest

from examples.banking import BankingApp
from tests import databases
from tests.behaviour_suite import BACKENDS, parameters
from tests.behaviour_suite import TEST_STATE_KEYS as TEST_STATE_KEYS
from tests.fake_providers import FakeAnthropic, FakeOpenAI

#: The tier marker of each directory under tests/ (tests/unit has none).
TIER_DIRECTORIES = ("integration", "acceptance", "perf")
_TESTS = Path(__file__).resolve().parent


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A test marked ``behaviour`` runs once per backend (those the marker names, or all)."""
    marker = metafunc.definition.get_closest_marker("behaviour")
    if marker is not None:
        metafunc.parametrize("app", parameters(marker.args), indirect=True)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark each test with its directory's tier, and ``postgres`` if it opens a database."""
    for item in items:
        relative = item.path.resolve().relative_to(_TESTS)
        if relative.parts[0] in TIER_DIRECTORIES:
            item.add_marker(relative.parts[0])
        if databases.uses_postgres(item):
            item.add_marker("postgres")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, object, object]:
    """Let tests/databases.py see which test opens a database (to refuse unmarked ones)."""
    databases.running_test = item
    try:
        return (yield)
    finally:
        databases.running_test = None


@pytest.fixture
async def app(request: pytest.FixtureRequest) -> AsyncIterator[BankingApp]:
    """A fresh banking example: in memory (own engine, own store, own transfer log), or on
    the behaviour-suite backend the test is parametrised with."""
    async with BACKENDS[getattr(request, "param", "memory")].open(request) as opened:
        yield opened


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


@pytest.fixture(scope="session", autouse=True)
def _drop_test_databases() -> Iterator[None]:
    """Drop the template databases this run created."""
    yield
    databases.cleanup()
