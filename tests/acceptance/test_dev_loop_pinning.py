"""The dev loop on one PostgreSQL database: an approval opened under one prompt, the prompt
edited, and ``turnstile worker`` processes of the edited app
(:mod:`tests.acceptance.prompt_edit_app`). Without a declared version the edited app's worker
claims the turns queued before the edit; under a declared version only ``--dev`` resumes the
approval (here through the worker's expiry job), with a warning naming the change, while a
worker without it leaves it open."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
import pytest

from engine import Engine, FinishReason
from engine.conversation.parts import Part
from tests.acceptance.durable_support import REPO_ROOT, Worker, eventually
from tests.acceptance.prompt_edit_app import AGENT, INTERRUPT, build
from tests.databases import libpq_dsn, postgres_url

APP = "tests.acceptance.prompt_edit_app:ai"


@dataclass
class Loop:
    """The database, the worker processes started on it, and the test's own apps."""

    url: str
    tmp_path: Path
    workers: list[Worker] = field(default_factory=list)
    apps: list[Engine] = field(default_factory=list)

    def start_worker(self, edit: str, *args: str, env: dict[str, str] | None = None) -> Worker:
        """A ``turnstile worker`` process serving the app at ``edit``, with ``args``."""
        name = f"{edit}-worker{len(self.workers) + 1}"
        log_path = self.tmp_path / f"{name}.log"
        log_file = log_path.open("wb")
        fast = ("--poll-interval", "0.2", "--shutdown-grace", "1", "--expiry-interval", "0.5")
        process = subprocess.Popen(
            [sys.executable, "-m", "workers.cli", "worker", "--app", APP, *fast, *args],
            cwd=REPO_ROOT,
            env={
                **os.environ,
                "TURNSTILE_DATABASE_URL": self.url,
                "PROMPT_EDIT": edit,
                "PYTHONUNBUFFERED": "1",
                "PYTHONPATH": os.pathsep.join(
                    p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p
                ),
                **(env or {}),
            },
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
        worker = Worker(name=name, process=process, log_path=log_path, _log_file=log_file)
        self.workers.append(worker)
        return worker

    async def ready(self, worker: Worker) -> None:
        async def serving() -> bool:
            assert worker.alive, f"{worker.name} exited early\n{self.logs()}"
            return " serving " in worker.log()

        await eventually(serving, timeout=30, what="the worker to serve", describe=self.logs)

    def app(self, edit: str, **options: object) -> Engine:
        """The test process's own app at ``edit``."""
        app = build(edit, url=self.url, **options)  # type: ignore[arg-type]
        self.apps.append(app)
        return app

    def logs(self) -> str:
        return "\n".join(f"----- {w.name} -----\n{w.log()}" for w in self.workers)

    def children(self, turn_id: str) -> list[tuple[str, str]]:
        """``(id, status)`` of the turns continuing ``turn_id``."""
        with psycopg.connect(libpq_dsn(self.url), autocommit=True) as connection:
            rows = connection.execute(
                "SELECT id, status::text FROM turns WHERE parent_id = %s", (turn_id,)
            ).fetchall()
        return [(str(r[0]), str(r[1])) for r in rows]

    async def close(self) -> None:
        for worker in self.workers:
            worker.close()
        for app in self.apps:
            store = app.agents[AGENT].store
            if store is not None:
                await store.close()


@pytest.fixture
async def loop(tmp_path: Path) -> AsyncIterator[Loop]:
    """A fresh database with no workers yet; every worker is killed at teardown."""
    with postgres_url() as url:
        started = Loop(url=url, tmp_path=tmp_path)
        try:
            yield started
        finally:
            await started.close()


async def test_a_worker_of_the_edited_app_claims_a_resume_queued_before_the_edit(
    loop: Loop,
) -> None:
    """No declared version: a resume queued under the old prompt, with no worker left of
    that prompt, is claimed and run by a plain ``turnstile worker`` of the edited app."""
    inline_before = loop.app("before", execution="inline").agents[AGENT]
    paused = await inline_before.chat().send("Move 5")
    assert paused.finish_reason is FinishReason.INTERRUPTED
    (asked,) = paused.interrupts
    queued_before = loop.app("before").agents[AGENT]
    queued = await queued_before.chat(snapshot_id=str(paused.snapshot_id)).resume(
        respond=[Part.of_response(INTERRUPT, asked.ref, {"approved": True})], wait=False
    )

    worker = loop.start_worker("after")
    await loop.ready(worker)
    after = loop.app("after").agents[AGENT]
    done = await after.wait(str(queued.snapshot_id), timeout=30)
    assert done.text == "done after the edit"


async def test_worker_dev_resumes_an_approval_paused_before_a_prompt_edit(loop: Loop) -> None:
    """Declared version v1: past the approval's deadline a worker of the edited app without
    ``--dev`` skips it (the definition changed) and leaves it open; ``turnstile worker
    --dev`` resumes it with the default answer, warning of the changed prompt, and its pool
    runs the resume under the edited prompt."""
    inline_before = loop.app("before", version="v1", timeout=1.0, execution="inline")
    paused = await inline_before.agents[AGENT].chat().send("Move 5")
    assert paused.finish_reason is FinishReason.INTERRUPTED
    paused_id = str(paused.snapshot_id)
    edited = {"TURNSTILE_APP_VERSION": "v1", "PROMPT_EDIT_TIMEOUT": "1"}

    strict = loop.start_worker("after", env=edited)
    await loop.ready(strict)

    async def skipped() -> bool:
        return f"expiry of {paused_id} skipped" in strict.log()

    await eventually(skipped, timeout=30, what="the strict worker to skip", describe=loop.logs)
    assert "system changed" in strict.log()
    assert loop.children(paused_id) == []
    strict.close()

    dev = loop.start_worker("after", "--dev", env=edited)
    await loop.ready(dev)

    async def resumed() -> str | None:
        done = [turn_id for turn_id, status in loop.children(paused_id) if status == "completed"]
        return done[0] if done else None

    resume_id = await eventually(
        resumed, timeout=30, what="the dev worker's resume", describe=loop.logs
    )
    after = loop.app("after", version="v1").agents[AGENT]
    done = await after.wait(resume_id, timeout=30)
    assert done.text == "done after the edit"
    warnings = [line for line in dev.log().splitlines() if f"resuming {paused_id}" in line]
    assert warnings and "WARNING" in warnings[0] and "system changed" in warnings[0]
