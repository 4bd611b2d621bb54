"""Genkit's cross-language agent spec, ported: its cases, the agents they run against, and the
two ways our tests run them (the Python API and the HTTP protocol).

The cases are those of ``tests/specs/agent.yaml`` in the public genkit-ai/genkit repository
(Apache-2.0 data), under the spec's own test names so a reader can match them, plus the three
cases of ``tests/specs/generate.yaml`` as one-turn sends (Turnstile has no ``/util/generate``
route: the agent's model request is checked instead). Each case says, in our words, what it
asks.

The agents are the spec's, built the Turnstile way. Genkit's *custom* agents run their code in
a handler; a Turnstile agent's code runs in its tools, so each custom agent here calls one tool
and then answers ``done``. Its stream therefore also carries that tool round's chunks, which the
custom-agent cases leave out of the chunk comparison (they compare the session-state chunks and
the turn ends). The local Python stream has no ``turnEnd`` chunk: the end of a send's stream
is its turn end, compared as ``{"turnEnd": {"finishReason": ...}}`` with the response's reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx
from pydantic import BaseModel

from engine import Engine, Message, Part, ToolContext
from engine.agent import Agent
from engine.errors import AgentError
from engine.model import ChunkSink, ModelRequest, ModelResponse
from engine.remote.server import create_app
from engine.store import SessionStore
from tests.http_support import serve_in_loop
from workers import WorkerPool

__all__ = [
    "CASES",
    "CUSTOM_AGENTS",
    "Case",
    "HttpDriver",
    "PythonDriver",
    "SpecApp",
    "run_case",
    "spec_app",
]

Wire = dict[str, Any]

# -- the cases' vocabulary -------------------------------------------------------------------


@dataclass(frozen=True)
class Send:
    """One invocation: open a chat with ``init``, send ``inputs`` in order."""

    inputs: Sequence[Wire]
    init: Wire = field(default_factory=dict)
    #: What the programmable model answers, call by call, and the chunks it streams first.
    model: Sequence[Wire] = ()
    stream_chunks: Sequence[Sequence[Wire]] = ()
    expect_chunks: Sequence[Wire] | None = None
    expect_output: Wire | None = None
    #: The invocation throws (API misuse) instead of answering a failed output.
    expect_error: Wire | None = None
    capture_snapshot: str | None = None
    capture_state: str | None = None
    capture_session: str | None = None


@dataclass(frozen=True)
class GetSnapshot:
    """Read a snapshot by id, or a session's latest."""

    expect: Wire
    snapshot_id: str | None = None
    session_id: str | None = None


@dataclass(frozen=True)
class WaitUntilSettled:
    """Poll a snapshot until it is completed, failed or aborted."""

    snapshot_id: str
    expect: Wire


_NO_EXPECTATION = object()


@dataclass(frozen=True)
class Abort:
    """Abort a snapshot; ``expect_previous`` is the status it must report (``None``: none)."""

    snapshot_id: str
    expect_previous: Any = _NO_EXPECTATION


Step = Send | GetSnapshot | WaitUntilSettled | Abort


@dataclass(frozen=True)
class Case:
    """One spec test: its name, the agent it runs against, its steps."""

    name: str
    agent: str
    steps: Sequence[Step]
    #: Only meaningful on the Python API (generate.yaml's cases inspect the model request).
    python_only: bool = False

    def __str__(self) -> str:
        return self.name


def text(role: str, words: str) -> Wire:
    return {"role": role, "content": [{"text": words}]}


def user(words: str, **extra: Any) -> Wire:
    """An input carrying a user message."""
    return {"message": text("user", words), **extra}


def says(words: str, finish: str = "stop") -> Wire:
    """A model response holding text."""
    return {"message": text("model", words), "finishReason": finish}


def request(name: str, ref: str, value: Any) -> Wire:
    return {"toolRequest": {"name": name, "ref": ref, "input": value}}


def response(name: str, ref: str, value: Any) -> Wire:
    return {"toolResponse": {"name": name, "ref": ref, "output": value}}


def asks(*calls: tuple[str, str, Any]) -> Wire:
    """A model response requesting tools."""
    return {
        "message": {"role": "model", "content": [request(*c) for c in calls]},
        "finishReason": "stop",
    }


def respond(*answers: tuple[str, str, Any]) -> Wire:
    """An input answering interrupts."""
    return {"resume": {"respond": [response(*a) for a in answers]}}


TURN_END: Wire = {"turnEnd": {}}
STOP_END: Wire = {"turnEnd": {"finishReason": "stop"}}


def history(*pairs: tuple[str, str]) -> list[Wire]:
    return [text(role, words) for role, words in pairs]


# -- the cases --------------------------------------------------------------------------------

_SESSION_55 = "55555555-5555-4555-8555-555555555555"

CASES: list[Case] = [
    Case(
        "simple single turn - client managed",
        "promptAgent",
        [
            Send(
                [user("hi")],
                model=[says("hello back")],
                expect_chunks=[STOP_END],
                expect_output={
                    "message": text("model", "hello back"),
                    "finishReason": "stop",
                    "hasSessionId": True,
                    "stateContains": {"messages": history(("user", "hi"), ("model", "hello back"))},
                },
            )
        ],
    ),
    Case(
        "simple single turn - server managed",
        "promptAgentWithStore",
        [
            Send(
                [user("hi")],
                model=[says("hello back")],
                expect_chunks=[STOP_END],
                expect_output={
                    "message": text("model", "hello back"),
                    "finishReason": "stop",
                    "hasSnapshotId": True,
                },
                capture_snapshot="snap1",
            ),
            GetSnapshot({"status": "completed", "hasSessionId": True}, snapshot_id="{{snap1}}"),
        ],
    ),
    Case(
        "streaming model chunks",
        "promptAgent",
        [
            Send(
                [user("hi")],
                model=[says("hello")],
                stream_chunks=[
                    [
                        {"index": 0, "role": "model", "content": [{"text": "hel"}]},
                        {"index": 0, "role": "model", "content": [{"text": "lo"}]},
                    ]
                ],
                expect_chunks=[
                    {"modelChunk": {"index": 0, "role": "model", "content": [{"text": "hel"}]}},
                    {"modelChunk": {"index": 0, "role": "model", "content": [{"text": "lo"}]}},
                    STOP_END,
                ],
                expect_output={
                    "message": text("model", "hello"),
                    "finishReason": "stop",
                    "stateContains": {"messages": history(("user", "hi"), ("model", "hello"))},
                },
            )
        ],
    ),
    Case(
        "multi-turn in one invocation",
        "promptAgent",
        [
            Send(
                [user("turn1"), user("turn2")],
                model=[says("reply1"), says("reply2")],
                expect_chunks=[STOP_END, STOP_END],
                expect_output={
                    "message": text("model", "reply2"),
                    "finishReason": "stop",
                    "stateContains": {
                        "messages": history(
                            ("user", "turn1"),
                            ("model", "reply1"),
                            ("user", "turn2"),
                            ("model", "reply2"),
                        )
                    },
                },
            )
        ],
    ),
    Case(
        "agent calls tools",
        "promptAgentWithTools",
        [
            Send(
                [user("do it")],
                model=[asks(("testTool", "ref1", {})), says("done")],
                expect_chunks=[
                    {
                        "modelChunk": {
                            "role": "tool",
                            "content": [response("testTool", "ref1", "tool called")],
                        }
                    },
                    TURN_END,
                ],
                expect_output={
                    "message": text("model", "done"),
                    "stateContains": {
                        "messages": [
                            text("user", "do it"),
                            {"role": "model", "content": [request("testTool", "ref1", {})]},
                            {
                                "role": "tool",
                                "content": [response("testTool", "ref1", "tool called")],
                            },
                            text("model", "done"),
                        ]
                    },
                },
            )
        ],
    ),
    Case(
        "interrupt and resume",
        "promptAgentWithInterrupt",
        [
            Send(
                [user("hello")],
                model=[asks(("interruptTool", "123", {"query": "yes?"}))],
                expect_output={
                    "message": {"content": [request("interruptTool", "123", {"query": "yes?"})]},
                    "finishReason": "interrupted",
                    "hasSnapshotId": True,
                },
                capture_snapshot="snap1",
            ),
            Send(
                [respond(("interruptTool", "123", {"answer": "yes indeed"}))],
                init={"snapshotId": "{{snap1}}"},
                model=[says("completed")],
                expect_output={"message": text("model", "completed")},
            ),
        ],
    ),
    Case(
        "interrupt and restart",
        "promptAgentWithRestartTool",
        [
            Send(
                [user("do it")],
                model=[asks(("restartTool", "r1", {"action": "delete"}))],
                expect_output={
                    "message": {"content": [request("restartTool", "r1", {"action": "delete"})]},
                    "finishReason": "interrupted",
                    "hasSnapshotId": True,
                },
                capture_snapshot="snap1",
            ),
            Send(
                [
                    {
                        "resume": {
                            "restart": [
                                {
                                    **request("restartTool", "r1", {"action": "delete"}),
                                    "metadata": {"resumed": {"approved": True}},
                                }
                            ]
                        }
                    }
                ],
                init={"snapshotId": "{{snap1}}"},
                model=[says("deleted")],
                expect_output={"message": text("model", "deleted")},
            ),
        ],
    ),
    Case(
        "restart with forged inputs rejected",
        "promptAgentWithRestartTool",
        [
            Send(
                [user("do it")],
                model=[asks(("restartTool", "r1", {"action": "safe-op"}))],
                capture_snapshot="snap1",
            ),
            Send(
                [
                    {
                        "resume": {
                            "restart": [
                                {
                                    **request("restartTool", "r1", {"action": "/etc/passwd"}),
                                    "metadata": {"resumed": {"approved": True}},
                                }
                            ]
                        }
                    }
                ],
                init={"snapshotId": "{{snap1}}"},
                model=[says("should not reach")],
                expect_output={
                    "finishReason": "failed",
                    "errorContains": {"status": "INVALID_ARGUMENT", "message": "modified inputs"},
                },
            ),
        ],
    ),
    Case(
        "respond referencing non-existent tool rejected",
        "promptAgentWithInterrupt",
        [
            Send(
                [user("hello")],
                model=[asks(("interruptTool", "i1", {"query": "confirm?"}))],
                capture_snapshot="snap1",
            ),
            Send(
                [respond(("fakeTool", "fake-ref", {"answer": "hacked"}))],
                init={"snapshotId": "{{snap1}}"},
                model=[says("should not reach")],
                expect_output={
                    "finishReason": "failed",
                    "errorContains": {
                        "status": "INVALID_ARGUMENT",
                        "message": "not found in session history",
                    },
                },
            ),
        ],
    ),
    Case(
        "snapshot chaining across invocations",
        "promptAgentWithStore",
        [
            Send([user("first")], model=[says("reply1")], capture_snapshot="snap1"),
            Send(
                [user("second")],
                init={"snapshotId": "{{snap1}}"},
                model=[says("reply2")],
                capture_snapshot="snap2",
            ),
            GetSnapshot(
                {
                    "parentId": "{{snap1}}",
                    "status": "completed",
                    "hasSessionId": True,
                    "stateContains": {
                        "messages": history(
                            ("user", "first"),
                            ("model", "reply1"),
                            ("user", "second"),
                            ("model", "reply2"),
                        )
                    },
                },
                snapshot_id="{{snap2}}",
            ),
        ],
    ),
    Case(
        "client-managed state across invocations",
        "promptAgent",
        [
            Send(
                [user("first")],
                model=[says("reply1")],
                capture_state="state1",
                capture_session="sid1",
            ),
            Send(
                [user("second")],
                init={"state": "{{state1}}"},
                model=[says("reply2")],
                expect_output={
                    "message": text("model", "reply2"),
                    "stateContains": {
                        "sessionId": "{{sid1}}",
                        "messages": history(
                            ("user", "first"),
                            ("model", "reply1"),
                            ("user", "second"),
                            ("model", "reply2"),
                        ),
                    },
                },
            ),
        ],
    ),
    Case(
        "detach and background completion",
        "promptAgentWithStore",
        [
            Send(
                [user("process this", detach=True)],
                model=[says("done in background")],
                expect_output={"hasSnapshotId": True},
                capture_snapshot="snap1",
            ),
            WaitUntilSettled(
                "{{snap1}}",
                {
                    "status": "completed",
                    "stateContains": {
                        "messages": history(
                            ("user", "process this"), ("model", "done in background")
                        )
                    },
                },
            ),
        ],
    ),
    Case(
        "detach with background failure",
        "customAgentFailing",
        [
            Send(
                [user("fail", detach=True)],
                expect_output={"hasSnapshotId": True},
                capture_snapshot="snap1",
            ),
            WaitUntilSettled("{{snap1}}", {"status": "failed", "finishReason": "failed"}),
        ],
    ),
    Case(
        "abort pending agent",
        "customAgentBlocking",
        [
            Send(
                [user("do work", detach=True)],
                expect_output={"hasSnapshotId": True},
                capture_snapshot="snap1",
            ),
            Abort("{{snap1}}", expect_previous="pending"),
            GetSnapshot({"status": "aborted"}, snapshot_id="{{snap1}}"),
        ],
    ),
    Case(
        "abort completed agent",
        "promptAgentWithStore",
        [
            Send([user("hi")], model=[says("hello")], capture_snapshot="snap1"),
            Abort("{{snap1}}", expect_previous="completed"),
            GetSnapshot({"status": "completed"}, snapshot_id="{{snap1}}"),
        ],
    ),
    Case(
        "server-managed agent rejects init state",
        "promptAgentWithStore",
        [
            Send(
                [user("fresh message")],
                init={
                    "state": {
                        "messages": [text("user", "stale history")],
                        "custom": {"shouldBeIgnored": True},
                        "artifacts": [],
                    }
                },
                model=[says("reply")],
                expect_error={
                    "status": "FAILED_PRECONDITION",
                    "message": "Cannot send 'state' to agent",
                },
            )
        ],
    ),
    Case(
        "pure detach without payload",
        "customAgentBlocking",
        [
            Send(
                [user("work"), {"detach": True}],
                expect_output={"hasSnapshotId": True},
                capture_snapshot="snap1",
            ),
            GetSnapshot({"status": "pending"}, snapshot_id="{{snap1}}"),
            Abort("{{snap1}}", expect_previous="pending"),
        ],
    ),
    Case(
        "failed snapshot includes error details",
        "customAgentFailing",
        [
            Send(
                [user("fail", detach=True)],
                expect_output={"hasSnapshotId": True},
                capture_snapshot="snap1",
            ),
            WaitUntilSettled(
                "{{snap1}}",
                {
                    "status": "failed",
                    "finishReason": "failed",
                    "errorContains": {"message": "intentional failure"},
                },
            ),
        ],
    ),
    Case(
        "abort non-existent snapshot",
        "promptAgentWithStore",
        [Abort("non-existent-id", expect_previous=None)],
    ),
    Case(
        "artifacts streamed and deduplicated",
        "customAgentWithArtifacts",
        [
            Send(
                [user("go")],
                expect_chunks=[
                    {"artifact": {"name": "doc1", "parts": [{"text": "v1"}]}},
                    {"artifact": {"name": "doc1", "parts": [{"text": "v2"}]}},
                    {"artifact": {"name": "doc2", "parts": [{"text": "other"}]}},
                    TURN_END,
                ],
                expect_output={
                    "message": text("model", "done"),
                    "artifactsContain": [
                        {"name": "doc1", "parts": [{"text": "v2"}]},
                        {"name": "doc2", "parts": [{"text": "other"}]},
                    ],
                },
            )
        ],
    ),
    Case(
        "custom state updated during execution",
        "customAgentWithCustomState",
        [
            Send(
                [user("go")],
                expect_output={
                    "message": text("model", "done"),
                    "stateContains": {"custom": {"counter": 1}},
                },
            )
        ],
    ),
    Case(
        "custom state persisted across invocations",
        "customAgentWithCustomState",
        [
            Send(
                [user("first")],
                expect_output={"stateContains": {"custom": {"counter": 1}}},
                capture_state="state1",
            ),
            Send(
                [user("second")],
                init={"state": "{{state1}}"},
                expect_output={
                    "stateContains": {
                        "custom": {"counter": 2},
                        "messages": history(("user", "first"), ("user", "second")),
                    }
                },
            ),
        ],
    ),
    Case(
        "custom state streamed as customPatch chunk",
        "customAgentWithCustomState",
        [
            Send(
                [user("go")],
                expect_chunks=[
                    {"customPatch": [{"op": "replace", "path": "", "value": {"counter": 1}}]},
                    TURN_END,
                ],
                expect_output={
                    "message": text("model", "done"),
                    "stateContains": {"custom": {"counter": 1}},
                },
            )
        ],
    ),
    Case(
        "customPatch first chunk is whole-document replace then incremental",
        "customAgentWithMultiCustomState",
        [
            Send(
                [user("go")],
                expect_chunks=[
                    {
                        "customPatch": [
                            {
                                "op": "replace",
                                "path": "",
                                "value": {"counter": 1, "status": "working"},
                            }
                        ]
                    },
                    {"customPatch": [{"op": "replace", "path": "/counter", "value": 2}]},
                    {"customPatch": [{"op": "replace", "path": "/status", "value": "done"}]},
                    TURN_END,
                ],
                expect_output={
                    "message": text("model", "done"),
                    "stateContains": {"custom": {"counter": 2, "status": "done"}},
                },
            )
        ],
    ),
    Case(
        "detached run emits no customPatch chunks",
        "customAgentWithCustomStateStore",
        [
            Send(
                [user("go", detach=True)],
                expect_chunks=[],
                expect_output={"hasSnapshotId": True},
                capture_snapshot="snap1",
            ),
            WaitUntilSettled(
                "{{snap1}}",
                {"status": "completed", "stateContains": {"custom": {"counter": 1}}},
            ),
        ],
    ),
    Case(
        "snapshot branching across invocations",
        "promptAgentWithStore",
        [
            Send([user("root")], model=[says("rootReply")], capture_snapshot="snap1"),
            Send(
                [user("branch-a")],
                init={"snapshotId": "{{snap1}}"},
                model=[says("reply-a")],
                capture_snapshot="snap2a",
            ),
            Send(
                [user("branch-b")],
                init={"snapshotId": "{{snap1}}"},
                model=[says("reply-b")],
                capture_snapshot="snap2b",
            ),
            GetSnapshot(
                {
                    "parentId": "{{snap1}}",
                    "status": "completed",
                    "stateContains": {
                        "messages": history(
                            ("user", "root"),
                            ("model", "rootReply"),
                            ("user", "branch-a"),
                            ("model", "reply-a"),
                        )
                    },
                },
                snapshot_id="{{snap2a}}",
            ),
            GetSnapshot(
                {
                    "parentId": "{{snap1}}",
                    "status": "completed",
                    "stateContains": {
                        "messages": history(
                            ("user", "root"),
                            ("model", "rootReply"),
                            ("user", "branch-b"),
                            ("model", "reply-b"),
                        )
                    },
                },
                snapshot_id="{{snap2b}}",
            ),
        ],
    ),
    Case(
        "multiple tool calls in one model response",
        "promptAgentWithTools",
        [
            Send(
                [user("do both")],
                model=[asks(("testTool", "ref1", {}), ("testTool", "ref2", {})), says("all done")],
                expect_output={
                    "message": text("model", "all done"),
                    "stateContains": {
                        "messages": [
                            text("user", "do both"),
                            {
                                "role": "model",
                                "content": [
                                    request("testTool", "ref1", {}),
                                    request("testTool", "ref2", {}),
                                ],
                            },
                            {
                                "role": "tool",
                                "content": [
                                    response("testTool", "ref1", "tool called"),
                                    response("testTool", "ref2", "tool called"),
                                ],
                            },
                            text("model", "all done"),
                        ]
                    },
                },
            )
        ],
    ),
    Case(
        "interrupt with multiple tool requests",
        "promptAgentWithInterrupt",
        [
            Send(
                [user("confirm both")],
                model=[
                    asks(
                        ("interruptTool", "i1", {"query": "q1?"}),
                        ("interruptTool", "i2", {"query": "q2?"}),
                    )
                ],
                expect_output={
                    "message": {
                        "content": [
                            request("interruptTool", "i1", {"query": "q1?"}),
                            request("interruptTool", "i2", {"query": "q2?"}),
                        ]
                    },
                    "hasSnapshotId": True,
                },
                capture_snapshot="snap1",
            ),
            Send(
                [
                    respond(
                        ("interruptTool", "i1", {"answer": "yes1"}),
                        ("interruptTool", "i2", {"answer": "yes2"}),
                    )
                ],
                init={"snapshotId": "{{snap1}}"},
                model=[says("both confirmed")],
                expect_output={"message": text("model", "both confirmed")},
            ),
        ],
    ),
    Case(
        "interrupt resume state accumulation",
        "promptAgentWithInterrupt",
        [
            Send(
                [user("check")],
                model=[asks(("interruptTool", "t1", {"query": "ok?"}))],
                capture_snapshot="snap1",
            ),
            Send(
                [respond(("interruptTool", "t1", {"answer": "confirmed"}))],
                init={"snapshotId": "{{snap1}}"},
                model=[says("done")],
                capture_snapshot="snap2",
            ),
            GetSnapshot(
                {
                    "status": "completed",
                    "stateContains": {
                        "messages": [
                            text("user", "check"),
                            {
                                "role": "model",
                                "content": [request("interruptTool", "t1", {"query": "ok?"})],
                            },
                            {
                                "role": "tool",
                                "content": [
                                    response("interruptTool", "t1", {"answer": "confirmed"})
                                ],
                            },
                            text("model", "done"),
                        ]
                    },
                },
                snapshot_id="{{snap2}}",
            ),
        ],
    ),
    Case(
        "artifacts persisted across invocations",
        "customAgentWithArtifactsStore",
        [
            Send(
                [user("first")],
                expect_output={
                    "hasSnapshotId": True,
                    "artifactsContain": [{"name": "doc1", "parts": [{"text": "content1"}]}],
                },
                capture_snapshot="snap1",
            ),
            Send(
                [user("second")],
                init={"snapshotId": "{{snap1}}"},
                expect_output={
                    "artifactsContain": [
                        {"name": "doc1", "parts": [{"text": "content1"}]},
                        {"name": "doc2", "parts": [{"text": "content2"}]},
                    ]
                },
            ),
        ],
    ),
    Case(
        "custom state persisted via server-managed store",
        "customAgentWithCustomStateStore",
        [
            Send([user("first")], capture_snapshot="snap1"),
            Send([user("second")], init={"snapshotId": "{{snap1}}"}, capture_snapshot="snap2"),
            GetSnapshot(
                {
                    "status": "completed",
                    "stateContains": {
                        "custom": {"counter": 2},
                        "messages": history(("user", "first"), ("user", "second")),
                    },
                },
                snapshot_id="{{snap2}}",
            ),
        ],
    ),
    Case(
        "abort failed agent",
        "customAgentFailing",
        [
            Send(
                [user("fail", detach=True)],
                expect_output={"hasSnapshotId": True},
                capture_snapshot="snap1",
            ),
            WaitUntilSettled("{{snap1}}", {"status": "failed", "finishReason": "failed"}),
            Abort("{{snap1}}", expect_previous="failed"),
            GetSnapshot({"status": "failed"}, snapshot_id="{{snap1}}"),
        ],
    ),
    Case(
        "abort already aborted agent",
        "customAgentBlocking",
        [
            Send(
                [user("work", detach=True)],
                expect_output={"hasSnapshotId": True},
                capture_snapshot="snap1",
            ),
            Abort("{{snap1}}", expect_previous="pending"),
            Abort("{{snap1}}", expect_previous="aborted"),
            GetSnapshot({"status": "aborted"}, snapshot_id="{{snap1}}"),
        ],
    ),
    Case(
        "resume server-managed session by sessionId",
        "promptAgentWithStore",
        [
            Send(
                [user("first")],
                init={"sessionId": "11111111-1111-4111-8111-111111111111"},
                model=[says("reply1")],
                expect_output={"hasSnapshotId": True},
                capture_snapshot="snap1",
            ),
            Send(
                [user("second")],
                init={"sessionId": "11111111-1111-4111-8111-111111111111"},
                model=[says("reply2")],
                capture_snapshot="snap2",
            ),
            GetSnapshot(
                {
                    "parentId": "{{snap1}}",
                    "status": "completed",
                    "stateContains": {
                        "sessionId": "11111111-1111-4111-8111-111111111111",
                        "messages": history(
                            ("user", "first"),
                            ("model", "reply1"),
                            ("user", "second"),
                            ("model", "reply2"),
                        ),
                    },
                },
                snapshot_id="{{snap2}}",
            ),
        ],
    ),
    Case(
        "fetch latest snapshot by sessionId",
        "promptAgentWithStore",
        [
            Send(
                [user("first")],
                init={"sessionId": "22222222-2222-4222-8222-222222222222"},
                model=[says("reply1")],
                capture_snapshot="snap1",
            ),
            Send(
                [user("second")],
                init={"sessionId": "22222222-2222-4222-8222-222222222222"},
                model=[says("reply2")],
            ),
            GetSnapshot(
                {
                    "parentId": "{{snap1}}",
                    "status": "completed",
                    "hasSessionId": True,
                    "stateContains": {
                        "sessionId": "22222222-2222-4222-8222-222222222222",
                        "messages": history(
                            ("user", "first"),
                            ("model", "reply1"),
                            ("user", "second"),
                            ("model", "reply2"),
                        ),
                    },
                },
                session_id="22222222-2222-4222-8222-222222222222",
            ),
        ],
    ),
    Case(
        "non-UUID sessionId accepted",
        "promptAgentWithStore",
        [
            Send(
                [user("first")],
                init={"sessionId": "my-app-session-123"},
                model=[says("reply1")],
                expect_output={"finishReason": "stop", "hasSnapshotId": True},
            ),
            GetSnapshot(
                {
                    "status": "completed",
                    "stateContains": {
                        "sessionId": "my-app-session-123",
                        "messages": history(("user", "first"), ("model", "reply1")),
                    },
                },
                session_id="my-app-session-123",
            ),
        ],
    ),
    Case(
        "client-managed agent rejects sessionId",
        "promptAgent",
        [
            Send(
                [user("hi")],
                init={"sessionId": "44444444-4444-4444-8444-444444444444"},
                model=[says("hello")],
                expect_error={"status": "FAILED_PRECONDITION", "message": "Cannot use 'sessionId'"},
            )
        ],
    ),
    Case(
        "snapshotId and matching sessionId together resume",
        "promptAgentWithStore",
        [
            Send(
                [user("first")],
                init={"sessionId": _SESSION_55},
                model=[says("reply1")],
                capture_snapshot="snap1",
            ),
            Send(
                [user("second")],
                init={"snapshotId": "{{snap1}}", "sessionId": _SESSION_55},
                model=[says("reply2")],
                expect_output={"finishReason": "stop"},
            ),
        ],
    ),
    Case(
        "snapshotId with mismatched sessionId rejected",
        "promptAgentWithStore",
        [
            Send(
                [user("first")],
                init={"sessionId": _SESSION_55},
                model=[says("reply1")],
                capture_snapshot="snap1",
            ),
            Send(
                [user("second")],
                init={
                    "snapshotId": "{{snap1}}",
                    "sessionId": "99999999-9999-4999-8999-999999999999",
                },
                model=[says("reply2")],
                expect_error={
                    "status": "INVALID_ARGUMENT",
                    "message": "does not belong to session",
                },
            ),
        ],
    ),
    # generate.yaml: one model call; what the model was asked is checked in `run_case`.
    Case(
        "simple generate call",
        "generateAgent",
        [
            Send(
                [user("hi")],
                model=[says("final response")],
                expect_output={"message": text("model", "final response"), "finishReason": "stop"},
            )
        ],
        python_only=True,
    ),
    Case(
        "stream responses",
        "generateAgent",
        [
            Send(
                [user("hi")],
                model=[says("final response")],
                stream_chunks=[
                    [
                        {"index": 0, "role": "model", "content": [{"text": "3"}]},
                        {"index": 0, "role": "model", "content": [{"text": "2"}]},
                        {"index": 0, "role": "model", "content": [{"text": "1"}]},
                    ]
                ],
                expect_chunks=[
                    {"modelChunk": {"index": 0, "role": "model", "content": [{"text": "3"}]}},
                    {"modelChunk": {"index": 0, "role": "model", "content": [{"text": "2"}]}},
                    {"modelChunk": {"index": 0, "role": "model", "content": [{"text": "1"}]}},
                    STOP_END,
                ],
                expect_output={"message": text("model", "final response"), "finishReason": "stop"},
            )
        ],
        python_only=True,
    ),
    Case(
        "calls tools",
        "generateAgentWithTools",
        [
            Send(
                [user("hi")],
                model=[asks(("testTool", "ref123", {})), says("final response")],
                expect_output={"message": text("model", "final response")},
            )
        ],
        python_only=True,
    ),
]

#: What each generate case's last model call must have been asked: its messages (after the
#: system prompt, which these agents have none of), its config and its tools' names.
GENERATE_REQUESTS: dict[str, Wire] = {
    "simple generate call": {
        "messages": [text("user", "hi")],
        "config": {"temperature": 11},
        "tools": [],
    },
    "stream responses": {
        "messages": [text("user", "hi")],
        "config": {"temperature": 11},
        "tools": [],
    },
    "calls tools": {
        "messages": [
            text("user", "hi"),
            {"role": "model", "content": [request("testTool", "ref123", {})]},
            {"role": "tool", "content": [response("testTool", "ref123", "tool called")]},
        ],
        "config": {"temperature": 11},
        "tools": [{"name": "testTool", "description": "description"}],
    },
}

#: Agents whose code runs in a tool (Genkit's custom agents): their tool round's chunks are
#: left out of the chunk comparison (see the module docstring).
CUSTOM_AGENTS = frozenset(
    {
        "customAgentWithArtifacts",
        "customAgentWithCustomState",
        "customAgentWithMultiCustomState",
        "customAgentWithCustomStateStore",
        "customAgentWithArtifactsStore",
    }
)

# -- the agents -------------------------------------------------------------------------------


class ProgrammedModel:
    """Genkit's programmable model: each call answers the next programmed response, after
    streaming that call's programmed chunks. Records what every call was asked."""

    name = "programmable"

    def __init__(self) -> None:
        self.responses: list[Wire] = []
        self.chunks: list[list[Wire]] = []
        self.requests: list[ModelRequest] = []
        self._calls = 0

    def program(self, responses: Sequence[Wire], chunks: Sequence[Sequence[Wire]]) -> None:
        self.responses = [dict(r) for r in responses]
        self.chunks = [list(group) for group in chunks]
        self._calls = 0

    async def generate(
        self, request: ModelRequest, on_chunk: ChunkSink | None = None
    ) -> ModelResponse:
        self.requests.append(request)
        call = self._calls
        self._calls += 1
        if on_chunk is not None and call < len(self.chunks):
            for chunk in self.chunks[call]:
                await on_chunk([Part.model_validate(p) for p in chunk["content"]])
        if not self.responses:
            raise AssertionError("the programmable model ran out of responses")
        answer = self.responses.pop(0)
        return ModelResponse(
            message=Message.model_validate(answer["message"]),
            finish_reason=answer.get("finishReason", "stop"),
        )


class ToolThenDone:
    """A custom agent's model: asks for its one tool after the user speaks, then says done."""

    name = "custom"

    def __init__(self, tool: str) -> None:
        self.tool = tool

    async def generate(
        self, request: ModelRequest, on_chunk: ChunkSink | None = None
    ) -> ModelResponse:
        last = request.messages[-1]
        if last.role == "user":
            message = Message(role="model", content=[Part.of_request(self.tool, "work", {})])
        else:
            message = Message(role="model", content=[Part.of_text("done")])
        return ModelResponse(message=message)


class Blocking:
    """``customAgentBlocking``: a model call that never ends until the turn is aborted."""

    name = "blocking"

    async def generate(
        self, request: ModelRequest, on_chunk: ChunkSink | None = None
    ) -> ModelResponse:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")  # pragma: no cover


class Failing:
    """``customAgentFailing``: every call fails."""

    name = "failing"

    async def generate(
        self, request: ModelRequest, on_chunk: ChunkSink | None = None
    ) -> ModelResponse:
        raise RuntimeError("intentional failure")


class InterruptQuery(BaseModel):
    """``interruptTool``'s input."""

    query: str


class RestartInput(BaseModel):
    """``restartTool``'s input."""

    action: str


class RestartOutput(BaseModel):
    """``restartTool``'s output."""

    result: str


def _restart_tool(value: RestartInput, ctx: ToolContext) -> RestartOutput:
    if not ctx.resumed:
        ctx.interrupt({"requiresConfirmation": True})
    return RestartOutput(result=f"confirmed: {value.action}")


def _counter(_: Any, ctx: ToolContext) -> str:
    ctx.update_state(lambda s: {"counter": ((s or {}).get("counter") or 0) + 1})
    return "counted"


def _three_changes(_: Any, ctx: ToolContext) -> str:
    ctx.update_state(lambda _: {"counter": 1, "status": "working"})
    ctx.update_state(lambda s: {**s, "counter": 2})
    ctx.update_state(lambda s: {**s, "status": "done"})
    return "changed"


def _artifacts(_: Any, ctx: ToolContext) -> str:
    ctx.add_artifact({"name": "doc1", "parts": [{"text": "v1"}]})
    ctx.add_artifact({"name": "doc1", "parts": [{"text": "v2"}]})
    ctx.add_artifact({"name": "doc2", "parts": [{"text": "other"}]})
    return "written"


def _numbered_artifact(_: Any, ctx: ToolContext) -> str:
    number = len(ctx.artifacts) + 1
    ctx.add_artifact({"name": f"doc{number}", "parts": [{"text": f"content{number}"}]})
    return "written"


#: A signing key for the client-managed agents' state (the tests' own, not a deployable one).
SPEC_STATE_KEYS = {"spec": "genkit-spec-signing-key-0123456789"}


@dataclass
class SpecApp:
    """The spec's agents on one store, with the programmable model they share."""

    engine: Engine
    model: ProgrammedModel
    store: SessionStore

    def agent(self, name: str) -> Agent:
        return self.engine.agents[name]


def build_spec_app(store: SessionStore, *, execution: str) -> SpecApp:
    """The spec's agents: the stored ones on ``store``, run as ``execution`` says."""
    model = ProgrammedModel()
    ai = Engine(model=model, state_keys=SPEC_STATE_KEYS)
    test_tool = ai.define_tool(
        name="testTool", description="description", fn=lambda _: "tool called"
    )
    interrupt = ai.define_interrupt(
        name="interruptTool", description="An interrupt tool", input_schema=InterruptQuery
    )
    restart = ai.define_tool(
        name="restartTool",
        description="A tool that requires confirmation before executing",
        input_schema=RestartInput,
        output_schema=RestartOutput,
        fn=_restart_tool,
    )
    stored: dict[str, Any] = {"store": store, "execution": execution}
    config = {"temperature": 1}
    ai.define_agent(name="promptAgent", config=config)
    ai.define_agent(name="promptAgentWithStore", config=config, **stored)
    ai.define_agent(name="promptAgentWithTools", config=config, tools=[test_tool])
    ai.define_agent(name="promptAgentWithInterrupt", config=config, tools=[interrupt], **stored)
    ai.define_agent(name="promptAgentWithRestartTool", config=config, tools=[restart], **stored)
    ai.define_agent(name="generateAgent", config={"temperature": 11})
    ai.define_agent(name="generateAgentWithTools", config={"temperature": 11}, tools=[test_tool])
    ai.define_agent(name="customAgentBlocking", model=Blocking(), **stored)
    ai.define_agent(name="customAgentFailing", model=Failing(), max_attempts=1, **stored)
    customs: list[tuple[str, Callable[[Any, ToolContext], str], bool]] = [
        ("customAgentWithArtifacts", _artifacts, False),
        ("customAgentWithCustomState", _counter, False),
        ("customAgentWithMultiCustomState", _three_changes, False),
        ("customAgentWithArtifactsStore", _numbered_artifact, True),
        ("customAgentWithCustomStateStore", _counter, True),
    ]
    for name, fn, keeps in customs:
        tool = ai.define_tool(name=f"{name}Work", fn=fn)
        options = stored if keeps else {}
        ai.define_agent(name=name, model=ToolThenDone(tool.name), tools=[tool], **options)
    return SpecApp(engine=ai, model=model, store=store)


@contextlib.asynccontextmanager
async def spec_app(store: SessionStore, *, workers: bool) -> AsyncIterator[SpecApp]:
    """The spec's agents on ``store``; with ``workers``, their turns are queued and a worker
    pool runs them in this process, as ``turnstile serve --workers`` does."""
    app = build_spec_app(store, execution="workers" if workers else "inline")
    if not workers:
        yield app
        return
    async with WorkerPool(app.engine, store, poll_interval=0.05, scheduler=False, concurrency=4):
        yield app


# -- the drivers ------------------------------------------------------------------------------


@dataclass
class Sent:
    """What one invocation produced: its chunks, then its output or the error it threw."""

    chunks: list[Wire] = field(default_factory=list)
    output: Wire | None = None
    thrown: Wire | None = None


class Driver(Protocol):
    """A way to run the spec's steps against the agents."""

    async def send(self, agent: str, init: Wire, inputs: Sequence[Wire]) -> Sent: ...

    async def get_snapshot(
        self, agent: str, *, snapshot_id: str | None, session_id: str | None
    ) -> Wire | None: ...

    async def abort(self, agent: str, snapshot_id: str) -> str | None: ...


def _invocations(inputs: Sequence[Wire]) -> list[Wire]:
    """The inputs, a detach-only input folded into the one before it (which it detaches)."""
    folded: list[Wire] = []
    for item in inputs:
        if set(item) == {"detach"} and folded:
            folded[-1] = {**folded[-1], "detach": bool(item["detach"])}
        else:
            folded.append(dict(item))
    return folded


class PythonDriver:
    """The spec through the Python API: one chat per invocation, ``send_stream`` per input."""

    def __init__(self, app: SpecApp) -> None:
        self.app = app

    async def send(self, agent: str, init: Wire, inputs: Sequence[Wire]) -> Sent:
        sent = Sent()
        try:
            chat = self.app.agent(agent).chat(
                snapshot_id=init.get("snapshotId"),
                session_id=init.get("sessionId"),
                state=init.get("state"),
            )
        except AgentError as thrown:
            sent.thrown = {"status": thrown.status, "message": thrown.message}
            return sent
        for item in _invocations(inputs):
            message = item.get("message")
            resume = item.get("resume")
            parts = (
                {key: [Part.model_validate(p) for p in resume.get(key, [])] for key in resume}
                if resume is not None
                else None
            )
            try:
                if item.get("detach"):
                    result = await chat.send(message, resume=parts, wait=False)
                else:
                    turn = chat.send_stream(message, resume=parts)
                    sent.chunks += [chunk.to_wire() async for chunk in turn.stream]
                    result = await turn.response
                    sent.chunks.append({"turnEnd": _reason_of(result.to_wire())})
            except AgentError as error:
                if error.response is None:
                    sent.thrown = {"status": error.status, "message": error.message}
                    return sent
                sent.output = error.response.to_wire()
                sent.chunks.append({"turnEnd": _reason_of(sent.output)})
                return sent
            sent.output = result.to_wire()
        return sent

    async def get_snapshot(
        self, agent: str, *, snapshot_id: str | None, session_id: str | None
    ) -> Wire | None:
        snapshot = await self.app.agent(agent).get_snapshot(
            snapshot_id=snapshot_id, session_id=session_id
        )
        return snapshot.to_wire() if snapshot is not None else None

    async def abort(self, agent: str, snapshot_id: str) -> str | None:
        previous = await self.app.agent(agent).abort(snapshot_id)
        return previous.value if previous is not None else None


def _reason_of(output: Wire) -> Wire:
    return {"finishReason": output["finishReason"]} if output.get("finishReason") else {}


class HttpDriver:
    """The spec over Genkit's HTTP protocol, as the genuine client speaks it: one streaming
    request per input, the next input continuing from the previous output."""

    def __init__(self, base_url: str, http: httpx.AsyncClient) -> None:
        self.base_url = base_url
        self.http = http

    async def send(self, agent: str, init: Wire, inputs: Sequence[Wire]) -> Sent:
        sent = Sent()
        current = dict(init)
        for item in _invocations(inputs):
            reply = await self.http.post(
                f"{self.base_url}/api/{agent}",
                json={"data": item, "init": current},
                headers={"accept": "text/event-stream"},
            )
            assert reply.status_code == 200, reply.text
            for kind, payload in _frames(reply.text):
                if kind == "error":
                    sent.thrown = dict(payload["error"])
                    return sent
                if "result" in payload:
                    sent.output = dict(payload["result"])
                else:
                    sent.chunks.append(dict(payload["message"]))
            assert sent.output is not None, reply.text
            if sent.output.get("finishReason") == "failed":
                return sent
            if sent.output.get("snapshotId"):
                current = {"snapshotId": sent.output["snapshotId"]}
            elif sent.output.get("state") is not None:
                current = {"state": sent.output["state"]}
        return sent

    async def get_snapshot(
        self, agent: str, *, snapshot_id: str | None, session_id: str | None
    ) -> Wire | None:
        selector = {"snapshotId": snapshot_id} if snapshot_id else {"sessionId": session_id}
        reply = await self.http.post(
            f"{self.base_url}/api/{agent}/getSnapshot", json={"data": selector}
        )
        if reply.status_code == 404:
            return None
        assert reply.status_code == 200, reply.text
        result: Wire = reply.json()["result"]
        return result

    async def abort(self, agent: str, snapshot_id: str) -> str | None:
        reply = await self.http.post(
            f"{self.base_url}/api/{agent}/abort", json={"data": {"snapshotId": snapshot_id}}
        )
        assert reply.status_code == 200, reply.text
        status: str | None = reply.json()["result"].get("status")
        return status


def _frames(body: str) -> list[tuple[str, Wire]]:
    """The frames of a streamed answer: ``("data", {...})`` or ``("error", {...})``."""
    frames: list[tuple[str, Wire]] = []
    for block in body.split("\n\n"):
        if not block.strip():
            continue
        kind, _, payload = block.partition(": ")
        frames.append((kind, json.loads(payload)))
    return frames


@contextlib.asynccontextmanager
async def http_driver(app: SpecApp) -> AsyncIterator[HttpDriver]:
    """``app`` behind a real HTTP server in this loop, and a driver speaking to it."""
    async with serve_in_loop(create_app(app.engine)) as url, httpx.AsyncClient(timeout=30) as http:
        yield HttpDriver(url, http)


# -- running a case ---------------------------------------------------------------------------

_WHOLE = re.compile(r"^\{\{(\w+)\}\}$")
_INLINE = re.compile(r"\{\{(\w+)\}\}")


def resolve(value: Any, captures: Mapping[str, Any]) -> Any:
    """``value`` with every ``{{name}}`` replaced by what was captured under ``name``."""
    if isinstance(value, str):
        whole = _WHOLE.match(value)
        if whole:
            return captures[whole.group(1)]
        return _INLINE.sub(lambda m: str(captures[m.group(1)]), value)
    if isinstance(value, list):
        return [resolve(v, captures) for v in value]
    if isinstance(value, dict):
        return {k: resolve(v, captures) for k, v in value.items()}
    return value


def contains(actual: Any, expected: Any, path: str = "") -> None:
    """The spec's "contains": objects match key by key (more keys allowed), lists as an
    in-order subsequence, ``None`` as absent or null, anything else exactly."""
    if expected is None:
        assert actual is None, f"{path}: expected nothing, got {actual!r}"
    elif isinstance(expected, dict):
        assert isinstance(actual, dict), f"{path}: expected an object, got {actual!r}"
        for key, value in expected.items():
            contains(actual.get(key), value, f"{path}.{key}")
    elif isinstance(expected, list):
        assert isinstance(actual, list), f"{path}: expected a list, got {actual!r}"
        position = 0
        for index, item in enumerate(expected):
            while True:
                assert position < len(actual), (
                    f"{path}[{index}]: {item!r} not found in order in {actual!r}"
                )
                try:
                    contains(actual[position], item, f"{path}[{position}]")
                except AssertionError:
                    position += 1
                    continue
                position += 1
                break
    else:
        assert actual == expected, f"{path}: expected {expected!r}, got {actual!r}"


def check_output(output: Wire, expect: Wire) -> None:
    """An invocation's output against the spec's ``expectOutput``."""
    if expect.get("message") is not None:
        contains(output.get("message"), expect["message"], "output.message")
    if expect.get("hasSnapshotId"):
        assert output.get("snapshotId"), f"no snapshotId in {output!r}"
    if expect.get("hasSessionId"):
        assert (output.get("state") or {}).get("sessionId"), f"no state.sessionId in {output!r}"
    if expect.get("stateContains") is not None:
        contains(output.get("state"), expect["stateContains"], "output.state")
    for wanted in expect.get("artifactsContain") or []:
        found = [a for a in output.get("artifacts") or [] if a.get("name") == wanted["name"]]
        assert found, f"no artifact {wanted['name']!r} in {output!r}"
        contains(found[0], wanted, f"artifact {wanted['name']}")
    if "finishReason" in expect:
        assert output.get("finishReason") == expect["finishReason"], output
    if expect.get("errorContains") is not None:
        error = output.get("error") or {}
        wanted = expect["errorContains"]
        if "status" in wanted:
            assert error.get("status") == wanted["status"], output
        if "message" in wanted:
            assert wanted["message"] in (error.get("message") or ""), output


def check_snapshot(snapshot: Wire, expect: Wire) -> None:
    """A snapshot against the spec's ``expectSnapshot``."""
    for key in ("parentId", "status", "finishReason"):
        if key in expect:
            assert snapshot.get(key) == expect[key], (key, snapshot)
    if expect.get("hasSessionId"):
        assert (snapshot.get("state") or {}).get("sessionId"), snapshot
    if expect.get("stateContains") is not None:
        contains(snapshot.get("state"), expect["stateContains"], "snapshot.state")
    if expect.get("errorContains") is not None:
        contains(snapshot.get("error"), expect["errorContains"], "snapshot.error")


def check_chunks(case: Case, actual: list[Wire], expected: Sequence[Wire]) -> None:
    """The chunks in order, exactly as many; ``turnEnd`` pins only a finish reason it names."""
    if case.agent in CUSTOM_AGENTS:
        actual = [c for c in actual if "modelChunk" not in c]
    assert len(actual) == len(expected), f"chunks {actual!r}, expected {list(expected)!r}"
    for got, want in zip(actual, expected, strict=True):
        if "turnEnd" in want:
            assert "turnEnd" in got, got
            reason = want["turnEnd"].get("finishReason")
            if reason is not None:
                assert got["turnEnd"].get("finishReason") == reason, got
        else:
            contains(got, want, "chunk")


async def run_case(case: Case, app: SpecApp, driver: Driver) -> None:
    """Run every step of ``case``, asserting what the spec expects of it."""
    captures: dict[str, Any] = {}
    for number, step in enumerate(case.steps):
        label = f"step {number} ({type(step).__name__})"
        if isinstance(step, Send):
            sent_step = resolve_step(step, captures)
            app.model.program(sent_step.model, sent_step.stream_chunks)
            sent = await driver.send(case.agent, sent_step.init, sent_step.inputs)
            _check_sent(case, sent_step, sent, captures, label)
        elif isinstance(step, GetSnapshot):
            snapshot = await driver.get_snapshot(
                case.agent,
                snapshot_id=resolve(step.snapshot_id, captures),
                session_id=resolve(step.session_id, captures),
            )
            assert snapshot is not None, f"{label}: no snapshot"
            check_snapshot(snapshot, resolve(step.expect, captures))
        elif isinstance(step, WaitUntilSettled):
            snapshot_id = resolve(step.snapshot_id, captures)
            snapshot = await _settled(driver, case.agent, snapshot_id)
            check_snapshot(snapshot, resolve(step.expect, captures))
        else:
            previous = await driver.abort(case.agent, resolve(step.snapshot_id, captures))
            if step.expect_previous is not _NO_EXPECTATION:
                assert previous == step.expect_previous, f"{label}: previous {previous!r}"
    if case.name in GENERATE_REQUESTS:
        _check_generate_request(app.model.requests[-1], GENERATE_REQUESTS[case.name])


def resolve_step(step: Send, captures: Mapping[str, Any]) -> Send:
    return Send(
        inputs=resolve(list(step.inputs), captures),
        init=resolve(dict(step.init), captures),
        model=list(step.model),
        stream_chunks=list(step.stream_chunks),
        expect_chunks=step.expect_chunks,
        expect_output=resolve(step.expect_output, captures),
        expect_error=step.expect_error,
        capture_snapshot=step.capture_snapshot,
        capture_state=step.capture_state,
        capture_session=step.capture_session,
    )


def _check_sent(case: Case, step: Send, sent: Sent, captures: dict[str, Any], label: str) -> None:
    if step.expect_error is not None:
        assert sent.thrown is not None, f"{label}: expected a thrown error, got {sent.output!r}"
        assert sent.thrown.get("status") == step.expect_error["status"], (label, sent.thrown)
        assert step.expect_error["message"] in sent.thrown.get("message", ""), (label, sent.thrown)
        return
    assert sent.thrown is None, f"{label}: threw {sent.thrown!r}"
    assert sent.output is not None, label
    if step.expect_chunks is not None:
        check_chunks(case, sent.chunks, step.expect_chunks)
    if step.expect_output is not None:
        check_output(sent.output, step.expect_output)
    if step.capture_snapshot:
        assert sent.output.get("snapshotId"), f"{label}: no snapshotId in {sent.output!r}"
        captures[step.capture_snapshot] = sent.output["snapshotId"]
    if step.capture_state:
        assert sent.output.get("state"), f"{label}: no state in {sent.output!r}"
        captures[step.capture_state] = sent.output["state"]
    if step.capture_session:
        captures[step.capture_session] = sent.output["state"]["sessionId"]


async def _settled(driver: Driver, agent: str, snapshot_id: str) -> Wire:
    """The snapshot once it is completed, failed or aborted (the spec waits up to 5 s)."""
    for _ in range(100):
        snapshot = await driver.get_snapshot(agent, snapshot_id=snapshot_id, session_id=None)
        if snapshot is not None and snapshot["status"] in ("completed", "failed", "aborted"):
            return snapshot
        await asyncio.sleep(0.05)
    raise AssertionError(f"snapshot {snapshot_id} did not settle: {snapshot!r}")


def _check_generate_request(request: ModelRequest, expected: Wire) -> None:
    assert [m.to_wire() for m in request.messages] == expected["messages"]
    assert request.config == expected["config"]
    assert [{"name": t.name, "description": t.description} for t in request.tools] == expected[
        "tools"
    ]
