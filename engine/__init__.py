"""Turnstile's engine: Genkit-style agents with interrupts, run as a persisted state machine.

The engine holds the semantics and never imports :mod:`stores` or :mod:`workers`.
"""

from __future__ import annotations

from engine.agent import Agent, SessionSnapshot, SessionState
from engine.chat import AgentTurn, Chat
from engine.engine import Engine
from engine.errors import (
    AgentError,
    ApprovalNotPendingError,
    DecisionConflictError,
    FailedPreconditionError,
    InvalidArgumentError,
    InvalidStateError,
    LeaseLostError,
    NotFoundError,
    ResumeValidationError,
    SessionBusyError,
    SnapshotNotResumableError,
    StaleSnapshotError,
    StaleTransitionError,
    StoreError,
    ToolError,
    TransientError,
    TurnFailedError,
    TurnstileError,
)
from engine.executor import LeaseSettings, RetryPolicy
from engine.model import Model, ModelRequest, ModelResponse, ToolSpec, TransientModelError
from engine.parts import Message, Part, ToolRequest, ToolResponse
from engine.response import AgentChunk, AgentInterrupt, AgentResponse
from engine.scripted import ScriptedModel
from engine.status import FinishReason, TurnStatus
from engine.store import SessionStore
from engine.tools import InterruptTool, Tool, ToolContext, ToolInterrupt

__all__ = [
    "Agent",
    "AgentChunk",
    "AgentError",
    "AgentInterrupt",
    "AgentResponse",
    "AgentTurn",
    "ApprovalNotPendingError",
    "Chat",
    "DecisionConflictError",
    "Engine",
    "FailedPreconditionError",
    "FinishReason",
    "InterruptTool",
    "InvalidArgumentError",
    "InvalidStateError",
    "LeaseLostError",
    "LeaseSettings",
    "Message",
    "Model",
    "ModelRequest",
    "ModelResponse",
    "NotFoundError",
    "Part",
    "ResumeValidationError",
    "RetryPolicy",
    "ScriptedModel",
    "SessionBusyError",
    "SessionSnapshot",
    "SessionState",
    "SessionStore",
    "SnapshotNotResumableError",
    "StaleSnapshotError",
    "StaleTransitionError",
    "StoreError",
    "Tool",
    "ToolContext",
    "ToolError",
    "ToolInterrupt",
    "ToolRequest",
    "ToolResponse",
    "ToolSpec",
    "TransientError",
    "TransientModelError",
    "TurnFailedError",
    "TurnStatus",
    "TurnstileError",
]
