"""The head's IPS clip, teachers and width chosen per run on calibration (router.head_select).

The search itself is checked with a stand-in scorer (no fitting); both pipelines are run
on the shipped RouteLLM GSM8K outcomes with the TF-IDF stand-in embedding and small heads:
the chosen head is the calibration argmin among the heads tried, the test split cannot
move the choice, `enabled: false` is the configured head, and on a seeded receipts ledger
whose logging policy saw what the head cannot (propensities 0.9 / 0.1 skewed by a hidden
variable) the selection takes the larger clip.
"""

from __future__ import annotations

import dataclasses
import zlib

import numpy as np
import pandas as pd
import pytest

from replaylab.apps.inputs import default_outcomes
from replaylab.config import ConfigError
from replaylab.contracts import validate_ledger
from replaylab.contracts.columns import Ledger as L
from replaylab.contracts.columns import Outcomes as O
from replaylab.contracts.enums import OutcomeStatus
from replaylab.pipelines.router import test_prompts as split_test_prompts
from replaylab.pipelines.router import train_router
from replaylab.pipelines.router_receipts import train_router_receipts
from replaylab.router.config import RouterExplorationConfig
from replaylab.router.exploration import deployment_ledger, simulate_receipts
from replaylab.router.head import HeadConfig, SuccessHead
from replaylab.router.head_select import HeadSelectConfig, select_head
from replaylab.router.inputs import TrainingRows
from replaylab.router.pipeline_config import router_config
from replaylab.router.replay import outcome_matrix
from replaylab.router.rules import ScenarioRules
from replaylab.sources.routellm import import_routellm_gsm8k
from tests.helpers.router import CHEAP, ENCODER, STRONG, receipts_world, tfidf

HEAD = {"max_epochs": 15, "num_threads": 1, "teachers": 1, "hidden": [32], "max_weight": 2.0}
SELECT = {"enabled": True, "max_weight": [2.0, 20.0], "teachers": [1, 2],
          "hidden": [[32], [16]]}


def _cfg(head: dict | None = None, select: dict | None = None, **over) -> object:
    base = {"candidates": [CHEAP, STRONG],
            "cost": {"call_cost_usd": {CHEAP: 0.00012, STRONG: 0.01235}},
            "head": {**HEAD, **(head or {})}, "head_select": {**SELECT, **(select or {})},
            "receipts": {"n_boot": 200, "min_explored_per_candidate": 5}, "spread_seeds": 1,
            "replay_plan": {"budget": 20}, "go": {"n_boot": 200},
            "evaluation": {"n_boot": 200}, "lgbm_estimators": 20,
            "knn_neighbors": 10}
    base.update(over)
    return router_config(base)


def _chosen(sel: dict) -> dict:
    rows = [r for r in sel["candidates"] if r["chosen"]]
    assert len(rows) == 1
    return rows[0]


def _argmin(sel: dict) -> dict:
    """The calibration argmin: met first, then the criterion (ties are not expected)."""
    return min(sel["candidates"], key=lambda r: (not r["met"], r["criterion"]))


def _key(r: dict) -> tuple:
    return (r["max_weight"], r["teachers"], tuple(r["hidden"]))


# ---------------------------------------------------------------- the search
def _fake(table: dict):
    """evaluate() stand-in: criterion from a table keyed by (clip, teachers, hidden)."""
    seen = []

    def evaluate(hc: HeadConfig):
        key = (hc.max_weight, hc.teachers, hc.hidden)
        seen.append(key)
        met, crit = table.get(key, (True, 1.0))
        return met, crit, {"x": crit}, key

    return evaluate, seen


BASE = HeadConfig(max_weight=2.0, teachers=5, hidden=(256, 128))
SEL = HeadSelectConfig(enabled=True, max_weight=(2.0, 20.0), teachers=(1, 5),
                       hidden=((256, 128), (64,)))


def test_coordinate_search_tries_one_axis_at_a_time_and_keeps_the_argmin():
    table = {(2.0, 5, (256, 128)): (True, 0.72), (20.0, 5, (256, 128)): (True, 0.54),
             (20.0, 1, (256, 128)): (True, 0.60), (20.0, 5, (64,)): (True, 0.55)}
    evaluate, seen = _fake(table)
    trial, sel = select_head(BASE, SEL, evaluate, "c")
    assert seen == [(2.0, 5, (256, 128)), (20.0, 5, (256, 128)), (20.0, 1, (256, 128)),
                    (20.0, 5, (64,))]  # 4 heads, not the grid's 8
    assert trial.fitted == (20.0, 5, (256, 128)) and trial.head.max_weight == 20.0
    assert sel["chosen"] == {"max_weight": 20.0, "teachers": 5, "hidden": [256, 128]}
    assert sel["chosen_on"] == "calibration" and len(sel["candidates"]) == 4
    assert _key(_chosen(sel)) == _key(_argmin(sel))
    assert "max_weight 20 chosen" in sel["reason"] and "teachers 5 kept" in sel["reason"]


def test_grid_search_tries_every_combination():
    table = {(2.0, 5, (256, 128)): (True, 0.5), (20.0, 5, (256, 128)): (True, 0.6),
             (2.0, 1, (256, 128)): (True, 0.7), (2.0, 5, (64,)): (True, 0.8),
             (20.0, 1, (64,)): (True, 0.3)}  # only the grid reaches the last one
    evaluate, seen = _fake(table)
    trial, sel = select_head(BASE, dataclasses.replace(SEL, search="grid"), evaluate, "c")
    assert len(seen) == len(set(seen)) == 8 and trial.fitted == (20.0, 1, (64,))
    assert _key(_chosen(sel)) == _key(_argmin(sel)) == (20.0, 1, (64,))
    evaluate, seen = _fake(table)
    trial, _ = select_head(BASE, SEL, evaluate, "c")
    assert len(seen) == 4 and trial.fitted == (2.0, 5, (256, 128))


def test_ties_go_to_the_cheaper_head_and_unmet_targets_rank_last():
    evaluate, _ = _fake({})  # every head ties at 1.0
    trial, _ = select_head(BASE, SEL, evaluate, "c")
    assert trial.fitted == (2.0, 1, (64,))  # the configured clip, 1 teacher, the narrow head
    table = {(2.0, 5, (256, 128)): (True, 0.9), (20.0, 5, (256, 128)): (False, -0.99),
             (2.0, 1, (256, 128)): (True, 0.95), (2.0, 5, (64,)): (True, 0.91)}
    evaluate, _ = _fake(table)
    trial, sel = select_head(BASE, SEL, evaluate, "c")
    assert trial.fitted == (2.0, 5, (256, 128))  # 20 never reached the target
    assert "target not met" in sel["reason"]


def test_disabled_fits_the_configured_head_only():
    evaluate, seen = _fake({})
    trial, sel = select_head(BASE, dataclasses.replace(SEL, enabled=False), evaluate, "c")
    assert seen == [(2.0, 5, (256, 128))] and trial.head == BASE
    assert sel["enabled"] is False and sel["candidates"] == [] and sel["chosen_on"] == "config"


def test_config_is_checked_and_defaults_off():
    assert router_config({"candidates": ["a", "b"]}).head_select.enabled is False
    cfg = router_config({"candidates": ["a", "b"], "head_select": {"hidden": [[8, 4], [8]]}})
    assert cfg.head_select.hidden == ((8, 4), (8,))
    for bad in ({"max_weight": [0.5]}, {"teachers": [0]}, {"hidden": [64]}, {"search": "x"},
                {"enabled": "yes"}):
        with pytest.raises(ConfigError):
            router_config({"candidates": ["a", "b"], "head_select": bad})


def test_teacher_cache_reuses_teacher_zero_as_the_one_head_fit():
    rng = np.random.default_rng(0)
    n, k = 120, 2
    emb = rng.normal(size=(n, 8)).astype(np.float32)
    meta = {"category": np.array(["a", "b"] * (n // 2), dtype=object),
            "prompt_tokens": rng.integers(5, 50, n).astype(float)}
    rows = TrainingRows(np.repeat(np.arange(n), k), np.tile(np.arange(k), n),
                        (rng.random(n * k) < 0.6).astype(float), np.ones(n * k), None)
    hc = HeadConfig(hidden=(8,), max_epochs=5, teachers=3)
    hc1 = dataclasses.replace(hc, teachers=1)
    cache: dict = {}
    three = SuccessHead(hc, seed=4).fit(emb, meta, rows, k, teacher_cache=cache)
    assert len(cache) == 1 and three.teachers_[0]["seed"] == 4  # teacher 0 kept, seed 4
    (teacher,) = cache.values()
    one = SuccessHead(hc1, seed=4).fit(emb, meta, rows, k, teacher_cache=cache)
    assert one.net_ is not teacher.net_ and one.history_ == teacher.history_  # a copy of it
    fresh = SuccessHead(hc1, seed=4).fit(emb, meta, rows, k)
    np.testing.assert_array_equal(one.predict_proba(emb, meta), fresh.predict_proba(emb, meta))
    other = SuccessHead(hc1, seed=5).fit(emb, meta, rows, k, teacher_cache=cache)  # not reused
    assert len(cache) == 1
    assert not np.array_equal(other.predict_proba(emb, meta), fresh.predict_proba(emb, meta))


# ---------------------------------------------------------------- receipts mode
@pytest.fixture(scope="module")
def receipts_files():
    world = receipts_world(_cfg())
    return world.ledger, world.replays


@pytest.fixture(scope="module")
def receipts_run(receipts_files, tmp_path_factory):
    led, rep = receipts_files
    out = tmp_path_factory.mktemp("hs-receipts")
    s, run = train_router_receipts(validate_ledger(led), rep, _cfg(), out, tfidf, ENCODER)
    return s, run, out


def test_receipts_choice_is_the_calibration_argmin_and_is_served(receipts_run):
    s, run, _ = receipts_run
    sel = s["head_selection"]
    assert sel["enabled"] and sel["chosen_on"] == "calibration" and sel["search"] == "coordinate"
    assert 3 <= len(sel["candidates"]) <= 4
    chosen = _chosen(sel)
    assert _key(chosen) == _key(_argmin(sel))
    assert sel["chosen"] == {k: chosen[k] for k in ("max_weight", "teachers", "hidden")}
    for r in sel["candidates"]:  # the criterion is the DR cost at the calibration point
        assert r["criterion"] == (r["dr_cost"] if r["met"] else -r["dr_quality"])
    # the served head is the chosen fit: its operating point is the one selected on
    assert s["operating_point"]["dr_cost"] == chosen["dr_cost"]
    assert run.threshold == chosen["threshold"]
    assert run.config.head.max_weight == chosen["max_weight"] == s["labels"]["ips_clip"]
    assert run.config.head.teachers == chosen["teachers"] == run.head.config.teachers
    assert list(run.head.config.hidden) == chosen["hidden"]


def test_receipts_test_sessions_do_not_move_the_choice(receipts_run, receipts_files, tmp_path):
    s, _, out = receipts_run
    led, rep = receipts_files
    labels = pd.read_parquet(out / "router_labels.parquet")
    test_sessions = set(labels.loc[labels["split"] == "test", L.SESSION_ID].astype(str))
    assert test_sessions
    bad = led.copy()
    t = bad[L.SESSION_ID].astype(str).isin(test_sessions).to_numpy()
    ok = bad[L.OUTCOME_STATUS] == OutcomeStatus.SUCCESS
    bad.loc[t, L.OUTCOME_SCORE] = 1.0 - pd.to_numeric(bad.loc[t, L.OUTCOME_SCORE])
    bad.loc[t, L.OUTCOME_STATUS] = np.where(ok[t], OutcomeStatus.FAILURE, OutcomeStatus.SUCCESS)
    bad.loc[t, L.ACTUAL_COST] = pd.to_numeric(bad.loc[t, L.ACTUAL_COST]) * 3.0
    s2, _ = train_router_receipts(validate_ledger(bad), rep, _cfg(), tmp_path, tfidf, ENCODER)
    assert s2["splits"] == s["splits"]
    assert s2["ope"]["dr"]["estimate"] != s["ope"]["dr"]["estimate"]  # the test did change
    assert s2["head_selection"] == s["head_selection"]  # the choice and its figures did not


def test_receipts_disabled_is_the_configured_head(receipts_run, receipts_files, tmp_path):
    led, rep = receipts_files
    off, run = train_router_receipts(validate_ledger(led), rep, _cfg(select={"enabled": False}),
                                     tmp_path / "off", tfidf, ENCODER)
    sel = off["head_selection"]
    assert sel["enabled"] is False and sel["candidates"] == []
    assert sel["chosen"] == {"max_weight": 2.0, "teachers": 1, "hidden": [32]}
    assert run.config.head == _cfg().head and run.head.config == _cfg().head
    # the same as a selection whose only candidates are the configured values
    one, _ = train_router_receipts(
        validate_ledger(led), rep, _cfg(select={"max_weight": [2.0], "teachers": [1],
                                                "hidden": [[32]]}),
        tmp_path / "one", tfidf, ENCODER)
    assert len(one["head_selection"]["candidates"]) == 1
    for key in ("operating_point", "ope", "go", "head"):
        assert off[key] == one[key], key


# ---------------------------------------------------------------- outcomes mode
@pytest.fixture(scope="module")
def gsm8k_outcomes():
    return import_routellm_gsm8k(default_outcomes())


@pytest.fixture(scope="module")
def outcomes_run(gsm8k_outcomes, tmp_path_factory):
    out = tmp_path_factory.mktemp("hs-outcomes")
    s, run = train_router(gsm8k_outcomes, _cfg(), out, tfidf)
    return s, run


def test_outcomes_choice_is_the_calibration_argmin_and_is_served(outcomes_run):
    s, run = outcomes_run
    sel = s["head_selection"]
    assert sel["enabled"] and sel["chosen_on"] == "calibration"
    # the criterion is the served objective's (router.objective, default incumbent): the
    # cost per opening call of the threshold it chooses on calibration, read with DR on the
    # fully replayed calibration split (the one head choice, router_fit.choose_head)
    assert sel["criterion"].startswith("DR cost per opening call")
    assert "objective incumbent" in sel["criterion"] and "(rules)" in sel["criterion"]
    chosen = _chosen(sel)
    assert _key(chosen) == _key(_argmin(sel))
    target = s["test"]["learned"]["threshold"]["target_quality"]  # on calibration
    for r in sel["candidates"]:
        assert r["met"] and r["criterion"] == pytest.approx(r["dr_cost"])
        assert r["dr_quality"] >= target - 1e-9 and r["target_quality"] == target
    assert s["test"]["learned"]["threshold"]["threshold"] == chosen["threshold"] == run.threshold
    assert run.config.head.max_weight == chosen["max_weight"]
    assert run.head.config == run.config.head


def test_outcomes_test_prompts_do_not_move_the_choice(outcomes_run, gsm8k_outcomes, tmp_path):
    s, _ = outcomes_run
    te, _, _ = split_test_prompts(gsm8k_outcomes, _cfg())
    bad = gsm8k_outcomes.copy()
    t = bad[O.PROMPT_ID].isin(set(te.prompt_ids)).to_numpy()
    assert 0 < t.sum() < len(bad)
    bad.loc[t, O.SCORE] = 1.0 - bad.loc[t, O.SCORE].astype(float)
    bad.loc[t, O.SUCCESS] = ~bad.loc[t, O.SUCCESS].astype(bool)
    s2, _ = train_router(bad, _cfg(), tmp_path, tfidf)
    assert s2["test"]["strong_only"]["quality"] != s["test"]["strong_only"]["quality"]
    assert s2["head_selection"] == s["head_selection"]


# ---------------------------------------------------------------- a clip that matters
def _skewed_ledger(n: int = 1600, seed: int = 7):
    """Two visible categories. In `a` the cheap model succeeds iff a hidden flag is set
    (40% of prompts), and the logging policy, which sees the flag, sends exactly those
    prompts to it: its cheap rows in `a` are successes at propensity 0.9 and failures
    explored at 0.1. In `b` the cheap model succeeds on 65% of prompts whatever the
    policy sees. Weighted 1 / propensity the head learns p_cheap(a) ~ 0.4 < p_cheap(b)
    ~ 0.65; clipped at 2 the failures count for 2 instead of 10 and p_cheap(a) ~ 0.77
    ranks `a` first: the router then buys its cheap calls where they fail."""
    rng = np.random.default_rng(seed)
    topic = np.where(np.arange(n) % 2 == 0, "a", "b")
    hidden = rng.random(n) < 0.4
    b_cheap = rng.random(n) < 0.65
    cheap_ok = np.where(topic == "a", hidden, b_cheap)
    b_rule = rng.random(n) < 0.5  # b: half the prompts to the cheap model, blind
    fine = np.where(topic == "a", np.where(hidden, "a1", "a0"), np.where(b_rule, "b1", "b0"))
    rows = []
    for i in range(n):
        text = f"question {i} on topic {topic[i]}"
        for cand, ok, cost in ((CHEAP, cheap_ok[i], 0.001), (STRONG, True, 0.01)):
            rows.append({O.VERSION: "1", O.PROMPT_ID: f"p{i}", O.PROMPT_TEXT: text,
                         O.TASK: fine[i], O.CANDIDATE: cand, O.SCORE: float(ok),
                         O.SUCCESS: bool(ok), O.COST: cost})
    outcomes = pd.DataFrame(rows)
    cfg = _cfg()
    m = outcome_matrix(outcomes, cfg.cost, candidates=cfg.candidates)
    rules = ScenarioRules.from_choices(cfg.candidates, {"a1": CHEAP, "a0": STRONG, "b1": CHEAP,
                                                        "b0": STRONG}, STRONG, "sees the flag",
                                       n, cfg.rules)
    sim = simulate_receipts(m, rules, RouterExplorationConfig(rate=0.1, mean_turns=1.5,
                                                              seed=seed))
    texts = outcomes.drop_duplicates(O.PROMPT_ID).set_index(O.PROMPT_ID)[O.PROMPT_TEXT].to_dict()
    led = deployment_ledger(sim, texts)
    led[L.CATEGORY] = led[L.CATEGORY].str[0]  # the head sees the topic, never the flag
    return led


def _topic_embed(texts: list[str]) -> np.ndarray:
    """The topic and per-text noise: nothing about the hidden flag."""
    out = np.zeros((len(texts), 8), np.float32)
    for j, t in enumerate(texts):
        rng = np.random.default_rng(zlib.crc32(t.encode()))
        out[j] = rng.normal(0.0, 0.3, 8)
        out[j, 0] += 1.0 if t.endswith("a") else -1.0
    return out / np.linalg.norm(out, axis=1, keepdims=True)


def test_skewed_propensities_choose_the_large_clip(tmp_path):
    led = _skewed_ledger()
    cfg = _cfg(select={"teachers": [1], "hidden": [[32]]})
    s, run = train_router_receipts(validate_ledger(led), None, cfg, tmp_path, _topic_embed,
                                   ENCODER)
    sel = s["head_selection"]
    by_clip = {r["max_weight"]: r for r in sel["candidates"]}
    assert set(by_clip) == {2.0, 20.0}
    assert by_clip[20.0]["met"] and by_clip[20.0]["chosen"], sel
    assert (not by_clip[2.0]["met"]
            or by_clip[20.0]["dr_cost"] < by_clip[2.0]["dr_cost"] * 0.95), sel
    assert run.config.head.max_weight == 20.0 and s["labels"]["ips_clip"] == 20.0


# ---------------------------------------------------------------- the reports
def test_both_reports_show_the_selection_table(receipts_run, outcomes_run, tmp_path):
    from replaylab.tracking.receipts_report import write_receipts_report
    from replaylab.tracking.router_report import write_router_report

    for name, (s, *_rest), write in (("receipts", receipts_run, write_receipts_report),
                                     ("outcomes", outcomes_run, write_router_report)):
        html = write(s, tmp_path / name).read_text()
        i = html.index("Head hyperparameters, chosen on calibration")
        part = html[i:html.index("</table>", i)]
        assert part.count("<tr class=") == len(s["head_selection"]["candidates"])
        assert part.count("<b>served</b>") == 1 and "test never looked at" in part
