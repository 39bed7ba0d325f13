"""LLMRouter DC-Router preprocessed outcomes -> outcomes-v1.

Source: ulab-uiuc/LLMRouter, its DC-Router preprocessed data
(`dcrouter_preprocessed/{train,test}.json`) and `llm_candidates/default_llm.json`,
copied unchanged under ../shared/data/outcomes/llmrouter/. License: MIT. Cite: the LLMRouter library
(U Lab @ UIUC, github.com/ulab-uiuc/LLMRouter); the format follows RouterDC
(Chen et al., "RouterDC: Query-Based Router by Dual Contrastive Learning", NeurIPS 2024).

What a source record is: {"question": text, "scores": {model: score in [0, 1]},
"cluster_id": int (train only)}. 5,608 train + 500 test questions x 9 models.
Scores are mostly 0/1; about 3% are fractions (multi-attempt or partial-credit
scores). No per-row benchmark label and no token counts.

Mapping (one outcomes row per question x model):
- task = `llmrouter/dcrouter` for every row (the file mixes benchmarks: zebra
  puzzles, MBPP, multiple choice, ...; no per-row label to recover).
- prompt_id = `stable_prompt_ids(task + "/" + split, question)`. The split is part
  of the key: 119 questions appear in both splits with different scores (50 of
  119 differ), so they are distinct observations. Extra column `split`
  (`train` / `test`, from the file stem); split by it, not at random, to keep
  those 119 texts on one side.
- success: `success_threshold=None` (default) follows the source: LLMRouter's
  DCTrainer evaluates with `binary_scores = (scores > 0)`, so success = score > 0.
  A float t gives success = score >= t (e.g. 1.0 for "fully correct").
- cost, prompt_tokens, completion_tokens: null. The records carry no token
  counts, so tokens x price cannot be computed here. `load_llmrouter_prices`
  returns the per-million input/output prices of `default_llm.json` (USD per
  million tokens, `input_price` / `output_price`) for the config price table.
  Note its `feature` prose quotes different prices for some models (e.g. qwen2.5:
  $0.30 in the text, 0.20 in the fields); the numeric fields are used.
- `cluster_id` is dropped: it is KMeans over the score vectors (a label leak if
  used as a feature).
- A question without a score for some model is left out for that model and
  counted in `attrs["import_report"]["missing_scores"]` (none on the shared copy).
  Candidates missing from the price table are listed in `unpriced_candidates`.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from replaylab.contracts.columns import Outcomes as O
from replaylab.sources.routellm import finish_outcomes, stable_prompt_ids

TASK = "llmrouter/dcrouter"
SPLIT = "split"  # extra column
PRICE_IN = "input_usd_per_million"
PRICE_OUT = "output_usd_per_million"


def load_llmrouter_prices(path: str | Path) -> pd.DataFrame:
    """default_llm.json -> frame indexed by candidate: input/output USD per million tokens."""
    path = Path(path)
    try:
        table = pd.DataFrame.from_dict(json.loads(path.read_text()), orient="index")
        prices = table[["input_price", "output_price"]].astype(float)
    except (OSError, json.JSONDecodeError, KeyError, ValueError) as e:
        raise ValueError(f"{path}: expected {{model: {{input_price, output_price, ...}}}} "
                         f"({type(e).__name__}: {e})") from e
    prices.columns = [PRICE_IN, PRICE_OUT]
    prices.index.name = O.CANDIDATE
    return prices


def _read_split(path: Path) -> pd.DataFrame:
    """One {train,test}.json -> wide frame: question, split, one score column per model."""
    try:
        records = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not a readable JSON file ({type(e).__name__})") from e
    if not isinstance(records, list) or not records or not all(
            isinstance(r, dict) and "question" in r and isinstance(r.get("scores"), dict)
            for r in records):
        raise ValueError(f"{path}: expected a JSON list of {{question, scores: {{model: score}}}}")
    scores = pd.DataFrame.from_records([r["scores"] for r in records])
    numeric = scores.apply(pd.to_numeric, errors="coerce")
    if (numeric.isna() & scores.notna()).any().any():
        raise ValueError(f"{path}: non-numeric score values")
    questions = pd.Series([r["question"] for r in records], name="question")
    return pd.concat([questions, numeric], axis=1).assign(**{SPLIT: path.stem})


def import_llmrouter(path: str | Path, *, candidates_path: str | Path | None = None,
                     success_threshold: float | None = None) -> pd.DataFrame:
    """dcrouter_preprocessed/ (train.json + test.json) or one of its files -> outcomes-v1.

    Full folder: (5,608 + 500) questions x 9 candidates = 54,972 rows.
    `candidates_path` defaults to `../llm_candidates/default_llm.json` of the folder.
    """
    path = Path(path)
    files = sorted(path.glob("*.json")) if path.is_dir() else [path] if path.is_file() else []
    if not files:
        raise ValueError(f"{path}: expected dcrouter_preprocessed/{{train,test}}.json")
    if success_threshold is not None and not 0.0 < success_threshold <= 1.0:
        raise ValueError(f"success_threshold={success_threshold!r}: must be in (0, 1] or None")
    wide = pd.concat([_read_split(f) for f in files], ignore_index=True)
    folder = path if path.is_dir() else path.parent
    wide[O.TASK] = TASK
    wide[O.PROMPT_ID] = stable_prompt_ids(TASK + "/" + wide[SPLIT], wide["question"])
    long = wide.melt(id_vars=[O.PROMPT_ID, "question", O.TASK, SPLIT],
                     var_name=O.CANDIDATE, value_name=O.SCORE)
    missing = int(long[O.SCORE].isna().sum())
    long = long.dropna(subset=[O.SCORE]).rename(columns={"question": O.PROMPT_TEXT})
    prices_file = (Path(candidates_path) if candidates_path
                   else folder.parent / "llm_candidates" / "default_llm.json")
    unpriced = None
    if prices_file.is_file():
        priced = load_llmrouter_prices(prices_file).index
        unpriced = sorted(set(long[O.CANDIDATE]) - set(priced))
    elif candidates_path is not None:
        raise ValueError(f"{prices_file}: no such candidates file")
    success = (long[O.SCORE] > 0.0) if success_threshold is None else (
        long[O.SCORE] >= success_threshold)
    report = {"missing_scores": missing, "unpriced_candidates": unpriced,
              "success_rule": "score > 0 (source)" if success_threshold is None
              else f"score >= {success_threshold}",
              "splits": long.groupby(SPLIT)[O.PROMPT_ID].nunique().to_dict()}
    return finish_outcomes(long, success, str(path), (SPLIT,), report)
