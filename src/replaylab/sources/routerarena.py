"""RouterArena cached model results -> outcomes-v1.

Source: RouteWorks/RouterArena (`cached_results/<model>.jsonl`, `model_cost/cost.json`),
copied unchanged under ../shared/data/outcomes/routerarena/. License: Apache-2.0.
Cite: Lu et al., "RouterArena: An Open Platform for Comprehensive Comparison of
LLM Routers", 2025 (arXiv:2510.00202).

What a source row is: one model's answer to one benchmark query: `global_index`
(e.g. `AIME_112`), `question` (the full templated prompt sent), `llm_selected`,
`token_usage` {input_tokens, output_tokens}, `success`/`error` of the API call,
and `evaluation_result` {score, metric, inference_cost, ...}. The shared copy
holds 809 queries x 2 models (claude-3-haiku-20240307, gemini-2.0-flash-001).

Mapping (one outcomes row per query x model file):
- prompt_id = `global_index` (the source's own unique id); prompt_text = `question`;
  task = `global_index` without its trailing `_<n>` (e.g. `MMLUPro_computer science`).
- candidate = `llm_selected`; prompt_tokens / completion_tokens = `token_usage`
  input / output tokens.
- cost = `evaluation_result.inference_cost` (USD, measured per call). Where it is
  missing, tokens x `cost.json` per-million prices; on the shared copy it is never
  missing and equals tokens x price to 1e-15.
- score = `evaluation_result.score`, clipped to [0, 1]. The metrics are 0/1
  (mcq_accuracy, exact_match, code/math/chess accuracy, superglue_*) except
  `meteor_score` (graded, 70 queries); one METEOR value is -0.033 (an artifact:
  METEOR is defined on [0, 1]) and is clipped to 0. Clipped values are counted
  in `attrs["import_report"]["scores_clipped"]`.
- success = score >= `success_threshold` (default 0.5). RouterArena itself only
  averages scores; any threshold in (0, 1] gives the same success for the 0/1
  metrics, so the choice matters for METEOR only.
- A row whose call failed (`success` false or `error` set) or has no score is
  left out and counted in `missing_scores` (none on the shared copy).
- Extra column `metric` (the source's evaluation metric name).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from replaylab.contracts.columns import Outcomes as O
from replaylab.sources.routellm import finish_outcomes

METRIC = "metric"  # extra column
_REQUIRED = ("global_index", "question", "llm_selected", "token_usage", "evaluation_result")


def _read_results(path: Path) -> pd.DataFrame:
    try:
        raw = pd.read_json(path, lines=True)
    except ValueError as e:
        raise ValueError(f"{path}: not RouterArena JSON Lines ({e})") from e
    missing = [c for c in _REQUIRED if c not in raw.columns]
    if raw.empty or missing:
        raise ValueError(f"{path}: missing field(s) {missing or list(_REQUIRED)} "
                         "expected in RouterArena cached results")
    usage = pd.json_normalize([u if isinstance(u, dict) else {} for u in raw["token_usage"]])
    ev = pd.json_normalize([e if isinstance(e, dict) else {} for e in raw["evaluation_result"]])
    if "score" not in ev.columns:
        raise ValueError(f"{path}: evaluation_result has no `score`")
    ok = pd.Series(True, index=raw.index)
    if "success" in raw.columns:
        ok = raw["success"].fillna(False).astype(bool)
    if "error" in raw.columns:
        ok = ok & raw["error"].isna()
    score = pd.to_numeric(ev["score"], errors="coerce")
    return pd.DataFrame({
        O.PROMPT_ID: raw["global_index"].astype(str),
        O.PROMPT_TEXT: raw["question"],
        O.CANDIDATE: raw["llm_selected"].astype(str),
        O.SCORE: score.where(ok),
        O.PROMPT_TOKENS: pd.to_numeric(usage.get("input_tokens"), errors="coerce"),
        O.COMPLETION_TOKENS: pd.to_numeric(usage.get("output_tokens"), errors="coerce"),
        O.COST: pd.to_numeric(ev.get("inference_cost"), errors="coerce"),
        METRIC: ev.get("metric"),
    })


def _priced_cost(frame: pd.DataFrame, cost_path: Path) -> pd.Series:
    """tokens x per-million prices of cost.json; NaN for models it does not list."""
    if not cost_path.is_file():
        return pd.Series(np.nan, index=frame.index)
    try:
        prices = pd.DataFrame.from_dict(json.loads(cost_path.read_text()), orient="index")
        p_in = frame[O.CANDIDATE].map(prices["input_token_price_per_million"])
        p_out = frame[O.CANDIDATE].map(prices["output_token_price_per_million"])
    except (json.JSONDecodeError, KeyError, ValueError) as e:
        raise ValueError(f"{cost_path}: expected {{model: {{input_token_price_per_million, "
                         f"output_token_price_per_million}}}} ({e})") from e
    tokens_in = frame[O.PROMPT_TOKENS].astype(float)
    tokens_out = frame[O.COMPLETION_TOKENS].astype(float)
    return (tokens_in * p_in + tokens_out * p_out) / 1e6


def import_routerarena(path: str | Path, *, success_threshold: float = 0.5) -> pd.DataFrame:
    """The RouterArena folder (or its `cached_results/`) -> outcomes-v1.

    809 queries x 2 candidates on the shared copy; see the module docstring.
    """
    path = Path(path)
    results = path / "cached_results" if (path / "cached_results").is_dir() else path
    files = sorted(results.glob("*.jsonl")) if results.is_dir() else []
    if not files:
        raise ValueError(f"{path}: expected cached_results/<model>.jsonl files")
    if not 0.0 < success_threshold <= 1.0:
        raise ValueError(f"success_threshold={success_threshold!r}: must be in (0, 1]")
    frame = pd.concat([_read_results(f) for f in files], ignore_index=True)
    texts = frame.groupby(O.PROMPT_ID)[O.PROMPT_TEXT].nunique()
    if (texts > 1).any():
        raise ValueError(f"{results}: global_index {texts[texts > 1].index[0]!r} has different "
                         "question texts across model files")
    priced = _priced_cost(frame, results.parent / "model_cost" / "cost.json")
    frame[O.COST] = frame[O.COST].fillna(priced)
    frame[O.TASK] = frame[O.PROMPT_ID].str.replace(r"_\d+$", "", regex=True)
    missing = int(frame[O.SCORE].isna().sum())
    frame = frame.dropna(subset=[O.SCORE])
    clipped = frame[O.SCORE].clip(0.0, 1.0)
    report = {"missing_scores": missing,
              "scores_clipped": int((clipped != frame[O.SCORE]).sum()),
              "success_threshold": success_threshold}
    frame[O.SCORE] = clipped
    return finish_outcomes(frame, frame[O.SCORE] >= success_threshold, str(path),
                           (METRIC,), report)
