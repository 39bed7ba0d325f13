"""experiment=autoscaling: static, HPA and forecast-driven controllers on the fleet simulator.

`run_autoscaling_experiment(config, out_dir) -> summary` runs every scenario
(steady day, burst, mix drift, 30 % under-forecast by default) with every
policy (static, reactive HPA, forecast-driven; `forecast_no_floor`, the
forecast without its reactive floor, on request) for every seed (the replicates: arrival and token draws; all policies of a
scenario and seed see the same requests), then a target-utilization sweep of
the reactive and forecast policies on one scenario, so they are compared at
matched SLO. The summary carries per scenario and policy the mean and 95 %
t-interval over seeds (`replaylab.stats.mean_ci`) of GPU-hours, SLO
attainment, energy, oscillations and scale events, paired differences against
the reactive policy, the sweep frontier, who wins where (`report.py`,
computed from these numbers) and the figures and report.html written under
`out_dir`.

Config: `AutoscalingConfig` (frozen dataclasses, one per section);
`autoscaling_config(mapping)` builds it from a plain mapping (a composed YAML),
naming any unknown field. The (scenario, seed) jobs are the cells of a
`harness.LocalGrid` / `harness.EngineGrid` runner: with compute=local, `workers` > 1 runs them in forked processes;
with compute=dask, one Dask task each. Results do not depend on either.
"""

from __future__ import annotations

import math
import secrets
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from replaylab.config import ConfigError, from_mapping
from replaylab.fleet.control.controllers import ForecastPolicyConfig, HPAConfig
from replaylab.fleet.experiments.autoscaling.runs import (
    POLICIES,
    RunPlan,
    RunSetup,
    needed_replicas,
    simulate_policy,
)
from replaylab.fleet.experiments.autoscaling.scenarios import (
    DAY_S,
    BaseRates,
    ScenarioConfig,
    TokenSample,
    TraceConfig,
    base_rates,
    scenario_rates,
    scenario_workload,
    token_sample,
)
from replaylab.fleet.experiments.harness import ExperimentConfig, GridRunner, local_grid
from replaylab.fleet.experiments.workloads import (
    WorkloadSpec,
    ledger_facts,
    read_workload_ledger,
    require_source,
    workload_spec,
)
from replaylab.fleet.hardware.capacity import (
    ProfileSpec,
    autoscaling_profile,
    replicas_for_rate,
    work_per_request,
)
from replaylab.fleet.hardware.profiles import GpuProfile
from replaylab.fleet.sim.workload import workload_from_ledger


@dataclass(frozen=True)
class TokenSpec:
    """How request token counts are classed; where they come from is `fleet.workload`
    (a shipped trace, or the ledger-v1 file that then gives the arrivals too)."""

    long_output_threshold: int = 400


@dataclass(frozen=True)
class ScalingPoolSpec:
    """The pool being scaled and its request handling (seconds, replicas)."""

    cold_start_s: float = 180.0          # scale-up decision -> takes requests (billed meanwhile)
    min_replicas: int = 1
    max_replicas: int = 200
    queue_capacity: int = 100_000        # per replica
    queue_timeout_s: float = 600.0
    tick_s: float = 15.0                 # arrival counts are drawn per tick
    oscillation_window_s: float = 600.0
    initial_target_util: float = 0.7     # dynamic policies start at the last history rate / this


@dataclass(frozen=True)
class OutageWindow:
    """Scrapes in [start_s, end_s) fail (simulated seconds)."""

    start_s: float
    end_s: float


@dataclass(frozen=True)
class TelemetrySpec:
    scrape_interval_s: float = 15.0
    ttl_s: float = 45.0
    delay_s: float = 0.0
    outage: tuple[OutageWindow, ...] = ()


@dataclass(frozen=True)
class StaticSpec:
    quantile: float = 0.95               # of the previous days' 10-minute rates
    history_days: int = 1
    target_util: float = 0.7


@dataclass(frozen=True)
class ForecastSpec:
    forecaster: str = "naive"            # naive | seasonal_naive | moving_window | auto_ets | mstl
    season: int = 144
    window: int = 144
    quantile: float = 0.9
    target_util: float = 0.85            # work utilization the recommendations size for
    # a pipeline=forecast table (backtest.parquet) on the trace's time axis; null: the
    # forecaster above runs here on the scenario's realized rates (forecast.rates)
    table: str | None = None


@dataclass(frozen=True)
class SweepSpec:
    """Targets swept on `scenario`: reactive in batch occupancy, forecast in work utilization."""

    scenario: str = "steady"
    reactive_targets: tuple[float, ...] = (0.2, 0.3, 0.4, 0.5, 0.6)
    forecast_targets: tuple[float, ...] = (0.6, 0.7, 0.8, 0.9, 0.95)


DEFAULT_SCENARIOS: Mapping[str, ScenarioConfig] = {
    "steady": ScenarioConfig("steady"),
    "burst": ScenarioConfig("burst", factor=3.0, minutes=20.0),
    "mix_drift": ScenarioConfig("mix_drift", long_share_factor=2.0, ramp_minutes=60.0),
    "under_forecast": ScenarioConfig("forecast_error", bias=-0.3, noise_sigma=0.1),
}


@dataclass(frozen=True)
class AutoscalingConfig(ExperimentConfig):
    """The whole experiment (see the module doc); `policies` run in every scenario.
    `workload` is the shared `fleet.workload` section (requests: tokens, or a ledger);
    `seed` (the harness's `ExperimentConfig`) draws the rates: burst time, synthetic
    trace noise. Nothing is read from outside the package by default: the rates are the
    seeded synthetic diurnal (`trace.source=synthetic`), the tokens the shipped Azure
    slice, the profile the shipped ML.ENERGY and Splitwise points; `trace.source=servegen`
    needs `trace.path` (a downloaded ServeGen folder)."""

    trace: TraceConfig = field(default_factory=TraceConfig)
    tokens: TokenSpec = field(default_factory=TokenSpec)
    workload: WorkloadSpec = field(default_factory=lambda: WorkloadSpec(time_scale=1.0))
    profile: ProfileSpec = field(default_factory=ProfileSpec)
    pool: ScalingPoolSpec = field(default_factory=ScalingPoolSpec)
    telemetry: TelemetrySpec = field(default_factory=TelemetrySpec)
    # {class: {ttft_s, tpot_s, e2e_s}} as in the shared slo/ group; every request of this
    # experiment is `interactive`
    slo: dict[str, dict[str, float | None]] = field(default_factory=lambda: {
        "interactive": {"ttft_s": 2.0, "tpot_s": 0.1}})
    static: StaticSpec = field(default_factory=StaticSpec)
    reactive: HPAConfig = field(default_factory=HPAConfig)
    forecast: ForecastSpec = field(default_factory=ForecastSpec)
    forecast_policy: ForecastPolicyConfig = field(default_factory=ForecastPolicyConfig)
    scenarios: dict[str, ScenarioConfig] = field(
        default_factory=lambda: dict(DEFAULT_SCENARIOS))
    policies: tuple[str, ...] = ("static", "reactive", "forecast")  # + "forecast_no_floor"
    seeds: tuple[int, ...] = (0, 1, 2)
    sweep: SweepSpec | None = field(default_factory=SweepSpec)
    workers: int = 1

    def __post_init__(self) -> None:
        bad = [p for p in self.policies if p not in POLICIES]
        if bad:
            raise ConfigError(f"autoscaling.policies: {bad} unknown; one of {POLICIES}")
        if not self.seeds:
            raise ConfigError("autoscaling.seeds: at least one seed")
        if not self.scenarios:
            raise ConfigError("autoscaling.scenarios: name at least one scenario")
        if self.sweep is not None and self.sweep.scenario not in self.scenarios:
            raise ConfigError(f"autoscaling.sweep.scenario={self.sweep.scenario!r}: not one of "
                              f"{sorted(self.scenarios)}")


_SECTIONS = {"trace": TraceConfig, "tokens": TokenSpec, "profile": ProfileSpec,
             "pool": ScalingPoolSpec, "telemetry": TelemetrySpec,
             "static": StaticSpec, "reactive": HPAConfig, "forecast": ForecastSpec,
             "forecast_policy": ForecastPolicyConfig, "sweep": SweepSpec}


def _window(w: Any) -> OutageWindow:
    """An outage window from {start_s, end_s} or [start_s, end_s]."""
    if isinstance(w, OutageWindow):
        return w
    if isinstance(w, Mapping):
        return from_mapping(OutageWindow, dict(w), "autoscaling.telemetry.outage")
    try:
        return OutageWindow(*w)
    except TypeError as e:
        raise ConfigError(f"autoscaling.telemetry.outage: {w!r} is not [start_s, end_s]") from e


def autoscaling_config(values: Mapping[str, Any]) -> AutoscalingConfig:
    """AutoscalingConfig from a plain mapping; unknown or bad fields name themselves."""
    v = dict(values)
    v.pop("name", None)
    for key, cls in _SECTIONS.items():
        if key in v and not (key == "sweep" and v[key] is None):
            v[key] = from_mapping(cls, dict(v[key] or {}), f"autoscaling.{key}")
    tel = v.get("telemetry")
    if isinstance(tel, TelemetrySpec) and tel.outage:
        v["telemetry"] = replace(tel, outage=tuple(_window(w) for w in tel.outage))
    v["workload"] = workload_spec(v.get("workload"))
    if "scenarios" in v:
        v["scenarios"] = {str(n): from_mapping(ScenarioConfig, dict(s or {}),
                                    f"autoscaling.scenarios.{n}") for n, s in dict(v["scenarios"]).items()}
    return from_mapping(AutoscalingConfig, v, "autoscaling")


# ---------------------------------------------------------------- the shared context


@dataclass(frozen=True)
class Context:
    """Read once per experiment: profile, token sample, rates, the run setup."""

    cfg: AutoscalingConfig
    profile: GpuProfile
    capacity: dict
    tokens: TokenSample
    base: BaseRates
    setup: RunSetup
    workload: dict = field(default_factory=dict)   # the summary's `workload`


def _requests(c: AutoscalingConfig) -> tuple[TokenSample, np.ndarray | None, dict[str, Any]]:
    """(token sample, the ledger's arrivals in seconds or None, the summary's `workload`).

    `fleet.workload.ledger=PATH`: the file gives both the rates (its arrivals, compressed
    `time_scale`x, counted per bucket) and the tokens. A shipped source (azure_conv,
    azure_code) gives the tokens only; the rates are `trace`'s. Rows without usage are
    skipped and counted; capped, cancelled and failed rows keep their observed tokens
    (what they occupied: docs/design/demand-target.md), counted in `rows_censored`."""
    spec = c.workload
    require_source(spec, "autoscaling")
    led = read_workload_ledger(spec)
    frame = led.result.valid
    tokens = token_sample(frame, c.tokens.long_output_threshold,
                          f"{led.label}, measured" if led.kind != "ledger" else led.label)
    arrivals = None
    if spec.ledger:
        arrivals = workload_from_ledger(led.result, time_scale=spec.time_scale).arrival_s
    use = "arrivals (rates per bucket) and tokens" if spec.ledger else "tokens"
    facts = ledger_facts(led, [frame], {}, description=f"{led.label}: {use}",
                         requests_simulated=0, time_scale=spec.time_scale if spec.ledger
                         else None)
    return tokens, arrivals, facts


def build_context(c: AutoscalingConfig) -> Context:
    """Profile, tokens and rates (see `AutoscalingConfig`); the setup every run shares."""
    profile, facts = autoscaling_profile(c.profile)
    tokens, arrivals, workload = _requests(c)
    if arrivals is not None:
        c = replace(c, trace=replace(c.trace, source="ledger", scale=1.0))
    w = work_per_request(profile, tokens.prompt_tokens, tokens.completion_tokens)
    facts = {**facts, "token_source": tokens.source, "token_rows": int(tokens.prompt_tokens.size),
             "mean_prompt_tokens": round(float(tokens.prompt_tokens.mean()), 1),
             "mean_completion_tokens": round(float(tokens.completion_tokens.mean()), 1),
             "long_output_share": round(tokens.long_share, 4),
             "work_per_request_s (modeled)": round(w, 5),
             "requests_per_s_per_replica_at_100pct (modeled)": round(1 / w, 3)}
    p, t = c.pool, c.telemetry
    setup = RunSetup(
        profile=profile, work_s=w, cold_start_s=p.cold_start_s, min_replicas=p.min_replicas,
        max_replicas=p.max_replicas, queue_capacity=p.queue_capacity,
        queue_timeout_s=p.queue_timeout_s, horizon_s=c.trace.hours * 3600.0,
        slo=c.slo_targets(),
        reactive=c.reactive, forecast_policy=c.forecast_policy,
        forecast_quantile=c.forecast.quantile, forecast_target_util=c.forecast.target_util,
        scrape_interval_s=t.scrape_interval_s, ttl_s=t.ttl_s, delay_s=t.delay_s,
        outage=tuple((w.start_s, w.end_s) for w in t.outage),
        oscillation_window_s=p.oscillation_window_s)
    return Context(c, profile, facts, tokens, base_rates(c.trace, c.seed, arrivals), setup,
                   workload)


# ---------------------------------------------------------------- one (scenario, seed) job


def _forecast(ctx: Context, sc: ScenarioConfig, d0, seed: int):
    from replaylab.forecast import rates as fcmod

    c = ctx.cfg
    lead = c.pool.cold_start_s + c.reactive.sync_s
    counts = d0.bucket_rps * d0.bucket_seconds
    if c.forecast.table:
        end_ms = d0.day_start_ms + int(c.trace.hours * 3600 * 1000)
        fc = fcmod.read_pipeline_forecast(c.forecast.table, c.forecast.forecaster, lead_s=lead,
                                          start_ms=d0.day_start_ms, end_ms=end_ms,
                                          scale=c.trace.scale)
    else:
        horizon = 1 + math.ceil(lead / d0.bucket_seconds)
        fc = fcmod.rate_forecast(
            counts, horizon, (0.1, 0.5, 0.9), forecaster=c.forecast.forecaster,
            season=c.forecast.season, window=c.forecast.window,
            bucket_seconds=d0.bucket_seconds,
            n_eval=int((counts.index >= d0.day_start_ms).sum()))
        fc = fc[fc["bucket_start"] >= d0.day_start_ms].reset_index(drop=True)
    if sc.kind == "forecast_error":
        fc = fcmod.inject_forecast_error(fc, sc.bias, sc.noise_sigma, seed + 11)
    return fc, fcmod.pinball_and_coverage(fc, counts)


def _plan(ctx: Context, d0, fc) -> RunPlan:
    c, w = ctx.cfg, ctx.setup.work_s
    hist = d0.bucket_rps[d0.bucket_rps.index < d0.day_start_ms]
    per_day = DAY_S // d0.bucket_seconds
    rate = float(np.quantile(hist.iloc[-c.static.history_days * per_day:].to_numpy(),
                             c.static.quantile))
    p = c.pool
    static = replicas_for_rate(rate, w, c.static.target_util, p.min_replicas, p.max_replicas)
    start = replicas_for_rate(float(hist.iloc[-1]), w, p.initial_target_util, p.min_replicas,
                              p.max_replicas)
    # a fresh key per job: signatures are checked in-run only and never leave it
    return RunPlan(static, start, fc, int(d0.day_start_ms), secrets.token_bytes(32))


def run_job(ctx: Context, job: tuple) -> dict[str, Any]:
    """job = (scenario, seed, [(policy, target_util or None), ...]) -> the runs' metrics."""
    name, seed, runs = job
    c = ctx.cfg
    sc = c.scenarios[name]
    wall = time.perf_counter()
    d0 = scenario_rates(ctx.base, c.trace, sc, ctx.tokens.long_share, c.pool.tick_s, c.seed)
    wl = scenario_workload(d0, c.pool.tick_s, ctx.tokens, seed)
    needs_fc = any(p.startswith("forecast") for p, _ in runs)
    fc, quality = _forecast(ctx, sc, d0, seed) if needs_fc else (None, {})
    plan = _plan(ctx, d0, fc)
    out = {"scenario": name, "seed": seed, "requests": wl.n, "notes": d0.notes,
           "forecast_quality": quality, "static_replicas": plan.static_replicas,
           "initial_replicas": plan.initial_replicas, "runs": []}
    out["needed"] = [a.tolist() for a in needed_replicas(wl, ctx.setup.work_s)]
    for policy, target in runs:
        m = simulate_policy(ctx.setup, policy, wl, plan, target)
        out["runs"].append({"policy": policy, "target_util": target, **m})
    out["wall_s"] = round(time.perf_counter() - wall, 2)
    return out


def jobs_of(c: AutoscalingConfig) -> list[tuple]:
    """Every (scenario, seed, runs) job: the configured policies, then the sweep points."""
    jobs = [(name, seed, [(p, None) for p in c.policies]) for name in c.scenarios
            for seed in c.seeds]
    if c.sweep is not None:
        for seed in c.seeds:
            jobs.append((c.sweep.scenario, seed, [("reactive", u) for u in
                                                   c.sweep.reactive_targets]))
            jobs.append((c.sweep.scenario, seed, [("forecast", u) for u in
                                                   c.sweep.forecast_targets]))
    return jobs


def run_jobs(ctx: Context, jobs: Sequence[tuple], workers: int = 1,
             runner: GridRunner | None = None) -> list[dict]:
    """Results in job order, each job one cell of `runner` (`harness.LocalGrid` by default:
    `workers` > 1 forks that many processes; `harness.EngineGrid` on Dask: one task per job,
    the context sent to the workers once). A progress bar on stderr (tqdm; off when stderr is
    not a terminal)."""
    return (runner or local_grid()).map(run_job, jobs, shared=ctx, workers=workers,
                                        desc="autoscaling jobs (scenario x seed)")


def run(cfg: Mapping[str, Any], run_dir: Path,
        runner: GridRunner | None = None) -> dict[str, Any]:
    """The package's entry: the plain experiment mapping (with `workload`) -> the summary."""
    return run_autoscaling_experiment(autoscaling_config(cfg), run_dir, runner)


def run_autoscaling_experiment(config: AutoscalingConfig, out_dir: Path,
                               runner: GridRunner | None = None) -> dict[str, Any]:
    """Run the scenarios, policies, seeds and sweep; write figures and report.html; the summary.
    runner: how the (scenario, seed) jobs run (`run_jobs`)."""
    from replaylab.fleet.experiments.autoscaling.report import summarize_experiment, write_report

    wall = time.perf_counter()
    ctx = build_context(config)
    jobs = jobs_of(config)
    results = run_jobs(ctx, jobs, config.workers, runner)
    summary = summarize_experiment(ctx, results)
    summary["workload"] = {**ctx.workload, "requests_simulated": int(
        sum(r["requests"] * len(r["runs"]) for r in results))}
    summary["speed"] = {"wall_s": round(time.perf_counter() - wall, 1),
                        "workers": config.workers, "jobs": len(jobs),
                        "runs": sum(len(r["runs"]) for r in results),
                        "requests_simulated": int(sum(r["requests"] * len(r["runs"])
                                                      for r in results)),
                        "simulate_s_per_run": round(float(np.mean(
                            [x["wall_s"] for r in results for x in r["runs"]])), 2)}
    if runner is not None and runner.kind != "local":   # `workers` is the local pool's
        summary["speed"]["workers"] = runner.kind
    summary["reports"] = write_report(results, summary, Path(out_dir))
    return summary
