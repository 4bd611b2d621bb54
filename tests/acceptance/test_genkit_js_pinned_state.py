"""The genuine Genkit JS client keeps a client-managed blob's pin and meets a later deploy.

Three real ``turnstile serve`` processes serve ``tests.acceptance.versioned_client_app``: v1,
a changed v2, and v2 registering the migration from v1. The client pauses a transfer on v1,
resumes it there on the same chat (its own echo of the blob, pin included, verifies), then
sends the kept blob to each v2. ``tests/js/scenarios.mjs`` prints what the client observed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from tests.acceptance.test_genkit_js_client import JS
from tests.acceptance.versioned_app import INTERRUPT
from tests.databases import postgres_url
from tests.http_support import serve_process

APP = "tests.acceptance.versioned_client_app"


@pytest.fixture(scope="module")
def deploys() -> Iterator[dict[str, str]]:
    """Base URLs of the v1, v2 and migrating v2 servers."""
    assert shutil.which("node"), "Node.js is required for the genuine-client tests"
    assert (JS / "node_modules" / "genkit").is_dir(), "run `make test` (it installs genkit)"
    with (
        postgres_url() as url,
        serve_process(url, app=f"{APP}:v1") as (v1, _),
        serve_process(url, app=f"{APP}:v2") as (v2, _),
        serve_process(url, app=f"{APP}:v2_migrating") as (v2_migrating, _),
    ):
        yield {"v1": v1, "v2": v2, "v2_migrating": v2_migrating}


def run_pinned_state(deploys: dict[str, str]) -> dict[str, Any]:
    env = {**os.environ, "V2_URL": deploys["v2"], "V2_MIGRATING_URL": deploys["v2_migrating"]}
    done = subprocess.run(
        ["node", "scenarios.mjs", "pinnedState", deploys["v1"]],
        cwd=JS,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def test_a_v1_blob_is_refused_by_a_changed_deploy_and_migrated_by_a_migrating_one(
    deploys: dict[str, str],
) -> None:
    """The blob the client holds names v1; v1 resumes it, a changed v2 refuses it with
    FAILED_PRECONDITION naming the changes, a v2 with a migration runs it pinned to v2."""
    result = run_pinned_state(deploys)
    paused = result["paused"]
    assert [i["name"] for i in paused["interrupts"]] == [INTERRUPT["v1"]]
    assert paused["pin"]["appVersion"] == "v1"
    assert paused["pin"]["fingerprint"].startswith("def-")
    assert "Move money" not in json.dumps(paused["pin"])
    assert result["sameDeploy"]["text"] == f"done by v1 after {INTERRUPT['v1']}"
    assert result["sameDeploy"]["pin"]["appVersion"] == "v1"
    refused = result["refused"]
    assert refused.get("status") == "FAILED_PRECONDITION", refused
    assert "paused under version 'v1'" in refused["message"]
    assert "system changed" in refused["message"]
    assert f"tools.{INTERRUPT['v1']} removed" in refused["message"]
    assert "tools.transfer.inputSchema changed" in refused["message"]
    assert result["migrated"]["text"] == f"done by v2 after {INTERRUPT['v2']}"
    assert result["migrated"]["pin"]["appVersion"] == "v2"
