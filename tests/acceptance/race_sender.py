"""A process that sends messages to one session while other processes do the same.

``python -m tests.acceptance.race_sender URL SESSION NAME COUNT`` builds the banking example
on ``URL`` (turns run inline, in this process), prints ``ready``, waits for a line on stdin
(so every sender starts at once), then sends ``NAME-0`` … ``NAME-<COUNT-1>`` to ``SESSION``
in order. A send refused with a retryable conflict (status ``ABORTED``: the session is busy,
or another send continued it first) is sent again from the session's latest snapshot. It
prints the messages it got accepted as one JSON list.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys

from engine import AgentError
from examples.banking import build
from stores import SqlSessionStore


async def send_all(url: str, session_id: str, name: str, count: int) -> list[str]:
    """Send ``count`` messages to the session; the ones accepted, in order."""
    store = SqlSessionStore(url)
    agent = build(store=store, execution="inline").banking_agent
    print("ready", flush=True)
    await asyncio.to_thread(sys.stdin.readline)
    accepted: list[str] = []
    try:
        for number in range(count):
            text = f"{name}-{number}"
            while True:
                try:
                    await agent.chat(session_id=session_id).send(text)
                except AgentError as refused:
                    if refused.status != "ABORTED":
                        raise
                    await asyncio.sleep(random.uniform(0, 0.01))
                    continue
                accepted.append(text)
                break
    finally:
        await store.close()
    return accepted


if __name__ == "__main__":
    url, session, sender, how_many = sys.argv[1:5]
    print(json.dumps(asyncio.run(send_all(url, session, sender, int(how_many)))), flush=True)
