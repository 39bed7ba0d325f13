"""Running the entry points as a user does (a subprocess per run)."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import REPO


def run_training(*overrides: str, check: bool = True) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "training", *overrides]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    if check and proc.returncode != 0:
        raise AssertionError(f"{cmd} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return proc
