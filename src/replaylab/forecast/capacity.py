"""LEGACY: the analytic capacity of the fluid autoscaling experiment (forecast/experiments.py).

Kept only until `python -m evaluation experiment=autoscaling` is rewired to
`replaylab.fleet.autoscaling_experiment`, which runs on the event-driven fleet
simulator (replaylab.fleet.sim) and sizes replicas with
`replaylab.fleet.capacity` from a calibrated `GpuProfile`; then this module goes.
The measurements are read by `replaylab.fleet.profiles` (the one reader).
The fluid experiment turns forecast quantiles into replica counts with this
first-order model:

    replica-seconds per request  w = prompt_tokens / prefill_tok_per_s
                                   + output_tokens / decode_tok_per_s
    requests/s one replica sustains at utilization u  = u / E[w]

- `decode_tok_per_s` (measured): ML.ENERGY leaderboard v3 output tokens/s of one
  serving configuration (task, model, GPU, GPUs per replica), at the largest
  measured batch whose inter-token latency p99 meets `itl_p99_slo_ms`.
- `prefill_tok_per_s` (measured): Splitwise prompt-phase throughput
  (sum of batch x prompt tokens / sum of prompt time) for the closest
  configuration in `splitwise_perf.csv` (Llama-2-70B on H100; a *modeled*
  transfer when the ML.ENERGY model differs).
- Additive prefill + decode is *modeled* and conservative: it charges prefill
  as if it never overlapped decode (chunked prefill overlaps partly), and the
  ML.ENERGY output rate already includes that task's own short prompts.

Every number carries a provenance label: `measured` (read from a file),
`modeled` (derived here by an assumption), never bare.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from replaylab.fleet.profiles import mlenergy_operating_point, splitwise_prefill_tok_per_s

MLENERGY_FILE = "energy/mlenergy_v3_measured.csv"
SPLITWISE_FILE = "energy/splitwise_perf.csv"


@dataclass(frozen=True)
class ReplicaProfile:
    """Throughput of one replica (all of its GPUs together) and where it comes from."""

    name: str
    gpus_per_replica: int
    decode_tok_per_s: float   # output tokens/s at the chosen batch (measured)
    prefill_tok_per_s: float  # prompt tokens/s in the prompt phase (measured)
    batch: int                # max_num_seqs of the chosen ML.ENERGY row
    itl_p99_ms: float         # measured inter-token latency p99 at that batch
    provenance: str           # "measured" inputs; the combination is "modeled"
    source: str               # file(s) and row selection, for the report

    def __post_init__(self) -> None:
        if self.gpus_per_replica < 1:
            raise ValueError(f"gpus_per_replica={self.gpus_per_replica}; must be >= 1")
        if not (self.decode_tok_per_s > 0 and self.prefill_tok_per_s > 0):
            raise ValueError(f"{self.name}: throughputs must be > 0 "
                             f"({self.decode_tok_per_s}, {self.prefill_tok_per_s})")


@dataclass(frozen=True)
class Archetype:
    """Mean tokens per request of one workload archetype (a length band)."""

    name: str
    prompt_tokens: float
    output_tokens: float


@dataclass(frozen=True)
class TokenMix:
    """Shares of archetypes in the request stream (shares sum to 1)."""

    archetypes: tuple[Archetype, ...]
    shares: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.archetypes) != len(self.shares) or not self.archetypes:
            raise ValueError("TokenMix: one share per archetype, at least one")
        if any(s < 0 for s in self.shares) or not math.isclose(sum(self.shares), 1.0,
                                                                abs_tol=1e-6):
            raise ValueError(f"TokenMix: shares {self.shares} must be >= 0 and sum to 1")

    def with_share(self, name: str, share: float) -> TokenMix:
        """The same archetypes with `name` at `share`; the others rescaled to fill 1."""
        i = [a.name for a in self.archetypes].index(name)
        rest = sum(s for j, s in enumerate(self.shares) if j != i)
        if not 0 <= share <= 1 or rest <= 0:
            raise ValueError(f"TokenMix.with_share: share={share} of {name!r} is not usable")
        new = [share if j == i else s * (1 - share) / rest for j, s in enumerate(self.shares)]
        return TokenMix(self.archetypes, tuple(new))

    @property
    def mean_prompt_tokens(self) -> float:
        return float(sum(a.prompt_tokens * s for a, s in zip(self.archetypes, self.shares,
                                                              strict=True)))

    @property
    def mean_output_tokens(self) -> float:
        return float(sum(a.output_tokens * s for a, s in zip(self.archetypes, self.shares,
                                                              strict=True)))


def work_per_request(mix: TokenMix, profile: ReplicaProfile) -> float:
    """Mean replica-seconds one request of `mix` costs (modeled: prefill + decode)."""
    return sum(s * (a.prompt_tokens / profile.prefill_tok_per_s
                    + a.output_tokens / profile.decode_tok_per_s)
               for a, s in zip(mix.archetypes, mix.shares, strict=True))


def replica_requests_per_s(mix: TokenMix, profile: ReplicaProfile,
                           target_util: float = 1.0) -> float:
    """Requests/s one replica sustains for `mix` when run at `target_util` of its capacity."""
    if not 0 < target_util <= 1:
        raise ValueError(f"target_util={target_util}; must be in (0, 1]")
    return target_util / work_per_request(mix, profile)


def replicas_needed(rate_q: float, tokens: TokenMix, profile: ReplicaProfile,
                    target_util: float, min_replicas: int = 1) -> int:
    """Replicas that serve `rate_q` requests/s of `tokens` at `target_util` (ceil, >= min)."""
    if rate_q < 0 or not math.isfinite(rate_q):
        raise ValueError(f"rate_q={rate_q}; must be a finite rate >= 0")
    need = rate_q / replica_requests_per_s(tokens, profile, target_util)
    return max(int(min_replicas), math.ceil(need - 1e-9))


# ---------------------------------------------------------------- measured sources


def measured_profile(shared_dir: str | Path, *, model: str = "meta-llama/Llama-3.1-70B-Instruct",
                     gpu: str = "H100", num_gpus: int = 4, task: str = "lm-arena-chat",
                     itl_p99_slo_ms: float = 100.0, prefill_model: str = "llama2-70b",
                     prefill_hardware: str = "h100-80gb",
                     prefill_tensor_parallel: int = 4) -> ReplicaProfile:
    """A replica profile from the measured ML.ENERGY and Splitwise files under `shared_dir`."""
    shared = Path(shared_dir)
    row = mlenergy_operating_point(shared / MLENERGY_FILE, model=model, gpu=gpu,
                                   num_gpus=num_gpus, task=task, itl_p99_slo_ms=itl_p99_slo_ms)
    prefill = splitwise_prefill_tok_per_s(shared / SPLITWISE_FILE, model=prefill_model,
                                          hardware=prefill_hardware,
                                          tensor_parallel=prefill_tensor_parallel)
    transfer = "" if prefill_model.replace("-", "").lower() in model.replace("-", "").lower() \
        else f"; prefill transferred from {prefill_model} (modeled)"
    return ReplicaProfile(
        name=f"{model.split('/')[-1]} on {num_gpus}x{gpu}", gpus_per_replica=num_gpus,
        decode_tok_per_s=float(row["output_tok_per_s"]), prefill_tok_per_s=prefill,
        batch=int(row["max_num_seqs"]), itl_p99_ms=float(row["itl_p99_ms"]),
        provenance="measured inputs, modeled combination",
        source=(f"ML.ENERGY v3 ({MLENERGY_FILE}): {task}, max_num_seqs={int(row['max_num_seqs'])}"
                f", itl_p99={row['itl_p99_ms']} ms <= {itl_p99_slo_ms}; Splitwise "
                f"({SPLITWISE_FILE}): {prefill_model}/{prefill_hardware}/tp"
                f"{prefill_tensor_parallel} prompt phase{transfer}"))


def azure_conv_mix(shared_dir: str | Path, long_output_threshold: int = 400) -> TokenMix:
    """Two archetypes measured on the Azure 2023 conversation trace (19,366 requests):
    `short_output` and `long_output` (generated tokens >= threshold), with their shares."""
    path = Path(shared_dir) / "traces/azure_llm_2023/AzureLLMInferenceTrace_conv.csv"
    d = pd.read_csv(path, usecols=["ContextTokens", "GeneratedTokens"])
    long = d["GeneratedTokens"] >= long_output_threshold
    arche = (Archetype("short_output", float(d.loc[~long, "ContextTokens"].mean()),
                       float(d.loc[~long, "GeneratedTokens"].mean())),
             Archetype("long_output", float(d.loc[long, "ContextTokens"].mean()),
                       float(d.loc[long, "GeneratedTokens"].mean())))
    share = float(long.mean())
    return TokenMix(arche, (1 - share, share))


def capacity_facts(profile: ReplicaProfile, mix: TokenMix) -> dict:
    """Report rows for a profile and mix, each number labelled."""
    return {
        "profile": profile.name, "profile_source": profile.source,
        "gpus_per_replica": profile.gpus_per_replica,
        "decode_tok_per_s (measured)": round(profile.decode_tok_per_s, 1),
        "prefill_tok_per_s (measured)": round(profile.prefill_tok_per_s, 1),
        "batch (measured config)": profile.batch,
        "itl_p99_ms (measured)": profile.itl_p99_ms,
        "mix": {a.name: {"share": round(s, 4), "prompt_tokens": round(a.prompt_tokens, 1),
                         "output_tokens": round(a.output_tokens, 1)}
                for a, s in zip(mix.archetypes, mix.shares, strict=True)},
        "replica_seconds_per_request (modeled)": round(work_per_request(mix, profile), 4),
        "requests_per_s_per_replica_at_100pct (modeled)": round(
            replica_requests_per_s(mix, profile), 3),
    }


def mix_work_series(mix: TokenMix, profile: ReplicaProfile, long_share: np.ndarray,
                    long_name: str = "long_output") -> np.ndarray:
    """Replica-seconds per request for each entry of a time series of long-output shares."""
    base = np.array([a.prompt_tokens / profile.prefill_tok_per_s
                     + a.output_tokens / profile.decode_tok_per_s for a in mix.archetypes])
    names = [a.name for a in mix.archetypes]
    i = names.index(long_name)
    shares = np.asarray(mix.shares, dtype=float)
    rest = shares.sum() - shares[i]
    long_share = np.asarray(long_share, dtype=float)
    others = np.delete(base * shares, i).sum() / rest if rest > 0 else 0.0
    return long_share * base[i] + (1 - long_share) * others
