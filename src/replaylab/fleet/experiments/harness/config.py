"""An experiment's config: the base every experiment's config dataclass extends
(`ExperimentConfig`, `SimExperimentConfig`; conf/experiment/base/*.yaml), the parsing of
its plain mapping (`parse_config`) and its SLO targets (`slo_targets`). Part of the
harness (`harness/__init__.py`).
"""

from __future__ import annotations

import math
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from replaylab.config import ConfigError, dataclass_of, from_mapping
from replaylab.fleet.experiments.workloads import WorkloadSpec, workload_spec


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


@dataclass(frozen=True, kw_only=True)
class ExperimentConfig:
    """What every fleet experiment's config has; its YAML is conf/experiment/base/fleet.yaml,
    which each conf/experiment/<name>.yaml lists in its defaults.

    seed        the entry point's `seed`
    workload    the shared `fleet.workload` section (`workloads.WorkloadSpec`), what is replayed
    slo         {class: {ttft_s, tpot_s, e2e_s}}, the shared slo/ group (`slo_targets`)

    Each experiment's config extends it (or `SimExperimentConfig`) with its own sections
    and is read from its plain mapping by `parse` (`parse_config`). No data folder: the
    profiles, token CDFs and the default trace slice ship with the package
    (`replaylab.data`); a downloaded file is named where it is used (`fleet.workload.ledger`,
    `fleet.workload.path`, a pool's `measurements`).
    """

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


def parse_config(cls, cfg: Mapping[str, Any]) -> Any:
    """An experiment's config dataclass from its mapping: `name` dropped, `workload` (the
    shared `fleet.workload` section) as a `WorkloadSpec`, and every other field typed as a
    dataclass (a section such as `rollback: RollbackSpec`) built from its mapping first
    (`replaylab.config.from_mapping`, errors named `experiment.<section>`)."""
    values = dict(cfg)
    values.pop("name", None)
    hints = typing.get_type_hints(cls)
    for f in fields(cls):
        sub = dataclass_of(hints.get(f.name))
        if f.name == "workload" or sub is None:
            continue
        if f.name in values and values[f.name] is None and sub is not hints[f.name]:
            continue   # an optional section left out
        values[f.name] = from_mapping(sub, dict(values.get(f.name) or {}),
                                      f"experiment.{f.name}")
    if "workload" in {f.name for f in fields(cls)}:
        values["workload"] = workload_spec(values.get("workload"))
    return from_mapping(cls, values, "experiment")

