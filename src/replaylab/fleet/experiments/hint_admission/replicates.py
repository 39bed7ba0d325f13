"""The replicates the modes are evaluated on: the test window of every replicate ledger
(source=synthetic, one per seed: `seed_replicates`) or consecutive time windows of a
ledger file's test window (`window_replicates`), each hinted through the runtime.

Part of the hint_admission experiment (`hint_admission/__init__.py`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from replaylab.config import ConfigError
from replaylab.fleet.experiments.hint_admission.artifact import synthetic_ledger, window_rows
from replaylab.fleet.experiments.hint_admission.config import HintConfig
from replaylab.fleet.experiments.hint_admission.sizing import size_pools
from replaylab.fleet.experiments.workloads import (
    ledger_facts,
    ledger_windows,
    row_cases,
    workload_facts,
    workload_text,
)


def _test_workload(c: HintConfig, frame: pd.DataFrame, source: str) -> tuple[Any, dict]:
    """A hinted test-window frame as a Workload, and how often its hint missed the truth."""
    from replaylab.contracts import validate_ledger
    from replaylab.fleet.sim.workload import workload_from_ledger

    valid = validate_ledger(frame.reset_index(drop=True), source=source)
    models = valid.valid["selected_model"].dropna().unique()
    w = workload_from_ledger(valid, model_map={m: c.model for m in models},
                             time_scale=c.workload.time_scale,
                             cancel_aborted=c.workload.cancel_aborted)
    ok = np.isfinite(w.hint_p90)
    true_total = w.prompt_tokens + w.completion_tokens
    return w, {"requests": w.n, "hinted": int(ok.sum()),
               "p90_exceedance": float(np.mean(true_total[ok] > w.hint_p90[ok]))
               if ok.any() else math.nan}


def _by_mode(sizing: Mapping[str, Mapping]) -> dict[str, int]:
    return {m: v["replicas"] for m, v in sizing.items()}


def seed_replicates(c: HintConfig, predictor, windows: Mapping, hinted_train: pd.DataFrame,
                    sizing: Mapping, mult: float, profile) -> dict[str, Any]:
    """source=synthetic: the test window of every replicate ledger (one per seed)."""
    from replaylab.hints.replay import replay_hints

    workloads, quality, tests = [], [], []
    spread = [{"seed": c.ledger.train_seed, **_by_mode(sizing)}]
    for s in c.ledger.replicate_seeds:
        if int(s) == c.ledger.train_seed:
            hinted = hinted_train
        else:
            hinted = replay_hints(synthetic_ledger(c, int(s)).result.valid, predictor)
            # how much the sizing moves between ledgers
            other = size_pools(window_rows(hinted, windows["calibration"]), c, mult, profile)
            spread.append({"seed": int(s), **_by_mode(other)})
        test = window_rows(hinted, windows["test"])
        if not len(test):
            continue
        w, q = _test_workload(c, test, f"synthetic seed {s}")
        workloads.append((int(s), w))
        quality.append({"seed": int(s), **q})
        tests.append(test)
    if not workloads:
        raise ConfigError("no test-window rows in any replicate ledger")
    n_req = sum(w.n for _, w in workloads)
    desc = workload_text(
        "synthetic ledger-v1 (replaylab.sources.synthetic), test window of the demand split",
        n_req, f"{len(workloads)} replicate ledgers (seeds {[s for s, _ in workloads]}), "
        f"arrivals compressed {c.workload.time_scale:g}x, hint_p90 from the exported artifact "
        "through DemandPredictor + replay_hints")
    skipped, censored = row_cases(pd.concat(tests))
    facts = workload_facts(description=desc, kind="synthetic", rows_used=n_req,
                           rows_skipped=skipped, rows_censored=censored,
                           requests_simulated=n_req, seeds=[s for s, _ in workloads],
                           time_scale=c.workload.time_scale)
    return {"workloads": workloads, "quality": quality, "spread": spread, "facts": facts}


def window_replicates(c: HintConfig, led, windows: Mapping, hinted_train: pd.DataFrame,
                      sizing: Mapping) -> dict[str, Any]:
    """A ledger file: `fleet.workload.windows` consecutive time windows of its test window."""
    test = window_rows(hinted_train, windows["test"])
    if not len(test):
        raise ConfigError(f"{led.file}: no rows in the demand split's test window")
    spec = c.workload
    parts, left_out = ledger_windows(test, spec.windows, spec.window_s, spec.max_requests)
    workloads, quality = [], []
    for k, part in enumerate(parts):
        w, q = _test_workload(c, part, led.file)
        workloads.append((k, w))
        quality.append({"window": k, **q})
    n_req = sum(w.n for _, w in workloads)
    desc = workload_text(
        f"{led.label}, test window of the demand split", n_req,
        f"{len(parts)} time windows of the test window, arrivals compressed "
        f"{spec.time_scale:g}x, hint_p90 from the exported artifact through DemandPredictor "
        "+ replay_hints")
    left_out = {**left_out, "not_test_window": len(led.result.valid) - len(test)}
    facts = ledger_facts(led, parts, left_out, description=desc, requests_simulated=n_req,
                         windows=len(parts), time_scale=spec.time_scale)
    return {"workloads": workloads, "quality": quality,
            "spread": [{"ledger": led.file, **_by_mode(sizing)}], "facts": facts}
