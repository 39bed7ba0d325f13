"""The experiment's config: `HintConfig` (a `harness.SimExperimentConfig`) and its sections,
read and checked by `hint_config`; `mode_of` reads an admission mode from a policy spec.

Part of the hint_admission experiment (`hint_admission/__init__.py`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from replaylab.config import ConfigError
from replaylab.fleet.experiments.harness import SimExperimentConfig
from replaylab.fleet.experiments.workloads import WorkloadSpec, require_source


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


def hint_config(cfg: Mapping[str, Any]) -> HintConfig:
    c = HintConfig.parse(cfg)
    if not c.modes:
        raise ConfigError("experiment=hint_admission needs modes (name -> policy spec)")
    require_source(c.workload, "hint_admission", generated=("synthetic",))
    return c


def mode_of(spec: Mapping[str, Any] | str) -> str:
    if isinstance(spec, str):
        return "none"
    return str(dict(spec).get("mode", "none"))
