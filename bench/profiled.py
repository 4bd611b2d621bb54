"""Run a module as ``__main__`` under cProfile timed by CPU, not wall clock.

``python -m bench.profiled OUT MODULE [ARGS...]`` — like ``python -m cProfile -o OUT -m
MODULE``, except that the profiler's clock is :func:`time.thread_time`: time a process
spends runnable but waiting for a CPU (common on a loaded two-core machine) is not charged
to whatever call it happened to be in. The stats are written when the module returns or
raises ``SystemExit``.
"""

from __future__ import annotations

import cProfile
import runpy
import sys
import time


def main() -> None:
    """Profile ``MODULE`` with the remaining arguments as its ``sys.argv``."""
    if len(sys.argv) < 3:
        raise SystemExit("usage: python -m bench.profiled OUT MODULE [ARGS...]")
    out, module, rest = sys.argv[1], sys.argv[2], sys.argv[3:]
    sys.argv = [module, *rest]
    profiler = cProfile.Profile(time.thread_time)
    profiler.enable()
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    finally:
        profiler.disable()
        profiler.dump_stats(out)


if __name__ == "__main__":
    main()
