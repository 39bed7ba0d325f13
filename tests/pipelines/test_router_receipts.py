"""The router from a receipts ledger (pipeline=router data.ledger=FILE).

Receipts are written by the simulator as a deployment would write them (category,
prompt_text on opening turns, no benchmark ids) from the shipped RouteLLM GSM8K
outcomes, so the truth of every off-policy figure is known. A cheap stand-in
embedding (TF-IDF + SVD) keeps the pipeline tests fast; the entry-point test runs
the real static MiniLM tier.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from replaylab.contracts import validate_ledger
from replaylab.contracts.columns import Ledger as L
from replaylab.pipelines.router_receipts import gate, train_router_receipts
from replaylab.router.config import RouterEvalConfig, RouterExplorationConfig
from replaylab.router.exploration import (
    deployment_ledger,
    policy_truth,
    simulate_receipts,
)
from replaylab.router.ope import (
    LoggedDecisions,
    ope_estimates,
    paired_difference,
    point_values,
    policy_matrix,
)
from replaylab.router.receipts import ReceiptsError
from replaylab.router.rules import ScenarioRules
from replaylab.verdict import GO, NO_GO, NOT_ENOUGH_EVIDENCE, VERDICTS
from tests.conftest import REPO
from tests.helpers.router import (
    CHEAP,
    ENCODER,
    ONE_HEAD,
    STRONG,
    receipts_world,
    router_receipts_config,
    tfidf,
)


@pytest.fixture(scope="module")
def world():
    return receipts_world(router_receipts_config())


@pytest.fixture(scope="module")
def files(world):
    return world.ledger, world.replays


@pytest.fixture(scope="module")
def trained(files, tmp_path_factory):
    led, rep = files
    out = tmp_path_factory.mktemp("receipts")
    summary, run = train_router_receipts(validate_ledger(led), rep, router_receipts_config(), out, tfidf, ENCODER)
    return summary, run, out


# ---------------------------------------------------------------- the summary
def test_summary_keys_and_one_verdict(trained):
    s, run, out = trained
    ope = s["ope"]
    for name in ("ips", "snips", "dr"):
        assert set(ope[name]) == {"estimate", "ci", "clipped"} and 0 <= ope[name]["ci"][0] <= ope[name]["ci"][1] <= 1
        assert ope[name]["ci"][0] <= ope[name]["estimate"] <= ope[name]["ci"][1]
    for key in ("quality", "cost"):
        d = ope["diff"][key]
        assert d["ci"][0] <= d["estimate"] <= d["ci"][1]
    assert {"quality", "cost", "session_cost"} <= set(ope["logging"])
    assert s["verdict"] in VERDICTS and s["go"] == (s["verdict"] == GO)
    assert s["go_reason"].startswith("objective incumbent") and f"; {s['verdict']}: " in \
        s["go_reason"]
    # the verdict is the objective's rule applied to the gate's intervals (DR, no clip)
    ev = ope["evidence"]
    ch = ev["variants"][ev["chosen"]]
    assert ev["chosen"] == "dr@none" and ch["diff_quality"]["estimate"] == pytest.approx(
        ope["diff"]["quality"]["estimate"])
    rule = (ch["diff_quality"]["ci"][0] >= -0.01) and (ch["diff_cost"]["ci"][1] < 0)
    assert s["go"] == rule
    # the evidence: IPS, SNIPS, DR at no clip and the automatic clip; the weight tail; the
    # high-confidence lower bound under the two-sided interval's lower end
    assert {f"{e}@{c}" for e in ("ips", "snips", "dr") for c in ("none", "auto")} == set(
        ev["variants"])
    assert ev["variants"]["ips@none"]["quality"]["estimate"] == pytest.approx(
        ope["ips"]["estimate"]) and ev["variants"]["snips@none"]["quality"]["estimate"] == \
        pytest.approx(ope["snips"]["estimate"])
    w = ev["weights"]
    assert w["ess"] == pytest.approx(ope["ess"]) and w["max_weight"] == pytest.approx(
        ope["max_weight"]) and 0 < w["top1pct_weight_share"] <= 1
    assert ch["diff_quality"]["ci"][0] <= ev["hclb"]["quality_gain"] <= ch["diff_quality"]["estimate"]
    assert (s["verdict"] == NOT_ENOUGH_EVIDENCE) == (s["go_detail"]["more_data"] is not None)
    assert 0 < ope["ess"] <= ope["n"] and 0 <= ope["agreement"] <= 1
    assert s["mode"] == "receipts" and s["receipts"]["escalation_bindings"] > 0
    for name in ("router_curves_test.parquet", "replay_plan.jsonl"):
        assert (out / name).is_file(), name
    for name in ("router_decisions_test.parquet", "router_labels.parquet"):  # datasets
        assert list((out / name).glob("*.parquet")), name
    assert s["compute"]["kind"] == "local" and s["compute"]["partitions"] == 1
    assert run.threshold == s["operating_point"]["threshold"]  # the shipped point is the judged one
    assert s["spread"]["seeds"] == [0] and s["spread"]["go"] == [s["go"]]
    assert s["spread"]["verdict"] == [s["verdict"]]


def test_seed_to_seed_spread_beside_the_headline(files, tmp_path):
    led, rep = files
    s, _ = train_router_receipts(validate_ledger(led), rep,
                                 router_receipts_config(spread_seeds=2), tmp_path, tfidf, ENCODER)
    sp = s["spread"]
    assert sp["seeds"] == [0, 1] and len(sp["diff_quality"]["values"]) == 2
    assert sp["diff_quality"]["values"][0] == s["ope"]["diff"]["quality"]["estimate"]
    assert sp["diff_quality"]["min"] <= sp["diff_quality"]["max"]


def test_time_split_by_session_with_embargo(trained, files):
    s, _, out = trained
    led, _ = files
    labels = pd.read_parquet(out / "router_labels.parquet")
    dec = labels[labels["label_source"] != "replay"]
    assert dec["session_id"].is_unique  # one opening decision per session
    sp = s["splits"]
    by = dec.groupby("split")["opening_ms"].agg(["min", "max"])
    assert by.loc["train", "max"] < sp["calibration_start_ms"] <= by.loc["calibration", "min"]
    assert by.loc["calibration", "max"] < sp["test_start_ms"] <= by.loc["test", "min"]
    # an embargoed session is gone; no kept train/cal session still runs at the next start
    last = led.groupby(L.SESSION_ID)[L.TIMESTAMP].max()
    tr = dec[dec["split"] == "train"]["session_id"]
    assert (last.reindex(tr) <= sp["calibration_start_ms"] - sp["embargo_ms"]).all()
    assert sp["sessions"]["embargo"] > 0
    n_test = sp["sessions"]["test"]
    assert abs(n_test / sum(sp["sessions"].values()) - 0.2) < 0.01  # the latest 20%


def test_replays_join_train_and_calibration_only(trained):
    s, _, out = trained
    labels = pd.read_parquet(out / "router_labels.parquet")
    rep = labels[labels["label_source"] == "replay"]
    assert set(rep["split"]) <= {"train", "calibration"} and len(rep) > 0
    r = s["replays"]
    assert r["test_prompts_left_out"] > 0
    assert r["rows_read"] == (r["unknown_prompts"] + r["test_prompts_left_out"]
                              + r["other_candidates_left_out"] + r["logged_candidate_left_out"]
                              + r["duplicates_left_out"] + sum(r["used"].values()))


def test_escalations_left_out_of_decisions_but_in_session_cost(trained, files):
    s, _, out = trained
    led, _ = files
    labels = pd.read_parquet(out / "router_labels.parquet")
    dec = labels[labels["label_source"] != "replay"]
    assert (dec["policy_decision"]).all()
    assert (dec["session_cost"] >= dec["cost"] - 1e-12).all()
    esc = led[led[L.REBIND_REASON] == "escalation"]["session_id"].unique()
    escalated = dec[dec["session_id"].isin(esc)]
    assert (escalated["session_cost"] > escalated["binding_cost"]).all()


def test_dr_covers_the_simulators_truth(trained, world):
    s, run, _ = trained
    m, sim = world.matrix, world.sim
    truth = policy_truth(sim, m, run.test_sessions, run.test_choice)
    ope = s["ope"]
    assert ope["dr"]["ci"][0] <= truth["quality"] <= ope["dr"]["ci"][1]
    assert ope["diff"]["quality"]["ci"][0] <= truth["diff_quality"] <= ope["diff"]["quality"]["ci"][1]
    assert ope["cost"]["ci"][0] <= truth["cost"] <= ope["cost"]["ci"][1]


def test_replay_plan_ranks_unobserved_recent_pairs(trained):
    s, _, out = trained
    plan = pd.read_json(out / "replay_plan.jsonl", lines=True)
    labels = pd.read_parquet(out / "router_labels.parquet")
    dec = labels[labels["label_source"] != "replay"].set_index("opening_request_id")
    assert 0 < len(plan) <= 50 and list(plan["rank"]) == list(range(1, len(plan) + 1))
    assert plan["priority"].is_monotonic_decreasing
    assert set(dec.loc[plan["prompt_id"], "split"]) <= {"calibration", "test"}
    assert (dec.loc[plan["prompt_id"], "candidate"].to_numpy() != plan["candidate"].to_numpy()).all()


# ---------------------------------------------------------------- refusals
def _train(led, tmp_path, **over):
    return train_router_receipts(validate_ledger(led), None, router_receipts_config(**over), tmp_path, tfidf, ENCODER)


def test_refuses_propensities_out_of_range(files, tmp_path):
    led = files[0].copy()
    led.loc[led.index[:3], L.PROPENSITY] = 1.5
    with pytest.raises(ReceiptsError, match=r"3 row\(s\) have a propensity outside \(0, 1\]"):
        _train(led, tmp_path)


def test_refuses_a_policy_binding_without_propensity(files, tmp_path):
    led = files[0].copy()
    first = led[L.TURN_INDEX] == 0
    led.loc[led.index[first][:4], L.PROPENSITY] = np.nan
    with pytest.raises(ReceiptsError, match="4 binding"):
        _train(led, tmp_path)


def test_refuses_exploration_above_the_cap(world, tmp_path):
    m, texts = world.matrix, world.texts
    rules = ScenarioRules(router_receipts_config().rules).fit(m)
    sim = simulate_receipts(m, rules, RouterExplorationConfig(rate=0.2, cap=0.3, seed=1))
    with pytest.raises(ReceiptsError, match="above router.exploration.cap=0.1"):
        _train(deployment_ledger(sim, texts), tmp_path)


def test_refuses_too_little_exploration(files, tmp_path):
    with pytest.raises(ReceiptsError, match="too little exploration"):
        _train(files[0], tmp_path, receipts={"min_explored_per_candidate": 10_000})


def test_refuses_a_single_candidate_and_unknown_ones(files, tmp_path):
    with pytest.raises(ReceiptsError, match=r"never appear in selected_model"):
        _train(files[0], tmp_path, candidates=[CHEAP, "acme/unknown"])


def test_refuses_prompts_it_cannot_see_naming_the_count(files, tmp_path):
    led = files[0].copy()
    first = led.index[led[L.TURN_INDEX] == 0]
    led.loc[first[:7], L.PROMPT_TEXT] = None
    with pytest.raises(ReceiptsError, match=r"^data.ledger: [0-9]+ of [0-9]+ opening decisions have neither"):
        _train(led, tmp_path)
    led[L.PROMPT_EMBEDDING] = None
    led[L.EMBEDDING_MODEL] = None
    led[L.PROMPT_EMBEDDING] = led[L.PROMPT_EMBEDDING].astype(object)
    for i in first[:7]:
        led.at[i, L.PROMPT_EMBEDDING] = [0.1] * 48
        led.at[i, L.EMBEDDING_MODEL] = "other/encoder"
    with pytest.raises(ReceiptsError, match="not the configured encoder 'tfidf-svd-48'"):
        _train(led, tmp_path)


def test_other_models_are_counted_and_left_out(files, tmp_path):
    led = files[0].copy()
    sess = led[L.SESSION_ID].unique()[:40]
    led.loc[led[L.SESSION_ID].isin(sess), L.SELECTED_MODEL] = "acme/other"
    s, _ = _train(led, tmp_path)
    assert s["receipts"]["sessions_opening_other_model"] == 40
    assert s["receipts"]["bindings_of_other_models"] >= 40


def test_stored_embeddings_of_the_configured_encoder_are_used(files, tmp_path):
    led = files[0].copy()
    first = led.index[led[L.TURN_INDEX] == 0]
    vec = tfidf(led.loc[first, L.PROMPT_TEXT].astype(str).tolist())
    led[L.PROMPT_EMBEDDING] = pd.Series([None] * len(led), index=led.index, dtype=object)
    led[L.EMBEDDING_MODEL] = None
    for j, i in enumerate(first[:300]):
        led.at[i, L.PROMPT_EMBEDDING] = vec[j].tolist()
        led.at[i, L.EMBEDDING_MODEL] = ENCODER
        led.at[i, L.PROMPT_TEXT] = None
    s, _ = _train(led, tmp_path)
    assert s["receipts"]["representation"]["prompt_embedding"] > 250


# ---------------------------------------------------------------- the estimators and the gate
def _bandit(seed: int, n: int = 4000, k: int = 3):
    rng = np.random.default_rng(seed)
    truth = rng.uniform(0.2, 0.9, size=(n, k))
    p0 = np.full((n, k), 0.1 / (k - 1))
    rule = rng.integers(0, k, n)
    p0[np.arange(n), rule] = 0.9
    a = np.array([rng.choice(k, p=p) for p in p0])
    r = (rng.random(n) < truth[np.arange(n), a]).astype(float)
    b = LoggedDecisions(tuple("abc"[:k]), a, r, p0[np.arange(n), a], np.arange(n),
                        np.arange(n))
    return b, truth, p0


def test_paired_difference_covers_the_truth_and_point_values_agree():
    covered = 0
    for seed in range(10):
        b, truth, p0 = _bandit(seed)
        target = truth.argmax(axis=1)
        q = np.clip(truth + np.random.default_rng(seed).normal(0, 0.1, truth.shape), 0, 1)
        cfg = RouterEvalConfig(n_boot=300, seed=seed)
        d = paired_difference(b, policy_matrix(target, 3), q, cfg)
        true = truth[np.arange(b.n), target].mean() - (p0 * truth).sum(axis=1).mean()
        covered += d["ci"][0] <= true <= d["ci"][1]
        est = ope_estimates(b, policy_matrix(target, 3), q, RouterEvalConfig(n_boot=0))
        pv = point_values(b, target[None, :], q)
        for key in ("ips", "snips", "dr"):
            assert pv[key][0] == pytest.approx(est[key], rel=1e-12)
    assert covered >= 8  # a 95% interval: 10 seeds, >= 8 covered holds with prob > 0.98


def test_gate_reads_the_objective_and_says_what_would_flip_it():
    from replaylab.router.objective import ObjectiveConfig

    def variant(dq, dc, cost=(0.004, 0.003, 0.005), floor=(0.0, -0.01, 0.01), est="dr",
                clip="none"):
        return {"estimator": est, "clip_level": clip, "clip": None if clip == "none" else 20.0,
                "diff_quality": {"estimate": dq[0], "ci": list(dq[1:])},
                "diff_cost": {"estimate": dc[0], "ci": list(dc[1:])},
                "cost": {"estimate": cost[0], "ci": list(cost[1:])},
                "quality_vs_floor": {"estimate": floor[0], "ci": list(floor[1:])}}

    def ope(chosen, other=None, failed=()):
        vs = {"dr@none": chosen, "ips@none": other or chosen}
        return {"sessions": 1000, "explored_sessions": 50,
                "evidence": {"chosen": "dr@none", "variants": vs,
                             "weights": {"failed": list(failed),
                                         "factors": [4.0] * len(failed)}}}

    inc = ObjectiveConfig()
    g = gate(ope(variant((0.0, -0.005, 0.01), (-1.0, -2.0, -0.5))), inc, 1e4)
    assert g["verdict"] == GO and g["go"] and g["go_reason"].startswith("objective incumbent")
    assert "every estimator" in g["go_reason"] and g["go_detail"]["flips"] == []
    # straddling with the estimate on the passing side: NOT ENOUGH EVIDENCE with the data
    g = gate(ope(variant((0.0, -0.03, 0.03), (-1.0, -2.0, -0.5))), inc, 1e4, test_share=0.2)
    assert g["verdict"] == NOT_ENOUGH_EVIDENCE and not g["go"]
    more = g["go_detail"]["more_data"]
    assert more["sessions"] == pytest.approx(8000.0)  # 1000 x ((0.03 / 0.01)^2 - 1)
    assert more["traffic_sessions"] == pytest.approx(40000.0)  # a fifth lands in test
    assert more["days"] == pytest.approx(4.0)
    assert g["go_detail"]["explored_sessions_needed"] == pytest.approx(400.0)
    assert "~8000 more test sessions (~40000 more sessions of traffic (~4.0 days at 10000 " \
        "per day) at test share 0.2; ~400 of the test sessions explored)" in g["go_reason"]
    # wholly below the margin: NO-GO; another estimator saying GO is named
    g = gate(ope(variant((-0.05, -0.08, -0.02), (-1.0, -2.0, -0.5)),
                 variant((0.0, -0.005, 0.01), (-1.0, -2.0, -0.5), est="ips")), inc, 1e4)
    assert g["verdict"] == NO_GO and g["go_detail"]["flips"] == ["IPS with no clip would say GO"]
    assert "would flip it: IPS with no clip would say GO" in g["go_reason"]
    # failing overlap diagnostics make a straddling interval thin evidence
    g = gate(ope(variant((-0.02, -0.05, 0.01), (-1.0, -2.0, -0.5)), failed=["ESS 9 < 50"]),
             inc, 1e4)
    assert g["verdict"] == NOT_ENOUGH_EVIDENCE and "ESS 9 < 50" in g["go_reason"]
    # budget: cost per call within the budget and significantly better quality
    bud = ObjectiveConfig(kind="budget", cost_per_call=0.006)
    g = gate(ope(variant((0.02, 0.01, 0.03), (0.0, -0.1, 0.1))), bud, 1e4)
    assert g["verdict"] == GO and g["go_reason"].startswith("objective budget")
    floor = ObjectiveConfig(kind="quality_floor")
    g = gate(ope(variant((0.0, -0.1, 0.1), (-1.0, -2.0, -0.5), floor=(-0.05, -0.07, -0.03))),
             floor, 1e4)
    assert g["verdict"] == NO_GO and "strong-only" in g["go_reason"]


# ---------------------------------------------------------------- the entry point
@pytest.mark.slow
def test_entry_point_on_receipt_files(files, tmp_path):
    led, rep = files
    led_path, rep_path = tmp_path / "receipts.parquet", tmp_path / "replays.jsonl"
    led.to_parquet(led_path, index=False)
    rep.to_json(rep_path, orient="records", lines=True)
    cmd = [sys.executable, "-m", "training", "pipeline=router", f"data.ledger={led_path}",
           f"data.replays={rep_path}", "router.encoder.tier=static",
           f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}",
           "router.head.max_epochs=10", *ONE_HEAD, "router.receipts.n_boot=200",
           f"hydra.run.dir={tmp_path / 'run'}"]
    res = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900,
                         env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert res.returncode == 0, res.stderr[-3000:]
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert s["served_check"]["agreement"] == 1.0 and s["served_check"]["loaded"]
    assert "router (receipts): " + s["go_reason"] in res.stderr + res.stdout
    from replaylab.apps.router import attribution_line

    line = attribution_line(s["attribution"])  # on by default: done, or why it was skipped
    assert line and "router (receipts): " + line in res.stderr + res.stdout
    if s["attribution"]["status"] == "done":
        inc = s["attribution"]["increments"]
        assert f"{inc['replays']['test']['estimate']:+.6f}" in line
    assert attribution_line(None) is None  # attribution=off: no line
    assert (tmp_path / "run" / "router_report.html").is_file()
    manifest = json.loads((tmp_path / "run" / "artifacts" / "router" / "manifest.json").read_text())
    assert manifest["training"]["go"] == s["go"]  # what serving and the registry get
    from mlflow.tracking import MlflowClient

    reg = s["registry"][0]
    db = f"sqlite:///{tmp_path / 'mlflow.db'}"
    mv = MlflowClient(db, registry_uri=db).get_model_version(
        reg["name"], str(reg["version"]))
    assert mv.tags["replaylab.go"] == str(s["go"]).lower()  # the promotion gate reads this
    bad = tmp_path / "bad.jsonl"
    bad.write_text(led.head(50).assign(propensity=2.0).to_json(orient="records", lines=True))
    res = subprocess.run(cmd[:4] + [f"data.ledger={bad}", "tracking=off"] + cmd[6:7] + cmd[8:],
                         cwd=REPO,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 2 and res.stderr.strip().count("\n") == 0
    assert res.stderr.startswith("error: data.ledger: ") and "Traceback" not in res.stderr


def test_departures_without_explored_support_are_flagged():
    """A served router that departs from the logging policy where almost no explored
    session shows its choice gets a low-support warning; one that departs where explored
    sessions do show it does not."""
    from replaylab.pipelines.router_receipts import evaluate_test
    from replaylab.router.ope_sums import LOW_DEPARTURE_SUPPORT
    from replaylab.router.receipts import OPENING_REQUEST
    from replaylab.router.replay import Label

    rng = np.random.default_rng(0)
    n, cands = 400, (CHEAP, STRONG)
    explored = rng.random(n) < 0.08
    own = np.ones(n, np.int64)                       # the logger opens on STRONG
    action = np.where(explored, 0, own)              # explored sessions go to CHEAP
    d = pd.DataFrame({"action": action, Label.REWARD: rng.random(n),
                      Label.COST: np.where(action == 0, 0.0001, 0.01),
                      Label.PROPENSITY: np.where(explored, 0.05, 0.95),
                      Label.SESSION_ID: [f"s{i}" for i in range(n)],
                      OPENING_REQUEST: [f"s{i}/t0" for i in range(n)],
                      Label.SESSION_COST: np.nan,
                      Label.LABEL_SOURCE: np.where(explored, "exploration", "logged")})
    prob = np.full((n, 2), 0.5)
    cost = np.array([0.0001, 0.01])  # the cost model: per-candidate unit cost
    ev = RouterEvalConfig(n_boot=50, seed=0)
    # departs on 30% of sessions, but chooses STRONG wherever CHEAP was explored
    choice = np.where(~explored & (rng.random(n) < 0.3), 0, 1)
    out, _ = evaluate_test(prob, choice, d, cands, cost, cost, ev)
    assert out["departure_support"] == 0 and out["departure_share"] > 0.2
    assert any("departs from the logging policy" in w for w in out["warnings"])
    # the same departures, and every explored CHEAP session now shows the served choice
    choice2 = np.where(explored, 0, choice)
    out2, _ = evaluate_test(prob, choice2, d, cands, cost, cost, ev)
    assert out2["departure_support"] == int(explored.sum()) >= LOW_DEPARTURE_SUPPORT
    assert not any("departs from the logging policy" in w for w in out2["warnings"])


def test_head_trains_on_a_bounded_uniform_sample_of_train_sessions(files, trained, tmp_path):
    """receipts.max_train_decisions: the head's fits see at most that many train decisions
    (their replays with them); calibration and test are untouched."""
    led, rep = files
    full, _, _ = trained
    cfg = router_receipts_config(receipts={"n_boot": 200, "min_explored_per_candidate": 5,
                         "max_train_decisions": 300})
    s, run = train_router_receipts(validate_ledger(led), rep, cfg, tmp_path, tfidf, ENCODER)
    tr = s["labels"]["train"]
    assert tr["decisions"] == 300 < tr["decisions_available"] == full["labels"]["train"]["decisions"]
    assert 0 < tr["replays"] < full["labels"]["train"]["replays"]  # replays of dropped ones out
    assert s["labels"]["calibration"] == full["labels"]["calibration"]
    assert s["ope"]["sessions"] == full["ope"]["sessions"] and s["splits"] == full["splits"]
    assert s["cost_model"] == full["cost_model"]  # every train call still prices the candidates


def test_sequential_gate_reads_the_looks_spent_alpha(files, tmp_path):
    """router.sequential (issue 45 item 4): kind spending makes the gate read the betting
    intervals at this look's alpha (recorded in the summary), wider than the one-look
    bootstrap's at the same data; the objective kinds it cannot judge are refused."""
    import dataclasses

    from replaylab.router.sequential import SEQUENTIAL_VARIANT, SequentialConfig

    led, rep = files
    base = router_receipts_config()
    cfg = dataclasses.replace(base, sequential=SequentialConfig(kind="spending", look=2,
                                                                 looks=5))
    s, _ = train_router_receipts(validate_ledger(led), rep, cfg, tmp_path, tfidf, ENCODER)
    rec = s["ope"]["sequential"]
    assert rec["look"] == 2 and rec["looks"] == 5 and rec["kind"] == "spending"
    assert 0 < rec["alpha_look"] < rec["spent"] < 0.05 and "betting" in rec["sequence"]
    evid = s["ope"]["evidence"]
    assert evid["chosen"] == SEQUENTIAL_VARIANT
    seq, one_look = evid["variants"][SEQUENTIAL_VARIANT], evid["variants"]["ips@none"]
    for key in ("diff_quality", "diff_cost"):
        lo, hi = seq[key]["ci"]
        assert lo <= seq[key]["estimate"] <= hi
        assert seq[key]["estimate"] == pytest.approx(one_look[key]["estimate"])
        assert hi - lo > one_look[key]["ci"][1] - one_look[key]["ci"][0]
    crit = {c["name"]: c for c in s["go_detail"]["criteria"]}
    assert crit["quality vs logging"]["ci"] == pytest.approx(seq["diff_quality"]["ci"])
    assert s["verdict"] in VERDICTS
    with pytest.raises(ValueError, match="sequential"):
        dataclasses.replace(cfg, objective=dataclasses.replace(cfg.objective,
                                                               kind="quality_floor"))
