"""Turnstile's engine: Genkit-style agents with interrupts, run as a persisted state machine.

The package root holds what an application writes against: the engine and its agents, chats
and their responses, tools and interrupts, models, and the errors to catch. Everything else
is importable from its module (``engine.errors`` for every typed error, ``engine.store`` for
the store protocol and its records, ``engine.turns.executor`` for lease settings, and so on).
The engine never imports :mod:`stores` or :mod:`workers`.
"""

from __future__ import annotations

from engine.agent import Agent
from engine.chat import Chat
from engine.conversation.parts import Message, Part
from engine.conversation.session_state import Artifact, StateSchemaError
from engine.engine import Engine
from engine.errors import AgentError, TurnFailedError, TurnstileError
from engine.escalation import EscalationStep
from engine.model import Model, ModelRequest, ModelResponse
from engine.models.function import FunctionModel
from engine.response import AgentChunk, AgentInterrupt, AgentResponse
from engine.scripted import ScriptedModel
from engine.state.versioning import PausedTurn
from engine.status import FinishReason, TurnStatus
from engine.tools import InterruptTool, Tool, ToolContext, ToolInterrupt
from engine.turns.executor import RetryPolicy

__all__ = [
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
