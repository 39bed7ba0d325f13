"""Operating a serving policy: a staged rollout with shadow, canary and rollback.

`python -m evaluation experiment=rollout`: each candidate policy (energy-aware and
static efficient pool by default) replacing the baseline (least-loaded) in
stages on one fleet and trace:

1. shadow: `ShadowPolicy(acting=baseline, candidate)`: the candidate's choices are
   logged beside the baseline's without acting; `shadow_report` says whether the
   candidate would have broken a hard constraint (or rejected more), and whether
   a canary may start (`canary_ready`); the shadow run is checked to be the
   baseline's own run (no SLO regression can come from shadowing);
2. canary at each traffic share (25 %, 50 %, 100 % by default): a request is
   routed by the candidate when a fixed hash of its index falls below the share
   (`CanarySplit`; the same request always takes the same side);
3. rollback: the candidate at a share until `RollbackGuard` (the simulator's
   controller hook, every tick) trips on a stated time, a queue guard or a
   predicted-TPOT guard, and the baseline after it; SLO before and after.

Each step is compared with the baseline run on the same windows (paired per
window, 95 % t-intervals); a step is promoted when its mean SLO attainment is
not more than `regression_threshold` below the baseline's and the candidate
broke no hard constraint; the `ladder` stops at the first step that fails.
The windows are those of `fleet.workload`'s ledger (a file or a shipped trace).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from replaylab.config import ConfigError
from replaylab.fleet.experiments.harness import (
    GridRunner,
    SimExperimentConfig,
    build_pools,
    ci_table,
    local_grid,
    make_policy,
    masked_slo,
    pool_mapping,
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

# ---------------------------------------------------------------- rollout


_HASH = 0x9E3779B1  # Knuth's multiplicative hash: a fixed, well-spread split of request indices


def canary_side(index: int, share: float) -> bool:
    """True when request `index` goes to the candidate at traffic `share` (fixed per request)."""
    return ((index * _HASH) & 0xFFFFFFFF) / 2.0 ** 32 < share


class CanarySplit:
    """Route a fixed `share` of requests by `candidate`, the rest by `baseline`.

    The side of a request is a hash of its index (the same request always takes
    the same side at a given share; a larger share keeps the smaller one's
    requests). `active` False (set by a RollbackGuard) sends everything to the
    baseline from then on. `decisions` counts each side.
    """

    def __init__(self, baseline, candidate, share: float) -> None:
        if not 0.0 <= share <= 1.0:
            raise ValueError(f"CanarySplit.share={share!r}: must be in [0, 1]")
        self.baseline, self.candidate, self.share = baseline, candidate, float(share)
        self.active = True
        self.decisions: Counter = Counter()

    def _side(self, request):
        if self.active and canary_side(request.index, self.share):
            return "candidate", self.candidate
        return "baseline", self.baseline

    def admit(self, request, fleet, now):
        _, pol = self._side(request)
        admit = getattr(pol, "admit", None)
        return None if admit is None else admit(request, fleet, now)

    def choose(self, request, eligible, fleet, now):
        name, pol = self._side(request)
        self.decisions[name] += 1
        return pol.choose(request, eligible, fleet, now)


class RollbackGuard:
    """A Controller (no scale actions) that switches a CanarySplit back to its baseline.

    Checked every control tick, on what a router sees: trips at `at_s` (a
    scheduled rollback); when the mean queue per ready replica exceeds
    `max_mean_queue`; or when some ready replica's predicted iteration time (its
    profile's dt at its current batch, KV and prefills: the time per output token
    it is delivering now) exceeds `max_predicted_tpot_s`. `rolled_back_at` and
    `reason` record when and why.
    """

    def __init__(self, split: CanarySplit, at_s: float = math.inf,
                 max_mean_queue: float = math.inf,
                 max_predicted_tpot_s: float = math.inf) -> None:
        self.split, self.at_s = split, float(at_s)
        self.max_mean_queue, self.max_tpot = float(max_mean_queue), float(max_predicted_tpot_s)
        self.rolled_back_at: float | None = None
        self.reason: str | None = None

    def decide(self, now: float, fleet) -> tuple:
        if self.rolled_back_at is not None:
            return ()
        ready = [r for r in fleet.replicas if r.state == "ready"]
        mean_q = sum(r.queued for r in ready) / len(ready) if ready else 0.0
        tpot = max((r.profile.iteration_s(r.running, r.kv_used, r.n_prefill) for r in ready
                    if r.running), default=0.0)
        reason = None
        if mean_q > self.max_mean_queue:
            reason = f"guard: mean queue {mean_q:.1f} > {self.max_mean_queue:g}"
        elif tpot > self.max_tpot:
            reason = f"guard: predicted TPOT {tpot:.3f} s > {self.max_tpot:g} s"
        elif now >= self.at_s:
            reason = f"scheduled at {self.at_s:g} s"
        if reason is not None:
            self.split.active = False
            self.rolled_back_at, self.reason = float(now), reason
        return ()


@dataclass(frozen=True)
class RollbackSpec:
    share: float = 1.0                 # the candidate's share before the rollback
    at_fraction: float = 0.5           # of each window: scheduled rollback
    max_mean_queue: float | None = None       # guard; null: none
    max_predicted_tpot_s: float | None = None  # guard; null: none
    control_interval_s: float = 1.0


@dataclass(frozen=True)
class RolloutConfig(SimExperimentConfig):
    pools: dict = field(default_factory=dict)
    baseline: dict = field(default_factory=lambda: {"kind": "least_loaded"})
    candidates: dict = field(default_factory=lambda: {"energy_aware": {"kind": "energy_aware"}})
    shares: tuple[float, ...] = (0.0, 0.25, 0.5, 1.0)
    rollback: RollbackSpec = field(default_factory=RollbackSpec)
    regression_threshold: float = 0.01   # SLO attainment drop that blocks promotion


def _rollout_config(cfg: Mapping[str, Any]) -> RolloutConfig:
    c = RolloutConfig.parse(cfg)
    if not c.pools or not c.candidates:
        raise ConfigError("experiment=rollout needs pools and candidates")
    require_source(c.workload, "rollout")
    if 0.0 not in c.shares:
        raise ConfigError("experiment.shares must include 0.0 (the baseline every step is "
                          "compared with)")
    return c


BASELINE = "baseline"


def _share_name(s: float) -> str:
    return BASELINE if s == 0 else f"canary_{100 * s:g}%"


def _hard_violations(result) -> dict[str, int]:
    """Hard constraints the simulator can break only through a policy: none is the bar."""
    counts = result.counts()
    lost = counts["arrived"] - sum(v for k, v in counts.items() if k != "arrived")
    return {"unconserved": int(lost), "no_replica": int(result.reject_reasons.get("no_replica", 0))}


def _guard(split: CanarySplit, rb: RollbackSpec, duration_s: float) -> RollbackGuard:
    inf = math.inf
    return RollbackGuard(split, at_s=rb.at_fraction * duration_s,
                         max_mean_queue=inf if rb.max_mean_queue is None else rb.max_mean_queue,
                         max_predicted_tpot_s=inf if rb.max_predicted_tpot_s is None
                         else rb.max_predicted_tpot_s)


def rollout_cell(shared: Mapping[str, Any], cell: tuple) -> dict[str, Any]:
    """One cell (candidate name or None, window index, step, share) -> the step's run:
    step `baseline` (the baseline policy alone), `shadow` (+ its shadow report), `canary`
    at `share` (+ decisions per side) or `rollback` (+ decisions, when and why)."""
    from replaylab.fleet.control.shadow import ShadowPolicy, shadow_report

    cname, k, step, share = cell
    c: RolloutConfig = shared["config"]
    pools, slo, w = shared["pools"], shared["slo"], shared["workloads"][k]
    conf = sim_config(c.sim, w)
    if step == BASELINE:
        return {"result": simulate(pools, conf, make_policy(c.baseline), w)}
    cand = shared["candidates"][cname]
    if step == "shadow":
        shadow = ShadowPolicy(make_policy(c.baseline), make_policy(cand))
        res = simulate(pools, conf, shadow, w)
        return {"result": res, "report": shadow_report(shadow.log, res, slo)}
    split = CanarySplit(make_policy(c.baseline), make_policy(cand), share)
    if step == "canary":
        res = simulate(pools, conf, split, w)
        return {"result": res, "decisions": Counter(split.decisions)}
    guard = _guard(split, c.rollback, w.duration_s)
    res = simulate(pools, replace(conf, control_interval_s=c.rollback.control_interval_s),
                   split, w, controller=guard)
    return {"result": res, "decisions": Counter(split.decisions),
            "rolled_back_at": guard.rolled_back_at, "reason": guard.reason}


def rollout_cells(c: RolloutConfig, n_windows: int) -> list[tuple]:
    """Every cell, in the order the experiment reads them: the baseline on every window, then
    per candidate and window its shadow, canary shares (> 0) and rollback."""
    cells: list[tuple] = [(None, k, BASELINE, 0.0) for k in range(n_windows)]
    for cname in c.candidates:
        for k in range(n_windows):
            cells.append((cname, k, "shadow", 0.0))
            cells += [(cname, k, "canary", float(s)) for s in c.shares if s > 0]
            cells.append((cname, k, "rollback", float(c.rollback.share)))
    return cells


def _rollout_candidate(c: RolloutConfig, wls: list, slo, baseline_runs: list,
                       outs) -> tuple[dict[str, list], dict[str, Any]]:
    """Shadow, every canary share and the rollback of one candidate on every window, from
    its cells' outputs `outs` (in `rollout_cells` order)."""
    steps: dict[str, list] = {"shadow": [], **{_share_name(s): [] for s in c.shares if s > 0},
                              "rollback": []}
    sides = {k: Counter() for k in steps}
    reports, rollback_facts, shadow_clean = [], [], True
    for w, base in zip(wls, baseline_runs, strict=True):
        out = next(outs)
        res = out["result"]
        steps["shadow"].append(res)
        reports.append(out["report"])
        shadow_clean = shadow_clean and bool(
            np.array_equal(res.state, base.state) and np.array_equal(res.replica, base.replica)
            and np.array_equal(res.end_s, base.end_s, equal_nan=True))
        for s in c.shares:
            if s > 0:
                out = next(outs)
                steps[_share_name(s)].append(out["result"])
                sides[_share_name(s)].update(out["decisions"])
        out = next(outs)
        res = out["result"]
        steps["rollback"].append(res)
        sides["rollback"].update(out["decisions"])
        rolled_back_at = out["rolled_back_at"]
        t_rb = rolled_back_at if rolled_back_at is not None else math.inf
        before = w.arrival_s < t_rb
        rollback_facts.append({"rolled_back_at_s": rolled_back_at, "reason": out["reason"],
                               "before": masked_slo(res, slo, before),
                               "after": masked_slo(res, slo, ~before)})
    shadow_all = _merge_shadow(reports)
    # the shadow run is the baseline's own run: shadowing itself cannot regress the SLO
    shadow_all["identical_to_baseline_run"] = shadow_clean
    facts = {"shadow": shadow_all, "decisions_by_side": {k: dict(v) for k, v in sides.items()
                                                         if v},
             "rollback": {"share": c.rollback.share, "at_fraction": c.rollback.at_fraction,
                          "guard_max_mean_queue": c.rollback.max_mean_queue,
                          "guard_max_predicted_tpot_s": c.rollback.max_predicted_tpot_s,
                          "windows": rollback_facts}}
    return steps, facts


def run(cfg: Mapping[str, Any], run_dir: Path,
        runner: GridRunner | None = None) -> dict[str, Any]:
    """Shadow, canary shares and a rollback of each candidate policy; see the module docstring.
    Cells (`rollout_cells`): step x window x candidate, all in one `runner.map` (local loop
    by default, or Dask tasks)."""
    c = _rollout_config(cfg)
    slo = c.slo_targets()
    wls, workload = trace_workloads(c.workload, c.model)
    pools = build_pools(pool_mapping(c.pools), c.model)
    cells = rollout_cells(c, len(wls))
    shared = {"config": c, "pools": pools, "slo": slo, "workloads": wls,
              "candidates": {n: dict(cand or {}) for n, cand in c.candidates.items()}}
    outs = iter((runner or local_grid()).map(rollout_cell, cells, shared=shared,
                                             desc="rollout cells (step x window x candidate)"))
    base_runs = [next(outs)["result"] for _ in wls]
    policies = {BASELINE: pooled_summary(base_runs, slo)}
    per_rep = {BASELINE: replicate_metrics(base_runs, slo)}
    candidates: dict[str, Any] = {}
    for cname, cand in c.candidates.items():
        steps, facts = _rollout_candidate(c, wls, slo, base_runs, outs)
        gates = {}
        for k, results in steps.items():
            key = f"{cname}/{k}"
            policies[key] = pooled_summary(results, slo)
            per_rep[key] = replicate_metrics(results, slo)
            if k == "shadow":
                continue
            hard: Counter = Counter()
            for r in results:
                hard.update(_hard_violations(r))
            d = paired_diff(per_rep[key]["slo_attainment"], per_rep[BASELINE]["slo_attainment"])
            regression = bool(d["mean"] < -c.regression_threshold)
            gates[k] = {"slo_attainment_diff_vs_baseline": d,
                        "joules_per_output_token_diff_vs_baseline": paired_diff(
                            per_rep[key]["joules_per_output_token"],
                            per_rep[BASELINE]["joules_per_output_token"]),
                        "hard_constraint_violations": dict(hard),
                        "slo_regression": regression,
                        "promote": (not regression) and sum(hard.values()) == 0}
        ladder = []
        for k in ["shadow", *[_share_name(s) for s in sorted(c.shares) if s > 0]]:
            ok = facts["shadow"]["canary_ready"] if k == "shadow" else gates[k]["promote"]
            ladder.append({"step": k, "proceed": bool(ok)})
            if not ok:
                break
        candidates[cname] = {"policy": dict(cand or {}), **facts, "gates": gates,
                             "ladder": ladder,
                             "reached": ladder[-1]["step"] if ladder[-1]["proceed"] else
                             (ladder[-2]["step"] if len(ladder) > 1 else "none")}
    summary: dict[str, Any] = {
        "experiment": "rollout", "workload": workload, "policies": policies,
        "conserved": all(p["conserved"] for p in policies.values()),
        "baseline": c.baseline, "shares": list(c.shares),
        "regression_threshold": c.regression_threshold,
        "candidates": candidates,
        "replicates": len(wls),
        "ci95": {k: ci_table(v) for k, v in per_rep.items()},
    }
    summary["answer"] = " ".join(_rollout_answer(n, f, policies) for n, f in candidates.items())
    summary["reports"] = _rollout_figures(summary, per_rep, c, Path(run_dir) / "figures")
    return json_safe(summary)


def _rollout_answer(name: str, f: dict, policies: dict) -> str:
    sh = f["shadow"]
    steps = [x["step"] for x in f["ladder"]]
    stop = next((x["step"] for x in f["ladder"] if not x["proceed"]), None)
    full = f["gates"].get("canary_100%", {}).get("slo_attainment_diff_vs_baseline")
    rb = f["rollback"]["windows"]
    after = [w["after"]["slo_attainment"] for w in rb if w["after"]["requests"]]
    reasons = sorted({(w["reason"] or "").split(" at ")[0].split(":")[0] for w in rb})
    agree = sh["agreement"]
    return (f"{name}: shadow " + ("ready" if sh["canary_ready"] else "NOT ready") +
            f" ({sh['candidate_violations']} hard-constraint violations, "
            + (f"{100 * agree:.0f}% agreement" if agree is not None else "no agreement") +
            ", shadow run identical to the baseline's: "
            f"{sh['identical_to_baseline_run']}); ladder {' -> '.join(steps)} "
            + (f"stopped at {stop}" if stop else "completed") +
            (f"; at 100% SLO attainment {100 * full['mean']:+.2f} pp vs baseline"
             if full else "") +
            f"; rollback ({', '.join(reasons)}) left SLO attainment after it at "
            + (f"{100 * min(after):.1f}-{100 * max(after):.1f}%" if after else "n/a")
            + f" per window (whole rollback run {policies[f'{name}/rollback']['slo_attainment']:.4f}).")


def _merge_shadow(reports: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One shadow verdict over every window: ready only if every window is ready."""
    if not reports:
        return {"canary_ready": False, "reasons": ["no shadow run"]}
    agreement = [r.get("agreement_rate") for r in reports]
    finite = [a for a in agreement if a is not None and math.isfinite(a)]
    reasons: list[str] = []
    for r in reports:
        for x in r.get("reasons") or ():
            if x not in reasons:
                reasons.append(str(x))
    return {"canary_ready": all(bool(r.get("canary_ready")) for r in reports),
            "agreement": float(np.mean(finite)) if finite else None,
            "agreement_per_window": agreement,
            "choice_agreement_per_window": [r.get("choice_agreement") for r in reports],
            "candidate_violations": sum(int(r.get("candidate_violations") or 0) for r in reports),
            "candidate_errors": sum(int(r.get("candidate_errors") or 0) for r in reports),
            "decisions": sum(int(r.get("decisions") or 0) for r in reports),
            "reasons": reasons, "per_window": list(reports)}


def _rollout_figures(summary: dict, per_rep: dict, c: RolloutConfig,
                     out: Path) -> dict[str, str]:
    plt = pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.2))
    shares = sorted(c.shares)
    for cname, facts in summary["candidates"].items():
        for key, ax in (("slo_attainment", a), ("joules_per_output_token", b)):
            xs, ys, lo, hi = [], [], [], []
            for s in shares:
                if s == 0:
                    xs.append(0.0)
                    ys.append(0.0)
                    lo.append(0.0)
                    hi.append(0.0)
                    continue
                d = facts["gates"][_share_name(s)][f"{key}_diff_vs_baseline"]
                xs.append(100 * s)
                ys.append(d["mean"])
                lo.append(d["ci95"][0] if d["ci95"][0] is not None else d["mean"])
                hi.append(d["ci95"][1] if d["ci95"][1] is not None else d["mean"])
            line, = ax.plot(xs, ys, marker="o", label=cname)
            ax.fill_between(xs, lo, hi, alpha=0.15, color=line.get_color())
            rb = facts["gates"]["rollback"][f"{key}_diff_vs_baseline"]["mean"]
            ax.plot([100 * c.rollback.share], [rb], "x", ms=10, color=line.get_color(),
                    label=f"{cname}: rollback run")
    a.axhline(-c.regression_threshold, ls="--", color="r", lw=0.8, label="regression threshold")
    a.set_ylabel("SLO attainment - baseline (paired, 95% CI)")
    b.set_ylabel("J per output token - baseline (paired, 95% CI)")
    for ax in (a, b):
        ax.axhline(0, color="k", lw=0.5)
        ax.set_xlabel("candidate share of requests (%)")
        ax.legend(fontsize=7)
    fig.suptitle(f"Canary ladder over {c.baseline.get('kind')}: difference from the baseline "
                 "run per window")
    return {"rollout": save_figure(fig, plt, out / "rollout.png")}
