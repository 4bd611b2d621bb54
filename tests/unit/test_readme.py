"""The README's API tour and its own-agent example run as written."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path
from typing import Any

import pytest

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


OWN_AGENT_HEADING = "## Your own agent, offline\n"
REFUND_DESK = README.parent / "examples" / "refund_desk.py"


def own_agent_blocks() -> list[str]:
    """The ```python blocks of the README's "Your own agent, offline" section, in order."""
    text = README.read_text()
    section = text[text.index(OWN_AGENT_HEADING) :]
    section = section[: section.index("\n## ", len(OWN_AGENT_HEADING))]
    return re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)


def test_readme_shows_the_refund_desk_example_verbatim() -> None:
    """The own-agent code in the README is examples/refund_desk.py exactly, so what readers
    copy is the file that ruff, mypy and the tests below check."""
    assert own_agent_blocks()[0] == REFUND_DESK.read_text()


async def test_refund_desk_example_runs_its_approved_refund(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The example's main() pauses for the manager, resumes approved and prints the refund."""
    from examples import refund_desk

    await refund_desk.main()
    assert capsys.readouterr().out.splitlines() == ["orderId='42'", "Refunded order 42 (rf-42)."]
    assert "42" in refund_desk.refunds


async def test_readme_offline_test_of_the_refund_desk_passes() -> None:
    """The README's test of its own agent runs as written and passes."""
    namespace: dict[str, Any] = {}
    exec(compile(own_agent_blocks()[1], "README-own-agent-test", "exec"), namespace)
    await namespace["test_a_declined_refund_refunds_nothing"]()
