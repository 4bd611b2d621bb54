"""Outgoing webhooks with real processes on PostgreSQL: a ``turnstile serve``, a ``turnstile
worker`` and a receiver HTTP server the test starts. The receiver hears the approval opened;
then it goes down: the worker escalates the approval and reminds about it, its deliveries
retry (counted on the worker's ``/metrics``), and a lead's decision still completes the turn;
once the receiver is back, it sees opened, reminded, escalated and decided, each event once
and signed with the endpoint's secret, as ``turnstile webhooks ls`` lists them."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.acceptance.escalation_app import TOKENS
from tests.acceptance.inbox_ui_support import eventually, open_stack
from tests.http_support import free_port, run_turnstile
from tests.webhook_receiver import receiving

pytestmark = pytest.mark.postgres

SECRET = "whsec-acceptance-0123456789abcdef"
ESCALATE_SECONDS = 6


def sample(base: str, name: str, **labels: str) -> float | None:
    """One sample of ``base``'s ``/metrics`` (``None``: no such series)."""
    response = httpx.get(f"{base}/metrics", timeout=10)
    assert response.status_code == 200, response.text
    for family in text_string_to_metric_families(response.text):
        for found in family.samples:
            if found.name == name and all(found.labels.get(k) == v for k, v in labels.items()):
                return float(found.value)
    return None


def test_webhooks_survive_a_receiver_outage(tmp_path: Path) -> None:
    """Each approval event reaches the receiver once, signed, after its outage; the turn
    never waits for it."""
    health = free_port()
    with receiving(SECRET) as receiver:
        env = {
            "TURNSTILE_TEST_ESCALATE_SECONDS": str(ESCALATE_SECONDS),
            "TURNSTILE_TEST_WEBHOOK_URL": receiver.url,
            "TURNSTILE_TEST_WEBHOOK_SECRET": SECRET,
            "TURNSTILE_HEALTH_PORT": str(health),
        }
        with open_stack(
            tmp_path,
            app="tests.acceptance.webhook_app:ai",
            auth="tests.acceptance.escalation_app:auth",
            tokens=TOKENS,
            env=env,
        ) as stack:
            worker_metrics = f"http://127.0.0.1:{health}"
            asked = stack.send("Transfer $900 to bob", detach=False)
            assert asked["finishReason"] == "interrupted"
            turn = asked["snapshotId"]
            approval = f"{turn}:approval-1"

            opened = f"{approval}/opened"
            eventually(
                lambda: opened in receiver.events() or None, timeout=30, what="the opened event"
            )
            receiver.stop()

            # While it is down the worker escalates and reminds; those deliveries retry.
            eventually(
                lambda: (
                    (
                        sample(
                            worker_metrics, "turnstile_webhook_deliveries_total", outcome="retried"
                        )
                        or 0
                    )
                    >= 2
                    or None
                ),
                timeout=60,
                what="retried deliveries",
            )
            with stack.api("lena") as lena:
                eventually(
                    lambda: (
                        any(
                            item["id"] == approval
                            for item in lena.get("/inbox", params={"agent": stack.agent}).json()[
                                "items"
                            ]
                        )
                        or None
                    ),
                    timeout=60,
                    what="the escalation to leads",
                )
                decided = lena.post(
                    f"/inbox/{approval}/decision", json={"respond": {"approved": True}}
                )
            assert decided.status_code == 200, decided.text
            eventually(
                lambda: [t["amount"] for t in stack.transfers()] == [900] or None,
                timeout=30,
                what="the transfer, with the receiver still down",
            )
            assert (sample(stack.base, "turnstile_webhook_deliveries_pending") or 0) > 0

            receiver.start()
            eventually(
                lambda: sample(stack.base, "turnstile_webhook_deliveries_pending") == 0 or None,
                timeout=120,
                what="every delivery delivered",
            )
            assert (
                sample(worker_metrics, "turnstile_webhook_deliveries_total", outcome="delivered")
                or 0
            ) == len(receiver.received)
            assert (
                sample(worker_metrics, "turnstile_webhook_deliveries_total", outcome="failed") == 0
            )
            listed = run_turnstile("webhooks", "ls", "--turn", turn, "--json", db_url=stack.db_url)
            assert listed.returncode == 0, listed.stderr
            items = json.loads(listed.stdout)["items"]
            assert {i["status"] for i in items} == {"delivered"}
            assert sorted(i["event_id"] for i in items) == sorted(receiver.events())

    seen = receiver.events()
    assert all(r.signed for r in receiver.received), "every request verifies with the secret"
    assert [n for n in Counter(seen).values() if n > 1] == [], f"a repeat in {seen}"
    kinds = Counter(r.event["event"] for r in receiver.received)
    assert (kinds["opened"], kinds["escalated"], kinds["decided"]) == (1, 1, 1)
    assert kinds["reminded"] >= 1
    assert {r.event["turn_id"] for r in receiver.received} == {turn}
    by_kind = {r.event["event"]: r.event for r in receiver.received}
    assert by_kind["escalated"]["escalated_to"] == "leads"
    assert by_kind["decided"]["decided_by"] == "lena"
