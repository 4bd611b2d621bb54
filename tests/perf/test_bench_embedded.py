"""Turnstile with its worker pool in the benchmark's own process: ``bench/approvals.py --impl
turnstile-embedded`` runs tiny workloads end to end and reports them like ``turnstile``, with
every resume's pickup logged, and ``bench/statement_budget.py --embedded`` budgets one.

The runs are real: databases on the test server (a private instance for the budget), real
workflows through the product; only the workflow counts are small.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench import approvals, statement_budget
from bench.common import ServerStats
from bench.report import EMBEDDED, Latencies, Result, report

WORKFLOWS, IDLE = 6, 2


@pytest.fixture
def signal_handlers() -> Iterator[None]:
    """The benchmarks' main() makes SIGTERM raise KeyboardInterrupt; undo it afterwards."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, handler in saved.items():
            signal.signal(signum, handler)


@pytest.mark.postgres
@pytest.mark.usefixtures("signal_handlers")
def test_the_embedded_configuration_reports_every_workflow_and_its_pickup(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With one process the embedded pool runs every turn alone; with two, a worker process
    runs beside it. Either way each workflow succeeds and each resumed turn's claim is in
    the run's claim logs, so the pickup latencies are complete."""
    out = tmp_path / "results.json"
    argv = ["--impl", EMBEDDED, "--processes", "1,2", "--slots", "2", "--clients", "3"]
    argv += ["--warmup", "2", "--workflows", str(WORKFLOWS), "--idle", str(IDLE)]
    assert approvals.main([*argv, "--json", str(out)]) == 0
    results = json.loads(out.read_text())
    assert [(r["impl"], r["processes"], r["slots"]) for r in results] == [
        (EMBEDDED, 1, 2),
        (EMBEDDED, 2, 2),
    ]
    for result in results:
        assert result["errors"] == []
        loaded, idle = result["loaded"], result["idle"]
        assert len(loaded["pickup_ms"]) == WORKFLOWS and len(idle["pickup_ms"]) == IDLE
        assert loaded["missing_pickups"] == idle["missing_pickups"] == 0
        assert len(loaded["settled_ms"]) == WORKFLOWS
    printed = capsys.readouterr().out
    assert f"1p x 2s {EMBEDDED}: " in printed and f"2p x 2s {EMBEDDED}: " in printed
    assert "failed workflows" not in printed


def _result(impl: str, rate: float) -> Result:
    stats = ServerStats(0, 0, 0, 0, 0, 0, 0)
    return Result(
        impl=impl,
        processes=1,
        slots=8,
        warmup=0,
        workflows=int(rate),
        idle_workflows=0,
        seconds=1.0,
        loaded=Latencies(),
        idle=Latencies(),
        stats=stats,
        client_cpu_s=0.0,
        worker_cpu_s=0.0,
    )


def test_the_embedded_configuration_gets_its_own_ratios() -> None:
    """Each of our configurations is compared with the same configuration's floor and peer,
    in the throughput table and in the targets."""
    results = [
        _result("turnstile", 100),
        _result(EMBEDDED, 150),
        _result("floor", 200),
        _result("langgraph", 50),
    ]
    text = report(results)
    throughput = text.split("\n\n")[0].splitlines()  # title, header, rule, rows
    rows = {line.split("  ")[0].strip(): line.split() for line in throughput[3:]}
    assert rows["1p x 8s turnstile"][4:7] == ["100.0", "50%", "2.00x"]
    assert rows[f"1p x 8s {EMBEDDED}"][4:7] == ["150.0", "75%", "3.00x"]
    assert f"1p x 8s {EMBEDDED}: 75% of the floor's throughput" in text
    assert f"1p x 8s {EMBEDDED}: 3.00x langgraph's throughput" in text
    assert "1p x 8s turnstile: 2.00x langgraph's throughput" in text


@pytest.mark.postgres
@pytest.mark.usefixtures("signal_handlers")
def test_the_statement_budget_runs_with_the_pool_in_its_own_process(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--embedded``: no worker process, the same budget, labelled as the embedded pool."""
    out = tmp_path / "budget.json"
    argv = ["--embedded", "--slots", "2", "--workflows", str(WORKFLOWS), "--clients", "3"]
    assert statement_budget.main([*argv, "--json", str(out)]) == 0
    (result,) = json.loads(out.read_text())
    assert result["label"] == "embedded pool x 2 slots"
    totals = result["totals"]
    assert totals["errors"] == 0 and totals["workflows"] == WORKFLOWS
    assert totals["commits"] >= WORKFLOWS and totals["wal_bytes"] > 0
    assert any(not line["nested"] and line["calls"] >= 1 for line in result["lines"])
    assert "embedded pool x 2 slots: 6 workflows" in capsys.readouterr().out
