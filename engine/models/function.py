"""A model you program yourself: a plain function from request to response, no provider.

:class:`FunctionModel` is for developing and testing your own agent offline, the way
:class:`~engine.scripted.ScriptedModel` serves the banking example. The function reads the
conversation (``request.last_user_text``, ``request.tool_responses``, ...) and decides what
the model answers with ``ModelResponse.of_text``, ``of_call`` or ``of_parts``::

    def brain(request: ModelRequest) -> ModelResponse:
        if found := request.tool_response(lookup_order):
            return ModelResponse.of_text(f"Order {found.output['id']} is on its way.")
        return ModelResponse.of_call(lookup_order, {"orderId": "42"})

    ai = Engine(model=FunctionModel(brain))

The agent runs exactly as it would on a real model: tool requests are executed, interrupts
pause the turn, and the function is called again with each tool round's results.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable

from engine.model import ChunkSink, ModelRequest, ModelResponse
from engine.models.errors import ModelError

__all__ = ["FunctionModel", "ModelFunction", "ModelOutputError"]

#: What :class:`FunctionModel` calls: a plain or an ``async`` function of the request.
ModelFunction = Callable[[ModelRequest], ModelResponse | Awaitable[ModelResponse]]


class ModelOutputError(ModelError):
    """A model's code returned something other than a :class:`ModelResponse`.

    A bug in the model, not in the conversation: retrying cannot help, so the turn fails
    (``INTERNAL``) with this message. ``details`` are ``{"model", "returned"}``, the model's
    name and the type it returned.
    """


class FunctionModel:
    """A :class:`~engine.model.Model` whose every answer is ``fn(request)``.

    ``fn`` may be a plain or an ``async`` function. A plain one runs on the event loop, so it
    should only decide (an ``async`` one may await whatever it needs). It gets a copy of the
    conversation, free to change. What it raises propagates as a provider's error would:
    :class:`~engine.model.TransientModelError` is retried with backoff, anything else fails
    the turn — handy for testing an agent's failure paths.

    ``name`` is recorded on the turn as ``function:<name>``; it defaults to ``fn``'s own name.
    The answer is streamed as one chunk holding all of its parts.
    """

    def __init__(self, fn: ModelFunction, *, name: str | None = None) -> None:
        self._fn = fn
        self._label = name or getattr(fn, "__name__", None) or type(fn).__name__

    @property
    def name(self) -> str:
        """``function:<name>`` (e.g. ``function:brain``)."""
        return f"function:{self._label}"

    async def generate(
        self, request: ModelRequest, on_chunk: ChunkSink | None = None
    ) -> ModelResponse:
        """Answer with what the function returns (awaited when it is awaitable).

        Raises :class:`ModelOutputError` when that is not a :class:`ModelResponse`.
        """
        # The runner hands over its own history and cached tool specs: a function that edits
        # the request (say, pops a message to look at the one before) must not change them.
        private = request.model_copy(deep=True)
        answer: object = self._fn(private)
        if inspect.isawaitable(answer):
            answer = await answer
        if not isinstance(answer, ModelResponse):
            raise self._bad_answer(answer)
        if on_chunk is not None and answer.message.content:
            await on_chunk([part.copy_deep() for part in answer.message.content])
        return answer

    def _bad_answer(self, answer: object) -> ModelOutputError:
        """The error for ``answer``, saying what to return instead."""
        returned = type(answer).__name__
        hint = " (a missing return?)" if answer is None else ""
        return ModelOutputError(
            f"The model function of {self.name} returned {returned}{hint}, not a "
            "ModelResponse: build one with ModelResponse.of_text(...), .of_call(...) or "
            ".of_parts(...).",
            details={"model": self.name, "returned": returned},
        )
