"""The worker pool and the ``turnstile`` command line.

:class:`WorkerPool` claims queued turns from a shared store and runs them with leases,
heartbeats and fenced writes; ``turnstile worker`` runs one pool per process, ``turnstile
migrate`` brings the database to the head revision.
"""

from __future__ import annotations

from workers.pool import WorkerPool

__all__ = ["WorkerPool"]
