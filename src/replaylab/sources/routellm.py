"""RouteLLM benchmark outcomes (GSM8K, MMLU) -> outcomes-v1.

Source: lm-sys/RouteLLM, `routellm/evals/{gsm8k,mmlu}` (copied unchanged under
../shared/data/outcomes/routellm/). License: Apache-2.0. Cite: Ong et al.,
"RouteLLM: Learning to Route LLMs with Preference Data", 2024 (arXiv:2406.18665).

What a source row is: one prompt, with one True/False correctness column per
model (`mistralai/Mixtral-8x7B-Instruct-v0.1`, `gpt-4-1106-preview`) and, for
GSM8K only, `<model>_response` text columns (not imported).

Mapping (one outcomes row per prompt x candidate):
- candidate = the source column name, unchanged; score = 1.0 / 0.0; success = score >= 1.
- task = `gsm8k`, or `mmlu/<subject>` from the file name `mmlu_<subject>.csv`.
- prompt_id = first 16 hex digits of sha1(task, prompt text) (`stable_prompt_ids`).
  MMLU's test set repeats 27 questions verbatim inside a subject (same labels);
  a repeat keeps its own row and gets the suffix `-<k>` (k-th repeat), so all
  14,042 source rows survive. Split train/test by prompt_text to avoid leakage.
- cost, prompt_tokens, completion_tokens: null (the source has none; the
  contract's config price table turns tokens into cost later). currency = USD.
- Extra column `contaminated` (bool): the prompt is an `eval_prompt` of the
  folder's `contaminated_prompts.jsonl`, i.e. RouteLLM found a near-duplicate of
  it in its router training data (12 GSM8K, 5 MMLU prompts). RouteLLM's own
  evals drop these by exact text match (1,307 / 14,037 remain); so does
  `drop_contaminated=True`. Default keeps and flags them: for routers trained
  here they are ordinary prompts. Null when no contamination file is found.
- A prompt without a correctness value for a candidate is left out for that
  candidate and counted in `frame.attrs["import_report"]["missing_scores"]`.
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

import numpy as np
import pandas as pd

from replaylab.contracts.columns import Outcomes as O

logger = logging.getLogger(__name__)

OUTCOMES_VERSION = "1"
CURRENCY = "USD"
CONTAMINATED = "contaminated"  # extra column
_PROMPT = "prompt"
_CONTAMINATION_FILE = "contaminated_prompts.jsonl"
OUTCOME_COLUMNS = (O.VERSION, O.PROMPT_ID, O.PROMPT_TEXT, O.TASK, O.CANDIDATE, O.SCORE,
                   O.SUCCESS, O.COST, O.CURRENCY, O.PROMPT_TOKENS, O.COMPLETION_TOKENS)


def stable_prompt_ids(namespace: pd.Series, text: pd.Series) -> pd.Series:
    """sha1(namespace, text)[:16] per row; the k-th repeat of a pair gets `-k` appended.

    Stable across runs and machines (unlike Python's hash); namespace is the
    task (plus split where one text appears in two splits as distinct items).
    """
    keys = namespace.astype(str) + "\x1f" + text.astype(str)
    ids = pd.Series([hashlib.sha1(k.encode("utf-8")).hexdigest()[:16] for k in keys],
                    index=text.index, dtype=object)
    repeat = keys.groupby(keys).cumcount()
    return ids.where(repeat == 0, ids + "-" + repeat.astype(str))


def finish_outcomes(long: pd.DataFrame, success: pd.Series, source: str,
                    extra: tuple[str, ...] = (), report: dict | None = None) -> pd.DataFrame:
    """Add version/currency, order the contract columns first, attach the import report."""
    out = long.assign(**{O.VERSION: OUTCOMES_VERSION, O.SUCCESS: success.astype(bool),
                         O.CURRENCY: CURRENCY})
    if O.COST not in out.columns:
        out[O.COST] = np.nan
    for col in (O.PROMPT_TOKENS, O.COMPLETION_TOKENS):
        out[col] = out[col].astype("Int64") if col in out.columns else pd.array(
            [pd.NA] * len(out), dtype="Int64")
    out = out[list(OUTCOME_COLUMNS) + list(extra)].reset_index(drop=True)
    out.attrs["import_report"] = {
        "source": source,
        "prompts": int(out[O.PROMPT_ID].nunique()),
        "candidates": sorted(out[O.CANDIDATE].unique().tolist()),
        "rows": len(out),
        **(report or {}),
    }
    if (report or {}).get("missing_scores"):
        logger.warning("%s: %d (prompt, candidate) pairs have no score and were left out",
                       source, report["missing_scores"])
    return out


def _read_wide(path: Path) -> pd.DataFrame:
    """One RouteLLM responses CSV -> frame with `prompt` and candidate columns as 1.0/0.0/NaN."""
    try:
        raw = pd.read_csv(path)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not a readable RouteLLM responses CSV ({e})") from e
    candidates = [c for c in raw.columns if c != _PROMPT and not c.endswith("_response")]
    if _PROMPT not in raw.columns or not candidates:
        raise ValueError(f"{path}: expected a `prompt` column and one True/False column per "
                         f"model, found {list(raw.columns)}")
    truth = {True: 1.0, False: 0.0, "True": 1.0, "False": 0.0}
    scores = raw[candidates].apply(lambda s: s.map(truth))
    bad = scores.isna() & raw[candidates].notna()
    if bad.any().any():
        col = bad.any().idxmax()
        raise ValueError(f"{path}: column {col!r} holds values other than True/False "
                         f"(e.g. {raw.loc[bad[col], col].iloc[0]!r})")
    return pd.concat([raw[[_PROMPT]], scores], axis=1)


def _contaminated_texts(path: Path | None) -> set[str] | None:
    if path is None or not path.is_file():
        return None
    try:
        rows = pd.read_json(path, lines=True)
    except ValueError as e:
        raise ValueError(f"{path}: not JSON Lines ({e})") from e
    if "eval_prompt" not in rows.columns:
        raise ValueError(f"{path}: expected an `eval_prompt` field, found {list(rows.columns)}")
    return set(rows["eval_prompt"].astype(str))


def _to_outcomes(wide: pd.DataFrame, contamination: Path | None, drop_contaminated: bool,
                 source: str) -> pd.DataFrame:
    """wide: `prompt`, `task` and candidate score columns -> outcomes-v1 long frame."""
    texts = _contaminated_texts(contamination)
    if texts is None and drop_contaminated:
        raise ValueError(f"{source}: drop_contaminated=True but no {_CONTAMINATION_FILE} "
                         f"at {contamination}")
    wide = wide.assign(**{O.PROMPT_ID: stable_prompt_ids(wide[O.TASK], wide[_PROMPT])})
    flag = (wide[_PROMPT].isin(texts) if texts is not None
            else pd.Series(pd.NA, index=wide.index, dtype="boolean"))
    wide[CONTAMINATED] = flag.astype("boolean")
    n_contaminated = int(flag.sum()) if texts is not None else None
    if drop_contaminated:
        wide = wide[~wide[CONTAMINATED]]
    id_cols = [O.PROMPT_ID, _PROMPT, O.TASK, CONTAMINATED]
    long = wide.melt(id_vars=id_cols, var_name=O.CANDIDATE, value_name=O.SCORE)
    missing = int(long[O.SCORE].isna().sum())
    long = long.dropna(subset=[O.SCORE]).rename(columns={_PROMPT: O.PROMPT_TEXT})
    report = {"missing_scores": missing, "contaminated": n_contaminated,
              "contaminated_dropped": drop_contaminated}
    return finish_outcomes(long, long[O.SCORE] >= 1.0, source, (CONTAMINATED,), report)


def import_routellm_gsm8k(path: str | Path, *, drop_contaminated: bool = False,
                          contaminated_path: str | Path | None = None) -> pd.DataFrame:
    """gsm8k_responses.csv -> outcomes-v1 (1,319 prompts x 2 candidates on the full file).

    `contaminated_path` defaults to `contaminated_prompts.jsonl` beside the CSV.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: no such file (expected gsm8k_responses.csv)")
    wide = _read_wide(path).assign(**{O.TASK: "gsm8k"})
    cont = Path(contaminated_path) if contaminated_path else path.parent / _CONTAMINATION_FILE
    return _to_outcomes(wide, cont, drop_contaminated, str(path))


def import_routellm_mmlu(path: str | Path, *, drop_contaminated: bool = False,
                         contaminated_path: str | Path | None = None) -> pd.DataFrame:
    """The `mmlu/responses/` folder (57 `mmlu_<subject>.csv`) -> outcomes-v1.

    14,042 prompts x 2 candidates on the full folder; task = `mmlu/<subject>`.
    `contaminated_path` defaults to `../contaminated_prompts.jsonl` of the folder.
    """
    path = Path(path)
    files = sorted(path.glob("mmlu_*.csv")) if path.is_dir() else []
    if not files:
        raise ValueError(f"{path}: expected a folder of mmlu_<subject>.csv files")
    frames = [_read_wide(f).assign(**{O.TASK: "mmlu/" + f.stem.removeprefix("mmlu_")})
              for f in files]
    wide = pd.concat(frames, ignore_index=True)
    cont = Path(contaminated_path) if contaminated_path else path.parent / _CONTAMINATION_FILE
    return _to_outcomes(wide, cont, drop_contaminated, str(path))
