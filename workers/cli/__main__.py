"""``python -m workers.cli``: the ``turnstile`` command."""

from workers.cli import main

raise SystemExit(main())
