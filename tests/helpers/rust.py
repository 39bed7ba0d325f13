"""Building and running the Rust reference scorer (scorers/rust) in tests."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import REPO
from tests.helpers.router import ONE_HEAD

CRATE = REPO / "scorers" / "rust"


BINARY = CRATE / "target" / "release" / "replaylab-route"


def find_cargo() -> str | None:
    """`cargo` on PATH, else rustup's default place; None when neither."""
    found = shutil.which("cargo")
    if found:
        return found
    home = Path.home() / ".cargo" / "bin" / "cargo"
    return str(home) if home.is_file() else None


def cargo_env(cargo: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{Path(cargo).parent}{os.pathsep}{env.get('PATH', '')}"  # rustc beside it
    return env


def run_bin(binary: Path, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(binary), *args], input=stdin, capture_output=True, text=True,
                          timeout=300)


def router_texts() -> list[str]:
    from replaylab.apps.inputs import default_outcomes
    from replaylab.artifacts.encoder_export import EDGE_CASE_TEXTS
    from replaylab.sources.routellm import import_routellm_gsm8k

    df = import_routellm_gsm8k(str(default_outcomes())).drop_duplicates("prompt_id")
    prompts = df["prompt_text"].astype(str).tolist()[:250]
    rng = np.random.default_rng(3)
    pools = [range(0x20, 0x7F), range(0xA0, 0x250), range(0x300, 0x370), range(0x400, 0x4FF),
             range(0x590, 0x6FF), range(0x2000, 0x206F), range(0x3040, 0x30FF),
             range(0x4E00, 0x4F00), range(0xAC00, 0xAD00), range(0x1F300, 0x1F64F),
             range(0x0, 0x20), range(0xFE00, 0xFFFF)]
    noise = ["".join(chr(int(rng.integers(p.start, p.stop))) + (" " if rng.random() < 0.2 else "")
                     for p in (pools[int(rng.integers(len(pools)))]
                               for _ in range(int(rng.integers(1, 60)))))
             for _ in range(120)]
    return prompts + list(EDGE_CASE_TEXTS) + noise + ["Ünïcödé " * 600]  # past max_chars


def cargo_or_skip() -> str:
    """`cargo`'s path; the calling test skips, saying so, when there is none."""
    found = find_cargo()
    if found is None:
        pytest.skip("cargo not on PATH: the Rust scorer is not checked")
    return found


def build_binary(cargo: str) -> Path:
    """`cargo build --offline --release` of the crate; the replaylab-route binary."""
    proc = subprocess.run([cargo, "build", "--offline", "--release", "--quiet"], cwd=CRATE,
                          env=cargo_env(cargo), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert BINARY.is_file()
    return BINARY


def train_static_router(run: Path) -> Path:
    """A static-tier router artifact from the real pipeline (small head, few bootstraps;
    the static encoder comes from the repo cache, exported there once when absent)."""
    cmd = [sys.executable, "-m", "training", "pipeline=router", "tracking=off",
           "router.encoder.tier=static", "router.head.max_epochs=5", "router.go.n_boot=100",
           "router.evaluation.n_boot=20", "router.lgbm_estimators=10", *ONE_HEAD,
           f"hydra.run.dir={run}"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=1200,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    art = run / "artifacts" / "router"
    assert json.loads((art / "router.json").read_text())["encoder"]["tier"] == "static"
    return art


LIBRARY_SO = CRATE / "target" / "release" / "libreplaylab_scorer.so"
LIBRARY_A = CRATE / "target" / "release" / "libreplaylab_scorer.a"
HEADER = CRATE / "include" / "replaylab.h"
SESSIONS = CRATE / "tests" / "sessions"  # scripts/make_binder_sessions.py


def build_library(cargo: str) -> Path:
    """The crate's release build (the CLI, libreplaylab_scorer.so and .a: one cargo build);
    the shared library's path."""
    build_binary(cargo)
    assert LIBRARY_SO.is_file() and LIBRARY_A.is_file()
    return LIBRARY_SO


def created_ms(art: Path) -> int:
    """An artifact's `created_at` in epoch milliseconds (a clock at which it is valid)."""
    created = json.loads((art / "manifest.json").read_text())["created_at"]
    return int(datetime.fromisoformat(created).timestamp() * 1000)
