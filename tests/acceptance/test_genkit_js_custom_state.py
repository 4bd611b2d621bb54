"""The genuine Genkit JS client (``genkit/beta/client``) sees our custom state and artifacts.

A real ``turnstile serve`` process on PostgreSQL with an embedded worker pool serves
``tests.acceptance.state_app``: the state changes happen in a worker, and their
``customPatch`` and ``artifact`` chunks reach the client through the relay.
``tests/js/scenarios.mjs`` prints what the client observed; the assertions are here.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest

from tests.acceptance.state_app import BIG_DRAFT
from tests.acceptance.test_genkit_js_client import JS, run
from tests.databases import postgres_url
from tests.http_support import serve_process


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    assert shutil.which("node"), "Node.js is required for the genuine-client tests"
    assert (JS / "node_modules" / "genkit").is_dir(), "run `make test` (it installs genkit)"
    with (
        postgres_url() as url,
        serve_process(url, app="tests.acceptance.state_app:ai", workers=2) as (base, _),
    ):
        yield base


def test_client_applies_custom_patches_and_reads_state_from_snapshots(server: str) -> None:
    """The client builds the custom state from the streamed patches, merges the output's
    artifacts, and reads both from getSnapshot and loadChat."""
    result = run("customState", server)
    assert result["chunks"] == [
        {"customPatch": [{"op": "replace", "path": "", "value": {"counter": 1}}]},
        {"artifact": {"name": "doc1", "parts": [{"text": "content1"}]}},
    ]
    assert result["customs"] == [{"counter": 1}]
    assert result["first"]["state"] == {"counter": 1}
    assert result["first"]["artifacts"] == [{"name": "doc1", "parts": [{"text": "content1"}]}]
    assert "state" not in result["first"]["raw"]  # server-managed: no state on the output
    assert result["second"]["state"] == {"counter": 2}
    assert result["second"]["chatState"] == {"counter": 2}
    both = [
        {"name": "doc1", "parts": [{"text": "content1"}]},
        {"name": "doc2", "parts": [{"text": "content2"}]},
    ]
    assert result["second"]["artifacts"] == both
    assert result["chatArtifacts"] == both
    assert result["snapshotState"] == {"custom": {"counter": 2}, "artifacts": both}
    assert result["loaded"] == {"state": {"counter": 2}, "artifacts": both}


def test_first_patch_replaces_whole_value_later_ones_are_diffs(server: str) -> None:
    """Three changes in one turn: a root replace, then two member replaces; artifacts of one
    name replace each other."""
    result = run("multiState", server)
    state_chunks = [c["raw"] for c in result["chunks"]]
    assert state_chunks == [
        {
            "customPatch": [
                {"op": "replace", "path": "", "value": {"counter": 1, "status": "working"}}
            ]
        },
        {"customPatch": [{"op": "replace", "path": "/counter", "value": 2}]},
        {"customPatch": [{"op": "replace", "path": "/status", "value": "done"}]},
        {"artifact": {"name": "doc1", "parts": [{"text": "v1"}]}},
        {"artifact": {"name": "doc1", "parts": [{"text": "v2"}]}},
        {"artifact": {"name": "doc2", "parts": [{"text": "other"}]}},
    ]
    assert [c["custom"] for c in result["chunks"][:3]] == [
        {"counter": 1, "status": "working"},
        {"counter": 2, "status": "working"},
        {"counter": 2, "status": "done"},
    ]
    assert result["state"] == {"counter": 2, "status": "done"}
    assert result["artifacts"] == [
        {"name": "doc1", "parts": [{"text": "v2"}]},
        {"name": "doc2", "parts": [{"text": "other"}]},
    ]
    assert result["text"] == "done"


def test_client_managed_state_carries_custom_and_refuses_a_tampered_one(server: str) -> None:
    """The signed state blob carries custom and artifacts from turn to turn; a blob whose
    custom was edited is refused like one whose messages were."""
    result = run("clientState", server)
    assert result["first"] == {"state": {"counter": 1}, "raw": {"counter": 1}}
    assert result["second"]["state"] == {"counter": 2}
    assert [a["name"] for a in result["second"]["artifacts"]] == ["doc1", "doc2"]
    assert result["second"]["messages"] == 8
    forged = result["forged"]
    assert forged["error"] is True
    assert forged["status"] == "INVALID_ARGUMENT", forged
    assert "signature" in forged["message"].lower(), forged


def test_a_patch_too_large_to_relay_is_made_good_before_the_turn_ends(server: str) -> None:
    """A custom state past the relay's notification size loses its patch on the way from the
    worker; the later patch that no longer applies is held back, and one whole-value replace
    brings the client to the settled state before turnEnd."""
    result = run("bigState", server)
    assert result["patches"] == [[{"op": "replace", "path": ""}]]
    assert result["n"] == 2 and result["chatN"] == 2
    assert result["draftLength"] == len(BIG_DRAFT)
