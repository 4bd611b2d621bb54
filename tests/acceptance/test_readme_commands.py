"""Every ``sh`` block of README.md runs as written, so a README command cannot rot.

The convention, an HTML comment on the line right before a block's opening fence:

- no comment: the block runs to its end and must exit 0; processes it leaves running in the
  background (``serve ... &``) are stopped once the block's checks are done;
- ``<!-- readme: background, ready when it logs "TEXT" -->``: the block's last command runs
  until it is stopped (``turnstile worker``, ``turnstile serve``): it must log TEXT without
  exiting, and is then stopped with SIGTERM;
- ``<!-- readme: not run: REASON -->``: the block is not run, for the reason given (one is
  required): ``make test`` (this suite itself), a real model provider's API key.

How a block runs: ``bash`` with ``set -euo pipefail``, in the repository's root, with
``.venv/bin`` first on ``PATH``, no ``TURNSTILE_*`` variable inherited from the test run, in a
process group of its own (stopped as a whole). Two substitutions keep runs apart from each
other and from a reader's files: every database URL (``postgresql://…`` or ``sqlite:///…``)
becomes a fresh empty database, and the port ``8080`` a free one (also given as
``TURNSTILE_PORT``, for a ``serve`` that names no port). A block with a database URL runs
twice, on SQLite and on PostgreSQL, whichever of them it names.

The browser walkthrough (the block that signs in with ``examples.demo_auth``) is then checked
in Chromium: Bob signs in with the token the block names and sees Alice's transfer waiting.
The console transcript of "Operating from the shell" is illustrative; its commands and options
are checked to exist.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import click
import psycopg
import pytest
from playwright.sync_api import Page, expect
from sqlalchemy.engine import make_url

from examples import demo_auth
from tests.acceptance.inbox_ui_support import evidence, sign_in
from tests.databases import ADMIN_URL, libpq_dsn
from tests.http_support import free_port
from workers.cli import cli

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
VENV_BIN = ROOT / ".venv" / "bin"

#: A fenced ``sh`` block, with the ``readme:`` comment on the line before it, if any.
SH_BLOCK = re.compile(
    r"^(?:<!-- readme: (?P<marker>.*?) -->\n)?```sh\n(?P<body>.*?)^```$",
    flags=re.MULTILINE | re.DOTALL,
)
#: Every ``readme:`` comment of the page, wherever it is.
ANY_MARKER = re.compile(r"<!-- readme: (.*?) -->")
BACKGROUND = re.compile(r'background, ready when it logs "(?P<text>[^"]+)"')
NOT_RUN = re.compile(r"not run: (?P<reason>.+)")
DATABASE_URL = re.compile(r"(?:postgresql|sqlite)://[^\s'\"]+")
README_PORT = re.compile(r"\b8080\b")
#: What marks the browser walkthrough among the blocks.
INBOX_WALKTHROUGH = "--auth examples.demo_auth:auth"

#: Seconds a block may take to run to its end, or a background block to say it is ready.
BLOCK_TIMEOUT = 90.0
#: Seconds the processes of a block get to stop after SIGTERM before they are killed.
STOP_GRACE = 15.0


@dataclass(frozen=True)
class Block:
    """One ``sh`` block of the README."""

    line: int
    body: str
    marker: str | None

    @property
    def ready_text(self) -> str | None:
        """What a background block logs once it serves (``None``: not a background block)."""
        found = BACKGROUND.fullmatch(self.marker or "")
        return found["text"] if found else None

    @property
    def runs(self) -> bool:
        """Whether the suite runs the block (every block not marked ``not run``)."""
        return not (self.marker or "").startswith("not run")

    @property
    def kinds(self) -> list[str]:
        """The databases the block runs on: both for a block naming one, else none."""
        return ["sqlite", "postgres"] if DATABASE_URL.search(self.body) else ["none"]


def readme_blocks() -> list[Block]:
    """The README's ``sh`` blocks, in order."""
    text = README.read_text()
    return [
        Block(
            line=text.count("\n", 0, found.start("body")),
            body=found["body"],
            marker=found["marker"],
        )
        for found in SH_BLOCK.finditer(text)
    ]


def _cases(*, walkthrough: bool) -> list[object]:
    """``(block, database kind)`` for each run of the blocks that are (or are not) the browser
    walkthrough, with ids naming the block's line."""
    return [
        pytest.param(block, kind, id=f"line-{block.line}-{kind}")
        for block in readme_blocks()
        if block.runs and (INBOX_WALKTHROUGH in block.body) == walkthrough
        for kind in block.kinds
    ]


@dataclass
class Run:
    """A block running in a shell of its own, its output in a file."""

    process: subprocess.Popen[bytes]
    log: Path
    port: int

    @property
    def output(self) -> str:
        """Everything the block printed so far (stdout and stderr)."""
        return self.log.read_text(errors="replace")

    @property
    def base(self) -> str:
        """The URL a server the block started answers on."""
        return f"http://127.0.0.1:{self.port}"


@contextlib.contextmanager
def database_url(kind: str, folder: Path, index: int) -> Iterator[str]:
    """A fresh, empty (not migrated) database of ``kind`` for the block to use."""
    if kind == "sqlite":
        yield f"sqlite:///{folder / f'readme-{index}.db'}"
        return
    name = f"turnstile_test_{os.getpid()}_readme_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(libpq_dsn(ADMIN_URL), autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield (
            make_url(ADMIN_URL)
            .set(drivername="postgresql", database=name)
            .render_as_string(hide_password=False)
        )
    finally:
        with psycopg.connect(libpq_dsn(ADMIN_URL), autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _environment(port: int) -> dict[str, str]:
    """The block's environment: the test run's, without its Turnstile settings, with the
    project's virtual environment first on PATH and the free port as the default one."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TURNSTILE_")}
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    env["TURNSTILE_PORT"] = str(port)
    env["PYTHONUNBUFFERED"] = "1"
    return env


@contextlib.contextmanager
def run_block(block: Block, kind: str, tmp_path: Path) -> Iterator[Run]:
    """Start ``block`` with its databases and port substituted; stop whatever it left running
    (its process group) when the caller is done."""
    port = free_port()
    urls = sorted(set(DATABASE_URL.findall(block.body)))
    with contextlib.ExitStack() as resources:
        script = block.body
        for index, url in enumerate(urls):
            fresh = resources.enter_context(database_url(kind, tmp_path, index))
            script = script.replace(url, fresh)
        script = README_PORT.sub(str(port), script)
        log = tmp_path / "block.log"
        with log.open("wb") as out:
            process = subprocess.Popen(
                ["bash", "-c", f"set -euo pipefail\n{script}"],
                cwd=ROOT,
                env=_environment(port),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group, stopped as one
            )
        try:
            yield Run(process=process, log=log, port=port)
        finally:
            _stop_group(process)


def _stop_group(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM to every process of the block's group; SIGKILL to those still there later."""
    group = process.pid
    with contextlib.suppress(ProcessLookupError):
        os.killpg(group, signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE
    while time.monotonic() < deadline:
        process.poll()
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(group, signal.SIGKILL)
    process.wait()


def finish(run: Run) -> str:
    """Wait for a block that runs to its end; its output, once it exited 0."""
    try:
        status = run.process.wait(timeout=BLOCK_TIMEOUT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the block did not finish in {BLOCK_TIMEOUT:g}s:\n{run.output}")
    assert status == 0, f"the block exited {status}:\n{run.output}"
    return run.output


def wait_until_ready(run: Run, text: str) -> str:
    """Wait until a background block logs ``text`` while still running; its output."""
    deadline = time.monotonic() + BLOCK_TIMEOUT
    while text not in run.output:
        if run.process.poll() is not None:
            pytest.fail(
                f"the block exited {run.process.returncode} before it logged {text!r}:\n"
                f"{run.output}"
            )
        if time.monotonic() > deadline:
            pytest.fail(f"the block did not log {text!r} in {BLOCK_TIMEOUT:g}s:\n{run.output}")
        time.sleep(0.1)
    assert run.process.poll() is None, f"the block stopped after it was ready:\n{run.output}"
    return run.output


# -- the convention ---------------------------------------------------------------------------


def test_every_marker_is_one_of_the_convention_and_names_its_reason() -> None:
    """A ``readme:`` comment stands right before an ``sh`` block and is either a background
    block's readiness or a ``not run`` with a reason, so no block is skipped silently."""
    markers = ANY_MARKER.findall(README.read_text())
    attached = [block.marker for block in readme_blocks() if block.marker is not None]
    assert markers == attached, "a readme: comment that is not right before an sh block"
    for marker in markers:
        reason = NOT_RUN.fullmatch(marker)
        assert BACKGROUND.fullmatch(marker) or reason, f"unknown readme: comment {marker!r}"
        if reason:
            assert len(reason["reason"].split()) >= 3, f"say why the block is not run: {marker!r}"


def test_the_suite_runs_the_readme_walkthroughs() -> None:
    """The blocks that matter to a new reader are run: the worker, the server and the browser
    walkthrough, each on both databases."""
    bodies = [block.body for block in readme_blocks() if block.runs for _kind in block.kinds]
    assert any("turnstile worker" in body for body in bodies)
    assert any("turnstile serve" in body and "--workers" in body for body in bodies)
    assert sum(INBOX_WALKTHROUGH in body for body in bodies) == 2


# -- the blocks -------------------------------------------------------------------------------


@pytest.mark.timeout(180)
@pytest.mark.parametrize(("block", "kind"), _cases(walkthrough=False))
def test_readme_block_runs(block: Block, kind: str, tmp_path: Path) -> None:
    """The block exits 0, or, marked background, runs and says it is ready."""
    with run_block(block, kind, tmp_path) as run:
        text = block.ready_text
        if text is None:
            finish(run)
        else:
            wait_until_ready(run, text)


@pytest.mark.timeout(180)
@pytest.mark.parametrize(("block", "kind"), _cases(walkthrough=True))
def test_browser_walkthrough_leaves_an_approval_for_bob(
    block: Block, kind: str, tmp_path: Path, page: Page
) -> None:
    """From a fresh clone, the walkthrough's one block leaves a server with Alice's transfer
    waiting, and Bob, signed in with the token it names, sees it in the inbox."""
    assert f"token {demo_auth.TOKENS['bob']}" in block.body
    assert f"Bearer {demo_auth.TOKENS['alice']}" in block.body
    with run_block(block, kind, tmp_path) as run:
        out = finish(run)
        assert '"finishReason":"interrupted"' in out
        with evidence(page, f"readme-walkthrough-{kind}"):
            sign_in(page, run.base, "bob", tokens=demo_auth.TOKENS)
            expect(page.get_by_text("Transfer $40 to carol").first).to_be_visible()


# -- the console transcript -------------------------------------------------------------------


def _transcript_commands() -> list[list[str]]:
    """The arguments of each ``$ turnstile ...`` line of the README's console blocks (up to a
    pipe)."""
    consoles = re.findall(r"```console\n(.*?)```", README.read_text(), flags=re.DOTALL)
    lines = [line for block in consoles for line in block.splitlines()]
    return [
        shlex.split(line.removeprefix("$ ").split("|")[0])[1:]
        for line in lines
        if line.startswith("$ turnstile ")
    ]


def test_the_console_transcript_uses_commands_and_options_that_exist() -> None:
    """Each command of the illustrative transcript is a ``turnstile`` command, and each option
    it gives is one of that command's."""
    commands = _transcript_commands()
    assert commands, "no $ turnstile lines in the README's console blocks"
    for args in commands:
        command: click.Command = cli
        words = iter(args)
        for word in words:
            if isinstance(command, click.Group) and word in command.commands:
                command = command.commands[word]
                continue
            break
        assert not isinstance(command, click.Group), f"turnstile {' '.join(args)}: no command"
        known = {opt for param in command.params for opt in param.opts}
        for word in args:
            flag = word.split("=")[0]
            if flag.startswith("--"):
                assert flag in known, f"turnstile {' '.join(args)}: {flag} is no option"
