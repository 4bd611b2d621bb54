"""The examples of docs/http.md run as written against a real ``turnstile serve`` process."""

from __future__ import annotations

import os
import re
import subprocess
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.databases import postgres_url
from tests.http_support import serve_process

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "http.md"
JS = ROOT / "tests" / "js"


def blocks(language: str) -> list[str]:
    """The fenced blocks of the page in ``language``, in order."""
    return re.findall(rf"```{language}\n(.*?)```", DOC.read_text(), flags=re.DOTALL)


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with postgres_url() as url, serve_process(url, workers=2) as (base, _process):
        yield base


def test_curl_examples_run_an_approval_and_an_inbox_decision(server: str, tmp_path: Path) -> None:
    """The curl blocks pause a transfer, resume it streamed, read the snapshot, and decide an
    approval through the inbox."""
    script = "set -euo pipefail\n" + "\n".join(blocks("sh"))
    done = subprocess.run(
        ["bash", "-c", script],
        cwd=tmp_path,
        env={**os.environ, "TURNSTILE_URL": server},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert '"finishReason":"interrupted"' in out
    assert 'data: {"result":' in out and "Done. Transaction txn-40-carol." in out
    assert '"status":"completed"' in out  # the snapshot
    assert '"interrupt":"userApproval"' in out  # the inbox listing
    assert '"resumeSnapshotId":"' in out and '"waitingFor":[]' in out


def test_js_example_runs_with_the_genuine_client(server: str) -> None:
    """The JavaScript block, run by Node with genkit/beta/client, approves the transfer."""
    (example,) = blocks("js")
    path = JS / "doc-example.mjs"  # inside tests/js so that 'genkit' resolves
    path.write_text(example)
    try:
        done = subprocess.run(
            ["node", path.name],
            cwd=JS,
            env={**os.environ, "TURNSTILE_URL": server},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        path.unlink()
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "userApproval Transfer $40 to carol",
        "Done. Transaction txn-40-carol.",
    ]


async def test_python_example_runs_with_the_remote_client(
    server: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The Python block, with the remote client, approves the transfer."""
    (example,) = blocks("python")
    namespace: dict[str, Any] = {"TURNSTILE_URL": server}
    body = "async def _example():\n" + textwrap.indent(example, "    ")
    exec(compile(body, "docs/http.md", "exec"), namespace)
    await namespace["_example"]()
    assert capsys.readouterr().out.splitlines() == ["Done. Transaction txn-40-carol."]
