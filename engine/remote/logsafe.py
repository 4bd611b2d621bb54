"""Client text in log lines, escaped: a request must not be able to write lines of its own.

Anything a client sends (ids, paths, query values, bodies) can reach a log line, directly or
inside an exception's message (a database error quoting a key, a plugin echoing a header). A
newline in it would forge a log line, an escape sequence would drive the operator's terminal.
These helpers render such text as one inert ``repr`` token, cut to a bounded length.
"""

from __future__ import annotations

import traceback

__all__ = ["MAX_LOGGED", "escaped", "escaped_traceback"]

#: Longer client text is cut in logs (a request body can be a megabyte).
MAX_LOGGED = 500

_CAUSE = "\nThe above exception was the direct cause of the following exception:\n\n"
_CONTEXT = "\nDuring handling of the above exception, another exception occurred:\n\n"


def escaped(value: object) -> str:
    """``repr(str(value))``, cut to :data:`MAX_LOGGED` characters: one line, no control
    characters, quoted so where it starts and ends is plain."""
    try:
        text = repr(str(value))
    except Exception:  # a broken __str__ must not turn logging into a second failure
        text = f"<unprintable {type(value).__name__}>"
    if len(text) > MAX_LOGGED:
        return text[:MAX_LOGGED] + f"... ({len(text)} characters)"
    return text


def _chain(error: BaseException) -> list[tuple[BaseException, str]]:
    """``error`` and the exceptions it came from, outermost last, each with the line that
    links it to the next (as Python prints a chained traceback)."""
    chain: list[tuple[BaseException, str]] = []
    seen: set[int] = set()
    current: BaseException | None = error
    link = ""
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        chain.append((current, link))
        if current.__cause__ is not None:
            current, link = current.__cause__, _CAUSE
        elif current.__context__ is not None and not current.__suppress_context__:
            current, link = current.__context__, _CONTEXT
        else:
            current = None
    return chain[::-1]


def escaped_traceback(error: BaseException) -> str:
    """``error``'s traceback, causes included, with every exception message escaped.

    The frames are the server's own code and are kept as Python prints them; only the
    messages, which may quote a client's input, go through :func:`escaped`.
    """
    lines: list[str] = []
    for exc, link in _chain(error):
        lines.append("Traceback (most recent call last):\n")
        lines.extend(traceback.format_tb(exc.__traceback__))
        kind = type(exc)
        name = (
            kind.__qualname__
            if kind.__module__ == "builtins"
            else f"{kind.__module__}.{kind.__qualname__}"
        )
        lines.append(f"{name}: {escaped(exc)}\n")
        lines.append(link)
    return "".join(lines).rstrip("\n")
