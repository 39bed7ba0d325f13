"""The harness every fleet experiment runs on; it knows no experiment by name.

Shared pieces only: pooled summaries and replicate statistics, the pools (`PoolSpec`,
`build_pools`), the policy factory (`make_policy`), the simulator's config
(`SimSpec`, `sim_config`), SLO targets, per-request slices, figure helpers and the
parsing of an experiment's plain mapping into its config dataclass (`parse_config`,
which also builds the shared `fleet.workload` section: `workloads.WorkloadSpec`), and
the one home of every experiment's fan-out: its grid of (policy x window/load x seed)
cells, run in a loop here (`LocalGrid`, compute=local) or as Dask tasks (`DaskGrid`,
compute=dask), with the same results (see "the grid of cells" below).
The workloads themselves (ledger files, the shipped traces, token CDFs) are loaded
by `workloads.py`, the other half of the harness.

Every policy's entry in a summary is `replaylab.fleet.sim.outcomes.summarize` pooled
over the replicates (time windows or seeds) the experiment ran; confidence
intervals are two-sided 95 % Student-t intervals over those replicates (paired
where two policies saw the same requests). Non-finite numbers are written as null.

The policies (`replaylab.fleet.policies`, `telemetry.feed`, `control.shadow`) are imported
inside functions, by name, so this module imports cheaply.
"""

from __future__ import annotations

import math
import typing
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, is_dataclass, replace
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from replaylab.config import ConfigError, from_mapping
from replaylab.fleet.experiments.workloads import WorkloadSpec, workload_spec
from replaylab.stats import mean_ci

# ---------------------------------------------------------------- numbers and summaries


def pooled_summary(results: Sequence, slo: Mapping | None = None,
                   power_factor: Mapping[str, float] | None = None) -> dict[str, Any]:
    """`summarize` over several runs as if one: counts and energy summed, p99s pooled.

    One run gives exactly `summarize(run)`. power_factor: pool_id -> multiplier of
    that pool's energy (a power curve scaled by f draws f times the energy, idle
    included, for the same decisions); pools not named keep 1.
    """
    from replaylab.fleet.hardware.profiles import weakest
    from replaylab.fleet.sim.outcomes import SUMMARY_KEYS, met_slo

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
    from replaylab.fleet.sim.outcomes import DEFAULT_SLO, SloTarget

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
    from replaylab.fleet.hardware.profiles import (
        FLEETSIM_PROFILES_FILE,
        MLENERGY_FILE,
        calibrate_mlenergy,
        kv_capacity_estimate,
        load_fleetsim_profiles,
    )

    shared = Path(shared_dir)
    kv = spec.kv_capacity_tokens or kv_capacity_estimate(
        spec.memory_gb, spec.weights_gb, spec.kv_bytes_per_token, spec.num_gpus or 1)
    if spec.source == "mlenergy":
        kw = {"cost_per_gpu_hour": spec.cost_per_gpu_hour} if spec.cost_per_gpu_hour else {}
        prof = calibrate_mlenergy(shared / MLENERGY_FILE,
                                  model=spec.model, gpu=spec.gpu, kv_capacity_tokens=kv,
                                  task=spec.task, num_gpus=spec.num_gpus,
                                  max_batch=spec.max_batch, idle_w=spec.idle_w, **kw).profile
        return prof
    profiles = load_fleetsim_profiles(shared / FLEETSIM_PROFILES_FILE)
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
    from replaylab.fleet.sim.fleet import PoolConfig

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
    Dask message (the cells of a `DaskGrid`) can carry such arrays: the buffers
    lie at arbitrary offsets of one frame. The values are unchanged."""
    bad = {}
    for f in fields(workload):
        v = getattr(workload, f.name)
        if isinstance(v, np.ndarray) and not (v.flags.aligned and v.flags.c_contiguous):
            bad[f.name] = np.require(v, requirements=("A", "C"))
    return replace(workload, **bad) if bad else workload


def pyplot():
    """`tracking.figures.pyplot`: matplotlib on the Agg backend, imported on first use."""
    from replaylab.tracking import figures

    return figures.pyplot()


def save_figure(fig, plt, path: Path) -> str:
    """`tracking.figures.save_figure`, the path as a string (it goes into summary.json)."""
    from replaylab.tracking import figures

    return str(figures.save_figure(fig, plt, path))


@dataclass(frozen=True, kw_only=True)
class ExperimentConfig:
    """What every fleet experiment's config has; its YAML is conf/experiment/base/fleet.yaml,
    which each conf/experiment/<name>.yaml lists in its defaults.

    shared_dir  the shared data folder (`paths.shared_dir`): profiles, traces, token CDFs
    seed        the entry point's `seed`
    workload    the shared `fleet.workload` section (`workloads.WorkloadSpec`), what is replayed
    slo         {class: {ttft_s, tpot_s, e2e_s}}, the shared slo/ group (`slo_targets`)

    Each experiment's config extends it (or `SimExperimentConfig`) with its own sections
    and is read from its plain mapping by `parse` (`parse_config`).
    """

    shared_dir: str
    seed: int = 0
    workload: WorkloadSpec = field(default_factory=WorkloadSpec)   # fleet.workload
    slo: dict = field(default_factory=dict)

    @classmethod
    def parse(cls, cfg: Mapping[str, Any]) -> Any:
        """The config from the experiment's composed mapping (see `parse_config`)."""
        return parse_config(cls, cfg)

    def slo_targets(self) -> dict:
        """{class: SloTarget} of `slo` (`slo_targets`)."""
        return slo_targets(self.slo)


@dataclass(frozen=True, kw_only=True)
class SimExperimentConfig(ExperimentConfig):
    """An experiment that simulates a fleet it configures (every one but autoscaling, which
    sizes one pool from its own profile); conf/experiment/base/simulated.yaml.

    model  the model every request is served by (the pools' `PoolConfig.model`)
    sim    the simulator's section, a `SimSpec` mapping (`sim_config`)
    """

    model: str = "llama-3.1-8b"
    sim: dict = field(default_factory=dict)


def _dataclass_section(hint: Any) -> type | None:
    """The dataclass a config field holds (`X` or `X | None`), else None."""
    args = [a for a in typing.get_args(hint) if a is not type(None)] or [hint]
    one = args[0] if len(args) == 1 else None
    return one if isinstance(one, type) and is_dataclass(one) else None


def parse_config(cls, cfg: Mapping[str, Any]) -> Any:
    """An experiment's config dataclass from its mapping: `name` dropped, `workload` (the
    shared `fleet.workload` section) as a `WorkloadSpec`, and every other field typed as a
    dataclass (a section such as `rollback: RollbackSpec`) built from its mapping first
    (`replaylab.config.from_mapping`, errors named `experiment.<section>`)."""
    values = dict(cfg)
    values.pop("name", None)
    hints = typing.get_type_hints(cls)
    for f in fields(cls):
        sub = _dataclass_section(hints.get(f.name))
        if f.name == "workload" or sub is None:
            continue
        if f.name in values and values[f.name] is None and sub is not hints[f.name]:
            continue   # an optional section left out
        values[f.name] = from_mapping(sub, dict(values.get(f.name) or {}),
                                      f"experiment.{f.name}")
    if "workload" in {f.name for f in fields(cls)}:
        values["workload"] = workload_spec(values.get("workload"))
    return from_mapping(cls, values, "experiment")


# ---------------------------------------------------------------- per-request slices


def masked_slo(result, slo, mask: np.ndarray) -> dict[str, Any]:
    """SLO attainment and TTFT p99 of the requests in `mask` (cancellations left out)."""
    from replaylab.fleet.sim.outcomes import met_slo
    from replaylab.fleet.sim.result import CANCELLED

    ok = met_slo(result, slo)
    keep = mask & (result.state != CANCELLED)
    n = int(keep.sum())
    ttft = result.ttft_s[keep & result.completed]
    ttft = ttft[np.isfinite(ttft)]
    return {"requests": n, "slo_attainment": float(ok[keep].mean()) if n else math.nan,
            "ttft_p99_s": float(np.quantile(ttft, 0.99)) if ttft.size else math.nan}


def pool_mapping(c_pools: Mapping) -> dict:
    return {str(k): dict(v or {}) for k, v in c_pools.items()}


# ---------------------------------------------------------------- the grid of cells
#
# The one home of a fleet experiment's fan-out: its grid of cells, run here or on Dask.
#
# An experiment lists its cells (a (policy, window or load, seed) combination, in the
# order it aggregates them) and a top-level, picklable `fn(shared, cell) -> result`
# that runs one cell: one simulation (or a few that belong together) and its picklable
# outcome: the SimResult (the pooled p99s and the per-window slices need its per-request
# arrays) and the few facts the experiment aggregates. `shared` is what every cell reads
# (pools, workloads, specs): it is handed to each call locally and sent to the Dask
# workers once (scattered).
#
#     runner.map(fn, cells, shared=..., desc="overload cells")   # results in cell order
#
# `LocalGrid` (compute=local, the default) runs the cells in a plain loop, in order, in
# this process (or, with `workers` > 1, in that many forked processes, as
# `autoscaling.workers` asks); `DaskGrid` (compute=dask) submits one task per cell to a
# `dask.distributed.Client` and gathers the results in cell order. No cell reads random
# state another cell left behind: every simulation is seeded by its own cell's data (the
# workload was drawn with its own seed; the simulator and the policies are
# deterministic), so the results are identical however and wherever the cells run.
#
# Both show a progress bar on stderr (tqdm, off when stderr is not a terminal): over the
# cells locally, over completed tasks on Dask.


class GridRunner(Protocol):
    """How a fleet experiment's cells run: `map(fn, cells, shared=, desc=, workers=)`."""

    kind: str

    def map(self, fn: Callable[[Any, Any], Any], cells: Sequence, *, shared: Any = None,
            desc: str = "cells", workers: int = 1) -> list:
        """[fn(shared, cell) for cell in cells], however they run; the order is the cells'."""
        ...


def progress_bar(total: int, desc: str):
    """tqdm on stderr (as the rest of replaylab); disabled when stderr is not a terminal."""
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="cell", disable=None)


def call_cell(fn: Callable[[Any, Any], Any], shared: Any, cell: Any) -> Any:
    """One cell: fn(shared, cell). Top level, so a process pool can pickle it."""
    return fn(shared, cell)


@dataclass(frozen=True)
class LocalGrid:
    """The cells in this process, in order (compute=local); `workers` > 1 (autoscaling's
    own option) runs them in that many forked processes, results still in cell order."""

    progress: bool = True
    kind: str = "local"

    def map(self, fn: Callable[[Any, Any], Any], cells: Sequence, *, shared: Any = None,
            desc: str = "cells", workers: int = 1) -> list:
        cells = list(cells)
        bar = progress_bar(len(cells), desc) if self.progress else None
        try:
            if workers <= 1 or len(cells) <= 1:
                out = []
                for cell in cells:
                    out.append(fn(shared, cell))
                    if bar is not None:
                        bar.update()
                return out
            from concurrent.futures import ProcessPoolExecutor
            from functools import partial
            from multiprocessing import get_context

            with ProcessPoolExecutor(min(workers, len(cells)),
                                     mp_context=get_context("fork")) as ex:
                out = []
                for r in ex.map(partial(call_cell, fn, shared), cells):
                    out.append(r)
                    if bar is not None:
                        bar.update()
                return out
        finally:
            if bar is not None:
                bar.close()


@dataclass(frozen=True)
class DaskGrid:
    """One Dask task per cell on `client` (compute=dask); `shared` is scattered to every
    worker once; the results are gathered in cell order (a failed cell raises its error)."""

    client: Any
    progress: bool = True
    kind: str = "dask"

    def map(self, fn: Callable[[Any, Any], Any], cells: Sequence, *, shared: Any = None,
            desc: str = "cells", workers: int = 1) -> list:
        from dask.distributed import as_completed

        cells = list(cells)
        if not cells:
            return []
        # a one-element list: scatter sends the object itself, not its items
        [shared_f] = self.client.scatter([shared], broadcast=True, hash=False)
        tag = f"{desc.split()[0]}-{uuid.uuid4().hex[:8]}"
        futures = [self.client.submit(call_cell, fn, shared_f, cell, key=f"{tag}-{i}",
                                      pure=False) for i, cell in enumerate(cells)]
        try:
            if self.progress:
                bar = progress_bar(len(futures), desc)
                try:
                    for _ in as_completed(futures):
                        bar.update()
                finally:
                    bar.close()
            return self.client.gather(futures)
        finally:
            for f in futures:
                f.release()
            shared_f.release()


def local_grid() -> LocalGrid:
    """The default runner: today's loop."""
    return LocalGrid()
