"""The scripted model: an offline, deterministic stand-in for an LLM.

:class:`ScriptedModel` follows the rules of ``docs/scripted-model.md`` exactly (texts, refs,
chunking, error messages), so the demo and the tests run without a real provider and a
Turnstile server can be compared transcript by transcript with a Genkit server running the
same rules. The first rule that matches wins:

* last message ``tool``: (r) rejected (every response a refusal an approver's reject made:
  Turnstile's extension, never met against Genkit), (i) loop, (c) confirmation, (b) approval
  answers, else ``"Unhandled tool response."``;
* otherwise, on the last user text: (h) parallel, (d) two transfers, (a) one transfer,
  (i) loop, (e) fail, (e2) flaky, (g) slow echo, (f) echo.

The regular expressions mimic JavaScript's: ASCII-only case folding and digits, and ``.``
never matching a line terminator.
"""

from __future__ import annotations

import asyncio
import math
import re
from collections.abc import Sequence
from decimal import Decimal
from typing import Any, NamedTuple

from engine.conversation.parts import Message, Part, ToolResponse
from engine.model import ChunkSink, ModelRequest, ModelResponse, TransientModelError

__all__ = ["DEFAULT_SLOW_CHUNK_DELAY", "ScriptedModel", "slug", "transaction_id"]

#: Seconds rule (g) waits before each chunk (the spec's ``SLOW_CHUNK_DELAY_MS`` = 300).
DEFAULT_SLOW_CHUNK_DELAY = 0.3

_FLAGS = re.IGNORECASE | re.ASCII
_DOT = r"[^\n\r\u2028\u2029]"  # JavaScript's `.` without the `s` flag
_PARALLEL = re.compile(rf"parallel transfer \$?(\d+) to ({_DOT}+)", _FLAGS)
_DOUBLE = re.compile(rf"transfer \$?(\d+) to ({_DOT}+?) and \$?(\d+) to ({_DOT}+)", _FLAGS)
_SINGLE = re.compile(rf"transfer \$?(\d+) to ({_DOT}+)", _FLAGS)
_LOOP = re.compile("loop", _FLAGS)
_FAIL = re.compile("fail", _FLAGS)
_FLAKY = re.compile("flaky", _FLAGS)
_SLOW = re.compile("slow", _FLAGS)
_APPROVAL_REF = re.compile(r"approval-(\d+)", re.ASCII)
_SLUG_RUN = re.compile(r"[^a-z0-9]+")

_TRANSFER_MONEY = "transferMoney"
_USER_APPROVAL = "userApproval"
_UNHANDLED = "Unhandled tool response."


class _Undefined:
    """JavaScript's ``undefined``: a key that is absent (as opposed to ``null``)."""


_UNDEFINED = _Undefined()


class _Transfer(NamedTuple):
    amount: int
    to_account: str


def slug(account: str) -> str:
    """Lower-case ``account``, turn every run outside ``[a-z0-9]`` into ``-``, trim ``-``."""
    return _SLUG_RUN.sub("-", account.lower()).strip("-")


def transaction_id(amount: int | float, to_account: str) -> str:
    """The transferMoney tool's id: ``txn-<amount>-<slug>`` (``txn-500-my-savings-account``).

    ``amount`` is rendered as JavaScript's ``String(number)`` would (``2.0`` -> ``"2"``).
    """
    return f"txn-{_js_number(amount)}-{slug(to_account)}"


def _js_number(value: int | float) -> str:
    """``String(value)`` for a JavaScript number (ECMAScript ``Number::toString``)."""
    if isinstance(value, int) and abs(value) < 10**21:
        return str(value)
    number = float(value)
    if math.isnan(number):
        return "NaN"
    if math.isinf(number):
        return "Infinity" if number > 0 else "-Infinity"
    if number == 0:
        return "0"
    if number < 0:
        return "-" + _js_number(-number)
    # repr() gives the shortest round-tripping digits, as JavaScript does; only the layout differs.
    decimal = Decimal(repr(number)).normalize()
    _, digit_tuple, exponent = decimal.as_tuple()
    assert isinstance(exponent, int)
    digits = "".join(map(str, digit_tuple))
    k = len(digits)
    n = exponent + k  # value = 0.digits * 10**n
    if k <= n <= 21:
        return digits + "0" * (n - k)
    if 0 < n <= 21:
        return f"{digits[:n]}.{digits[n:]}"
    if -6 < n <= 0:
        return "0." + "0" * -n + digits
    e = n - 1
    mantissa = digits if k == 1 else f"{digits[0]}.{digits[1:]}"
    return f"{mantissa}e{'+' if e >= 0 else '-'}{abs(e)}"


def _js_str(value: object) -> str:
    """String concatenation of ``value`` as JavaScript would render it (for outputs in text)."""
    if isinstance(value, _Undefined):
        return "undefined"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return _js_number(value)
    if isinstance(value, list):
        return ",".join("" if item is None else _js_str(item) for item in value)
    if isinstance(value, dict):
        return "[object Object]"
    return str(value)


def _get(output: Any, key: str) -> object:
    """``output[key]`` for a JSON object output; :data:`_UNDEFINED` when absent."""
    if isinstance(output, dict):
        return output.get(key, _UNDEFINED)
    return _UNDEFINED


def _clean_account(name: str) -> str:
    """Trim, drop trailing ``.``, ``!`` and ``?`` characters, trim again."""
    return name.strip().rstrip(".!?").strip()


def _parse_transfers(text: str) -> tuple[bool, list[_Transfer]] | None:
    """``(parallel, transfers)`` requested by ``text`` under rule (h), (d) or (a), in order."""
    for pattern in (_PARALLEL, _DOUBLE, _SINGLE):
        if match := pattern.search(text):
            groups = match.groups()
            transfers = [
                _Transfer(int(groups[i]), _clean_account(groups[i + 1]))
                for i in range(0, len(groups), 2)
            ]
            return pattern is _PARALLEL, transfers
    return None


def _last_user_text(messages: Sequence[Message]) -> str:
    """The concatenated text parts of the most recent ``user`` message ('' when none)."""
    for message in reversed(messages):
        if message.role == "user":
            return message.text
    return ""


def _requested_transfers(messages: Sequence[Message]) -> list[_Transfer]:
    """The transfers of the most recent user message that requests any."""
    for message in reversed(messages):
        if message.role == "user" and (parsed := _parse_transfers(message.text)):
            return parsed[1]
    return []


def _transfer_request(transfer: _Transfer, k: int) -> Part:
    """``transferMoney {amount, toAccount}`` with ref ``transfer-k``."""
    return Part.of_request(
        _TRANSFER_MONEY,
        f"transfer-{k}",
        {"amount": transfer.amount, "toAccount": transfer.to_account},
    )


def _approval_request(transfer: _Transfer, k: int) -> Part:
    """``userApproval {action, details}`` with ref ``approval-k``."""
    details = f"Transfer ${transfer.amount} to {transfer.to_account}"
    return Part.of_request(
        _USER_APPROVAL, f"approval-{k}", {"action": _TRANSFER_MONEY, "details": details}
    )


def _loop_request() -> Part:
    """Rule (i): ``transferMoney {amount: 1, toAccount: "loop"}`` with ref ``transfer-1``."""
    return _transfer_request(_Transfer(1, "loop"), 1)


def _word_chunks(text: str) -> list[str]:
    """Split ``text`` after every space, as ``text.split(/(?<= )/)`` does in JavaScript."""
    return [chunk for chunk in re.split("(?<= )", text) if chunk] or [text]


class ScriptedModel:
    """The offline, deterministic model of ``docs/scripted-model.md``.

    ``slow_chunk_delay`` is the wait (seconds) before each chunk of rule (g); it is an
    ``asyncio.sleep``, so cancelling the task aborts the answer. Texts that already failed
    once under rule (e2) are remembered per instance.
    """

    def __init__(self, *, slow_chunk_delay: float = DEFAULT_SLOW_CHUNK_DELAY) -> None:
        self._slow_chunk_delay = slow_chunk_delay
        self._seen_flaky: set[str] = set()

    @property
    def name(self) -> str:
        """Always ``scripted``."""
        return "scripted"

    async def generate(
        self, request: ModelRequest, on_chunk: ChunkSink | None = None
    ) -> ModelResponse:
        """Answer ``request`` by the first matching rule, streaming chunks to ``on_chunk``.

        Raises ``RuntimeError("Scripted model failure")`` for rule (e) and
        :class:`TransientModelError` the first time a text hits rule (e2).
        """
        messages = request.messages
        user_text = _last_user_text(messages)
        if messages and messages[-1].role == "tool":
            return await self._answer_tool(messages, user_text, on_chunk)

        parsed = _parse_transfers(user_text)
        if parsed is not None:
            parallel, transfers = parsed
            parts = [_transfer_request(transfers[0], 1)] if parallel else []
            parts += [_approval_request(t, k) for k, t in enumerate(transfers, start=1)]
            return await _tool_answer(parts, on_chunk)
        if _LOOP.search(user_text):
            return await _tool_answer([_loop_request()], on_chunk)
        if _FAIL.search(user_text):
            raise RuntimeError("Scripted model failure")
        if _FLAKY.search(user_text) and user_text not in self._seen_flaky:
            self._seen_flaky.add(user_text)
            raise TransientModelError("Scripted transient model failure")
        delay = self._slow_chunk_delay if _SLOW.search(user_text) else 0.0
        return await _text_answer("Echo: " + user_text, on_chunk, delay)

    async def _answer_tool(
        self, messages: Sequence[Message], user_text: str, on_chunk: ChunkSink | None
    ) -> ModelResponse:
        """Rules (r), (i), (c) and (b) for a last message of role ``tool`` (refusals aside,
        the others see only the responses that are not refusals)."""
        answered = [p.tool_response for p in messages[-1].content if p.tool_response is not None]
        # Rule (r), Turnstile's own: a call an approver rejected answers with a refusal.
        refusals = [r for r in answered if _get(r.output, "rejected") is True]
        responses = [r for r in answered if r not in refusals]
        if refusals and not responses:
            reason = _get(refusals[0].output, "reason")
            text = _js_str(reason) if isinstance(reason, str) and reason else "no reason given"
            return await _text_answer(f"The transfer was rejected: {text}", on_chunk)
        done = [r for r in responses if r.name == _TRANSFER_MONEY]
        approvals = [r for r in responses if r.name == _USER_APPROVAL]
        if done and _LOOP.search(user_text):
            return await _tool_answer([_loop_request()], on_chunk)
        if done:
            texts = [f"Done. Transaction {_js_str(_get(r.output, 'transactionId'))}." for r in done]
            return await _text_answer(" ".join(texts), on_chunk)
        if approvals:
            return await _answer_approvals(messages, approvals, on_chunk)
        return await _text_answer(_UNHANDLED, on_chunk)


async def _answer_approvals(
    messages: Sequence[Message], approvals: list[ToolResponse], on_chunk: ChunkSink | None
) -> ModelResponse:
    """Rule (b): request the approved transfers, or report the cancellation."""
    transfers = _requested_transfers(messages)
    approved = [
        (position, r)
        for position, r in enumerate(approvals, start=1)
        if _get(r.output, "approved") is True
    ]
    if not approved:
        feedback = _get(approvals[0].output, "feedback")
        reason = "denied" if isinstance(feedback, _Undefined) or not feedback else feedback
        return await _text_answer("Transfer cancelled: " + _js_str(reason), on_chunk)
    parts: list[Part] = []
    for position, response in approved:
        match = _APPROVAL_REF.match(response.ref) if response.ref is not None else None
        k = int(match[1]) if match else position
        if 1 <= k <= len(transfers):
            parts.append(_transfer_request(transfers[k - 1], k))
    if not parts:  # approved, but nothing the user asked for matches: nothing to do
        return await _text_answer(_UNHANDLED, on_chunk)
    return await _tool_answer(parts, on_chunk)


async def _text_answer(text: str, on_chunk: ChunkSink | None, delay: float = 0.0) -> ModelResponse:
    """Stream ``text`` word by word (waiting ``delay`` before each chunk), then return it."""
    for chunk in _word_chunks(text):
        if delay > 0:
            await asyncio.sleep(delay)  # cancellation aborts the answer here
        if on_chunk is not None:
            await on_chunk([Part.of_text(chunk)])
    return ModelResponse(message=Message(role="model", content=[Part.of_text(text)]))


async def _tool_answer(parts: list[Part], on_chunk: ChunkSink | None) -> ModelResponse:
    """Stream all tool requests as one chunk, then return them as the message."""
    if on_chunk is not None:
        # Copies through the wire form, cheaper than a deep copy (see Message.copy_deep).
        await on_chunk([part.copy_deep() for part in parts])
    return ModelResponse(message=Message(role="model", content=parts))
