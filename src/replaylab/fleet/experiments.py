"""Fleet experiments of issue 6: `python -m evaluation experiment=<name>` for each of

    energy           least-loaded vs static efficient pool vs energy-aware, J per success and
                     per output token beside SLO, cost and capacity; again under +-20 %
                     power-model error (does the ranking hold?) (experiments_energy.py)
    hint_admission   admission without a hint / with the demand artifact's hint / with the
                     true length (experiments_hint.py)
    stale_telemetry  telemetry-aware least-loaded through a scrape outage (experiments_stale.py)
    rollout          shadow, canary shares 0/25/50/100 % and a rollback (experiments_ops.py)
    overload         arrivals at 1x, 1.5x, 2x the fleet's capacity, with and without admission
                     (experiments_overload.py)

`run_fleet_experiment(name, cfg, run_dir)` takes the plain experiment mapping (as
Hydra composes it: conf/experiment/<name>.yaml), writes figures under
`run_dir/figures` and returns the summary the entry point writes to summary.json:

    {"experiment": name, "workload": "<source, requests, scaling>",
     "policies": {"<policy>": {SUMMARY_KEYS..., "conserved": bool}, ...},
     "conserved": bool, <experiment sections>, "reports": {figure: path}}

Every policy's entry is `replaylab.fleet.outcomes.summarize` pooled over the
replicates (time windows or seeds) the experiment ran; confidence intervals are
two-sided 95 % Student-t intervals over those replicates (paired where two
policies saw the same requests). Non-finite numbers are written as null.

The policies of issue 6 (`replaylab.fleet.policies`, `telemetry_feed`, `shadow`)
are imported inside functions, by name, so this module imports cheaply.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from replaylab.config import ConfigError, from_mapping
from replaylab.stats import mean_ci

# ---------------------------------------------------------------- numbers and summaries


def pooled_summary(results: Sequence, slo: Mapping | None = None,
                   power_factor: Mapping[str, float] | None = None) -> dict[str, Any]:
    """`summarize` over several runs as if one: counts and energy summed, p99s pooled.

    One run gives exactly `summarize(run)`. power_factor: pool_id -> multiplier of
    that pool's energy (a power curve scaled by f draws f times the energy, idle
    included, for the same decisions); pools not named keep 1.
    """
    from replaylab.fleet.outcomes import SUMMARY_KEYS, met_slo
    from replaylab.fleet.profiles import weakest

    counts = {k: 0 for k in ("arrived", "completed", "rejected", "timed_out", "cancelled")}
    good = 0
    window = energy = gpu_h = cost = 0.0
    tokens = 0
    ttft, e2e, prov = [], [], []
    for r in results:
        for k, v in r.counts().items():
            counts[k] += v
        good += int(met_slo(r, slo).sum())
        w = r.workload
        window += r.end_time_s - (float(w.arrival_s[0]) if w.n else 0.0)
        energy += run_energy_j(r, power_factor)
        gpu_h += r.gpu_hours
        cost += r.cost
        tokens += int(r.output_tokens.sum())
        done = r.completed
        ttft.append(r.ttft_s[done])
        e2e.append(r.e2e_s[done])
        prov.append(r.energy_provenance)
    denom = counts["arrived"] - counts["cancelled"]

    def p99(parts: list[np.ndarray]) -> float:
        x = np.concatenate(parts) if parts else np.zeros(0)
        x = x[np.isfinite(x)]
        return float(np.quantile(x, 0.99)) if x.size else math.nan

    out = {**counts, "slo_attainment": good / denom if denom else math.nan,
           "ttft_p99_s": p99(ttft), "e2e_p99_s": p99(e2e),
           "goodput_rps": good / window if window > 0 else math.nan,
           "gpu_hours": gpu_h, "cost": cost,
           "joules_per_success": energy / counts["completed"] if counts["completed"] else math.nan,
           "joules_per_output_token": energy / tokens if tokens else math.nan,
           "energy_provenance": weakest(prov) if prov else "modeled"}
    summary = {k: out[k] for k in SUMMARY_KEYS}
    summary["conserved"] = conserved(summary)
    return summary


def run_energy_j(result, power_factor: Mapping[str, float] | None = None) -> float:
    """All energy of a run; with power_factor, each pool's energy times its factor."""
    reps = result.replicas
    if not len(reps):
        return 0.0
    if not power_factor:
        return float(reps["energy_j"].sum())
    f = reps["pool_id"].map(lambda p: float(power_factor.get(p, 1.0)))
    return float((reps["energy_j"] * f).sum())


def conserved(summary: Mapping[str, Any]) -> bool:
    """arrived = completed + rejected + timed_out + cancelled."""
    return int(summary["arrived"]) == sum(int(summary[k]) for k in
                                          ("completed", "rejected", "timed_out", "cancelled"))


def replicate_metrics(results: Sequence, slo: Mapping | None = None,
                      power_factor: Mapping[str, float] | None = None) -> dict[str, list]:
    """Per replicate: the summary numbers the experiments put intervals on."""
    keys = ("slo_attainment", "goodput_rps", "gpu_hours", "cost", "joules_per_success",
            "joules_per_output_token", "ttft_p99_s")
    rows = [pooled_summary([r], slo, power_factor) for r in results]
    out = {k: [float(s[k]) for s in rows] for k in keys}
    out["rejected_share"] = [s["rejected"] / s["arrived"] if s["arrived"] else math.nan
                             for s in rows]
    out["timed_out_share"] = [s["timed_out"] / s["arrived"] if s["arrived"] else math.nan
                              for s in rows]
    return out


def ci_table(per_rep: Mapping[str, list]) -> dict[str, dict]:
    return {k: mean_ci(v) for k, v in per_rep.items()}


# ---------------------------------------------------------------- configuration pieces


def slo_targets(spec: Mapping[str, Mapping[str, float]] | None) -> dict:
    """{class: SloTarget} from {class: {ttft_s, tpot_s, e2e_s}} (None: outcomes.DEFAULT_SLO)."""
    from replaylab.fleet.outcomes import DEFAULT_SLO, SloTarget

    if not spec:
        return dict(DEFAULT_SLO)
    out = {}
    for name, t in spec.items():
        try:
            out[str(name)] = SloTarget(**{k: (math.inf if v is None else float(v))
                                         for k, v in dict(t).items()})
        except (TypeError, ValueError) as e:
            raise ConfigError(f"experiment.slo.{name}: {e}") from e
    return out


@dataclass(frozen=True)
class PoolSpec:
    """One pool of an experiment's fleet; `source` says where its profile comes from.

    mlenergy: `calibrate_mlenergy` on energy/mlenergy_v3_measured.csv (model, gpu,
      num_gpus, task); fleetsim: FleetSim's manual profile `gpu` (modeled).
    KV capacity: kv_capacity_tokens, or kv_capacity_estimate(memory_gb, weights_gb,
    kv_bytes_per_token, num_gpus) when it is null. max_batch / cost / idle_w: null
    keeps the source's value.
    """

    source: str = "mlenergy"
    model: str = "meta-llama/Llama-3.1-8B-Instruct"
    gpu: str = "H100"
    num_gpus: int | None = None
    task: str = "lm-arena-chat"
    replicas: int = 1
    kv_capacity_tokens: int | None = None
    memory_gb: float = 80.0
    weights_gb: float = 16.0
    kv_bytes_per_token: int = 131_072   # Llama-3.1-8B: 32 layers x 8 KV heads x 128 x 2 x 2 B
    max_batch: int | None = None
    cost_per_gpu_hour: float | None = None
    idle_w: float | None = None
    cold_start_s: float = 60.0

    def __post_init__(self) -> None:
        if self.source not in ("mlenergy", "fleetsim"):
            raise ValueError(f"source={self.source!r}: must be mlenergy or fleetsim")
        if self.replicas < 0:
            raise ValueError(f"replicas={self.replicas}: must be >= 0")


def build_profile(spec: PoolSpec, shared_dir: str | Path):
    """The GpuProfile of a pool spec (see PoolSpec)."""
    from replaylab.fleet.profiles import (
        calibrate_mlenergy,
        kv_capacity_estimate,
        load_fleetsim_profiles,
    )

    shared = Path(shared_dir)
    kv = spec.kv_capacity_tokens or kv_capacity_estimate(
        spec.memory_gb, spec.weights_gb, spec.kv_bytes_per_token, spec.num_gpus or 1)
    if spec.source == "mlenergy":
        kw = {"cost_per_gpu_hour": spec.cost_per_gpu_hour} if spec.cost_per_gpu_hour else {}
        prof = calibrate_mlenergy(shared / "energy" / "mlenergy_v3_measured.csv",
                                  model=spec.model, gpu=spec.gpu, kv_capacity_tokens=kv,
                                  task=spec.task, num_gpus=spec.num_gpus,
                                  max_batch=spec.max_batch, idle_w=spec.idle_w, **kw).profile
        return prof
    profiles = load_fleetsim_profiles(shared / "fleet" / "fleetsim_gpu_profiles.json")
    if spec.gpu not in profiles:
        raise ConfigError(f"fleetsim profile {spec.gpu!r} unknown; known {sorted(profiles)}")
    prof = profiles[spec.gpu]
    changes: dict[str, Any] = {}
    if spec.kv_capacity_tokens:
        changes["kv_capacity_tokens"] = int(spec.kv_capacity_tokens)
    if spec.max_batch:
        changes["max_batch"] = int(spec.max_batch)
    if spec.cost_per_gpu_hour is not None:
        changes["cost_per_gpu_hour"] = float(spec.cost_per_gpu_hour)
    if spec.num_gpus:
        changes["gpus"] = int(spec.num_gpus)
    return prof.with_overrides(**changes) if changes else prof


def build_pools(pools: Mapping[str, Mapping], shared_dir: str | Path, model: str,
                power_factor: Mapping[str, float] | None = None) -> list:
    """PoolConfigs (in config order) serving `model`; power_factor scales a pool's power curve."""
    from replaylab.fleet.sim_fleet import PoolConfig

    out = []
    for pid, raw in pools.items():
        spec = from_mapping(PoolSpec, dict(raw or {}), f"experiment.pools.{pid}")
        prof = build_profile(spec, shared_dir)
        f = float((power_factor or {}).get(pid, 1.0))
        if f != 1.0:
            prof = scaled_power(prof, f)
        out.append(PoolConfig(str(pid), model, prof, replicas=spec.replicas,
                              cold_start_s=spec.cold_start_s))
    return out


def scaled_power(profile, factor: float):
    """The profile with its whole power curve (idle and nominal) times `factor`."""
    return profile.with_overrides(power_idle_w=profile.power_idle_w * factor,
                                  power_nominal_w=profile.power_nominal_w * factor)


def make_policy(spec: Mapping[str, Any] | str, primary: Mapping[str, str] | None = None):
    """A fresh policy from its spec: {kind, ...parameters}; kinds:

    round_robin, least_loaded, static_efficient, energy_aware (max_load_per_replica,
    hysteresis, carbon), spillover (primary: {model: pool}, max_load_per_replica),
    hint_admission (mode none|hint|perfect, kv_headroom, default_max_tokens,
    chooser: another spec). Bad kinds or parameters are a ConfigError.
    """
    spec = {"kind": spec} if isinstance(spec, str) else dict(spec)
    try:
        return _policy(dict(spec), primary)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"policy {spec}: {e}") from e


def _policy(spec: dict, primary: Mapping[str, str] | None):
    from replaylab.fleet.sim_policy import LeastLoaded, RoundRobin

    kind = spec.pop("kind", None)
    if kind == "round_robin":
        return RoundRobin()
    if kind == "least_loaded":
        return LeastLoaded()
    if kind in ("static_efficient", "energy_aware", "spillover", "hint_admission"):
        from replaylab.fleet import policies as P

        if kind == "static_efficient":
            return P.StaticEfficientPolicy(**spec)
        if kind == "energy_aware":
            return P.EnergyAwarePolicy(**spec)
        if kind == "spillover":
            return P.SpilloverPolicy(spec.pop("primary", None) or primary or {}, **spec)
        chooser = spec.pop("chooser", None)
        return P.HintAdmission(**spec, chooser=make_policy(chooser) if chooser else None)
    raise ConfigError(f"policy kind {kind!r} unknown; one of round_robin, least_loaded, "
                      "static_efficient, energy_aware, spillover, hint_admission")


# ---------------------------------------------------------------- workloads


def azure_ledger(shared_dir: str | Path, service: str = "conv") -> pd.DataFrame:
    """The Azure LLM inference trace 2023 (`conv` or `code`) as a ledger-v1 frame."""
    from replaylab.sources.azure import import_azure_llm_2023

    path = Path(shared_dir) / "traces" / "azure_llm_2023" / (
        f"AzureLLMInferenceTrace_{service}.csv")
    if not path.is_file():
        raise FileNotFoundError(f"{path}: the Azure LLM 2023 trace (paths.shared_dir)")
    return import_azure_llm_2023(path)


def ledger_windows(ledger: pd.DataFrame, windows: int, window_s: float | None = None,
                   max_requests: int | None = None) -> list[pd.DataFrame]:
    """`windows` consecutive time windows of the ledger (equal length; window_s: fixed)."""
    ts = ledger["timestamp"].to_numpy("int64")
    t0, span = int(ts.min()), int(ts.max() - ts.min()) + 1
    w_ms = int(window_s * 1000) if window_s else span // max(windows, 1)
    out = []
    for k in range(windows):
        part = ledger[(ts >= t0 + k * w_ms) & (ts < t0 + (k + 1) * w_ms)]
        if max_requests:
            part = part.sort_values("timestamp", kind="stable").head(int(max_requests))
        if len(part):
            out.append(part)
    if not out:
        raise ConfigError(f"no ledger rows in {windows} windows of {w_ms} ms")
    return out


def workload_text(source: str, n: int, note: str = "") -> str:
    return f"{source}: {n} requests" + (f"; {note}" if note else "")


# ---------------------------------------------------------------- simulation helpers


@dataclass(frozen=True)
class SimSpec:
    """SimConfig fields an experiment sets (queue length, timeouts, queueing mode)."""

    queueing: str = "replica"
    queue_capacity: int = 256
    queue_timeout_s: float | None = None   # null: none
    warm_start: bool = True
    # energy / GPU-hour window: last arrival + this (the same for every policy)
    horizon_pad_s: float = 0.0


def sim_config(spec: Mapping | None, workload, **extra):
    """SimConfig of an experiment; its energy window is common to every policy (see below).

    The window ends at the last arrival + horizon_pad_s, and no earlier than the
    latest time any request's client cancellation, deadline or queue timeout
    could fire. Reason: `SimResult.end_time_s` is the time of the last event the
    engine popped, including those events of requests that had already finished
    (popped and skipped), and which requests get them depends on the policy
    (a rejected request arms none). A horizon past all of them gives every
    policy the same window, so idle energy and GPU-hours compare fairly.
    """
    from replaylab.fleet.sim_fleet import SimConfig

    s = from_mapping(SimSpec, dict(spec or {}), "experiment.sim")
    timeout = math.inf if s.queue_timeout_s is None else float(s.queue_timeout_s)
    w = workload
    last = float(w.arrival_s[-1]) if w.n else 0.0
    horizon = last + float(s.horizon_pad_s)
    if math.isfinite(timeout):
        horizon = max(horizon, last + timeout)
    for col in (w.cancel_after_s, w.deadline_s):
        fin = np.isfinite(col)
        if fin.any():
            horizon = max(horizon, float((w.arrival_s[fin] + col[fin]).max()))
    return SimConfig(queueing=s.queueing, queue_capacity=int(s.queue_capacity),
                     queue_timeout_s=timeout, warm_start=s.warm_start,
                     horizon_s=horizon, **extra)


def simulate(pools: list, config, policy, workload, controller=None):
    from replaylab.fleet.sim import FleetSim

    return FleetSim(pools, config, policy, controller).run(workload)


def pyplot():
    """`tracking.figures.pyplot`: matplotlib on the Agg backend, imported on first use."""
    from replaylab.tracking import figures

    return figures.pyplot()


def save_figure(fig, plt, path: Path) -> str:
    """`tracking.figures.save_figure`, the path as a string (it goes into summary.json)."""
    from replaylab.tracking import figures

    return str(figures.save_figure(fig, plt, path))


# ---------------------------------------------------------------- real traces


@dataclass(frozen=True)
class TraceSpec:
    """A real ledger cut into time windows (the replicates), each compressed `time_scale`x."""

    source: str = "azure_conv"        # azure_conv | azure_code
    windows: int = 4
    window_s: float | None = None     # null: the trace's span / windows
    time_scale: float = 8.0
    max_requests: int | None = None   # per window (tests)


def _trace_ledger(shared_dir: str, source: str) -> pd.DataFrame:
    if source in ("azure_conv", "azure_code"):
        return azure_ledger(shared_dir, source.split("_", 1)[1])
    raise ConfigError(f"trace.source={source!r}: azure_conv or azure_code")


def trace_workloads(c_trace: TraceSpec, shared_dir: str, model: str) -> tuple[list, str]:
    """(workloads per window, description) of a real trace, all rows mapped to `model`."""
    from replaylab.fleet.workload import workload_from_ledger

    ledger = _trace_ledger(shared_dir, c_trace.source)
    parts = ledger_windows(ledger, c_trace.windows, c_trace.window_s, c_trace.max_requests)
    wls = [workload_from_ledger(p, model_map={m: model for m in p["selected_model"].unique()},
                                time_scale=c_trace.time_scale) for p in parts]
    n = sum(w.n for w in wls)
    skipped = sum(sum(w.skipped.values()) for w in wls)
    span = np.mean([w.duration_s for w in wls])
    desc = workload_text(
        f"Azure LLM inference trace 2023 ({c_trace.source}, ledger-v1 via "
        "replaylab.sources.azure)", n,
        f"{len(wls)} windows, arrivals compressed {c_trace.time_scale:g}x "
        f"(~{span:.0f} s simulated each), {skipped} rows skipped, all served as {model!r}")
    return wls, desc


def parse_config(cls, cfg: Mapping[str, Any], sections: Mapping[str, type]) -> Any:
    """An experiment's config dataclass from its mapping: `name` dropped, each of
    `sections` (key -> dataclass) built first (`replaylab.config.from_mapping`)."""
    values = dict(cfg)
    values.pop("name", None)
    for key, sub in sections.items():
        values[key] = from_mapping(sub, dict(values.get(key) or {}), f"experiment.{key}")
    return from_mapping(cls, values, "experiment")



# ---------------------------------------------------------------- per-request slices


def masked_slo(result, slo, mask: np.ndarray) -> dict[str, Any]:
    """SLO attainment and TTFT p99 of the requests in `mask` (cancellations left out)."""
    from replaylab.fleet.outcomes import met_slo
    from replaylab.fleet.sim_result import CANCELLED

    ok = met_slo(result, slo)
    keep = mask & (result.state != CANCELLED)
    n = int(keep.sum())
    ttft = result.ttft_s[keep & result.completed]
    ttft = ttft[np.isfinite(ttft)]
    return {"requests": n, "slo_attainment": float(ok[keep].mean()) if n else math.nan,
            "ttft_p99_s": float(np.quantile(ttft, 0.99)) if ttft.size else math.nan}


def pool_mapping(c_pools: Mapping) -> dict:
    return {str(k): dict(v or {}) for k, v in c_pools.items()}


# ---------------------------------------------------------------- dispatch


def _hint(cfg, run_dir):
    from replaylab.fleet.experiments_hint import run_hint_admission_experiment

    return run_hint_admission_experiment(cfg, run_dir)


def _stale(cfg, run_dir):
    from replaylab.fleet.experiments_stale import run_stale_telemetry_experiment

    return run_stale_telemetry_experiment(cfg, run_dir)


def _rollout(cfg, run_dir):
    from replaylab.fleet.experiments_ops import run_rollout_experiment

    return run_rollout_experiment(cfg, run_dir)


def _energy(cfg, run_dir):
    from replaylab.fleet.experiments_energy import run_energy_experiment

    return run_energy_experiment(cfg, run_dir)


def _overload(cfg, run_dir):
    from replaylab.fleet.experiments_overload import run_overload_experiment

    return run_overload_experiment(cfg, run_dir)


FLEET_EXPERIMENTS: dict[str, Callable[[Mapping[str, Any], Path], dict]] = {
    "energy": _energy, "hint_admission": _hint, "stale_telemetry": _stale,
    "rollout": _rollout, "overload": _overload}


def run_fleet_experiment(name: str, cfg: Mapping[str, Any], run_dir: Path) -> dict[str, Any]:
    """Run fleet experiment `name` with its plain config; returns the JSON-safe summary."""
    if name not in FLEET_EXPERIMENTS:
        raise ConfigError(f"fleet experiment {name!r} unknown; one of {sorted(FLEET_EXPERIMENTS)}")
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    return FLEET_EXPERIMENTS[name](cfg, Path(run_dir))
