"""Health probes and Prometheus metrics of real ``turnstile serve`` and ``turnstile worker``
processes on real PostgreSQL databases: nothing is mocked.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
from alembic import command
from prometheus_client.parser import text_string_to_metric_families

from stores.migrate import _config, head_revision
from tests.databases import drop_postgres_database, new_postgres_database, postgres_url
from tests.http_support import DEPLOYABLE_STATE_KEYS, ROOT, free_port, serve_process

TRANSFER = "Transfer $500 to my savings account"


def turn_body(text: str) -> dict[str, Any]:
    return {"data": {"message": {"role": "user", "content": [{"text": text}]}}, "init": {}}


def scrape(base: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """``/metrics`` as ``{(sample name, sorted labels): value}``."""
    response = httpx.get(f"{base}/metrics", timeout=10)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str
) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def wait_until(check: Callable[[], bool], *, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.1)


def test_metrics_after_a_turn_that_pauses_for_approval() -> None:
    """A turn paused at an approval shows as one open approval, its request as a 200 on the
    route template, the pool's claim and settle as counts; the decision closes the approval."""
    with postgres_url() as url, serve_process(url, workers=1) as (base, _process):
        paused = httpx.post(f"{base}/api/bankingAgent", json=turn_body(TRANSFER), timeout=30)
        assert paused.json()["result"]["finishReason"] == "interrupted"

        samples = scrape(base)
        assert value(samples, "turnstile_database_up") == 1
        assert value(samples, "turnstile_approvals_open", agent="bankingAgent") == 1
        assert value(samples, "turnstile_approvals_oldest_age_seconds", agent="bankingAgent") > 0
        assert value(samples, "turnstile_queue_depth", agent="bankingAgent") == 0
        assert value(samples, "turnstile_turns", agent="bankingAgent", status="pending") == 0
        assert value(samples, "turnstile_turns_running", agent="bankingAgent") == 0
        assert value(samples, "turnstile_worker_slots") == 1
        assert value(samples, "turnstile_worker_slots_busy") == 0
        assert value(samples, "turnstile_worker_turns_claimed_total") == 1
        assert value(samples, "turnstile_worker_turns_settled_total") == 1
        agent = {"agent": "bankingAgent"}
        assert value(samples, "turnstile_claim_latency_seconds_count", **agent) == 1
        completed = {"agent": "bankingAgent", "status": "completed"}
        assert value(samples, "turnstile_turn_duration_seconds_count", **completed) == 1
        request = {"method": "POST", "route": "/api/{agent}", "status": "200"}
        assert value(samples, "turnstile_http_requests_total", **request) == 1
        assert (
            value(samples, "turnstile_http_request_duration_seconds_count", route="/api/{agent}")
            == 1
        )
        assert value(samples, "turnstile_build_info", version=_installed_version()) == 1
        # One model call, which asked for the approval: a tool run that paused, no error.
        model = {"agent": "bankingAgent", "model": "scripted"}
        assert value(samples, "turnstile_model_call_duration_seconds_count", **model) == 1
        approval = {"agent": "bankingAgent", "tool": "userApproval"}
        assert value(samples, "turnstile_tool_call_duration_seconds_count", **approval) == 1
        assert not any(
            name.startswith(("turnstile_model_call_errors", "turnstile_tool_call_errors"))
            for name, _ in samples
        )
        assert value(samples, "turnstile_lease_losses_total", agent="bankingAgent") == 0
        # The raw path never becomes a label: only route templates do.
        assert not any("bankingAgent" in dict(labels).get("route", "") for _, labels in samples)

        inbox = httpx.get(f"{base}/inbox", timeout=10).json()["items"]
        decided = httpx.post(
            f"{base}/inbox/{inbox[0]['id']}/decision",
            json={"respond": {"approved": True}},
            timeout=10,
        )
        assert decided.status_code == 200, decided.text
        samples = scrape(base)
        assert value(samples, "turnstile_approvals_open", agent="bankingAgent") == 0
        # The approved resume asked the model for the transfer, ran it once, then asked the
        # model for its summary: two more model calls.
        wait_until(
            lambda: scrape(base).get(("turnstile_worker_turns_settled_total", ()), 0) == 2,
            timeout=10,
            what="the resume to settle",
        )
        samples = scrape(base)
        transfer = {"agent": "bankingAgent", "tool": "transferMoney"}
        assert value(samples, "turnstile_tool_call_duration_seconds_count", **transfer) == 1
        assert value(samples, "turnstile_tool_call_duration_seconds_count", **approval) == 1
        assert value(samples, "turnstile_model_call_duration_seconds_count", **model) == 3
        assert value(samples, "turnstile_approvals_oldest_age_seconds", agent="bankingAgent") == 0
        route = "/inbox/{approval_id}/decision"
        assert (
            value(
                samples, "turnstile_http_requests_total", method="POST", route=route, status="200"
            )
            == 1
        )


def _installed_version() -> str:
    import importlib.metadata

    try:
        return importlib.metadata.version("turnstile")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def test_a_queued_turn_shows_in_the_queue_until_a_worker_claims_it() -> None:
    """With no worker, a detached turn waits in the queue: depth 1 and a growing age."""
    with postgres_url() as url, serve_process(url, workers=0) as (base, _process):
        body = turn_body("hello queue")
        body["data"]["detach"] = True
        detached = httpx.post(f"{base}/api/bankingAgent", json=body, timeout=30)
        assert detached.json()["result"]["finishReason"] == "detached"
        time.sleep(0.2)
        samples = scrape(base)
        assert value(samples, "turnstile_queue_depth", agent="bankingAgent") == 1
        assert value(samples, "turnstile_turns", agent="bankingAgent", status="pending") == 1
        assert value(samples, "turnstile_queue_oldest_age_seconds", agent="bankingAgent") >= 0.2
        # A process without a pool has no worker series.
        assert not any(name.startswith("turnstile_worker_") for name, _ in samples)


def test_readyz_follows_the_schema_and_healthz_never_touches_the_database() -> None:
    """/readyz is 503 (with the reason) on a database taken back to no schema at all, and 200
    again after `turnstile migrate`; /healthz answers 200 throughout."""
    with postgres_url() as url, serve_process(url, workers=0) as (base, _process):
        ready = httpx.get(f"{base}/readyz", timeout=10)
        assert ready.status_code == 200
        assert ready.json()["checks"]["database"] == f"at head {head_revision()}"

        command.downgrade(_config(url), "base")
        time.sleep(1.1)  # a readiness result is reused for a second
        unready = httpx.get(f"{base}/readyz", timeout=10)
        assert unready.status_code == 503
        assert "empty (never migrated)" in unready.json()["reason"]
        assert "turnstile migrate" in unready.json()["reason"]
        assert httpx.get(f"{base}/healthz", timeout=10).status_code == 200

        migrated = subprocess.run(
            [sys.executable, "-m", "workers.cli", "migrate", "--db", url],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert migrated.returncode == 0, migrated.stderr
        wait_until(
            lambda: httpx.get(f"{base}/readyz", timeout=10).status_code == 200,
            timeout=10,
            what="/readyz to answer 200 after the migration",
        )


def test_a_lost_database_makes_readyz_503_and_metrics_say_so_never_500() -> None:
    """Drop the server's database under it: /readyz answers 503 with the reason, /metrics
    answers 200 with turnstile_database_up 0, /healthz stays 200."""
    url = new_postgres_database()
    try:
        with serve_process(url, workers=0) as (base, _process):
            assert httpx.get(f"{base}/readyz", timeout=10).status_code == 200
            drop_postgres_database(url)
            time.sleep(1.1)
            unready = httpx.get(f"{base}/readyz", timeout=20)
            assert unready.status_code == 503
            assert unready.json()["reason"].startswith("database: database unreachable")
            assert value(scrape(base), "turnstile_database_up") == 0
            assert httpx.get(f"{base}/healthz", timeout=10).status_code == 200
    finally:
        drop_postgres_database(url)


#: The example's published key is refused without --dev: sign with a key of the tests'.
WORKER_ENV = {**os.environ, "TURNSTILE_STATE_KEYS": DEPLOYABLE_STATE_KEYS}


@contextlib.contextmanager
def worker_with_health_port(url: str, *extra: str) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """``turnstile worker --health-port``; yields the health server's base URL."""
    port = free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "workers.cli",
            "worker",
            "--app",
            "examples.banking:ai",
            "--db",
            url,
            "--concurrency",
            "2",
            "--health-port",
            str(port),
            "--log-level",
            "WARNING",
            *extra,
        ],
        cwd=ROOT,
        env=WORKER_ENV,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: _answers(f"{base}/healthz"), timeout=30, what="the health port")
        yield base, process
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.TransportError:
        return False


def test_worker_health_port_serves_probes_and_metrics() -> None:
    """A worker-only process answers /healthz, /readyz (pool running, schema at head) and
    /metrics, and counts the turn it ran; its health port closes when it stops."""
    with (
        postgres_url() as url,
        serve_process(url, workers=0) as (server, _server),
        worker_with_health_port(url) as (health, worker),
    ):
        assert httpx.get(f"{health}/healthz", timeout=10).json() == {"status": "ok"}
        ready = httpx.get(f"{health}/readyz", timeout=10)
        assert ready.status_code == 200
        assert ready.json()["checks"] == {
            "workers": "running (2 slots)",
            "database": f"at head {head_revision()}",
        }
        paused = httpx.post(f"{server}/api/bankingAgent", json=turn_body(TRANSFER), timeout=30)
        assert paused.json()["result"]["finishReason"] == "interrupted"
        samples = scrape(health)
        assert value(samples, "turnstile_worker_slots") == 2
        assert value(samples, "turnstile_worker_turns_claimed_total") == 1
        assert value(samples, "turnstile_approvals_open", agent="bankingAgent") == 1
        assert (
            value(
                samples,
                "turnstile_http_requests_total",
                method="GET",
                route="/readyz",
                status="200",
            )
            == 1
        )
        worker.terminate()
        assert worker.wait(timeout=15) == 0
        assert not _answers(f"{health}/healthz")


def test_worker_refuses_a_health_port_in_use() -> None:
    """A --health-port another process listens on is a usage error (exit 2), not a crash."""
    with postgres_url() as url, worker_with_health_port(url) as (health, _worker):
        port = health.rsplit(":", 1)[1]
        refused = subprocess.run(
            [
                sys.executable,
                "-m",
                "workers.cli",
                "worker",
                "--app",
                "examples.banking:ai",
                "--db",
                url,
                "--health-port",
                port,
            ],
            cwd=ROOT,
            env=WORKER_ENV,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert refused.returncode == 2, refused.stderr
    assert "cannot listen on --health-port" in refused.stderr
