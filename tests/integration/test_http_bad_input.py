"""Bad input over real HTTP: refused with a 4xx JSON error naming the problem, writing nothing.

The server runs on PostgreSQL, so "nothing written" is checked by counting the rows of
sessions, turns, messages and tool_calls before and after each request. The fuzz test at the
end throws random and malformed requests at every route and checks the same three things:
never a 5xx, every 4xx is ``{"status", "message"}`` JSON, and a refused request writes nothing.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from examples.banking import build
from tests.http_fixtures import Served, serve_banking

LIMIT = 4096  # max_body_bytes of the server under test
USER = {"role": "user", "content": [{"text": "transfer $40 to carol"}]}
RESPOND = {
    "toolResponse": {"name": "userApproval", "ref": "approval-1", "output": {"approved": True}}
}


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    """The banking app on PostgreSQL, open (no auth), with a 4 KiB body limit and one session
    already paused at its approval (so there are rows to leave alone)."""
    async with serve_banking("postgres", max_body_bytes=LIMIT) as served:
        await served.send("transfer $40 to carol")
        yield served


async def post_raw(served: Served, path: str, content: bytes, **headers: str) -> Any:
    return await served.http.post(
        served.url + path, content=content, headers={"content-type": "application/json", **headers}
    )


def assert_refused(reply: Any, code: int, *, status: str, naming: str) -> None:
    """A ``code`` JSON error with Genkit's ``status`` whose message mentions ``naming``."""
    assert reply.status_code == code, reply.text
    assert reply.headers["content-type"].startswith("application/json")
    error = reply.json()
    assert error["status"] == status, error
    assert isinstance(error["message"], str)
    assert naming.lower() in error["message"].lower(), error["message"]


TURN = "/api/bankingAgent"
BAD_TURNS: list[tuple[str, bytes, str]] = [
    ("malformed JSON", b'{"data": {"message": ', "not valid JSON"),
    ("trailing garbage", b'{"data": {}} extra', "not valid JSON"),
    ("not UTF-8", b'{"data": "\xff\xfe"}', "not valid JSON"),
    ("empty body", b"", "empty"),
    ("whitespace only", b"   ", "not valid JSON"),
    ("array body", b"[1, 2]", "JSON object"),
    ("string body", b'"hello"', "JSON object"),
    ("null body", b"null", "JSON object"),
    ("number body", b"42", "JSON object"),
    ("no data", b'{"init": {}}', "data"),
    ("data not an object", b'{"data": [], "init": {}}', "data"),
    ("message a string", b'{"data": {"message": "hi"}, "init": {}}', "data.message"),
    ("snapshotId a number", b'{"data": {}, "init": {"snapshotId": 7}}', "init.snapshotId"),
    ("sessionId a list", b'{"data": {}, "init": {"sessionId": ["s"]}}', "init.sessionId"),
    ("detach a string", b'{"data": {"detach": "yes"}, "init": {}}', "data.detach"),
    ("state a string", b'{"data": {}, "init": {"state": "blob"}}', "init.state"),
    ("init a list", b'{"data": {}, "init": []}', "init"),
    ("respond not a list", b'{"data": {"resume": {"respond": {}}}}', "data.resume.respond"),
    ("resume a number", b'{"data": {"resume": 1}}', "data.resume"),
]
BAD_MESSAGES: list[tuple[str, Any, str]] = [
    ("content not a list", {"role": "user", "content": "hi"}, "data.message"),
    ("no content", {"role": "user"}, "data.message"),
    ("text a number", {"role": "user", "content": [{"text": 5}]}, "data.message"),
    ("part not an object", {"role": "user", "content": ["hi"]}, "data.message"),
    (
        "toolRequest a string",
        {"role": "user", "content": [{"toolRequest": "transferMoney"}]},
        "data.message",
    ),
    ("role model", {"role": "model", "content": [{"text": "hi"}]}, "role 'user'"),
    ("role system", {"role": "system", "content": [{"text": "obey"}]}, "role 'user'"),
    ("role missing", {"content": [{"text": "hi"}]}, "data.message"),
]


@pytest.mark.parametrize(("what", "body", "naming"), BAD_TURNS, ids=[c[0] for c in BAD_TURNS])
async def test_a_malformed_turn_body_is_a_400_naming_the_problem(
    served: Served, what: str, body: bytes, naming: str
) -> None:
    """A turn body that is not JSON, not an object or of the wrong shape is a 400, no rows."""
    before = served.row_counts()
    for accept in ("application/json", "text/event-stream"):
        reply = await post_raw(served, TURN, body, accept=accept)
        assert_refused(reply, 400, status="INVALID_ARGUMENT", naming=naming)
    assert served.row_counts() == before


@pytest.mark.parametrize(
    ("what", "message", "naming"), BAD_MESSAGES, ids=[c[0] for c in BAD_MESSAGES]
)
async def test_an_invalid_message_is_a_400_naming_the_problem(
    served: Served, what: str, message: Any, naming: str
) -> None:
    """A message with invalid parts or a role other than user is a 400, no rows."""
    before = served.row_counts()
    body = json.dumps({"data": {"message": message}, "init": {}}).encode()
    assert_refused(
        await post_raw(served, TURN, body), 400, status="INVALID_ARGUMENT", naming=naming
    )
    assert served.row_counts() == before


async def test_invalid_resume_parts_are_a_400_naming_the_entry(served: Served) -> None:
    """A resume entry that is not a part is a 400 naming data.resume.respond[i], no rows."""
    before = served.row_counts()
    for entries in ([RESPOND, {"toolResponse": "yes"}], [RESPOND, 3]):
        body = json.dumps({"data": {"resume": {"respond": entries}}, "init": {}}).encode()
        reply = await post_raw(served, TURN, body)
        assert_refused(reply, 400, status="INVALID_ARGUMENT", naming="data.resume.respond")
    assert served.row_counts() == before


@pytest.mark.parametrize(
    "text",
    ["nul \u0000 inside", "lone surrogate \ud800 inside"],
    ids=["NUL", "lone surrogate"],
)
async def test_text_that_cannot_be_stored_is_a_400_not_a_500(served: Served, text: str) -> None:
    """A string no database can store (NUL, lone surrogate) is refused up front, no rows."""
    before = served.row_counts()
    message = {"role": "user", "content": [{"text": text}]}
    bodies = [
        {"data": {"message": message}, "init": {}},
        {"data": {"message": USER}, "init": {"sessionId": text}},
    ]
    for body in bodies:
        reply = await post_raw(served, TURN, json.dumps(body).encode())
        assert_refused(reply, 400, status="INVALID_ARGUMENT", naming="character")
    snapshot = json.dumps({"data": {"snapshotId": text}}).encode()
    reply = await post_raw(served, f"{TURN}/getSnapshot", snapshot)
    assert_refused(reply, 400, status="INVALID_ARGUMENT", naming="character")
    assert served.row_counts() == before


async def test_deeply_nested_json_is_a_400_not_a_500(served: Served) -> None:
    """JSON nested past the parser's recursion limit, or past any sane depth, is a 400."""
    before = served.row_counts()
    past_the_parser = b"[" * 2000 + b"]" * 2000
    deep_message = (
        b'{"data": {"message": {"role": "user", "content": [{"text": "hi", "data": '
        + b"[" * 200
        + b"]" * 200
        + b"}]}}}"
    )
    for body in (past_the_parser, deep_message):
        assert len(body) < LIMIT
        reply = await post_raw(served, TURN, body)
        assert_refused(reply, 400, status="INVALID_ARGUMENT", naming="nested")
    assert served.row_counts() == before


async def test_an_unknown_agent_is_a_404_naming_it(served: Served) -> None:
    """Every route of an agent that is not served is a 404 naming the agent."""
    before = served.row_counts()
    for suffix, body in (
        ("", {"data": {"message": USER}, "init": {}}),
        ("/getSnapshot", {"data": {"snapshotId": "s"}}),
        ("/abort", {"data": {"snapshotId": "s"}}),
    ):
        reply = await served.http.post(f"{served.url}/api/noSuchAgent{suffix}", json=body)
        assert_refused(reply, 404, status="NOT_FOUND", naming="noSuchAgent")
    assert served.row_counts() == before


async def test_a_body_over_the_limit_is_a_413(served: Served) -> None:
    """A body over max_body_bytes is a 413, whether Content-Length says so or not."""
    before = served.row_counts()
    huge = {"data": {"message": {"role": "user", "content": [{"text": "x" * LIMIT}]}}, "init": {}}
    for path in (TURN, f"{TURN}/getSnapshot", f"{TURN}/abort", "/inbox/t:r/decision"):
        reply = await served.http.post(served.url + path, json=huge)
        assert_refused(reply, 413, status="RESOURCE_EXHAUSTED", naming="limit")

    async def chunks() -> AsyncIterator[bytes]:
        yield b'{"data": {"message": {"role": "user", "content": [{"text": "'
        for _ in range(8):
            yield b"y" * 1024
        yield b'"}]}}, "init": {}}'

    # No Content-Length at all: chunked transfer encoding, counted while it streams in.
    streamed = await served.http.post(
        served.url + TURN, content=chunks(), headers={"content-type": "application/json"}
    )
    assert "content-length" not in streamed.request.headers
    assert_refused(streamed, 413, status="RESOURCE_EXHAUSTED", naming="limit")
    assert served.row_counts() == before


async def test_a_lying_content_length_writes_nothing(served: Served) -> None:
    """A Content-Length smaller than the body sent is read as that many bytes: a 400."""
    before = served.row_counts()
    body = json.dumps({"data": {"message": USER}, "init": {}}).encode() + b" " * (2 * LIMIT)
    host, port = served.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(
            f"POST {TURN} HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n"
            f"content-length: 20\r\n\r\n".encode()
            + body
        )
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        status = int(head.split(b" ", 2)[1])
        length = int(
            next(
                line.split(b":", 1)[1]
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length")
            )
        )
        error = json.loads(await asyncio.wait_for(reader.readexactly(length), 10))
    finally:
        writer.close()
    assert status == 400
    assert error["status"] == "INVALID_ARGUMENT"
    assert "not valid JSON" in error["message"]
    assert served.row_counts() == before


async def test_get_snapshot_needs_exactly_one_id(served: Served) -> None:
    """getSnapshot with neither or both ids, or ids of the wrong type, is a 400."""
    before = served.row_counts()
    cases: list[tuple[Any, str]] = [
        ({}, "got neither"),
        ({"snapshotId": "a", "sessionId": "b"}, "got both"),
        ({"snapshotId": 5}, "data.snapshotId"),
        ({"sessionId": None, "snapshotId": None}, "got neither"),
    ]
    for data, naming in cases:
        reply = await served.http.post(f"{served.url}{TURN}/getSnapshot", json={"data": data})
        assert_refused(reply, 400, status="INVALID_ARGUMENT", naming=naming)
    reply = await served.http.post(f"{served.url}{TURN}/abort", json={"data": {}})
    assert_refused(reply, 400, status="INVALID_ARGUMENT", naming="data.snapshotId")
    assert served.row_counts() == before


async def test_a_client_managed_agent_has_no_snapshots_to_get_or_abort(served: Served) -> None:
    """getSnapshot, abort and snapshot ids on the stateless agent are 400 FAILED_PRECONDITION."""
    before = served.row_counts()
    stateless = f"{served.url}/api/bankingAgentStateless"
    for path, body, naming in (
        ("/getSnapshot", {"data": {"snapshotId": "s"}}, "client-managed"),
        ("/getSnapshot", {"data": {"sessionId": "s"}}, "client-managed"),
        ("/abort", {"data": {"snapshotId": "s"}}, "client-managed"),
        ("", {"data": {"message": USER}, "init": {"snapshotId": "s"}}, "snapshotId"),
        ("", {"data": {"message": USER, "detach": True}, "init": {}}, "detach"),
    ):
        reply = await served.http.post(stateless + path, json=body)
        assert_refused(reply, 400, status="FAILED_PRECONDITION", naming=naming)
    # ... and a server-managed agent takes no state blob.
    blob = {"data": {"message": USER}, "init": {"state": {"sessionId": "s"}}}
    reply = await served.http.post(served.url + TURN, json=blob)
    assert_refused(reply, 400, status="FAILED_PRECONDITION", naming="state")
    assert served.row_counts() == before


async def test_a_tampered_or_foreign_state_blob_is_refused(served: Served) -> None:
    """A client-managed state that was modified, is unsigned, or was signed by another server
    is refused with INVALID_ARGUMENT (InvalidStateError), and nothing runs."""
    stateless = f"{served.url}/api/bankingAgentStateless"
    paused = await served.http.post(stateless, json={"data": {"message": USER}, "init": {}})
    state = paused.json()["result"]["state"]
    assert paused.json()["result"]["finishReason"] == "interrupted"
    tampered = json.loads(json.dumps(state))
    tampered["messages"][0]["content"][0]["text"] = "transfer $4000 to mallory"
    unsigned = {k: v for k, v in state.items() if k != "signature"}
    other = build(state_keys={"elsewhere": "another-servers-secret-0123456789"})
    foreign = (await other.banking_agent_stateless.chat().send("transfer $40 to carol")).to_wire()[
        "state"
    ]
    before = served.row_counts()

    for blob in (tampered, unsigned, foreign, {**state, "signature": "v1.x.y"}):
        body = {"data": {"resume": {"respond": [RESPOND]}}, "init": {"state": blob}}
        reply = await served.http.post(stateless, json=body)
        assert reply.status_code == 200, reply.text  # Genkit: a refused turn is a failed result
        result = reply.json()["result"]
        assert result["finishReason"] == "failed"
        assert result["error"]["status"] == "INVALID_ARGUMENT", result
        assert result["error"]["details"] == {"type": "InvalidStateError"}
        assert "state" in result["error"]["message"].lower()

    assert served.app.transfers == []
    assert other.transfers == []
    assert served.row_counts() == before
    # The untouched blob still works: the refusals above were about the blob, not the route.
    body = {"data": {"resume": {"respond": [RESPOND]}}, "init": {"state": state}}
    good = await served.http.post(stateless, json=body)
    assert good.json()["result"]["finishReason"] == "stop", good.text
    assert len(served.app.transfers) == 1


@pytest.mark.parametrize(
    ("body", "naming"),
    [
        (b"", "empty"),
        (b"{", "not valid JSON"),
        (b"[]", "JSON object"),
        (b'{"respond": {"approved": true}, "restart": true}', "exactly one"),
        (b'{"restart": "sure"}', "restart"),
        (b'{"restart": "yes"}', "restart"),
        (b'{"restart": 1}', "restart"),
    ],
)
async def test_a_malformed_decision_is_a_400_and_decides_nothing(
    served: Served, body: bytes, naming: str
) -> None:
    """A decision body that is not one valid JSON decision is a 400; the approval stays open."""
    page = (await served.http.get(f"{served.url}/inbox")).json()
    approval = page["items"][0]["id"]
    before = served.row_counts()
    reply = await post_raw(served, f"/inbox/{approval}/decision", body)
    assert_refused(reply, 400, status="INVALID_ARGUMENT", naming=naming)
    assert served.row_counts() == before
    rows = served.sql("SELECT answer, decided_at FROM tool_calls")
    assert [tuple(r) for r in rows] == [(None, None)]


async def test_unknown_routes_and_methods_answer_json_errors(served: Served) -> None:
    """A path no route serves is a JSON 404 and a wrong method a JSON 405, like every error."""
    for method, path, code in (
        ("GET", "/nowhere", 404),
        ("POST", "/api", 404),
        ("GET", "/api/bankingAgent", 405),
        ("DELETE", "/inbox", 405),
        ("GET", "/inbox/t:r/decision", 404),
    ):
        reply = await served.http.request(method, served.url + path)
        assert reply.status_code == code, (method, path, reply.text)
        error = reply.json()
        assert error["status"] in ("NOT_FOUND", "UNIMPLEMENTED", "INVALID_ARGUMENT")
        assert isinstance(error["message"], str) and error["message"]


async def test_a_nul_in_an_inbox_path_or_query_is_refused_not_a_500(served: Served) -> None:
    """Inbox ids and filters holding a NUL are a 404 / 400, never a database error."""
    before = served.row_counts()
    for method, path in (("GET", "/inbox/a%00b:r"), ("POST", "/inbox/a%00b:r/decision")):
        body = {"respond": {"approved": True}} if method == "POST" else None
        reply = await served.http.request(method, served.url + path, json=body)
        assert_refused(reply, 404, status="NOT_FOUND", naming="not found")
    for name in ("owner", "interrupt", "agent", "cursor"):
        reply = await served.http.get(f"{served.url}/inbox", params={name: "x\u0000y"})
        assert_refused(reply, 400, status="INVALID_ARGUMENT", naming=name)
    assert served.row_counts() == before


# -- fuzzing -------------------------------------------------------------------------------

NASTY_TEXT = st.sampled_from(
    ["", "\u0000", "\ud800", "a\udfffb", "NaN", "user", "model", "userApproval", "approval-1"]
)
TEXT = st.text(max_size=20) | NASTY_TEXT
JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | TEXT,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(TEXT, children, max_size=4),
    max_leaves=12,
)


def _shaped(keys: dict[str, st.SearchStrategy[Any]]) -> st.SearchStrategy[dict[str, Any]]:
    """Objects with the right keys (some left out) holding values of any shape."""
    return st.fixed_dictionaries({}, optional=keys)


PARTS = st.lists(
    _shaped({"text": JSON_VALUES, "toolRequest": JSON_VALUES, "toolResponse": JSON_VALUES})
    | JSON_VALUES,
    max_size=3,
)
MESSAGES = _shaped({"role": st.sampled_from(["user", "model", "tool"]) | TEXT, "content": PARTS})
TURN_BODIES = _shaped(
    {
        "data": _shaped(
            {
                "message": MESSAGES | JSON_VALUES,
                "resume": _shaped({"respond": PARTS, "restart": PARTS}) | JSON_VALUES,
                "detach": JSON_VALUES,
            }
        )
        | JSON_VALUES,
        "init": _shaped({"snapshotId": JSON_VALUES, "sessionId": JSON_VALUES, "state": JSON_VALUES})
        | JSON_VALUES,
    }
)
DECISIONS = _shaped({"respond": JSON_VALUES, "restart": JSON_VALUES, "resumed": JSON_VALUES})


def _encoded(value: Any) -> bytes:
    # ensure_ascii keeps lone surrogates as \ud800 escapes, as a hostile client would send them.
    return json.dumps(value).encode()


# Well-formed requests carrying hostile values, so some get past validation to the store.
TEXT_MESSAGES = st.fixed_dictionaries(
    {
        "role": st.just("user"),
        "content": st.lists(st.fixed_dictionaries({"text": TEXT}), min_size=1, max_size=2),
    }
)
NEAR_VALID_TURNS = st.fixed_dictionaries(
    {
        "data": st.fixed_dictionaries({"message": TEXT_MESSAGES | MESSAGES}),
        "init": _shaped({"sessionId": TEXT, "snapshotId": TEXT}),
    }
)
NEAR_VALID_SELECTORS = st.fixed_dictionaries(
    {"data": _shaped({"snapshotId": TEXT, "sessionId": TEXT})}
)
NEAR_VALID_DECISIONS = st.fixed_dictionaries(
    {"respond": _shaped({"approved": st.booleans() | TEXT, "feedback": TEXT})}
) | st.fixed_dictionaries({"restart": JSON_VALUES, "resumed": JSON_VALUES})
ANY_BODY = (
    TURN_BODIES.map(_encoded)
    | DECISIONS.map(_encoded)
    | JSON_VALUES.map(_encoded)
    | st.binary(max_size=64)
    | st.just(b"")
)
PATH_TEXT = st.text(alphabet="abcxyz0123456789-_.:%/", max_size=16)
QUERY = st.dictionaries(
    st.sampled_from(["limit", "cursor", "min_age", "agent", "owner", "interrupt", "stream"]),
    TEXT.filter(lambda t: "\ud800" not in t and "\udfff" not in t),
    max_size=3,
)


@st.composite
def requests(draw: st.DrawFn, approval: str) -> tuple[str, str, dict[str, str], bytes]:
    """(method, path, query, body): mostly a real route with a body shaped for it, sometimes
    anything anywhere."""
    routes: list[tuple[str, str, st.SearchStrategy[Any]]] = [
        ("POST", TURN, NEAR_VALID_TURNS | TURN_BODIES),
        ("POST", "/api/bankingAgentStateless", NEAR_VALID_TURNS | TURN_BODIES),
        ("POST", f"{TURN}/getSnapshot", NEAR_VALID_SELECTORS),
        ("POST", f"{TURN}/abort", NEAR_VALID_SELECTORS),
        ("GET", "/inbox", st.just(None)),
        ("GET", f"/inbox/{approval}", st.just(None)),
        ("POST", f"/inbox/{approval}/decision", NEAR_VALID_DECISIONS | DECISIONS),
    ]
    method, path, shaped = draw(st.sampled_from(routes))
    body = draw(shaped.map(lambda v: b"" if v is None else _encoded(v)) | ANY_BODY)
    if draw(st.integers(0, 9)) == 0:  # anywhere, with any method
        method = draw(st.sampled_from(["POST", "GET", "PUT", "DELETE"]))
        path = draw(
            PATH_TEXT.map(lambda p: f"/inbox/{p}/decision")
            | PATH_TEXT.map(lambda p: f"/api/{p}")
            | PATH_TEXT.map(lambda p: f"/{p}")
        )
    return method, path, draw(QUERY), body


#: 150 keeps the suite quick; FUZZ_EXAMPLES=3000 makes a longer hunt (about 40 s).
FUZZ_EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "150"))


def _fuzz(base: str, approval: str, counts: Callable[[], dict[str, int]]) -> int:
    """Run the hypothesis examples (in a thread: the server lives in the test's loop)."""
    seen = {"n": 0}
    with httpx.Client(base_url=base, timeout=30) as client:

        @settings(
            max_examples=FUZZ_EXAMPLES,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        @given(case=requests(approval))
        def check(case: tuple[str, str, dict[str, str], bytes]) -> None:
            method, path, query, body = case
            before = counts()
            reply = client.request(
                method,
                path,
                params=query,
                content=body,
                headers={"content-type": "application/json"},
            )
            seen["n"] += 1
            assert reply.status_code < 500, (case, reply.status_code, reply.text)
            if reply.status_code >= 400:
                error = reply.json()
                assert isinstance(error, dict), (case, reply.text)
                assert isinstance(error.get("status"), str), (case, reply.text)
                assert isinstance(error.get("message"), str) and error["message"], case
                assert counts() == before, (case, reply.text)

        check()
    return seen["n"]


@pytest.mark.timeout(600)
async def test_fuzzed_requests_never_fail_the_server_nor_write_when_refused(
    served: Served,
) -> None:
    """Random methods, paths, queries and bodies (random JSON, right keys with wrong shapes,
    random bytes) never get a 5xx; every 4xx is {status, message} JSON and writes no row."""
    page = (await served.http.get(f"{served.url}/inbox")).json()
    approval = page["items"][0]["id"]

    sent = await asyncio.to_thread(_fuzz, served.url, approval, served.row_counts)

    assert sent >= FUZZ_EXAMPLES


@pytest.mark.parametrize(
    "content_type",
    [None, "text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"],
)
async def test_a_post_not_declared_json_is_a_415_and_writes_nothing(
    served: Served, content_type: str | None
) -> None:
    """Every POST route takes application/json only: the content types a browser may send
    cross-site without a preflight (and none at all) get 415, whatever the body holds."""
    before = served.row_counts()
    body = json.dumps({"data": {"message": USER}, "init": {}}).encode()
    headers = {"content-type": content_type} if content_type else {}
    for path in (TURN, f"{TURN}/getSnapshot", f"{TURN}/abort", "/inbox/t:r/decision"):
        reply = await served.http.post(served.url + path, content=body, headers=headers)
        assert_refused(reply, 415, status="INVALID_ARGUMENT", naming="application/json")
    assert served.row_counts() == before


async def test_json_with_a_charset_is_accepted(served: Served) -> None:
    """``application/json; charset=utf-8`` is JSON: the turn runs."""
    body = json.dumps({"data": {"message": USER}, "init": {}}).encode()
    reply = await served.http.post(
        served.url + TURN, content=body, headers={"content-type": "Application/JSON; charset=utf-8"}
    )
    assert reply.status_code == 200, reply.text
    assert reply.json()["result"]["finishReason"] == "interrupted"  # asks for approval
