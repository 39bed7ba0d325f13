"""GPU replica profiles: service-time and power parameters, each with its provenance.

One replica (one serving engine instance on `gpus` GPUs) runs iterations of
continuous batching. With n sequences in the batch, K KV-cache tokens reserved
by them and m of them still in prefill, one iteration takes

    dt = base_s + per_seq_s * n + per_kv_token_s * K + prefill_chunk_s * m     (seconds)

A sequence in prefill consumes `chunk_tokens` prompt tokens per iteration;
decode makes one token per iteration. The batch is bounded by `max_batch`
sequences and by `kv_capacity_tokens` (a request reserves prompt + completion
tokens, rounded up to `kv_block_tokens`). Power is per GPU (curves.py).

Provenance, strongest first (STYLE.md principle 10):

- measured: read off a measurement; the points the curves are fitted to. No
  profile is wholly measured: a profile is a set of curves between the points
- calibrated: fitted to measured points (ML.ENERGY v3, Splitwise); the fit's
  residuals are kept (`CalibratedProfile.fits`)
- modeled: constants from a model or another simulator (FleetSim); FleetSim's
  constants mix per-GPU power and cost with per-instance throughput, so they
  are only ever `modeled`
- projected: extrapolated beyond what any of the above covers

Each profile carries one label per part (service, power, kv, cost); a result
inherits the weakest label of the parts it used (`weakest`).

This module is the one reader of the GPU measurements (ML.ENERGY v3,
Splitwise, FleetSim's profiles): calibrations (`calibrate_mlenergy`,
`calibrate_splitwise`), the latency-bound operating point
(`mlenergy_operating_point`) and the prompt-phase throughput
(`splitwise_prefill_tok_per_s`) all read the files here (`read_mlenergy`,
`read_splitwise`, `load_fleetsim_profiles`). Each takes `path=None`: the points
the package ships (`replaylab.data`, folder `fleet/`: the rows of the
configurations in `MLENERGY_SHIPPED` / `SPLITWISE_SHIPPED`, copied unchanged
from the full files, and FleetSim's profiles whole; provenance and license in
its README.md), or a full downloaded file named by the caller.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd

from replaylab.config import fail_field
from replaylab.data import require_public, shipped
from replaylab.fleet.hardware.curves import (
    CurveFit,
    fit_power_curve,
    fit_prefill_time,
    fit_step_time,
    fit_throughput_curve,
    power_table,
)

PROVENANCE = ("measured", "calibrated", "modeled", "projected")  # strongest first

# The measured GPU files this module reads (the one reader of GPU measurements: ML.ENERGY
# v3, Splitwise, FleetSim's manual profiles), shipped in replaylab.data/fleet: the rows of
# these configurations, copied unchanged from the full downloads (scripts/fleet_data.py),
# and the fits of the default profiles on them (FITTED_PROFILES, checked by the tests).
DATA_FOLDER = "fleet"
MLENERGY_POINTS = "mlenergy_v3_points.csv"
SPLITWISE_POINTS = "splitwise_points.csv"
FLEETSIM_PROFILES = "fleetsim_gpu_profiles.json"
FITTED_PROFILES = "fitted_profiles.json"
MLENERGY_SHIPPED = (   # (task, model, gpu, num_gpus)
    ("lm-arena-chat", "meta-llama/Llama-3.1-8B-Instruct", "H100", 1),
    ("lm-arena-chat", "meta-llama/Llama-3.1-8B-Instruct", "B200", 1),
    ("lm-arena-chat", "meta-llama/Llama-3.1-70B-Instruct", "H100", 4),
    ("lm-arena-chat", "meta-llama/Llama-3.1-70B-Instruct", "B200", 2),
    ("lm-arena-chat", "Qwen/Qwen3-8B", "H100", 1),
    ("lm-arena-chat", "Qwen/Qwen3-8B", "B200", 1),
)
SPLITWISE_SHIPPED = (  # (model, hardware, tensor_parallel)
    ("llama2-70b", "a100-80gb", 4),
    ("llama2-70b", "h100-80gb", 2),
    ("llama2-70b", "h100-80gb", 4),
)


def measurement_file(name: str, path: str | Path | None = None, *, key: str = "",
                     setting: str = "path") -> Path:
    """`path` (a full downloaded file: it must exist, else one line saying where to get
    it) or, when None, the shipped file `name` (replaylab.data, folder fleet/)."""
    if path is None:
        return shipped(DATA_FOLDER, name)
    return require_public(path, key, setting)


def _shipped_note(path: str | Path | None) -> str:
    if path is not None:
        return ""
    return ("; the shipped points hold only the configurations of MLENERGY_SHIPPED and "
            "SPLITWISE_SHIPPED (replaylab.fleet.hardware.profiles): name the full downloaded "
            "file for another")


def read_mlenergy(path: str | Path | None = None) -> pd.DataFrame:
    """ML.ENERGY v3 rows: the shipped points (None) or a full `mlenergy_v3_measured.csv`."""
    return pd.read_csv(measurement_file(MLENERGY_POINTS, path, key="mlenergy"))


def read_splitwise(path: str | Path | None = None) -> pd.DataFrame:
    """Splitwise perf rows: the shipped points (None) or a full `splitwise_perf.csv`."""
    return pd.read_csv(measurement_file(SPLITWISE_POINTS, path, key="splitwise"))


def weakest(labels) -> str:
    """The weakest provenance among `labels` (e.g. calibrated + modeled -> modeled)."""
    ranks = [PROVENANCE.index(x) for x in labels]
    return PROVENANCE[max(ranks)] if ranks else "modeled"


@dataclass(frozen=True)
class GpuProfile:
    """Service-time and power parameters of one replica; see the module docstring."""

    name: str
    gpu: str
    base_s: float                 # W: fixed cost of one iteration
    per_seq_s: float = 0.0        # per sequence in the batch
    per_kv_token_s: float = 0.0   # per KV token resident in the batch (attention ~ context)
    prefill_chunk_s: float = 0.0  # extra per sequence that is prefilling a chunk
    chunk_tokens: int = 512
    kv_block_tokens: int = 16
    kv_capacity_tokens: int = 1_048_576
    max_batch: int = 256
    gpus: int = 1
    power_idle_w: float = 300.0   # per GPU
    power_nominal_w: float = 600.0
    power_k: float = 1.0
    power_x0: float = 4.0
    cost_per_gpu_hour: float = 4.0
    service_provenance: str = "modeled"
    power_provenance: str = "modeled"
    kv_provenance: str = "modeled"
    cost_provenance: str = "modeled"
    source: str = ""

    def __post_init__(self) -> None:
        c = "GpuProfile"
        if not self.base_s > 0:
            fail_field(c, "base_s", self.base_s, "must be > 0 (an iteration takes time)")
        for name in ("per_seq_s", "per_kv_token_s", "prefill_chunk_s", "cost_per_gpu_hour"):
            if not getattr(self, name) >= 0:
                fail_field(c, name, getattr(self, name), "must be >= 0")
        for name in ("chunk_tokens", "kv_block_tokens", "kv_capacity_tokens", "max_batch", "gpus"):
            v = getattr(self, name)
            if not isinstance(v, int | np.integer) or v < 1:
                fail_field(c, name, v, "must be an integer >= 1")
        if not 0 <= self.power_idle_w <= self.power_nominal_w:
            fail_field(c, "power_idle_w", self.power_idle_w, "need 0 <= idle <= nominal")
        for name in ("service_provenance", "power_provenance", "kv_provenance", "cost_provenance"):
            if getattr(self, name) not in PROVENANCE:
                fail_field(c, name, getattr(self, name), f"must be one of {PROVENANCE}")

    def iteration_s(self, n: int, kv_tokens: int = 0, n_prefill: int = 0) -> float:
        """Seconds of one iteration with n sequences, kv_tokens reserved, n_prefill prefilling."""
        return (self.base_s + self.per_seq_s * n + self.per_kv_token_s * kv_tokens
                + self.prefill_chunk_s * n_prefill)

    def power_table(self) -> list[float]:
        """Replica watts (all its GPUs) for batch sizes 0..max_batch."""
        return power_table(self.power_idle_w, self.power_nominal_w, self.power_k, self.power_x0,
                           self.max_batch, self.gpus)

    @property
    def energy_provenance(self) -> str:
        """Energy = power x time: as strong as the weaker of the power and service models."""
        return weakest([self.power_provenance, self.service_provenance])

    def with_overrides(self, **changes) -> GpuProfile:
        """A copy with some fields changed (e.g. max_batch=1 for a one-server replica)."""
        return replace(self, **changes)


_FLEETSIM_SECTION = "manual_profiles__fleet_sim/gpu_profiles/profiles.py"


def load_fleetsim_profiles(path: str | Path | None = None) -> dict[str, GpuProfile]:
    """FleetSim's manual profiles (A100-80GB, H100-80GB, A10G), all labelled `modeled`
    (path None: the shipped `fleetsim_gpu_profiles.json`).

    FleetSim's iteration time is W + H * n * mean_seq_len / calibration_ctx,
    i.e. W + (H / calibration_ctx) * (KV tokens in the batch): per_kv_token_s =
    H / calibration_ctx. Its prefill chunks cost a decode iteration (prefill_chunk_s = 0).
    """
    raw = json.loads(measurement_file(FLEETSIM_PROFILES, path, key="fleetsim").read_text())
    out = {}
    for name, p in raw[_FLEETSIM_SECTION].items():
        if name.startswith("_"):
            continue
        out[name] = GpuProfile(
            name=f"fleetsim:{name}", gpu=name, base_s=float(p["W"]),
            per_kv_token_s=float(p["H"]) / float(p["calibration_ctx"]),
            chunk_tokens=int(p["chunk"]), kv_block_tokens=int(p["blk_size"]),
            kv_capacity_tokens=int(p["total_kv_blks"]) * int(p["blk_size"]),
            max_batch=int(p["max_slots"]), power_idle_w=float(p["power_idle_w"]),
            power_nominal_w=float(p["power_nominal_w"]), power_k=float(p["power_logistic_k"]),
            power_x0=float(p["power_logistic_x0"]), cost_per_gpu_hour=float(p["cost_per_hr"]),
            source=f"FleetSim manual profile {name} (vllm-project/semantic-router, Apache-2.0)")
    return out


@dataclass(frozen=True)
class CalibratedProfile:
    """A profile fitted to measured points, with every fit and its residuals."""

    profile: GpuProfile
    fits: dict[str, CurveFit] = field(default_factory=dict)

    def residual_summary(self) -> pd.DataFrame:
        return pd.DataFrame([f.summary() for f in self.fits.values()])


def calibrate_mlenergy(path: str | Path | None = None, *, model: str, gpu: str,
                       kv_capacity_tokens: int,
                       task: str = "lm-arena-chat", num_gpus: int | None = None,
                       chunk_tokens: int = 512, cost_per_gpu_hour: float = 4.0,
                       max_batch: int | None = None,
                       idle_w: float | None = None) -> CalibratedProfile:
    """Fit throughput and per-GPU power curves to ML.ENERGY v3 rows of one (task, model, gpu).

    Throughput n / (W + a*n) is fitted to `output_tok_per_s` at `avg_batch`;
    the logistic power curve to `power_per_gpu_W`. The KV capacity is not in the
    data: the caller states it (labelled `modeled`); so is the price.
    max_batch defaults to the largest `max_num_seqs` measured (beyond it the
    curves would be projections). The data start at batch 8, so the fitted idle
    power is an extrapolated asymptote; `idle_w` holds it at a stated value instead.
    """
    df = read_mlenergy(path)
    sel = df[(df["task"] == task) & (df["model"] == model) & (df["gpu"] == gpu)]
    if num_gpus is None and not sel.empty:
        num_gpus = int(sel["num_gpus"].min())
    sel = sel[sel["num_gpus"] == num_gpus].sort_values("avg_batch")
    if len(sel) < 4:
        raise ValueError(f"ML.ENERGY: {len(sel)} rows for task={task!r} model={model!r} "
                         f"gpu={gpu!r} num_gpus={num_gpus}; need >= 4{_shipped_note(path)}")
    src = f"ML.ENERGY leaderboard v3 (measured): {task} {model} {gpu}x{num_gpus}"
    labels = [f"max_num_seqs={int(s)}" for s in sel["max_num_seqs"]]
    tput = fit_throughput_curve(sel["avg_batch"], sel["output_tok_per_s"], source=src,
                                labels=labels)
    power = fit_power_curve(sel["avg_batch"], sel["power_per_gpu_W"], source=src, labels=labels,
                            idle_w=idle_w)
    prof = GpuProfile(
        name=f"mlenergy:{model.split('/')[-1]}:{gpu}x{num_gpus}", gpu=gpu,
        base_s=tput.params["base_s"], per_seq_s=tput.params["per_seq_s"],
        chunk_tokens=chunk_tokens, kv_capacity_tokens=int(kv_capacity_tokens),
        max_batch=int(max_batch or sel["max_num_seqs"].max()), gpus=int(num_gpus),
        power_idle_w=power.params["idle_w"], power_nominal_w=power.params["nominal_w"],
        power_k=power.params["k"], power_x0=power.params["x0"],
        cost_per_gpu_hour=cost_per_gpu_hour, service_provenance="calibrated",
        power_provenance="calibrated", source=src)
    return CalibratedProfile(prof, {"throughput": tput, "power": power})


def calibrate_splitwise(path: str | Path | None = None, *, model: str, hardware: str,
                        tensor_parallel: int,
                        kv_capacity_tokens: int, power_from: GpuProfile,
                        chunk_tokens: int = 512, max_batch: int = 64) -> CalibratedProfile:
    """Fit decode step and prefill times to Splitwise measurements of one configuration.

    Step time W + a*b + h*b*p (the KV term: p prompt tokens per sequence) is
    fitted to `token_time`; prefill p0 + beta*b*p to `prompt_time`; the chunk
    cost per prefilling sequence is beta * chunk_tokens. Medians over repeats.
    Splitwise's power columns are normalised fractions (zero for H100), so power
    and price come from `power_from` with its provenance. Rows at batch 64 whose
    prompt time falls below batch 32's are a measurement artefact and are dropped.
    """
    df = read_splitwise(path)
    sel = df[(df["model"] == model) & (df["hardware"] == hardware)
             & (df["tensor_parallel"] == tensor_parallel)]
    if sel.empty:
        raise ValueError(f"Splitwise: no rows for {model!r} {hardware!r} tp={tensor_parallel}"
                         f"{_shipped_note(path)}")
    g = (sel.groupby(["prompt_size", "batch_size", "token_size"])[["token_time", "prompt_time"]]
         .median().reset_index())
    per_tok = g["prompt_time"] / (g["prompt_size"] * g["batch_size"])
    g = g[per_tok > 0.5 * per_tok.median()]  # drops the batch-64 rows with implausible prefill
    src = f"Splitwise perf (measured, MIT): {model} {hardware} tp={tensor_parallel}"
    labels = [f"b={b},p={p},t={t}" for b, p, t in
              zip(g["batch_size"], g["prompt_size"], g["token_size"], strict=True)]
    step = fit_step_time(g["batch_size"], g["prompt_size"], g["token_time"], source=src,
                         labels=labels)
    pre = fit_prefill_time(g["batch_size"], g["prompt_size"], g["prompt_time"], source=src,
                           labels=labels)
    prof = replace(
        power_from, name=f"splitwise:{model}:{hardware}:tp{tensor_parallel}", gpu=hardware,
        base_s=step.params["base_ms"] / 1e3, per_seq_s=step.params["per_seq_ms"] / 1e3,
        per_kv_token_s=step.params["per_kv_token_ms"] / 1e3,
        prefill_chunk_s=pre.params["per_token_ms"] * chunk_tokens / 1e3,
        chunk_tokens=chunk_tokens, kv_capacity_tokens=int(kv_capacity_tokens),
        max_batch=max_batch, gpus=int(tensor_parallel), service_provenance="calibrated",
        source=f"{src}; power: {power_from.source}")
    return CalibratedProfile(prof, {"decode_step": step, "prefill": pre})


def mlenergy_operating_point(path: str | Path | None = None, *, model: str, gpu: str,
                             num_gpus: int,
                             task: str, itl_p99_slo_ms: float) -> pd.Series:
    """The ML.ENERGY v3 row (measured) of the fastest batch whose ITL p99 meets the SLO.

    Among the rows of (task, model, gpu, num_gpus), those with `itl_p99_ms` <=
    `itl_p99_slo_ms`; the one with the highest `output_tok_per_s`. Its
    `max_num_seqs` is the largest batch a latency-bound deployment would run.
    """
    df = read_mlenergy(path)
    rows = df[(df["model"] == model) & (df["gpu"] == gpu) & (df["num_gpus"] == num_gpus)
              & (df["task"] == task)]
    if rows.empty:
        raise ValueError(f"ML.ENERGY: no row for model={model!r} gpu={gpu!r} "
                         f"num_gpus={num_gpus} task={task!r}{_shipped_note(path)}")
    ok = rows[rows["itl_p99_ms"] <= itl_p99_slo_ms]
    if ok.empty:
        raise ValueError(f"ML.ENERGY: no batch of {model!r} on {num_gpus}x{gpu} meets "
                         f"itl_p99 <= {itl_p99_slo_ms} ms (lowest "
                         f"{rows['itl_p99_ms'].min()} ms)")
    return ok.loc[ok["output_tok_per_s"].idxmax()]


def splitwise_prefill_tok_per_s(path: str | Path | None = None, *, model: str, hardware: str,
                                tensor_parallel: int, min_tokens: int = 2048) -> float:
    """Prompt-phase tokens/s of a Splitwise configuration (measured), over saturated runs.

    `prompt_time` is milliseconds for the whole batch's prompt phase; runs with
    fewer than `min_tokens` prompt tokens in the batch are launch-bound and left
    out; the median per (prompt_size, batch_size) first (each is repeated), then
    a pooled ratio: sum of tokens / sum of prompt seconds.
    """
    df = read_splitwise(path)
    rows = df[(df["model"] == model) & (df["hardware"] == hardware)
              & (df["tensor_parallel"] == tensor_parallel)]
    tokens = rows["prompt_size"] * rows["batch_size"]
    sat = rows[tokens >= min_tokens]
    if sat.empty:
        raise ValueError(f"Splitwise: no saturated rows for {model}/{hardware}/tp{tensor_parallel}")
    g = sat.assign(tokens=sat["prompt_size"] * sat["batch_size"]).groupby(
        ["prompt_size", "batch_size"])[["tokens", "prompt_time"]].median()
    return float(g["tokens"].sum() / (g["prompt_time"].sum() / 1000.0))


def kv_capacity_estimate(memory_gb: float, weights_gb: float, kv_bytes_per_token: int,
                         gpus: int = 1, utilization: float = 0.9) -> int:
    """KV tokens that fit beside the weights: (gpus*mem*util - weights) / bytes per token (modeled)."""
    free = gpus * memory_gb * utilization - weights_gb
    if free <= 0:
        raise ValueError(f"weights {weights_gb} GB do not fit in {gpus} x {memory_gb} GB")
    return int(math.floor(free * 1e9 / kv_bytes_per_token))
