"""Router labels: outcome matrix, scenario rules, simulated receipts, bandit rows, replay.

Committed slices under tests/data (README_outcomes.md) and tiny seeded frames;
all 1,319 RouteLLM GSM8K prompts (the package's shipped outcomes) in one slow test.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from replaylab.config import ConfigError
from replaylab.contracts import validate_ledger
from replaylab.contracts.columns import Ledger as L
from replaylab.contracts.columns import Outcomes as O
from replaylab.router.config import (
    RouterCostConfig,
    RouterExplorationConfig,
    RouterReplayConfig,
    RouterRulesConfig,
)
from replaylab.router.exploration import bandit_rows, simulate_receipts
from replaylab.router.pipeline_config import router_config
from replaylab.router.replay import Label, outcome_matrix, replay_labels, training_labels
from replaylab.router.rules import ScenarioRules
from replaylab.sources.llmrouter import import_llmrouter
from replaylab.sources.routellm import import_routellm_gsm8k, import_routellm_mmlu
from replaylab.sources.routerarena import import_routerarena
from tests.helpers.router import GPT4, GSM8K, MIXTRAL, ROUTELLM_COST


def make_outcomes(n: int, candidates: dict[str, tuple[float, float]], seed: int = 0,
                  tasks: tuple[str, ...] = ("math", "chat")) -> pd.DataFrame:
    """Seeded outcomes-v1 frame: candidates {name: (success rate, cost per call)}."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        text = f"prompt number {i} " + "x" * int(rng.integers(4, 400))
        for cand, (rate, cost) in candidates.items():
            ok = bool(rng.random() < rate)
            rows.append({O.VERSION: "1", O.PROMPT_ID: f"p{i:05d}", O.PROMPT_TEXT: text,
                         O.TASK: tasks[i % len(tasks)], O.CANDIDATE: cand, O.SCORE: float(ok),
                         O.SUCCESS: ok, O.COST: cost, O.CURRENCY: "USD",
                         O.PROMPT_TOKENS: None, O.COMPLETION_TOKENS: None})
    return pd.DataFrame(rows)


THREE = {"small": (0.5, 0.001), "medium": (0.7, 0.004), "large": (0.9, 0.02)}


@pytest.fixture(scope="module")
def gsm8k_slice(test_data):
    frame = import_routellm_gsm8k(test_data / "routellm/gsm8k/gsm8k_responses.csv")
    return frame, outcome_matrix(frame, ROUTELLM_COST)


def _simulate(matrix, **overrides):
    rules = ScenarioRules().fit(matrix)
    return simulate_receipts(matrix, rules, RouterExplorationConfig(**overrides))


# ------------------------------------------------------------------ config


def test_exploration_rate_above_cap_is_refused():
    with pytest.raises(ConfigError, match=r"router.exploration: .*rate=0.2.*cap"):
        router_config({"candidates": ["a", "b"], "exploration": {"rate": 0.2}})
    assert RouterExplorationConfig().rate == 0.05 and RouterExplorationConfig().cap == 0.10
    RouterExplorationConfig(rate=0.2, cap=0.25)  # a raised cap allows more
    with pytest.raises(ValueError, match="RouterExplorationConfig.cap=1.0"):
        RouterExplorationConfig(cap=1.0)
    with pytest.raises(ValueError, match="long_prompt_tokens"):
        RouterRulesConfig(long_prompt_tokens=500)
    with pytest.raises(ValueError, match="prices.gpt"):
        RouterCostConfig(prices={"gpt": {"input_usd_per_million": 1.0}})


# ------------------------------------------------------------------ matrix and costs


def test_outcome_matrix_costs_measured_priced_and_per_call(test_data):
    arena = outcome_matrix(import_routerarena(test_data / "routerarena"))
    assert arena.report["cost_source"]["gemini-2.0-flash-001"] == {"measured": arena.n_prompts}
    assert (arena.meta["prompt_length_source"] == "tokens").all()
    frame = make_outcomes(4, {"a": (0.5, 0.0), "b": (0.9, 0.0)}).assign(
        **{O.COST: None, O.PROMPT_TOKENS: 1000, O.COMPLETION_TOKENS: 500})
    prices = {"a": {"input_usd_per_million": 1.0, "output_usd_per_million": 2.0}}
    m = outcome_matrix(frame, RouterCostConfig(prices=prices, call_cost_usd={"b": 0.5}))
    assert np.allclose(m.cost[:, m.index("a")], (1000 * 1.0 + 500 * 2.0) / 1e6)
    assert np.allclose(m.cost[:, m.index("b")], 0.5)
    assert m.report["cost_source"]["b"] == {"per_call_config": 4}
    with pytest.raises(ValueError, match=r"call_cost_usd\.b"):
        outcome_matrix(frame, RouterCostConfig(prices=prices))


def test_outcome_matrix_leaves_out_incomplete_prompts(test_data):
    frame = make_outcomes(5, {"a": (0.5, 0.1), "b": (0.9, 0.2)})
    frame = frame.drop(frame.index[(frame[O.PROMPT_ID] == "p00002") & (frame[O.CANDIDATE] == "b")])
    m = outcome_matrix(frame)
    assert m.n_prompts == 4 and "p00002" not in set(m.prompt_ids)
    assert m.report["missing_scores_by_candidate"] == {"b": 1}
    assert O.PROMPT_TEXT not in m.meta.columns


# ------------------------------------------------------------------ rules


def test_rules_fitted_per_task_configured_and_long_prompt():
    m = outcome_matrix(make_outcomes(400, THREE, seed=3))
    rules = ScenarioRules(RouterRulesConfig(task_candidate={"chat": "small"})).fit(m)
    info = rules.describe()
    assert info["task_source"] == {"chat": "configured", "math": "fitted"}
    assert info["task_candidate"]["math"] == "large"  # small/medium are far worse
    assert "fitted on the training split (400 prompts)" in info["note"]
    loose = ScenarioRules(RouterRulesConfig(quality_tolerance=1.0)).fit(m)
    assert set(loose.predict(m.meta)) == {"small"}  # within tolerance: the cheapest
    lengthy = ScenarioRules(RouterRulesConfig(long_prompt_tokens=50,
                                              long_prompt_candidate="medium")).fit(m)
    choice, decision = lengthy.decide(m.meta)
    long = m.meta[Label.PROMPT_LENGTH] > 50
    assert (choice[long] == "medium").all() and (decision[long] == "long_prompt").all()
    assert set(decision[~long]) == {"task:math", "task:chat"}
    with pytest.raises(ValueError, match="names no candidate"):
        ScenarioRules(RouterRulesConfig(default_candidate="nope")).fit(m)
    with pytest.raises(RuntimeError, match="not fitted"):
        ScenarioRules().predict(m.meta)


# ------------------------------------------------------------------ simulation


def test_simulated_ledger_is_valid_ledger_v1_with_routing_columns(gsm8k_slice):
    _, m = gsm8k_slice
    sim = _simulate(m, rate=0.1, sessions_per_prompt=4)
    led = sim.ledger
    result = validate_ledger(led)
    assert result.rows_quarantined == 0 and result.rows_valid == len(led)
    for col in (L.BINDING_ID, L.ROUTING_SOURCE, L.PROPENSITY, L.OUTCOME_STATUS,
                L.OUTCOME_SCORE, L.ACTUAL_COST, L.REBIND_REASON):
        assert col in led.columns
    assert led[L.REQUEST_ID].is_unique
    first = led.groupby(L.BINDING_ID)[L.TURN_INDEX].transform("min") == led[L.TURN_INDEX]
    assert led.loc[first, L.PROPENSITY].between(0, 1, inclusive="right").all()
    assert led.loc[~first, L.PROPENSITY].isna().all()
    assert (led.groupby(L.BINDING_ID)[L.SELECTED_MODEL].nunique() == 1).all()
    assert sim.stats["sessions"] == 4 * m.n_prompts and sim.stats["rows_quarantined"] == 0


def test_propensity_is_the_logging_probability_of_the_bound_candidate(test_data):
    frame = import_llmrouter(test_data / "llmrouter/dcrouter_preprocessed")
    m = outcome_matrix(frame, RouterCostConfig(call_cost_usd={c: 0.001 for c in frame[O.CANDIDATE]}))
    k, eps = len(m.candidates), 0.08
    sim = _simulate(m, rate=eps, sessions_per_prompt=20, seed=5)
    assert np.allclose(sim.logging_probs.sum(axis=1), 1.0)
    opening = sim.ledger[sim.ledger[L.TURN_INDEX] == 0]
    logged = sim.logging_probs[np.arange(len(sim.opening)), sim.opening]
    assert np.allclose(opening[L.PROPENSITY].to_numpy(), logged)
    explored = (opening[L.ROUTING_SOURCE] == "exploration").to_numpy()
    assert np.allclose(logged[explored], eps / (k - 1)) and np.allclose(logged[~explored], 1 - eps)
    rule = sim.logging_probs.argmax(axis=1)
    assert (sim.opening[explored] != rule[explored]).all()  # "another candidate"


def test_exploration_share_and_uniform_draw_among_others():
    m = outcome_matrix(make_outcomes(500, THREE, seed=1))
    sim = _simulate(m, rate=0.1, sessions_per_prompt=40, seed=2)
    n, share = sim.stats["sessions"], sim.stats["exploration_share"]
    assert abs(share - 0.1) < 4 * np.sqrt(0.1 * 0.9 / n)
    rule = sim.logging_probs.argmax(axis=1)
    explored = sim.opening != rule
    assert explored.sum() == sim.stats["exploration_sessions"]
    # among explored sessions whose rule chose "large", the two others are equally likely
    pick = sim.opening[explored & (rule == m.index("large"))]
    counts = np.bincount(pick, minlength=3)[[m.index("small"), m.index("medium")]]
    assert abs(counts[0] - counts[1]) < 4 * np.sqrt(counts.sum() / 4)


def test_seeded_and_deterministic(gsm8k_slice):
    _, m = gsm8k_slice
    a, b = _simulate(m, seed=7), _simulate(m, seed=7)
    pd.testing.assert_frame_equal(a.ledger, b.ledger)
    c = _simulate(m, seed=8, rate=0.1)
    assert not a.ledger[L.TIMESTAMP].equals(c.ledger[L.TIMESTAMP])


def test_only_the_bound_candidates_outcome_is_visible_and_escalation(test_data):
    frame = import_routellm_mmlu(test_data / "routellm/mmlu/responses")
    m = outcome_matrix(frame, ROUTELLM_COST)
    rules = ScenarioRules(RouterRulesConfig(default_candidate=MIXTRAL, fit_tasks=False)).fit(m)
    sim = simulate_receipts(m, rules, RouterExplorationConfig(sessions_per_prompt=10, seed=1,
                                                            ladder=(MIXTRAL, GPT4)))
    assert sim.stats["ladder_source"] == "configured"
    led = sim.ledger
    row = pd.Series(np.arange(m.n_prompts), index=m.prompt_ids)[led[O.PROMPT_ID]].to_numpy()
    col = np.array([m.index(c) for c in led[L.SELECTED_MODEL]])
    assert np.array_equal(led[L.OUTCOME_SCORE].to_numpy(), m.score[row, col])
    assert np.allclose(led[L.ACTUAL_COST].to_numpy(), m.cost[row, col])
    # a rebind happens only after a failed turn, to the stronger candidate, never otherwise
    led = led.sort_values([L.SESSION_ID, L.TURN_INDEX])
    prev_fail = led.groupby(L.SESSION_ID)[L.OUTCOME_STATUS].shift() == "failure"
    prev_model = led.groupby(L.SESSION_ID)[L.SELECTED_MODEL].shift()
    esc = led[L.REBIND_REASON] == "escalation"
    assert esc.any() and (prev_fail[esc]).all() and (led.loc[esc, L.SELECTED_MODEL] == GPT4).all()
    assert (prev_model[esc] == MIXTRAL).all() and (led.loc[esc, L.PROPENSITY] == 1.0).all()
    assert (led.loc[esc, L.ROUTING_SOURCE] == "heuristic").all()
    stays = prev_fail & (prev_model == GPT4)
    assert not esc[stays].any()  # the strongest has nowhere to go
    # escalation cost is counted: truth of the logged opening = the ledger's session sums
    t = sim.truth
    per_session = sim.ledger.groupby(L.SESSION_ID)[L.ACTUAL_COST].sum()
    logged = t.session_cost[np.arange(len(sim.opening)), sim.opening]
    assert np.allclose(per_session.reindex(t.session_id).to_numpy(), logged)


# ------------------------------------------------------------------ bandit rows


def test_bandit_rows_one_per_binding(gsm8k_slice):
    _, m = gsm8k_slice
    sim = _simulate(m, rate=0.1, sessions_per_prompt=5, seed=3)
    rows = bandit_rows(sim.ledger)
    assert len(rows) == sim.ledger[L.BINDING_ID].nunique()
    assert rows[Label.POLICY_DECISION].sum() == sim.stats["sessions"]
    assert (~rows[Label.POLICY_DECISION]).sum() == sim.stats["escalations"]
    dec = rows[rows[Label.POLICY_DECISION]]
    assert set(dec[Label.LABEL_SOURCE]) <= {"logged", "exploration"}
    assert (dec[Label.LABEL_SOURCE] == "exploration").sum() == sim.stats["exploration_sessions"]
    assert (rows[Label.CONTEXT_KEY] == rows[Label.PROMPT_ID]).all()
    assert np.isclose(rows.groupby(Label.SESSION_ID)[Label.BINDING_COST].sum().sum(),
                      sim.ledger[L.ACTUAL_COST].sum())


def _real_ledger() -> pd.DataFrame:
    """A hand-written receipts ledger as a router would export it (no prompt_id)."""
    base = {L.VERSION: "1", L.LIFECYCLE_STATE: "completed", L.PROMPT_TOKENS: 10,
            L.COMPLETION_TOKENS: 20, L.ACTUAL_COST: 0.01, L.PROMPT_TEXT: "secret text"}
    rows = [
        ("r1", "s1", 0, "m-small", "classifier", "b1", None, 0.7, "success", None),
        ("r2", "s1", 1, "m-small", "sticky_binding", "b1", None, None, "failure", None),
        ("r3", "s1", 2, "m-large", "heuristic", "b2", "escalation", None, "success", 0.9),
        ("r4", "s2", 0, "m-large", "exploration", "b3", None, 0.15, "cancelled", None),
    ]
    cols = [L.REQUEST_ID, L.SESSION_ID, L.TURN_INDEX, L.SELECTED_MODEL, L.ROUTING_SOURCE,
            L.BINDING_ID, L.REBIND_REASON, L.PROPENSITY, L.OUTCOME_STATUS, L.OUTCOME_SCORE]
    frame = pd.DataFrame(rows, columns=cols).assign(**base)
    return frame.assign(**{L.TIMESTAMP: 1_700_000_000_000 + 1000 * frame[L.TURN_INDEX]})


def test_real_receipts_ledger_is_accepted_and_missing_propensity_refused():
    rows = bandit_rows(_real_ledger())
    assert list(rows[Label.BINDING_ID]) == ["b1", "b2", "b3"]
    assert list(rows[Label.CONTEXT_KEY]) == ["r1", "r3", "r4"]  # no prompt_id: first request
    assert list(rows[Label.POLICY_DECISION]) == [True, False, True]
    assert list(rows[Label.LABEL_SOURCE]) == ["logged", "logged", "exploration"]
    assert rows[Label.REWARD].iloc[0] == 1.0 and rows[Label.REWARD].iloc[1] == 0.9
    assert np.isnan(rows[Label.REWARD].iloc[2]) and rows.attrs["label_report"]["no_outcome"] == 1
    assert rows[Label.BINDING_TURNS].tolist() == [2, 1, 1]
    assert np.isclose(rows[Label.SESSION_COST].iloc[0], 0.03)
    assert L.PROMPT_TEXT not in rows.columns
    missing = _real_ledger()
    missing.loc[missing[L.REQUEST_ID] == "r4", L.PROPENSITY] = None
    with pytest.raises(ValueError, match=r"1 binding\(s\) chosen by the logging policy have no "
                                         r"propensity.*b3"):
        bandit_rows(missing)
    with pytest.raises(ValueError, match="lacks routing column"):
        bandit_rows(_real_ledger().drop(columns=[L.PROPENSITY]))


# ------------------------------------------------------------------ replay and privacy


def test_replay_labels_share_and_marking(gsm8k_slice):
    _, m = gsm8k_slice
    rows = bandit_rows(_simulate(m, seed=4).ledger)
    replay = replay_labels(rows, m, RouterReplayConfig(share=0.5, seed=1))
    assert replay.attrs["replay_report"]["replayed_prompts"] == 15
    assert (replay[Label.LABEL_SOURCE] == "replay").all() and replay[Label.PROPENSITY].isna().all()
    logged = rows[rows[Label.POLICY_DECISION]].set_index(Label.PROMPT_ID)[Label.CANDIDATE]
    assert (replay[Label.CANDIDATE].to_numpy() != logged[replay[Label.PROMPT_ID]].to_numpy()).all()
    row = pd.Series(np.arange(m.n_prompts), index=m.prompt_ids)[replay[Label.PROMPT_ID]]
    col = [m.index(c) for c in replay[Label.CANDIDATE]]
    assert np.array_equal(replay[Label.REWARD].to_numpy(), m.score[row.to_numpy(), col])
    again = replay_labels(rows, m, RouterReplayConfig(share=0.5, seed=1))
    pd.testing.assert_frame_equal(replay, again)


def test_prompt_text_never_reaches_the_label_tables(gsm8k_slice):
    frame, m = gsm8k_slice
    sim = _simulate(m, rate=0.1, seed=9)
    rows = bandit_rows(sim.ledger)
    labels = training_labels(rows, replay_labels(rows, m, RouterReplayConfig(share=1.0)))
    texts = set(frame[O.PROMPT_TEXT])
    for table in (m.meta, sim.ledger, rows, labels):
        assert O.PROMPT_TEXT not in table.columns
        for col in table.columns:
            if table[col].dtype == object:
                assert not set(table[col].dropna().astype(str)) & texts, col
    assert set(labels[Label.LABEL_SOURCE]) == {"logged", "exploration", "replay"}


@pytest.mark.slow
def test_gsm8k_full_receipts(test_data):
    """All 1,319 GSM8K prompts: the package's shipped outcomes (the full file's scores)."""
    frame = import_routellm_gsm8k(
        GSM8K, contaminated_path=test_data / "routellm/gsm8k/contaminated_prompts.jsonl")
    m = outcome_matrix(frame, ROUTELLM_COST)
    sim = _simulate(m)
    assert m.n_prompts == 1319 and sim.stats["sessions"] == 1319
    assert validate_ledger(sim.ledger).rows_quarantined == 0
    assert sim.stats["ladder"] == [MIXTRAL, GPT4]
    assert 0.03 < sim.stats["exploration_share"] < 0.07
    assert sim.stats["propensities"] == {"0.05": sim.stats["exploration_sessions"],
                                         "0.95": 1319 - sim.stats["exploration_sessions"]}
