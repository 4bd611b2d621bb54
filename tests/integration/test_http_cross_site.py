"""What docs/http.md ("Browsers: CORS and CSRF") promises a browser, over real HTTP: no CORS
preflight is approved, so a cross-site page can send only simple requests, and the API
refuses those (415) before anything runs."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.http_fixtures import Served, serve_banking

EVIL = "https://evil.example"
TURN = '{"data": {"message": {"role": "user", "content": [{"text": "Transfer $5 to x"}]}}}'


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    async with serve_banking("memory") as one:
        yield one


async def test_a_preflight_is_never_approved(served: Served) -> None:
    """The preflight a browser sends before a cross-site JSON post gets no CORS grant."""
    reply = await served.http.options(
        served.agent_url,
        headers={
            "origin": EVIL,
            "access-control-request-method": "POST",
            "access-control-request-headers": "content-type",
        },
    )
    assert reply.status_code >= 400
    assert not [h for h in reply.headers if h.lower().startswith("access-control-")]


@pytest.mark.parametrize(
    "content_type",
    ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", None],
)
async def test_simple_cross_site_posts_are_refused(
    served: Served, content_type: str | None
) -> None:
    """The posts a page may send without a preflight: 415, no CORS grant, nothing started."""
    headers = {"origin": EVIL}
    if content_type is not None:
        headers["content-type"] = content_type
    reply = await served.http.post(served.agent_url, content=TURN, headers=headers)
    assert reply.status_code == 415, reply.text
    assert "access-control-allow-origin" not in reply.headers
    assert (await served.inbox())["items"] == []
