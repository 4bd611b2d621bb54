"""Client-managed state: an agent without a store keeps each session in a signed blob the
client holds and sends back.

A client-managed turn runs on a scratch in-memory store rebuilt from the verified blob, so
it shares the runner and every rule with a stored turn; what differs lives here: opening
the blob, signing the settled conversation, and turn ids that a replayed blob cannot renew.

Like a stored turn, a blob is pinned to the definition it was made under: beside Genkit's
fields and the signature it carries ``pin`` (:data:`PIN_FIELD`), covered by the signature,
which the rebuilt turn records so that a resume across a definition change is refused or
migrated exactly as a stored one is (:mod:`engine.state.pinning`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from engine.conversation.parts import Message
from engine.conversation.session_state import SessionData
from engine.errors import InvalidStateError
from engine.ids import new_id
from engine.state.signing import StateSigner, canonical_json
from engine.state.snapshots import SessionState, restore_client_state
from engine.state.versioning import outline_definition
from engine.store import TurnInput, TurnRecord
from engine.store.memory import InMemorySessionStore

__all__ = [
    "PIN_FIELD",
    "BlobPin",
    "ClientSession",
    "client_turn_id",
    "open_client_state",
    "sign_state",
]

#: The blob's field naming what it is pinned to: ``{appVersion, fingerprint, definition}``,
#: the definition as an outline (:func:`~engine.state.versioning.outline_definition`).
PIN_FIELD = "pin"


@dataclass(frozen=True)
class BlobPin:
    """The definition a client-managed blob was made under: the application version, the
    fingerprint and the outline of the definition."""

    app_version: str
    fingerprint: str
    definition: dict[str, Any] | None

    @classmethod
    def of(cls, turn: TurnRecord, definition: dict[str, Any] | None) -> BlobPin | None:
        """What ``turn`` is pinned to, given the definition its fingerprint names (``None``
        for a turn recorded without a pin)."""
        if turn.app_version is None or turn.definition_fingerprint is None:
            return None
        definition = None if definition is None else outline_definition(definition)
        return cls(turn.app_version, turn.definition_fingerprint, definition)

    def to_wire(self) -> dict[str, Any]:
        """The ``pin`` field's JSON."""
        return {
            "appVersion": self.app_version,
            "fingerprint": self.fingerprint,
            "definition": self.definition,
        }

    @classmethod
    def from_blob(cls, verified: Mapping[str, Any]) -> BlobPin | None:
        """The pin of a verified blob; ``None`` for a blob signed before blobs were pinned."""
        raw = verified.get(PIN_FIELD)
        if raw is None:
            return None
        version = raw.get("appVersion") if isinstance(raw, Mapping) else None
        fingerprint = raw.get("fingerprint") if isinstance(raw, Mapping) else None
        definition = raw.get("definition") if isinstance(raw, Mapping) else None
        if (
            not isinstance(version, str)
            or not isinstance(fingerprint, str)
            or not isinstance(definition, Mapping | None)
        ):
            raise InvalidStateError(
                f"Client state has a malformed '{PIN_FIELD}' field: expected "
                "{appVersion, fingerprint, definition}."
            )
        return cls(version, fingerprint, None if definition is None else dict(definition))


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
        return ClientSession(scratch, None, new_id())
    verified = signer.verify(state, agent=agent)
    restored = await restore_client_state(
        scratch,
        verified,
        str(state.get("signature")),
        agent=agent,
        owner=lease_owner,
        session_owner=session_owner,
        pin=BlobPin.from_blob(verified),
    )
    return ClientSession(scratch, restored, str(verified["sessionId"]))


def sign_state(
    signer: StateSigner,
    *,
    agent: str,
    session_id: str,
    messages: list[Message],
    data: SessionData | None = None,
    pin: BlobPin | None = None,
) -> dict[str, Any]:
    """The signed blob a client keeps after a turn: the session's whole conversation and,
    given ``pin``, the definition it is pinned to."""
    state = SessionState(
        session_id=session_id,
        messages=messages,
        custom=data.custom if data is not None else None,
        artifacts=data.artifacts_wire() if data is not None else [],
    ).to_wire()
    if pin is not None:
        state[PIN_FIELD] = pin.to_wire()
    return signer.sign(state, agent=agent)


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
