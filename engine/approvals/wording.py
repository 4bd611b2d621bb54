"""What an approval asks, in the approver's words: a title and a one-line summary.

An application declares them on the interrupt or tool (``define_interrupt(...,
title="Transfer approval", summary="Transfer ${amount} to {toAccount}")``): ``summary`` is a
template over the call's input, filled with :meth:`str.format_map`, or a function of the
validated input returning text. Every place that lists approvals — the inbox page, the
approval page, the JSON inbox, ``turnstile approvals`` and the history export — words them
through :func:`wording_of`, so they all say the same thing.

The wording is plain text, whitespace-flattened and cut to a bounded length; whoever shows it
escapes it (the pages' templates do). It never raises: a template naming a key the input lacks
keeps ``{key}`` in the text, and a template that cannot be filled or a function that raises
falls back to the rendering of an undeclared approval (the code name and the input's values),
logging the problem once per tool.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engine.agent import Agent

__all__ = [
    "MAX_SUMMARY_CHARS",
    "MAX_TITLE_CHARS",
    "Wording",
    "input_summary",
    "one_line",
    "plain_value",
    "word_approval",
    "wording_of",
]

#: Longest title shown before it is cut short.
MAX_TITLE_CHARS = 80
#: Longest summary shown before it is cut short.
MAX_SUMMARY_CHARS = 200

_log = logging.getLogger(__name__)
_warned: set[str] = set()
_warned_lock = threading.Lock()


@dataclass(frozen=True)
class Wording:
    """An approval in words: what a list or a page leads with."""

    #: The declared title, else the interrupt's or tool's code name.
    title: str
    #: The declared summary filled from the input, else the input's values in one line.
    summary: str
    #: Whether the application declared the summary (and it rendered): pages then keep the
    #: code name for the details.
    declared: bool
    #: Whether the application declared the title (else it is the code name).
    titled: bool = False

    @property
    def headline(self) -> str:
        """What a row or a page leads with: the declared summary, else the title."""
        return self.summary if self.declared else self.title

    @property
    def subline(self) -> str:
        """What follows the headline: the declared title (never the code name) under a
        declared summary, else the input's values."""
        if self.declared:
            return self.title if self.titled else ""
        return self.summary


def one_line(text: str, limit: int) -> str:
    """``text`` on one line, without control characters, at most ``limit`` characters."""
    # Only a bounded head is read, so a huge value costs no more than a short one.
    head = text[: limit * 8]
    flat = " ".join("".join(c if c.isprintable() else " " for c in head).split())
    if len(flat) > limit:
        return flat[: limit - 1] + "…"
    return flat + "…" if len(head) < len(text) else flat


def plain_value(value: Any) -> str:
    """A JSON value as a person reads it: Yes/No, an em dash for null, JSON for structures."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "Yes" if value else "No"
    if isinstance(value, int | float | str):
        return str(value)
    return json.dumps(value, indent=2, ensure_ascii=False)


def input_summary(value: Any, limit: int = MAX_SUMMARY_CHARS) -> str:
    """An undeclared approval's input in one line: its plain values, joined by dashes."""
    if isinstance(value, dict):
        texts = [str(v) for v in value.values() if isinstance(v, str | int | float) and v != ""]
        if texts:
            return one_line(" — ".join(texts), limit)
    if value is None or value is True:
        return ""
    return one_line(plain_value(value), limit)


class _Kept:
    """A template field the input lacks: printed as the template wrote it, whatever its
    format spec, so the approver sees which value is missing."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __format__(self, spec: str) -> str:
        return "{" + self.name + (":" + spec if spec else "") + "}"

    def __getitem__(self, key: Any) -> _Kept:
        return _Kept(f"{self.name}[{key}]")

    def __getattr__(self, name: str) -> _Kept:
        return _Kept(f"{self.name}.{name}")


class _Fields(dict[str, Any]):
    """The input's keys for :meth:`str.format_map`; a missing one is kept readable."""

    def __missing__(self, key: str) -> _Kept:
        return _Kept(key)


def _fill(template: str, value: Any) -> str:
    fields = _Fields(value) if isinstance(value, Mapping) else _Fields()
    fields.setdefault("input", value)
    # Values print as a person reads them (None as a dash); format specs still apply to numbers.
    for key, item in list(fields.items()):
        if item is None or isinstance(item, bool):
            fields[key] = plain_value(item)
    return template.format_map(fields)


def _warn_once(tool_name: str, problem: BaseException) -> None:
    with _warned_lock:
        if tool_name in _warned:
            return
        _warned.add(tool_name)
    _log.warning(
        "The summary declared on '%s' could not be rendered (%s: %s); showing the default wording.",
        tool_name,
        type(problem).__name__,
        problem,
    )


def _declared_summary(tool: Any, value: Any) -> str | None:
    """The tool's declared summary of ``value`` (``None``: none declared, or it failed)."""
    spec = getattr(tool, "summary", None)
    if spec is None:
        return None
    try:
        if isinstance(spec, str):
            text = _fill(spec, value)
        else:
            text = spec(tool.input.parse(value))
            if not isinstance(text, str):
                raise TypeError(f"the summary function returned {type(text).__name__}, not str")
    except Exception as problem:  # any failure of app code shows the default wording
        _warn_once(str(getattr(tool, "name", "?")), problem)
        return None
    text = one_line(text, MAX_SUMMARY_CHARS)
    return text or None


def wording_of(tool: Any, name: str, value: Any) -> Wording:
    """How an approval of ``tool`` (the app's interrupt or tool; ``None`` when the app no
    longer defines ``name``) asking ``value`` is worded. Never raises."""
    declared_title = getattr(tool, "title", None)
    titled = isinstance(declared_title, str)
    title = one_line(declared_title if isinstance(declared_title, str) else name, MAX_TITLE_CHARS)
    summary = _declared_summary(tool, value) if tool is not None else None
    if summary is not None:
        return Wording(title=title, summary=summary, declared=True, titled=titled)
    return Wording(title=title, summary=input_summary(value), declared=False, titled=titled)


def word_approval(agents: Mapping[str, Agent], agent: str, name: str, value: Any) -> Wording:
    """An approval of ``agent``'s interrupt or tool ``name`` asking ``value``, worded by the
    app's definition of it (the code name and the input when the app no longer has it)."""
    served = agents.get(agent)
    return wording_of(served.tools.get(name) if served is not None else None, name, value)
