"""Durable execution with real worker processes on real PostgreSQL: claim races, SIGKILL
mid tool call and mid model stream, a zombie worker past its lease, concurrent resumes,
terminated database connections, abort from another process, and approval expiry.

Every worker is ``python -m workers.cli worker --app tests.acceptance.durable_app:ai``; the
test process only queues turns, answers approvals and reads the database. Tool executions are
observed through the app's execution log and ledger (see ``durable_app``), which live outside
the database, so a repeated effect cannot hide behind a rolled-back transaction.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections import Counter
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from engine import AgentError, TurnFailedError, TurnStatus
from engine.errors import ApprovalNotPendingError, SessionBusyError
from tests.acceptance.durable_support import APP_SPEC, Cluster, Worker, eventually
from tests.databases import postgres_url
from tests.http_support import serve_process


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    """A fresh database with no workers yet; every worker is killed at teardown."""
    with postgres_url() as url:
        started = Cluster(url=url, tmp_path=tmp_path)
        try:
            yield started
        finally:
            await started.close()


async def events_of(cluster: Cluster, turn_id: str) -> list[tuple[str | None, str, int]]:
    """The turn's transitions as ``(from, to, attempt)``."""
    rows = await cluster.query(
        "SELECT from_status::text, to_status::text, attempt FROM turn_events "
        "WHERE turn_id = %s AND kind = 'status' ORDER BY id",
        (turn_id,),
    )
    return [(r[0], r[1], r[2]) for r in rows]


async def turn_row(cluster: Cluster, turn_id: str) -> dict[str, Any]:
    """Status, finish reason, attempts and lease of one turn."""
    rows = await cluster.query(
        "SELECT status::text, finish_reason, attempts, lease_owner, lease_token "
        "FROM turns WHERE id = %s",
        (turn_id,),
    )
    status, finish_reason, attempts, owner, token = rows[0]
    return {
        "status": status,
        "finish_reason": finish_reason,
        "attempts": attempts,
        "lease_owner": owner,
        "lease_token": token,
    }


async def transfer_call(cluster: Cluster, turn_id: str) -> tuple[str, str]:
    """``(idempotency key, status)`` of the turn's one transferMoney journal row."""
    rows = await cluster.query(
        "SELECT idempotency_key, status::text FROM tool_calls "
        "WHERE turn_id = %s AND name = 'transferMoney'",
        (turn_id,),
    )
    assert len(rows) == 1, rows
    return rows[0][0], rows[0][1]


async def paused_transfer(cluster: Cluster, text: str) -> tuple[Any, Any]:
    """Send ``text`` to bankingAgent and return ``(chat, approval interrupt)`` once paused."""
    return await paused_transfer_in(cluster, cluster.app().banking_agent.chat(), text)


async def paused_transfer_in(cluster: Cluster, chat: Any, text: str) -> tuple[Any, Any]:
    """Send ``text`` on ``chat`` and return ``(chat, approval interrupt)`` once paused."""
    paused = await asyncio.wait_for(chat.send(text), 30)
    assert paused.finish_reason == "interrupted", cluster.logs()
    approval = next(i for i in paused.interrupts if i.name == "userApproval")
    return chat, approval


async def freeze_outside_transactions(cluster: Cluster, worker: Worker) -> None:
    """SIGSTOP ``worker`` at a moment when none of its database sessions is inside a
    statement or transaction (a frozen open transaction would keep its row locks, and the
    claim query skips locked rows, so no other worker could take over)."""
    for _ in range(50):
        worker.pause()
        busy = await cluster.scalar(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE application_name = 'turnstile-worker' AND datname = current_database() "
            "AND state <> 'idle'"
        )
        if busy == 0:
            return
        worker.resume()
        await asyncio.sleep(0.01)
    raise AssertionError(f"could not freeze {worker.name} outside a transaction")


@pytest.mark.timeout(240)
async def test_four_worker_processes_run_each_of_500_turns_exactly_once(cluster: Cluster) -> None:
    """Four worker processes racing for 500 queued turns claim and run each exactly once: one
    attempt per turn, one claim per turn across all logs, one transferMoney execution each."""
    workers = [cluster.start_worker(concurrency=4) for _ in range(4)]
    await cluster.wait_ready(*workers, timeout=60)
    agent = cluster.app().banking_agent
    gate = asyncio.Semaphore(16)

    async def send(n: int) -> str:
        async with gate:
            sent = await agent.chat().send(f"parallel transfer ${n} to acct{n}", wait=False)
        assert sent.status is TurnStatus.PENDING
        return str(sent.snapshot_id)

    ids = await asyncio.gather(*(send(n) for n in range(1, 501)))
    assert len(set(ids)) == 500
    await cluster.wait_all_settled(timeout=180)

    rows = await cluster.query(
        "SELECT id, status::text, finish_reason, attempts, error::text FROM turns"
    )
    assert len(rows) == 500
    wrong = [r for r in rows if r[1:4] != ("completed", "interrupted", 1)]
    assert not wrong, f"{len(wrong)} turns not run exactly once: {wrong[:5]}\n{cluster.logs()}"
    histories = await cluster.query(
        "SELECT turn_id, array_agg(to_status::text ORDER BY id) FROM turn_events "
        "WHERE kind = 'status' GROUP BY turn_id"
    )
    assert len(histories) == 500
    assert {tuple(h[1]) for h in histories} == {("pending", "completed")}

    claims = cluster.claims()
    claimed = Counter(turn for worker_claims in claims.values() for turn, _ in worker_claims)
    assert set(claimed) == set(ids)
    assert set(claimed.values()) == {1}, [t for t, n in claimed.items() if n > 1][:5]
    per_worker = {name: len(turns) for name, turns in claims.items()}
    assert all(per_worker.values()), f"a worker never won a claim: {per_worker}"

    expected_keys = {f"{turn_id}:transfer-1" for turn_id in ids}
    executions = cluster.executions()
    starts = Counter(key for event, key, _ in executions if event == "start")
    dones = Counter(key for event, key, _ in executions if event == "done")
    assert set(starts) == set(dones) == expected_keys
    assert set(starts.values()) == set(dones.values()) == {1}
    assert {pid for _, _, pid in executions} == {w.pid for w in workers}
    journal = await cluster.query(
        "SELECT name, status::text, count(*) FROM tool_calls GROUP BY name, status ORDER BY name"
    )
    assert journal == [("transferMoney", "done", 500), ("userApproval", "interrupted", 500)]
    assert all(w.alive for w in workers), cluster.logs()


async def test_worker_killed_mid_tool_call_is_replaced_and_the_call_reruns_under_its_key(
    cluster: Cluster,
) -> None:
    """SIGKILL during a transfer: a second worker re-runs only that unfinished call, with the
    same idempotency key (booked once); a call of the session that finished earlier is
    replayed from the journal on resume and never re-run."""
    cluster.configure(transfer_seconds=2.5)
    first = cluster.start_worker()
    agent = cluster.app().banking_agent
    # Round 1 runs transferMoney (transfer-1) next to the approval; resuming replays its output.
    chat, approval = await paused_transfer(cluster, "parallel transfer $10 to Carol")
    earlier_key = f"{chat.snapshot_id}:transfer-1"
    assert cluster.executions_of(earlier_key, "done") == [first.pid]
    confirmed = await asyncio.wait_for(
        chat.resume(respond=[approval.respond({"approved": True})]), 30
    )
    assert confirmed.text == "Done. Transaction txn-10-carol."

    chat, approval = await paused_transfer_in(cluster, chat, "Transfer $15 to Dan")
    resumed = await chat.send(
        resume={"respond": [approval.respond({"approved": True})]}, wait=False
    )
    turn_id = str(resumed.snapshot_id)
    key = await cluster.wait_execution(f"{turn_id}:", "start")
    first.kill()
    assert await transfer_call(cluster, turn_id) == (key, "running")
    assert (await turn_row(cluster, turn_id))["status"] == "pending"

    second = cluster.start_worker()
    done = await agent.wait(turn_id, timeout=30)
    assert done.text == "Done. Transaction txn-15-dan.", cluster.logs()
    assert await transfer_call(cluster, turn_id) == (key, "done")
    assert cluster.executions_of(key, "start") == [first.pid, second.pid]
    assert cluster.executions_of(key, "done") == [second.pid]
    assert cluster.executions_of(earlier_key, "start") == [first.pid]
    assert cluster.executions_of(earlier_key, "done") == [first.pid]
    assert cluster.ledger_keys() == Counter({earlier_key: 1, key: 1})
    assert await events_of(cluster, turn_id) == [(None, "pending", 0), ("pending", "completed", 2)]


async def test_a_server_killed_mid_call_of_a_turn_it_leased_at_creation_loses_nothing(
    cluster: Cluster, tmp_path: Path
) -> None:
    """``serve --workers 2`` creates a sent turn leased to its own pool (the claim is in the
    creating statement: same moment as the pending entry) and runs it; SIGKILL during its
    transfer leaves the lease to expire, a worker process then claims the turn as attempt 2,
    re-runs only the unfinished call under its key and books it once."""
    cluster.configure(transfer_seconds=2.5)
    body = {
        "data": {
            "message": {"role": "user", "content": [{"text": "parallel transfer $10 to Carol"}]}
        },
        "init": {},
    }
    log = tmp_path / "serve.log"
    with (
        serve_process(cluster.url, app=APP_SPEC, workers=2, env=cluster.process_env(), log=log) as (
            base,
            server,
        ),
        ThreadPoolExecutor(1) as background,
    ):
        # The request dies with the server: only the turn it created matters.
        background.submit(httpx.post, f"{base}/api/bankingAgent", json=body, timeout=60)
        key = await cluster.wait_execution("", "start")
        turn_id = key.split(":")[0]
        leased = await turn_row(cluster, turn_id)
        server.kill()
        server.wait()
    assert (leased["status"], leased["attempts"], leased["lease_token"]) == ("pending", 1, 1)
    first = await cluster.query(
        "SELECT kind, actor, at FROM turn_events WHERE turn_id = %s ORDER BY id LIMIT 2",
        (turn_id,),
    )
    (created, _, created_at), (claimed, owner, claimed_at) = first
    assert (created, claimed, owner) == ("status", "claimed", leased["lease_owner"])
    assert claimed_at == created_at, "claimed by the creating statement"

    worker = cluster.start_worker()
    paused = await cluster.app().banking_agent.wait(turn_id, timeout=30)
    assert paused.finish_reason == "interrupted", cluster.logs() + log.read_text()
    assert cluster.executions_of(key, "start") == [server.pid, worker.pid]
    assert cluster.executions_of(key, "done") == [worker.pid]
    assert cluster.ledger_keys() == Counter({key: 1})
    row = await turn_row(cluster, turn_id)
    assert (row["status"], row["attempts"]) == ("completed", 2)
    kinds = await cluster.query(
        "SELECT kind, actor FROM turn_events WHERE turn_id = %s AND kind IN "
        "('claimed', 'lease lost') ORDER BY id",
        (turn_id,),
    )
    assert [k for k, _ in kinds] == ["claimed", "lease lost", "claimed"]
    assert kinds[1][1] == leased["lease_owner"]


async def test_worker_killed_after_a_call_finished_never_reruns_it(cluster: Cluster) -> None:
    """SIGKILL after the transfer's journal row is done (while the model answers): the next
    worker continues from the journal and asks the model only; the transfer ran once."""
    cluster.configure(model_after_tool_seconds=3.0)
    first = cluster.start_worker()
    agent = cluster.app().banking_agent
    chat, approval = await paused_transfer(cluster, "Transfer $20 to Erin")
    resumed = await chat.send(
        resume={"respond": [approval.respond({"approved": True})]}, wait=False
    )
    turn_id = str(resumed.snapshot_id)

    async def finished_call() -> tuple[str, str] | None:
        rows = await cluster.query(
            "SELECT idempotency_key, status::text FROM tool_calls "
            "WHERE turn_id = %s AND name = 'transferMoney' AND status = 'done'",
            (turn_id,),
        )
        return rows[0] if rows else None

    key, _ = await eventually(finished_call, timeout=15, what="the transfer to finish")
    first.kill()
    assert (await turn_row(cluster, turn_id))["status"] == "pending", "killed too late"

    cluster.start_worker()
    done = await agent.wait(turn_id, timeout=30)
    assert done.text == "Done. Transaction txn-20-erin.", cluster.logs()
    assert cluster.executions_of(key, "start") == [first.pid]
    assert cluster.executions_of(key, "done") == [first.pid]
    assert cluster.ledger_keys() == Counter({key: 1})
    assert (await turn_row(cluster, turn_id))["attempts"] == 2
    assert await transfer_call(cluster, turn_id) == (key, "done")


async def test_worker_killed_mid_model_stream_is_replaced_and_the_turn_completes(
    cluster: Cluster,
) -> None:
    """SIGKILL while the model streams a slow answer: another worker claims the expired lease
    and completes the turn with one model message."""
    first = cluster.start_worker()
    agent = cluster.app().banking_agent
    text = "slow one two three four five six"  # seven chunks, 300 ms each
    sent = await agent.chat().send(text, wait=False)
    turn_id = str(sent.snapshot_id)
    owner = await cluster.wait_claimed(turn_id)
    assert f":{first.pid}:" in owner
    await asyncio.sleep(0.6)
    row = await turn_row(cluster, turn_id)
    assert (row["status"], row["lease_owner"]) == ("pending", owner), "stream ended too early"
    first.kill()

    second = cluster.start_worker()
    done = await agent.wait(turn_id, timeout=30)
    assert done.text == f"Echo: {text}", cluster.logs()
    assert [m.role for m in done.messages] == ["user", "model"]
    assert await events_of(cluster, turn_id) == [(None, "pending", 0), ("pending", "completed", 2)]
    claims = cluster.claims()
    assert claims == {"worker1": [(turn_id, 1)], "worker2": [(turn_id, 2)]}, cluster.logs()
    assert second.alive


async def test_zombie_worker_resumed_after_its_lease_expired_writes_nothing(
    cluster: Cluster,
) -> None:
    """A worker frozen (SIGSTOP) mid transfer past its lease, then thawed (SIGCONT) after a
    second worker finished the turn, changes no row of the database and notices the lost
    lease."""
    cluster.configure(transfer_seconds=3.0)
    zombie = cluster.start_worker()
    agent = cluster.app().banking_agent
    chat, approval = await paused_transfer(cluster, "Transfer $30 to Frank")
    resumed = await chat.send(
        resume={"respond": [approval.respond({"approved": True})]}, wait=False
    )
    turn_id = str(resumed.snapshot_id)
    key = await cluster.wait_execution(f"{turn_id}:", "start")
    await freeze_outside_transactions(cluster, zombie)

    async def lease_expired() -> bool:
        return bool(
            await cluster.scalar(
                "SELECT lease_expires_at < now() FROM turns WHERE id = %s", (turn_id,)
            )
        )

    await eventually(lease_expired, timeout=10, what="the frozen worker's lease to expire")
    rescuer = cluster.start_worker()
    done = await agent.wait(turn_id, timeout=30)
    assert done.text == "Done. Transaction txn-30-frank.", cluster.logs()
    before = await cluster.dump()

    zombie.resume()
    # The zombie's transfer finishes (its sleep is over), then it tries to journal it and to
    # renew its lease: both are fenced off. Wait until its pool reports the attempt's end.
    finished = re.compile(rf"turn {turn_id} attempt 1\b(?! claimed)")

    async def zombie_done() -> bool:
        return finished.search(zombie.log()) is not None

    await eventually(
        zombie_done, timeout=20, what="the zombie to give up its turn", describe=cluster.logs
    )
    after = await cluster.dump()
    assert after == before, cluster.logs()
    assert zombie.alive and rescuer.alive
    noticed = re.compile(rf"turn {turn_id}: lease .*(lost|no longer valid)", re.IGNORECASE)
    assert noticed.search(zombie.log()), cluster.logs()
    # The effect outside the database is protected by the idempotency key alone.
    assert cluster.executions_of(key, "start") == [zombie.pid, rescuer.pid]
    assert cluster.ledger_keys() == Counter({key: 1})
    assert await events_of(cluster, turn_id) == [(None, "pending", 0), ("pending", "completed", 2)]


async def test_twenty_concurrent_resumes_of_one_snapshot_have_exactly_one_winner(
    cluster: Cluster,
) -> None:
    """Twenty concurrent resumes of one paused snapshot: one creates the turn, nineteen get a
    typed ABORTED conflict, and the money moves once."""
    asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(max_workers=24))
    cluster.start_worker()
    agent = cluster.app().banking_agent
    chat, approval = await paused_transfer(cluster, "Transfer $40 to Gina")
    paused_id = str(chat.snapshot_id)
    answer = approval.respond({"approved": True, "feedback": "ok"})
    start = asyncio.Event()

    async def resume() -> Any:
        reopened = agent.chat(snapshot_id=paused_id)
        await start.wait()
        return await reopened.send(resume={"respond": [answer]}, wait=False)

    tasks = [asyncio.create_task(resume()) for _ in range(20)]
    await asyncio.sleep(0)
    start.set()
    outcomes = await asyncio.gather(*tasks, return_exceptions=True)

    winners = [o for o in outcomes if not isinstance(o, BaseException)]
    losers = [o for o in outcomes if isinstance(o, BaseException)]
    assert len(winners) == 1, outcomes
    unexpected = [
        o
        for o in losers
        if not isinstance(o, SessionBusyError | ApprovalNotPendingError)
        or not isinstance(o, AgentError)
        or o.status != "ABORTED"
    ]
    assert not unexpected, unexpected
    children = await cluster.query("SELECT id FROM turns WHERE parent_id = %s", (paused_id,))
    assert children == [(winners[0].snapshot_id,)]
    done = await agent.wait(str(winners[0].snapshot_id), timeout=30)
    assert done.text == "Done. Transaction txn-40-gina.", cluster.logs()
    assert len(cluster.ledger_keys()) == 1
    assert [e for e, _, _ in cluster.executions()] == ["start", "done"]
    decided = await cluster.query(
        "SELECT status::text, answer FROM tool_calls WHERE turn_id = %s", (paused_id,)
    )
    assert decided == [("answered", {"respond": {"approved": True, "feedback": "ok"}})]


@pytest.mark.timeout(120)
async def test_workers_survive_terminated_database_connections(cluster: Cluster) -> None:
    """Terminating every worker backend again and again mid-run: workers reconnect, every turn
    completes, each transfer is booked once, and new work is still picked up afterwards."""
    cluster.configure(transfer_seconds=0.2)
    workers = [cluster.start_worker(concurrency=4), cluster.start_worker(concurrency=4)]
    await cluster.wait_ready(*workers)
    agent = cluster.app().banking_agent
    texts = [f"parallel transfer ${n} to conn{n}" for n in range(1, 25)]
    texts += [f"slow words for turn {n}" for n in range(1, 9)]
    sent = [await agent.chat().send(text, wait=False) for text in texts]
    ids = [str(s.snapshot_id) for s in sent]

    terminated = 0
    storm_ends = time.monotonic() + 4.0
    while time.monotonic() < storm_ends:
        rows = await cluster.query(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE application_name = 'turnstile-worker' AND datname = current_database()"
        )
        terminated += sum(1 for (ok,) in rows if ok)
        await asyncio.sleep(0.05)
    assert terminated >= 5, f"only {terminated} backends terminated\n{cluster.logs()}"

    await cluster.wait_all_settled(timeout=60)
    rows = await cluster.query(
        "SELECT id, status::text, finish_reason, error::text FROM turns WHERE id = ANY(%s)",
        (ids,),
    )
    failed = [r for r in rows if r[1] != "completed"]
    assert not failed, f"{failed}\n{cluster.logs()}"
    reasons = Counter(r[2] for r in rows)
    assert reasons == Counter({"interrupted": 24, "stop": 8})
    booked = cluster.ledger_keys()
    assert set(booked) == {f"{turn_id}:transfer-1" for turn_id in ids[:24]}
    assert set(booked.values()) == {1}

    # Reconnected: a turn sent now is picked up and answered.
    later = await agent.chat().send("hello again", wait=False)
    answer = await agent.wait(str(later.snapshot_id), timeout=15)
    assert answer.text == "Echo: hello again"
    assert all(w.alive for w in workers), cluster.logs()

    async def back() -> bool:
        count: int = await cluster.scalar(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE application_name = 'turnstile-worker' AND datname = current_database()"
        )
        return count >= 2

    await eventually(back, timeout=10, what="worker connections to come back")


async def test_a_write_that_keeps_losing_its_connection_is_retried_not_failed(
    cluster: Cluster,
) -> None:
    """A worker whose journal write loses its database connection more often than the store
    retries (a failover, here forced by terminating the backend each time it waits on a held
    lock) does not fail the turn: connection errors are transient, the turn is retried and
    completes, and the transfer happens once."""
    cluster.start_worker()
    agent = cluster.app().banking_agent
    chat, approval = await paused_transfer(cluster, "Transfer $80 to Kim")
    # The resumed turn's first write is its round 0 (messages); keep that table locked.
    async with cluster.holding("LOCK TABLE messages IN EXCLUSIVE MODE") as blocker:
        resumed = await chat.send(
            resume={"respond": [approval.respond({"approved": True})]}, wait=False
        )
        turn_id = str(resumed.snapshot_id)
        killed = await cluster.terminate_blocked(blocker, times=4, within=5)
    assert killed >= 1, f"the worker never wrote round 0\n{cluster.logs()}"

    await cluster.wait_all_settled(timeout=30)
    row = await turn_row(cluster, turn_id)
    error = await cluster.scalar("SELECT error::text FROM turns WHERE id = %s", (turn_id,))
    assert row["status"] == "completed", (
        f"after {killed} lost connections the turn is {row['status']}: {error}\n{cluster.logs()}"
    )
    done = await agent.wait(turn_id, timeout=10)
    assert done.text == "Done. Transaction txn-80-kim."
    assert len(cluster.ledger_keys()) == 1
    assert [e for e, _, _ in cluster.executions()] == ["start", "done"]


async def test_heartbeat_survives_transient_database_errors(cluster: Cluster) -> None:
    """A lease renewal that loses its connection a few times in a row (terminated while it
    waits on a held row lock) does not end the heartbeat: the worker keeps its lease, so the
    running tool call is not claimed and executed a second time."""
    cluster.configure(transfer_seconds=5.0)
    worker = cluster.start_worker()
    agent = cluster.app().banking_agent
    chat, approval = await paused_transfer(cluster, "Transfer $90 to Lee")
    resumed = await chat.send(
        resume={"respond": [approval.respond({"approved": True})]}, wait=False
    )
    turn_id = str(resumed.snapshot_id)
    key = await cluster.wait_execution(f"{turn_id}:", "start")
    lock = f"SELECT 1 FROM turns WHERE id = '{turn_id}' FOR UPDATE"
    async with cluster.holding(lock) as blocker:
        killed = await cluster.terminate_blocked(blocker, times=4, within=3)
    assert killed >= 1, f"no lease renewal was blocked\n{cluster.logs()}"

    done = await agent.wait(turn_id, timeout=30)
    assert done.text == "Done. Transaction txn-90-lee.", cluster.logs()
    assert cluster.executions_of(key, "start") == [worker.pid], (
        f"the call ran {len(cluster.executions_of(key, 'start'))} times after {killed} failed "
        f"renewals: {cluster.executions()}\n{cluster.logs()}"
    )
    assert (await turn_row(cluster, turn_id))["attempts"] == 1
    assert cluster.ledger_keys() == Counter({key: 1})


async def test_abort_from_another_process_stops_the_running_turn(cluster: Cluster) -> None:
    """The test process aborts a turn a worker process is streaming: it goes aborting, then the
    worker stops at once and settles it aborted with no model message kept."""
    worker = cluster.start_worker()
    agent = cluster.app().banking_agent
    text = "slow " + " ".join(f"w{n}" for n in range(14))  # ~4.5 s of streaming
    sent = await agent.chat().send(text, wait=False)
    turn_id = str(sent.snapshot_id)
    await cluster.wait_claimed(turn_id)
    await asyncio.sleep(0.5)  # mid stream

    asked = time.monotonic()
    assert await agent.abort(turn_id) is TurnStatus.PENDING
    response = await agent.wait(turn_id, timeout=10)
    elapsed = time.monotonic() - asked
    assert response.status is TurnStatus.ABORTED
    assert response.finish_reason == "aborted"
    assert elapsed < 2.0, f"abort took {elapsed:.1f}s\n{cluster.logs()}"
    assert [m.role for m in response.messages] == ["user"]
    assert await events_of(cluster, turn_id) == [
        (None, "pending", 0),
        ("pending", "aborting", 1),
        ("aborting", "aborted", 1),
    ]
    assert f"turn {turn_id} aborted" in worker.log()
    snapshot = await agent.get_snapshot(snapshot_id=turn_id)
    assert snapshot is not None and snapshot.status is TurnStatus.ABORTED


async def test_expired_approvals_are_decided_by_a_worker_scheduler(cluster: Cluster) -> None:
    """A worker process's APScheduler job answers an overdue approval with its on_timeout
    default (the turn continues) or fails the turn (on_timeout="fail"); approvals without a
    timeout stay open."""
    cluster.configure(approval_timeout=1.0)
    worker = cluster.start_worker()
    app = cluster.app()
    expiring = app.expiring_agent.chat()
    strict = app.strict_agent.chat()
    patient = app.banking_agent.chat()
    for chat, text in (
        (expiring, "Transfer $50 to Hank"),
        (strict, "Transfer $60 to Ivy"),
        (patient, "Transfer $70 to Jo"),
    ):
        paused = await asyncio.wait_for(chat.send(text), 30)
        assert paused.finish_reason == "interrupted"
    deadlines = await cluster.query(
        "SELECT turn_id, deadline IS NOT NULL FROM tool_calls WHERE name = 'userApproval'"
    )
    assert dict(deadlines) == {
        expiring.snapshot_id: True,
        strict.snapshot_id: True,
        patient.snapshot_id: False,
    }

    async def child_of(parent: str | None) -> str | None:
        child: str | None = await cluster.scalar(
            "SELECT id FROM turns WHERE parent_id = %s", (parent,)
        )
        return child

    # The scheduler's interval is 5 s: within 20 s both overdue approvals are decided.
    continued = await eventually(
        lambda: child_of(expiring.snapshot_id), timeout=20, what="expiry of expiringAgent"
    )
    failed = await eventually(
        lambda: child_of(strict.snapshot_id), timeout=20, what="expiry of strictAgent"
    )
    cancelled = await app.expiring_agent.wait(continued, timeout=15)
    assert cancelled.text == "Transfer cancelled: expired", cluster.logs()
    with pytest.raises(TurnFailedError) as raised:
        await app.strict_agent.wait(failed, timeout=15)
    assert raised.value.status == "DEADLINE_EXCEEDED"

    decisions = await cluster.query(
        "SELECT turn_id, status::text, decided_by, answer FROM tool_calls "
        "WHERE name = 'userApproval' AND round > 0"
    )
    assert sorted(decisions, key=str) == sorted(
        [
            (
                expiring.snapshot_id,
                "answered",
                "timeout",
                {"respond": {"approved": False, "feedback": "expired"}},
            ),
            (strict.snapshot_id, "answered", "timeout", {"expired": True}),
            (patient.snapshot_id, "interrupted", None, None),
        ],
        key=str,
    )
    assert await child_of(patient.snapshot_id) is None
    assert cluster.executions() == []
    assert "expiry: decided" in worker.log()
