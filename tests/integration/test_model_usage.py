"""Token usage reported by the model is summed on the turn, in memory and in SQL columns."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from engine import Message, ScriptedModel
from engine.errors import LeaseLostError
from engine.model import ChunkSink, ModelRequest, ModelResponse, ModelUsage
from engine.store import NewTurn, RoundRecord, SessionStore, TurnInput
from examples.banking import build
from stores import SqlSessionStore
from tests.conftest import TEST_STATE_KEYS


class MeteredModel:
    """The scripted model, reporting 100 + n input and 10 + n output tokens on call n."""

    def __init__(self, *, report_output: bool = True) -> None:
        self.inner = ScriptedModel()
        self.calls = 0
        self.report_output = report_output

    @property
    def name(self) -> str:
        return "metered"

    async def generate(
        self, request: ModelRequest, on_chunk: ChunkSink | None = None
    ) -> ModelResponse:
        self.calls += 1
        response = await self.inner.generate(request, on_chunk)
        response.usage = ModelUsage(
            input_tokens=100 + self.calls,
            output_tokens=10 + self.calls if self.report_output else None,
        )
        return response


async def test_usage_is_summed_per_turn(store: SessionStore) -> None:
    """The paused turn holds its one call's usage; the resumed turn the sum of its two calls."""
    app = build(store=store, model=MeteredModel(), state_keys=TEST_STATE_KEYS, execution="inline")
    chat = app.banking_agent.chat()
    paused = await chat.send("Transfer $500 to my savings account.")
    done = await chat.resume(respond=[paused.interrupts[0].respond({"approved": True})])
    assert done.text == "Done. Transaction txn-500-my-savings-account."
    first = await store.get_turn(str(paused.snapshot_id))
    second = await store.get_turn(str(done.snapshot_id))
    assert first is not None and second is not None
    assert (first.input_tokens, first.output_tokens) == (101, 11)
    assert (second.input_tokens, second.output_tokens) == (102 + 103, 12 + 13)
    if isinstance(store, SqlSessionStore):
        with store.db.engine.connect() as connection:
            rows = connection.execute(
                sa.text("SELECT id, input_tokens, output_tokens FROM turns ORDER BY seq")
            ).all()
        assert [tuple(r) for r in rows] == [
            (paused.snapshot_id, 101, 11),
            (done.snapshot_id, 205, 25),
        ]


async def test_unreported_counts_stay_null(store: SessionStore) -> None:
    """A model reporting no usage (or only input tokens) leaves the missing totals null."""
    app = build(store=store, state_keys=TEST_STATE_KEYS, execution="inline")
    res = await app.banking_agent.chat().send("hello")
    turn = await store.get_turn(str(res.snapshot_id))
    assert turn is not None and (turn.input_tokens, turn.output_tokens) == (None, None)

    app = build(
        store=store,
        model=MeteredModel(report_output=False),
        state_keys=TEST_STATE_KEYS,
        execution="inline",
    )
    res = await app.banking_agent.chat().send("hello")
    turn = await store.get_turn(str(res.snapshot_id))
    assert turn is not None and (turn.input_tokens, turn.output_tokens) == (101, None)


async def test_usage_written_under_a_lost_lease_is_not_counted(store: SessionStore) -> None:
    """save_round's usage is fenced like its messages: a stale lease adds nothing."""
    hello = Message.user("hi")
    await store.create_turn(
        NewTurn(
            id="t1",
            session_id="s1",
            agent="a",
            input=TurnInput(kind="message", message=hello),
            initial_messages=[hello],
        )
    )
    claimed = await store.claim_turn("t1", owner="w", lease_seconds=30)
    answer = RoundRecord(
        round=1, messages=[Message.model_validate({"role": "model"})], committed=False
    )
    await store.save_round(
        "t1", lease_token=claimed.turn.lease_token, round=answer, usage=ModelUsage(input_tokens=5)
    )
    with pytest.raises(LeaseLostError):
        await store.save_round(
            "t1",
            lease_token=claimed.turn.lease_token + 1,
            round=answer,
            usage=ModelUsage(input_tokens=100, output_tokens=100),
        )
    turn = await store.get_turn("t1")
    assert turn is not None and (turn.input_tokens, turn.output_tokens) == (5, None)
