"""`python -m training pipeline=forecast` with no data argument: the embedded default is long
enough for the default backtest, and the run ends with one verdict line (the gate's)."""

from __future__ import annotations

import json
from pathlib import Path

from hydra import compose, initialize_config_dir

from replaylab.apps.schemas import register_schemas
from replaylab.apps.verdicts import run_tags, summary_go, verdict_line
from replaylab.config import from_mapping
from replaylab.forecast import ForecastConfig
from tests.helpers.entrypoints import train

CONF = Path(__file__).resolve().parents[2] / "conf"
DECISIONS = ("GO", "NO-GO", "NOT ENOUGH EVIDENCE")


def test_the_bare_config_holds_the_default_backtest_and_a_daily_season():
    register_schemas()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="train", overrides=["pipeline=forecast"])
    assert cfg.data.ledger is None and cfg.data.aggregates is None
    syn = cfg.data.synthetic
    fc = from_mapping(ForecastConfig, dict(cfg.forecast), "forecast")
    bt, width = fc.backtest, fc.aggregation.bucket_seconds
    buckets = int(syn.n_sessions / syn.sessions_per_s // width) - 2  # the trimmed edges
    test = bt.horizon_buckets + bt.step * (bt.n_windows - 1)
    assert buckets - test >= 2 * 86_400 // width  # the daily season, twice, before the backtest
    assert bt.n_windows >= fc.gate.min_origins and syn.diurnal_amplitude > 0


def test_bare_forecast_runs_tiny_and_ends_with_the_verdict_line(tmp_path):
    out = tmp_path / "run"
    proc = train("pipeline=forecast", "tracking=off", "data.synthetic.n_sessions=5000",
                 "data.synthetic.sessions_per_s=0.04",
                 "forecast.forecasters=[seasonal_naive,moving_window,auto_ets]", run_dir=out)
    last = proc.stdout.strip().splitlines()[-1]
    s = json.loads((out / "summary.json").read_text())
    assert last == s["verdict"] == verdict_line(s)
    assert last.startswith("forecast: ") and s["gate"]["decision"] in DECISIONS
    assert last.startswith(f"forecast: {s['gate']['decision']} (")
    assert s["plan"]["n_windows"] == 24 and s["gate"]["origins"] == 24


def test_not_enough_evidence_has_no_go_tag():
    s = {"pipeline": "forecast", "series": 2, "horizon_buckets": 6,
         "gate": {"go": None, "decision": "NOT ENOUGH EVIDENCE", "reasons": ["4 origins"]}}
    assert verdict_line(s) == ("forecast: NOT ENOUGH EVIDENCE (4 origins); "
                               "2 series x 6 buckets ahead")
    assert summary_go(s) is None and run_tags(s)["go"] == "n/a"
    assert run_tags({**s, "gate": {**s["gate"], "go": False, "decision": "NO-GO"}})["go"] == "false"
