"""A process that continues one snapshot once, as another process does the same.

``python -m tests.acceptance.intent_sender URL INTENT SESSION SNAPSHOT TEXT`` builds the
banking example on ``URL`` (turns run inline, in this process), prints ``ready``, waits for a
line on stdin (so both processes start at once), then sends ``TEXT`` once, naming the session
alone (``session``), the snapshot and the session (``chat``) or the snapshot alone
(``snapshot``). It prints one JSON object: the session and snapshot the turn got, or the
error class and status of the refusal.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from engine import AgentError
from examples.banking import build
from stores import SqlSessionStore


async def send_once(url: str, intent: str, session_id: str, snapshot_id: str, text: str) -> Any:
    store = SqlSessionStore(url)
    agent = build(store=store, execution="inline").banking_agent
    chat = agent.chat(
        session_id=session_id if intent in ("session", "chat") else None,
        snapshot_id=snapshot_id if intent in ("chat", "snapshot") else None,
    )
    print("ready", flush=True)
    await asyncio.to_thread(sys.stdin.readline)
    try:
        response = await chat.send(text)
    except AgentError as refused:
        return {"refused": type(refused).__name__, "status": refused.status}
    finally:
        await store.close()
    return {"session_id": response.session_id, "snapshot_id": response.snapshot_id}


if __name__ == "__main__":
    url, intent, session, snapshot, words = sys.argv[1:6]
    print(json.dumps(asyncio.run(send_once(url, intent, session, snapshot, words))), flush=True)
