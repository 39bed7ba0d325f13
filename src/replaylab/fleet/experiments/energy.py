"""Fleet experiment `energy`: least-loaded vs static efficient pool vs energy-aware.

Joules per success and per output token beside SLO, cost and capacity, on real
trace windows (any ledger: `fleet.workload`), and again under +-20 % power-model error
(does the ranking hold?). Shared pieces (pools, workloads, pooled summaries) live in
the harness (`harness/`, `workloads.py`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from replaylab.config import ConfigError
from replaylab.fleet.experiments.harness import (
    GridRunner,
    SimExperimentConfig,
    build_pools,
    ci_table,
    has_hints,
    hint_policy_check,
    local_grid,
    make_policy,
    pooled_summary,
    pyplot,
    replicate_metrics,
    save_figure,
    sim_config,
    simulate,
)
from replaylab.fleet.experiments.workloads import require_source, trace_workloads
from replaylab.jsonsafe import json_safe
from replaylab.stats import paired_diff


@dataclass(frozen=True)
class EnergyConfig(SimExperimentConfig):
    pools: dict = field(default_factory=dict)
    policies: dict = field(default_factory=dict)
    power_error: dict = field(default_factory=dict)  # name -> {pool: relative error}


NOMINAL = None   # the cells' key of the nominal power curves (no power_error name is None)


def energy_cell(shared: Mapping[str, Any], cell: tuple[str | None, int, str]):
    """One cell (power curves: NOMINAL or a power_error name, window index, policy name)
    -> its SimResult."""
    curves, k, name = cell
    w = shared["workloads"][k]
    return simulate(shared["pools"][curves], sim_config(shared["sim"], w),
                    make_policy(shared["policies"][name]), w)


def run(cfg: Mapping[str, Any], run_dir: Path,
        runner: GridRunner | None = None) -> dict[str, Any]:
    """Least-loaded vs static efficient pool vs energy-aware on a mixed fleet (module docstring).

    Cells: power curves (nominal, then each power_error) x window x policy, all in one
    `runner.map` (local loop by default, or Dask tasks).

    Every policy runs every window at the nominal power curves. Power-model error
    is then evaluated two ways for each perturbation (pool -> relative error):
    `decisions_fixed`: the policies decided with the nominal curves and the real
    draw differs (exact: a pool's energy scales with its curve); `policy_informed`:
    the fleet re-simulated with the perturbed curves (energy-aware routes by them).
    `ranking_holds`: the order of the policies by joules_per_output_token is the
    nominal one (`rank_policies`: ties, to 12 significant digits, go by name).
    """
    c = EnergyConfig.parse(cfg)
    if not c.pools or not c.policies:
        raise ConfigError("experiment=energy needs pools and policies")
    require_source(c.workload, "energy")
    slo = c.slo_targets()
    wls, workload = trace_workloads(c.workload, c.model)
    pools = build_pools(c.pools, c.model)
    specs, skipped = hint_policy_check(
        c.policies, has_hints(wls), "energy",
        f"the workload ({workload.get('file') or workload.get('source')}) carries none (every hint_p90 "
        "null or the column absent)")
    names = list(specs)
    factors = {ename: {str(p): 1.0 + float(e) for p, e in dict(fs).items()}
               for ename, fs in c.power_error.items()}
    curves = {NOMINAL: pools, **{ename: build_pools(c.pools, c.model, f)
                                 for ename, f in factors.items()}}
    cells = [(cv, k, n) for cv in curves for k in range(len(wls)) for n in names]
    shared = {"pools": curves, "sim": c.sim, "policies": specs, "workloads": wls}
    results = (runner or local_grid()).map(
        energy_cell, cells, shared=shared, desc="energy cells (curves x window x policy)")
    runs: dict[str | None, dict[str, list]] = {cv: {n: [] for n in names} for cv in curves}
    for (cv, _, n), result in zip(cells, results, strict=True):
        runs[cv][n].append(result)
    nominal = runs[NOMINAL]
    policies = {n: pooled_summary(nominal[n], slo) for n in names}
    per_rep = {n: replicate_metrics(nominal[n], slo) for n in names}

    def ranking(summaries: Mapping[str, Mapping]) -> list[str]:
        return rank_policies({n: summaries[n]["joules_per_output_token"] for n in names})

    base_rank = ranking(policies)
    errors: dict[str, Any] = {}
    for ename, f in factors.items():
        fixed = {n: pooled_summary(nominal[n], slo, f) for n in names}
        informed_runs = runs[ename]
        informed = {n: pooled_summary(informed_runs[n], slo) for n in names}
        errors[ename] = {
            "relative_error": {p: f[p] - 1.0 for p in f},
            "decisions_fixed": {
                "joules_per_output_token": {n: fixed[n]["joules_per_output_token"] for n in names},
                "joules_per_success": {n: fixed[n]["joules_per_success"] for n in names},
                "ranking": ranking(fixed), "ranking_holds": ranking(fixed) == base_rank},
            "policy_informed": {
                "joules_per_output_token": {n: informed[n]["joules_per_output_token"]
                                            for n in names},
                "slo_attainment": {n: informed[n]["slo_attainment"] for n in names},
                "ranking": ranking(informed), "ranking_holds": ranking(informed) == base_rank},
            "ranking_holds": ranking(fixed) == base_rank and ranking(informed) == base_rank,
        }
    best = base_rank[0]
    lead = {n: paired_diff(per_rep[n]["joules_per_output_token"],
                           per_rep[best]["joules_per_output_token"])
            for n in names if n != best}
    slo_vs_best = {n: paired_diff(per_rep[n]["slo_attainment"], per_rep[best]["slo_attainment"])
                   for n in names if n != best}
    summary: dict[str, Any] = {
        "experiment": "energy", "workload": workload,
        "policies": policies, "skipped_policies": skipped,
        "conserved": all(p["conserved"] for p in policies.values()),
        "fleet": {p.pool_id: {"profile": p.profile.name, "gpus": p.profile.gpus,
                              "replicas": p.replicas, "max_batch": p.profile.max_batch,
                              "kv_capacity_tokens": p.profile.kv_capacity_tokens,
                              "power_idle_w": p.profile.power_idle_w,
                              "power_nominal_w": p.profile.power_nominal_w,
                              "cost_per_gpu_hour": p.profile.cost_per_gpu_hour,
                              "energy_provenance": p.profile.energy_provenance,
                              "source": p.profile.source} for p in pools},
        "replicates": len(wls),
        "ci95": {n: ci_table(per_rep[n]) for n in names},
        "pools": {n: pool_shares_pooled(nominal[n]) for n in names},
        "ranking": base_rank,
        "lead_over_best": {"best": best, "joules_per_output_token_diff": lead,
                           "slo_attainment_diff": slo_vs_best},
        "power_error": errors,
        "ranking_holds": {k: v["ranking_holds"] for k, v in errors.items()},
        "ranking_holds_all": all(v["ranking_holds"] for v in errors.values()),
        "provenance": "energy: calibrated curves (ML.ENERGY) or modeled (FleetSim) per pool; "
                      "fitted idle power is an extrapolation; KV capacity and prices modeled",
    }
    summary["answer"] = _energy_answer(summary, names)
    summary["reports"] = _energy_figures(summary, names, Path(run_dir) / "figures")
    return json_safe(summary)


def rank_policies(values: Mapping[str, float], digits: int = 12) -> list[str]:
    """Names by their metric, lowest first; the order never depends on the input order.

    Ties break by name. Values are compared at `digits` significant digits, so two
    policies whose energies differ only by floating-point summation order tie (and
    then go by name); a missing metric (NaN, None) ranks last.
    """
    def key(n: str) -> tuple:
        v = values[n]
        if v is None or not math.isfinite(float(v)):   # NaN, None, inf: last, by name
            return (1, 0.0, str(n))
        return (0, float(f"{float(v):.{digits}g}"), str(n))

    return sorted(values, key=key)


def _energy_answer(s: dict, names: list[str]) -> str:
    pol, rank = s["policies"], s["ranking"]
    parts = ["Ranking by joules per output token (nominal power curves): " + " < ".join(
        f"{n} ({pol[n]['joules_per_output_token']:.4f} J/tok, SLO "
        f"{pol[n]['slo_attainment']:.3f}, TTFT p99 {pol[n]['ttft_p99_s']:.2f} s)" for n in rank)
        + "."]
    parts += [f"Policy {n} {why}." for n, why in s.get("skipped_policies", {}).items()]
    best = s["lead_over_best"]["best"]
    for n, d in s["lead_over_best"]["joules_per_output_token_diff"].items():
        lo, hi = d["ci95"]
        rel = d["mean"] / pol[best]["joules_per_output_token"]
        parts.append(f"{n} uses {d['mean']:+.4f} J/tok ({rel:+.1%}) more than {best} "
                     f"[95% CI {lo:+.4f}, {hi:+.4f} over {d['n']} windows; "
                     + ("excludes zero" if d["excludes_zero"] else "includes zero") + "].")
    errs = s["power_error"]
    if errs:
        fixed = [k for k, v in errs.items() if v["decisions_fixed"]["ranking_holds"]]
        informed = [k for k, v in errs.items() if v["policy_informed"]["ranking_holds"]]
        parts.append(f"Power-model error: with the decisions made on the nominal curves the "
                     f"ranking holds in {len(fixed)}/{len(errs)} perturbations; with the "
                     f"policies re-deciding on the perturbed curves in {len(informed)}/"
                     f"{len(errs)}.")
        for k, v in errs.items():
            if not v["ranking_holds"]:
                which = "decisions fixed" if not v["decisions_fixed"]["ranking_holds"] else \
                    "re-decided"
                r = (v["decisions_fixed"] if which == "decisions fixed"
                     else v["policy_informed"])["ranking"]
                parts.append(f"It breaks under {k} ({which}): " + " < ".join(r) + ".")
    return " ".join(parts)


def pool_shares_pooled(results: Sequence) -> dict[str, dict[str, float]]:
    """pool_shares over several runs (served share and utilization pooled)."""
    frames = [r.replicas for r in results if len(r.replicas)]
    if not frames:
        return {}
    reps = pd.concat(frames, ignore_index=True)
    served = float(reps["served"].sum()) or 1.0
    out = {}
    for pid, g in reps.groupby("pool_id", sort=False):
        on = float(g["on_s"].sum())
        out[str(pid)] = {"served_share": float(g["served"].sum()) / served,
                         "utilization": float(g["busy_s"].sum()) / on if on > 0 else math.nan,
                         "energy_share": float(g["energy_j"].sum()) / max(
                             float(reps["energy_j"].sum()), 1e-12)}
    return out


def _energy_figures(summary: dict, names: list[str], out: Path) -> dict[str, str]:
    plt = pyplot()
    pol = summary["policies"]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
    for n in names:
        x = pol[n]["joules_per_output_token"]
        y = pol[n]["slo_attainment"]
        alts = [v["decisions_fixed"]["joules_per_output_token"][n]
                for v in summary["power_error"].values()]
        alts += [v["policy_informed"]["joules_per_output_token"][n]
                 for v in summary["power_error"].values()]
        lo = min([x, *alts]) if alts else x
        hi = max([x, *alts]) if alts else x
        ci = summary["ci95"][n]["slo_attainment"]["ci95"]
        yerr = None
        if all(v is not None and math.isfinite(v) for v in ci):
            yerr = [[max(y - ci[0], 0)], [max(ci[1] - y, 0)]]
        a.errorbar([x], [y], xerr=[[x - lo], [hi - x]], yerr=yerr, fmt="o", capsize=4, label=n)
    a.set_xlabel("J per output token (bars: range under power-model error)")
    a.set_ylabel("SLO attainment (bars: 95% CI over windows)")
    a.set_title("Energy vs SLO per policy")
    a.legend(fontsize=8)
    keys = ["nominal", *summary["power_error"]]
    width = 0.8 / max(len(names), 1)
    for i, n in enumerate(names):
        vals = [pol[n]["joules_per_output_token"]] + [
            summary["power_error"][k]["decisions_fixed"]["joules_per_output_token"][n]
            for k in keys[1:]]
        b.bar(np.arange(len(keys)) + i * width, vals, width, label=n)
    b.set_xticks(np.arange(len(keys)) + width * (len(names) - 1) / 2, keys, rotation=20,
                 fontsize=8)
    b.set_ylabel("J per output token (decisions fixed)")
    b.set_title("Ranking under power-model error")
    b.legend(fontsize=8)
    return {"energy_vs_slo": save_figure(fig, plt, out / "energy_vs_slo.png")}
