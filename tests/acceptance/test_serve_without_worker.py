"""``turnstile serve`` never hangs silently for want of a worker: with ``--dev`` it runs its
own worker slots; otherwise a turn request that no worker claims within ``--worker-wait``
is answered 503 (the turn stays queued and runs once a worker starts), and ``/readyz`` says
why until one does."""

from __future__ import annotations

import concurrent.futures
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.databases import new_sqlite_database, postgres_url
from tests.http_support import serve_process, worker_process

TRANSFER = "Transfer $500 to my savings account"


def turn_body(text: str) -> dict[str, Any]:
    return {"data": {"message": {"role": "user", "content": [{"text": text}]}}, "init": {}}


def test_dev_serve_on_sqlite_answers_its_own_turns() -> None:
    """``serve --dev`` without ``--workers`` runs worker slots itself: a transfer sent to it
    pauses for approval, with no other process running."""
    url = new_sqlite_database()
    with serve_process(url, workers=None, args=["--dev"]) as (base, _process):
        answer = httpx.post(f"{base}/api/bankingAgent", json=turn_body(TRANSFER), timeout=60)
        assert answer.status_code == 200, answer.text
        assert answer.json()["result"]["finishReason"] == "interrupted"


@pytest.mark.postgres
def test_a_turn_no_worker_claims_is_answered_503_and_runs_once_a_worker_starts() -> None:
    """With no worker anywhere and ``--worker-wait 2``, a transfer is answered 503
    UNAVAILABLE naming its snapshot within seconds, /readyz turns 503 naming the queue, and
    a worker started afterwards runs the queued turn (it pauses) and readiness returns."""
    with (
        postgres_url() as url,
        serve_process(url, args=["--worker-wait", "2"]) as (base, _process),
    ):
        started = time.monotonic()
        answer = httpx.post(f"{base}/api/bankingAgent", json=turn_body(TRANSFER), timeout=60)
        assert 2 <= time.monotonic() - started < 15
        assert answer.status_code == 503, answer.text
        error = answer.json()
        assert error["status"] == "UNAVAILABLE"
        assert "stays queued" in error["message"]
        snapshot = error["details"]["snapshotId"]
        time.sleep(1.5)  # readiness is checked at most once a second
        unready = httpx.get(f"{base}/readyz", timeout=10)
        assert unready.status_code == 503, unready.text
        assert "wait for a worker" in unready.json()["checks"]["queue"]
        with worker_process(url):
            deadline = time.monotonic() + 30
            while True:
                found = httpx.post(
                    f"{base}/api/bankingAgent/getSnapshot",
                    json={"data": {"snapshotId": snapshot}},
                    timeout=10,
                ).json()["result"]
                if found["status"] != "pending" or time.monotonic() > deadline:
                    break
                time.sleep(0.3)
            assert found["status"] == "completed", found
            ready = httpx.get(f"{base}/readyz", timeout=10)
            assert ready.status_code == 200, ready.text


@pytest.mark.postgres
def test_sigterm_answers_a_request_waiting_for_a_worker_and_stops_cleanly(
    tmp_path: Path,
) -> None:
    """A serve with no worker, told to wait for ever, holds a transfer request; SIGTERM
    answers it 503 naming the still-queued turn within seconds, and the process exits 0
    with no traceback in its log."""
    log = tmp_path / "serve.log"
    with (
        postgres_url() as url,
        serve_process(url, args=["--worker-wait", "0"], log=log) as (base, process),
        concurrent.futures.ThreadPoolExecutor(1) as pool,
    ):
        waiting = pool.submit(
            httpx.post, f"{base}/api/bankingAgent", json=turn_body(TRANSFER), timeout=60
        )
        time.sleep(1.5)
        assert not waiting.done()
        stopped = time.monotonic()
        process.send_signal(signal.SIGTERM)
        answer = waiting.result(timeout=15)
        assert answer.status_code == 503, answer.text
        assert "server is stopping" in answer.json()["message"]
        assert answer.json()["details"]["snapshotId"]
        assert process.wait(timeout=15) == 0
        assert time.monotonic() - stopped < 10
    assert "Traceback" not in log.read_text()
