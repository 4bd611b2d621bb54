"""A rolling deploy on one PostgreSQL database: ``turnstile worker`` processes of two
versions of one app side by side (:mod:`tests.acceptance.versioned_app`), each claiming only
its own version's turns; a paused v1 turn whose resume v2 refuses with the diff, then moves
by a registered migration, or by ``turnstile turns migrate`` (dry run first)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest

from engine import Engine, FinishReason
from engine.agent import Agent
from engine.conversation.parts import Part
from engine.response import AgentResponse
from engine.state.versioning import DefinitionChangedError
from tests.acceptance.durable_support import REPO_ROOT, Worker, eventually
from tests.acceptance.versioned_app import AGENT, INTERRUPT, build
from tests.databases import libpq_dsn, postgres_url


@dataclass
class Deploy:
    """The database, the worker processes of each version, and the test's own apps."""

    url: str
    tmp_path: Path
    workers: list[Worker] = field(default_factory=list)
    apps: list[Engine] = field(default_factory=list)

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "TURNSTILE_DATABASE_URL": self.url,
            "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": os.pathsep.join(
                p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p
            ),
        }

    def start_worker(self, version: str) -> Worker:
        """A ``turnstile worker`` process serving the app at ``version``."""
        name = f"{version}-worker{len(self.workers) + 1}"
        log_path = self.tmp_path / f"{name}.log"
        log_file = log_path.open("wb")
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "workers.cli",
                "worker",
                "--app",
                f"tests.acceptance.versioned_{version}:ai",
                "--poll-interval",
                "0.2",
                "--shutdown-grace",
                "1",
            ],
            cwd=REPO_ROOT,
            env=self.env(),
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
        worker = Worker(name=name, process=process, log_path=log_path, _log_file=log_file)
        self.workers.append(worker)
        return worker

    async def ready(self, *workers: Worker) -> None:
        async def serving() -> bool:
            for worker in workers:
                assert worker.alive, f"{worker.name} exited early\n{self.logs()}"
            return all(" serving " in w.log() for w in workers)

        await eventually(serving, timeout=30, what="workers to serve", describe=self.logs)

    def agent(self, version: str, *, migration: bool = False) -> Agent:
        """The test process's own app at ``version`` (it queues turns; workers run them)."""
        app = build(version, url=self.url, migration=migration)
        self.apps.append(app)
        return app.agents[AGENT]

    def logs(self) -> str:
        return "\n".join(f"----- {w.name} -----\n{w.log()}" for w in self.workers)

    def row(self, turn_id: str) -> tuple[Any, ...]:
        with psycopg.connect(libpq_dsn(self.url), autocommit=True) as connection:
            found = connection.execute(
                "SELECT app_version, status::text, definition_fingerprint FROM turns WHERE id = %s",
                (turn_id,),
            ).fetchone()
        assert found is not None
        return tuple(found)

    def notes(self, turn_id: str) -> list[str]:
        with psycopg.connect(libpq_dsn(self.url), autocommit=True) as connection:
            rows = connection.execute(
                "SELECT note FROM turn_events "
                "WHERE turn_id = %s AND kind = 'status' AND note IS NOT NULL ORDER BY id",
                (turn_id,),
            ).fetchall()
        return [r[0] for r in rows]

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "workers.cli", *args],
            cwd=REPO_ROOT,
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=60,
        )

    async def close(self) -> None:
        for worker in self.workers:
            worker.close()
        for app in self.apps:
            closed: set[int] = set()
            for agent in app.agents.values():
                if agent.store is not None and id(agent.store) not in closed:
                    closed.add(id(agent.store))
                    await agent.store.close()


@pytest.fixture
async def deploy(tmp_path: Path) -> AsyncIterator[Deploy]:
    """A fresh database with no workers yet; every worker is killed at teardown."""
    with postgres_url() as url:
        started = Deploy(url=url, tmp_path=tmp_path)
        try:
            yield started
        finally:
            await started.close()


def approve(response: AgentResponse, name: str) -> list[Part]:
    """The answer approving the paused call (under the interrupt name ``name``)."""
    (paused,) = response.interrupts
    return [Part.of_response(name, paused.ref, {"approved": True})]


async def paused_v1(deploy: Deploy) -> tuple[Agent, AgentResponse]:
    """A v1 conversation paused at v1's approval, run by a v1 worker."""
    v1 = deploy.agent("v1")
    paused = await v1.chat().send("Move 5", timeout=30)
    assert paused.finish_reason is FinishReason.INTERRUPTED
    assert [i.name for i in paused.interrupts] == [INTERRUPT["v1"]]
    return v1, paused


async def test_each_version_s_workers_claim_only_that_version_s_turns(deploy: Deploy) -> None:
    """With only a v1 worker, a v2 turn stays queued (``turnstile stats`` shows it claimable
    under v2, and v1's open approval is listed with its version); a v2 worker then runs it,
    and v1's and v2's conversations each finish in their own version."""
    v1_worker = deploy.start_worker("v1")
    await deploy.ready(v1_worker)
    v1, paused = await paused_v1(deploy)
    assert deploy.row(str(paused.snapshot_id))[0] == "v1"

    v2 = deploy.agent("v2")
    queued = await v2.chat().send("Move 5", wait=False)
    await _stays_pending(deploy, str(queued.snapshot_id), seconds=2.0)
    stats = deploy.cli("stats", "--json")
    assert stats.returncode == 0, stats.stderr
    by_version = {(v["agent"], v["version"]): v for v in json.loads(stats.stdout)["versions"]}
    assert by_version[AGENT, "v2"]["claimable"] == 1
    assert by_version[AGENT, "v1"] == {"agent": AGENT, "version": "v1", "claimable": 0, "paused": 1}
    listed = deploy.cli("approvals", "ls", "--json")
    assert listed.returncode == 0, listed.stderr
    (open_v1,) = json.loads(listed.stdout)["items"]
    assert (open_v1["interrupt"], open_v1["app_version"]) == (INTERRUPT["v1"], "v1")

    v2_worker = deploy.start_worker("v2")
    await deploy.ready(v2_worker)
    settled = await v2.wait(str(queued.snapshot_id), timeout=30)
    assert [i.name for i in settled.interrupts] == [INTERRUPT["v2"]]
    done_v2 = await v2.chat(snapshot_id=str(settled.snapshot_id)).resume(
        respond=approve(settled, INTERRUPT["v2"]), timeout=30
    )
    assert done_v2.text == "done by v2 after confirmTransfer"
    done_v1 = await v1.chat(snapshot_id=str(paused.snapshot_id)).resume(
        respond=approve(paused, INTERRUPT["v1"]), timeout=30
    )
    assert done_v1.text == "done by v1 after approveTransfer"
    assert deploy.row(str(done_v1.snapshot_id))[0] == "v1"
    assert deploy.row(str(done_v2.snapshot_id))[0] == "v2"


async def _stays_pending(deploy: Deploy, turn_id: str, *, seconds: float) -> None:
    """The turn is still pending, never claimed, ``seconds`` from now."""
    await asyncio.sleep(seconds)
    assert deploy.row(turn_id)[1] == "pending", deploy.logs()
    with psycopg.connect(libpq_dsn(deploy.url), autocommit=True) as connection:
        (attempts,) = connection.execute(  # type: ignore[misc]
            "SELECT attempts FROM turns WHERE id = %s", (turn_id,)
        ).fetchone()
    assert attempts == 0


async def test_v2_refuses_a_v1_resume_with_the_diff_then_migrates_it(deploy: Deploy) -> None:
    """v2 without a migration refuses to resume v1's paused turn, naming every change and
    writing nothing; v2 with its registered migration resumes it, a v2 worker runs it under
    the new interrupt name, and the turn records v2 and the move."""
    workers = deploy.start_worker("v1"), deploy.start_worker("v2")
    await deploy.ready(*workers)
    _, paused = await paused_v1(deploy)
    snapshot = str(paused.snapshot_id)

    plain_v2 = deploy.agent("v2")
    with pytest.raises(DefinitionChangedError) as refused:
        await plain_v2.chat(snapshot_id=snapshot).resume(
            respond=approve(paused, INTERRUPT["v1"]), timeout=30
        )
    assert refused.value.status == "FAILED_PRECONDITION"
    for change in (
        "system changed",
        "tools.approveTransfer removed",
        "tools.confirmTransfer added",
        "tools.transfer.inputSchema changed",
    ):
        assert change in refused.value.message
    latest = await plain_v2.get_snapshot(session_id=paused.session_id)
    assert latest is not None and latest.snapshot_id == snapshot

    migrating_v2 = deploy.agent("v2", migration=True)
    done = await migrating_v2.chat(snapshot_id=snapshot).resume(
        respond=approve(paused, INTERRUPT["v1"]), timeout=30
    )
    assert done.text == "done by v2 after confirmTransfer"
    assert deploy.row(str(done.snapshot_id))[0] == "v2"
    (note,) = deploy.notes(str(done.snapshot_id))
    assert note.startswith("migrated from version v1 to v2")


async def test_an_operator_moves_paused_turns_with_the_cli(deploy: Deploy) -> None:
    """``turns migrate --dry-run`` lists the paused v1 turn and the diff and changes nothing;
    the real run moves it to v2 (recorded on its timeline), and a v2 worker — the only one
    left — finishes it."""
    v1_worker = deploy.start_worker("v1")
    await deploy.ready(v1_worker)
    _, paused = await paused_v1(deploy)
    snapshot = str(paused.snapshot_id)
    before = deploy.row(snapshot)
    v1_worker.close()
    v2_worker = deploy.start_worker("v2")
    await deploy.ready(v2_worker)

    common = ["--from", "v1", "--to", "v2", "--app", "tests.acceptance.versioned_v2:ai"]
    dry = deploy.cli("turns", "migrate", *common, "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    planned = json.loads(dry.stdout)
    (entry,) = planned["turns"]
    assert (entry["turn_id"], entry["state"], entry["moved"]) == (snapshot, "paused", False)
    assert "tools.approveTransfer removed" in entry["change_lines"]
    assert entry["unknown_interrupts"] == [INTERRUPT["v1"]]
    assert deploy.row(snapshot) == before

    moved = deploy.cli("turns", "migrate", *common)
    assert moved.returncode == 0, moved.stderr
    assert "moved 1 of 1 turns from v1 to v2" in moved.stdout
    assert deploy.row(snapshot)[0] == "v2"
    assert deploy.notes(snapshot) == ["moved from version v1 to v2 by turnstile turns migrate"]
    shown = deploy.cli("turns", "show", snapshot, "--json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["turn"]["app_version"] == "v2"

    v2 = deploy.agent("v2")
    done = await v2.chat(snapshot_id=snapshot).resume(
        respond=approve(paused, INTERRUPT["v1"]), timeout=30
    )
    assert done.text == "done by v2 after approveTransfer"
    assert deploy.row(str(done.snapshot_id))[0] == "v2"


async def test_a_cli_decision_the_changed_app_cannot_resume_is_refused_with_exit_1(
    deploy: Deploy,
) -> None:
    """``approvals approve`` through the v2 app on v1's paused turn is an engine refusal
    (exit 1, as docs/cli.md says of refusals), one line naming the change; nothing is
    recorded, and the approval stays open."""
    workers = (deploy.start_worker("v1"),)
    await deploy.ready(*workers)
    _, paused = await paused_v1(deploy)
    (asked,) = paused.interrupts
    approval = f"{paused.snapshot_id}:{asked.ref}"
    refused = deploy.cli(
        "approvals", "approve", approval, "--by", "ops", "--app", "tests.acceptance.versioned_v2:ai"
    )
    assert refused.returncode == 1, refused.stderr
    assert "Traceback" not in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert "tools.approveTransfer removed" in refused.stderr
    listed = deploy.cli("approvals", "ls", "--json")
    assert [item["id"] for item in json.loads(listed.stdout)["items"]] == [approval]


async def test_turns_migrate_to_a_version_the_app_is_not_is_refused_in_one_line(
    deploy: Deploy,
) -> None:
    """``turns migrate --to`` naming another version than the app's is a usage error: one
    line naming both versions, exit 2, no traceback."""
    refused = deploy.cli(
        "turns",
        "migrate",
        "--from",
        "v1",
        "--to",
        "v9",
        "--app",
        "tests.acceptance.versioned_v2:ai",
    )
    assert refused.returncode == 2, refused.stderr
    assert "Traceback" not in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert refused.stderr.startswith("turnstile turns migrate: ")
