"""The router pipeline end to end, its artifact and the serving Router.

Pipeline logic runs on the shipped RouteLLM GSM8K outcomes with a cheap
stand-in embedding (TF-IDF + SVD); the artifact tests use the real MiniLM ONNX
encoder, exported once per module, on a subset of the same prompts.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from replaylab.artifacts.router_export import export_router
from replaylab.config import ConfigError
from replaylab.contracts import validate_ledger
from replaylab.pipelines.router import RouterDataError, seeded_split, train_router
from replaylab.pipelines.router import test_prompts as split_test_prompts
from replaylab.router.exploration import simulate_receipts
from replaylab.runtime import Router
from replaylab.sources.routellm import import_routellm_gsm8k
from replaylab.verdict import GO, VERDICTS
from tests.conftest import REPO
from tests.helpers.router import CHEAP, GSM8K, STRONG, router_pipeline_config, tfidf

POLICIES = {"learned", "rules", "rules_equal", "random", "knn", "lgbm", "cheap_only",
            "strong_only", "oracle"}
KEYS = {"quality", "cost", "strong_share", "apgr", "cpt50", "cpt80", "cost_ratio_at_95"}


@pytest.fixture(scope="module")
def outcomes() -> pd.DataFrame:
    return import_routellm_gsm8k(GSM8K)


@pytest.fixture(scope="module")
def gsm8k_run(outcomes, tmp_path_factory):
    seen: list[list[str]] = []

    def embed(texts):
        seen.append(list(texts))
        return tfidf(texts)

    out = tmp_path_factory.mktemp("router")
    summary, run = train_router(outcomes, router_pipeline_config(), out, embed)
    return summary, run, out, seen


# ---------------------------------------------------------------- pipeline
def test_summary_has_the_documented_keys(gsm8k_run):
    s, _, _, _ = gsm8k_run
    assert s["pipeline"] == "router" and s["candidates"] == [CHEAP, STRONG]
    assert s["prompts"] == 1319 and sum(s["splits"].values()) == 1319
    assert set(s["test"]) == POLICIES
    for name, v in s["test"].items():
        assert KEYS <= set(v), name
    assert {"ips", "snips", "dr", "truth"} <= set(s["ope"])
    for est in ("ips", "snips", "dr"):
        lo, hi = s["ope"][est]["ci"]
        assert lo <= hi and np.isfinite(s["ope"][est]["estimate"])
    assert isinstance(s["go"], bool) and s["go_reasons"]
    assert s["verdict"] in VERDICTS and s["go"] == (s["verdict"] == GO)
    assert s["go_reasons"][0].startswith("objective incumbent")
    assert f"; {s['verdict']}: " in s["go_reasons"][0]
    # the OPE evidence on the re-logged test (the receipts gate's sums) beside the truth
    ev = s["ope"]["evidence"]
    assert ev["variants"]["snips@none"]["quality"]["estimate"] == pytest.approx(
        s["ope"]["snips"]["estimate"])
    assert ev["weights"]["ess"] == pytest.approx(s["ope"]["ess"])
    assert s["ope"]["ope_verdict"]["verdict"] in VERDICTS
    assert [c["fraction"] for c in s["learning_curve"]] == [0.25, 0.5, 1.0]


def test_the_receipts_pipeline_judged_the_decisions_the_truth_judges(gsm8k_run):
    """The outcomes mode runs the receipts pipeline on receipts simulated from the table:
    its time split is the seeded prompt split (no session embargoed), its calibration
    openings are all replayed, its test decisions are the ones scored on the truth
    (agreement 1.0 over every test session), and its threshold is the served one."""
    s, run, out, _ = gsm8k_run
    r = json.loads((out / "receipts" / "summary.json").read_text())
    assert r["mode"] == "receipts" and r["compute"]["kind"] == "local"
    assert {k: r["receipts"]["decisions"][k] for k in s["splits"]} == s["splits"]
    assert r["receipts"]["decisions"]["embargo"] == 0
    n_cal, k = s["splits"]["calibration"], len(s["candidates"])
    assert r["replays"]["used"]["calibration"] == n_cal * (k - 1)
    assert r["replays"]["used"]["train"] == s["replay"]["replayed_prompts"] * (k - 1)
    agree = s["ope"]["served_agreement"]
    assert agree["share"] == 1.0 and agree["sessions"] == s["splits"]["test"]
    assert r["operating_point"]["threshold"] == run.threshold == s["served_threshold"]
    assert r["operating_point"]["incumbent"] == "rules"
    assert s["ope"]["truth_figures"]["sessions"] == s["splits"]["test"]
    assert s["ope"]["truth"] == pytest.approx(s["test"]["learned"]["quality"], rel=1e-12)


def test_seed_to_seed_spread_beside_the_headline(outcomes, gsm8k_run, tmp_path):
    """router.spread_seeds: the learned router's test figures over head seeds, the first
    being the headline itself; other seeds give other heads (a spread, not a copy)."""
    s1, _, _, _ = gsm8k_run
    assert s1["spread"]["seeds"] == [0]  # the library default: no spread
    s, _ = train_router(outcomes, router_pipeline_config(spread_seeds=3, head={"max_epochs": 30, "num_threads": 1,
                                                             "teachers": 1}), tmp_path, tfidf)
    sp = s["spread"]
    assert sp["seeds"] == [0, 1, 2] and len(sp["rows"]) == 3
    assert sp["cost_ratio_at_95"]["values"][0] == s["test"]["learned"]["cost_ratio_at_95"]
    assert sp["quality"]["values"][0] == s["test"]["learned"]["quality"]
    assert sp["cost_ratio_at_95"]["min"] <= sp["cost_ratio_at_95"]["max"]
    assert len({r["threshold"] for r in sp["rows"]} | {r["quality"] for r in sp["rows"]}) > 2


def test_the_console_verdict_is_the_summarys(gsm8k_run):
    from replaylab.apps.verdicts import verdict_line

    s, _, _, _ = gsm8k_run
    line = verdict_line(s)
    assert line.startswith(f"router: {s['verdict']} (objective incumbent")
    assert all(r in line for r in s["go_reasons"])
    # the headline is the served point's; cost_ratio_at_95 is named as the curve figure
    learned = s["test"]["learned"]
    assert f"served point on test: quality {learned['quality']:.3f}" in line
    assert f"curve figure cost_ratio_at_95 {learned['cost_ratio_at_95']:.3f}" in line
    assert "headline says otherwise" not in line


def test_exploration_is_bounded_and_session_scoped(gsm8k_run):
    s, _, _, _ = gsm8k_run
    e = s["exploration"]
    assert e["rate"] == 0.05 and e["cap"] == 0.10
    # explored share within 4 standard errors of the rate, never above the cap
    se = (0.05 * 0.95 / e["sessions"]) ** 0.5
    assert abs(e["explored_sessions"] / e["sessions"] - 0.05) < 4 * se
    assert s["labels"]["exploration"] == e["explored_sessions"]
    with pytest.raises(ConfigError, match="cap"):
        router_pipeline_config(exploration={"rate": 0.2})


def test_oracle_and_anchors_bound_every_policy(gsm8k_run):
    t = gsm8k_run[0]["test"]
    assert t["oracle"]["quality"] >= max(v["quality"] for v in t.values())
    assert t["cheap_only"]["cost"] <= min(v["cost"] for v in t.values())
    assert t["strong_only"]["strong_share"] == 1.0 and t["cheap_only"]["strong_share"] == 0.0
    # the random router is matched to the learned router's strong-call rate
    assert abs(t["random"]["strong_share"] - t["learned"]["strong_share"]) < 0.08


def test_prompt_text_never_leaves_the_embedding_step(gsm8k_run, outcomes):
    s, _, out, seen = gsm8k_run
    assert len(seen) == 1 and len(seen[0]) == 1319  # one call, every prompt once
    labels = pd.read_parquet(s["artifacts"]["labels"])
    texts = set(outcomes["prompt_text"])
    for col in labels.columns:
        assert "prompt_text" not in col and "response" not in col
        if labels[col].dtype == object:
            assert not set(labels[col].dropna().astype(str)) & texts, col
    assert "prompt_text" not in pd.read_parquet(s["artifacts"]["curves"]).columns


def test_the_rules_say_they_were_fitted(gsm8k_run):
    rules = gsm8k_run[0]["rules"]
    assert "fitted on the training split" in rules["note"]


def test_both_rules_variants_are_reported_with_their_curves(gsm8k_run):
    s = gsm8k_run[0]
    eq = s["rules_equal"]
    assert 0 < eq["prompts"] < eq["train_prompts"] == s["splits"]["train"]
    assert s["go_baseline"] == s["go_detail"]["baseline"] == "rules"
    assert set(pd.read_parquet(s["artifacts"]["curves"])["policy"]) >= {"rules", "rules_equal"}
    for pair in ("learned-rules", "learned-rules_equal"):
        g = s["test_gaps"][pair]
        assert g["ci"][0] <= g["mean"] <= g["ci"][1] or not np.isfinite(g["mean"])
    assert s["test_gaps"]["learned-rules"]["mean"] == pytest.approx(
        s["test"]["learned"]["cost_ratio_at_95"] - s["test"]["rules"]["cost_ratio_at_95"])


def _two_task_subset(outcomes: pd.DataFrame, n: int = 300) -> pd.DataFrame:
    ids = outcomes["prompt_id"].drop_duplicates().to_numpy()[:n]
    sub = outcomes[outcomes["prompt_id"].isin(ids)].copy()
    code = pd.factorize(sub["prompt_id"])[0]
    sub["task"] = np.where(code % 2 == 0, "even", "odd")
    return sub


def test_rules_equal_sees_only_the_learned_routers_label_budget(outcomes, tmp_path):
    """Changing the outcomes of never-replayed training prompts moves the full-information
    rules but not rules_equal; go.baseline picks which one the gate compares against."""
    from replaylab.router.replay import Label

    # random replays: the replayed set is then a seeded draw by prompt, the same in both runs
    # (a planned one is ranked by a head fitted on the logged outcomes this test changes)
    small = {"head": {"max_epochs": 3, "num_threads": 1}, "lgbm_estimators": 5,
             "go": {"n_boot": 100, "curve_fractions": [1.0]}, "evaluation": {"n_boot": 20},
             "replay": {"selection": "random"}}
    sub = _two_task_subset(outcomes)
    s0, _ = train_router(sub, router_pipeline_config(**small), tmp_path / "a", tfidf)
    labels = pd.read_parquet(s0["artifacts"]["labels"])
    replayed = set(labels.loc[labels[Label.LABEL_SOURCE] == "replay", Label.PROMPT_ID])
    ids = sub["prompt_id"].drop_duplicates().to_numpy()
    train = set(ids[seeded_split(len(ids), (0.6, 0.2, 0.2), 0) == "train"])
    assert s0["rules_equal"]["prompts"] == len(replayed) and replayed <= train
    # the strong model fails, the cheap one succeeds, on every never-replayed training prompt
    flip = sub["prompt_id"].isin(train - replayed)
    changed = sub.copy()
    changed.loc[flip, "score"] = (changed.loc[flip, "candidate"] == CHEAP).astype(float)
    changed.loc[flip, "success"] = changed.loc[flip, "score"] >= 0.5
    s1, _ = train_router(changed, router_pipeline_config(**small), tmp_path / "b", tfidf)
    assert s1["rules"]["task_candidate"] != s0["rules"]["task_candidate"]
    assert s1["rules"]["task_candidate"] == {"even": CHEAP, "odd": CHEAP}
    assert s1["rules_equal"]["task_candidate"] == s0["rules_equal"]["task_candidate"]
    assert s1["test"]["rules_equal"] == s0["test"]["rules_equal"]
    assert s1["test"]["rules"] != s0["test"]["rules"]
    # the gate compares against the configured baseline
    assert s1["go_detail"]["baseline"] == "rules"
    assert s1["go_detail"]["rules_cost"] == pytest.approx(s1["test"]["rules"]["cost"])
    s2, _ = train_router(changed, router_pipeline_config(**{**small, "go": {**small["go"], "baseline":
                                                           "rules_equal"}}),
                         tmp_path / "c", tfidf)
    assert s2["go_baseline"] == s2["go_detail"]["baseline"] == "rules_equal"
    assert s2["go_detail"]["rules_cost"] == pytest.approx(s2["test"]["rules_equal"]["cost"])
    assert s2["go_detail"]["rules_cost"] != pytest.approx(s1["go_detail"]["rules_cost"])
    assert all("rules_equal" in r for r in s2["go_reasons"])
    # another objective: the cheapest point at 95% of strong-only, judged on that floor
    s3, _ = train_router(changed, router_pipeline_config(**{**small, "objective": {
        "kind": "quality_floor", "fraction_of_strong": 0.9}}), tmp_path / "d", tfidf)
    assert s3["objective"]["kind"] == "quality_floor"
    assert s3["go_reasons"][0].startswith("objective quality_floor")
    assert s3["go_detail"]["criteria"][0]["name"] == "quality - 0.9 x strong-only"
    assert s3["go_detail"]["operating_point"].startswith("quality >= ")
    assert s3["go_detail"]["operating_point"].endswith("quality >= 0.9 x strong-only)")


def test_go_baseline_is_checked_and_needs_replayed_prompts(outcomes, tmp_path):
    with pytest.raises(ConfigError, match=r"baseline='rule_equal'.*one of"):
        router_pipeline_config(go={"baseline": "rule_equal"})
    sub = _two_task_subset(outcomes, 120)
    with pytest.raises(RouterDataError, match="rules_equal"):
        train_router(sub, router_pipeline_config(go={"baseline": "rules_equal"}, replay={"share": 0.0},
                               head={"max_epochs": 2, "num_threads": 1}), tmp_path, tfidf)


def test_equal_information_matrix_keeps_only_fully_observed_prompts():
    from replaylab.pipelines.router import equal_information_matrix
    from replaylab.router.inputs import TrainingRows
    from replaylab.router.replay import OutcomeMatrix

    n, k = 4, 2
    meta = pd.DataFrame({"prompt_id": list("abcd"), "task": ["t"] * n,
                         "prompt_length": [10.0] * n})
    m = OutcomeMatrix(("c", "s"), meta, np.zeros((n, k)), np.zeros((n, k), bool),
                      np.ones((n, k)), np.full((n, k), np.nan), np.full((n, k), np.nan))
    rows = TrainingRows(row=np.array([0, 0, 1, 2, 2]), action=np.array([0, 1, 1, 1, 0]),
                        reward=np.array([1.0, 0.0, 1.0, 0.5, 1.0]), weight=None,
                        cost=np.array([1.0, 9.0, 9.0, 9.0, 1.0]))
    eq = equal_information_matrix(rows, m)
    assert eq.prompt_ids.tolist() == ["a", "c"]
    np.testing.assert_array_equal(eq.score, [[1.0, 0.0], [1.0, 0.5]])  # the observed labels
    np.testing.assert_array_equal(eq.cost, [[1.0, 9.0], [1.0, 9.0]])


def test_splits_are_disjoint_and_seeded():
    a, b = seeded_split(1000, (0.6, 0.2, 0.2), 3), seeded_split(1000, (0.6, 0.2, 0.2), 3)
    assert (a == b).all() and {x: int((a == x).sum()) for x in set(a)} == {
        "train": 600, "calibration": 200, "test": 200}


def test_a_table_too_small_is_a_clear_error(outcomes, tmp_path):
    few = outcomes[outcomes["prompt_id"].isin(outcomes["prompt_id"].unique()[:20])]
    with pytest.raises(RouterDataError, match="need >= 50"):
        train_router(few, router_pipeline_config(), tmp_path, tfidf)


def test_simulated_receipts_validate_as_ledger(outcomes):
    from replaylab.router.replay import outcome_matrix
    from replaylab.router.rules import ScenarioRules

    cfg = router_pipeline_config()
    m = outcome_matrix(outcomes, cfg.cost, candidates=cfg.candidates)
    sim = simulate_receipts(m, ScenarioRules(cfg.rules).fit(m), cfg.exploration)
    assert validate_ledger(sim.ledger).rows_quarantined == 0
    firsts = sim.ledger.dropna(subset=["propensity"])
    assert set(np.round(firsts["propensity"], 6)) <= {0.95, 0.05, 1.0}


# ---------------------------------------------------------------- artifact and runtime (MiniLM)
@pytest.fixture(scope="module")
def encoder_dir(outcomes, tmp_path_factory):
    from replaylab.artifacts.encoder_export import export_encoder
    from replaylab.router.encoder import load_minilm

    texts = outcomes["prompt_text"].drop_duplicates().tolist()[:40]
    folder = tmp_path_factory.mktemp("enc") / "minilm"
    export_encoder(load_minilm(), folder, parity_texts=texts)  # int8 too: golden per variant
    return folder


@pytest.fixture(scope="module")
def minilm_run(outcomes, encoder_dir, tmp_path_factory):
    from replaylab.runtime.encoder import load_encoder

    ids = outcomes["prompt_id"].drop_duplicates().to_numpy()[:400]
    sub = outcomes[outcomes["prompt_id"].isin(ids)]
    enc = load_encoder(encoder_dir, threads=2)
    out = tmp_path_factory.mktemp("rrun")
    summary, run = train_router(sub, router_pipeline_config(), out, lambda t: enc.encode(t))
    art = export_router(run, encoder_dir, out / "artifacts" / "router")
    return sub, summary, run, art, enc


@pytest.mark.slow
def test_router_artifact_routes_as_training_decided(minilm_run):
    """Training's reported test decisions come from the graphs the runtime serves, so on one
    machine the runtime's probabilities and decisions are identical to them (bit for bit)."""
    from replaylab.router.replay import Label, outcome_matrix

    sub, summary, run, art, enc = minilm_run
    router = Router.load(art, threads=2)
    assert router.loaded, router.reason
    assert router.golden_status == "passed" and router.golden.ok
    assert router.candidates == (CHEAP, STRONG) and router.threshold == run.threshold
    assert router.rule == run.rule == "margin"
    shipped = json.loads((art / "router.json").read_text())["threshold"]
    assert shipped == summary["go_detail"]["threshold"]  # the gated operating point
    assert (art / "fit_prompts.json").is_file()
    reported = pd.read_parquet(summary["artifacts"]["test_decisions"])
    first = sub.drop_duplicates("prompt_id").set_index("prompt_id")
    m = outcome_matrix(sub, router_pipeline_config().cost, candidates=[CHEAP, STRONG])
    meta = m.meta.set_index(m.prompt_ids.astype(str))
    ids = reported["prompt_id"].tolist()
    texts = first.loc[ids, "prompt_text"].tolist()
    cats = meta.loc[ids, "task"].astype(str).tolist()
    tokens = meta.loc[ids, Label.PROMPT_LENGTH].tolist()
    got = router.route_batch(texts, cats, tokens)
    assert [d.candidate for d in got] == reported["candidate"].tolist()
    for c in router.candidates:  # the same float64 values, not merely close
        np.testing.assert_array_equal([d.scores[c] for d in got], reported[f"p_{c}"].to_numpy())
    one = router.route(texts[0], cats[0], tokens[0])
    assert one.candidate == got[0].candidate and not one.fallback and one.variant == "fp32"
    assert set(one.scores) == {CHEAP, STRONG} and one.version == router.version
    assert summary["head"]["decisions_from"].startswith("onnx head graph")
    assert 0.0 <= summary["decision_stability"]["fp32_near_threshold_share"] <= 1.0


@pytest.mark.slow
def test_router_golden_vectors_are_checked_where_it_is_served(minilm_run, tmp_path):
    """The router re-routes its golden queries at load: int8 that misses serves fp32, fp32
    that misses falls back with golden_mismatch; an artifact without them loads as before."""
    from tests.conftest import edit_golden

    _, _, run, art, _ = minilm_run
    golden = json.loads((art / "golden.json").read_text())
    assert golden["kind"] == "router" and len(golden["cases"]) >= 10
    published = sorted(golden["cases"][0]["expected"])
    assert "fp32" in published
    for variant in published:
        r = Router.load(art, variant=variant)
        assert r.loaded and r.variant == variant and r.golden_status == "passed", r.load_report()
        f = r.golden.figures
        assert f["stable_decision_agreement"] == 1.0 and f["n_stable"] >= 1
        print(f"router golden {variant}: {r.golden.seconds * 1e3:.1f} ms, {f}")

    def flip(doc):  # every decision flipped, P(success) moved well past the tolerance
        for c in doc["cases"]:
            e = c["expected"]["fp32"]
            e["success_prob"] = [min(1.0, p + 0.3) for p in e["success_prob"]]
            e["candidate"] = STRONG if e["candidate"] == CHEAP else CHEAP

    off = edit_golden(shutil.copytree(art, tmp_path / "off"), flip)
    r = Router.load(off, fallback_candidate=STRONG)
    assert not r.loaded and r.reason == "golden_mismatch"
    d = r.route("What is 2 + 2?")
    assert (d.candidate, d.fallback, d.reason) == (STRONG, True, "golden_mismatch")
    assert Router.load(off, check_golden=False).loaded  # the operator's explicit choice
    if "int8" in published:
        def spoil_int8(doc):
            for c in doc["cases"]:
                c["expected"]["int8"]["success_prob"] = [
                    1.0 - p for p in c["expected"]["int8"]["success_prob"]]

        i8 = edit_golden(shutil.copytree(art, tmp_path / "i8"), spoil_int8)
        r = Router.load(i8, variant="int8")
        assert r.loaded and (r.variant, r.requested_variant, r.variant_reason) == (
            "fp32", "int8", "golden_mismatch"), r.load_report()
        assert r.route("What is 2 + 2?").variant == "fp32"
    # an artifact whose encoder misses its own golden vectors on this CPU cannot serve
    enc_off = edit_golden(shutil.copytree(art, tmp_path / "enc"), lambda d: [
        c["expected"].update(fp32=[0.0] * len(c["expected"]["fp32"])) for c in d["cases"]],
        name="encoder/golden.json")
    assert Router.load(enc_off).reason == "golden_mismatch"


@pytest.mark.slow
def test_bad_router_artifacts_fall_back(minilm_run, tmp_path, caplog):
    import logging

    caplog.set_level(logging.DEBUG, logger="replaylab")
    _, _, _, art, _ = minilm_run
    missing = Router.load(tmp_path / "none", fallback_candidate=STRONG)
    d = missing.route("What is 2 + 2?")
    assert (d.candidate, d.fallback, d.reason) == (STRONG, True, "missing_artifact")
    bad = tmp_path / "bad"
    shutil.copytree(art, bad)
    data = bytearray((bad / "head.onnx").read_bytes())
    data[-10] ^= 0xFF
    (bad / "head.onnx").write_bytes(bytes(data))
    caplog.clear()
    r = Router.load(bad, fallback_candidate=STRONG)
    assert not r.loaded and r.reason == "hash_mismatch"
    warned = [x for x in caplog.records if x.levelno >= logging.WARNING]
    assert len(warned) == 1 and warned[0].name == "replaylab.runtime.router"
    assert "reason hash_mismatch" in warned[0].getMessage() and str(bad) in warned[0].getMessage()
    assert r.route("hello").candidate == STRONG
    with pytest.raises(ValueError, match="fallback_candidate"):
        Router.load(bad).route("hello")
    caplog.clear()
    good = Router.load(art)
    assert good.loaded and not [x for x in caplog.records if x.levelno >= logging.WARNING]
    d = good.route(None)  # the tokenizer refuses it: the artifact's rules answer
    assert d.fallback and d.decision.startswith("rules:") and d.reason == "model_error"


@pytest.mark.slow
def test_a_router_config_with_an_unknown_rule_falls_back(minilm_run, tmp_path):
    import hashlib
    import json

    from replaylab.contracts.manifest import content_hash, write_manifest

    _, _, _, art, _ = minilm_run
    for field, value in (("rule", "relative"), ("fallback_candidate", "gpt-5")):
        bad = tmp_path / field
        shutil.copytree(art, bad)
        cfg = json.loads((bad / "router.json").read_text())
        cfg[field] = value
        (bad / "router.json").write_text(json.dumps(cfg))
        m = json.loads((bad / "manifest.json").read_text())  # re-hashed: a verified manifest
        for entry in m["files"]:
            if entry["path"] == "router.json":
                entry["sha256"] = hashlib.sha256((bad / "router.json").read_bytes()).hexdigest()
                entry["size"] = (bad / "router.json").stat().st_size
        m["content_hash"] = content_hash(m)
        write_manifest(bad, m)
        r = Router.load(bad)
        assert not r.loaded and r.reason == "bad_config", field
        d = r.route("What is 2 + 2?")
        assert d.fallback and d.candidate == STRONG and d.reason == "bad_config"


_BLOCKER = """
import sys, importlib.abc
BLOCKED = {"torch", "transformers", "sentence_transformers", "lightgbm", "pandas", "sklearn",
           "mlflow", "scipy"}
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"blocked in this test: {name}")
sys.meta_path.insert(0, Block())
"""


@pytest.mark.slow
def test_router_runtime_without_the_training_stack(minilm_run):
    _, _, _, art, _ = minilm_run
    code = _BLOCKER + f"""
import json
from replaylab.runtime import Router
r = Router.load({str(art)!r})
d = r.route("Natalia sold clips to 48 of her friends in April. How many clips?", "gsm8k")
print(json.dumps([r.loaded, d.candidate, d.fallback]))
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    loaded, cand, fallback = json.loads(proc.stdout.strip().splitlines()[-1])
    assert loaded and not fallback and cand in (CHEAP, STRONG)


def test_meta_carries_task_and_length(outcomes):
    """The head's metadata is what the simulated ledger logged: the task as category, and
    the prompt's length (RouteLLM has no token counts: estimated from the text) as the
    opening call's prompt_tokens."""
    from replaylab.router.replay import Label, outcome_matrix

    cfg = router_pipeline_config()
    te, _, meta = split_test_prompts(outcomes, cfg)
    assert set(meta["category"]) == {"gsm8k"} and (meta["prompt_tokens"] > 0).all()
    m = outcome_matrix(outcomes, cfg.cost, candidates=[CHEAP, STRONG])
    length = pd.Series(m.meta[Label.PROMPT_LENGTH].to_numpy(float), index=m.prompt_ids)
    assert np.array_equal(meta["prompt_tokens"], length.reindex(te.prompt_ids).round().to_numpy())


def test_python_m_training_router_rejects_a_rate_above_the_cap(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "training", "pipeline=router", "tracking=off",
                           "router.exploration.rate=0.3", f"hydra.run.dir={tmp_path}"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith("error: ") and "cap" in proc.stderr


def test_compute_dask_runs_the_outcomes_mode_as_local(outcomes, dask_address, tmp_path):
    """The outcomes mode runs the receipts pipeline on the engine `compute` names: on the
    session's cluster the served head, its threshold, the verdict and every test figure
    equal the local run's, and the receipts summary says which engine ran."""
    from replaylab.compute import ComputeConfig, engine

    small = {"head": {"max_epochs": 3, "num_threads": 1}, "lgbm_estimators": 5,
             "go": {"n_boot": 100, "curve_fractions": [1.0]}, "evaluation": {"n_boot": 20},
             "replay": {"selection": "random"}}
    sub = _two_task_subset(outcomes)
    cfg = router_pipeline_config(**small)
    s_l, run_l = train_router(sub, cfg, tmp_path / "local", tfidf)
    with engine(ComputeConfig(kind="dask", address=dask_address)) as eng:
        s_d, run_d = train_router(sub, cfg, tmp_path / "dask", tfidf, engine=eng)
    assert run_d.threshold == run_l.threshold and run_d.fallback == run_l.fallback
    assert s_d["verdict"] == s_l["verdict"] and s_d["go_reasons"] == s_l["go_reasons"]
    assert s_d["test"].keys() == s_l["test"].keys()
    for name, fig in s_l["test"].items():
        for key in ("quality", "cost", "strong_share"):
            assert s_d["test"][name][key] == pytest.approx(fig[key], rel=1e-12), (name, key)
    assert s_d["receipts"]["splits"] == s_l["receipts"]["splits"]
    kinds = [json.loads((d / "receipts" / "summary.json").read_text())["compute"]["kind"]
             for d in (tmp_path / "local", tmp_path / "dask")]
    assert kinds == ["local", "dask"]


def test_the_gated_threshold_is_the_shipped_one(gsm8k_run):
    """One operating point: router.json serves the threshold the go/no-go judged, and the
    gate's learned test cost is the reported learned router's (the same decisions)."""
    from replaylab.artifacts.router_export import router_config_json

    s, run, _, _ = gsm8k_run
    d = s["go_detail"]
    assert router_config_json(run)["threshold"] == run.threshold == d["threshold"] == \
        s["served_threshold"] == s["test"]["learned"]["threshold"]["threshold"]
    assert d["learned_cost"] == pytest.approx(s["test"]["learned"]["cost"], rel=1e-12)
    assert f"served threshold {d['threshold']:.4g}" in d["served"]
    assert "gated at the same threshold" in d["served"]
    # one objective: the threshold was chosen for it on calibration, the gate judged it
    o = s["objective"]
    assert o["kind"] == "incumbent" and d["operating_point"].startswith("quality >= ")
    floor = d["rules_calibration_quality"] - o["margin"]
    assert d["learned_calibration_quality"] >= floor - 1e-12 or not d[
        "objective_met_on_calibration"]
    assert [c["name"] for c in d["criteria"]] == ["quality vs rules", "cost saving vs rules"]
    assert d["criteria"][0]["line"] == -o["margin"]
    h = s["headline"]
    assert h["quality"] == s["test"]["learned"]["quality"] and h["verdict"] == s["verdict"]
    assert "not a served point" in h["curve_figures"]["what"]
    assert not any("headline says otherwise" in r for r in s["go_reasons"])
    # the prompts it was fitted on, hashed, for a compare's leakage count
    assert set(run.fit_prompts) == {"train", "calibration"}
    assert len(run.fit_prompts["train"]) > len(run.fit_prompts["calibration"]) > 0
