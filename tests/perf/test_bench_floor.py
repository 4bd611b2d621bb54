"""The benchmark's floor (``bench/floor.py``) writes what the product's recovery guarantees
need: the transfer's round is checkpointed before the tool runs and before the model is asked
again, each in its own commit ahead of the settle; ``--settle-only`` writes it with the settle.

A real floor worker process runs real workflows against PostgreSQL; triggers record every
row each write leaves, with the transaction that wrote it.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
from sqlalchemy.engine import make_url

from bench import floor
from bench.common import Processes, count_backends
from tests.databases import libpq_dsn, postgres_url

WORKFLOWS = 3

# Every row written to the floor's tables, in order, with the id of its transaction.
RECORDER = """
CREATE TABLE written (
    seq bigserial PRIMARY KEY,
    tbl text NOT NULL,
    turn_id text NOT NULL,
    ref text,
    status text NOT NULL,
    xact xid8 NOT NULL DEFAULT pg_current_xact_id());
CREATE FUNCTION record_written() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO written (tbl, turn_id, ref, status)
    VALUES (TG_TABLE_NAME, coalesce(to_jsonb(NEW) ->> 'turn_id', to_jsonb(NEW) ->> 'id'),
            to_jsonb(NEW) ->> 'ref', NEW.status);
    RETURN NULL;
END $$;
CREATE TRIGGER fturns_written AFTER INSERT OR UPDATE ON fturns
    FOR EACH ROW EXECUTE FUNCTION record_written();
CREATE TRIGGER fcalls_written AFTER INSERT OR UPDATE ON fcalls
    FOR EACH ROW EXECUTE FUNCTION record_written();
"""


async def _run_floor(url: str, tmp_path: Path, *extra: str) -> list[list[tuple[Any, ...]]]:
    """Run WORKFLOWS workflows through a floor worker process; the transfer rounds' writes:
    per resumed turn, (table, ref, status, transaction) in the order written."""
    dsn, database = libpq_dsn(url), make_url(url).database
    assert database is not None
    with psycopg.connect(dsn, autocommit=True) as connection:
        connection.execute(floor.SCHEMA)
        connection.execute(RECORDER)
    children = Processes()
    argv = [sys.executable, "-m", "bench.floor", "worker", "--dsn", dsn, "--slots", "2"]
    argv += ["--claim-log", str(tmp_path / "claims.log"), *extra]
    log = tmp_path / "worker.log"
    children.start(argv, env=dict(os.environ), log=log)
    try:
        deadline = time.monotonic() + 30
        while count_backends(database, floor.READY_QUERY) < 1:
            children.check()
            assert time.monotonic() < deadline, log.read_text()
            await asyncio.sleep(0.05)
        async with floor.FloorClient(dsn, connections=2) as client:
            try:
                samples = [
                    await asyncio.wait_for(client.workflow(0, k), 20) for k in range(WORKFLOWS)
                ]
            except TimeoutError:
                pytest.fail(f"a workflow did not finish; worker log:\n{log.read_text()}")
        resumed = [sample.resumed_turn for sample in samples]
    finally:
        children.stop()
    with psycopg.connect(dsn, autocommit=True) as connection:
        return [
            connection.execute(
                """SELECT tbl, ref, status, xact::text::bigint FROM written
                   WHERE turn_id = %s AND (tbl = 'fcalls' OR status <> 'pending')
                   ORDER BY seq""",
                (turn,),
            ).fetchall()
            for turn in resumed
        ]


@pytest.mark.parametrize("extra", [[], ["--settle-only"]], ids=["checkpoints", "settle-only"])
async def test_the_floor_writes_the_transfer_round_as_its_guarantees_need(
    extra: list[str], tmp_path: Path
) -> None:
    """With checkpoints the transfer's call is journaled running, then done, each in a commit
    of its own before the settle's; settle-only writes it done in the settle's commit."""
    with postgres_url() as url:
        turns = await _run_floor(url, tmp_path, *extra)
    assert len(turns) == WORKFLOWS
    for writes in turns:
        calls = [(ref, status) for tbl, ref, status, _ in writes if tbl == "fcalls"]
        settles = [xact for tbl, _, status, xact in writes if tbl == "fturns"]
        assert [status for tbl, _, status, _ in writes if tbl == "fturns"] == ["completed"]
        call_xacts = [xact for tbl, _, _, xact in writes if tbl == "fcalls"]
        if extra:
            assert calls == [("transfer-1", "done")]
            assert call_xacts == settles
        else:
            assert calls == [("transfer-1", "running"), ("transfer-1", "done")]
            running, done = call_xacts
            assert running < done < settles[0]
