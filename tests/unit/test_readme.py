"""The README's API tour runs as written."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path
from typing import Any

README = Path(__file__).resolve().parents[2] / "README.md"


def python_blocks() -> list[str]:
    """The ```python blocks of the README, in order."""
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)


async def test_readme_tour_runs_and_approves_the_transfer() -> None:
    """Defining the banking agent and the send/approve/resume snippet work verbatim."""
    definitions, flow = python_blocks()[:2]
    namespace: dict[str, Any] = {}
    exec(compile(definitions, "README-definitions", "exec"), namespace)
    body = "async def _flow():\n" + textwrap.indent(flow, "    ") + "\n    return res\n"
    exec(compile(body, "README-flow", "exec"), namespace)
    res = await namespace["_flow"]()
    assert res.text.startswith("Done. Transaction txn-")
    assert res.interrupts == []


def test_readme_screenshots_exist() -> None:
    """Every image the README shows is a PNG in the repository (the inbox, the edit form and
    the escalation notice)."""
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", README.read_text())
    assert {"docs/img/approval-edit.png", "docs/img/approval-escalated.png"} <= set(images)
    for image in images:
        path = README.parent / image
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", f"{image} is not a PNG"
