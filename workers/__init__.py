"""The worker pool and the ``turnstile`` command line (the durable executor lands here)."""

from __future__ import annotations

__all__: list[str] = []
