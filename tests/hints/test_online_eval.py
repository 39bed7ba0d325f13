"""Shift injectors and the frozen-vs-adaptive replay comparison (tiny seeded synthetic data)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from replaylab.contracts import validate_ledger
from replaylab.sources.shift import inject_latent_shift, inject_mix_shift
from replaylab.sources.synthetic import SyntheticLedgerConfig, generate_synthetic_ledger


@pytest.fixture(scope="module")
def ledger() -> pd.DataFrame:
    return generate_synthetic_ledger(SyntheticLedgerConfig(n_sessions=400, sessions_per_s=0.25),
                                     seed=3)


def _at(frame: pd.DataFrame) -> int:
    return int(frame["timestamp"].quantile(0.5))


def test_mix_shift_keeps_the_past_and_the_arrivals_and_moves_the_mix(ledger):
    at = _at(ledger)
    out = inject_mix_shift(ledger, column="category", at_ms=at, weights={"math": 1.0}, seed=0)
    start = ledger.groupby("session_id")["timestamp"].transform("min")
    before = ledger[start < at].sort_values("request_id").reset_index(drop=True)
    kept = out[~out["session_id"].str.contains("~shift")].sort_values("request_id")
    pd.testing.assert_frame_equal(kept.reset_index(drop=True), before)
    new = out[out["session_id"].str.contains("~shift")]
    assert set(new.groupby("session_id")["category"].first()) == {"math"}
    slots = np.sort(ledger[start >= at].groupby("session_id")["timestamp"].min().to_numpy())
    assert np.array_equal(np.sort(new.groupby("session_id")["timestamp"].min().to_numpy()), slots)
    assert out["request_id"].is_unique
    assert validate_ledger(out).rows_quarantined == 0
    again = inject_mix_shift(ledger, column="category", at_ms=at, weights={"math": 1.0}, seed=0)
    pd.testing.assert_frame_equal(out, again)
    with pytest.raises(ValueError, match="no session"):
        inject_mix_shift(ledger, column="category", at_ms=at, weights={"nope": 1.0})
    with pytest.raises(ValueError, match="no column"):
        inject_mix_shift(ledger, column="missing", at_ms=at)


def test_latent_shift_changes_only_later_sessions_and_respects_caps(ledger):
    at = _at(ledger)
    out = inject_latent_shift(ledger, at_ms=at, share=0.5, scale=3.0, seed=1)
    start = ledger.groupby("session_id")["timestamp"].transform("min")
    early = (start < at).to_numpy()
    pd.testing.assert_frame_equal(out[early], ledger[early])
    changed = out["completion_tokens"].fillna(-1) != ledger["completion_tokens"].fillna(-1)
    assert changed.any() and not changed[early].any()
    assert (out["completion_tokens"] >= ledger["completion_tokens"]).fillna(True).all()
    cap = out["max_tokens"]
    assert (out["completion_tokens"][cap.notna()] <= cap[cap.notna()]).fillna(True).all()
    assert int(changed.sum()) <= out.attrs["latent_shift"]["rows_verbose"] < len(out)
    assert len(out) == len(ledger) and validate_ledger(out).rows_quarantined == 0


@pytest.fixture(scope="module")
def predictor(tmp_path_factory, ledger):
    from replaylab.artifacts.demand_export import export_demand
    from replaylab.demand import DemandConfig
    from replaylab.pipelines.demand import train_demand
    from replaylab.pipelines.project import LedgerInput, load_ledger
    from replaylab.projection import ProjectionConfig, SplitConfig
    from replaylab.runtime.demand import DemandPredictor

    tmp = tmp_path_factory.mktemp("online_eval")
    loaded = load_ledger(LedgerInput(
        synthetic=SyntheticLedgerConfig(n_sessions=400, sessions_per_s=0.25)))
    summary, run = train_demand(loaded, ProjectionConfig(), SplitConfig(embargo_ms=300_000),
                                DemandConfig(), tmp / "train")
    p = DemandPredictor.load(export_demand(run, summary, tmp / "art"))
    assert p.loaded
    return p, loaded.result.valid


def test_no_feedback_means_adaptive_equals_frozen(predictor):
    from replaylab.hints.online_eval import compare_online

    p, led = predictor
    late = int(led["timestamp"].max()) + 1
    cmp = compare_online(led, p, online_from_ms=late - 10**9, window=50)
    assert cmp.summary["rows_scored"] > 0
    none = compare_online(led, p, online_from_ms=late, window=50)  # deployed after the end
    assert none.summary["rows_scored"] == 0
    cmp0 = compare_online(led, p, online_from_ms=int(led["timestamp"].min()), window=50)
    s = cmp0.summary
    assert s["drift"]["final"]["<global>"]["updates"] > 0
    # the frozen replay is the runtime's frozen hint: feedback never reaches it
    assert "feedback_at_ms" not in cmp0.frozen and cmp0.adaptive["feedback_at_ms"].notna().any()
    assert np.array_equal(cmp0.frozen["hint_hi"].to_numpy(), cmp.frozen["hint_hi"].to_numpy())


def test_adaptive_recovers_coverage_under_a_latent_shift(predictor, tmp_path):
    from replaylab.hints.online_eval import compare_online, online_figure

    p, led = predictor
    start = int(led["timestamp"].min())
    shifted = inject_latent_shift(led, at_ms=start, share=0.6, scale=3.0, seed=0)
    cmp = compare_online(shifted, p, online_from_ms=start, window=100)
    f, a = cmp.summary["frozen"], cmp.summary["adaptive"]
    assert f["coverage"] < 0.77  # the frozen band misses the verbose population
    assert a["coverage"] > f["coverage"] + 0.03  # the tracker widens where the misses are
    assert a["mean_width"] > f["mean_width"]
    assert cmp.summary["shift"]["kind"] == "latent_shift"
    blocks = f["blocks"]
    assert blocks == cmp.summary["rows_scored"] // 100
    assert 0.5 < f["in_band_expected"] < 0.75  # Binomial(100, .8) mass in 0.77..0.83: ~0.62
    png = online_figure(cmp, tmp_path / "online.png")
    assert png.read_bytes()[:4] == b"\x89PNG"
