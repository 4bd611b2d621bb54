"""Custom session state across a SIGKILLed worker process, on real PostgreSQL.

``tallyAgent`` (``tests.acceptance.durable_app``) runs ``tallyFast`` and ``tallySlow`` side by
side in its first round and ``tallySlow`` again in its second; each call adds one to its own
counter in the custom state. Executions are counted in the app's execution log, patches in
the counters: a patch applied twice would show as a counter of 2.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from engine import TurnStatus
from tests.acceptance.durable_support import Cluster, eventually
from tests.databases import postgres_url


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    """A fresh database with no workers yet; every worker is killed at teardown."""
    with postgres_url() as url:
        started = Cluster(url=url, tmp_path=tmp_path)
        try:
            yield started
        finally:
            await started.close()


async def stored_state(cluster: Cluster, turn_id: str) -> tuple[Any, Any]:
    """``(custom, artifacts)`` of the turn's row, as an operator reads them in psql."""
    rows = await cluster.query("SELECT custom, artifacts FROM turns WHERE id = %s", (turn_id,))
    return rows[0]


async def call_effects(cluster: Cluster, turn_id: str, ref: str) -> tuple[str, Any]:
    """``(status, effects)`` of one journal row."""
    rows = await cluster.query(
        "SELECT status::text, effects FROM tool_calls WHERE turn_id = %s AND ref = %s",
        (turn_id, ref),
    )
    return rows[0] if rows else ("absent", None)


async def turns_show(cluster: Cluster, turn_id: str, *options: str) -> str:
    """What ``turnstile turns show`` prints for the turn (operators see the state there)."""
    command = [sys.executable, "-m", "workers.cli", "turns", "show", turn_id, "--db", cluster.url]
    process = await asyncio.create_subprocess_exec(
        *command, *options, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 0, err.decode()
    return out.decode()


async def test_killed_worker_neither_loses_nor_repeats_a_state_change(cluster: Cluster) -> None:
    """SIGKILL while round 1's slow call runs and its fast sibling is done: the next worker
    replays the fast call's recorded change (never running it again), re-runs the slow one,
    and round 1's state is committed with round 1; an abort during round 2 keeps it."""
    cluster.configure(transfer_seconds=2.0)
    first = cluster.start_worker()
    agent = cluster.app().tally_agent
    sent = await agent.chat().send("go", wait=False)
    turn_id = str(sent.snapshot_id)
    fast_key, slow_key = f"{turn_id}:fast-1", f"{turn_id}:slow-1"

    async def fast_done() -> bool:
        return (await call_effects(cluster, turn_id, "fast-1"))[0] == "done"

    await eventually(fast_done, timeout=15, what="tallyFast's journal row", describe=cluster.logs)
    await cluster.wait_execution(slow_key, "start")
    first.kill()
    status, effects = await call_effects(cluster, turn_id, "fast-1")
    assert status == "done"
    assert effects[0] == {"customPatch": [{"op": "replace", "path": "", "value": {"fast": 1}}]}
    # Round 1 never committed: the turn still holds the state it started from.
    assert await stored_state(cluster, turn_id) == (None, None)

    second = cluster.start_worker()
    round_two = await cluster.wait_execution(f"{turn_id}:slow-2", "start", timeout=30)
    custom, artifacts = await stored_state(cluster, turn_id)
    assert custom == {"fast": 1, "slow": 1}, cluster.logs()
    assert sorted(a["name"] for a in artifacts) == ["fast-log", "slow-log"]

    assert await agent.abort(turn_id) is TurnStatus.PENDING
    aborted = await agent.wait(turn_id, timeout=15)
    assert aborted.status is TurnStatus.ABORTED
    assert aborted.custom == {"fast": 1, "slow": 1}
    snapshot = await agent.get_snapshot(snapshot_id=turn_id)
    assert snapshot is not None and snapshot.state.custom == {"fast": 1, "slow": 1}
    assert cluster.executions_of(fast_key, "start") == [first.pid]
    assert cluster.executions_of(slow_key, "start") == [first.pid, second.pid]
    assert cluster.executions_of(slow_key, "done") == [second.pid]
    assert cluster.executions_of(round_two, "done") == []

    retried = await agent.chat(snapshot_id=turn_id).send(wait=False)
    done = await agent.wait(str(retried.snapshot_id), timeout=30)
    assert done.text == "done", cluster.logs()
    assert done.custom == {"fast": 1, "slow": 2}
    assert json.dumps(done.custom) == json.dumps(
        (await stored_state(cluster, done.snapshot_id or ""))[0]
    )

    shown = await turns_show(cluster, turn_id)
    assert '{"fast": 1, "slow": 1}' in shown and "fast-log" in shown, shown
    as_json = json.loads(await turns_show(cluster, turn_id, "--json"))
    assert as_json["turn"]["custom"] == {"fast": 1, "slow": 1}
