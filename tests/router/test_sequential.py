"""The receipts gate under repeated looks (issue 45 item 4): betting bounds and alpha spending.

Statistics on tiny seeded data: a betting bound misses its mean at most alpha of the time
(with a binomial tolerance), at every prefix at once; the spending schedule spends exactly
alpha over the planned looks; and the growing-ledger simulation of
scripts/router_sequential.py (smaller) says GO on a router no better than the incumbent's
margin in at most 5% of sequences, while the fixed-level gate, judged at every look, does
so more often than its one look's level.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
from scipy.stats import binom

from replaylab.router.sequential import (
    SequentialConfig,
    betting_lower_bound,
    look_alpha,
    paired_ips_interval,
    sequential_diffs,
)
from tests.conftest import REPO


def _script():
    spec = importlib.util.spec_from_file_location(
        "router_sequential", REPO / "scripts" / "router_sequential.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _tolerance(trials: int, rate: float) -> int:
    """The most misses Binomial(trials, rate) exceeds with probability < 0.001."""
    return int(binom.ppf(0.999, trials, rate))


def test_spending_spends_alpha_exactly_over_the_planned_looks():
    for spending in ("obrien_fleming", "pocock"):
        looks = [look_alpha(SequentialConfig(kind="spending", look=k, looks=5,
                                             spending=spending)) for k in range(1, 6)]
        per_look = np.array([r["alpha_look"] for r in looks])
        assert (per_look > 0).all()
        assert per_look.sum() == pytest.approx(0.05, abs=1e-12)
        assert looks[-1]["spent"] == pytest.approx(0.05, abs=1e-12)
        assert [r["look"] for r in looks] == [1, 2, 3, 4, 5]
    obf = [look_alpha(SequentialConfig(kind="spending", look=k))["alpha_look"]
           for k in range(1, 6)]
    assert obf == sorted(obf) and obf[0] < 1e-4  # O'Brien-Fleming keeps alpha for later
    # a look past the plan has no alpha left: its bound is the range's end, never GO
    past = look_alpha(SequentialConfig(kind="spending", look=6, looks=5))
    assert past["alpha_look"] == 0.0
    assert betting_lower_bound(np.ones(50), past["alpha_look"], floor=-1.0) == -1.0


def test_bad_sequential_config_names_the_field():
    with pytest.raises(ValueError, match="SequentialConfig.kind"):
        SequentialConfig(kind="peeking")
    with pytest.raises(ValueError, match="SequentialConfig.look"):
        SequentialConfig(look=0)
    with pytest.raises(ValueError, match="SequentialConfig.alpha"):
        SequentialConfig(alpha=0.7)


def test_betting_bound_misses_its_mean_at_most_alpha_at_every_prefix():
    """Heavy-tailed importance-weighted rewards (w up to 40, mean 0.7): the anytime bound,
    checked at 5 prefixes of each stream, is above the true mean at ANY of them in at most
    alpha of the streams."""
    rng = np.random.default_rng(7)
    alpha, trials, misses = 0.1, 200, 0
    for _ in range(trials):
        explored = rng.random(2000) < 0.05
        w = np.where(explored, 0.5 / 0.025, 0.95 / 0.95)  # E w = 1
        w = np.where(explored & (rng.random(2000) < 0.5), 0.0, w)
        x = w * (rng.random(2000) < 0.7)                     # E x = 0.7 (E[w]=0.5*20*.05+.95)
        mean = 0.7 * (0.05 * 0.5 * 20 + 0.95)
        bounds = [betting_lower_bound(x[:n], alpha) for n in (200, 500, 1000, 1500, 2000)]
        misses += max(bounds) > mean
    assert misses <= _tolerance(trials, alpha), misses


def test_paired_interval_covers_a_known_difference_and_shrinks():
    rng = np.random.default_rng(3)
    n = 4000
    served = rng.random(n) < 0.5                  # the served router agrees with the log
    prop = np.where(served, 0.9, 0.1)
    w = served / prop
    r = (rng.random(n) < np.where(served, 0.8, 0.6)).astype(float)
    # E[w r] = P(served) x 0.8 / 0.9 x 0.9 ... by construction: 0.5 x 0.8 / 0.9 = 0.4444
    truth = 0.5 * 0.8 / 0.9 - (0.5 * 0.8 + 0.5 * 0.6)
    small = paired_ips_interval(w[:500], r[:500], 0.05)
    big = paired_ips_interval(w, r, 0.05)
    assert big["ci"][0] <= truth <= big["ci"][1]
    assert big["ci"][1] - big["ci"][0] < small["ci"][1] - small["ci"][0]
    with pytest.raises(ValueError, match="rewards must lie"):
        paired_ips_interval(w, r * 2.0, 0.05)


def test_sequential_diffs_records_the_look():
    rng = np.random.default_rng(0)
    w = np.where(rng.random(300) < 0.9, 1 / 0.9, 0.0)
    out = sequential_diffs(w, (rng.random(300) < 0.7).astype(float), rng.random(300) * 0.01,
                           SequentialConfig(kind="spending", look=3, looks=5))
    rec = out["record"]
    assert rec["look"] == 3 and rec["looks"] == 5 and rec["spending"] == "obrien_fleming"
    assert rec["spent_before"] < rec["spent"] <= 0.05
    assert rec["alpha_look"] == pytest.approx(rec["spent"] - rec["spent_before"])
    assert "betting" in rec["sequence"]
    for key in ("quality", "cost"):
        lo, hi = out[key]["ci"]
        assert lo <= out[key]["estimate"] <= hi


@pytest.mark.slow
def test_spending_keeps_false_go_at_alpha_over_five_looks():
    """200 growing ledgers of 5 looks (6,000 sessions a look) where the served router's
    true quality is exactly the margin below the incumbent's (GO is false): the spending
    gate says GO in any look of at most 5% of them (binomial tolerance at 0.001); on 40
    ledgers where it is truly better by 0.03 it says GO in some."""
    mod = _script()
    methods = {"spending": SequentialConfig(kind="spending")}
    res = mod.simulate(n_null=200, n_better=40, looks=5, per_look=6000, rate=0.10, seed=0,
                       methods=methods, better_by=0.03)
    null, better = res["methods"]["spending"]["null"], res["methods"]["spending"]["better"]
    assert null["sequences"] == 200
    assert null["any_go"] <= _tolerance(200, 0.05), null
    assert better["any_go"] >= 1, better
