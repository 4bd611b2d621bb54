"""Expiry of long-lived approvals: interrupts that declare ``timeout=`` and ``on_timeout=``.

When the earliest deadline among a paused turn's calls passes, the turn is decided:

* if every paused call of the turn belongs to an interrupt with a default answer
  (``on_timeout=<output>``), the turn is resumed with those answers, recorded as decided by
  ``timeout``;
* otherwise (an interrupt with ``on_timeout="fail"`` or none, or a self-pausing tool), the
  turn is failed: a new turn of kind ``expire`` settles ``failed`` with status
  ``DEADLINE_EXCEEDED``, holding the conversation up to its last closed round.

An interrupt with ``on_timeout={"escalate": "group"}`` has no deadline and is never expired:
the worker's sweep moves it to that group instead (:mod:`engine.approvals.assignment`).

Both go through the normal path — validation, ``create_turn`` with the answers guarded on
``interrupted``, execution inline or by a worker — so running the job twice, or on two
workers at once, decides each approval once.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from engine.agent import TurnRequest
from engine.conversation.parts import RESUMED, Part
from engine.errors import AgentError, TurnFailedError
from engine.rejection import REJECT, rejection_part
from engine.store import SessionStore, ToolCallRecord, ToolCallStatus, TurnInput
from engine.telemetry import instruments
from engine.tools import InterruptTool

if TYPE_CHECKING:
    from engine.engine import Engine

__all__ = ["FAIL", "TIMEOUT_DECIDER", "expire_approvals"]

logger = logging.getLogger("turnstile.expiry")

#: ``on_timeout=FAIL`` fails the turn when the approval expires.
FAIL = "fail"
#: Recorded as ``decided_by`` on answers given by expiry.
TIMEOUT_DECIDER = "timeout"


async def expire_approvals(
    engine: Engine, store: SessionStore, *, now: datetime | None = None, limit: int = 100
) -> list[str]:
    """Decide every paused turn in ``store`` whose earliest approval deadline has passed.

    Returns the ids of the turns it created (resumes or expiries). Turns decided meanwhile by
    a human or another worker are skipped.
    """
    moment = now or datetime.now(UTC)
    served = [name for name, agent in engine.agents.items() if agent.store is store]
    overdue: dict[str, list[ToolCallRecord]] = defaultdict(list)
    for call in await store.list_expired_interrupts(now=moment, limit=limit, agents=served):
        overdue[call.turn_id].append(call)
    created: list[str] = []
    expired: dict[str, int] = defaultdict(int)
    for turn_id in overdue:
        turn = await store.get_turn(turn_id)
        agent = engine.agents.get(turn.agent) if turn else None
        if turn is None or agent is None or agent.store is not store:
            continue
        paused = [
            c for c in await store.list_calls(turn_id) if c.status is ToolCallStatus.INTERRUPTED
        ]
        defaults: list[Part] = []
        restarts: list[Part] = []
        for call in paused:
            kind, part = _answer_at_expiry(call, agent.tools.get(call.name))
            if part is not None:
                (restarts if kind == "restart" else defaults).append(part)
        if paused and len(defaults) + len(restarts) == len(paused):
            turn_input = TurnInput(kind="resume", respond=defaults, restart=restarts)
        else:
            names = ", ".join(f"{c.name}#{c.ref}" for c in overdue[turn_id])
            turn_input = TurnInput(
                kind="expire", reason=f"Approval expired before it was answered: {names}."
            )
        request = TurnRequest(input=turn_input, snapshot_id=turn_id, decided_by=TIMEOUT_DECIDER)
        try:
            response = await agent.submit(request)
        except TurnFailedError as failure:
            # An inline agent ran the expiry turn at once and it failed, as an expiry does.
            if failure.snapshot_id is not None:
                created.append(failure.snapshot_id)
                expired[turn.agent] += len(overdue[turn_id])
            continue
        except AgentError as error:
            # Decided meanwhile (a human answered, another worker expired it): nothing to do.
            logger.info("expiry of %s skipped: %s", turn_id, error)
            continue
        except Exception:
            logger.exception("expiry of %s failed", turn_id)
            continue
        if response.snapshot_id is not None:
            created.append(response.snapshot_id)
        expired[turn.agent] += len(overdue[turn_id])
        logger.info("approval deadline passed on %s: %s", turn_id, turn_input.kind)
    for name, count in expired.items():
        instruments.approvals_expired(name, count)
    return created


def _answer_at_expiry(call: ToolCallRecord, tool: object) -> tuple[str, Part | None]:
    """How an expiry answers paused ``call``: ``("respond", part)``, ``("restart", part)``,
    or ``("none", None)`` when nothing answers it (the turn then expires)."""
    decided = call.answer if call.decided_at is not None else None
    if isinstance(decided, dict) and "respond" in decided:
        # An approver decided this one in the inbox: their answer stands.
        return "respond", Part.of_response(call.name, call.ref, decided["respond"])
    if isinstance(decided, dict) and REJECT in decided:
        return "respond", rejection_part(call, decided[REJECT])
    if isinstance(decided, dict) and "restart" in decided:
        return "restart", Part.of_request(
            call.name, call.ref, call.input, {RESUMED: decided["restart"]}
        )
    if isinstance(tool, InterruptTool) and tool.on_timeout not in (None, FAIL):
        return "respond", Part.of_response(call.name, call.ref, tool.on_timeout)
    return "none", None
