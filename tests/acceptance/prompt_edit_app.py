"""A payments app before and after a prompt edit, for the dev-loop acceptance tests.

``tests.acceptance.prompt_edit_app:ai`` is the app as the environment says: ``PROMPT_EDIT``
(``before`` or ``after``) picks the system prompt, and ``TURNSTILE_APP_VERSION``, when set, is
its declared version. Only the prompt differs between the two, so a turn paused under one is
resumable under the other wherever pinning is lenient. The ``approveTransfer`` interrupt
expires after ``PROMPT_EDIT_TIMEOUT`` seconds (none when unset) with an approval, so a worker's
expiry job resumes it. The model signs its last answer with the edit it ran under.
"""

from __future__ import annotations

import os

from pydantic import BaseModel

from engine import Engine, Part
from engine.conversation.parts import Message
from engine.model import ChunkSink, ModelRequest, ModelResponse
from stores import SqlSessionStore

__all__ = ["AGENT", "INTERRUPT", "PROMPTS", "build"]

AGENT = "payments"
INTERRUPT = "approveTransfer"
PROMPTS = {"before": "Move money when asked.", "after": "Move money when asked, politely."}


class Decision(BaseModel):
    approved: bool


class EditSignedModel:
    """Asks for approval on a user message; once answered, says which edit ran it."""

    name = "scripted"

    def __init__(self, edit: str) -> None:
        self.edit = edit

    async def generate(
        self, request: ModelRequest, on_chunk: ChunkSink | None = None
    ) -> ModelResponse:
        """The next message of the two-step script."""
        if request.messages[-1].role == "user":
            content = [Part.of_request(INTERRUPT, None, {"amount": 5})]
        else:
            content = [Part.of_text(f"done {self.edit} the edit")]
        return ModelResponse(message=Message(role="model", content=content))


def build(
    edit: str,
    *,
    version: str | None = None,
    url: str | None = None,
    timeout: float | None = None,
    execution: str = "auto",
) -> Engine:
    """The app at ``edit`` (``before`` or ``after``) on ``url`` (default: the CLI's
    database); ``timeout`` is the approval's, which the definition does not include."""
    store = SqlSessionStore(url or os.environ["TURNSTILE_DATABASE_URL"])
    ai = Engine(model=EditSignedModel(edit), version=version)
    approval = ai.define_interrupt(
        name=INTERRUPT,
        output_schema=Decision,
        timeout=timeout,
        on_timeout={"approved": True} if timeout is not None else None,
    )
    ai.define_agent(
        name=AGENT,
        system=PROMPTS[edit],
        tools=[approval],
        store=store,
        execution=execution,
        max_turns=3,
    )
    return ai


def _timeout() -> float | None:
    given = os.environ.get("PROMPT_EDIT_TIMEOUT")
    return float(given) if given else None


ai = (
    build(
        os.environ["PROMPT_EDIT"],
        version=os.environ.get("TURNSTILE_APP_VERSION"),
        timeout=_timeout(),
    )
    if "PROMPT_EDIT" in os.environ
    else None
)
