"""`python -m evaluation experiment=autoscaling`: static vs reactive (HPA) vs proactive.

`run_autoscaling_experiment(cfg, out_dir)` takes the plain experiment config
(a mapping, as Hydra composes it), runs every scenario with every policy on the
same arrivals, sweeps the target utilization of the reactive and proactive
policies on the frontier scenario, writes the report into `out_dir`, and
returns the summary (the entry point writes summary.json and logs it).
"""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import numpy as np

from replaylab.config import ConfigError, from_mapping
from replaylab.forecast import autoscaling_forecast as fcmod
from replaylab.forecast.autoscaling import Demand, PoolConfig, SimResult, simulate
from replaylab.forecast.autoscaling_policies import (
    HPAConfig,
    HPAPolicy,
    ProactiveConfig,
    ProactivePolicy,
    StaticPolicy,
)
from replaylab.forecast.autoscaling_scenarios import (
    DAY_S,
    BaseRates,
    ScenarioConfig,
    TraceConfig,
    base_rates,
    draw_arrivals,
    scenario_rates,
)
from replaylab.forecast.capacity import (
    TokenMix,
    azure_conv_mix,
    capacity_facts,
    measured_profile,
    mix_work_series,
    replicas_needed,
)
from replaylab.forecast.recommendation import (
    EventLog,
    RecommendationInbox,
    recommendations_from_forecast,
)

POOL = "pool-a"


@dataclass(frozen=True)
class ProfileConfig:
    model: str = "meta-llama/Llama-3.1-70B-Instruct"
    gpu: str = "H100"
    num_gpus: int = 4
    task: str = "lm-arena-chat"
    itl_p99_slo_ms: float = 100.0
    prefill_model: str = "llama2-70b"
    prefill_hardware: str = "h100-80gb"
    prefill_tensor_parallel: int = 4
    long_output_threshold: int = 400


@dataclass(frozen=True)
class StaticConfig:
    quantile: float = 0.95
    history_days: int = 1
    target_util: float = 0.7


@dataclass(frozen=True)
class ForecastConfig:
    forecaster: str = "naive"     # naive | seasonal_naive | moving_window | auto_ets | mstl
    season: int = 144
    window: int = 144
    quantile: float = 0.9         # the quantile the proactive policy provisions for
    target_util: float = 0.85     # utilization the proactive policy sizes for


@dataclass(frozen=True)
class ExperimentConfig:
    shared_dir: str
    trace: TraceConfig = field(default_factory=TraceConfig)
    profile: ProfileConfig = field(default_factory=ProfileConfig)
    pool: PoolConfig = field(default_factory=PoolConfig)
    static: StaticConfig = field(default_factory=StaticConfig)
    reactive: HPAConfig = field(default_factory=HPAConfig)
    forecast: ForecastConfig = field(default_factory=ForecastConfig)
    proactive: ProactiveConfig = field(default_factory=ProactiveConfig)
    scenarios: dict[str, ScenarioConfig] = field(default_factory=dict)
    sweep_scenario: str | None = "steady"
    sweep_target_utils: tuple[float, ...] = (0.5, 0.6, 0.7, 0.8, 0.9)
    sweep_seeds: tuple[int, ...] = (0, 1, 2)  # arrival draws averaged per sweep point
    seed: int = 0


_SECTIONS = {"trace": TraceConfig, "profile": ProfileConfig, "pool": PoolConfig,
             "static": StaticConfig, "reactive": HPAConfig, "forecast": ForecastConfig,
             "proactive": ProactiveConfig}


def experiment_config(values: dict[str, Any]) -> ExperimentConfig:
    """A typed config from the composed mapping; unknown or bad fields name themselves."""
    values = dict(values)
    values.pop("name", None)
    sweep = values.pop("sweep", {}) or {}
    kw: dict[str, Any] = {k: from_mapping(cls, values.pop(k, None), f"experiment.{k}")
                          for k, cls in _SECTIONS.items()}
    scen = values.pop("scenarios", None) or {}
    kw["scenarios"] = {
        name: from_mapping(ScenarioConfig, {**(v or {}), "policies": tuple(
            (v or {}).get("policies", ScenarioConfig.policies))}, f"experiment.scenarios.{name}")
        for name, v in scen.items()}
    kw["sweep_scenario"] = sweep.get("scenario", "steady")
    kw["sweep_target_utils"] = tuple(sweep.get("target_utils", ()))
    kw["sweep_seeds"] = tuple(sweep.get("seeds", (0,)))
    try:
        return ExperimentConfig(**kw, **values)
    except TypeError as e:
        known = sorted(f.name for f in fields(ExperimentConfig))
        raise ConfigError(f"experiment: {e}; known fields: {known}") from e


@dataclass
class _Context:
    cfg: ExperimentConfig
    profile: Any
    mix: TokenMix
    key: bytes
    base: BaseRates


def _policy(name: str, ctx: _Context, sc: ScenarioConfig, d0, forecast, events: EventLog,
            target_util: float | None = None):
    c = ctx.cfg
    tick = c.pool.tick_s
    if name == "static":
        per_day = DAY_S // d0.bucket_seconds
        hist = d0.bucket_rps[d0.bucket_rps.index < d0.day_start_ms].iloc[
            -c.static.history_days * per_day:]
        rate = float(np.quantile(hist.to_numpy(), c.static.quantile))
        return StaticPolicy(replicas_needed(rate, ctx.mix, ctx.profile, c.static.target_util))
    hpa_cfg = c.reactive if target_util is None or name.startswith("proactive") else replace(
        c.reactive, target_util=target_util)
    hpa = HPAPolicy(hpa_cfg, tick, name="reactive")
    if name == "reactive":
        return hpa
    if not name.startswith("proactive"):
        raise ConfigError(f"policy {name!r}; choose static, reactive, proactive, "
                          "proactive_no_floor")
    util = target_util or c.forecast.target_util
    lead = c.pool.cold_start_s + c.reactive.sync_s
    msgs = recommendations_from_forecast(
        forecast, pool=POOL, quantile=c.forecast.quantile, lead_s=lead, key=ctx.key,
        events=events, forecast_version=f"{forecast['forecaster'].iloc[0]}",
        replicas_for_rate=lambda r: replicas_needed(r, ctx.mix, ctx.profile, util))
    pcfg = c.proactive if name == "proactive" else replace(c.proactive, floor_util=None)
    return ProactivePolicy(pcfg, RecommendationInbox(msgs), ctx.key, POOL, hpa, events, tick,
                           name=name)


def _forecast(ctx: _Context, sc: ScenarioConfig, d0, seed: int):
    c = ctx.cfg
    lead = c.pool.cold_start_s + c.reactive.sync_s
    horizon = 1 + math.ceil(lead / d0.bucket_seconds)
    counts = d0.bucket_rps * d0.bucket_seconds
    fc = fcmod.forecast_for_experiment(
        counts, horizon, (0.1, 0.5, 0.9), forecaster=c.forecast.forecaster,
        season=c.forecast.season, window=c.forecast.window, bucket_seconds=d0.bucket_seconds,
        n_eval=int((counts.index >= d0.day_start_ms).sum()))
    fc = fc[fc["bucket_start"] >= d0.day_start_ms].reset_index(drop=True)
    if sc.kind == "forecast_error":
        fc = fcmod.inject_forecast_error(fc, sc.bias, sc.noise_sigma, seed + 11)
    quality = fcmod.pinball_and_coverage(fc, counts)
    return fc, quality


def run_scenario(ctx: _Context, name: str, sc: ScenarioConfig,
                 utils: dict[str, float] | None = None) -> dict[str, Any]:
    """Every policy of one scenario on the same arrivals -> metrics, series, events."""
    c = ctx.cfg
    d0 = scenario_rates(ctx.base, c.trace, sc, ctx.mix.shares[-1], c.pool.tick_s, c.seed)
    demand = Demand(draw_arrivals(d0.tick_rps, c.pool.tick_s, d0.tick_dispersion, c.seed + 1),
                    mix_work_series(ctx.mix, ctx.profile, d0.long_share), d0.day_start_ms)
    fc, quality = _forecast(ctx, sc, d0, c.seed)
    results: dict[str, SimResult] = {}
    events: dict[str, EventLog] = {}
    for pname in (utils or {p: None for p in sc.policies}):
        log = EventLog()
        pol = _policy(pname, ctx, sc, d0, fc, log, (utils or {}).get(pname))
        results[pname] = simulate(demand, pol, c.pool)
        events[pname] = log
    return {"results": results, "events": events, "forecast_quality": quality,
            "notes": d0.notes, "forecast": fc, "demand": demand}


def _frontier(ctx: _Context) -> dict[str, list[dict]]:
    """SLO attainment and GPU-hours of reactive and proactive per target utilization,
    each the mean over `sweep_seeds` arrival draws of the sweep scenario."""
    c = ctx.cfg
    if not c.sweep_scenario or not c.sweep_target_utils or not c.sweep_seeds:
        return {}
    sc = c.scenarios.get(c.sweep_scenario, ScenarioConfig())
    out: dict[str, list[dict]] = {"reactive": [], "proactive": []}
    for u in c.sweep_target_utils:
        runs = [run_scenario(replace(ctx, cfg=replace(c, seed=s)), c.sweep_scenario, sc,
                             {"reactive": u, "proactive": u}) for s in c.sweep_seeds]
        for p in out:
            ms = [r["results"][p].totals for r in runs]
            out[p].append({"target_util": u, "seeds": len(ms),
                           "slo_attainment": round(float(np.mean(
                               [m["slo_attainment"] for m in ms])), 6),
                           "gpu_hours": round(float(np.mean([m["gpu_hours"] for m in ms])), 3)})
    return out


def run_autoscaling_experiment(cfg: dict[str, Any], out_dir: Path) -> dict[str, Any]:
    """Run the configured scenarios and the sweep; write the report; return the summary."""
    from replaylab.forecast.autoscaling_report import verdicts, write_autoscaling_report

    c = experiment_config(cfg)
    if not c.scenarios:
        raise ConfigError("experiment.scenarios is empty: name at least one scenario")
    p = c.profile
    profile = measured_profile(c.shared_dir, model=p.model, gpu=p.gpu, num_gpus=p.num_gpus,
                               task=p.task, itl_p99_slo_ms=p.itl_p99_slo_ms,
                               prefill_model=p.prefill_model,
                               prefill_hardware=p.prefill_hardware,
                               prefill_tensor_parallel=p.prefill_tensor_parallel)
    if profile.gpus_per_replica != c.pool.gpus_per_replica:
        c = replace(c, pool=replace(c.pool, gpus_per_replica=profile.gpus_per_replica))
    mix = azure_conv_mix(c.shared_dir, p.long_output_threshold)
    # a fresh key per run: signatures are checked in-run only and never leave it
    ctx = _Context(c, profile, mix, secrets.token_bytes(32), base_rates(c.trace, c.seed))
    runs = {name: run_scenario(ctx, name, sc) for name, sc in c.scenarios.items()}
    frontier = _frontier(ctx)
    rps = ctx.base.rps
    summary: dict[str, Any] = {
        "pipeline": "autoscaling", "experiment": "autoscaling",
        "provenance": "modeled: analytic capacity from measured throughputs; fluid queue",
        "trace": {"source": c.trace.source, "day": c.trace.day, "hours": c.trace.hours,
                  "scale": c.trace.scale, "history_buckets": int(
                      (rps.index < rps.index[-1] - (DAY_S - 600) * 1000).sum()),
                  "mean_rps_day": round(float(rps.iloc[-DAY_S // 600:].mean()), 3)},
        "capacity": capacity_facts(profile, mix),
        "pool": {"tick_s": c.pool.tick_s, "cold_start_s": c.pool.cold_start_s,
                 "slo_wait_s": c.pool.slo_wait_s, "timeout_s": c.pool.timeout_s,
                 "gpus_per_replica": c.pool.gpus_per_replica},
        "scenarios": {n: {pn: r.totals for pn, r in run["results"].items()}
                      for n, run in runs.items()},
        "scenario_notes": {n: run["notes"] for n, run in runs.items()},
        "forecast_quality": {n: run["forecast_quality"] for n, run in runs.items()},
        "events": {n: {pn: log.counts() for pn, log in run["events"].items()
                       if pn.startswith("proactive")} for n, run in runs.items()},
        "frontier": frontier,
        "policy_settings": {"static_quantile": c.static.quantile,
                            "static_target_util": c.static.target_util,
                            "reactive_target_util": c.reactive.target_util,
                            "proactive_target_util": c.forecast.target_util,
                            "proactive_quantile": c.forecast.quantile,
                            "proactive_floor_util": c.proactive.floor_util,
                            "forecaster": c.forecast.forecaster},
    }
    summary["verdicts"], summary["target"] = verdicts(summary)
    summary["reports"] = write_autoscaling_report(runs, summary, c.pool.tick_s, Path(out_dir))
    return summary
