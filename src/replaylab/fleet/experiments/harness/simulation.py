"""What an experiment simulates: its pools (`PoolSpec`, `build_pools`), its policies
(`make_policy`, and the check of hint-admitting policies against the workload), the
simulator's config (`SimSpec`, `sim_config`) and one run (`simulate`). Part of the
harness (`harness/__init__.py`).

The policies (`replaylab.fleet.policies`) and the simulator are imported inside
functions, by name, so this module imports cheaply.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np

from replaylab.config import ConfigError, from_mapping

# ---------------------------------------------------------------- pools


@dataclass(frozen=True)
class PoolSpec:
    """One pool of an experiment's fleet; `source` says where its profile comes from.

    mlenergy: `calibrate_mlenergy` on the ML.ENERGY v3 points the package ships (model,
      gpu, num_gpus, task; `measurements`: a full downloaded mlenergy_v3_measured.csv
      instead, for a configuration not shipped); fleetsim: FleetSim's manual profile `gpu`
      (modeled, shipped whole).
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
    measurements: str | None = None     # mlenergy: a full ML.ENERGY v3 CSV (null: shipped)

    def __post_init__(self) -> None:
        if self.source not in ("mlenergy", "fleetsim"):
            raise ValueError(f"source={self.source!r}: must be mlenergy or fleetsim")
        if self.replicas < 0:
            raise ValueError(f"replicas={self.replicas}: must be >= 0")


def build_profile(spec: PoolSpec, section: str = "experiment.pool"):
    """The GpuProfile of a pool spec (see PoolSpec); `section` names it in errors."""
    from replaylab.fleet.hardware.profiles import (
        calibrate_mlenergy,
        kv_capacity_estimate,
        load_fleetsim_profiles,
        measurement_file,
    )

    kv = spec.kv_capacity_tokens or kv_capacity_estimate(
        spec.memory_gb, spec.weights_gb, spec.kv_bytes_per_token, spec.num_gpus or 1)
    if spec.source == "mlenergy":
        kw = {"cost_per_gpu_hour": spec.cost_per_gpu_hour} if spec.cost_per_gpu_hour else {}
        path = spec.measurements and measurement_file(
            "", spec.measurements, key="mlenergy", setting=f"{section}.measurements")
        try:
            return calibrate_mlenergy(path, model=spec.model, gpu=spec.gpu,
                                      kv_capacity_tokens=kv, task=spec.task,
                                      num_gpus=spec.num_gpus, max_batch=spec.max_batch,
                                      idle_w=spec.idle_w, **kw).profile
        except ValueError as e:
            raise ConfigError(str(e)) from e
    profiles = load_fleetsim_profiles()
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


def build_pools(pools: Mapping[str, Mapping], model: str,
                power_factor: Mapping[str, float] | None = None) -> list:
    """PoolConfigs (in config order) serving `model`; power_factor scales a pool's power curve."""
    from replaylab.fleet.sim.fleet import PoolConfig

    out = []
    for pid, raw in pools.items():
        spec = from_mapping(PoolSpec, dict(raw or {}), f"experiment.pools.{pid}")
        prof = build_profile(spec, f"experiment.pools.{pid}")
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


def pool_mapping(c_pools: Mapping) -> dict:
    return {str(k): dict(v or {}) for k, v in c_pools.items()}


# ---------------------------------------------------------------- policies


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
    from replaylab.fleet.policies.reference import LeastLoaded, RoundRobin

    kind = spec.pop("kind", None)
    if kind == "round_robin":
        return RoundRobin()
    if kind == "least_loaded":
        return LeastLoaded()
    if kind in ("static_efficient", "energy_aware", "spillover", "hint_admission"):
        from replaylab.fleet.policies.admission import HintAdmission
        from replaylab.fleet.policies.energy import EnergyAwarePolicy, StaticEfficientPolicy
        from replaylab.fleet.policies.spillover import SpilloverPolicy

        if kind == "static_efficient":
            return StaticEfficientPolicy(**spec)
        if kind == "energy_aware":
            return EnergyAwarePolicy(**spec)
        if kind == "spillover":
            return SpilloverPolicy(spec.pop("primary", None) or primary or {}, **spec)
        chooser = spec.pop("chooser", None)
        return HintAdmission(**spec, chooser=make_policy(chooser) if chooser else None)
    raise ConfigError(f"policy kind {kind!r} unknown; one of round_robin, least_loaded, "
                      "static_efficient, energy_aware, spillover, hint_admission")


def needs_hint(spec: Mapping[str, Any] | str) -> bool:
    """A policy spec that admits by the demand hint: kind hint_admission in mode hint (the
    default mode). Without any `hint_p90` it would admit exactly as mode none does."""
    spec = {"kind": spec} if isinstance(spec, str) else dict(spec or {})
    return spec.get("kind") == "hint_admission" and spec.get("mode", "hint") == "hint"


def has_hints(workloads: Sequence) -> bool:
    """Whether any request of `workloads` carries a demand hint (a finite `hint_p90`)."""
    return any(bool(np.isfinite(w.hint_p90).any()) for w in workloads)


def hint_policy_check(policies: Mapping[str, Any], hinted: bool, experiment: str,
                      why: str) -> tuple[dict[str, Any], dict[str, str]]:
    """(the policies to run, {skipped policy: reason}) for a workload with or without hints.

    A policy that admits by the hint (`needs_hint`) on a workload without one
    (`hinted` False; `why` says what the workload lacks) would silently behave like
    admission by the default max_tokens cap, so it is not run: with other policies
    beside it, it is skipped and reported; when it is all that was asked for, the
    request is refused (ConfigError, one line at the entry point).
    """
    if hinted:
        return dict(policies), {}
    skip = [n for n, spec in policies.items() if needs_hint(spec)]
    if not skip:
        return dict(policies), {}
    reason = (f"admits by hint_p90 and {why}: it would admit exactly like "
              "mode none (the default max_tokens cap)")
    if len(skip) == len(policies):
        raise ConfigError(f"experiment={experiment}: policy {', '.join(skip)} {reason}; give "
                          "the workload hints (a ledger with hint_p90, or "
                          "fleet.workload.hint_sigma for source=cdf) or ask for another policy")
    return ({n: s for n, s in policies.items() if n not in skip},
            dict.fromkeys(skip, f"skipped: {reason}"))


# ---------------------------------------------------------------- the simulator


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
    from replaylab.fleet.sim.fleet import SimConfig

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
    from replaylab.fleet.sim.simulator import FleetSim

    return FleetSim(pools, config, policy, controller).run(aligned_workload(workload))


def aligned_workload(workload):
    """`workload` itself, or a copy whose arrays are all aligned and C-contiguous.

    The simulator reads the arrays through memoryviews, which cannot index an unaligned
    array (numpy then reports the buffer format `=d`). A workload unpickled from a
    Dask message (the cells of an `EngineGrid` on Dask) can carry such arrays: the buffers
    lie at arbitrary offsets of one frame. The values are unchanged."""
    bad = {}
    for f in fields(workload):
        v = getattr(workload, f.name)
        if isinstance(v, np.ndarray) and not (v.flags.aligned and v.flags.c_contiguous):
            bad[f.name] = np.require(v, requirements=("A", "C"))
    return replace(workload, **bad) if bad else workload

