"""The turn inspector: one turn's status, timeline, rounds, journal and usage; abort, retry.

Abort is :meth:`engine.agent.Agent.abort` and retry is a turn with no message (``send()``),
both with the viewer as the session's owner: the engine refuses either for anyone else, so the
buttons are shown only to the owner (or to everyone on an open server).
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from engine.errors import NotFoundError, TurnFailedError
from engine.remote.ui import present
from engine.remote.ui.kit import PageKit, Viewer, query_of, segment
from engine.remote.ui.queries import TurnFound, next_turn, timeline
from engine.remote.wire import check_id
from engine.status import TurnStatus
from engine.store import TurnInput
from engine.turns.request import TurnRequest

__all__ = ["TurnPages"]

#: Statuses a retry continues from (``send()`` with no message).
RETRYABLE = (TurnStatus.FAILED, TurnStatus.ABORTED)
_NOTICES = {
    "abort": "Abort requested: the worker stops the turn at its next step.",
    "aborted": "The turn was aborted.",
    "retry": "Retry queued: this is the new turn.",
}


class TurnPages:
    """``GET /ui/turns/{id}``, its state for the script, and the abort and retry forms."""

    def __init__(self, kit: PageKit) -> None:
        self.kit = kit

    async def _find(self, request: Request, viewer: Viewer) -> TurnFound:
        turn_id = check_id(request.path_params["turn_id"], "The turn id")
        found = await self.kit.catalog.turn(viewer.principal, turn_id)
        if found is None:
            raise NotFoundError(f"Turn '{turn_id}' not found.")
        return found

    def _may_act(self, viewer: Viewer, found: TurnFound) -> bool:
        return viewer.principal is None or found.owner == viewer.principal.id

    async def show(self, request: Request, viewer: Viewer) -> Response:
        """Everything the store knows about the turn."""
        found = await self._find(request, viewer)
        turn, store = found.turn, found.store
        latest = await store.latest_turn(turn.session_id)
        following = await next_turn(store, turn)
        calls = await store.list_calls(turn.id)
        may_act = self._may_act(viewer, found)
        open_approvals = [
            c
            for c in calls
            if c.status.value == "interrupted" and c.decided_at is None and c.interrupt
        ]
        context: dict[str, Any] = {
            "nav": "",
            "turn": turn,
            "owner": found.owner,
            "status_text": present.turn_state(
                turn.status.value,
                turn.finish_reason.value if turn.finish_reason else None,
                continued=following is not None,
            ),
            "latest": latest,
            "following": following,
            "rounds": [
                {
                    "round": r.round,
                    "committed": r.committed,
                    "messages": present.message_views(r.messages),
                }
                for r in await store.load_rounds(turn.id)
            ],
            "calls": calls,
            "open_approvals": open_approvals,
            "timeline": await timeline(store, turn.id),
            "can_abort": may_act and turn.status is TurnStatus.PENDING,
            "can_retry": may_act
            and turn.status in RETRYABLE
            and latest is not None
            and latest.id == turn.id,
            "notice": _NOTICES.get(query_of(request).get("done", "")),
            "active": turn.status in (TurnStatus.PENDING, TurnStatus.ABORTING),
            "state": _fingerprint(found),
        }
        return self.kit.page(request, viewer, "turn.html", context)

    async def state(self, request: Request, viewer: Viewer) -> Response:
        """A fingerprint of the turn (the page's script reloads when it changes)."""
        found = await self._find(request, viewer)
        return self.kit.json(request, viewer, {"state": _fingerprint(found)})

    async def abort(self, request: Request, viewer: Viewer) -> Response:
        """Ask the turn to stop (the engine checks that the viewer owns its session)."""
        form = await self.kit.form(request)
        self.kit.check_csrf(request, viewer, form)
        found = await self._find(request, viewer)
        outcome = await found.agent.request_abort(found.turn.id, owner=viewer.id)
        done = "aborted" if outcome.status is TurnStatus.ABORTED else "abort"
        return self.kit.redirect(request, viewer, f"/ui/turns/{segment(found.turn.id)}", done=done)

    async def retry(self, request: Request, viewer: Viewer) -> Response:
        """Continue a failed or aborted turn from its journal: a turn with no message."""
        form = await self.kit.form(request)
        self.kit.check_csrf(request, viewer, form)
        found = await self._find(request, viewer)
        retry = TurnRequest(
            input=TurnInput(kind="retry"),
            snapshot_id=found.turn.id,
            owner=viewer.id,
            decided_by=viewer.id,
        )
        try:
            response = await found.agent.submit(retry)
            new_id = response.snapshot_id
        except TurnFailedError as failure:  # an inline agent ran the retry, and it failed
            new_id = failure.snapshot_id
        target = f"/ui/turns/{segment(new_id or found.turn.id)}"
        return self.kit.redirect(request, viewer, target, done="retry")


def _fingerprint(found: TurnFound) -> str:
    turn = found.turn
    return "|".join(
        [
            turn.status.value,
            turn.finish_reason.value if turn.finish_reason else "",
            str(turn.attempts),
            turn.updated_at.isoformat(),
        ]
    )
