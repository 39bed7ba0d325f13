"""Every valid file runs (issue 12): optional columns absent or all null, in every contract.

A user's file must end in a result, or in a one-line input error (the types of
`replaylab.apps.train.input_errors()`) that names the file and the column; never in a
traceback. This module takes a small slice of every shipped, importable source
(ledger-v1: the synthetic ledger, azure_code, azure_conv, burstgpt, mooncake;
outcomes-v1: routellm_gsm8k, routellm_mmlu, routerarena, llmrouter; aggregates-v1:
servegen), makes the variants below, writes each to a file (Parquet, JSON Lines or
CSV, in turn), reads it back through the contract reader and runs the pipelines on
it:

- `drop:<col>` / `null:<col>`: each optional column the source carries, dropped or
  set to null (outcomes-v1 allows a table without token counts; ledger-v1 a ledger
  with nothing optional);
- `drop:all` / `null:all`: every optional column at once (`null:all` also adds the
  optional columns the source lacks, all null);
- `null_required:<col>`: a nullable required column all null (ledger token counts);
- `shuffled`, `unknown_columns`, `texts` (unicode and empty prompt texts).

Ledger files go through the demand pipeline (`train_demand`, the library path of
`pipeline=demand`), the projection (`project_ledger`), the forecast aggregation and
the fleet workload; outcomes through `train_router` (with a hashed bag-of-words
embedding: the encoder is not what is under test; the real encoder runs in the
`python -m training pipeline=router` case below); aggregates through `run_forecast`.
A second family checks that an absent and an all-null optional column are read the
same by every reader (projection, demand labels, ledger profile, forecast aggregation,
fleet workload, router receipts, hint residuals, outcome matrix, forecast panel), in
Parquet and in a text format. Subprocess cases run `python -m training` and
`python -m evaluation residuals` as a user does: exit 0 on a valid file with optional
columns absent, exit 2 and one `error:` line naming the file and the column otherwise.

Figure rendering (matplotlib's tight layout and PNG encoding, ~85% of a small demand
run) is stubbed in the variant runs: the code that builds each figure from the data
still runs, only the pixels are not drawn. The `as_is` runs render for real.
"""

from __future__ import annotations

import functools
import hashlib
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from replaylab.apps.inputs import default_outcomes
from replaylab.apps.train import input_errors
from replaylab.contracts import (
    AGGREGATES_SCHEMA,
    LEDGER_SCHEMA,
    OUTCOMES_SCHEMA,
    read_aggregates,
    read_ledger,
    read_outcomes,
    write_table,
)
from replaylab.contracts.columns import Aggregates as A
from replaylab.contracts.columns import Ledger as L
from replaylab.contracts.columns import Outcomes as O
from replaylab.sources.registry import import_source
from replaylab.sources.synthetic import SyntheticLedgerConfig, generate_synthetic_ledger
from tests.conftest import REPO, TEST_DATA
from tests.helpers.router import ONE_HEAD

INPUT_ERRORS = input_errors()

# ---------------------------------------------------------------- sources (small slices)

LEDGER_FILES = {
    "azure_code": "azure_llm_2023/AzureLLMInferenceTrace_code_first200.csv",
    "azure_conv": "azure_llm_2023/AzureLLMInferenceTrace_conv_first200.csv",
    "burstgpt": "burstgpt/burstgpt3_first200.csv",
    "mooncake": "mooncake_fast25/conversation_trace_first200.jsonl",
}
LEDGER_SOURCES = ("synthetic", *LEDGER_FILES)
# outcomes: the paths under tests/data. A table keeps the first PROMPTS prompts; MMLU and
# RouterArena read slices of 60 prompts (tests/data/README_outcomes.md), as the router
# needs 50; GSM8K reads the package's shipped outcomes.
OUTCOME_FILES = {
    "routellm_gsm8k": "routellm/gsm8k/gsm8k_responses.csv",
    "routellm_mmlu": "routellm/mmlu_first60/responses",
    "routerarena": "routerarena_short60",
    "llmrouter": "llmrouter/dcrouter_preprocessed",
}
GSM8K_FULL = default_outcomes()  # shipped, Apache-2.0
PROMPTS = 60
MIXTRAL, GPT4 = "mistralai/Mixtral-8x7B-Instruct-v0.1", "gpt-4-1106-preview"

TEXTS = ("", "héllo wörld", "数学の問題を解いてください", "emoji 🚀🔥 test", "مرحبا بالعالم",
         "zero\u200bwidth and e\u0301 combining", "  ", "tab\tand\nnewline", "Ωmega ∑ ∫ √2")
UNKNOWN = {"zz_extra_int": lambda n: np.arange(n), "zz_extra_text": lambda n: [
    TEXTS[i % len(TEXTS)] for i in range(n)], "zz_extra_null": lambda n: [None] * n,
    "zz_extra_float": lambda n: np.where(np.arange(n) % 3 == 0, np.nan, 0.5)}


def _ledger_frame(name: str) -> pd.DataFrame:
    if name == "synthetic":
        return generate_synthetic_ledger(
            SyntheticLedgerConfig(n_sessions=150, sessions_per_s=0.25), seed=0)
    return import_source(name, str(TEST_DATA / LEDGER_FILES[name]))[1]


def _outcome_frame(name: str) -> pd.DataFrame:
    path = GSM8K_FULL if name == "routellm_gsm8k" else TEST_DATA / OUTCOME_FILES[name]
    frame = import_source(name, str(path))[1]
    if name == "llmrouter":  # two of the nine candidates: the cheapest and dearest listed
        frame = frame[frame[O.CANDIDATE].isin(_llmrouter_pair())]
    keep = pd.unique(frame[O.PROMPT_ID])[:PROMPTS]
    return frame[frame[O.PROMPT_ID].isin(keep)].reset_index(drop=True)


@functools.cache
def _llmrouter_prices() -> pd.DataFrame:
    """List prices of the candidates the dcrouter data scores, cheapest first."""
    from replaylab.sources.llmrouter import load_llmrouter_prices

    prices = load_llmrouter_prices(TEST_DATA / "llmrouter/llm_candidates/default_llm.json")
    scored = import_source("llmrouter", str(TEST_DATA / OUTCOME_FILES["llmrouter"]))[1]
    prices = prices[prices.index.isin(scored[O.CANDIDATE].unique())]
    return prices.assign(t=prices.sum(axis=1)).sort_values("t")


def _llmrouter_pair() -> list[str]:
    p = _llmrouter_prices()
    return [str(p.index[0]), str(p.index[-1])]


def _aggregates_frame() -> pd.DataFrame:
    return import_source("servegen", str(TEST_DATA / "servegen"))[1]


# ---------------------------------------------------------------- variants


def _optional(schema) -> list[str]:
    return [f.name for f in schema.fields if not f.required]


def _nullable_required(schema) -> list[str]:
    return [f.name for f in schema.fields if f.required and f.nullable]


def _null_like(s: pd.Series) -> pd.Series:
    """The column with every value null (keeping a dtype that can hold null)."""
    if pd.api.types.is_bool_dtype(s):
        return pd.Series(pd.NA, index=s.index, dtype="boolean")
    if pd.api.types.is_integer_dtype(s):
        return pd.Series(pd.NA, index=s.index, dtype="Int64")
    if pd.api.types.is_float_dtype(s):
        return pd.Series(np.nan, index=s.index, dtype="float64")
    return pd.Series(None, index=s.index, dtype=object)


def _texts_for(frame: pd.DataFrame, key: str | None, nullable: bool) -> list:
    """Unicode and empty texts; one per `key` value when given (a prompt's text is one)."""
    n = len(frame)
    if key is None:
        return [None if nullable and i % 5 == 4 else TEXTS[i % len(TEXTS)] for i in range(n)]
    codes = pd.factorize(frame[key])[0]
    return [TEXTS[c % len(TEXTS)] for c in codes]


def variant_names(frame: pd.DataFrame, schema) -> list[str]:
    """The variants of `frame` (see the module docstring), deterministic."""
    names = ["as_is"]
    for col in _optional(schema):
        if col in frame.columns:
            names.append(f"drop:{col}")
            if frame[col].notna().any():
                names.append(f"null:{col}")
    names += ["drop:all", "null:all"]
    names += [f"null_required:{c}" for c in _nullable_required(schema) if c in frame.columns]
    return names + ["shuffled", "unknown_columns", "texts"]


def make_variant(frame: pd.DataFrame, schema, name: str) -> pd.DataFrame:
    """Apply variant `name` to a contract frame (a copy)."""
    out = frame.copy()
    kind, _, col = name.partition(":")
    optional = [c for c in _optional(schema) if c in out.columns]
    if kind == "drop":
        return out.drop(columns=optional if col == "all" else [col])
    if kind in ("null", "null_required"):
        cols = optional if col == "all" else [col]
        for c in cols:
            out[c] = _null_like(out[c])
        if col == "all":  # the optional columns the source lacks, present and all null
            for c in _optional(schema):
                if c not in out.columns:
                    out[c] = pd.Series(None, index=out.index, dtype=object)
        return out
    if kind == "shuffled":
        order = np.random.default_rng(12).permutation(out.columns.to_numpy())
        return out[list(order)]
    if kind == "unknown_columns":
        return out.assign(**{c: make(len(out)) for c, make in UNKNOWN.items()})
    if kind == "texts":
        if schema is OUTCOMES_SCHEMA:
            return out.assign(**{O.PROMPT_TEXT: _texts_for(out, O.PROMPT_ID, False)})
        if schema is LEDGER_SCHEMA:
            return out.assign(**{L.PROMPT_TEXT: _texts_for(out, None, True),
                                 L.CATEGORY: _texts_for(out, None, True)})
        return out.assign(**{A.ARCHETYPE: out[A.ARCHETYPE] + " ∑ü"})
    if kind == "as_is":
        return out
    raise AssertionError(name)


def _fmt(index: int, text_format: str) -> str:
    return "parquet" if index % 2 == 0 else text_format


def _cases(sources: dict[str, pd.DataFrame], schema, text_format: str,
           slow: Callable[[str], bool] = lambda name: False) -> list:
    out = []
    for src, frame in sources.items():
        for i, name in enumerate(variant_names(frame, schema)):
            marks = [pytest.mark.slow] if slow(name) else []
            out.append(pytest.param(src, name, _fmt(i, text_format), id=f"{src}-{name}",
                                    marks=marks))
    return out


def _one_column_null(name: str) -> bool:
    """`null:<col>` of one column: the absent == all-null tests below already show every
    ledger reader reads it as `drop:<col>`, so its full pipeline run is the slow part."""
    return name.startswith("null:") and name != "null:all"


# Collection needs each source's columns; the committed slices are tiny (ms to read).
_LEDGER_CASES = _cases({s: _ledger_frame(s) for s in LEDGER_SOURCES}, LEDGER_SCHEMA, "jsonl",
                       slow=_one_column_null)
_OUTCOME_CASES = _cases({s: import_source(s, str(TEST_DATA / OUTCOME_FILES[s]))[1]
                         for s in OUTCOME_FILES}, OUTCOMES_SCHEMA, "jsonl")
_AGGREGATE_CASES = _cases({"servegen": _aggregates_frame()}, AGGREGATES_SCHEMA, "csv")


def _present_optional(frames: dict[str, pd.DataFrame], schema) -> list:
    return [pytest.param(s, c, id=f"{s}-{c}") for s, f in frames.items()
            for c in _optional(schema) if c in f.columns]


_LEDGER_PAIRS = _present_optional({s: _ledger_frame(s) for s in LEDGER_SOURCES}, LEDGER_SCHEMA)
_OUTCOME_PAIRS = _present_optional({"routerarena": _outcome_frame("routerarena")},
                                   OUTCOMES_SCHEMA)
_AGGREGATE_PAIRS = _present_optional({"servegen": _aggregates_frame()}, AGGREGATES_SCHEMA)


# ---------------------------------------------------------------- shared helpers


@pytest.fixture(scope="module")
def ledgers() -> dict[str, pd.DataFrame]:
    return {s: _ledger_frame(s) for s in LEDGER_SOURCES}


@pytest.fixture(scope="module")
def outcome_tables() -> dict[str, pd.DataFrame]:
    return {s: _outcome_frame(s) for s in OUTCOME_FILES}


@pytest.fixture
def no_rendering(monkeypatch):
    """Skip matplotlib's layout and PNG encoding; an empty file stands for each figure."""
    from matplotlib.figure import Figure

    def savefig(self, fname, *args, **kwargs):
        Path(fname).write_bytes(b"")

    monkeypatch.setattr(Figure, "savefig", savefig)
    monkeypatch.setattr(Figure, "tight_layout", lambda self, *a, **k: None)


def write(frame: pd.DataFrame, folder: Path, stem: str, fmt: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    return write_table(frame, folder / f"{stem}.{fmt}")


def ends_cleanly(run: Callable[[], object], *names: str) -> BaseException | None:
    """Run `run`; a result passes, an input error must be one line naming each of `names`."""
    try:
        run()
    except INPUT_ERRORS as e:
        msg = str(e)
        assert "\n" not in msg.strip(), f"multi-line error: {msg!r}"
        for n in names:
            assert n in msg, f"{type(e).__name__} does not name {n!r}: {msg}"
        return e
    return None


def hashed_embedding(texts: list[str]) -> np.ndarray:
    """A cheap deterministic stand-in encoder: hashed bag of words, 384-d, L2-normalized."""
    out = np.zeros((len(texts), 384), dtype=np.float32)
    for i, text in enumerate(texts):
        for word in str(text).lower().split():
            h = hashlib.blake2b(word.encode("utf-8"), digest_size=4).digest()
            out[i, int.from_bytes(h, "little") % 384] += 1.0
    out[:, 0] += 1e-3  # an empty text is still a unit vector
    return out / np.linalg.norm(out, axis=1, keepdims=True)


# ---------------------------------------------------------------- ledger-v1


SPLIT_MS = 1000


def _demand_config():
    from replaylab.demand import DemandConfig, QuantileModelConfig

    return DemandConfig(min_train_rows=20, min_calibration_rows=10,
                        model=QuantileModelConfig(n_estimators=20, num_threads=1,
                                                  min_child_samples=5))


def _run_ledger(path: Path, out: Path) -> dict[str, BaseException | None]:
    """Every ledger reader a user's file reaches; each ends in a result or a clean error."""
    from replaylab.fleet.sim.workload import workload_from_ledger
    from replaylab.forecast.config import AggregationConfig
    from replaylab.pipelines.demand import train_demand
    from replaylab.pipelines.forecast import aggregate_ledger
    from replaylab.pipelines.project import LoadedLedger, project_ledger
    from replaylab.projection import ProjectionConfig, SplitConfig

    result = read_ledger(path)
    assert result.rows_quarantined == 0, result.by_reason()
    loaded = LoadedLedger(result, origin=str(path))
    split = SplitConfig(embargo_ms=SPLIT_MS)
    return {
        "demand": ends_cleanly(lambda: train_demand(loaded, ProjectionConfig(), split,
                                                    _demand_config(), out / "demand"), str(path)),
        "project": ends_cleanly(lambda: project_ledger(loaded, ProjectionConfig(), split,
                                                       out / "project")),
        "aggregate": ends_cleanly(lambda: aggregate_ledger(
            result, AggregationConfig(bucket_seconds=60, k_min=1, trim_edges=False))),
        "workload": ends_cleanly(lambda: workload_from_ledger(result)),
    }


@pytest.mark.parametrize(("source", "variant", "fmt"), _LEDGER_CASES)
def test_ledger_variant_runs(source, variant, fmt, ledgers, tmp_path, request):
    if variant != "as_is":
        request.getfixturevalue("no_rendering")
    frame = make_variant(ledgers[source], LEDGER_SCHEMA, variant)
    path = write(frame, tmp_path, "ledger", fmt)
    errors = _run_ledger(path, tmp_path / "run")
    if variant == f"null_required:{L.COMPLETION_TOKENS}":  # nothing to learn from
        assert errors["demand"] is not None and L.COMPLETION_TOKENS in str(errors["demand"])
        errors.pop("demand")
    if variant == f"null_required:{L.PROMPT_TOKENS}":
        assert errors["demand"] is not None and L.PROMPT_TOKENS in str(errors["demand"])
        errors.pop("demand")
    assert errors == dict.fromkeys(errors), errors


def _ledger_views(path: Path) -> dict[str, object]:
    """What each reader makes of a ledger file (to compare absent and all-null columns)."""
    from replaylab.demand.labels import demand_labels
    from replaylab.fleet.sim.workload import workload_from_ledger
    from replaylab.forecast.aggregate import ledger_to_aggregates
    from replaylab.forecast.config import AggregationConfig
    from replaylab.pipelines.project import ledger_profile
    from replaylab.projection import ProjectionConfig, dispatch_time_features

    valid = read_ledger(path).valid
    features = dispatch_time_features(valid, ProjectionConfig(canary_checks=False))
    agg = ledger_to_aggregates(valid, AggregationConfig(bucket_seconds=60, k_min=1,
                                                        trim_edges=False))
    w = workload_from_ledger(valid)
    return {"features": features,
            "labels": demand_labels(features, valid).label_class.tolist(),
            "profile": ledger_profile(valid),
            "aggregates": agg.aggregates, "aggregation_report": agg.report,
            "workload": {"arrival": w.arrival_s.tolist(), "slo": w.slo_class.tolist(),
                         "slo_classes": w.slo_classes, "region": w.region.tolist(),
                         "cancel": w.cancel_after_s.tolist(),
                         "hint": np.nan_to_num(w.hint_p90, nan=-1.0).tolist()}}


def _pair_files(frame: pd.DataFrame, column: str, folder: Path, text_format: str) -> list:
    """(column absent, column all null) files, once in Parquet and once in `text_format`."""
    null = frame.assign(**{column: _null_like(frame[column])})
    return [(write(frame.drop(columns=[column]), folder, f"absent-{fmt}", fmt),
             write(null, folder, f"null-{fmt}", fmt)) for fmt in ("parquet", text_format)]


def _assert_same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        if isinstance(a[k], pd.DataFrame):
            pd.testing.assert_frame_equal(a[k], b[k], obj=k)
        else:
            assert a[k] == b[k], k


@pytest.mark.parametrize(("source", "column"), _LEDGER_PAIRS)
def test_ledger_absent_and_all_null_read_the_same(source, column, ledgers, tmp_path):
    for absent, null in _pair_files(ledgers[source], column, tmp_path, "jsonl"):
        _assert_same(_ledger_views(absent), _ledger_views(null))


HINT_OPTIONAL = (L.HINT_P90, L.HINT_LO, L.HINT_HI, L.HINT_INTERVAL, L.HINT_FALLBACK,
                 L.HINT_MODEL_VERSION, L.ACK_STATE, L.CATEGORY, L.SLO_CLASS, L.FINISH_REASON)


def _with_hints(frame: pd.DataFrame) -> pd.DataFrame:
    """A hinted ledger (as `replay_hints` or serving writes one), hints made up from tokens."""
    total = frame[L.PROMPT_TOKENS].astype("float64").fillna(0.0).to_numpy() + 200.0
    return frame.assign(**{L.HINT_P50: total, L.HINT_P90: total * 1.5, L.HINT_LO: total * 0.5,
                           L.HINT_HI: total * 2.0, L.HINT_INTERVAL: 0.8, L.HINT_FALLBACK: False,
                           L.HINT_MODEL_VERSION: "1.0.0+abc", L.ACK_STATE: "used"})


@pytest.mark.parametrize("column", HINT_OPTIONAL)
def test_residuals_absent_and_all_null_read_the_same(column, ledgers, tmp_path):
    from replaylab.hints.residuals import residual_summary

    hinted = _with_hints(ledgers["synthetic"])
    for absent, null in _pair_files(hinted, column, tmp_path, "jsonl"):
        a, b = (json.dumps(residual_summary(read_ledger(p).valid, min_group_rows=5),
                           sort_keys=True, default=str) for p in (absent, null))
        assert a == b


def test_residuals_without_p50_is_one_error_absent_or_null(ledgers):
    from replaylab.hints.residuals import ResidualDataError, residual_summary

    hinted = _with_hints(ledgers["synthetic"])
    messages = set()
    for frame in (hinted.drop(columns=[L.HINT_P50]), hinted.assign(**{L.HINT_P50: np.nan})):
        with pytest.raises(ResidualDataError) as e:
            residual_summary(frame)
        messages.add(str(e.value))
    assert len(messages) == 1 and L.HINT_P50 in messages.pop()


RECEIPT_OPTIONAL = (L.OUTCOME_SCORE, L.OUTCOME_STATUS, L.ACTUAL_COST, L.REBIND_REASON,
                    L.ROUTING_SOURCE, L.CATEGORY)


@pytest.mark.parametrize("column", RECEIPT_OPTIONAL)
def test_receipts_absent_and_all_null_read_the_same(column, ledgers, tmp_path):
    """The synthetic ledger is a receipts ledger (bindings, propensities, outcomes)."""
    from replaylab.router.exploration import bandit_rows

    for absent, null in _pair_files(ledgers["synthetic"], column, tmp_path, "jsonl"):
        pd.testing.assert_frame_equal(bandit_rows(read_ledger(absent).valid),
                                      bandit_rows(read_ledger(null).valid))


def test_receipts_without_outcomes_are_one_error_absent_or_null(ledgers):
    from replaylab.router.exploration import bandit_rows

    frame, both = ledgers["synthetic"], [L.OUTCOME_SCORE, L.OUTCOME_STATUS]
    messages = set()
    for f in (frame.drop(columns=both), frame.assign(**{c: None for c in both})):
        with pytest.raises(ValueError) as e:
            bandit_rows(f)
        messages.add(str(e.value))
    assert len(messages) == 1 and L.OUTCOME_STATUS in messages.pop()


# ---------------------------------------------------------------- outcomes-v1


def _router_config(source: str, table: pd.DataFrame):
    from replaylab.router.pipeline_config import router_config

    cands = sorted(table[O.CANDIDATE].unique())
    cost: dict = {"prices": {}, "call_cost_usd": {}}
    if source.startswith("routellm"):
        cands = [MIXTRAL, GPT4]
        cost["call_cost_usd"] = {MIXTRAL: 0.00012, GPT4: 0.01235}
    elif source == "llmrouter":  # no tokens, no cost: the listed price x 250 tokens a call
        prices = _llmrouter_prices()
        cands = _llmrouter_pair()
        cost["call_cost_usd"] = {c: float(prices.at[c, "t"] * 250 / 1e6) for c in cands}
    elif source == "routerarena":  # measured cost; RouterArena's cost.json for tokens
        raw = json.loads((TEST_DATA / "routerarena/model_cost/cost.json").read_text())
        cost["prices"] = {c: {"input_usd_per_million": raw[c]["input_token_price_per_million"],
                              "output_usd_per_million": raw[c]["output_token_price_per_million"]}
                          for c in cands}
    return router_config({
        "candidates": cands, "cost": cost, "split": [0.6, 0.2, 0.2],
        "head": {"max_epochs": 5, "hidden": [64], "num_threads": 1},
        "go": {"n_boot": 100, "curve_fractions": [0.5, 1.0]}, "evaluation": {"n_boot": 100},
        "lgbm_estimators": 10, "knn_neighbors": 5})


def _no_cost_at_all(source: str, variant: str) -> bool:
    """RouterArena is configured with prices, not per-call costs: without measured cost and
    token counts nothing prices a call, and the run must say so."""
    gone = {"drop:all", "null:all"}
    return source == "routerarena" and variant in gone


@pytest.mark.parametrize(("source", "variant", "fmt"), _OUTCOME_CASES)
def test_outcomes_variant_trains_the_router(source, variant, fmt, outcome_tables, tmp_path):
    from replaylab.pipelines.router import train_router

    table = outcome_tables[source]
    frame = make_variant(table, OUTCOMES_SCHEMA, variant)
    path = write(frame, tmp_path, "outcomes", fmt)
    result = read_outcomes(path)
    assert result.rows_quarantined == 0, result.by_reason()
    cfg = _router_config(source, table)
    summaries = []

    def run():
        summaries.append(train_router(result.valid, cfg, tmp_path / "router",
                                      hashed_embedding)[0])

    if _no_cost_at_all(source, variant):  # found before the table's size is looked at
        err = ends_cleanly(run, str(path), O.COST)
        assert err is not None, "a table without cost or token counts trained"
        return
    assert ends_cleanly(run) is None
    s = summaries[0]
    assert s["prompts"] == table[O.PROMPT_ID].nunique()
    assert set(s["test"]) >= {"learned", "rules", "oracle"}


def _matrix_view(path: Path, cfg) -> dict:
    from replaylab.router.replay import outcome_matrix

    m = outcome_matrix(read_outcomes(path).valid, cfg.cost, candidates=cfg.candidates)
    return {"meta": m.meta, "report": m.report,
            **{k: getattr(m, k).tolist() for k in ("score", "success", "cost")},
            **{k: np.nan_to_num(getattr(m, k), nan=-1).tolist()
               for k in ("prompt_tokens", "completion_tokens")}}


@pytest.mark.parametrize(("source", "column"), _OUTCOME_PAIRS)
def test_outcomes_absent_and_all_null_read_the_same(source, column, outcome_tables, tmp_path):
    frame = outcome_tables[source]
    cfg = _router_config(source, frame)
    for absent, null in _pair_files(frame, column, tmp_path, "jsonl"):
        _assert_same(_matrix_view(absent, cfg), _matrix_view(null, cfg))


# ---------------------------------------------------------------- aggregates-v1


def _forecast_config():
    from replaylab.forecast import ForecastConfig
    from replaylab.forecast.config import BacktestConfig

    return ForecastConfig(forecasters=("seasonal_naive", "moving_window"), include_total=True,
                          backtest=BacktestConfig(horizon_buckets=3, n_windows=2,
                                                  min_train_buckets=12, conformal_windows=2))


@pytest.mark.parametrize(("source", "variant", "fmt"), _AGGREGATE_CASES)
def test_aggregates_variant_forecasts(source, variant, fmt, tmp_path, request):
    from replaylab.pipelines.forecast import run_forecast

    if variant != "as_is":
        request.getfixturevalue("no_rendering")
    frame = make_variant(_aggregates_frame(), AGGREGATES_SCHEMA, variant)
    path = write(frame, tmp_path, "aggregates", fmt)
    result = read_aggregates(path)
    assert result.rows_quarantined == 0, result.by_reason()
    summaries = []
    assert ends_cleanly(lambda: summaries.append(run_forecast(result, _forecast_config(),
                                                              tmp_path / "forecast"))) is None
    assert summaries[0]["series"] >= 1


def _panel_view(path: Path) -> dict:
    from replaylab.forecast.drift import archetype_mix_drift
    from replaylab.forecast.panel import build_panel

    valid = read_aggregates(path).valid
    panel = build_panel(valid, _forecast_config())
    return {"y": panel.y.tolist(), "ids": panel.ids, "selection": panel.selection,
            "drift": json.dumps(archetype_mix_drift(valid, None), sort_keys=True, default=str)}


@pytest.mark.parametrize(("source", "column"), _AGGREGATE_PAIRS)
def test_aggregates_absent_and_all_null_read_the_same(source, column, tmp_path):
    for absent, null in _pair_files(_aggregates_frame(), column, tmp_path, "csv"):
        _assert_same(_panel_view(absent), _panel_view(null))


# ---------------------------------------------------------------- entry points


def _cli(module: str, *overrides: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *overrides, "tracking=off"], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)


def assert_clean_exit_2(proc: subprocess.CompletedProcess, *names: str) -> str:
    """Exit code 2, no traceback, exactly one `error:` line (the last), naming `names`."""
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-3000:])
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 1 and proc.stderr.strip().splitlines()[-1] == errors[0], proc.stderr
    for n in names:
        assert n in errors[0], (n, errors[0])
    return errors[0]


def assert_ok(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, proc.stderr[-3000:]


def _required_only(frame: pd.DataFrame, schema) -> pd.DataFrame:
    return frame[[c for c in frame.columns if c in schema.required_columns]]


def test_cli_project_runs_a_ledger_with_required_columns_only(ledgers, tmp_path):
    path = write(_required_only(ledgers["burstgpt"], LEDGER_SCHEMA), tmp_path, "ledger", "jsonl")
    assert_ok(_cli("training", "pipeline=project", f"data.ledger={path}",
                   f"hydra.run.dir={tmp_path / 'run'}"))
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert s["rows_valid"] == len(ledgers["burstgpt"])


def test_cli_demand_on_a_ledger_without_usage_names_file_and_column(ledgers, tmp_path):
    frame = ledgers["azure_code"].assign(**{L.COMPLETION_TOKENS: None})
    path = write(frame, tmp_path, "no_usage", "parquet")
    assert_clean_exit_2(_cli("training", "pipeline=demand", f"data.ledger={path}",
                             f"hydra.run.dir={tmp_path / 'run'}"), str(path), L.COMPLETION_TOKENS)


def test_cli_forecast_runs_aggregates_without_optional_columns(tmp_path):
    path = write(_required_only(_aggregates_frame(), AGGREGATES_SCHEMA), tmp_path, "agg", "csv")
    assert_ok(_cli("training", "pipeline=forecast", f"data.aggregates={path}",
                   f"hydra.run.dir={tmp_path / 'run'}",
                   "forecast.forecasters=[seasonal_naive,moving_window]",
                   "forecast.backtest.horizon_buckets=3", "forecast.backtest.n_windows=2",
                   "forecast.backtest.min_train_buckets=12",
                   "forecast.backtest.conformal_windows=2"))


def test_cli_forecast_missing_required_column_names_file_and_column(tmp_path):
    path = write(_aggregates_frame().drop(columns=[A.REQUESTS]), tmp_path, "agg", "csv")
    assert_clean_exit_2(_cli("training", "pipeline=forecast", f"data.aggregates={path}",
                             f"hydra.run.dir={tmp_path / 'run'}"), str(path), A.REQUESTS)


def test_cli_router_missing_required_column_names_file_and_column(outcome_tables, tmp_path):
    path = write(outcome_tables["routellm_gsm8k"].drop(columns=[O.SCORE]), tmp_path, "o",
                 "parquet")
    assert_clean_exit_2(_cli("training", "pipeline=router", f"data.outcomes={path}",
                             f"hydra.run.dir={tmp_path / 'run'}"), str(path), O.SCORE)


# The encoder is exported once into the default cache (`outputs/cache`, as `make run`
# does) and reused while it verifies; int8 is not under test here.
ROUTER_CLI = ("router.encoder.int8=false", "router.head.max_epochs=5",
              "router.lgbm_estimators=10", "router.go.n_boot=100", "router.evaluation.n_boot=100",
              *ONE_HEAD)


@pytest.mark.slow
def test_cli_router_runs_outcomes_without_token_columns(outcome_tables, tmp_path):
    """The issue's case: cost on every row, no prompt_tokens / completion_tokens columns,
    through `python -m training pipeline=router` and the real MiniLM encoder."""
    table = outcome_tables["routerarena"]
    path = write(table.drop(columns=[O.PROMPT_TOKENS, O.COMPLETION_TOKENS]), tmp_path, "ra",
                 "parquet")
    cands = ",".join(sorted(table[O.CANDIDATE].unique()))
    assert_ok(_cli("training", "pipeline=router", f"data.outcomes={path}",
                   f"router.candidates=[{cands}]", *ROUTER_CLI,
                   f"hydra.run.dir={tmp_path / 'run'}", timeout=500))
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert s["outcomes"]["cost_source"] == {c: {"measured": PROMPTS} for c in cands.split(",")}
    assert s["compute"] == {"kind": "local"}  # an outcome table trains in this process


@pytest.mark.slow
def test_cli_router_without_any_cost_names_file_and_column(outcome_tables, tmp_path):
    """LLMRouter has neither cost nor token counts: with no per-call cost configured for
    its candidates, the run stops in one line naming the file and the column."""
    path = write(outcome_tables["llmrouter"], tmp_path, "llmrouter", "parquet")
    line = assert_clean_exit_2(_cli(
        "training", "pipeline=router", f"data.outcomes={path}",
        f"router.candidates=[{','.join(_llmrouter_pair())}]", *ROUTER_CLI,
        f"hydra.run.dir={tmp_path / 'run'}", timeout=500), str(path), O.COST)
    assert "call_cost_usd" in line


def _hinted(frame: pd.DataFrame) -> pd.DataFrame:
    """Required columns plus the four hint values residuals need; nothing else optional."""
    out = _required_only(frame, LEDGER_SCHEMA).copy()
    total = (out[L.PROMPT_TOKENS].astype("float64") + 200.0).to_numpy()
    return out.assign(**{L.HINT_P50: total, L.HINT_P90: total * 1.5, L.HINT_LO: total * 0.5,
                         L.HINT_HI: total * 2.0})


def test_cli_residuals_runs_a_hinted_ledger_without_optional_columns(ledgers, tmp_path):
    path = write(_hinted(ledgers["azure_conv"]), tmp_path, "hinted", "jsonl")
    assert_ok(_cli("evaluation", "experiment=residuals", f"data.ledger={path}",
                   f"hydra.run.dir={tmp_path / 'run'}"))


def test_cli_residuals_on_an_invalid_ledger_names_file_and_column(ledgers, tmp_path):
    path = write(_hinted(ledgers["azure_conv"]).drop(columns=[L.SELECTED_MODEL]), tmp_path,
                 "bad", "parquet")
    assert_clean_exit_2(_cli("evaluation", "experiment=residuals", f"data.ledger={path}",
                             f"hydra.run.dir={tmp_path / 'run'}"), str(path), L.SELECTED_MODEL)


def test_cli_residuals_on_a_ledger_without_hints_names_file_and_column(ledgers, tmp_path):
    path = write(ledgers["azure_conv"], tmp_path, "plain", "parquet")
    assert_clean_exit_2(_cli("evaluation", "experiment=residuals", f"data.ledger={path}",
                             f"hydra.run.dir={tmp_path / 'run'}"), str(path), L.HINT_P50)


def test_case_count():
    """How many cases this module runs (quoted in the issue's closing note)."""
    counts = {"ledger variants": len(_LEDGER_CASES), "outcomes variants": len(_OUTCOME_CASES),
              "aggregates variants": len(_AGGREGATE_CASES),
              "absent == all-null pairs": len(_LEDGER_PAIRS) + len(_OUTCOME_PAIRS)
              + len(_AGGREGATE_PAIRS) + len(HINT_OPTIONAL) + len(RECEIPT_OPTIONAL)}
    counts["entry-point subprocess cases"] = sum(1 for name in globals()
                                                 if name.startswith("test_cli_"))
    print(f"test_valid_inputs: {sum(counts.values())} cases {counts}")
    assert counts["ledger variants"] >= 5 * 6 and counts["outcomes variants"] >= 4 * 6
