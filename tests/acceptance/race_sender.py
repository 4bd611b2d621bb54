"""A process that sends messages to one session while other processes do the same.

``python -m tests.acceptance.race_sender URL SESSION NAME COUNT INTENT`` builds the banking
example on ``URL`` (turns run inline, in this process), prints ``ready``, waits for a line on
stdin (so every sender starts at once), then sends ``NAME-0`` … ``NAME-<COUNT-1>`` to
``SESSION`` in order, continuing as ``INTENT`` says (docs/decisions.md, "What a send
continues"):

- ``session``: each send names the session alone (its latest turn);
- ``chat``: one chat, opened where the session is and following its own turns, so each send
  names the snapshot it is at and the session (a compare-and-set).

A send refused because another sender got there first is sent again: by session as it was,
from a chat reopened at the session's latest snapshot for ``chat``. It prints one JSON
object: the messages it got accepted, in order, and the error classes of the refusals.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
from collections import Counter
from typing import Any

from engine import AgentError
from engine.agent import Agent
from engine.chat import Chat
from examples.banking import build
from stores import SqlSessionStore

#: What a sender may be told when another got there first; anything else fails the race.
RETRYABLE = ("StaleSnapshotError", "SessionBusyError")


async def reopened(agent: Agent, session_id: str) -> Chat:
    """A chat at the session's latest snapshot, once that snapshot has settled."""
    while True:
        latest = await agent.get_snapshot(session_id=session_id)
        assert latest is not None
        if latest.status.value not in ("pending", "aborting"):
            return agent.chat(session_id=session_id, snapshot_id=latest.snapshot_id)
        await asyncio.sleep(random.uniform(0, 0.01))


async def send_all(url: str, session_id: str, name: str, count: int, intent: str) -> Any:
    """Send ``count`` messages to the session; the ones accepted, and the refusals met."""
    store = SqlSessionStore(url)
    agent = build(store=store, execution="inline").banking_agent
    print("ready", flush=True)
    await asyncio.to_thread(sys.stdin.readline)
    accepted: list[str] = []
    refusals: Counter[str] = Counter()
    chat = await reopened(agent, session_id) if intent == "chat" else None
    try:
        for number in range(count):
            text = f"{name}-{number}"
            while True:
                try:
                    await (chat or agent.chat(session_id=session_id)).send(text)
                except AgentError as refused:
                    refusals[type(refused).__name__] += 1
                    if type(refused).__name__ not in RETRYABLE:
                        raise
                    await asyncio.sleep(random.uniform(0, 0.01))
                    if chat is not None:
                        chat = await reopened(agent, session_id)
                    continue
                accepted.append(text)
                break
    finally:
        await store.close()
    return {"accepted": accepted, "refusals": dict(refusals)}


if __name__ == "__main__":
    url, session, sender, how_many, intent = sys.argv[1:6]
    result = asyncio.run(send_all(url, session, sender, int(how_many), intent))
    print(json.dumps(result), flush=True)
