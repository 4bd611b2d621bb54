"""The benchmark's schema what-ifs (``bench/what_if/*.sql``) stay runnable experiments."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from examples.banking import build
from stores import SqlSessionStore
from tests.conftest import TEST_STATE_KEYS
from tests.databases import libpq_dsn, postgres_url

WHAT_IFS = sorted((Path(__file__).parents[2] / "bench" / "what_if").glob("*.sql"))


def _apply(url: str, what_ifs: list[Path]) -> None:
    with psycopg.connect(libpq_dsn(url), autocommit=True) as connection:
        for what_if in what_ifs:
            connection.execute(what_if.read_text())


def test_every_what_if_is_found() -> None:
    """The four what-ifs the performance page reports are all there, in their order."""
    assert [path.name[0] for path in WHAT_IFS] == ["1", "2", "3", "4"]


@pytest.mark.parametrize("last", range(len(WHAT_IFS)), ids=[path.stem for path in WHAT_IFS])
async def test_a_what_if_schema_still_runs_the_benchmark_workflow(last: int) -> None:
    """Each what-if applies on top of the ones before it (as the page measures them) and the
    approval workflow still completes on the result, so the figures measured with it are
    those of a working system."""
    with postgres_url() as url:
        _apply(url, WHAT_IFS[: last + 1])
        store = SqlSessionStore(url)
        try:
            app = build(store=store, state_keys=TEST_STATE_KEYS, execution="inline")
            chat = app.banking_agent.chat()
            paused = await chat.send("Transfer $500 to my savings account.")
            assert [i.name for i in paused.interrupts] == ["userApproval"]
            done = await chat.resume(respond=[paused.interrupts[0].respond({"approved": True})])
            assert done.text == "Done. Transaction txn-500-my-savings-account."
        finally:
            await store.close()
