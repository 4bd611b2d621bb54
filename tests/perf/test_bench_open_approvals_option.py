"""``--open-approvals`` of ``bench/grow_history.py`` and ``bench/operator_reads.py``, run as
the scripts docs/performance.md shows (processes, on the PostgreSQL of ``DATABASE_URL``), at a
size small enough for the suite: the history ends with that many approvals waiting whatever
its size, and the reads still run on it."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]

#: Ten genuine workflows in a hundred left paused: four open approvals per copy of the seed.
SMALL = ["--seed", "40", "--open-fraction", "0.1", "--open-approvals", "8"]


def _script(name: str, *args: str) -> str:
    """Run ``bench/<name>`` to its end; its standard output."""
    run = subprocess.run(
        [sys.executable, str(ROOT / "bench" / name), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    return run.stdout


def _open_approvals(output: str) -> list[int]:
    return [int(n) for n in re.findall(r"open_approvals=(\d+)", output)]


@pytest.mark.timeout(180)
def test_the_history_builder_keeps_as_many_approvals_open_as_asked() -> None:
    """A thousand turns copied from a seed with four open approvals end with eight: the seed
    and one copy keep their paused workflows, the other copies leave them out."""
    output = _script("grow_history.py", "--turns", "1000", *SMALL)
    assert _open_approvals(output) == [8]


@pytest.mark.timeout(180)
def test_operator_reads_hold_the_open_approvals_at_every_size() -> None:
    """Two sizes, the same eight open approvals in each, and every read timed on both."""
    output = _script(
        "operator_reads.py",
        "--sizes",
        "500,1500",
        *SMALL,
        "--repeat",
        "1",
        "--retention-batches",
        "1",
    )
    assert _open_approvals(output) == [8, 8]
    paused = re.search(r"^turns ls --status paused\s+([\d.]+)\s+([\d.]+)\s*$", output, re.M)
    assert paused is not None, output
