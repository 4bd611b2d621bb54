"""DNS rebinding against a real ``turnstile serve`` with no authenticator (issue 31, item 5).

A page on ``attacker.example`` that rebinds its name to 127.0.0.1 reaches the server with
``Host: attacker.example``. An open server answers only the local names, so that page can
neither read the inbox nor decide an approval; probes answer any ``Host``, and
``--allowed-hosts`` names the hosts a deployment is reached by.
"""

from __future__ import annotations

from typing import Any

import httpx
import psycopg

from tests.databases import libpq_dsn, postgres_url
from tests.http_support import serve_process

ATTACKER = {"host": "attacker.example"}
APPROVE = {"respond": {"approved": True}}


def paused_approval(base: str) -> str:
    """A transfer that waits for approval; the inbox id of that approval."""
    reply = httpx.post(
        f"{base}/api/bankingAgent",
        json={
            "data": {"message": {"role": "user", "content": [{"text": "transfer $40 to carol"}]}},
            "init": {},
        },
        timeout=60,
    )
    assert reply.status_code == 200, reply.text
    result: dict[str, Any] = reply.json()["result"]
    assert result["finishReason"] == "interrupted", result
    return f"{result['snapshotId']}:approval-1"


def turn_statuses(url: str) -> list[str]:
    with psycopg.connect(libpq_dsn(url)) as connection:
        rows = connection.execute("SELECT status::text FROM turns ORDER BY created_at").fetchall()
    return [status for (status,) in rows]


def test_a_rebound_name_can_neither_read_nor_decide_on_an_open_server() -> None:
    """Host ``attacker.example`` gets 400 on the API, the inbox and a decision, and changes
    nothing; the same requests by ``localhost`` are served, and ``/healthz`` answers both."""
    with postgres_url() as url, serve_process(url, workers=1) as (base, _process):
        port = base.rsplit(":", 1)[1]
        refused_send = httpx.post(
            f"{base}/api/bankingAgent",
            json={"data": {"message": {"role": "user", "content": [{"text": "hi"}]}}},
            headers=ATTACKER,
        )
        assert refused_send.status_code == 400, refused_send.text
        assert "allowed-hosts" in refused_send.json()["message"]
        assert turn_statuses(url) == []

        approval = paused_approval(base)
        before = turn_statuses(url)
        assert httpx.get(f"{base}/inbox", headers=ATTACKER).status_code == 400
        assert httpx.get(f"{base}/ui/", headers=ATTACKER).status_code == 400
        forged = httpx.post(f"{base}/inbox/{approval}/decision", json=APPROVE, headers=ATTACKER)
        assert forged.status_code == 400, forged.text
        assert turn_statuses(url) == before

        assert httpx.get(f"{base}/healthz", headers=ATTACKER).status_code == 200
        local = {"host": f"localhost:{port}"}
        assert httpx.get(f"{base}/inbox", headers=local).status_code == 200
        decided = httpx.post(
            f"{base}/inbox/{approval}/decision", json=APPROVE, headers=local, timeout=60
        )
        assert decided.status_code == 200, decided.text
        assert decided.json()["decided"] is True


def test_allowed_hosts_names_the_hosts_a_deployment_answers_to() -> None:
    """With ``--allowed-hosts turnstile.example`` that name is served and ``127.0.0.1`` is
    refused, except by the probes."""
    with (
        postgres_url() as url,
        serve_process(url, args=["--allowed-hosts", "turnstile.example"]) as (base, _process),
    ):
        named = httpx.get(f"{base}/inbox", headers={"host": "turnstile.example"})
        assert named.status_code == 200, named.text
        assert httpx.get(f"{base}/inbox").status_code == 400
        assert httpx.get(f"{base}/healthz").status_code == 200
