"""The run: train and size, then one cell per (replicate, mode, replicas) on the grid,
pooled into the summary (`run`).

Part of the hint_admission experiment (`hint_admission/__init__.py`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from replaylab.config import ConfigError, from_mapping
from replaylab.fleet.experiments.harness import (
    GridRunner,
    PoolSpec,
    build_profile,
    ci_table,
    local_grid,
    make_policy,
    pooled_summary,
    replicate_metrics,
    sim_config,
    simulate,
)
from replaylab.fleet.experiments.hint_admission.artifact import (
    train_and_export,
    training_ledger,
    window_rows,
)
from replaylab.fleet.experiments.hint_admission.config import hint_config, mode_of
from replaylab.fleet.experiments.hint_admission.replicates import seed_replicates, window_replicates
from replaylab.fleet.experiments.hint_admission.report import (
    answer_text,
    compare_modes,
    write_figures,
)
from replaylab.fleet.experiments.hint_admission.sizing import size_pools
from replaylab.jsonsafe import json_safe


def hint_cell(shared: Mapping[str, Any], cell: tuple[int, str, int]):
    """One cell (replicate index, mode name, replicas of the pool) -> its SimResult."""
    from replaylab.fleet.sim.fleet import PoolConfig

    k, name, replicas = cell
    w = shared["workloads"][k]
    pools = [PoolConfig("pool", shared["model"], shared["profile"], replicas=replicas,
                        cold_start_s=shared["cold_start_s"])]
    return simulate(pools, sim_config(shared["sim"], w), make_policy(shared["modes"][name]), w)


def run(cfg: Mapping[str, Any], run_dir: Path,
        runner: GridRunner | None = None) -> dict[str, Any]:
    """See the module docstring; returns the summary (policies = admission modes).
    Cells: replicate x mode x (common fleet, the mode's own sizing when it differs);
    `runner`: local loop by default, or Dask tasks."""
    from replaylab.hints.replay import replay_hints
    from replaylab.hints.residuals import residual_summary

    c = hint_config(cfg)
    slo = c.slo_targets()
    run_dir = Path(run_dir)
    loaded, led = training_ledger(c)
    trained = train_and_export(c, run_dir, loaded)
    predictor, windows = trained["predictor"], trained["windows"]
    if "test" not in windows or "calibration" not in windows:
        raise ConfigError("the demand split has no calibration or test window; "
                          "use a larger ledger")

    # 2. sizing from the calibration window's residuals
    train_frame = trained["loaded"].result.valid
    hinted_train = replay_hints(train_frame, predictor)
    calib = window_rows(hinted_train, windows["calibration"])
    res = residual_summary(calib, group_columns=(), min_group_rows=30)
    mult_all = res["overall"]["sizing_multiplier"] or {}
    mult = float(mult_all.get(c.sizing.multiplier_quantile, 1.0))
    spec = from_mapping(PoolSpec, dict(c.pool), "experiment.pool")
    profile = build_profile(spec, "experiment.pool")
    sizing = size_pools(calib, c, mult, profile)
    fleet_replicas = sizing["hint"]["replicas"]

    # 3. the test window of every replicate (ledger seed or time window), hinted by the runtime
    replicates = (window_replicates(c, led, windows, hinted_train, sizing) if led is not None
                  else seed_replicates(c, predictor, windows, hinted_train, sizing, mult, profile))
    workloads, hint_quality = replicates["workloads"], replicates["quality"]
    sizing_spread = replicates["spread"]

    names = list(c.modes)
    own_reps = {n: sizing.get(mode_of(c.modes[n]), sizing["hint"])["replicas"] for n in names}
    cells = []
    for k in range(len(workloads)):
        for n in names:
            cells.append((k, n, fleet_replicas))
            if own_reps[n] != fleet_replicas:
                cells.append((k, n, own_reps[n]))
    shared = {"workloads": [w for _, w in workloads], "model": c.model, "profile": profile,
              "cold_start_s": spec.cold_start_s, "sim": c.sim, "modes": dict(c.modes)}
    outs = iter((runner or local_grid()).map(hint_cell, cells, shared=shared,
                                             desc="hint_admission cells (replicate x mode)"))
    common: dict[str, list] = {n: [] for n in names}
    own: dict[str, list] = {n: [] for n in names}
    for _ in workloads:
        for n in names:
            common[n].append(next(outs))
            own[n].append(common[n][-1] if own_reps[n] == fleet_replicas else next(outs))
    policies = {n: pooled_summary(common[n], slo) for n in names}
    for n in names:
        policies[f"{n}@own_sizing"] = pooled_summary(own[n], slo)
    per_rep = {n: replicate_metrics(common[n], slo) for n in names}
    per_rep_own = {n: replicate_metrics(own[n], slo) for n in names}
    comparisons = compare_modes(names, c, per_rep, per_rep_own, sizing, sizing_spread)
    summary: dict[str, Any] = {
        "experiment": "hint_admission", "workload": replicates["facts"], "policies": policies,
        "conserved": all(p["conserved"] for p in policies.values()),
        "artifact": {"path": trained["artifact"], "version": trained["version"],
                     "ledger_rows": trained["rows"], "windows_ms": windows,
                     "demand_test": trained["demand_test"]},
        "residuals": {"window": "calibration", "rows": res["rows"],
                      "coverage": res["overall"]["coverage"],
                      "p90_exceedance": res["overall"]["p90_exceedance"],
                      "sizing_multiplier": mult_all, "used": c.sizing.multiplier_quantile,
                      "multiplier": mult},
        "hint_quality_test": hint_quality,
        "sizing": {"profile": profile.name, "kv_capacity_tokens": profile.kv_capacity_tokens,
                   "need_quantile": c.sizing.need_quantile,
                   "service_time": c.sizing.service_time,
                   "target_fill": c.sizing.target_fill, "by_mode": sizing,
                   "common_fleet_replicas": fleet_replicas,
                   "replicas_by_ledger": sizing_spread},
        "replicates": len(workloads),
        "ci95": {n: ci_table(per_rep[n]) for n in names},
        "ci95_own_sizing": {n: ci_table(per_rep_own[n]) for n in names},
        "materiality": dict(c.materiality),
        "comparisons": comparisons,
    }
    summary["answer"] = answer_text(comparisons, c, sizing)
    summary["reports"] = write_figures(summary, names, per_rep, run_dir / "figures")
    return json_safe(summary)
