"""Which importer reads which public source, into which contract.

Modules are imported lazily so that an optional source (ShareGPT) costs
nothing until it is asked for.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import pandas as pd

Contract = Literal["ledger", "outcomes", "aggregates"]


@dataclass(frozen=True)
class SourceSpec:
    name: str
    contract: Contract
    module: str  # under replaylab.sources
    function: str
    fixed_options: tuple[tuple[str, object], ...] = ()

    def loader(self) -> Callable[..., pd.DataFrame]:
        mod = importlib.import_module(f"replaylab.sources.{self.module}")
        return getattr(mod, self.function)


SOURCES: dict[str, SourceSpec] = {
    s.name: s
    for s in (
        SourceSpec("azure_code", "ledger", "azure", "import_azure_llm_2023", (("service", "code"),)),
        SourceSpec("azure_conv", "ledger", "azure", "import_azure_llm_2023", (("service", "conv"),)),
        SourceSpec("burstgpt", "ledger", "burstgpt", "import_burstgpt"),
        SourceSpec("mooncake", "ledger", "mooncake", "import_mooncake"),
        SourceSpec("sharegpt", "ledger", "sharegpt", "import_sharegpt"),
        SourceSpec("routellm_gsm8k", "outcomes", "routellm", "import_routellm_gsm8k"),
        SourceSpec("routellm_mmlu", "outcomes", "routellm", "import_routellm_mmlu"),
        SourceSpec("routerarena", "outcomes", "routerarena", "import_routerarena"),
        SourceSpec("llmrouter", "outcomes", "llmrouter", "import_llmrouter"),
        SourceSpec("servegen", "aggregates", "servegen", "import_servegen"),
    )
}


def import_source(name: str, path: str | None, **options: object) -> tuple[Contract, pd.DataFrame]:
    """Run the importer `name` on `path`; return its contract and the (unvalidated) table."""
    if name not in SOURCES:
        raise KeyError(f"unknown source {name!r}; known: {', '.join(sorted(SOURCES))}")
    spec = SOURCES[name]
    kwargs = dict(spec.fixed_options)
    kwargs.update(options)
    loader = spec.loader()
    frame = loader(path, **kwargs) if path is not None else loader(**kwargs)
    return spec.contract, frame
