"""Receipts mode: which part of the gain came from exploration and which from replays, what
the replays add, and the next round's plan with its expected gain (issue 46 item 3;
pipelines/router_attribution.py).

A synthetic world whose truth is known: two kinds of opening prompts told apart by their
words; the cheap candidate solves the "sum" prompts (95%) and fails the "proof" prompts
(5%), the strong one solves both (97%). The logging policy's rules send everything to the
strong candidate, 4% of sessions are explored (the only logged cheap outcomes). Offline
replays of a quarter of the openings reveal the cheap candidate's outcome: the head learns
where the cheap candidate suffices from them. "Noise" replays are the same rows with the
cheap outcomes shuffled among themselves (the same success rate, no link to the prompt).
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from replaylab.contracts import validate_ledger
from replaylab.contracts.columns import Outcomes as O
from replaylab.pipelines.router_receipts import train_router_receipts
from replaylab.router.config import RouterEvalConfig
from tests.helpers.router import CHEAP, ENCODER, STRONG, router_receipts_config, tfidf

N_PROMPTS = 700
SUM_WORDS = ["add", "sum", "plus", "total", "numbers", "count", "apples", "coins"]
PROOF_WORDS = ["prove", "theorem", "lemma", "integral", "derive", "bound", "limit", "series"]


def synthetic_world(seed: int = 0, signal: bool = True
                    ) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(ledger, replays carrying the cheap outcome, shuffled replays) of the module's world;
    signal False: the cheap candidate succeeds half the time whatever the prompt (its
    outcomes are noise, and so are the replays that reveal them)."""
    from replaylab.router.config import RouterExplorationConfig
    from replaylab.router.exploration import deployment_ledger, replay_outcomes, simulate_receipts
    from replaylab.router.replay import outcome_matrix
    from replaylab.router.rules import ScenarioRules

    rng = np.random.default_rng(seed)
    easy = rng.random(N_PROMPTS) < 0.5
    rows, texts = [], {}
    for i in range(N_PROMPTS):
        words = SUM_WORDS if easy[i] else PROOF_WORDS
        pid = f"p{i:04d}"
        filler = [f"w{j}" for j in rng.integers(0, 80, size=4)]  # words that tell nothing
        texts[pid] = " ".join([*rng.choice(words, size=4), *filler])
        p_cheap = (0.95 if easy[i] else 0.05) if signal else 0.5
        for cand, p, cost in ((CHEAP, p_cheap, 0.00012), (STRONG, 0.97, 0.01235)):
            ok = bool(rng.random() < p)
            rows.append({O.VERSION: "1", O.PROMPT_ID: pid, O.PROMPT_TEXT: texts[pid],
                         O.TASK: "synthetic", O.CANDIDATE: cand, O.SCORE: float(ok),
                         O.SUCCESS: ok, O.COST: cost})
    cfg = router_receipts_config()
    m = outcome_matrix(pd.DataFrame(rows), cfg.cost, candidates=cfg.candidates)
    rules = ScenarioRules(cfg.rules).fit(m)
    sim = simulate_receipts(m, rules, RouterExplorationConfig(rate=0.04, sessions_per_prompt=2,
                                                              seed=3))
    led = deployment_ledger(sim, texts)
    rep = replay_outcomes(sim, m, texts, share=0.25, seed=0)
    noise = rep.copy()
    cheap = (noise[O.CANDIDATE] == CHEAP).to_numpy()
    shuffled = rng.permutation(noise.loc[cheap, O.SCORE].to_numpy())
    noise.loc[cheap, O.SCORE] = shuffled
    noise.loc[cheap, O.SUCCESS] = shuffled >= 0.5
    return led, rep, noise


def config(**over):
    over.setdefault("evaluation", {"attribution": "auto"})
    return router_receipts_config(head_select={"enabled": False}, **over)


@pytest.fixture(scope="module")
def world():
    return synthetic_world()


@pytest.fixture(scope="module")
def signal(world, tmp_path_factory):
    led, rep, _ = world
    out = tmp_path_factory.mktemp("attr_signal")
    s, _ = train_router_receipts(validate_ledger(led), rep, config(), out, tfidf, ENCODER)
    return s, out


@pytest.fixture(scope="module")
def noise(tmp_path_factory):
    led, rep, _ = synthetic_world(signal=False)
    out = tmp_path_factory.mktemp("attr_noise")
    s, _ = train_router_receipts(validate_ledger(led), rep, config(), out, tfidf, ENCODER)
    return s


def test_replays_that_reveal_a_cheap_candidate_raise_the_value(signal):
    """The replays carry the only real evidence of where the cheap candidate succeeds: the
    served head with them saves more per call than without them, on calibration (where it
    is read) and on test, both intervals above 0."""
    s, _ = signal
    a = s["attribution"]
    assert a["status"] == "done" and a["replays"] > 0 and a["explored_decisions"] > 0
    v = s["replays"]["value"]
    for split in ("calibration", "test"):
        inc = v["increment"][split]
        assert inc["ci"][0] > 0 and inc["reading"] == "adds", (split, inc)
        assert v["with"][split]["gain"] - v["without"][split]["gain"] == pytest.approx(
            inc["estimate"])
    assert v["unit"] == "USD per opening call saved" and v["by"] == "split"
    assert set(v["groups"]) == {"train", "calibration"}
    assert sum(g["replays"] for g in v["groups"].values()) == a["replays"]


def test_the_three_points_sum_to_the_served_gain(signal):
    """own + exploration + replays = the served router's gain, which is the gate's own
    figure (DR cost saving over the logging policy on test)."""
    s, _ = signal
    a = s["attribution"]
    inc = a["increments"]
    for split in ("calibration", "test"):
        parts = sum(inc[k][split]["estimate"] for k in
                    ("head_on_own_decisions", "exploration", "replays"))
        assert parts == pytest.approx(a["total"][split], abs=1e-12)
        assert a["points"]["served"][split]["gain"] == pytest.approx(a["total"][split])
        for k in inc:
            lo, hi = inc[k][split]["ci"]
            assert lo <= inc[k][split]["estimate"] <= hi
    assert a["total"]["test"] == pytest.approx(-s["ope"]["diff"]["cost"]["estimate"])
    # the rules log the strong candidate only: a head on their own choices cannot choose the
    # cheap one, so the first point is the incumbent itself and is not refitted
    assert a["points"]["own"]["calibration"]["gain"] == 0.0 and "note" in a["points"]["own"]
    assert a["refits"] == 1 + len(s["replays"]["value"]["groups"])
    assert a["points"]["served"]["threshold"] == s["operating_point"]["threshold"]


def test_noise_replays_add_nothing_that_shows(noise):
    """Replays of outcomes that are noise (the cheap candidate's success does not depend on
    the prompt): on calibration, where the value is read, the increment's interval covers 0
    (NOT ENOUGH EVIDENCE). On test the head with them saves cost only by losing quality (its
    quality interval lies wholly below the logging policy's - margin: the gate's NO-GO), so
    the saving is read as no gain."""
    v = noise["replays"]["value"]
    inc = v["increment"]
    lo, hi = inc["calibration"]["ci"]
    assert lo <= 0 <= hi and inc["calibration"]["reading"] == "NOT ENOUGH EVIDENCE", inc
    assert inc["test"]["reading"] != "adds"
    q = v["with"]["test"]["quality_vs_logging"]
    if inc["test"]["reading"] == "bought with quality":
        assert q["ci"][1] < -0.01 and inc["test"]["estimate"] > 0
    else:
        assert inc["test"]["ci"][0] <= 0


def test_attribution_off_writes_nothing_and_changes_nothing(world, signal, tmp_path):
    led, rep, _ = world
    s, _ = train_router_receipts(validate_ledger(led), rep,
                                 config(evaluation={"attribution": "off"}), tmp_path, tfidf,
                                 ENCODER)
    assert "attribution" not in s and "value" not in s["replays"]
    on, _ = signal
    assert s["operating_point"]["threshold"] == on["operating_point"]["threshold"]
    assert s["ope"]["diff"]["cost"] == on["ope"]["diff"]["cost"] and s["verdict"] == on["verdict"]
    with pytest.raises(ValueError, match="attribution"):
        RouterEvalConfig(attribution="sometimes")


def test_an_attribution_that_cannot_be_made_is_skipped_not_fatal(world, signal, tmp_path,
                                                                  monkeypatch):
    """A refit that fails: the run finishes with the same router and verdict, the summary
    says the attribution was skipped and why, and no replay value is claimed."""
    import replaylab.pipelines.router_attribution as attribution

    def broken(*args, **kwargs):
        raise ValueError("no usable rows")

    monkeypatch.setattr(attribution, "fit_head", broken)
    led, rep, _ = world
    s, _ = train_router_receipts(validate_ledger(led), rep, config(), tmp_path, tfidf, ENCODER)
    assert s["attribution"]["status"] == "skipped"
    assert "could not be refitted: ValueError: no usable rows" in s["attribution"]["reason"]
    assert "value" not in s["replays"]
    on, _ = signal
    assert s["operating_point"]["threshold"] == on["operating_point"]["threshold"]
    assert s["verdict"] == on["verdict"]


def test_replay_groups_by_source_column(world, tmp_path):
    """A `source` column in data.replays scores each source: harness-a replays half of the
    replayed prompts truly, harness-b the other half with the cheap outcomes shuffled among
    themselves (the same success rate, no link to the prompt: they drown the explored
    evidence). harness-a adds, and more than harness-b."""
    led, rep, noise = world
    half = set(rep[O.PROMPT_ID].unique()[::2])  # each replayed prompt from one harness
    both = pd.concat([rep[rep[O.PROMPT_ID].isin(half)].assign(source="harness-a"),
                      noise[~noise[O.PROMPT_ID].isin(half)].assign(source="harness-b")],
                     ignore_index=True)
    s, _ = train_router_receipts(validate_ledger(led), both, config(), tmp_path, tfidf,
                                 ENCODER)
    v = s["replays"]["value"]
    assert v["by"] == "source" and set(v["groups"]) == {"harness-a", "harness-b"}
    a, b = v["groups"]["harness-a"], v["groups"]["harness-b"]
    assert a["calibration"]["estimate"] > b["calibration"]["estimate"]
    assert a["calibration"]["ci"][0] > 0 and a["calibration"]["reading"] == "adds"
    assert a["replays"] + b["replays"] == s["attribution"]["replays"]


def test_plan_expected_gain_for_every_planned_prompt(signal):
    """replay_plan.jsonl: every row has a finite expected gain >= 0; the summary states the
    total, the means and the budget, and they are the file's."""
    s, out = signal
    plan = pd.read_json(out / "replay_plan.jsonl", lines=True)
    rp = s["replay_plan"]
    assert len(plan) == rp["rows"] == rp["budget"] == 50
    g = plan["expected_gain"].to_numpy(float)
    assert np.isfinite(g).all() and (g >= 0).all() and g.max() > 0
    eg = rp["expected_gain"]
    assert eg["total"] == pytest.approx(g.sum()) and eg["prompts"] == plan["prompt_id"].nunique()
    assert eg["mean_per_row"] == pytest.approx(g.mean())
    assert eg["mean_per_prompt"] == pytest.approx(g.sum() / plan["prompt_id"].nunique())
    assert json.loads(json.dumps(eg))["unit"].startswith("routing score")


def test_report_says_where_the_gain_came_from(signal, tmp_path):
    from replaylab.tracking.receipts_report import write_receipts_report

    s, _ = signal
    html = write_receipts_report(s, tmp_path).read_text()
    assert "Where the gain came from" in html and "exploration" in html
    inc = s["attribution"]["increments"]["replays"]["test"]
    assert f"{inc['estimate']:.6f}" in html or f"{inc['estimate']:.6g}" in html
    off = write_receipts_report({k: v for k, v in s.items() if k != "attribution"},
                                tmp_path / "off").read_text()
    assert "Not computed (router.evaluation.attribution=off)" in off
