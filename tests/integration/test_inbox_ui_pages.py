"""The inbox UI's pages over real HTTP (uvicorn in the test's loop), without a browser: what
each page answers to good and bad requests, validation on the page, restart, abort and retry,
and who sees what when the server authenticates."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

import httpx
import pytest

from engine import Engine, ScriptedModel
from engine.conversation.parts import Message, Part
from engine.model import ChunkSink, ModelRequest, ModelResponse
from engine.remote import BearerTokenAuth, Principal, RoleInboxPolicy, create_app
from engine.remote.ui import UiSettings
from engine.store.memory import InMemorySessionStore
from examples.banking import BankingApp, build
from tests.databases import sql_store
from tests.http_support import csrf_of, serve_in_loop, signed_in_with

SETTINGS = UiSettings(secret="pages-test-secret-0123456789abcdef", poll_seconds=1)
TOKENS = {"alice": "alice-token", "bob": "bob-token", "mallory": "mallory-token"}
AUTH = BearerTokenAuth(
    {
        TOKENS["alice"]: Principal(id="alice"),
        TOKENS["bob"]: Principal(id="bob", roles=frozenset({"approver"})),
        TOKENS["mallory"]: Principal(id="mallory"),
    }
)


def approval_links(html: str) -> list[str]:
    return re.findall(r'href="(/ui/approvals/[^"]+)"', html)


@pytest.fixture
async def open_server() -> AsyncIterator[tuple[BankingApp, httpx.AsyncClient]]:
    """The banking example in memory, served with no authenticator."""
    app = build()
    async with (
        serve_in_loop(create_app(app.ai, ui_settings=SETTINGS)) as base,
        httpx.AsyncClient(base_url=base) as client,
    ):
        yield app, client


async def page_and_token(client: httpx.AsyncClient, path: str) -> tuple[httpx.Response, str]:
    page = await client.get(path)
    assert page.status_code == 200, page.text
    return page, csrf_of(page.text)


async def test_an_open_server_lists_and_decides_without_signing_in(
    open_server: tuple[BankingApp, httpx.AsyncClient],
) -> None:
    app, client = open_server
    await app.banking_agent.chat().send("Transfer $20 to alice and $30 to bob")
    inbox = await client.get("/ui")
    assert inbox.status_code == 200
    assert "<title>(2) Inbox · Turnstile</title>" in inbox.text
    # The two approvals of one turn say that they were asked together.
    assert inbox.text.count("asked together with 1 more in the same turn") == 2
    # Asked under the version served now: the row does not repeat it.
    assert "app-version" not in inbox.text
    assert "no authentication" in inbox.text
    assert inbox.headers["content-security-policy"].startswith("default-src 'none'")
    newest = await client.get("/ui", params={"order": "newest"})
    assert approval_links(newest.text) == list(reversed(approval_links(inbox.text)))

    first = approval_links(inbox.text)[0]
    opened, token = await page_and_token(client, first)
    # The open page links the other call's approval by what it asks.
    assert re.search(
        r'Its approval: <a href="/ui/approvals/[^"]+">Transfer \$30 to bob</a>', opened.text
    )
    missing = await client.post(
        f"{first}/decision", data={"csrf_token": token, "action": "respond"}
    )
    assert missing.status_code == 400
    assert "Approved: Choose an answer." in missing.text
    assert 'id="field-approved-error"' in missing.text

    decided = await client.post(
        f"{first}/decision",
        data={"csrf_token": token, "action": "respond", "field.approved": "false"},
    )
    assert decided.status_code == 303
    shown = await client.get(decided.headers["location"])
    assert "Your decision was recorded." in shown.text
    # The sibling is named by what it asks (the example's declared summary), then its ref.
    sibling = re.search(
        r'waits for decisions on <a href="(/ui/approvals/[^"]+)">Transfer \$30 to bob</a> '
        r'<span class="muted">\(approval-2\)</span>',
        shown.text,
    )
    assert sibling is not None, shown.text
    assert sibling.group(1) in approval_links(inbox.text)
    again = await client.post(
        f"{first}/decision",
        data={"csrf_token": token, "action": "respond", "field.approved": "true"},
    )
    assert again.status_code == 409 and "already decided" in again.text

    history = await client.get("/ui/history")
    assert "approved: No" in history.text and "anonymous" in history.text
    live = (await client.get("/ui/inbox/live")).json()
    assert live["count"] == 1 and len(live["ids"]) == 1


class CodeModel:
    """Asks ``confirmCode`` once, then says what it was told."""

    name = "code-model"

    async def generate(
        self, request: ModelRequest, on_chunk: ChunkSink | None = None
    ) -> ModelResponse:
        last = request.messages[-1]
        if last.role == "tool":
            return ModelResponse(message=Message(role="model", content=[Part.of_text("ok")]))
        ask = Part.of_request("confirmCode", "code-1", {"reason": "a code is needed"})
        return ModelResponse(message=Message(role="model", content=[ask]))


@pytest.fixture
async def code_server() -> AsyncIterator[tuple[Engine, httpx.AsyncClient]]:
    ai = Engine(model=ScriptedModel())
    confirm = ai.define_interrupt(
        name="confirmCode",
        description="Type the four-digit code.",
        timeout=3600,
        on_timeout="fail",
        input_schema={"type": "object", "properties": {"reason": {"type": "string"}}},
        output_schema={
            "type": "object",
            "properties": {"code": {"type": "string", "pattern": "^[0-9]{4}$", "title": "Code"}},
            "required": ["code"],
        },
    )
    ai.define_agent(name="coder", tools=[confirm], model=CodeModel(), store=InMemorySessionStore())
    async with (
        serve_in_loop(create_app(ai, ui_settings=SETTINGS)) as base,
        httpx.AsyncClient(base_url=base) as client,
    ):
        yield ai, client


async def test_the_engines_schema_check_is_shown_on_the_form_and_restart_asks_again(
    code_server: tuple[Engine, httpx.AsyncClient],
) -> None:
    ai, client = code_server
    paused = await ai.agents["coder"].chat().send("go")
    link = f"/ui/approvals/{paused.snapshot_id}:code-1"
    page, token = await page_and_token(client, link)
    assert "Type the four-digit code." in page.text and "a code is needed" in page.text
    assert "(in 59 min)" in page.text, "the deadline is shown with how far away it is"
    wrong = await client.post(
        f"{link}/decision", data={"csrf_token": token, "action": "respond", "field.code": "12"}
    )
    assert wrong.status_code == 400
    assert "does not match its output schema" in wrong.text
    assert 'value="12"' in wrong.text, "the page keeps what was typed"

    restarted = await client.post(
        f"{link}/decision", data={"csrf_token": token, "action": "restart"}
    )
    assert restarted.status_code == 303
    inbox = await client.get("/ui")
    [new_link] = approval_links(inbox.text)
    assert new_link != link.replace(":", "%3A"), "restart paused the turn again at a new approval"


async def test_bad_requests_are_4xx_pages_never_500(
    open_server: tuple[BankingApp, httpx.AsyncClient],
) -> None:
    app, client = open_server
    paused = await app.banking_agent.chat().send("Transfer $5 to carol")
    link = f"/ui/approvals/{paused.snapshot_id}:approval-1"
    _page, token = await page_and_token(client, link)
    cases: list[tuple[httpx.Response, int]] = [
        (await client.get("/ui", params={"age": "soon"}), 400),
        (await client.get("/ui", params={"order": "random"}), 400),
        (await client.get("/ui", params={"cursor": "bm90IGEgY3Vyc29y"}), 400),
        (await client.get("/ui", params={"agent": "a\x01b"}), 400),
        (await client.get("/ui/history", params={"decided_by": "x" * 3000}), 400),
        (await client.get("/ui/approvals/no-colon"), 404),
        (await client.get(f"/ui/approvals/{paused.snapshot_id}:nope"), 404),
        (await client.get("/ui/turns/unknown-turn"), 404),
        (await client.post(f"{link}/decision", json={"csrf_token": token}), 415),
        (
            await client.post(
                f"{link}/decision",
                content=b"csrf_token=" + b"x" * 2_000_000,
                headers={"content-type": "application/x-www-form-urlencoded"},
            ),
            413,
        ),
        (await client.post(f"{link}/decision", data={"csrf_token": token, "action": "x"}), 400),
        (await client.post(f"{link}/decision", data={"action": "restart"}), 403),
        (
            await client.post(
                f"{link}/decision",
                data={"csrf_token": token, "action": "restart"},
                headers={"sec-fetch-site": "cross-site"},
            ),
            403,
        ),
    ]
    assert [answer.status_code for answer, _ in cases] == [status for _, status in cases]
    assert all("text/html" in answer.headers["content-type"] for answer, _ in cases)
    still = await client.get(link)
    assert "Waiting for a decision" in still.text, "no refused request decided anything"


@pytest.fixture
async def queued_server() -> AsyncIterator[tuple[BankingApp, str]]:
    """The banking example on SQLite with its turns queued for workers (none run), behind
    bearer tokens, approvers by role."""
    async with sql_store("sqlite") as store:
        app = build(store=store, execution="workers")
        served = create_app(
            app.ai, auth=AUTH, inbox_policy=RoleInboxPolicy("approver"), ui_settings=SETTINGS
        )
        async with serve_in_loop(served) as base:
            yield app, base


async def signed_in(base: str, who: str) -> httpx.AsyncClient:
    """A client signed in to the UI as ``who``."""
    return await signed_in_with(base, TOKENS[who])


async def test_abort_and_retry_from_the_inspector_are_the_owners(
    queued_server: tuple[BankingApp, str],
) -> None:
    _app, base = queued_server
    async with httpx.AsyncClient(
        base_url=base, headers={"Authorization": f"Bearer {TOKENS['alice']}"}
    ) as api:
        started = await api.post(
            "/api/bankingAgent",
            json={
                "data": {
                    "message": {"role": "user", "content": [{"text": "hello"}]},
                    "detach": True,
                }
            },
        )
    turn_id = started.json()["result"]["snapshotId"]
    inspector = f"/ui/turns/{turn_id}"

    mallory = await signed_in(base, "mallory")
    bob = await signed_in(base, "bob")
    alice = await signed_in(base, "alice")
    try:
        assert (await mallory.get(inspector)).status_code == 404
        seen_by_bob = await bob.get(inspector)
        assert seen_by_bob.status_code == 200 and "Abort this turn" not in seen_by_bob.text
        refused = await bob.post(
            f"{inspector}/abort", data={"csrf_token": csrf_of(seen_by_bob.text)}
        )
        assert refused.status_code == 404, "the engine refuses an abort by someone else"

        page = await alice.get(inspector)
        assert "Abort this turn" in page.text and "queued or running" in page.text
        aborted = await alice.post(f"{inspector}/abort", data={"csrf_token": csrf_of(page.text)})
        assert aborted.status_code == 303
        page = await alice.get(aborted.headers["location"])
        assert "The turn was aborted." in page.text
        assert "new -&gt; pending" in page.text and "pending -&gt; aborted" in page.text

        retried = await alice.post(f"{inspector}/retry", data={"csrf_token": csrf_of(page.text)})
        assert retried.status_code == 303
        new_page = await alice.get(retried.headers["location"])
        assert "Retry queued" in new_page.text and "a retry (no message)" in new_page.text
        assert turn_id in new_page.text  # it continues the aborted turn
    finally:
        for client in (mallory, bob, alice):
            await client.aclose()


async def test_signing_in_out_and_the_json_api_beside_it(
    queued_server: tuple[BankingApp, str],
) -> None:
    _app, base = queued_server
    async with httpx.AsyncClient(base_url=base) as client:
        sent_away = await client.get("/ui/history?agent=bankingAgent")
        assert sent_away.status_code == 303
        assert sent_away.headers["location"].startswith("/ui/login?next=")
        assert "set-cookie" not in sent_away.headers
        login = await client.get("/ui/login")
        refused = await client.post(
            "/ui/login", data={"csrf_token": csrf_of(login.text), "token": "wrong"}
        )
        assert refused.status_code == 401 and "That token was not accepted." in refused.text
        no_token = await client.post("/ui/login", data={"token": TOKENS["bob"]})
        assert no_token.status_code == 403, "a login form without its CSRF token is refused"
        posted_json = await client.post("/ui/approvals/a:b/decision", data={"action": "x"})
        assert posted_json.status_code == 401, "not signed in"
        assert (await client.get("/ui/inbox/live")).status_code == 401
    bob = await signed_in(base, "bob")
    try:
        inbox = await bob.get("/ui")
        assert "Signed in as <strong>bob</strong>" in inbox.text
        out = await bob.post("/ui/logout", data={"csrf_token": csrf_of(inbox.text)})
        assert out.status_code == 303 and out.headers["location"] == "/ui/login"
        assert (await bob.get("/ui")).status_code == 303
        api = await bob.get("/inbox", headers={"Authorization": f"Bearer {TOKENS['bob']}"})
        assert api.status_code == 200
    finally:
        await bob.aclose()


async def test_the_inspector_says_a_paused_turn_was_answered_and_continued(
    open_server: tuple[BankingApp, httpx.AsyncClient],
) -> None:
    """A turn that paused says "paused (waiting for approval)" while its approval is open,
    and "paused, answered and continued" once decided, never "paused again"; the turn that
    continued it is linked."""
    app, client = open_server
    paused = await app.banking_agent.chat().send("Transfer $20 to alice")
    assert paused.snapshot_id is not None
    inspector = f"/ui/turns/{paused.snapshot_id}"
    waiting = await client.get(inspector)
    assert "paused (waiting for approval)" in waiting.text
    assert "paused again" not in waiting.text
    (first,) = approval_links((await client.get("/ui")).text)
    _page, token = await page_and_token(client, first)
    decided = await client.post(
        f"{first}/decision",
        data={"csrf_token": token, "action": "respond", "field.approved": "true"},
    )
    assert decided.status_code == 303
    answered = await client.get(inspector)
    assert "paused, answered and continued" in answered.text
    assert "paused again" not in answered.text
    assert re.search(r'Continued by</dt><dd><a href="/ui/turns/[^"]+"', answered.text)


async def test_a_hostile_or_broken_summary_is_escaped_cut_or_replaced_never_a_500(
    open_server: tuple[BankingApp, httpx.AsyncClient],
) -> None:
    """A declared summary carrying markup is shown as text and cut short on the inbox and the
    approval page; one that raises shows the default wording instead of failing the page."""
    app, client = open_server
    app.user_approval.title = "<b>Transfer</b> approval"
    app.user_approval.summary = lambda request: "<script>alert(1)</script>" + "y" * 5000
    await app.banking_agent.chat().send("Transfer $5 to carol")
    inbox = await client.get("/ui")
    assert inbox.status_code == 200
    assert "<script>alert" not in inbox.text and "<b>Transfer" not in inbox.text
    headline = re.search(r'<span class="approval-name">([^<]*)</span>', inbox.text)
    assert headline is not None
    assert headline.group(1).startswith("&lt;script&gt;alert(1)&lt;/script&gt;yyy")
    assert headline.group(1).endswith("y…") and headline.group(1).count("y") < 200
    assert "&lt;b&gt;Transfer&lt;/b&gt; approval" in inbox.text
    [page_link] = approval_links(inbox.text)
    page = await client.get(page_link)
    assert page.status_code == 200 and "<script>alert" not in page.text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page.text

    def broken(_request: object) -> str:
        raise KeyError("no such field")

    app.user_approval.summary = broken
    fallback = await client.get("/ui")
    assert fallback.status_code == 200
    assert '<span class="approval-name">&lt;b&gt;Transfer&lt;/b&gt; approval</span>' in (
        fallback.text
    )
    assert "transferMoney — Transfer $5 to carol" in fallback.text
