"""``python -m examples.tour`` end to end, as a real process, without and with a terminal."""

from __future__ import annotations

import os
import re
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine.scripted import transaction_id

REPO_ROOT = Path(__file__).resolve().parents[2]
DEMO = [sys.executable, "-m", "examples.tour"]
TIMEOUT = 60.0
#: An interactive y/n prompt waiting for input (automatic answers are followed by a note).
PROMPT = re.compile(r"Approve\? \[(?:Y/n|y/N)\] $")


def run_demo(*args: str) -> subprocess.CompletedProcess[str]:
    """Run the demo with stdin closed and return its finished process."""
    return subprocess.run(
        [*DEMO, *args],
        cwd=REPO_ROOT,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )


def test_demo_without_tty_plays_all_three_scenes() -> None:
    """Without a terminal the demo answers by itself and shows approvals, denial and transfers."""
    result = run_demo()
    out = result.stdout
    assert result.returncode == 0, result.stderr
    assert "(no TTY: answering automatically)" in out
    assert "You:   Transfer $500 to my savings account." in out
    assert "Interrupt: userApproval" in out
    assert "Action:    transferMoney" in out
    assert "Details:   Transfer $500 to my savings account" in out
    assert "txn-500-my-savings-account" in out
    assert "Transfer cancelled: Not this month" in out
    alice, bob = transaction_id(50, "Alice"), transaction_id(75, "Bob")
    assert f"Agent: Done. Transaction {alice}. Done. Transaction {bob}." in out
    assert "status: completed, finish reason: stop" in out
    assert "Transfers executed: 3" in out


def test_demo_yes_flag_answers_automatically() -> None:
    """``--yes`` forces automatic answers and says so."""
    result = run_demo("--yes")
    assert result.returncode == 0, result.stderr
    assert "(--yes: answering automatically)" in result.stdout
    assert "Transfers executed: 3" in result.stdout


def drive_through_pty(answers: list[str]) -> tuple[int, str]:
    """Run the demo on a pseudo-terminal, typing one answer per prompt; return (code, output)."""
    master, slave = os.openpty()
    try:
        process = subprocess.Popen(
            DEMO, cwd=REPO_ROOT, stdin=slave, stdout=slave, stderr=slave, close_fds=True
        )
    finally:
        os.close(slave)
    output = b""
    pending = list(answers)
    deadline = time.monotonic() + TIMEOUT
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.2)
            if ready:
                try:
                    data = os.read(master, 4096)
                except OSError:  # EIO: the child closed the terminal
                    break
                if not data:
                    break
                output += data
                if pending and PROMPT.search(output.decode(errors="replace")):
                    os.write(master, (pending.pop(0) + "\n").encode())
            elif process.poll() is not None:
                break
        code = process.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        os.close(master)
    return code, output.decode(errors="replace")


@pytest.mark.skipif(sys.platform == "win32", reason="needs a POSIX pseudo-terminal")
def test_demo_on_a_terminal_really_denies_when_the_human_says_no() -> None:
    """Answering "n" in scene 1 at a terminal cancels that transfer while scene 3 still runs."""
    code, out = drive_through_pty(["n", "y", "y"])
    plain = re.sub(r"\x1b\[[0-9;]*m", "", out)
    assert code == 0, plain
    assert "answering automatically" not in plain
    assert "Transfer cancelled: Declined at the terminal" in plain
    assert "Transfer cancelled: Not this month" in plain
    assert "[transferMoney ran: transaction txn-500-my-savings-account]" not in plain
    assert "Transfers executed: 2" in plain
