"""Importers of public outcome sets (outcomes-v1) and ServeGen rate traces (aggregates-v1).

Slices under tests/data/{routellm,routerarena,routerarena_short60,llmrouter,servegen}
(see tests/data/README_outcomes.md); the full-file tests read $REPLAYLAB_SHARED_DATA
(`make test` sets it to ../shared/data when that is beside the checkout) and skip
without it. Expected counts on the full files are those of its SOURCES.md.
"""

from __future__ import annotations

import ast
import hashlib
import json

import numpy as np
import pandas as pd
import pytest

from replaylab.contracts import (
    read_aggregates,
    read_outcomes,
    validate_aggregates,
    validate_outcomes,
    write_table,
)
from replaylab.contracts.columns import Aggregates as A
from replaylab.contracts.columns import Outcomes as O
from replaylab.sources.llmrouter import import_llmrouter, load_llmrouter_prices
from replaylab.sources.routellm import import_routellm_gsm8k, import_routellm_mmlu
from replaylab.sources.routerarena import import_routerarena
from replaylab.sources.servegen import import_servegen

MIXTRAL = "mistralai/Mixtral-8x7B-Instruct-v0.1"
GPT4 = "gpt-4-1106-preview"


def _check_outcomes(df: pd.DataFrame, prompts: int, candidates: int) -> None:
    """Shape, key uniqueness and a clean validation (nothing quarantined)."""
    assert df[O.PROMPT_ID].nunique() == prompts
    assert df[O.CANDIDATE].nunique() == candidates
    assert len(df) == prompts * candidates
    assert not df.duplicated([O.PROMPT_ID, O.CANDIDATE]).any()
    result = validate_outcomes(df)
    assert result.rows_quarantined == 0, result.summary()


def _row(df: pd.DataFrame, prompt_id: str, candidate: str) -> pd.Series:
    hit = df[(df[O.PROMPT_ID] == prompt_id) & (df[O.CANDIDATE] == candidate)]
    assert len(hit) == 1
    return hit.iloc[0]


# ------------------------------------------------------------------ RouteLLM


def test_routellm_gsm8k_slice(test_data):
    df = import_routellm_gsm8k(test_data / "routellm/gsm8k/gsm8k_responses.csv")
    _check_outcomes(df, prompts=30, candidates=2)
    assert set(df[O.TASK]) == {"gsm8k"} and set(df[O.CURRENCY]) == {"USD"}
    assert df[O.COST].isna().all() and df[O.PROMPT_TOKENS].isna().all()
    # first prompt (Janet's ducks): both models correct; id = sha1(task, text)[:16]
    text = df.loc[df[O.PROMPT_ID] == "13873bc1b9e5438b", O.PROMPT_TEXT].iloc[0]
    assert text.startswith("Janet’s ducks lay 16 eggs")
    assert hashlib.sha1(f"gsm8k\x1f{text}".encode()).hexdigest()[:16] == "13873bc1b9e5438b"
    for cand in (MIXTRAL, GPT4):
        row = _row(df, "13873bc1b9e5438b", cand)
        assert row[O.SCORE] == 1.0 and bool(row[O.SUCCESS]) and bool(row["contaminated"])
    assert df.groupby(O.CANDIDATE)[O.SCORE].sum().to_dict() == {GPT4: 22.0, MIXTRAL: 15.0}
    assert (df[O.SUCCESS] == (df[O.SCORE] >= 1.0)).all()
    # eval_idx 0, 1, 2, 18 of contaminated_prompts.jsonl fall in the first 30 rows
    assert df.drop_duplicates(O.PROMPT_ID)["contaminated"].sum() == 4
    kept = import_routellm_gsm8k(test_data / "routellm/gsm8k/gsm8k_responses.csv",
                                 drop_contaminated=True)
    assert kept[O.PROMPT_ID].nunique() == 26 and not kept["contaminated"].any()


def test_routellm_mmlu_slice(test_data):
    df = import_routellm_mmlu(test_data / "routellm/mmlu/responses")
    _check_outcomes(df, prompts=30, candidates=2)
    assert df.groupby(O.TASK)[O.PROMPT_ID].nunique().to_dict() == {
        "mmlu/anatomy": 10, "mmlu/college_chemistry": 10, "mmlu/college_physics": 10}
    # college_physics rows 72 and 76 are the same question: the repeat gets "-1"
    repeat = df[df[O.PROMPT_ID].str.endswith("-1")]
    assert set(repeat[O.TASK]) == {"mmlu/college_physics"} and len(repeat) == 2
    first = df[df[O.PROMPT_ID] == repeat[O.PROMPT_ID].iloc[0].removesuffix("-1")]
    assert set(first[O.PROMPT_TEXT]) == set(repeat[O.PROMPT_TEXT])
    # college_chemistry row 37 is in mmlu/contaminated_prompts.jsonl
    flagged = df[df["contaminated"]]
    assert set(flagged[O.TASK]) == {"mmlu/college_chemistry"} and len(flagged) == 2
    anatomy0 = df[(df[O.TASK] == "mmlu/anatomy")
                  & df[O.PROMPT_TEXT].str.startswith("A lesion causing compression")]
    assert anatomy0.set_index(O.CANDIDATE)[O.SCORE].to_dict() == {MIXTRAL: 1.0, GPT4: 1.0}


def test_routellm_mmlu_first60_slice(test_data):
    """The 60-prompt MMLU slice the router runs on (tests/house/test_valid_inputs.py)."""
    df = import_routellm_mmlu(test_data / "routellm/mmlu_first60/responses")
    _check_outcomes(df, prompts=60, candidates=2)
    assert set(df[O.TASK]) == {"mmlu/abstract_algebra"} and not df["contaminated"].any()
    assert df.groupby(O.CANDIDATE)[O.SCORE].sum().to_dict() == {GPT4: 26.0, MIXTRAL: 23.0}


def test_routellm_full(shared_data, test_data):
    base = shared_data / "outcomes/routellm"
    gsm = import_routellm_gsm8k(base / "gsm8k/gsm8k_responses.csv")
    _check_outcomes(gsm, prompts=1319, candidates=2)
    mmlu = import_routellm_mmlu(base / "mmlu/responses")
    _check_outcomes(mmlu, prompts=14042, candidates=2)
    assert mmlu[O.TASK].nunique() == 57
    assert mmlu.attrs["import_report"]["missing_scores"] == 0
    # RouteLLM's own decontamination leaves 1,307 / 14,037 prompts
    assert gsm.attrs["import_report"]["contaminated"] == 12
    assert mmlu.attrs["import_report"]["contaminated"] == 5
    assert import_routellm_mmlu(base / "mmlu/responses",
                                drop_contaminated=True)[O.PROMPT_ID].nunique() == 14037
    # the 60-prompt slice is the folder's first 60 prompts, unchanged
    cut = import_routellm_mmlu(test_data / "routellm/mmlu_first60/responses")
    first = mmlu[mmlu[O.PROMPT_ID].isin(pd.unique(mmlu[O.PROMPT_ID])[:60])]
    pd.testing.assert_frame_equal(first.reset_index(drop=True), cut.reset_index(drop=True))


def test_routellm_bad_structure_names_file(tmp_path):
    bad = tmp_path / "gsm8k_responses.csv"
    bad.write_text("question,answer\nq,a\n")
    with pytest.raises(ValueError, match="gsm8k_responses.csv"):
        import_routellm_gsm8k(bad)
    with pytest.raises(ValueError, match="mmlu_"):
        import_routellm_mmlu(tmp_path)


# ------------------------------------------------------------------ RouterArena


def test_routerarena_slice(test_data):
    df = import_routerarena(test_data / "routerarena")
    _check_outcomes(df, prompts=25, candidates=2)
    row = _row(df, "AIME_112", "claude-3-haiku-20240307")
    assert row[O.TASK] == "AIME" and row[O.SCORE] == 0.0 and not row[O.SUCCESS]
    assert row[O.PROMPT_TOKENS] == 349 and row[O.COMPLETION_TOKENS] == 120
    assert row[O.COST] == pytest.approx(0.00023725)  # = (349 x 0.25 + 120 x 1.25) / 1e6
    # the source's METEOR of -0.033 is clipped to 0 and reported
    neg = _row(df, "NarrativeQA_4102", "claude-3-haiku-20240307")
    assert neg[O.SCORE] == 0.0 and neg["metric"] == "meteor_score"
    assert df.attrs["import_report"]["scores_clipped"] == 1
    assert _row(df, "NarrativeQA_4102", "gemini-2.0-flash-001")[O.SCORE] == pytest.approx(
        0.2133333, abs=1e-6)
    assert (df[O.SUCCESS] == (df[O.SCORE] >= 0.5)).all()
    assert df[O.COST].notna().all() and df[O.PROMPT_TOKENS].notna().all()


def test_routerarena_cost_matches_price_table(test_data):
    """The source's per-call cost equals tokens x cost.json prices."""
    df = import_routerarena(test_data / "routerarena")
    prices = pd.DataFrame.from_dict(
        json.loads((test_data / "routerarena/model_cost/cost.json").read_text()), orient="index")
    p_in = df[O.CANDIDATE].map(prices["input_token_price_per_million"])
    p_out = df[O.CANDIDATE].map(prices["output_token_price_per_million"])
    priced = (df[O.PROMPT_TOKENS].astype(float) * p_in
              + df[O.COMPLETION_TOKENS].astype(float) * p_out) / 1e6
    np.testing.assert_allclose(df[O.COST], priced, rtol=1e-9)


def test_routerarena_short60_slice(test_data):
    """The 60 prompts with the shortest lines (tests/house/test_valid_inputs.py): measured
    cost and token counts on every row, as on the full file."""
    df = import_routerarena(test_data / "routerarena_short60")
    _check_outcomes(df, prompts=60, candidates=2)
    assert df[O.COST].notna().all() and df[O.PROMPT_TOKENS].notna().all()
    assert df[O.TASK].nunique() == 28
    assert df.groupby(O.CANDIDATE)[O.SUCCESS].sum().to_dict() == {
        "claude-3-haiku-20240307": 33, "gemini-2.0-flash-001": 47}


def test_routerarena_full(shared_data, test_data):
    df = import_routerarena(shared_data / "outcomes/routerarena")
    _check_outcomes(df, prompts=809, candidates=2)
    assert df.attrs["import_report"]["missing_scores"] == 0
    # both slices hold whole lines of the full files: their rows are the full file's rows
    for folder in ("routerarena", "routerarena_short60"):
        cut = import_routerarena(test_data / folder)
        full = df.set_index([O.PROMPT_ID, O.CANDIDATE]).loc[
            cut.set_index([O.PROMPT_ID, O.CANDIDATE]).index]
        pd.testing.assert_frame_equal(full.reset_index(), cut, check_like=True)


# ------------------------------------------------------------------ LLMRouter


def test_llmrouter_slice(test_data):
    df = import_llmrouter(test_data / "llmrouter/dcrouter_preprocessed")
    _check_outcomes(df, prompts=52, candidates=9)
    assert df.groupby("split")[O.PROMPT_ID].nunique().to_dict() == {"train": 31, "test": 21}
    # one question is in both splits with different scores: two prompt ids, one text
    per_text = df.drop_duplicates(O.PROMPT_ID).groupby(O.PROMPT_TEXT)["split"].nunique()
    assert (per_text == 2).sum() == 1
    assert df[O.COST].isna().all()  # no token counts in the source
    assert (df[O.SUCCESS] == (df[O.SCORE] > 0)).all()  # the source's rule
    strict = import_llmrouter(test_data / "llmrouter/dcrouter_preprocessed/test.json",
                              success_threshold=1.0)
    _check_outcomes(strict, prompts=21, candidates=9)
    assert (strict[O.SUCCESS] == (strict[O.SCORE] >= 1.0)).all()
    graded = strict[(strict[O.SCORE] > 0) & (strict[O.SCORE] < 1)]
    assert not graded[O.SUCCESS].any()


def test_llmrouter_known_row(test_data):
    records = json.loads((test_data / "llmrouter/dcrouter_preprocessed/test.json").read_text())
    df = import_llmrouter(test_data / "llmrouter/dcrouter_preprocessed/test.json")
    rec = records[0]
    row = df[(df[O.PROMPT_TEXT] == rec["question"]) & (df[O.CANDIDATE] == "gemma-2-9b-it")]
    assert row[O.SCORE].item() == rec["scores"]["gemma-2-9b-it"] == 1.0


def test_missing_score_is_reported_not_filled(tmp_path):
    split = tmp_path / "dcrouter_preprocessed" / "test.json"
    split.parent.mkdir()
    split.write_text(json.dumps([{"question": "q1", "scores": {"a": 1.0, "b": 0.0}},
                                 {"question": "q2", "scores": {"a": 0.5}}]))
    df = import_llmrouter(split.parent)
    assert len(df) == 3 and df.attrs["import_report"]["missing_scores"] == 1
    assert df.loc[df[O.PROMPT_TEXT] == "q2", O.CANDIDATE].tolist() == ["a"]
    assert df.attrs["import_report"]["unpriced_candidates"] is None  # no price table here


def test_llmrouter_prices(test_data):
    prices = load_llmrouter_prices(test_data / "llmrouter/llm_candidates/default_llm.json")
    assert prices.loc["gemma-2-9b-it"].tolist() == [0.1, 0.1]
    assert len(prices) == 14


def test_llmrouter_full(shared_data):
    df = import_llmrouter(shared_data / "outcomes/llmrouter/dcrouter_preprocessed")
    _check_outcomes(df, prompts=5608 + 500, candidates=9)
    assert df.groupby("split")[O.PROMPT_ID].nunique().to_dict() == {"train": 5608, "test": 500}
    assert df.attrs["import_report"]["unpriced_candidates"] == []


def test_outcomes_roundtrip_parquet(test_data, tmp_path):
    df = import_routerarena(test_data / "routerarena")
    back = read_outcomes(write_table(df, tmp_path / "routerarena.parquet"))
    assert back.rows_valid == len(df) and back.rows_quarantined == 0


# ------------------------------------------------------------------ ServeGen


def _expected_quantile(files, start_s: int, kind: str, q: float) -> float:
    """Brute force: request-weighted mixture of the clients' histograms (ast, not numpy)."""
    acc: dict[int, float] = {}
    for trace in files:
        rates = pd.read_csv(trace, header=None)
        n = round(float(rates.loc[rates[0] == start_s, 1].iloc[0]) * 600)
        if n == 0:
            continue
        ds = json.loads(trace.with_name(trace.name.replace("trace.csv", "dataset.json")).read_text())
        hist = ast.literal_eval(ds[str(start_s // 21600 * 21600)][kind])
        total = sum(hist.values())
        for tokens, p in hist.items():
            acc[tokens] = acc.get(tokens, 0.0) + n * p / total
    cdf = pd.Series(acc).sort_index().cumsum()
    return float(cdf.index[np.argmax(cdf.to_numpy() / cdf.iloc[-1] >= q - 1e-12)])


def test_servegen_slice(test_data):
    df = import_servegen(test_data / "servegen")
    result = validate_aggregates(df)
    assert result.rows_quarantined == 0, result.summary()
    # 1 day of 10-minute buckets per archetype; clients pooled, no per-client rows
    assert df.groupby(A.ARCHETYPE).size().to_dict() == {"language/m-large": 144,
                                                        "reason/deepseek-r1": 144}
    assert set(df[A.BUCKET_SECONDS]) == {600} and set(df[A.REGION]) == {"all"}
    assert not df.duplicated([A.BUCKET_START, A.ARCHETYPE]).any()
    # conservation: requests = sum over client files of round(rate x 600)
    for arche in ("language/m-large", "reason/deepseek-r1"):
        files = sorted((test_data / "servegen" / arche).glob("chunk-*-trace.csv"))
        counts = sum((pd.read_csv(f, header=None)[1] * 600).round().sum() for f in files)
        assert df.loc[df[A.ARCHETYPE] == arche, A.REQUESTS].sum() == counts
    reason = df[df[A.ARCHETYPE] == "reason/deepseek-r1"].set_index(A.BUCKET_START)
    # bucket 83,400 s: both reason clients (chunk-46, chunk-57) have requests -> a mixture
    row = reason.loc[83_400_000]
    assert row[A.REQUESTS] == 442
    files = sorted((test_data / "servegen/reason/deepseek-r1").glob("chunk-*-trace.csv"))
    ns, cvs = [], []
    for f in files:
        t = pd.read_csv(f, header=None)
        r = t[t[0] == 83_400]
        ns.append(round(float(r[1].iloc[0]) * 600))
        cvs.append(float(r[2].iloc[0]))
    assert min(ns) > 0  # a genuine two-client bucket
    assert row[A.RATE_CV] == pytest.approx(np.sqrt(np.dot(ns, np.square(cvs)) / sum(ns)))
    for col, kind, q in ((A.PROMPT_TOKENS_P50, "input_tokens", 0.5),
                         (A.PROMPT_TOKENS_P90, "input_tokens", 0.9),
                         (A.COMPLETION_TOKENS_P50, "output_tokens", 0.5),
                         (A.COMPLETION_TOKENS_P90, "output_tokens", 0.9)):
        assert row[col] == _expected_quantile(files, 83_400, kind, q)
    # language has no dataset.json: quantiles null; idle buckets: no cv
    lang = df[df[A.ARCHETYPE] == "language/m-large"]
    assert lang[A.PROMPT_TOKENS_P50].isna().all()
    assert df.loc[df[A.REQUESTS] == 0, A.RATE_CV].isna().all()
    assert df[A.PROMPT_TOKENS_SUM].isna().all()


def test_servegen_single_file_origin_and_archetype(test_data, tmp_path):
    trace = test_data / "servegen/reason/deepseek-r1/chunk-57-trace.csv"
    df = import_servegen(trace, origin_ms=1_700_000_000_000, archetype="reason")
    assert len(df) == 144 and set(df[A.ARCHETYPE]) == {"reason"}
    assert df[A.BUCKET_START].iloc[1] == 1_700_000_000_000 + 600_000
    raw = pd.read_csv(trace, header=None)
    active = df[A.REQUESTS] > 0
    np.testing.assert_allclose(df.loc[active, A.RATE_CV], raw.loc[active.to_numpy(), 2])
    back = read_aggregates(write_table(df, tmp_path / "servegen.csv"))
    assert back.rows_quarantined == 0 and back.rows_valid == 144


def test_servegen_bad_structure_names_file(tmp_path):
    bad = tmp_path / "chunk-0-trace.csv"
    bad.write_text("0,1.0,1.0,Gamma\n600,1.0,1.0,Gamma\n")
    with pytest.raises(ValueError, match="chunk-0-trace.csv"):
        import_servegen(bad)
    with pytest.raises(ValueError, match="chunk-N-trace.csv"):
        import_servegen(tmp_path / "empty")


def test_servegen_full(shared_data):
    df = import_servegen(shared_data / "traces/servegen")
    assert validate_aggregates(df).rows_quarantined == 0
    # 14 days (language) and 1 day (reason) of 10-minute buckets
    assert df.groupby(A.ARCHETYPE).size().to_dict() == {"language/m-large": 2016,
                                                        "reason/deepseek-r1": 144}
    assert df.attrs["import_report"]["clients"] == 162 + 73
    reason = df[df[A.ARCHETYPE] == "reason/deepseek-r1"]
    assert reason[A.PROMPT_TOKENS_P50].notna().all()
    assert (reason[A.PROMPT_TOKENS_P90] >= reason[A.PROMPT_TOKENS_P50]).all()
