"""The router's gate (router/gate.py), its objective (router/objective.py) and the OPE
evidence the receipts gate reads (router/ope_sums.py): three verdicts on seeded numbers."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from replaylab.config import ConfigError
from replaylab.router.gate import Criterion, Evidence, GateBoundary, gate_interval, judge
from replaylab.router.objective import ObjectiveConfig, served_policy
from replaylab.router.ope_sums import CLIPS, auto_clip, ope_part, weight_diagnostics
from replaylab.router.pipeline_config import router_config
from replaylab.router.policy import PolicyConfig, select_threshold
from replaylab.router.replay import Label
from replaylab.verdict import GO, NO_GO, NOT_ENOUGH_EVIDENCE

LABEL = "objective incumbent"


def crit(est, lo, hi, line=-0.01, side="lower", strict=False):
    return Criterion("quality vs logging", est, [lo, hi], line, side, strict)


def test_three_verdicts_follow_the_intervals():
    saving = Criterion("cost vs logging", -1.0, [-2.0, -0.5], 0.0, "upper", strict=True)
    go = judge(Evidence([crit(0.0, -0.005, 0.01), saving], 100, 1e4), LABEL)
    assert go["verdict"] == GO and go["go"] and go["reasons"][0].startswith(LABEL)
    # straddles its line with the estimate on the passing side: not enough evidence, and
    # how much more decides it: n * ((half / room)^2 - 1) = 100 * (0.03/0.01)^2 - 100
    nee = judge(Evidence([crit(0.0, -0.03, 0.03), saving], 100, 1e4, explored_rate=0.05), LABEL)
    assert nee["verdict"] == NOT_ENOUGH_EVIDENCE and not nee["go"]
    assert nee["more_data"]["sessions"] == pytest.approx(800.0)
    assert nee["more_data"]["days"] == pytest.approx(800.0 / 1e4)
    assert nee["more_data"]["explored_sessions"] == pytest.approx(40.0)
    assert "~800 more test sessions (~800 more sessions of traffic" in nee["reasons"][0]
    assert "quality vs logging +0.0000, CI lower -0.0300 (must be >= -0.0100: fails)" in \
        nee["reasons"][0]
    # the whole interval below the line: NO-GO, whatever the diagnostics say
    no = judge(Evidence([crit(-0.05, -0.08, -0.02), saving], 100, 1e4,
                        diagnostics=["ESS 10 < 50"], diagnostic_factors=[5.0]), LABEL)
    assert no["verdict"] == NO_GO and no["more_data"] is None
    # straddling with the estimate on the failing side: NO-GO with good overlap ...
    wrong = [crit(-0.02, -0.05, 0.01), saving]
    assert judge(Evidence(wrong, 100, 1e4), LABEL)["verdict"] == NO_GO
    # ... NOT ENOUGH EVIDENCE when the overlap diagnostics fail; the ESS factor decides
    thin = judge(Evidence(wrong, 100, 1e4, diagnostics=["ESS 2.5 < 50"],
                          diagnostic_factors=[20.0]), LABEL)
    assert thin["verdict"] == NOT_ENOUGH_EVIDENCE and "ESS 2.5 < 50" in thin["reasons"][0]
    assert thin["more_data"]["sessions"] == pytest.approx(1900.0)  # ESS x20 > interval's x9
    # a hard failure (exploration over its cap) is NO-GO even when the intervals pass
    hard = judge(Evidence([crit(0.0, -0.005, 0.01), saving], 100, 1e4,
                          hard_failures=["explored share 0.2 above the cap 0.1"]), LABEL)
    assert hard["verdict"] == NO_GO and "above the cap" in hard["reasons"][0]


def test_a_strict_line_and_an_upper_side():
    c = Criterion("cost vs logging", -0.1, [-0.3, 0.0], 0.0, "upper", strict=True)
    assert not c.passed() and not c.decided_fail() and c.estimate_passes()
    c = Criterion("cost per call", 0.004, [0.003, 0.005], 0.005, "upper")
    assert c.passed()


def test_gate_interval_is_the_percentile_interval_at_the_boundary_level():
    reps = np.random.default_rng(0).normal(0.0, 1.0, 4000)
    lo, hi = gate_interval(reps, 0.0, GateBoundary(level=0.9))
    assert lo == pytest.approx(-1.645, abs=0.08) and hi == pytest.approx(1.645, abs=0.08)
    with pytest.raises(ValueError, match="GateBoundary.method"):
        GateBoundary(method="whatever")


def test_objective_config_and_the_policy_it_serves():
    with pytest.raises(ValueError, match="cost_per_call"):
        ObjectiveConfig(kind="budget")
    with pytest.raises(ValueError, match="kind"):
        ObjectiveConfig(kind="cheapest")
    o = ObjectiveConfig()
    assert o.quality_floor(0.8, 0.9) == pytest.approx(0.79)
    assert ObjectiveConfig(kind="quality_floor").quality_floor(0.8, 0.9) == pytest.approx(0.855)
    assert served_policy(o, PolicyConfig(), 0.8).quality_floor == pytest.approx(0.79)
    b = served_policy(ObjectiveConfig(kind="budget", cost_per_call=0.002), PolicyConfig(), 0.8)
    assert b.cost_budget == 0.002 and b.quality_floor is None
    # the keys the objective replaced are refused with the key and what to set instead
    for over in ({"policy": {"cost_budget": 0.001}}, {"go": {"quality_margin": 0.02}},
                 {"policy": {"target_share": 0.9}}):
        with pytest.raises(ConfigError, match="router.objective"):
            router_config({"candidates": ["a", "b"], **over})


def test_an_absolute_floor_picks_the_cheapest_point_reaching_it():
    rng = np.random.default_rng(1)
    n = 400
    score = np.stack([rng.random(n) < 0.6, rng.random(n) < 0.9], axis=1).astype(float)
    cost = np.tile([0.001, 0.02], (n, 1))
    prob = np.clip(score + rng.normal(0, 0.3, score.shape), 0, 1)
    for floor in (0.65, 0.75, 0.85):
        ch = select_threshold(prob, score, cost, PolicyConfig(escalate=False, quality_floor=floor))
        q, c = ch.curve.quality, ch.curve.cost
        assert ch.met and ch.quality >= floor - 1e-12
        assert ch.cost == pytest.approx(c[q >= floor - 1e-12].min())
    high = select_threshold(prob, score, cost, PolicyConfig(escalate=False, quality_floor=1.1))
    assert not high.met and high.quality == pytest.approx(high.curve.quality.max())


def _rows(n: int, explore: float, seed: int) -> tuple[pd.DataFrame, np.ndarray]:
    """One opening per session; the logger opens on column 1, explores column 0 with
    probability `explore`; the served policy chooses column 0 on half the sessions."""
    rng = np.random.default_rng(seed)
    explored = rng.random(n) < explore
    a = np.where(explored, 0, 1)
    r = np.where(a == 0, rng.random(n) < 0.7, rng.random(n) < 0.8).astype(float)
    d = pd.DataFrame({"split": "test", "action": a, Label.REWARD: r,
                      Label.COST: np.where(a == 0, 0.001, 0.01),
                      Label.PROPENSITY: np.where(explored, explore, 1 - explore),
                      Label.SESSION_ID: [f"s{i}" for i in range(n)],
                      Label.SESSION_COST: np.nan,
                      Label.LABEL_SOURCE: np.where(explored, "exploration", "logged"),
                      "choice": np.where(rng.random(n) < 0.5, 0, 1), "p0": 0.7, "p1": 0.8})
    return d, np.array([0.001, 0.01])


def test_auto_clip_is_the_least_estimated_mse():
    for n, explore in ((3000, 0.3), (300, 0.01), (20000, 0.01)):
        d, uc = _rows(n, explore, 0)
        total = ope_part(d, 2, uc, uc, 50, 0, None, None, 1, "margin")
        for est in ("ips", "dr"):
            got = auto_clip(total, est)
            rows = {r["clip"]: r for r in got["candidates"]}
            assert set(rows) == set(CLIPS) and got["clip"] in CLIPS
            assert rows[got["clip"]]["mse"] == min(r["mse"] for r in rows.values())
            assert rows[None]["bias_bound"] == 0.0  # no clip, no bias
            # a clip below the largest weight cuts it: a positive bias bound
            assert rows[2.0]["bias_bound"] > 0.0


def test_weight_diagnostics_name_the_tail():
    d, uc = _rows(2000, 0.02, 3)
    total = ope_part(d, 2, uc, uc, 0, 0, None, None, 1, "margin")
    w = (d["choice"] == d["action"]) / d[Label.PROPENSITY]
    diag = weight_diagnostics(total, {"share": 0.5, "support": 40})
    assert diag["max_weight"] == pytest.approx(w.max())
    assert diag["ess"] == pytest.approx(w.sum() ** 2 / (w ** 2).sum())
    top = np.sort(w.to_numpy())[::-1][:20].sum() / w.sum()
    assert diag["top1pct_sessions"] == 20 and diag["top1pct_weight_share"] == pytest.approx(top)
