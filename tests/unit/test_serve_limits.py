"""The pieces of serve's hardening and metrics that need no server: flag validation, the
log filter that bounds floods, the default connection limit and the pool observer."""

from __future__ import annotations

import logging
import resource
import time
from datetime import UTC, datetime, timedelta

import pytest
from prometheus_client import CollectorRegistry

from engine.status import TurnStatus
from engine.store import TurnInput, TurnRecord
from workers.cli import main
from workers.http_limits import (
    DEFAULT_MAX_CONNECTIONS,
    ConnectionLimits,
    RateLimitedLog,
    RequestSlots,
    SlotBudget,
    default_connection_limit,
)
from workers.metrics import PoolMetrics


@pytest.mark.parametrize(
    ("flags", "complaint"),
    [
        (["--limit-concurrency", "50", "--limit-connections", "10"], "exceeds --limit-connections"),
        (["--header-timeout", "0"], "expected a finite number of seconds > 0"),
        (["--body-timeout", "-1"], "expected a number of seconds >= 0"),
        (["--limit-connections", "0"], "expected a whole number >= 1"),
        (["--limit-concurrency", "4", "--limit-per-client", "5"], "exceeds --limit-concurrency"),
        (["--limit-streams", "0"], "expected a whole number >= 1"),
        (["--max-header-bytes", "lots"], "expected a whole number >= 1"),
    ],
)
def test_bad_limit_flags_are_usage_errors(
    flags: list[str], complaint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each bad limit exits 2 with a message naming it, before the app is imported."""
    assert exit_status(["serve", "--app", "no_such_module_here:ai", *flags]) == 2
    assert complaint in capsys.readouterr().err


def exit_status(argv: list[str]) -> int:
    """``main``'s exit status, whether it returns it or argparse exits with it."""
    try:
        return main(argv)
    except SystemExit as exc:
        return int(exc.code or 0)


def test_worker_health_port_must_be_a_port(capsys: pytest.CaptureFixture[str]) -> None:
    assert exit_status(["worker", "--app", "x:y", "--health-port", "70000"]) == 2
    assert "expected a port number 0-65535" in capsys.readouterr().err


def test_default_connection_limit_leaves_half_the_open_files() -> None:
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    expected = DEFAULT_MAX_CONNECTIONS
    if soft != resource.RLIM_INFINITY:
        expected = max(16, min(DEFAULT_MAX_CONNECTIONS, soft // 2))
    assert default_connection_limit() == expected


def test_request_budgets_default_to_shares_of_the_connection_limits() -> None:
    """A client address may hold a quarter of the request slots, streams get a quarter of
    the connections (a client a quarter of those), and sign-in a small budget of its own."""
    limits = ConnectionLimits(max_connections=1000, max_requests=500)
    assert limits.requests == SlotBudget(total=500, per_client=125)
    assert limits.streams == SlotBudget(total=250, per_client=62)
    assert limits.sign_ins == SlotBudget(total=16, per_client=4)
    assert limits.body_deadlines == {"/ui/login": 5.0}
    tiny = ConnectionLimits(max_connections=2, max_requests=1, max_requests_per_client=3)
    assert tiny.requests == SlotBudget(total=1, per_client=1)
    assert tiny.streams == SlotBudget(total=1, per_client=1)


def test_each_path_takes_the_slots_of_its_kind() -> None:
    """Probes take no slot; sign-in and event streams take their own, the rest the shared."""
    slots = RequestSlots(ConnectionLimits(max_connections=100, max_requests=8))
    assert slots.for_path("/healthz") is None
    assert slots.for_path("/metrics") is None
    assert slots.for_path("/ui/login") is slots.sign_in
    assert slots.for_path("/ui/events") is slots.streams
    assert slots.for_path("/api/bankingAgent") is slots.requests
    assert slots.for_path("/ui/inbox/live") is slots.requests


def test_a_client_past_its_share_gets_429_and_a_full_server_503() -> None:
    """A client holding its share gets 429 while slots are free; once every slot is busy
    every newcomer gets 503; giving slots back frees them and forgets idle clients."""
    limits = ConnectionLimits(max_connections=100, max_requests=4, max_requests_per_client=2)
    slots = RequestSlots(limits)
    shared = slots.requests
    assert [shared.take("a"), shared.take("a"), shared.take("a")] == [None, None, 429]
    assert [shared.take("b"), shared.take("c")] == [None, None]
    assert slots.saturation() == "all 4 request slots are busy"
    assert [shared.take("d"), shared.take("a")] == [503, 503]
    for client in ("a", "b", "c"):
        shared.give_back(client)
    assert slots.saturation() is None
    assert shared.by_client == {"a": 1}
    assert slots.describe() == "1 of 4 request slots busy, 0 event stream(s), 0 sign-in(s)"


def _record(message: str, *args: object) -> logging.LogRecord:
    return logging.LogRecord("uvicorn.error", logging.WARNING, __file__, 1, message, args, None)


def test_rate_limited_log_lets_a_burst_through_then_counts_what_it_held_back() -> None:
    """Five lines of a kind pass, the rest of the interval is held back, and the first line
    of the next interval says how many were; other kinds are not affected."""
    flood = RateLimitedLog(burst=5, interval=0.2)
    passed = [flood.filter(_record("Invalid HTTP request received.")) for _ in range(50)]
    assert passed == [True] * 5 + [False] * 45
    assert flood.filter(_record("another kind %s", 1))
    time.sleep(0.25)
    next_window = _record("Invalid HTTP request received.")
    assert flood.filter(next_window)
    assert next_window.getMessage().endswith("(45 similar line(s) held back)")


def _turn(status: TurnStatus, *, waited: float) -> TurnRecord:
    now = datetime.now(UTC)
    return TurnRecord(
        id="t1",
        session_id="s1",
        agent="bankingAgent",
        parent_id=None,
        status=status,
        input=TurnInput(kind="message"),
        run_after=now - timedelta(seconds=waited),
        created_at=now - timedelta(seconds=waited),
        updated_at=now,
    )


def test_pool_metrics_observe_claims_durations_and_retries() -> None:
    """What a pool reports through the observer interface lands in the histograms and the
    retry counter, by agent and outcome."""
    registry = CollectorRegistry()
    observer = PoolMetrics(registry)
    claimed = _turn(TurnStatus.PENDING, waited=2.0)
    observer.turn_claimed(claimed)
    observer.turn_finished(claimed, _turn(TurnStatus.PENDING, waited=0), 0.5)
    observer.turn_finished(claimed, _turn(TurnStatus.COMPLETED, waited=0), 1.5)
    observer.turn_finished(claimed, None, 0.1)

    def sample(name: str, **labels: str) -> float:
        found = registry.get_sample_value(name, labels)
        assert found is not None, (name, labels)
        return found

    assert sample("turnstile_claim_latency_seconds_count", agent="bankingAgent") == 1
    assert sample("turnstile_claim_latency_seconds_sum", agent="bankingAgent") >= 2.0
    duration = "turnstile_turn_duration_seconds_count"
    assert sample(duration, agent="bankingAgent", status="completed") == 1
    assert sample(duration, agent="bankingAgent", status="pending") == 1
    assert sample(duration, agent="bankingAgent", status="error") == 1
    assert sample("turnstile_turn_retries_total", agent="bankingAgent") == 1
