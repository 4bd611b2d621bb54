"""The public faces are pinned: what ``engine`` and ``engine.store`` export changes only on
purpose, with this test changed in the same commit."""

from __future__ import annotations

import engine
import engine.store

ENGINE = [
    "Agent",
    "AgentChunk",
    "AgentError",
    "AgentInterrupt",
    "AgentResponse",
    "Artifact",
    "Chat",
    "Engine",
    "EscalationStep",
    "FinishReason",
    "FunctionModel",
    "InterruptTool",
    "Message",
    "Model",
    "ModelRequest",
    "ModelResponse",
    "Part",
    "PausedTurn",
    "RetryPolicy",
    "ScriptedModel",
    "StateSchemaError",
    "Tool",
    "ToolContext",
    "ToolInterrupt",
    "TurnFailedError",
    "TurnStatus",
    "TurnstileError",
]

#: What a store backend implements (the port) and the records it reads and writes.
STORE_PORT = [
    "ApprovalHistory",
    "AssignmentBook",
    "ChangeFeed",
    "Inbox",
    "Journal",
    "Relay",
    "Retention",
    "SessionStore",
    "TurnQueue",
    "TurnTimeline",
    "VoteBook",
]


def test_engine_exports_exactly_its_public_names() -> None:
    """``engine`` exports the names an application writes against, and each resolves."""
    assert sorted(engine.__all__) == ENGINE
    assert all(getattr(engine, name) is not None for name in ENGINE)


def test_the_store_face_exports_the_port_and_every_record() -> None:
    """``engine.store`` exports every protocol of the port and the records they name."""
    exported = set(engine.store.__all__)
    assert set(STORE_PORT) <= exported
    assert all(getattr(engine.store, name) is not None for name in exported)
    assert {"TurnRecord", "NewTurn", "ToolCallRecord", "PendingApproval", "Vote"} <= exported
