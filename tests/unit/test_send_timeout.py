"""``send(timeout=)`` of a turn run in the caller, and where the unclaimed-turn warning's
time comes from."""

from __future__ import annotations

import pytest

from engine import Engine, ScriptedModel, TurnStatus
from engine.errors import InvalidArgumentError, TurnTimeoutError
from stores import InMemorySessionStore
from stores.settings import InvalidSettingsError, read_settings
from tests.conftest import TEST_STATE_KEYS

SLOW = "slow one two three four five six"


async def test_an_inline_turn_goes_on_after_its_caller_timed_out() -> None:
    """The caller gets the typed timeout; the turn keeps running in this process, can still
    be aborted, and settles for a later wait."""
    ai = Engine(model=ScriptedModel(slow_chunk_delay=0.1), state_keys=TEST_STATE_KEYS)
    agent = ai.define_agent(name="inline", store=InMemorySessionStore())
    chat = agent.chat()
    with pytest.raises(TurnTimeoutError) as expired:
        await chat.send(SLOW, timeout=0.2)
    snapshot_id = expired.value.snapshot_id
    assert snapshot_id is not None and chat.snapshot_id == snapshot_id
    assert "still pending" in expired.value.message
    settled = await agent.wait(snapshot_id, timeout=5)
    assert settled.text == f"Echo: {SLOW}"

    with pytest.raises(TurnTimeoutError) as again:
        await chat.send(SLOW, timeout=0.2)
    assert again.value.snapshot_id is not None
    assert await agent.abort(again.value.snapshot_id) is TurnStatus.PENDING
    stopped = await agent.wait(again.value.snapshot_id, timeout=5)
    assert stopped.status is TurnStatus.ABORTED


async def test_a_timeout_must_be_positive() -> None:
    """``timeout=0`` is refused before anything is written."""
    ai = Engine(model=ScriptedModel(), state_keys=TEST_STATE_KEYS)
    store = InMemorySessionStore()
    agent = ai.define_agent(name="inline", store=store)
    with pytest.raises(InvalidArgumentError, match="timeout"):
        await agent.chat().send("hi", timeout=0)


def test_the_warning_time_comes_from_the_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """``TURNSTILE_UNCLAIMED_WARNING``: seconds, 0 for never, handed to the engine's agents
    by the settings; anything else is refused by name; unset means 30 s."""
    monkeypatch.delenv("TURNSTILE_UNCLAIMED_WARNING", raising=False)
    assert read_settings().unclaimed_warning == 30.0
    assert Engine(model=ScriptedModel()).define_agent(name="a").unclaimed_warning == 30.0
    monkeypatch.setenv("TURNSTILE_UNCLAIMED_WARNING", "0")
    assert read_settings().unclaimed_warning == 0.0
    monkeypatch.setenv("TURNSTILE_UNCLAIMED_WARNING", "2.5")
    ai = Engine(model=ScriptedModel(), **read_settings().engine_options())
    assert ai.define_agent(name="a").unclaimed_warning == 2.5
    for bad in ("soon", "-1", "nan", "inf"):
        monkeypatch.setenv("TURNSTILE_UNCLAIMED_WARNING", bad)
        with pytest.raises(InvalidSettingsError, match="TURNSTILE_UNCLAIMED_WARNING"):
            read_settings()


def test_an_engine_refuses_a_bad_warning_time() -> None:
    """``Engine(unclaimed_warning=)`` must be a finite number of seconds >= 0."""
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="unclaimed_warning must be a number of seconds"):
            Engine(model=ScriptedModel(), unclaimed_warning=bad)
