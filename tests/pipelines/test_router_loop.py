"""The loop closes (issue 29 item 7): receipts -> train -> served binder -> its receipts -> train.

Round 0: the scenario rules log sessions with session-scoped exploration (the simulator),
written to files as a deployment writes them. `python -m training pipeline=router
data.ledger=...` trains on them and exports the artifact. Round 1: the artifact is loaded
by `replaylab.runtime.Router` and served through `replaylab.runtime.SessionBinder` over new
traffic on the same outcome table; the receipts the binder wrote are a file, and the
second training run reads that file. Everything runs through `scripts/router_loop.py`, the
script behind docs/results/router.md "The loop", on the real static MiniLM tier.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pandas as pd
import pytest

from replaylab.contracts import validate_ledger
from replaylab.contracts.columns import Ledger as L
from replaylab.stats import binomial_ci
from tests.conftest import REPO

RATE = 0.08


def _script():
    spec = importlib.util.spec_from_file_location("router_loop", REPO / "scripts" / "router_loop.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def loop(tmp_path_factory):
    out = tmp_path_factory.mktemp("loop")
    doc = _script().run_loop(out, seed=0, rate=RATE, spp=2, n1=3000, tier="static",
                             overrides=["router.head.teachers=1", "router.spread_seeds=1",
                                        "router.head.num_threads=1", "router.receipts.n_boot=300",
                                        "router.head.max_epochs=30",
                                        # 99% intervals: the coverage checks below hold on
                                        # other CPUs' (differently rounded) heads too
                                        "router.receipts.level=0.99"])
    return out, doc


@pytest.mark.slow
def test_round1_receipts_are_the_binders_and_validate(loop):
    out, doc = loop
    led = pd.read_parquet(out / "round1" / "receipts.parquet")
    checked = validate_ledger(led, source="round1")
    assert checked.rows_quarantined == 0 and len(checked.valid) == doc["round1"]["turns"]
    first = led[led[L.TURN_INDEX] == 0]
    assert len(first) == doc["round1"]["sessions"] == first[L.SESSION_ID].nunique()
    explored = first[L.ROUTING_SOURCE] == "exploration"
    # K = 2: an explored opening has propensity RATE, the router's own choice 1 - RATE, exactly
    assert set(first.loc[explored, L.PROPENSITY]) == {RATE}
    assert set(first.loc[~explored, L.PROPENSITY]) == {1.0 - RATE}
    assert set(first.loc[~explored, L.ROUTING_SOURCE]) == {"classifier"}
    lo, hi = binomial_ci(int(explored.sum()), len(first), 0.999)
    assert lo <= RATE <= hi, (explored.mean(), lo, hi)
    # sticky until a failure; an escalation is a new binding with propensity 1
    later = led[led[L.TURN_INDEX] > 0]
    esc = later[L.REBIND_REASON] == "escalation"
    assert set(later.loc[~esc, L.ROUTING_SOURCE]) == {"sticky_binding"}
    assert later.loc[~esc, L.PROPENSITY].isna().all()
    assert (later.loc[esc, L.PROPENSITY] == 1.0).all() and esc.any()
    # every escalation follows a failed turn of its session, and the binding never changes
    # otherwise
    led = led.sort_values([L.SESSION_ID, L.TURN_INDEX])
    prev_fail = led.groupby(L.SESSION_ID)[L.OUTCOME_STATUS].shift(1).eq("failure")
    prev_model = led.groupby(L.SESSION_ID)[L.SELECTED_MODEL].shift(1)
    changed = prev_model.notna() & (prev_model != led[L.SELECTED_MODEL])
    assert (changed == (led[L.REBIND_REASON] == "escalation")).all()
    assert prev_fail[changed].all()


@pytest.mark.slow
def test_round1_training_reads_what_the_binder_wrote(loop):
    out, doc = loop
    import json

    s1 = json.loads((out / "train1" / "summary.json").read_text())
    assert s1["mode"] == "receipts"
    assert s1["receipts"]["sessions"] == doc["round1"]["sessions"]
    assert s1["exploration"]["explored_sessions"] == int(
        doc["round1"]["explored_share"] * doc["round1"]["sessions"] + 0.5)
    dec = pd.read_parquet(out / "train1" / "router_decisions_test.parquet")
    assert dec["session_id"].str.startswith("r1-").all()  # the served sessions, not round 0's
    assert set(np.round(dec["propensity"], 12)) <= {RATE, 1.0 - RATE}


@pytest.mark.slow
def test_ope_of_each_round_covers_the_simulators_truth(loop):
    _, doc = loop
    for r in ("round0", "round1"):
        cov = doc[r]["covers"]
        assert cov["dr_quality"] and cov["diff_quality"], (r, doc[r]["ope"]["dr"], doc[r]["truth"])
        truth = doc[r]["truth"]
        # never GO against the truth: not worse than the margin and cheaper
        if doc[r]["go"]:
            assert truth["diff_quality"] >= -0.01 and truth["diff_cost"] < 0
