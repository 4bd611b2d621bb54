"""The server never echoes the request's Host in a redirect: over real HTTP, with a forged
``Host`` header, a path a trailing slash away from a route is redirected with a relative
``Location`` (path and query only)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from engine.remote.auth import inbox_policy_from_spec
from tests.http_fixtures import Served, bearer, serve_banking, token_auth

FORGED = {"host": "evil.example"}


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    """With an authenticator, so the forged ``Host`` reaches routing (an open server answers
    only local names: tests/acceptance/test_dns_rebinding.py)."""
    async with serve_banking("memory", auth=token_auth()) as one:
        yield one


@pytest.mark.parametrize(
    ("method", "path", "location"),
    [
        ("POST", "/api/bankingAgent/", "/api/bankingAgent"),
        ("POST", "/api/bankingAgent/?stream=true", "/api/bankingAgent?stream=true"),
        ("GET", "/api/bankingAgent/abort/", "/api/bankingAgent/abort"),
        ("POST", "/api/bankingAgent/getSnapshot/", "/api/bankingAgent/getSnapshot"),
    ],
)
async def test_a_slash_redirect_is_relative_whatever_the_host(
    served: Served, method: str, path: str, location: str
) -> None:
    reply = await served.http.request(
        method, served.url + path, headers=FORGED, json={} if method == "POST" else None
    )
    assert reply.status_code == 307
    assert reply.headers["location"] == location
    assert "evil.example" not in reply.text


async def test_following_the_relative_redirect_reaches_the_route(served: Served) -> None:
    """A client resolves the relative location against the URL it asked for (a 307 keeps
    the method and the body): the route itself answers."""
    reply = await served.http.post(
        f"{served.url}/api/bankingAgent/getSnapshot/",
        json={"data": {"snapshotId": "missing"}},
        headers=bearer("tok-alice"),
        follow_redirects=True,
    )
    assert reply.status_code == 404
    assert reply.json()["message"] == "Snapshot 'missing' not found for agent 'bankingAgent'."


async def test_a_path_that_would_leave_the_server_is_not_redirected(served: Served) -> None:
    """``//evil.example/`` would be a network-path reference: a 404, never a redirect."""
    async with httpx.AsyncClient() as raw:
        request = raw.build_request("GET", f"{served.url}/")
        request.url = request.url.copy_with(raw_path=b"//evil.example/")
        reply = await raw.send(request)
    assert reply.status_code == 404
    assert "location" not in reply.headers


async def test_unrouted_paths_stay_404(served: Served) -> None:
    reply = await served.http.get(f"{served.url}/nothing/here/", headers=FORGED)
    assert reply.status_code == 404
    assert reply.json()["status"] == "NOT_FOUND"


async def test_a_role_policy_from_a_spec_lets_the_role_decide_over_http() -> None:
    """``role:approver`` (the ``--inbox-policy`` form): carol, an approver, sees and decides
    alice's approval; bob, without the role, sees nothing of it."""
    policy = inbox_policy_from_spec("role:approver")
    async with serve_banking("memory", auth=token_auth(), inbox_policy=policy) as served:
        paused = await served.send("Transfer $500 to my savings account.", token="tok-alice")
        assert paused["finishReason"] == "interrupted"
        assert (await served.inbox(token="tok-bob"))["items"] == []
        [item] = (await served.inbox(token="tok-carol"))["items"]
        decided = await served.decide(
            item["id"], {"respond": {"approved": True}}, token="tok-carol"
        )
        assert decided.status_code == 200, decided.text
        assert decided.json()["decidedBy"] == "carol"
        assert decided.json()["resumeSnapshotId"] is not None
