"""Running the entry points: in process through Hydra's compose API (most tests), or as a
user does, a subprocess per run (one smoke test per entry point).

`in_process("training", "pipeline=demand", ..., run_dir=DIR)` composes `conf/train.yaml`
with the overrides (as `python -m training ...` would) and calls the entry point's own
body, `training/__main__.py`'s `main` under its `@hydra.main` wrapper, so the test runs
exactly what the command runs, less the ~3-6 s a new interpreter spends importing (torch,
mlflow, lightgbm) on 2 busy cores. What Hydra's launcher does around the body is done
here too: the run folder and its `.hydra/` files (config, overrides: `export register`
re-logs the resolved config from there), `HydraConfig` for the body, and Hydra's console
log handler (INFO and up, to stdout), so stdout/stderr hold the lines a user sees. `sys.exit` codes (2: an input
error; 3: a refused promotion) come back as `code`.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from tests.conftest import REPO

CONFIGS = {"training": "train", "export": "export", "evaluation": "evaluate"}


def run_training(*overrides: str, check: bool = True) -> subprocess.CompletedProcess:
    """`python -m training ...` in a subprocess (the smoke tests; bad-CLI tests)."""
    cmd = [sys.executable, "-m", "training", *overrides]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    if check and proc.returncode != 0:
        raise AssertionError(f"{cmd} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return proc


@dataclass
class EntryRun:
    """One in-process run: the exit code, what it printed, its folder and summary.json."""

    returncode: int
    stdout: str
    stderr: str
    run_dir: Path
    summary: dict = field(default_factory=dict)


def _entry_main(entry: str):
    """The entry point's `main` body, unwrapped from `@hydra.main` (functools.wraps)."""
    import importlib

    module = importlib.import_module(f"{entry}.__main__")
    return module.main.__wrapped__


def _argv_overrides(entry: str, overrides: tuple[str, ...]) -> list[str]:
    """The positional first word each entry point accepts (`export register ...`,
    `evaluation overload ...`), as its `__main__` turns it into an override."""
    args = list(overrides)
    if args and "=" not in args[0] and not args[0].startswith("-"):
        key = {"export": "action", "evaluation": "experiment"}.get(entry)
        if key is None:
            raise ValueError(f"{entry}: a positional argument {args[0]!r}")
        args[0] = f"{key}={args[0]}"
    return args


def in_process(entry: str, *overrides: str, run_dir: Path, check: bool = False) -> EntryRun:
    """Run `python -m <entry> *overrides` in this process, its outputs in `run_dir`."""
    from hydra import compose, initialize_config_dir
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf, open_dict, read_write

    from replaylab.apps.schemas import register_schemas

    register_schemas()
    run_dir = Path(run_dir).resolve()
    args = _argv_overrides(entry, overrides)
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3",
                               job_name="__main__"):
        cfg = compose(config_name=CONFIGS[entry], overrides=[*args, f"hydra.run.dir={run_dir}"],
                      return_hydra_config=True)
    # what hydra.core.utils.run_job does before it calls the body
    with read_write(cfg.hydra.runtime), open_dict(cfg.hydra.runtime):
        cfg.hydra.runtime.output_dir = str(run_dir)
    previous = HydraConfig.instance().cfg
    HydraConfig.instance().set_config(cfg)
    task = cfg.copy()
    with read_write(task), open_dict(task):
        del task["hydra"]
    run_dir.mkdir(parents=True, exist_ok=True)
    saved = run_dir / ".hydra"
    saved.mkdir(exist_ok=True)
    OmegaConf.save(task, saved / "config.yaml")
    OmegaConf.save(cfg.hydra.overrides.task, saved / "overrides.yaml")

    out, err = io.StringIO(), io.StringIO()
    handler = logging.StreamHandler(out)  # Hydra's default console handler: INFO+, stdout
    handler.setFormatter(logging.Formatter("[%(asctime)s][%(name)s][%(levelname)s] - "
                                           "%(message)s"))
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    env = dict(os.environ)
    code = 0
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                _entry_main(entry)(task)
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
        HydraConfig.instance().cfg = previous
        _end_mlflow_runs()
        os.environ.clear()  # MLflow's client settings the body sets stay with the run
        os.environ.update(env)
    path = run_dir / "summary.json"
    run = EntryRun(code, out.getvalue(), err.getvalue(), run_dir,
                   json.loads(path.read_text()) if path.is_file() else {})
    if check and code != 0:
        raise AssertionError(f"{entry} {' '.join(overrides)} failed ({code}):\n"
                             f"{run.stderr[-3000:]}")
    return run


def _end_mlflow_runs() -> None:
    """A body leaves no MLflow run open and no tracking or registry URI set for the next
    one (a new process would start clean)."""
    mlflow = sys.modules.get("mlflow")
    if mlflow is not None:
        while mlflow.active_run() is not None:
            mlflow.end_run("FAILED")
        # the body's mlflow.set_tracking_uri is process-global (and a set experiment with
        # it): a later test's MLFLOW_TRACKING_URI would otherwise lose to it
        mlflow.set_tracking_uri(None)
        mlflow.set_registry_uri(None)


def train(*overrides: str, run_dir: Path, check: bool = True) -> EntryRun:
    """`python -m training *overrides`, in process; raises on a non-zero exit by default."""
    return in_process("training", *overrides, run_dir=run_dir, check=check)


def export(*overrides: str, run_dir: Path, check: bool = False) -> EntryRun:
    """`python -m export *overrides` (first word may be the action), in process."""
    return in_process("export", *overrides, run_dir=run_dir, check=check)


def evaluate(*overrides: str, run_dir: Path, check: bool = True) -> EntryRun:
    """`python -m evaluation *overrides` (first word may be the experiment), in process."""
    return in_process("evaluation", *overrides, run_dir=run_dir, check=check)
