"""`fleet.workload`: every fleet experiment on a user's own ledger-v1 file.

Two ledgers are written here, each as JSON Lines and as Parquet:

- RAGPulse-shaped (flashserve/RAGPulse `0_trace.jsonl`: sessions of a RAG Q&A service,
  prompts of 1.05k-7.7k tokens with the retrieved passages, outputs of 7-2.2k): some
  rows without usage, some cut at their cap (finish_reason=length), some cancelled;
- Azure-shaped: 400 rows of the Azure LLM 2023 conversation trace (the slice the package
  ships) through `replaylab.sources.azure` (no sessions, every row completed).

Into each, rows the contract must quarantine are planted (negative token counts, an
unknown lifecycle state; in the JSON Lines RAGPulse file also a line that is not JSON).
Every experiment is composed from its conf/experiment/<name>.yaml with
`fleet.workload.ledger=PATH` (small sizes) and run by the evaluation entry point's job
(`replaylab.apps.evaluate.run_experiment`); the summary's `workload` must name the file
by its sha256, count exactly the planted bad rows as quarantined, and account for every
row read.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

REPO = Path(__file__).resolve().parents[2]
FLEET = ("energy", "hint_admission", "stale_telemetry", "rollout", "overload")
T0_MS = 1_757_476_800_000          # RAGPulse's week: 2025-09-10
SPAN_S = 7200                      # the RAGPulse-shaped ledger's rows lie in [T0, T0 + 2 h)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def ragpulse_frame(n_sessions: int = 170, seed: int = 0) -> tuple[pd.DataFrame, dict]:
    """(ledger-v1 frame, planted counts): sessions of 1-5 turns, 20-180 s apart."""
    rng = np.random.default_rng(seed)
    alphabet = list("abcdefghijklmnopqrstuvwxyz0123456789")
    rows = []
    for s in range(n_sessions):
        sid = f"{T0_MS + 997 * s}-{''.join(rng.choice(alphabet, 12))}"
        t = rng.uniform(0, SPAN_S - 600)
        for k in range(int(rng.integers(1, 6))):
            if t >= SPAN_S - 1:
                break
            prompt = int(np.clip(rng.lognormal(np.log(3200), 0.35), 1050, 7700))
            out = int(np.clip(rng.lognormal(np.log(200), 0.7), 7, 2180))
            rows.append({"ledger_version": "1", "request_id": f"rag-{len(rows)}",
                         "session_id": sid, "turn_index": k, "timestamp": int(T0_MS + 1000 * t),
                         "prompt_tokens": prompt, "completion_tokens": out,
                         "lifecycle_state": "completed", "finish_reason": "stop",
                         "max_tokens": None, "duration_ms": 250 + 25 * out,
                         "selected_model": "qwen2.5-32b-rag", "category": "rag",
                         "slo_class": "interactive"})
            t += rng.uniform(20, 180)
    df = pd.DataFrame(rows).sort_values("timestamp", kind="stable").reset_index(drop=True)
    df["completion_tokens"] = df["completion_tokens"].astype("Int64")
    df["max_tokens"] = df["max_tokens"].astype("Int64")
    idx = np.arange(len(df))
    r = idx % 40  # disjoint sets of rows
    length, absent, cancelled = idx[(r == 5) | (r == 25)], idx[r == 11], idx[r == 17]
    bad_tokens, bad_state = idx[(r == 29) & (idx < 200)], idx[(r == 37) & (idx < 200)]
    df.loc[length, "max_tokens"] = 256
    df.loc[length, "completion_tokens"] = 256
    df.loc[length, "finish_reason"] = "length"
    df.loc[absent, "completion_tokens"] = pd.NA
    df.loc[absent, "finish_reason"] = "unknown"
    df.loc[cancelled, "lifecycle_state"] = "aborted"
    df.loc[cancelled, "finish_reason"] = "cancelled"
    df.loc[bad_tokens, "prompt_tokens"] = -1
    df.loc[bad_state, "lifecycle_state"] = "exploded"
    return df, {"rows": len(df), "bad": len(bad_tokens) + len(bad_state),
                "absent_usage": len(absent), "length": len(length), "cancelled": len(cancelled)}


def azure_frame(tmp: Path) -> tuple[pd.DataFrame, dict]:
    """400 rows of the Azure conversation trace via replaylab.sources.azure, 3 of them bad."""
    from replaylab.data import shipped
    from replaylab.fleet.experiments.workloads import AZURE_SLICE
    from replaylab.sources.azure import import_azure_llm_2023

    src = shipped("fleet", AZURE_SLICE)
    csv = tmp / "AzureLLMInferenceTrace_conv.csv"
    pd.read_csv(src, nrows=400).to_csv(csv, index=False)
    df = import_azure_llm_2023(csv)
    df["completion_tokens"] = df["completion_tokens"].astype("Int64")
    df["lifecycle_state"] = df["lifecycle_state"].astype(object)
    df.loc[[10, 200], "completion_tokens"] = -3
    df.loc[300, "lifecycle_state"] = "exploded"
    return df, {"rows": len(df), "bad": 3, "absent_usage": 0, "length": 0, "cancelled": 0}


@pytest.fixture(scope="module")
def ledgers(tmp_path_factory) -> dict[str, tuple[Path, dict]]:
    """name -> (file, planted counts + the window length covering every row)."""
    from replaylab.contracts import write_table

    tmp = tmp_path_factory.mktemp("ledgers")
    out = {}
    rag, rag_n = ragpulse_frame()
    az, az_n = azure_frame(tmp)
    for name, df, n in (("ragpulse", rag, rag_n), ("azure", az, az_n)):
        ts = df["timestamp"].to_numpy("int64")
        n["window_s"] = math.ceil((ts.max() - ts.min() + 1) / 2 / 1000) + 1  # 2 windows: all rows
        for ext in ("jsonl", "parquet"):
            path = write_table(df, tmp / f"{name}.{ext}")
            planted = dict(n)
            if name == "ragpulse" and ext == "jsonl":  # one more bad row: a line that is no JSON
                with path.open("a") as fh:
                    fh.write("{not json\n")
                planted["bad"] += 1
                planted["rows"] += 1
            out[f"{name}.{ext}"] = (path, planted)
    return out


def compose(name: str, *overrides: str):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from replaylab.apps.schemas import register_schemas

    register_schemas()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return hydra_compose(config_name="evaluate", overrides=[
            f"experiment={name}", *overrides])


def small(name: str, window_s: float | None) -> list[str]:
    """Overrides that shrink each experiment (2 windows; hint: 2 windows of its test window)."""
    win = ["fleet.workload.windows=2"]
    if name != "hint_admission":
        win.append(f"fleet.workload.window_s={window_s}")
    return win + {
        "energy": [], "stale_telemetry": [], "rollout": ["experiment.shares=[0.0,0.5]"],
        "overload": ["experiment.load_factors=[1.0,2.0]"],
        "hint_admission": [],
    }[name]


def run_on_ledger(name: str, path: Path, planted: dict, run_dir: Path, *extra: str) -> dict:
    from replaylab.apps.evaluate import run_experiment

    cfg = compose(name, f"fleet.workload.ledger={path}",
                  *small(name, planted["window_s"]), *extra)
    return run_experiment(cfg, run_dir)


def check_workload(s: dict, path: Path, planted: dict, name: str) -> None:
    w = s["workload"]
    assert w["source"] == "ledger" and w["file"] == str(path)
    assert w["fingerprint"] == _sha256(path)
    assert w["rows_read"] == planted["rows"]
    assert w["rows_quarantined"] == planted["bad"]
    assert sum(w["quarantine_by_reason"].values()) == planted["bad"]
    # every row read is quarantined, used or skipped for a stated reason
    assert w["rows_read"] == w["rows_quarantined"] + w["rows_used"] + sum(w["rows_skipped"].values())
    assert w["rows_used"] > 0 and w["windows"] == 2
    if name == "hint_admission":  # the test window only: train/calibration rows are not replayed
        assert w["rows_skipped"]["not_test_window"] > 0
        assert w["requests_simulated"] == w["rows_used"]
        return
    # 2 windows cover every row: only the planted rows without usage are left out
    assert w["rows_skipped"]["outside_windows"] == 0
    assert w["rows_skipped"]["absent_usage"] == planted["absent_usage"]
    assert w["rows_used"] == planted["rows"] - planted["bad"] - planted["absent_usage"]
    assert w["rows_censored"]["length"] == planted["length"]
    assert w["rows_censored"]["cancelled"] == planted["cancelled"]
    loads = len(s["load_factors"]) if name == "overload" else 1
    assert w["requests_simulated"] == loads * w["rows_used"]


def check_policies(s: dict) -> None:
    assert s["policies"] and s["conserved"] is True
    for pname, p in s["policies"].items():
        assert p["arrived"] == p["completed"] + p["rejected"] + p["timed_out"] + p["cancelled"], \
            pname
        assert p["conserved"] is True
    json.dumps(s, allow_nan=False)


CASES = [pytest.param(name, led, marks=pytest.mark.slow if name == "hint_admission" else ())
         for name in FLEET for led in ("ragpulse.jsonl", "azure.parquet")
         if not (name == "hint_admission" and led == "azure.parquet")]


@pytest.mark.parametrize("name, ledger", CASES)
def test_every_fleet_experiment_runs_on_a_ledger_file(name, ledger, ledgers, tmp_path):
    path, planted = ledgers[ledger]
    s = run_on_ledger(name, path, planted, tmp_path)
    assert s["experiment"] == name and s["pipeline"] == "fleet"
    check_policies(s)
    check_workload(s, path, planted, name)
    if name == "energy":
        assert set(s["ranking"]) == {"least_loaded", "static_efficient", "energy_aware"}
        for p in s["ranking"]:
            pol = s["policies"][p]
            assert pol["joules_per_success"] > 0 and 0 <= pol["slo_attainment"] <= 1
        jt = [s["policies"][p]["joules_per_output_token"] for p in s["ranking"]]
        assert jt == sorted(jt)  # ranked by energy per output token


@pytest.mark.slow
def test_hint_admission_trains_on_an_azure_shaped_ledger(ledgers, tmp_path):
    path, planted = ledgers["azure.jsonl"]
    # 400 rows span 75 s: the default 5-minute embargo between splits would empty train
    s = run_on_ledger("hint_admission", path, planted, tmp_path,
                      "experiment.ledger.embargo_ms=2000")
    check_policies(s)
    check_workload(s, path, planted, "hint_admission")
    assert s["artifact"]["ledger_rows"] == planted["rows"] - planted["bad"]
    assert [q["window"] for q in s["hint_quality_test"]] == [0, 1]


def test_parquet_and_jsonl_replay_the_same_requests(ledgers, tmp_path):
    """The same ledger in either format: the same simulation; only file and hash differ."""
    out = {}
    for ext in ("jsonl", "parquet"):
        path, planted = ledgers[f"azure.{ext}"]
        out[ext] = run_on_ledger("energy", path, planted, tmp_path / ext)
    a, b = out["jsonl"], out["parquet"]
    assert a["policies"] == b["policies"]
    assert a["workload"]["fingerprint"] != b["workload"]["fingerprint"]
    same = ("rows_read", "rows_quarantined", "rows_used", "rows_skipped", "requests_simulated")
    assert {k: a["workload"][k] for k in same} == {k: b["workload"][k] for k in same}


@pytest.mark.parametrize("name", FLEET)
def test_fleet_workload_is_one_section_with_checked_keys(name, tmp_path):
    from hydra.errors import ConfigCompositionException

    cfg = compose(name, "fleet.workload.ledger=my_ledger.jsonl")
    assert cfg.fleet.workload.ledger == "my_ledger.jsonl"
    assert "workload" not in cfg.experiment  # one section, not a copy per experiment
    for bad in ("fleet.workload.ledgr=1", "experiment.workload.ledger=x"):
        with pytest.raises(ConfigCompositionException, match="ledg"):
            compose(name, bad)
    # Hydra's explicit append (+key=value) passes composition: the library names the key
    from replaylab.apps.evaluate import run_experiment
    from replaylab.config import ConfigError

    with pytest.raises(ConfigError, match="ledgr"):
        run_experiment(compose(name, "+fleet.workload.ledgr=1"), tmp_path)


def test_a_bad_ledger_is_one_clear_error(tmp_path):
    from replaylab.apps.evaluate import run_experiment
    from replaylab.config import ConfigError
    from replaylab.contracts import ContractError

    not_parquet = tmp_path / "ledger.parquet"
    not_parquet.write_text("timestamp,prompt_tokens\n1,2\n")
    missing = tmp_path / "missing.jsonl"
    with pytest.raises(FileNotFoundError, match="no such file.*ledger-v1.*pipeline=import"):
        run_experiment(compose("energy", f"fleet.workload.ledger={missing}"), tmp_path / "run")
    cfg = compose("energy", f"fleet.workload.ledger={not_parquet}")
    with pytest.raises(ContractError, match="not a readable Parquet file"):
        run_experiment(cfg, tmp_path / "run")
    with pytest.raises(ConfigError, match="fleet.workload.source"):
        run_experiment(compose("energy", "fleet.workload.source=cdf"), tmp_path / "run")


@pytest.mark.slow
def test_entry_point_energy_on_a_ledger_and_on_a_missing_one(ledgers, tmp_path):
    path, planted = ledgers["ragpulse.parquet"]
    from tests.helpers.entrypoints import evaluate

    base = ["experiment=energy", "tracking=off", *small("energy", planted["window_s"])]
    out = tmp_path / "run"
    proc = evaluate(*base, f"fleet.workload.ledger={path}", run_dir=out, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    s = proc.summary
    check_policies(s)
    check_workload(s, path, planted, "energy")
    missing = tmp_path / "nope.jsonl"
    proc = evaluate(*base, f"fleet.workload.ledger={missing}", run_dir=tmp_path / "bad",
                    check=False)
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and str(missing) in errors[0] and "Traceback" not in proc.stderr


@pytest.mark.slow
def test_autoscaling_runs_on_a_ledger_file(ledgers, tmp_path):
    """experiment=autoscaling with fleet.workload.ledger: the file's arrivals (stretched to
    two days: history + the evaluated day) give the rates and its rows the tokens."""
    from replaylab.apps.evaluate import run_experiment

    path, planted = ledgers["ragpulse.parquet"]
    cfg = compose("autoscaling", f"fleet.workload.ledger={path}",
                  f"fleet.workload.time_scale={SPAN_S / (50 * 3600)}",   # 2 h -> 50 h
                  "experiment.trace.day=1", "experiment.trace.hours=2", "experiment.seeds=[0]",
                  "experiment.sweep=null", "experiment.workers=1",
                  "~experiment.scenarios.mix_drift", "~experiment.scenarios.under_forecast")
    s = run_experiment(cfg, tmp_path)
    assert s["experiment"] == "autoscaling" and s["conserved"] is True
    assert s["trace"]["source"] == "ledger" and s["trace"]["scale"] == 1.0
    assert set(s["scenarios"]) == {"steady", "burst"}
    for pols in s["scenarios"].values():
        assert set(pols) == {"static", "reactive", "forecast"}
    w = s["workload"]
    assert w["source"] == "ledger" and w["fingerprint"] == _sha256(path)
    assert w["rows_quarantined"] == planted["bad"]
    assert w["rows_skipped"]["absent_usage"] == planted["absent_usage"]
    assert w["rows_used"] == planted["rows"] - planted["bad"] - planted["absent_usage"]
    assert w["rows_censored"]["length"] == planted["length"]
    # the token sample is the ledger's rows with usage
    assert s["capacity"]["token_rows"] == w["rows_used"]
    json.dumps(s, allow_nan=False)
