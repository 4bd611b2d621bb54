"""The genuine Genkit JS client (``genkit/beta/client`` 1.42.0) drives our server unchanged.

The server is a real ``turnstile serve`` process on PostgreSQL with an embedded worker pool,
so every turn of ``bankingAgent`` runs in a worker and its chunks reach the client through the
relay. ``tests/js/scenarios.mjs`` runs one scenario with ``remoteAgent`` and prints what the
client observed; the assertions are here.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.databases import postgres_url
from tests.http_support import serve_process

JS = Path(__file__).resolve().parent.parent / "js"


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    assert shutil.which("node"), "Node.js is required for the genuine-client tests"
    assert (JS / "node_modules" / "genkit").is_dir(), "run `make test` (it installs genkit)"
    with postgres_url() as url, serve_process(url, workers=2) as (base, _process):
        yield base


def run(scenario: str, base: str) -> dict[str, Any]:
    done = subprocess.run(
        ["node", "scenarios.mjs", scenario, base],
        cwd=JS,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def test_send_returns_the_model_text_and_a_snapshot(server: str) -> None:
    """chat.send gets the scripted echo, a snapshot id and a session id."""
    result = run("send", server)
    assert result["text"] == "Echo: hello there"
    assert result["finishReason"] == "stop"
    assert result["snapshotId"] and result["sessionId"]


def test_send_stream_yields_the_word_chunks_from_the_worker(server: str) -> None:
    """sendStream receives the model's word chunks, relayed from the worker process."""
    result = run("stream", server)
    assert result["chunks"] == ["Echo: ", "hello ", "streaming ", "world"]
    assert result["text"] == "Echo: hello streaming world"


def test_interrupt_then_resume_with_respond_transfers(server: str) -> None:
    """A transfer pauses at userApproval; resumeStream with respond() completes it."""
    result = run("respond", server)
    assert result["first"]["finishReason"] == "interrupted"
    assert result["first"]["interrupts"] == [
        {
            "name": "userApproval",
            "ref": "approval-1",
            "input": {"action": "transferMoney", "details": "Transfer $40 to carol"},
        }
    ]
    assert result["text"] == "Done. Transaction txn-40-carol."
    chunks = result["chunks"]
    # As Genkit streams a resume: the resumed tool message first, turnEnd last.
    assert chunks[0]["modelChunk"]["role"] == "tool"
    assert chunks[0]["modelChunk"]["content"][0]["toolResponse"]["ref"] == "approval-1"
    assert chunks[-1] == {"turnEnd": {"snapshotId": result["snapshotId"], "finishReason": "stop"}}


def test_restart_of_an_interrupt_asks_again(server: str) -> None:
    """restart() on a pure interrupt re-pauses with the same request; a later respond ends it."""
    result = run("restart", server)
    assert result["again"]["finishReason"] == "interrupted"
    assert result["again"]["interrupts"] == result["first"]
    assert result["text"] == "Transfer cancelled: no"


def test_several_interrupts_must_all_be_answered(server: str) -> None:
    """Two interrupts: answering one is refused naming the other; answering both transfers."""
    result = run("several", server)
    assert [i["ref"] for i in result["interrupts"]] == ["approval-1", "approval-2"]
    assert result["partial"]["status"] == "INVALID_ARGUMENT"
    assert "userApproval#approval-2" in result["partial"]["message"]
    assert result["text"] == "Done. Transaction txn-10-alice. Done. Transaction txn-20-bob."


def test_forged_resumes_are_rejected_and_the_pause_stays_resumable(server: str) -> None:
    """Wrong ref, wrong tool, schema-violating output: INVALID_ARGUMENT each; then it resumes."""
    result = run("forged", server)
    for key in ("wrongRef", "wrongTool", "badOutput"):
        assert result[key]["name"] == "AgentError"
        assert result[key]["status"] == "INVALID_ARGUMENT"
        assert result[key]["snapshotId"] == result["pausedAt"]
    assert "approval-7" in result["wrongRef"]["message"]
    assert result["pointsAt"] == result["pausedAt"]
    assert result["text"] == "Transfer cancelled: denied"


def test_a_pause_is_decided_once_across_chats(server: str) -> None:
    """A second chat answering the same pause gets ABORTED (a conflict), not a second transfer."""
    result = run("replay", server)
    assert result["first"] == "Done. Transaction txn-5-erin."
    assert result["second"]["status"] == "ABORTED"
    assert "not pending" in result["second"]["message"]


def test_get_snapshot_by_snapshot_and_session_and_missing(server: str) -> None:
    """getSnapshot finds a snapshot by id and by session; an unknown id is a 404."""
    result = run("snapshots", server)
    assert result["bySnapshot"] == {
        "snapshotId": result["snapshotId"],
        "status": "completed",
        "messages": 2,
    }
    assert result["bySession"] == {"snapshotId": result["snapshotId"], "status": "completed"}
    assert "404" in result["missing"]["message"]
    assert "NOT_FOUND" in result["missing"]["message"]


def test_detached_turn_runs_in_the_workers(server: str) -> None:
    """detach() returns the pending snapshot at once; polling getSnapshot sees it complete."""
    result = run("detach", server)
    assert result["pending"] == result["taskId"]
    # getSnapshot shows the turn pending while the worker runs it, then completed.
    assert result["statuses"][0] == "pending"
    assert result["statuses"][-1] == "completed"
    assert set(result["statuses"]) == {"pending", "completed"}
    assert result["last"] == {
        "role": "model",
        "content": [{"text": "Echo: slow hello from the background"}],
    }


def test_abort_stops_a_detached_turn(server: str) -> None:
    """chat.abort() on a running detached turn answers the status before (pending) and the
    turn ends aborted; an unknown id answers no status, as Genkit's abort does."""
    result = run("abort", server)
    assert result["aborted"] == "pending"  # the client hands back the status we report
    assert result["status"] == "aborted"
    assert result["unknown"] is None


def test_client_managed_state_round_trips_and_tampering_is_refused(server: str) -> None:
    """The stateless agent returns signed state; an edited blob is refused; detach needs a store."""
    result = run("stateless", server)
    assert result["paused"] == {
        "finishReason": "interrupted",
        "hasState": True,
        "hasSnapshotId": False,
    }
    assert result["text"] == "Done. Transaction txn-7-frank."
    assert result["tampered"]["status"] == "INVALID_ARGUMENT"
    assert "signature" in result["tampered"]["message"]
    assert "FAILED_PRECONDITION" in result["noStore"]["message"]


def test_init_misuse_is_an_error_frame(server: str) -> None:
    """state to a server-managed agent, snapshotId to a client-managed one: FAILED_PRECONDITION."""
    result = run("misuse", server)
    assert result["sendState"]["status"] == "FAILED_PRECONDITION"
    assert result["sendSnapshot"]["status"] == "FAILED_PRECONDITION"
    assert "404" in result["unknownAgent"]["message"]


def test_a_failed_turn_is_a_failed_result_pointing_at_its_snapshot(server: str) -> None:
    """A model failure is an AgentError with INTERNAL; the chat follows the failed snapshot
    and its next message goes on from there."""
    result = run("failure", server)
    assert result["failed"]["status"] == "INTERNAL"
    assert result["failed"]["message"] == "Scripted model failure"
    assert result["pointsAt"] == result["failed"]["snapshotId"]
    assert result["next"]["text"] == "Echo: hello again"


def test_a_chat_goes_on_from_the_last_good_snapshot_after_a_failure(server: str) -> None:
    """A new chat on the snapshot before a failed turn continues the same session: its turn's
    parent is that snapshot and the failed message is not in the conversation."""
    result = run("continueFromLastGood", server)
    assert result["failed"]["status"] == "INTERNAL"
    assert result["next"] == {
        "text": "Echo: hello again",
        "sessionId": result["first"]["sessionId"],
        "error": False,
    }
    assert result["parentId"] == result["first"]["snapshotId"]
    assert result["texts"] == [
        "hello first",
        "Echo: hello first",
        "hello again",
        "Echo: hello again",
    ]


def test_continuing_one_snapshot_twice_branches(server: str) -> None:
    """Genkit's branching: the second continuation of a snapshot opens a new session whose
    turn has that snapshot as parent; the histories diverge and the first session's latest
    is still the first continuation."""
    result = run("branch", server)
    root = result["root"]
    common = ["hello root", "Echo: hello root"]
    assert result["a"] == {
        "sessionId": root["sessionId"],
        "parentId": root["snapshotId"],
        "status": "completed",
        "texts": [*common, "hello a", "Echo: hello a"],
    }
    assert result["b"]["sessionId"] != root["sessionId"]
    assert result["b"]["parentId"] == root["snapshotId"]
    assert result["b"]["texts"] == [*common, "hello b", "Echo: hello b"]
    assert result["rootLatest"]["texts"] == result["a"]["texts"]
