"""What a client is told when the database goes away under a real ``turnstile serve``
(issue 31, item 8): a 503 that names neither the database's host, port nor name, on the
JSON API and on the inbox pages alike; the server's log keeps the driver's words."""

from __future__ import annotations

from pathlib import Path

import httpx
from sqlalchemy.engine import make_url

from engine.remote.wire import DATABASE_UNAVAILABLE
from tests.databases import drop_postgres_database, postgres_url
from tests.http_support import serve_process

TURN = {"data": {"message": {"role": "user", "content": [{"text": "hello"}]}}, "init": {}}


def test_a_lost_database_is_a_503_that_names_nothing_of_it(tmp_path: Path) -> None:
    """With the database dropped, the JSON inbox and the inbox page answer 503 and a turn
    fails (its result's error, as Genkit reports a failed turn), all without the database's
    name or address; the log names it for the operator."""
    log = tmp_path / "serve.log"
    with postgres_url() as url, serve_process(url, log=log) as (base, _process):
        assert httpx.get(f"{base}/inbox").status_code == 200
        drop_postgres_database(url)
        parsed = make_url(url)
        secrets = [str(parsed.database), f"{parsed.host}", f"port {parsed.port or 5432}"]

        turn = httpx.post(f"{base}/api/bankingAgent", json=TURN, timeout=60)
        inbox = httpx.get(f"{base}/inbox", timeout=60)
        page = httpx.get(f"{base}/ui/", timeout=60, follow_redirects=True)
        assert turn.status_code == 200, turn.text
        failed = turn.json()["result"]
        assert failed["finishReason"] == "failed"
        assert failed["error"]["status"] == "UNAVAILABLE"
        assert failed["error"]["message"].startswith(DATABASE_UNAVAILABLE)
        assert inbox.status_code == 503, inbox.text
        assert inbox.json()["message"].startswith(DATABASE_UNAVAILABLE), inbox.text
        assert page.status_code == 503, page.text
        assert DATABASE_UNAVAILABLE in page.text
        for answer in (turn, inbox, page):
            for secret in secrets:
                assert secret not in answer.text, (secret, answer.text)
    assert str(parsed.database) in log.read_text()
