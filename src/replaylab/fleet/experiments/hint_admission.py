"""`python -m evaluation experiment=hint_admission`: does the demand hint change fleet outcomes?

The research question: admission that reserves KV for a request by the demand
artifact's `hint_p90` (mode `hint`) instead of the prompt plus a default token
cap (mode `none`, no estimate) or the true length (`perfect`, an oracle bound):
does it materially change SLO attainment, rejections, goodput or the capacity
needed?

1. Train a demand model on the ledger `fleet.workload` names: the seeded synthetic
   ledger (source=synthetic: sessions, caps, SLO classes, `replaylab.sources.synthetic`)
   or a ledger-v1 file (ledger=PATH, or a shipped trace), with `train_demand` (the
   same session split either way), export it with
   `export_demand` to `run_dir/artifacts/demand` and load it through the runtime
   (`DemandPredictor.load`): the hints are the artifact's, never the true lengths.
2. Size: replay the CALIBRATION window through the runtime (`replay_hints`), take
   `residual_summary`'s `sizing_multiplier` (q95 of actual / hint_p90), and size the
   pool for the in-flight KV reservation each mode plans with (hint_p90 x the
   multiplier; prompt + cap; the truth), held at the ledger's own service times.
3. Evaluate on the TEST window only (never trained or calibrated on), replicated
   over independent ledger seeds (synthetic: seed 0 = the training ledger's test
   split; the others are fresh ledgers restricted to the same window) or, for a
   ledger file, over `fleet.workload.windows` consecutive time windows of its test
   window (one ledger: the capacity comparison then has no spread across ledgers),
   each replayed through the runtime so `hint_p90` comes from the artifact. Every mode runs on the same
   hint-sized fleet (SLO, rejections, goodput) and on the fleet its own rule sizes
   (capacity: replicas, GPU-hours, and the SLO that capacity buys).
4. Paired differences per replicate, mean and 95 % t-interval; a difference is
   `material` when its interval excludes zero AND its mean is at least the stated
   threshold. `answer` says it in words, including when it is not.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from replaylab.config import ConfigError, from_mapping
from replaylab.fleet.experiments.harness import (
    GridRunner,
    PoolSpec,
    SimExperimentConfig,
    build_profile,
    ci_table,
    local_grid,
    make_policy,
    pooled_summary,
    pyplot,
    replicate_metrics,
    save_figure,
    sim_config,
    simulate,
)
from replaylab.fleet.experiments.workloads import (
    WorkloadSpec,
    ledger_facts,
    ledger_windows,
    read_workload_ledger,
    require_source,
    row_cases,
    workload_facts,
    workload_text,
)
from replaylab.jsonsafe import json_safe
from replaylab.stats import mean_ci, paired_diff


@dataclass(frozen=True)
class LedgerSpec:
    """The seeds of the synthetic ledgers and the split's embargo (SplitConfig); the
    ledger itself, its time_scale and cancel_aborted are `fleet.workload`'s."""

    train_seed: int = 0
    replicate_seeds: tuple[int, ...] = (0, 101, 102, 103, 104)   # source=synthetic only
    embargo_ms: int = 300_000


@dataclass(frozen=True)
class SizingSpec:
    """Replicas = ceil(KV need / (kv capacity x target_fill)), within [min, max]."""

    multiplier_quantile: str = "q95"   # of residual_summary's sizing_multiplier
    need_quantile: float = 0.99        # of the in-flight reservation over time
    target_fill: float = 0.9
    # how long a request holds its reservation: "profile" (its iterations, prefill chunks +
    # actual completion - 1, at the profile's iteration time at reference_batch: the
    # simulated engine) or "ledger" (the ledger's recorded duration_ms)
    service_time: str = "profile"
    reference_batch: int = 64
    min_replicas: int = 1
    max_replicas: int = 64


@dataclass(frozen=True)
class HintConfig(SimExperimentConfig):
    ledger: LedgerSpec = field(default_factory=LedgerSpec)
    workload: WorkloadSpec = field(default_factory=lambda: WorkloadSpec(source="synthetic"))
    demand: dict = field(default_factory=dict)       # DemandConfig overrides
    pool: dict = field(default_factory=dict)         # a PoolSpec
    sizing: SizingSpec = field(default_factory=SizingSpec)
    default_max_tokens: int = 4096
    modes: dict = field(default_factory=dict)        # name -> policy spec (hint_admission ...)
    materiality: dict = field(default_factory=lambda: {
        "slo_attainment": 0.01, "rejected_share": 0.01, "goodput_rps_rel": 0.02,
        "replicas_rel": 0.1})


def _config(cfg: Mapping[str, Any]) -> HintConfig:
    c = HintConfig.parse(cfg)
    if not c.modes:
        raise ConfigError("experiment=hint_admission needs modes (name -> policy spec)")
    require_source(c.workload, "hint_admission", generated=("synthetic",))
    return c


# ---------------------------------------------------------------- the demand artifact


def _synthetic(c: HintConfig, seed: int):
    from replaylab.pipelines.project import LedgerInput, load_ledger

    return load_ledger(LedgerInput(synthetic=c.workload.synthetic, seed=seed))


def training_ledger(c: HintConfig):
    """(LoadedLedger to train on, the ReplayedLedger of a file or None for synthetic)."""
    if not c.workload.replays_ledger:
        return _synthetic(c, c.ledger.train_seed), None
    from replaylab.pipelines.project import LoadedLedger

    led = read_workload_ledger(c.workload, c.shared_dir)
    return LoadedLedger(led.result, origin=led.file), led


def train_and_export(c: HintConfig, run_dir: Path, loaded) -> dict[str, Any]:
    """Train on `loaded` (the training ledger), export, load through the runtime;
    facts + predictor."""
    from replaylab.artifacts.demand_export import export_demand
    from replaylab.demand import DemandConfig
    from replaylab.pipelines.demand import train_demand
    from replaylab.projection import ProjectionConfig, SplitConfig
    from replaylab.runtime.demand import DemandPredictor

    demand = from_mapping(DemandConfig, dict(c.demand), "experiment.demand")
    split = SplitConfig(embargo_ms=int(c.ledger.embargo_ms))
    dsum, run = train_demand(loaded, ProjectionConfig(), split, demand, run_dir / "demand_run")
    art = export_demand(run, dsum, run_dir / "artifacts" / "demand")
    predictor = DemandPredictor.load(art)
    if not predictor.loaded:
        raise RuntimeError(f"the exported demand artifact did not load: {predictor.reason}")
    test = dsum.get("test") or {}
    return {"loaded": loaded, "predictor": predictor, "windows": run.time_window,
            "artifact": str(art), "version": predictor.version,
            "demand_test": {"rows": test.get("rows"), "model_beats": test.get("model_beats")},
            "rows": int(len(loaded.result.valid))}


def _window(frame: pd.DataFrame, win: Mapping[str, int]) -> pd.DataFrame:
    ts = frame["timestamp"].to_numpy("int64")
    return frame[(ts >= int(win["first_ms"])) & (ts <= int(win["last_ms"]))]


# ---------------------------------------------------------------- sizing


def reservation(frame: pd.DataFrame, mode: str, multiplier: float, default_max_tokens: int,
                ) -> np.ndarray:
    """Tokens each row's admission plans to reserve under `mode` (hint: p90 x multiplier)."""
    prompt = frame["prompt_tokens"].to_numpy("float64", na_value=0.0)
    comp = frame["completion_tokens"].to_numpy("float64", na_value=np.nan)
    if mode == "none":
        return prompt + default_max_tokens
    if mode == "perfect":
        return prompt + np.where(np.isfinite(comp), np.maximum(comp, 1), default_max_tokens)
    hint = frame["hint_p90"].to_numpy("float64", na_value=np.nan)
    return np.where(np.isfinite(hint), hint * multiplier, prompt + default_max_tokens)


def service_seconds(frame: pd.DataFrame, how: str, profile, reference_batch: int,
                    ) -> np.ndarray:
    """Seconds each (past) request held its KV: by the profile's iterations or the ledger."""
    if how == "ledger":
        dur = frame["duration_ms"].to_numpy("float64", na_value=np.nan) / 1000.0
    elif how == "profile":
        p = frame["prompt_tokens"].to_numpy("float64", na_value=0.0)
        comp = frame["completion_tokens"].to_numpy("float64", na_value=np.nan)
        iters = np.maximum(1, np.ceil(p / profile.chunk_tokens)) + np.maximum(comp, 1) - 1
        n = max(1, min(int(reference_batch), profile.max_batch))
        dur = iters * profile.iteration_s(n)
    else:
        raise ConfigError(f"experiment.sizing.service_time={how!r}: profile or ledger")
    fill = np.nanmedian(dur) if np.isfinite(dur).any() else 1.0
    return np.where(np.isfinite(dur), dur, fill)


def kv_need(frame: pd.DataFrame, tokens: np.ndarray, time_scale: float, q: float,
            dur: np.ndarray) -> float:
    """Quantile over arrivals of the reservation in flight (each held for `dur` seconds)."""
    ts = frame["timestamp"].to_numpy("int64")
    start = (ts - ts.min()) / 1000.0 / time_scale
    end = start + dur
    order = np.argsort(start, kind="stable")
    start, end, tokens = start[order], end[order], tokens[order]
    # in flight at each arrival: started at or before it and not yet ended
    ev_t = np.concatenate([start, end])
    ev_v = np.concatenate([tokens, -tokens])
    o = np.lexsort((ev_v, ev_t))  # at equal times, ends (negative) first
    level = np.cumsum(ev_v[o])
    at_start = level[np.isin(o, np.arange(len(start)))]
    return float(np.quantile(at_start, q)) if at_start.size else 0.0


def size_pools(calib: pd.DataFrame, c: HintConfig, multiplier: float, profile,
               ) -> dict[str, dict[str, float]]:
    """Replicas each mode's rule asks for (from the calibration window)."""
    out = {}
    dur = service_seconds(calib, c.sizing.service_time, profile, c.sizing.reference_batch)
    for mode in ("none", "hint", "perfect"):
        tok = reservation(calib, mode, multiplier, c.default_max_tokens)
        need = kv_need(calib, tok, c.workload.time_scale, c.sizing.need_quantile, dur)
        n = math.ceil(need / (profile.kv_capacity_tokens * c.sizing.target_fill))
        out[mode] = {"kv_need_tokens": need,
                     "replicas": int(min(max(n, c.sizing.min_replicas), c.sizing.max_replicas))}
    return out


# ---------------------------------------------------------------- the experiment


def _mode_of(spec: Mapping[str, Any] | str) -> str:
    if isinstance(spec, str):
        return "none"
    return str(dict(spec).get("mode", "none"))


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
            hinted = replay_hints(_synthetic(c, int(s)).result.valid, predictor)
            # how much the sizing moves between ledgers
            other = size_pools(_window(hinted, windows["calibration"]), c, mult, profile)
            spread.append({"seed": int(s), **_by_mode(other)})
        test = _window(hinted, windows["test"])
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
    test = _window(hinted_train, windows["test"])
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

    c = _config(cfg)
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
    calib = _window(hinted_train, windows["calibration"])
    res = residual_summary(calib, group_columns=(), min_group_rows=30)
    mult_all = res["overall"]["sizing_multiplier"] or {}
    mult = float(mult_all.get(c.sizing.multiplier_quantile, 1.0))
    spec = from_mapping(PoolSpec, dict(c.pool), "experiment.pool")
    profile = build_profile(spec, c.shared_dir)
    sizing = size_pools(calib, c, mult, profile)
    fleet_replicas = sizing["hint"]["replicas"]

    # 3. the test window of every replicate (ledger seed or time window), hinted by the runtime
    replicates = (window_replicates(c, led, windows, hinted_train, sizing) if led is not None
                  else seed_replicates(c, predictor, windows, hinted_train, sizing, mult, profile))
    workloads, hint_quality = replicates["workloads"], replicates["quality"]
    sizing_spread = replicates["spread"]

    names = list(c.modes)
    own_reps = {n: sizing.get(_mode_of(c.modes[n]), sizing["hint"])["replicas"] for n in names}
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
    comparisons = _comparisons(names, c, per_rep, per_rep_own, sizing, sizing_spread)
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
    summary["answer"] = _answer(comparisons, c, sizing)
    summary["reports"] = _figures(summary, names, per_rep, run_dir / "figures")
    return json_safe(summary)


_METRICS = (("slo_attainment", "slo_attainment"), ("rejected_share", "rejected_share"),
            ("goodput_rps", "goodput_rps_rel"))


def _material(d: dict, threshold: float, relative_to: float | None = None) -> bool:
    m = d["mean"]
    if m is None or not math.isfinite(m) or not d.get("excludes_zero"):
        return False
    size = abs(m) / abs(relative_to) if relative_to else abs(m)
    return bool(size >= threshold)


def _comparisons(names: list[str], c: HintConfig, per_rep: dict, per_rep_own: dict,
                 sizing: dict, spread: list[dict]) -> dict[str, Any]:
    """hint - none and perfect - hint (same fleet; own sizing), paired per replicate."""
    by_mode = {_mode_of(c.modes[n]): n for n in names}
    pairs = [(a, b) for a, b in (("hint", "none"), ("perfect", "hint"), ("perfect", "none"))
             if a in by_mode and b in by_mode]
    out: dict[str, Any] = {}
    for a, b in pairs:
        na, nb = by_mode[a], by_mode[b]
        cell: dict[str, Any] = {"same_fleet": {}, "own_sizing": {}}
        for key, mkey in _METRICS:
            for where, table in (("same_fleet", per_rep), ("own_sizing", per_rep_own)):
                d = paired_diff(table[na][key], table[nb][key])
                base = float(np.nanmean(table[nb][key])) if key == "goodput_rps" else None
                d["threshold"] = float(c.materiality.get(mkey, 0.0))
                d["relative"] = key == "goodput_rps"
                d["material"] = _material(d, d["threshold"], base)
                cell[where][key] = d
        gh = paired_diff(per_rep_own[na]["gpu_hours"], per_rep_own[nb]["gpu_hours"])
        ra, rb = sizing[a]["replicas"], sizing[b]["replicas"]
        rel = (ra - rb) / rb if rb else math.nan
        thr = float(c.materiality.get("replicas_rel", 0.1))
        # the sizing rule applied to every replicate ledger's calibration window
        by_ledger = [(x[a] - x[b]) / x[b] for x in spread if x.get(b)]
        rel_ci = mean_ci(by_ledger)
        lo, hi = rel_ci["ci95"]
        rel_ci["excludes_zero"] = bool(lo is not None and math.isfinite(lo) and (lo > 0 or hi < 0))
        material = (_material(rel_ci, thr) if rel_ci["n"] >= 2
                    else bool(math.isfinite(rel) and abs(rel) >= thr))
        cell["capacity"] = {"replicas": {a: ra, b: rb}, "replicas_rel_diff": rel,
                            "replicas_rel_diff_by_ledger": rel_ci, "threshold": thr,
                            "material": material, "gpu_hours_diff": gh}
        out[f"{a}_vs_{b}"] = cell
    return out


def _fmt_diff(d: dict, pct: bool = True) -> str:
    lo, hi = d["ci95"]
    if not (lo is not None and math.isfinite(lo)):
        return f"{d['mean']:+.4f} (no interval)"
    if pct:
        return f"{100 * d['mean']:+.2f} pp [95% CI {100 * lo:+.2f}, {100 * hi:+.2f}]"
    return f"{d['mean']:+.3f} [95% CI {lo:+.3f}, {hi:+.3f}]"


def _answer(comparisons: dict, c: HintConfig, sizing: dict) -> str:
    cell = comparisons.get("hint_vs_none")
    if cell is None:
        return "No hint-vs-none comparison was configured (modes need mode: hint and none)."
    m = c.materiality
    sf, cap = cell["same_fleet"], cell["capacity"]
    parts = []
    slo_d, rej_d, gp_d = sf["slo_attainment"], sf["rejected_share"], sf["goodput_rps"]
    material_outcome = slo_d["material"] or rej_d["material"] or gp_d["material"]
    parts.append(
        f"On the same hint-sized fleet ({sizing['hint']['replicas']} replicas), admission with "
        f"the demand hint instead of prompt + {c.default_max_tokens}-token cap changes SLO "
        f"attainment by {_fmt_diff(slo_d)}, the rejected share by {_fmt_diff(rej_d)} and "
        f"goodput by {_fmt_diff(gp_d, pct=False)} req/s.")
    if material_outcome:
        which = [k for k, d in (("SLO attainment", slo_d), ("rejections", rej_d),
                                ("goodput", gp_d)) if d["material"]]
        parts.append(f"That is a material change in {', '.join(which)} (interval excludes zero "
                     f"and the mean exceeds the threshold: SLO {m.get('slo_attainment')}, "
                     f"rejections {m.get('rejected_share')}, goodput "
                     f"{m.get('goodput_rps_rel')} relative).")
    else:
        parts.append("That is NOT a material change in SLO or admission outcomes: no interval "
                     "both excludes zero and exceeds the stated threshold (SLO "
                     f"{m.get('slo_attainment')}, rejections {m.get('rejected_share')}, goodput "
                     f"{m.get('goodput_rps_rel')} relative).")
    rh, rn = cap["replicas"]["hint"], cap["replicas"]["none"]
    bl = cap["replicas_rel_diff_by_ledger"]
    lo, hi = bl["ci95"]
    spread = (f"; over the {bl['n']} replicate ledgers' calibration windows "
              f"{100 * bl['mean']:+.0f}% [95% CI {100 * lo:+.0f}, {100 * hi:+.0f}]"
              if bl["n"] >= 2 and lo is not None and math.isfinite(lo) else "")
    parts.append(
        f"Capacity: sizing from hint_p90 x the {c.sizing.multiplier_quantile} residual "
        f"multiplier ({sizing['hint']['kv_need_tokens'] / 1e3:.0f}k KV tokens in flight) asks "
        f"for {rh} replicas against {rn} for the cap rule "
        f"({100 * cap['replicas_rel_diff']:+.0f}%{spread}): "
        + ("a material difference in capacity" if cap["material"] else
           "not a material difference in capacity")
        + f" (threshold {100 * cap['threshold']:.0f}%).")
    own = cell["own_sizing"]["slo_attainment"]
    parts.append(f"Each rule on the fleet it sized: SLO attainment differs by {_fmt_diff(own)}"
                 + (" (material)." if own["material"] else " (not material)."))
    verdict = (f"Answer: the demand hint {'DOES' if material_outcome else 'does NOT'} "
               f"materially change SLO/admission outcomes on a given fleet, and "
               f"{'DOES' if cap['material'] else 'does NOT'} materially change the capacity "
               f"the sizing rule asks for.")
    parts.insert(0, verdict)
    pv = comparisons.get("perfect_vs_hint")
    if pv is not None:
        d = pv["same_fleet"]["slo_attainment"]
        parts.append(f"Headroom left to a perfect estimate (perfect - hint, same fleet): SLO "
                     f"{_fmt_diff(d)}.")
    return " ".join(parts)


def _figures(summary: dict, names: list[str], per_rep: dict, out: Path) -> dict[str, str]:
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    panels = (("slo_attainment", "SLO attainment"), ("rejected_share", "rejected share"),
              ("goodput_rps", "goodput (req/s)"))
    x = np.arange(len(names))
    for ax, (key, label) in zip(axes, panels, strict=True):
        means, errs = [], [[], []]
        for n in names:
            ci = summary["ci95"][n][key]
            m = ci["mean"]
            lo, hi = ci["ci95"]
            means.append(m)
            ok = lo is not None and math.isfinite(lo)
            errs[0].append(m - lo if ok else 0.0)
            errs[1].append(hi - m if ok else 0.0)
        ax.bar(x, means, yerr=errs, capsize=5, color=["#999", "#3a7", "#37a", "#a73"][:len(x)])
        for s in range(len(per_rep[names[0]][key])):
            ax.plot(x, [per_rep[n][key][s] for n in names], color="k", alpha=0.25, lw=0.8)
        ax.set_xticks(x, names)
        ax.set_ylabel(label)
    fig.suptitle(f"Admission by estimate, same fleet ({summary['sizing']['common_fleet_replicas']}"
                 f" replicas); bars: 95% CI over {summary['replicates']} replicates, lines: pairs")
    paths = {"hint_outcomes": save_figure(fig, plt, out / "hint_outcomes.png")}
    fig, ax = plt.subplots(figsize=(5.5, 4))
    modes = list(summary["sizing"]["by_mode"])
    ax.bar(modes, [summary["sizing"]["by_mode"][m]["replicas"] for m in modes],
           color=["#999", "#3a7", "#37a"])
    ax.set_ylabel("replicas sized from the calibration window")
    ax.set_title("Capacity each admission rule asks for")
    paths["hint_capacity"] = save_figure(fig, plt, out / "hint_capacity.png")
    return paths
