"""Client-managed state: an agent without a store keeps each session in a signed blob the
client holds and sends back.

A client-managed turn runs on a scratch in-memory store rebuilt from the verified blob, so
it shares the runner and every rule with a stored turn; what differs lives here: opening
the blob, signing the settled conversation, and turn ids that a replayed blob cannot renew.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from engine.memory_store import InMemorySessionStore
from engine.parts import Message
from engine.session_state import SessionData
from engine.signing import StateSigner, canonical_json
from engine.snapshots import SessionState, restore_client_state
from engine.store import TurnInput, TurnRecord

__all__ = ["ClientSession", "client_turn_id", "open_client_state", "sign_state"]


@dataclass(frozen=True)
class ClientSession:
    """A client-managed session opened for one turn: its scratch store, the settled turn
    the blob describes (``None`` for a new session), and the session id."""

    store: InMemorySessionStore
    base: TurnRecord | None
    session_id: str


async def open_client_state(
    state: Mapping[str, Any] | None,
    *,
    signer: StateSigner,
    agent: str,
    lease_owner: str,
    session_owner: str | None,
) -> ClientSession:
    """Verify ``state`` (``None``: a new session) and rebuild it in a scratch store."""
    scratch = InMemorySessionStore()
    if state is None:
        return ClientSession(scratch, None, str(uuid.uuid4()))
    verified = signer.verify(state, agent=agent)
    restored = await restore_client_state(
        scratch,
        verified,
        str(state.get("signature")),
        agent=agent,
        owner=lease_owner,
        session_owner=session_owner,
    )
    return ClientSession(scratch, restored, str(verified["sessionId"]))


def sign_state(
    signer: StateSigner,
    *,
    agent: str,
    session_id: str,
    messages: list[Message],
    data: SessionData | None = None,
) -> dict[str, Any]:
    """The signed blob a client keeps after a turn: the session's whole conversation."""
    return signer.sign(
        SessionState(
            session_id=session_id,
            messages=messages,
            custom=data.custom if data is not None else None,
            artifacts=data.artifacts_wire() if data is not None else [],
        ).to_wire(),
        agent=agent,
    )


def client_turn_id(base_id: str, turn_input: TurnInput) -> str:
    """The id of a client-managed turn continuing the verified snapshot ``base_id``.

    Without server state a signed blob can be replayed, so the id — and with it every
    idempotency key the turn hands out — is derived from what was continued: a replayed
    resume gets the same keys and cannot repeat an effect through a tool that honours its
    key. A resume counts by which calls it answers and how (respond or restart), not by
    what the answers say: free text such as ``feedback`` must not mint fresh keys for the
    same approval (see docs/decisions.md).
    """
    if turn_input.kind == "resume":
        answered = sorted(
            [("respond", str(p.tool_response.ref)) for p in turn_input.respond if p.tool_response]
            + [("restart", str(p.tool_request.ref)) for p in turn_input.restart if p.tool_request]
        )
        what: Any = {"kind": "resume", "answered": answered}
    else:
        what = turn_input.model_dump(mode="json", exclude={"relay"})
    replay = base_id.encode() + canonical_json(what)
    return "client-" + hashlib.sha256(replay).hexdigest()[:24]
