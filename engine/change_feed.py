"""Word that something in a store may have changed, for pages that update themselves.

The inbox UI's event stream (``/ui/events``) waits on this between looks at the inbox. A
store that hears changes made by every process (PostgreSQL's LISTEN/NOTIFY) or that holds
every change itself (the in-memory store) says ``live_changes``; one that cannot (SQLite)
does not, and its pages poll instead.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

__all__ = ["ChangeFeed"]


@runtime_checkable
class ChangeFeed(Protocol):
    """A store that can wake a waiter when any turn may have changed."""

    @property
    def live_changes(self) -> bool:
        """Whether :meth:`wait_for_any_change` hears changes made by every process (else it
        only sleeps, and callers should poll instead)."""
        ...

    async def wait_for_any_change(self, timeout: float) -> bool:
        """Return ``True`` when any turn may have been created or changed, ``False`` after
        ``timeout`` seconds without. A hint only: callers re-read what they show."""
        ...
