"""The floor: the approval workflow as raw psycopg writing the minimum rows, for comparison.

A correct durable implementation of "send → pause for approval → resume → transfer → done",
with the recovery guarantees Turnstile gives (a finished tool call is never run again, a
started one runs again with the same request and idempotency key), needs, per workflow,
eight committed writes — each a single statement (data-modifying CTEs), so one round trip
each — and three reads:

1. client: insert the pending turn (the user message is its input) + NOTIFY work;
2. worker: claim it (the product's claim: UPDATE … WHERE id IN (SELECT … FOR UPDATE SKIP
   LOCKED) with a lease owner, expiry and token);
3. worker: settle it ``completed/interrupted`` with the paused model message, fenced by the
   lease token, + insert the ``interrupted`` userApproval call row + NOTIFY change;
4. client (woken by LISTEN): read the paused turn;
5. client: mark the call ``answered`` (only if still ``interrupted``) + insert the resumed turn
   (next ``seq``; one running turn per session is a partial unique index) + NOTIFY work;
6. worker: claim it, read the parent's paused message (one read);
7. worker, the round's checkpoint before the tool runs: the conversation so far (the
   answered approval and the model's transfer request), fenced, + the ``running``
   transferMoney call row with its idempotency key ``<turn>:<ref>`` — without it a crash
   during the transfer would ask the model again, and a different request could run;
8. worker: run the transfer; then the round's checkpoint before the model is asked again:
   the tool's answer, fenced, + the call row ``done`` with its output — without it a crash
   during the next model call would run the finished transfer again;
9. worker: settle it ``completed/stop`` with the five messages the product stores, fenced,
   + NOTIFY change;
10. client (woken): read the final turn.

Same durability (``synchronous_commit`` at the server default), ids, JSON payloads and
process/slot layout as the product; LISTEN/NOTIFY wake-ups with a 1 s poll fallback. Left
out: sessions, ``turn_events``, a separate ``running`` write for an idempotent tool, and
recovery itself (the floor only has to write what recovery would need).

``--settle-only`` drops steps 7 and 8 (the call row is inserted ``done`` by the settle): the
floor earlier rounds were measured against, which does not keep those guarantees. See
``docs/performance.md``. Workers: ``python -m bench.floor worker --dsn DSN --slots S
--claim-log PATH [--settle-only]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import signal
import time
import uuid
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from bench.common import Sample

__all__ = ["READY_QUERY", "SCHEMA", "FloorClient", "serve"]

SCHEMA = """
CREATE TABLE fturns (
    id text PRIMARY KEY,
    session_id text NOT NULL,
    seq integer NOT NULL,
    parent_id text REFERENCES fturns (id),
    status text NOT NULL,
    finish_reason text,
    input jsonb NOT NULL,
    output jsonb,
    attempts integer NOT NULL DEFAULT 0,
    lease_token bigint NOT NULL DEFAULT 0,
    lease_owner text,
    lease_expires_at timestamptz,
    run_after timestamptz NOT NULL,
    created_at timestamptz NOT NULL,
    settled_at timestamptz,
    UNIQUE (session_id, seq)
);
CREATE INDEX fturns_claimable ON fturns (run_after, id) WHERE status = 'pending';
CREATE UNIQUE INDEX fturns_one_active ON fturns (session_id) WHERE status = 'pending';
CREATE TABLE fcalls (
    turn_id text NOT NULL REFERENCES fturns (id),
    round integer NOT NULL,
    ref text NOT NULL,
    name text NOT NULL,
    input jsonb,
    status text NOT NULL,
    output jsonb,
    interrupt jsonb,
    answer jsonb,
    idempotency_key text NOT NULL,
    decided_at timestamptz,
    started_at timestamptz,
    finished_at timestamptz,
    created_at timestamptz NOT NULL,
    PRIMARY KEY (turn_id, round, ref)
);
CREATE INDEX fcalls_open ON fcalls (created_at) WHERE status = 'interrupted';
"""

#: The last statement of a ready worker's LISTEN connection (see ``count_backends``).
READY_QUERY = "LISTEN floor_work"

SEND = """WITH t AS (
    INSERT INTO fturns (id, session_id, seq, status, input, run_after, created_at)
    VALUES (%(id)s, %(session)s, 1, 'pending', %(input)s, now(), now()) RETURNING id)
SELECT pg_notify('floor_work', id) FROM t"""

RESUME = """WITH answered AS (
    UPDATE fcalls SET status = 'answered', answer = %(answer)s, decided_at = now()
    WHERE turn_id = %(parent)s AND round = 1 AND ref = %(ref)s AND status = 'interrupted'
    RETURNING turn_id),
t AS (
    INSERT INTO fturns (id, session_id, seq, parent_id, status, input, run_after, created_at)
    SELECT %(id)s, p.session_id, p.seq + 1, p.id, 'pending', %(input)s, now(), now()
    FROM fturns p JOIN answered a ON a.turn_id = p.id RETURNING id)
SELECT pg_notify('floor_work', id) FROM t"""

READ = "SELECT status, finish_reason, output FROM fturns WHERE id = %s"

CLAIM = """UPDATE fturns SET lease_owner = %(owner)s,
    lease_expires_at = now() + interval '30 seconds',
    lease_token = lease_token + 1, attempts = attempts + 1
WHERE id IN (
    SELECT id FROM fturns
    WHERE status = 'pending' AND run_after <= now()
      AND (lease_expires_at IS NULL OR lease_expires_at < now())
    ORDER BY run_after, id LIMIT %(limit)s FOR UPDATE SKIP LOCKED)
RETURNING id, parent_id, input, lease_token"""

#: The fence every worker write after the claim carries: the turn still pending under the
#: lease token the claim handed out (no row: the lease was lost).
_FENCE = "WHERE id = %(id)s AND lease_token = %(token)s AND status = 'pending' RETURNING id"

_SETTLED = f"""UPDATE fturns SET status = 'completed', finish_reason = %(finish)s,
        output = %(output)s, lease_owner = NULL, lease_expires_at = NULL,
        lease_token = lease_token + 1, settled_at = now()
    {_FENCE}"""

#: The settle that also writes the turn's one call row (the paused turn's interrupt, or the
#: settle-only floor's transfer).
SETTLE = f"""WITH s AS ({_SETTLED}),
c AS (
    INSERT INTO fcalls (turn_id, round, ref, name, input, status, output, interrupt,
                        idempotency_key, finished_at, created_at)
    SELECT id, 1, %(ref)s, %(name)s, %(call_input)s, %(call_status)s, %(call_output)s,
           %(interrupt)s, id || ':' || %(ref)s, now(), now() FROM s)
SELECT pg_notify('floor_turn', id) FROM s"""

#: The settle of a turn whose call rows its round checkpoints already wrote.
SETTLE_TURN = f"""WITH s AS ({_SETTLED})
SELECT pg_notify('floor_turn', id) FROM s"""

#: A round's checkpoint before its tool runs: the conversation so far and the ``running``
#: call, fenced.
OPEN_ROUND = f"""WITH f AS (UPDATE fturns SET output = %(output)s {_FENCE})
INSERT INTO fcalls (turn_id, round, ref, name, input, status, idempotency_key, started_at,
                    created_at)
SELECT id, 1, %(ref)s, %(name)s, %(call_input)s, 'running', id || ':' || %(ref)s, now(), now()
FROM f RETURNING turn_id"""

#: A round's checkpoint before the model is asked again: the tool's answer, and the call
#: ``done``, fenced.
CLOSE_ROUND = f"""WITH f AS (UPDATE fturns SET output = %(output)s {_FENCE})
UPDATE fcalls c SET status = 'done', output = %(call_output)s, finished_at = now()
FROM f WHERE c.turn_id = f.id AND c.round = 1 AND c.ref = %(ref)s RETURNING c.turn_id"""

_TRANSFER = re.compile(r"transfer \$?(\d+) to (.+)", re.IGNORECASE)


def _request(ref: str, name: str, arguments: dict[str, Any], meta: Any = None) -> dict[str, Any]:
    part: dict[str, Any] = {"toolRequest": {"ref": ref, "name": name, "input": arguments}}
    if meta is not None:
        part["metadata"] = meta
    return part


def _response(ref: str, name: str, output: Any) -> dict[str, Any]:
    return {"toolResponse": {"ref": ref, "name": name, "output": output}}


async def _fenced(
    connection: psycopg.AsyncConnection[Any], sql: str, params: dict[str, Any]
) -> bool:
    """Run a fenced write; False when it wrote nothing (the lease was lost)."""
    cursor = await connection.execute(sql, params)
    if await cursor.fetchone() is None:
        print(f"floor worker: lease on {params['id']} lost", flush=True)
        return False
    return True


async def _run_turn(
    connection: psycopg.AsyncConnection[Any], row: tuple[Any, ...], *, checkpoints: bool
) -> None:
    """Run one claimed turn: the scripted model's steps; with ``checkpoints`` the transfer's
    round is written before the tool runs and before the model is asked again."""
    turn_id, parent_id, turn_input, token = row
    params: dict[str, Any] = {"id": turn_id, "token": token, "interrupt": None}
    if parent_id is None:  # a send: the model asks for approval, the turn pauses
        text = turn_input["message"]["content"][0]["text"]
        approval = {"action": "transferMoney", "details": text}
        paused = _request("approval-1", "userApproval", approval, {"interrupt": True})
        params.update(
            finish="interrupted",
            output=Jsonb([{"role": "model", "content": [paused]}]),
            ref="approval-1",
            name="userApproval",
            call_input=Jsonb(approval),
            call_status="interrupted",
            call_output=None,
            interrupt=Jsonb(True),
        )
        await _fenced(connection, SETTLE, params)
        return
    # A resume: read the paused message, transfer (idempotency key), answer.
    cursor = await connection.execute("SELECT output FROM fturns WHERE id = %s", (parent_id,))
    found = await cursor.fetchone()
    assert found is not None, parent_id
    paused_part = found[0][-1]["content"][0]
    approval = paused_part["toolRequest"]["input"]
    decision = turn_input["respond"][0]["toolResponse"]["output"]
    match = _TRANSFER.search(approval["details"])
    assert match is not None and decision["approved"] is True
    transfer = {"amount": int(match[1]), "toAccount": match[2]}
    amended = dict(paused_part, metadata={"resolvedInterrupt": True})
    messages: list[dict[str, Any]] = [
        {"role": "model", "content": [amended]},
        {
            "role": "tool",
            "content": [_response("approval-1", "userApproval", decision)],
            "metadata": {"resumed": True},
        },
        {"role": "model", "content": [_request("transfer-1", "transferMoney", transfer)]},
    ]
    call = {"ref": "transfer-1", "name": "transferMoney", "call_input": Jsonb(transfer)}
    if checkpoints and not await _fenced(
        connection, OPEN_ROUND, {**params, **call, "output": Jsonb(messages)}
    ):
        return
    account = re.sub(r"[^a-z0-9]+", "-", match[2].lower()).strip("-")
    receipt = {"success": True, "transactionId": f"txn-{match[1]}-{account}"}
    messages.append(
        {"role": "tool", "content": [_response("transfer-1", "transferMoney", receipt)]}
    )
    if checkpoints and not await _fenced(
        connection,
        CLOSE_ROUND,
        {**params, **call, "call_output": Jsonb(receipt), "output": Jsonb(messages)},
    ):
        return
    messages.append(
        {"role": "model", "content": [{"text": f"Done. Transaction {receipt['transactionId']}."}]}
    )
    params.update(finish="stop", output=Jsonb(messages))
    if checkpoints:
        await _fenced(connection, SETTLE_TURN, params)
        return
    params.update(call, call_status="done", call_output=Jsonb(receipt))
    await _fenced(connection, SETTLE, params)


def _append(path: str, lines: list[str]) -> None:
    with open(path, "a", encoding="utf-8") as handle:
        handle.writelines(lines)


async def _first(*events: asyncio.Event, timeout: float) -> None:
    waiters = [asyncio.create_task(e.wait()) for e in events]
    try:
        await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
        await asyncio.gather(*waiters, return_exceptions=True)


async def serve(
    dsn: str, slots: int, claim_log: str, poll: float = 1.0, *, checkpoints: bool = True
) -> None:
    """One floor worker process: claim up to the free slots, run each in its own connection
    (``checkpoints``: see :func:`_run_turn`)."""
    stop, work, freed = asyncio.Event(), asyncio.Event(), asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    owner = f"floor:{os.getpid()}"
    connect = psycopg.AsyncConnection.connect
    claimer = await connect(dsn, autocommit=True)
    idle: asyncio.Queue[psycopg.AsyncConnection[Any]] = asyncio.Queue()
    for _ in range(slots):
        idle.put_nowait(await connect(dsn, autocommit=True))
    listener = await connect(dsn, autocommit=True)
    await listener.execute(READY_QUERY)

    async def hear() -> None:
        async for _ in listener.notifies():
            work.set()

    async def run(row: tuple[Any, ...]) -> None:
        connection = await idle.get()
        try:
            await _run_turn(connection, row, checkpoints=checkpoints)
        finally:
            idle.put_nowait(connection)

    def finished(task: asyncio.Task[None]) -> None:
        running.discard(task)
        freed.set()
        if not task.cancelled() and task.exception() is not None:
            print(f"floor worker: turn failed: {task.exception()!r}", flush=True)

    hearing = asyncio.create_task(hear())
    running: set[asyncio.Task[None]] = set()
    claims: list[str] = []
    try:
        while not stop.is_set():
            freed.clear()
            free = slots - len(running)
            if free <= 0:
                await _first(stop, freed, timeout=poll)
                continue
            work.clear()
            cursor = await claimer.execute(CLAIM, {"owner": owner, "limit": free})
            rows = await cursor.fetchall()
            now = time.time()
            for row in rows:
                claims.append(f"{now:.6f} {row[0]} 1\n")
                task = asyncio.create_task(run(row))
                running.add(task)
                task.add_done_callback(finished)
            if len(rows) < free:
                await _first(stop, freed, work, timeout=poll)
        await asyncio.gather(*running, return_exceptions=True)
    finally:
        hearing.cancel()
        await asyncio.gather(hearing, return_exceptions=True)
        _append(claim_log, claims)  # at exit only: not worth a thread
        for connection in [claimer, listener, *[idle.get_nowait() for _ in range(idle.qsize())]]:
            await connection.close()


class FloorClient:
    """The bench side of the floor: ``connections`` connections shared by all clients (one
    statement at a time each), and one LISTEN connection whose notifications resolve
    per-turn futures (registered before the write, so none is lost)."""

    def __init__(self, dsn: str, connections: int = 8) -> None:
        self.dsn = dsn
        self.size = connections
        self.idle: asyncio.Queue[psycopg.AsyncConnection[Any]] = asyncio.Queue()
        self.waiters: dict[str, asyncio.Future[None]] = {}
        self._listener: psycopg.AsyncConnection[Any] | None = None
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> FloorClient:
        connect = psycopg.AsyncConnection.connect
        self._listener = await connect(self.dsn, autocommit=True)
        await self._listener.execute("LISTEN floor_turn")
        self._task = asyncio.create_task(self._hear(self._listener))
        for _ in range(self.size):
            self.idle.put_nowait(await connect(self.dsn, autocommit=True))
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        while not self.idle.empty():
            await self.idle.get_nowait().close()
        if self._listener is not None:
            await self._listener.close()

    async def _one(self, sql: str, params: Any) -> tuple[Any, ...] | None:
        """Run one statement on a free connection; its first row (``None`` if none)."""
        connection = await self.idle.get()
        try:
            cursor = await connection.execute(sql, params)
            row = await cursor.fetchone()
            return tuple(row) if row is not None else None
        finally:
            self.idle.put_nowait(connection)

    async def _hear(self, listener: psycopg.AsyncConnection[Any]) -> None:
        async for note in listener.notifies():
            waiter = self.waiters.pop(note.payload, None)
            if waiter is not None and not waiter.done():
                waiter.set_result(None)

    def _register(self, turn_id: str) -> asyncio.Future[None]:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiters[turn_id] = future
        return future

    async def _settled(self, turn_id: str, woken: asyncio.Future[None]) -> tuple[Any, ...]:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(woken), 1.0)  # NOTIFY, else poll
            row = await self._one(READ, (turn_id,))
            if row is not None and row[0] != "pending":
                self.waiters.pop(turn_id, None)
                return row
            if woken.done():
                woken = self._register(turn_id)

    async def workflow(self, client: int, k: int) -> Sample:
        """Send "Transfer $k to acct k", wait for the pause, approve, wait for the answer."""
        session, first = str(uuid.uuid4()), str(uuid.uuid4())
        message = {"role": "user", "content": [{"text": f"Transfer ${k + 1} to acct {k}"}]}
        woken = self._register(first)
        await self._one(
            SEND,
            {
                "id": first,
                "session": session,
                "input": Jsonb({"kind": "message", "message": message}),
            },
        )
        status, finish, _ = await self._settled(first, woken)
        if (status, finish) != ("completed", "interrupted"):
            raise RuntimeError(f"send settled {status}/{finish}")
        second = str(uuid.uuid4())
        answer = {"approved": True}
        resume_input = {
            "kind": "resume",
            "respond": [_response("approval-1", "userApproval", answer)],
            "restart": [],
        }
        woken = self._register(second)
        resume_at = time.time()
        created = await self._one(
            RESUME,
            {
                "id": second,
                "parent": first,
                "ref": "approval-1",
                "answer": Jsonb({"respond": answer}),
                "input": Jsonb(resume_input),
            },
        )
        if created is None:
            raise RuntimeError(f"approval of {first} is not pending")
        status, finish, output = await self._settled(second, woken)
        done_at = time.time()
        if (status, finish) != ("completed", "stop") or "Done." not in str(output[-1]):
            raise RuntimeError(f"resume settled {status}/{finish}")
        return Sample(second, resume_at, done_at)


def main() -> None:
    """``python -m bench.floor worker --dsn DSN --slots S --claim-log PATH [--settle-only]``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    commands = parser.add_subparsers(dest="command", required=True)
    worker = commands.add_parser("worker", help="run one floor worker process")
    worker.add_argument("--dsn", required=True)
    worker.add_argument("--slots", type=int, default=1)
    worker.add_argument("--claim-log", required=True)
    worker.add_argument(
        "--settle-only",
        action="store_true",
        help="no round checkpoints (the floor of earlier rounds, without their guarantees)",
    )
    args = parser.parse_args()
    asyncio.run(serve(args.dsn, args.slots, args.claim_log, checkpoints=not args.settle_only))


if __name__ == "__main__":
    main()
