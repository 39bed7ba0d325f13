"""What a router run hands to export, both modes: `RouterRun`, `ReceiptsRun`, the golden inputs.

`RouterRun` is the fitted router (head, its served graph, threshold, rule, fallback column,
the logging or scenario rules) plus the run's summary: `artifacts.router_export` needs
nothing else. A receipts run (`pipelines/router_receipts.py`) adds the test decisions it
was judged on (`ReceiptsRun`), so the entry point can check them against the exported
artifact as the runtime loads it. `golden_inputs` picks the queries of the artifact's
golden vectors the same way in both modes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from replaylab.router.head import SuccessHead
from replaylab.router.pipeline_config import RouterPipelineConfig
from replaylab.router.rules import ScenarioRules

GOLDEN_QUERIES = 12  # test prompts in the router golden vectors (plus two edge cases)
EDGE_CASES = ({"text": "", "category": None, "prompt_tokens": None},
              {"text": "Ünïcödé 中文 🤖 — route me", "category": None, "prompt_tokens": None})


@dataclass
class RouterRun:
    """The fitted objects of a run: enough to export and serve the router."""

    config: RouterPipelineConfig
    candidates: tuple[str, ...]
    head: SuccessHead
    threshold: float
    rules: ScenarioRules
    summary: dict = field(default_factory=dict)
    rule: str = "absolute"  # policy.routing_scores rule of the threshold
    fallback: int = -1  # column routed to when no candidate clears the threshold
    deployed: SuccessHead | None = None  # the head's graph, which made every learned decision
    golden_inputs: list[dict] = field(default_factory=list)  # queries for the golden vectors
    rules_equal: ScenarioRules | None = None  # the rules at the learned router's label budget
    # bootstrap replicates (n_boot,) of test cost_ratio_at_95 differences, "a-b" -> reps
    gap_replicates: dict[str, np.ndarray] = field(default_factory=dict)
    # split -> sorted `prompt_hashes` of the prompts the router was fitted / calibrated on
    # (the artifact's fit_prompts.json: a compare counts another run's test prompts in them)
    fit_prompts: dict[str, list[str]] = field(default_factory=dict)


@dataclass
class ReceiptsRun(RouterRun):
    """A RouterRun (what export needs) plus the test decisions it was judged on, so the
    entry point can check them against the exported artifact as the runtime loads it.

    test_choice: (n,) served column per test decision; test_embeddings (n, d), test_meta,
    test_texts: the inputs those decisions were made from (texts None where the ledger
    gave an embedding); test_sessions: (n,) their session ids; fitted: the fit."""

    test_choice: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    test_embeddings: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), np.float32))
    test_meta: dict = field(default_factory=dict)
    test_texts: list = field(default_factory=list)
    test_sessions: np.ndarray = field(default_factory=lambda: np.zeros(0, object))
    # the fit (`router_fit.FittedRouter`: its rows, refits and operating point), for what a
    # caller adds on top (the outcomes mode's full-information figures); never exported
    fitted: Any = None


def golden_inputs(texts: Sequence[str | None], category: Sequence[Any],
                  prompt_tokens: Sequence[float]) -> list[dict]:
    """The queries of the artifact's golden vectors: up to GOLDEN_QUERIES test prompts with
    text, evenly spaced over the split, with the category and prompt length training used
    (None where missing), plus an empty and a Unicode prompt without metadata.

    texts: (n,) the test prompts' text (None where the ledger gave only an embedding);
    category, prompt_tokens: (n,) their metadata, aligned."""
    have = [i for i, t in enumerate(texts) if t is not None]
    spaced = np.unique(np.linspace(0, len(have) - 1, num=min(GOLDEN_QUERIES, len(have)))
                       .astype(int)) if have else []
    out = []
    for j in spaced:
        i = have[j]
        c, p = category[i], float(prompt_tokens[i])
        out.append({"text": texts[i], "category": None if pd.isna(c) else str(c),
                    "prompt_tokens": float(p) if np.isfinite(p) else None})
    return out + [dict(e) for e in EDGE_CASES]
