"""The peer: the approval workflow in LangGraph, checkpointed in PostgreSQL by PostgresSaver.

Not the product and not a floor: what a user who does not pick Turnstile would write, so
``bench/approvals.py --impl turnstile,langgraph`` reports Turnstile's throughput as a ratio
to it, measured in the same run, the implementations alternating round by round. LangGraph
is an optional dependency of the benchmark only (``make test`` does not need it)::

    .venv/bin/pip install -e '.[bench]'        # langgraph, langgraph-checkpoint-postgres
    .venv/bin/python bench/approvals.py --impl turnstile,floor,langgraph \\
        --processes 1 --slots 1,8 --rounds 3 --workflows 800 --idle 50

The graph (``MessagesState``, LangChain messages, the compiled graph's ``checkpointer``):

* ``model`` — a deterministic offline stand-in answering as ``engine.scripted.ScriptedModel``
  does for this workload, without sleeping: to "Transfer $N to X" it calls ``userApproval``
  ``{action, details}`` (tool call ``approval-1``); to an approving answer it calls
  ``transferMoney`` ``{amount, toAccount}`` (``transfer-1``); to the receipt it says
  ``Done. Transaction txn-N-x.``;
* ``approval`` — LangGraph's human in the loop: ``interrupt()`` with the request; resumed by
  ``Command(resume=decision)``, it answers the tool call with the decision;
* ``transfer`` — books the transfer under the idempotency key ``<thread id>:<tool call id>``
  (once per key, as a payment API does) and answers with the receipt;
* ``model`` goes to the node of the tool it called, or ends; both tools go back to ``model``.

One workflow: ``invoke`` a new thread with the user's message (returns paused at the
interrupt, checked), then ``invoke(Command(resume={"approved": True}))`` on it (returns the
final answer, checked). Every step is checkpointed in PostgreSQL with the ``durability``
given (``sync`` by default: each step's checkpoint is written before the next step starts,
so the transfer's request is stored before it runs and its receipt before the model is
asked again — the guarantees Turnstile keeps; LangGraph's own default is ``async``).

Configuration P processes x S slots: P processes (``multiprocessing``, spawned), each with
one compiled graph and one saver on a ``psycopg_pool`` pool of S connections (with the
settings LangGraph documents: autocommit, ``prepare_threshold=0``, ``dict_row``), running S
workflows at a time: ``langgraph`` is the sync ``PostgresSaver`` with S threads,
``langgraph-async`` the ``AsyncPostgresSaver`` with S asyncio tasks (async nodes). The
processes take workflow numbers from one shared counter until the phase's last one.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import multiprocessing
import re
import resource
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from multiprocessing.sharedctypes import Synchronized
from typing import Any, TypeAlias, cast

import psycopg
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.types import Command, interrupt
from psycopg.rows import DictRow, dict_row
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from bench.common import Sample
from bench.report import PEERS
from engine.scripted import transaction_id

__all__ = ["DURABILITIES", "PEERS", "Bank", "Peer", "build_graph", "setup"]

#: LangGraph's durability modes (``invoke(..., durability=...)``).
DURABILITIES = ("sync", "async", "exit")

#: What LangGraph's savers need of their connections (as its ``from_conn_string`` sets).
_CONNECTION: dict[str, Any] = {"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row}

_TRANSFER = re.compile(r"transfer \$?(\d+) to (.+)", re.IGNORECASE)
_APPROVAL, _TRANSFER_MONEY = "userApproval", "transferMoney"


def setup(dsn: str) -> None:
    """Create the saver's tables in the (fresh) database: ``PostgresSaver.setup()``."""
    with psycopg.connect(dsn, **_CONNECTION) as connection:
        PostgresSaver(connection).setup()


@dataclass
class Bank:
    """The transfers made, by idempotency key: a key books once, however often it is sent;
    ``executed`` counts the calls (the benchmark checks: one per approved workflow)."""

    booked: dict[str, dict[str, Any]] = field(default_factory=dict)
    executed: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def transfer(self, key: str, amount: int, account: str) -> dict[str, Any]:
        """Book ``amount`` to ``account`` under ``key`` (unless booked already); the receipt."""
        with self.lock:
            self.executed += 1
            if key not in self.booked:
                receipt = {"success": True, "transactionId": transaction_id(amount, account)}
                self.booked[key] = receipt
            return self.booked[key]


def _requested(text: str) -> tuple[int, str] | None:
    """The transfer a user's text asks for, as the scripted model reads it (rule a)."""
    match = _TRANSFER.search(text)
    if match is None:
        return None
    return int(match[1]), match[2].strip().rstrip(".!?").strip()


Update = dict[str, list[AnyMessage]]


def _call(name: str, ref: str, args: dict[str, Any]) -> Update:
    return {"messages": [AIMessage("", tool_calls=[{"name": name, "args": args, "id": ref}])]}


def _say(text: str) -> Update:
    return {"messages": [AIMessage(text)]}


def _model(state: MessagesState, config: RunnableConfig) -> Update:
    """The scripted model's answer to the conversation so far (this workload's rules)."""
    messages = state["messages"]
    last = messages[-1]
    if isinstance(last, ToolMessage):
        output = json.loads(str(last.content))
        if last.name == _TRANSFER_MONEY:
            return _say(f"Done. Transaction {output['transactionId']}.")
        if last.name != _APPROVAL:
            return _say("Unhandled tool response.")
        if output.get("approved") is not True:
            return _say(f"Transfer cancelled: {output.get('feedback') or 'denied'}")
        users = (m for m in reversed(messages) if isinstance(m, HumanMessage))
        asked = next((t for m in users if (t := _requested(str(m.content)))), None)
        if asked is None:
            return _say("Unhandled tool response.")
        amount, account = asked
        return _call(_TRANSFER_MONEY, "transfer-1", {"amount": amount, "toAccount": account})
    text = str(last.content)
    asked = _requested(text)
    if asked is None:
        return _say(f"Echo: {text}")
    details = f"Transfer ${asked[0]} to {asked[1]}"
    return _call(_APPROVAL, "approval-1", {"action": _TRANSFER_MONEY, "details": details})


def build_graph(checkpointer: Any, bank: Bank, *, asynchronous: bool = False) -> Any:
    """The compiled approval graph (async node functions with ``asynchronous``)."""

    def tool_call(state: MessagesState) -> dict[str, Any]:
        last = state["messages"][-1]
        assert isinstance(last, AIMessage) and last.tool_calls
        return dict(last.tool_calls[0])

    def approval(state: MessagesState, config: RunnableConfig) -> Update:
        request = tool_call(state)
        decision = interrupt(request["args"])  # a resume re-runs the node: this returns it
        answer = ToolMessage(json.dumps(decision), name=_APPROVAL, tool_call_id=request["id"])
        return {"messages": [answer]}

    def transfer(state: MessagesState, config: RunnableConfig) -> Update:
        request = tool_call(state)
        key = f"{config['configurable']['thread_id']}:{request['id']}"
        args = request["args"]
        receipt = bank.transfer(key, args["amount"], args["toAccount"])
        answer = ToolMessage(json.dumps(receipt), name=_TRANSFER_MONEY, tool_call_id=request["id"])
        return {"messages": [answer]}

    def route(state: MessagesState) -> str:
        last = state["messages"][-1]
        calls = last.tool_calls if isinstance(last, AIMessage) else []
        return str(calls[0]["name"]) if calls else END

    def as_async(function: Callable[[MessagesState, RunnableConfig], Update]) -> Any:
        """The node itself, or (``asynchronous``) a coroutine function calling it: LangGraph's
        ``ainvoke`` runs a sync node in a thread pool."""
        if not asynchronous:
            return function

        async def node(state: MessagesState, config: RunnableConfig) -> Update:
            return function(state, config)

        return node

    graph = StateGraph(MessagesState)
    graph.add_node("model", as_async(_model))
    graph.add_node("approval", as_async(approval))
    graph.add_node("transfer", as_async(transfer))
    graph.add_edge(START, "model")
    graph.add_conditional_edges(
        "model", route, {_APPROVAL: "approval", _TRANSFER_MONEY: "transfer", END: END}
    )
    graph.add_edge("approval", "model")
    graph.add_edge("transfer", "model")
    return graph.compile(checkpointer=checkpointer)


def _opening(k: int) -> tuple[dict[str, Any], dict[str, Any], str]:
    """Workflow ``k``'s config (a new thread), first input and expected final answer."""
    config = {"configurable": {"thread_id": str(uuid.uuid4())}}
    first = {"messages": [HumanMessage(f"Transfer ${k + 1} to acct {k}")]}
    return config, first, f"Done. Transaction txn-{k + 1}-acct-{k}."


def _check_paused(paused: dict[str, Any]) -> None:
    interrupts = paused.get("__interrupt__") or []
    if len(interrupts) != 1 or interrupts[0].value.get("action") != _TRANSFER_MONEY:
        raise RuntimeError(f"not paused at the approval: {interrupts!r}")


def _check_done(done: dict[str, Any], expected: str) -> None:
    text = done["messages"][-1].content
    if text != expected or done.get("__interrupt__"):
        raise RuntimeError(f"unexpected answer {text!r}")


def _workflow(graph: Any, k: int, durability: str) -> Sample:
    config, first, expected = _opening(k)
    _check_paused(graph.invoke(first, config, durability=durability))
    resume_at = time.time()
    done = graph.invoke(Command(resume={"approved": True}), config, durability=durability)
    done_at = time.time()
    _check_done(done, expected)
    return Sample(config["configurable"]["thread_id"], resume_at, done_at)


async def _aworkflow(graph: Any, k: int, durability: str) -> Sample:
    config, first, expected = _opening(k)
    _check_paused(await graph.ainvoke(first, config, durability=durability))
    resume_at = time.time()
    done = await graph.ainvoke(Command(resume={"approved": True}), config, durability=durability)
    done_at = time.time()
    _check_done(done, expected)
    return Sample(config["configurable"]["thread_id"], resume_at, done_at)


#: A shared ``multiprocessing.Value("q")``: the next workflow number.
Counter: TypeAlias = "Synchronized[int]"


def _take(counter: Counter, end: int) -> int | None:
    """The next workflow number of the phase, or None when the phase is done."""
    with counter.get_lock():
        k = int(counter.value)
        if k >= end:
            return None
        counter.value = k + 1
    return k


#: What a process sends back after a phase: samples, errors, transfers executed in it.
Outcome = tuple[list[Sample], list[str], int]


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _serve_sync(dsn: str, slots: int, durability: str, counter: Counter, pipe: Connection) -> None:
    bank = Bank()
    kwargs = dict(_CONNECTION)
    with ConnectionPool(dsn, min_size=slots, max_size=slots, kwargs=kwargs) as pool:
        pool.wait()
        rows = cast("ConnectionPool[psycopg.Connection[DictRow]]", pool)  # dict_row, above
        graph = build_graph(PostgresSaver(rows), bank)
        pipe.send(_cpu())  # ready: what start-up cost

        def client(end: int, samples: list[Sample], errors: list[str]) -> None:
            while (k := _take(counter, end)) is not None:
                try:
                    samples.append(_workflow(graph, k, durability))
                except Exception as exc:
                    errors.append(repr(exc))

        with ThreadPoolExecutor(slots) as threads:
            while (order := pipe.recv()) is not None:
                end, width = order
                samples: list[Sample] = []
                errors: list[str] = []
                executed = bank.executed
                for future in [threads.submit(client, end, samples, errors) for _ in range(width)]:
                    future.result()
                pipe.send((samples, errors, bank.executed - executed))


async def _serve_async(
    dsn: str, slots: int, durability: str, counter: Counter, pipe: Connection
) -> None:
    bank = Bank()
    kwargs = dict(_CONNECTION)
    loop = asyncio.get_running_loop()
    pool = AsyncConnectionPool(dsn, min_size=slots, max_size=slots, kwargs=kwargs, open=False)
    async with pool:
        await pool.wait()
        rows = cast("AsyncConnectionPool[psycopg.AsyncConnection[DictRow]]", pool)
        graph = build_graph(AsyncPostgresSaver(rows), bank, asynchronous=True)
        pipe.send(_cpu())

        async def client(end: int, samples: list[Sample], errors: list[str]) -> None:
            while (k := _take(counter, end)) is not None:
                try:
                    samples.append(await _aworkflow(graph, k, durability))
                except Exception as exc:
                    errors.append(repr(exc))

        while (order := await loop.run_in_executor(None, pipe.recv)) is not None:
            end, width = order
            samples: list[Sample] = []
            errors: list[str] = []
            executed = bank.executed
            await asyncio.gather(*(client(end, samples, errors) for _ in range(width)))
            pipe.send((samples, errors, bank.executed - executed))


def _serve(
    impl: str, dsn: str, slots: int, durability: str, counter: Counter, pipe: Connection
) -> None:
    """One peer process: set up, report ready (with its CPU so far), run the phases it is sent
    (``(end, width)``: ``width`` clients taking numbers below ``end``) until ``None``."""
    if impl == "langgraph-async":
        asyncio.run(_serve_async(dsn, slots, durability, counter, pipe))
    else:
        _serve_sync(dsn, slots, durability, counter, pipe)


class Peer:
    """P peer processes of S slots, started by ``with``; :meth:`phase` runs workflows."""

    def __init__(self, impl: str, dsn: str, processes: int, slots: int, durability: str) -> None:
        if impl not in PEERS or durability not in DURABILITIES:
            raise ValueError(f"{impl} with durability {durability}")
        context = multiprocessing.get_context("spawn")
        self.counter: Counter = context.Value("q", 0)
        self.slots = slots
        self.processes: list[tuple[BaseProcess, Connection]] = []
        self.start_up_cpu = 0.0  # the processes' CPU when ready (imports, connecting)
        for _ in range(processes):
            mine, theirs = context.Pipe()
            args = (impl, dsn, slots, durability, self.counter, theirs)
            process = context.Process(target=_serve, args=args, daemon=True)
            self.processes.append((process, mine))

    def __enter__(self) -> Peer:
        for process, _ in self.processes:
            process.start()
        try:
            for process, pipe in self.processes:
                self.start_up_cpu += self._receive(process, pipe, timeout=120)
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @staticmethod
    def _receive(process: BaseProcess, pipe: Connection, timeout: float) -> Any:
        deadline = time.monotonic() + timeout
        while not pipe.poll(1.0):
            if not process.is_alive():
                raise RuntimeError(f"peer process exited with {process.exitcode}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"no answer from the peer process in {timeout:.0f} s")
        try:
            return pipe.recv()
        except EOFError:
            process.join(5)
            raise RuntimeError(f"peer process exited with {process.exitcode}") from None

    def phase(
        self, start: int, n: int, *, width: int | None = None, processes: int | None = None
    ) -> tuple[list[Sample], list[str], float]:
        """Run workflows ``start`` to ``start + n``, ``width`` at a time (default: the slots)
        in each of the first ``processes`` (default: all); samples, errors, wall seconds."""
        running = self.processes[:processes]
        self.counter.value = start
        started = time.perf_counter()
        for _, pipe in running:
            pipe.send((start + n, width or self.slots))
        outcomes: list[Outcome] = [self._receive(p, pipe, 120 + n) for p, pipe in running]
        seconds = time.perf_counter() - started
        samples = [s for outcome in outcomes for s in outcome[0]]
        errors = [e for outcome in outcomes for e in outcome[1]]
        executed = sum(outcome[2] for outcome in outcomes)
        if executed != len(samples):  # one transfer per completed workflow, no more
            errors.append(f"{executed} transfers executed for {len(samples)} workflows")
        return samples, errors, seconds

    def close(self) -> None:
        """Ask every process to stop, wait, terminate the ones left; they are reaped here."""
        for process, pipe in self.processes:
            if process.is_alive():
                with contextlib.suppress(OSError):  # it is exiting anyway
                    pipe.send(None)
        for process, pipe in self.processes:
            process.join(20)
            if process.is_alive():
                process.terminate()
                process.join(5)
            pipe.close()
