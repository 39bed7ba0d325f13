"""From the composed Hydra config to the library's typed inputs, shared by the pipelines."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from replaylab.compute.config import ComputeConfig
from replaylab.config import ConfigError, from_mapping


def plain(node: Any) -> dict:
    """A config node as a plain dict with interpolations resolved ({} for None)."""
    return OmegaConf.to_container(node, resolve=True) if node is not None else {}


def compute_config(cfg: DictConfig) -> ComputeConfig:
    """The typed `compute` of a run (`ConfigError` naming the field on a bad value)."""
    node = cfg.get("compute") if hasattr(cfg, "get") else None
    return from_mapping(ComputeConfig, plain(node), "compute")


def compute_engine(cfg: DictConfig):
    """`replaylab.compute.engine` of the run's `compute` (a context manager)."""
    from replaylab.compute import engine

    return engine(compute_config(cfg))


def ledger_input(cfg: DictConfig):
    """The typed ledger input of `cfg.data` (a file, or the seeded synthetic ledger)."""
    from replaylab.pipelines.project import LedgerInput
    from replaylab.sources.synthetic import SyntheticLedgerConfig

    data = plain(cfg.data)
    generator = dict(data["synthetic"])
    defect_rate = generator.pop("defect_rate")
    synthetic = from_mapping(SyntheticLedgerConfig, generator, "data.synthetic")
    return from_mapping(LedgerInput, {"path": data["ledger"], "synthetic": synthetic,
                                      "defect_rate": defect_rate, "seed": cfg.seed}, "data")


def default_outcomes() -> Path:
    """The shipped RouteLLM GSM8K outcomes (Apache-2.0), a package resource of replaylab.data."""
    from importlib.resources import files

    return Path(str(files("replaylab.data") / "routellm_gsm8k" / "gsm8k_responses.csv"))


def load_outcomes(cfg: DictConfig) -> tuple[Any, str]:
    """(outcomes-v1 frame, where it came from)."""
    from replaylab.contracts import read_outcomes
    from replaylab.sources.registry import SOURCES, import_source

    path, source = cfg.data.get("outcomes"), cfg.data.get("outcomes_source")
    if path is None and source is None:
        path, source = default_outcomes(), "routellm_gsm8k"
    if source is not None:
        if source not in SOURCES or SOURCES[source].contract != "outcomes":
            names = sorted(k for k, v in SOURCES.items() if v.contract == "outcomes")
            raise ConfigError(f"data.outcomes_source={source!r}: choose one of {names}")
        # a path not given or not there: one line naming the file and where to download it
        _, frame = import_source(source, None if path is None else str(path), "data.outcomes")
        return frame, f"{source}:{path}"
    if not Path(path).is_file():
        raise FileNotFoundError(f"data.outcomes={path}: no such file")
    result = read_outcomes(path)
    return result.valid, str(path)
