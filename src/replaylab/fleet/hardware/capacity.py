"""Replicas for a request rate: the analytic sizing rule the autoscaling policies plan with.

The fleet simulator (sim/simulator.py) is the judge; this is the planner's arithmetic on
the same `GpuProfile`. A request with prompt p and completion c stays in a
replica's batch for pf + c - 1 iterations (pf = max(1, ceil(p / chunk_tokens))
prefill iterations, then one token per iteration); an iteration with n
sequences takes dt = base_s + per_seq_s * n + per_kv_token_s * K + prefill_chunk_s * m.
Charging each sequence its share of every iteration it is in, at a full batch
of B = min(max_batch, kv_capacity / E[kv reservation]) sequences:

    work per request (replica-seconds)  w = E[pf + c - 1] * (base_s / B + per_seq_s
                                            + per_kv_token_s * E[kv reservation])
                                          + E[pf] * prefill_chunk_s
    requests/s a replica sustains at utilization u = u / w
    replicas for a rate r at utilization u = ceil(r * w / u)

`w` is modeled (it assumes the batch is full); the test suite measures it
against the simulator's saturated throughput (tests/fleet/test_fleet_autoscaling.py).

`autoscaling_profile` builds the replica profile the autoscaling experiment
uses, from the measurements read by `replaylab.fleet.hardware.profiles`: service curve
and power from ML.ENERGY v3 at the largest batch whose ITL p99 meets the SLO,
prefill cost per chunk from Splitwise's prompt-phase fit (another model on the
same GPUs: a modeled transfer, so the service part is labelled `modeled`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from replaylab.config import fail_field
from replaylab.fleet.hardware.profiles import (
    GpuProfile,
    calibrate_mlenergy,
    calibrate_splitwise,
    kv_capacity_estimate,
    measurement_file,
    mlenergy_operating_point,
)


def full_batch(profile: GpuProfile, kv_reserved_mean: float) -> int:
    """Sequences a replica holds at once: max_batch, or fewer when the KV cache binds."""
    by_kv = int(profile.kv_capacity_tokens // max(kv_reserved_mean, 1.0))
    return max(1, min(profile.max_batch, by_kv))


def work_per_request(profile: GpuProfile, prompt_tokens: np.ndarray,
                     completion_tokens: np.ndarray) -> float:
    """Mean replica-seconds one request of this token sample costs at a full batch (modeled)."""
    p = np.asarray(prompt_tokens, dtype="int64")
    c = np.maximum(np.asarray(completion_tokens, dtype="int64"), 1)
    if p.size == 0:
        raise ValueError("work_per_request: an empty token sample")
    pf = np.maximum(1, -(-p // profile.chunk_tokens))
    block = profile.kv_block_tokens
    kv = float((-(-(p + c) // block) * block).mean())
    b = full_batch(profile, kv)
    per_iter = profile.base_s / b + profile.per_seq_s + profile.per_kv_token_s * kv
    return float((pf + c - 1).mean() * per_iter + pf.mean() * profile.prefill_chunk_s)


def replicas_for_rate(rate_rps: float, work_s: float, target_util: float,
                      min_replicas: int = 1, max_replicas: int | None = None) -> int:
    """Replicas that serve `rate_rps` requests/s of `work_s` replica-seconds each at `target_util`."""
    if not (math.isfinite(rate_rps) and rate_rps >= 0):
        raise ValueError(f"rate_rps={rate_rps}: must be a finite rate >= 0")
    if not 0 < target_util <= 1:
        raise ValueError(f"target_util={target_util}: must be in (0, 1]")
    n = max(int(min_replicas), math.ceil(rate_rps * work_s / target_util - 1e-9))
    return n if max_replicas is None else min(n, int(max_replicas))


@dataclass(frozen=True)
class ProfileSpec:
    """The replica of the autoscaling experiment: one model on `num_gpus` GPUs (see module doc).

    KV capacity = num_gpus * memory_gb * 0.9 - weights_gb over kv_bytes_per_token
    (modeled; Llama-3.1-70B: 80 layers x 8 KV heads x 128 x 2 x 2 bytes = 327,680).
    `mlenergy_measurements` / `splitwise_measurements`: full downloaded files to read
    instead of the points the package ships (null: shipped; `profiles.MLENERGY_SHIPPED`).
    """

    model: str = "meta-llama/Llama-3.1-70B-Instruct"
    gpu: str = "H100"
    num_gpus: int = 4
    task: str = "lm-arena-chat"
    itl_p99_slo_ms: float = 100.0
    prefill_model: str = "llama2-70b"
    prefill_hardware: str = "h100-80gb"
    prefill_tensor_parallel: int = 4
    memory_gb: float = 80.0
    weights_gb: float = 140.0
    kv_bytes_per_token: int = 327_680
    chunk_tokens: int = 512
    cost_per_gpu_hour: float = 4.0
    mlenergy_measurements: str | None = None
    splitwise_measurements: str | None = None

    def __post_init__(self) -> None:
        c = "ProfileSpec"
        if not isinstance(self.num_gpus, int) or self.num_gpus < 1:
            fail_field(c, "num_gpus", self.num_gpus, "must be an integer >= 1")
        if not self.itl_p99_slo_ms > 0:
            fail_field(c, "itl_p99_slo_ms", self.itl_p99_slo_ms, "must be > 0")


def autoscaling_profile(spec: ProfileSpec) -> tuple[GpuProfile, dict]:
    """(profile, facts for the report) from the ML.ENERGY and Splitwise points (shipped, or
    the full files `spec` names)."""
    ml_path = spec.mlenergy_measurements and measurement_file(
        "", spec.mlenergy_measurements, key="mlenergy",
        setting="experiment.profile.mlenergy_measurements")
    sw_path = spec.splitwise_measurements and measurement_file(
        "", spec.splitwise_measurements, key="splitwise",
        setting="experiment.profile.splitwise_measurements")
    row = mlenergy_operating_point(ml_path, model=spec.model, gpu=spec.gpu,
                                   num_gpus=spec.num_gpus, task=spec.task,
                                   itl_p99_slo_ms=spec.itl_p99_slo_ms)
    batch = int(row["max_num_seqs"])
    kv = kv_capacity_estimate(spec.memory_gb, spec.weights_gb, spec.kv_bytes_per_token,
                              spec.num_gpus)
    ml = calibrate_mlenergy(ml_path, model=spec.model, gpu=spec.gpu, kv_capacity_tokens=kv,
                            task=spec.task, num_gpus=spec.num_gpus,
                            chunk_tokens=spec.chunk_tokens,
                            cost_per_gpu_hour=spec.cost_per_gpu_hour, max_batch=batch)
    sw = calibrate_splitwise(sw_path, model=spec.prefill_model, hardware=spec.prefill_hardware,
                             tensor_parallel=spec.prefill_tensor_parallel,
                             kv_capacity_tokens=kv, power_from=ml.profile,
                             chunk_tokens=spec.chunk_tokens, max_batch=batch)
    transfer = spec.prefill_model.replace("-", "").lower() not in spec.model.replace(
        "-", "").lower()
    src = (f"{ml.profile.source}, max_num_seqs={batch} (itl_p99 {row['itl_p99_ms']} ms <= "
           f"{spec.itl_p99_slo_ms}); prefill per chunk: {sw.profile.source.split(';')[0]}"
           + (" (transferred to this model: modeled)" if transfer else ""))
    prof = ml.profile.with_overrides(
        name=f"{ml.profile.name}+splitwise-prefill", prefill_chunk_s=sw.profile.prefill_chunk_s,
        service_provenance="modeled" if transfer else "calibrated", source=src)
    facts = {
        "profile": prof.name, "source": src, "gpus_per_replica": prof.gpus,
        "max_batch (measured config)": batch,
        "itl_p99_ms at that batch (measured)": float(row["itl_p99_ms"]),
        "decode_tok_per_s at that batch (measured)": float(row["output_tok_per_s"]),
        "decode_tok_per_s at that batch (calibrated fit)": round(
            batch / prof.iteration_s(batch), 1),
        "prefill_chunk_s (calibrated, Splitwise)": round(prof.prefill_chunk_s, 5),
        "kv_capacity_tokens (modeled)": prof.kv_capacity_tokens,
        "power_idle_w / nominal_w per GPU (calibrated)": [round(prof.power_idle_w, 1),
                                                          round(prof.power_nominal_w, 1)],
        "fits": {k: {kk: vv for kk, vv in f.summary().items() if isinstance(vv, int | float)}
                 for k, f in {**ml.fits, "prefill": sw.fits["prefill"]}.items()},
        "service_provenance": prof.service_provenance,
    }
    return prof, facts
