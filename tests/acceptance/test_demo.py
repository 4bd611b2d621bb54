"""``make demo`` end to end: real worker processes on SQLite, one SIGKILLed mid-transfer."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(120)
def test_demo_recovers_a_transfer_from_a_killed_worker(tmp_path: Path) -> None:
    """The demo pauses, kills the worker mid-transfer, and a new worker books it exactly once."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TURNSTILE_")}
    result = subprocess.run(
        [sys.executable, "-m", "examples.demo"],
        cwd=tmp_path,
        env={**env, "PYTHONPATH": str(ROOT)},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=110,
    )
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    assert "(no TTY: answering automatically)" in out
    assert (
        "interrupt=userApproval ref=approval-1 details='Transfer $500 to my savings account'" in out
    )
    assert "ledger after the kill: 1 booking(s)" in out
    assert "reason='lease expired'" in out
    assert "Agent: Done. Transaction txn-500-my-savings-account." in out
    assert "completed, 2 attempts" in out
    assert "ledger: 1 booking(s): $500 to my savings account" in out
    assert "tool done        transferMoney transfer-1" in out
    assert "Agent: Transfer cancelled: Not now" in out
    assert "Agent: Done. Transaction txn-50-alice. Done. Transaction txn-75-bob." in out
    assert "ledger now holds 3 bookings" in out
    assert (tmp_path / ".turnstile" / "demo" / "demo.db").exists()
