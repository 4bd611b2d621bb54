"""Admission of turn requests: at most N turns in flight per principal.

One principal flooding the server must not queue so many turns that everybody else waits
behind them. With ``create_app(..., max_turns_per_principal=N)``, a turn request is admitted
only while its principal has fewer than ``N`` turns in flight; otherwise it gets 429
``RESOURCE_EXHAUSTED`` with ``Retry-After`` and nothing is written.

What counts as in flight, for a principal (its id; every unauthenticated caller together
counts as one principal, the sessions without an owner):

* every ``pending`` or ``aborting`` turn of its sessions in the stores of the served agents,
  whichever process created it and whoever runs it — read from the store
  (``active_turn_ids``, a read on the partial index of active turns);
* every turn request of it this server has admitted and not yet answered — the turns not in
  the store yet, and the client-managed turns, which are never stored.

Both are sets of turn ids: a store-backed request's turn id is fixed at admission, so a turn
already stored and still being answered is counted once. The check and the reservation of
one principal run one at a time, so requests arriving together in one process cannot pass
the limit between them; see ``docs/decisions.md`` ("Turns in flight per principal").
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from typing import Protocol, runtime_checkable

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from engine.agent import Agent
from engine.engine import Engine
from engine.errors import TooManyTurnsError
from engine.ids import new_id
from engine.turns.idempotency import keyed_turn_id
from engine.turns.request import TurnRequest

__all__ = ["RETRY_AFTER_SECONDS", "ActiveTurnReader", "Reservation", "TurnAdmission"]

#: The ``Retry-After`` of a refused turn request: turns usually settle within seconds.
RETRY_AFTER_SECONDS = 1


@runtime_checkable
class ActiveTurnReader(Protocol):
    """A store that can list a principal's in-flight turns (both shipped stores can)."""

    async def active_turn_ids(self, owner: str | None, *, limit: int) -> list[str]:
        """Ids of at most ``limit`` pending or aborting turns of ``owner``'s sessions
        (``None``: sessions without an owner)."""
        ...


class Reservation:
    """What one admitted request holds until its response has been sent."""

    def __init__(self) -> None:
        self._release: Callable[[], None] | None = None

    def hold(self, release: Callable[[], None]) -> None:
        """Keep ``release`` to run once, when the request is over."""
        self._release = release

    def release(self) -> None:
        """Give the reservation back (again: nothing happens)."""
        release, self._release = self._release, None
        if release is not None:
            release()

    def released_after(self, response: Response) -> Response:
        """``response``, giving the reservation back once it is sent or abandoned."""
        if self._release is None:
            return response
        return _ReleasedAfter(response, self)


class _ReleasedAfter(Response):
    """Sends ``inner`` unchanged, then releases the reservation, however the sending ends
    (a stream whose client went away is never iterated, yet must give its place back)."""

    def __init__(self, inner: Response, reservation: Reservation) -> None:
        # Not Response.__init__: this response has no body of its own, only inner's.
        self.inner = inner
        self.reservation = reservation
        self.status_code = inner.status_code
        self.raw_headers = inner.raw_headers
        self.background = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self.inner(scope, receive, send)
        finally:
            self.reservation.release()


@dataclass
class _Gate:
    """One principal's lock, and how many requests use it (dropped when none does)."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    users: int = 0


class TurnAdmission:
    """Admits turn requests while their principal has fewer than ``limit`` in flight."""

    def __init__(self, engine: Engine, limit: int) -> None:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValueError(
                f"max_turns_per_principal must be a whole number >= 1 (None: no limit), "
                f"not {limit!r}."
            )
        self.engine = engine
        self.limit = limit
        self._gates: dict[str | None, _Gate] = {}
        # Per principal: the turn ids (or, client-managed, request ids) of admitted requests
        # not yet answered, with how many requests hold each (a retry may hold one twice).
        self._reserved: dict[str | None, Counter[str]] = {}
        self._readers()  # refuse at once a store that cannot be counted

    def _readers(self) -> list[ActiveTurnReader]:
        """The distinct stores of the served agents."""
        readers: dict[int, ActiveTurnReader] = {}
        for agent in self.engine.agents.values():
            store = agent.store
            if store is None or id(store) in readers:
                continue
            if not isinstance(store, ActiveTurnReader):
                raise ValueError(
                    f"max_turns_per_principal needs stores that list in-flight turns "
                    f"(active_turn_ids); agent '{agent.name}' uses a {type(store).__name__}."
                )
            readers[id(store)] = store
        return list(readers.values())

    async def admit(
        self, agent: Agent, request: TurnRequest, reservation: Reservation
    ) -> TurnRequest:
        """Admit ``request`` (returned with its turn id fixed when ``agent`` has a store) and
        hold its place in ``reservation``; raise :class:`TooManyTurnsError` to refuse."""
        owner = request.owner
        if agent.store is not None:
            turn_id = request.turn_id or (
                keyed_turn_id(agent.name, request)
                if request.idempotency_key is not None
                else new_id()
            )
            request = replace(request, turn_id=turn_id)
            place = turn_id
        else:
            place = f"client-managed:{uuid.uuid4()}"
        async with self._gate(owner):
            # Taken before the store is read: a request answered meanwhile is then counted
            # twice at worst (a refusal too early), never not at all.
            in_flight = set(self._reserved.get(owner, ()))
            if len(in_flight - {place}) < self.limit:
                enough = self.limit + len(in_flight) + 1
                for reader in self._readers():
                    in_flight.update(await reader.active_turn_ids(owner, limit=enough))
            in_flight.add(place)
            if len(in_flight) > self.limit:
                raise TooManyTurnsError(
                    _refusal(owner, self.limit), retry_after=RETRY_AFTER_SECONDS
                )
            # Looked up again: a request answered during the read may have dropped the entry.
            self._reserved.setdefault(owner, Counter())[place] += 1
        reservation.hold(lambda: self._give_back(owner, place))
        return request

    def _give_back(self, owner: str | None, place: str) -> None:
        reserved = self._reserved.get(owner)
        if reserved is None:
            return
        reserved[place] -= 1
        if reserved[place] <= 0:
            del reserved[place]
        if not reserved:
            del self._reserved[owner]

    @contextlib.asynccontextmanager
    async def _gate(self, owner: str | None) -> AsyncIterator[None]:
        """One principal's admissions one at a time (others are not held up)."""
        gate = self._gates.setdefault(owner, _Gate())
        gate.users += 1
        try:
            async with gate.lock:
                yield
        finally:
            gate.users -= 1
            if gate.users == 0:
                del self._gates[owner]


def _refusal(owner: str | None, limit: int) -> str:
    who = f"Principal '{owner}'" if owner is not None else "Unauthenticated callers (together)"
    return (
        f"{who} already has {limit} turn(s) in flight, the most this server admits per "
        f"principal; retry once one has settled (Retry-After: {RETRY_AFTER_SECONDS} s)."
    )
