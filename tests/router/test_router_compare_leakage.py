"""The router compare counts leakage (issue 30): the challenger's test prompts that the
champion was fitted or calibrated on (its artifact's fit_prompts.json: hashes of the
prompt texts), scores both routers on all prompts and on the unseen ones, with paired
prompt-bootstrap intervals of challenger - champion, and the compare page warns.

No MLflow and no encoder: the routers' choices are drawn here; the matrix, texts and
split are the pipeline's (`test_prompts`) on the shipped GSM8K outcomes.
"""

from __future__ import annotations

import numpy as np

from replaylab.artifacts.rescore_router import compare_routers, score_choices, seen_mask
from replaylab.pipelines import router as router_pipeline
from replaylab.pipelines.router import prompt_hashes, seeded_split
from replaylab.router.inputs import prompt_hash
from replaylab.tracking.compare_report import write_compare_report
from tests.helpers.router import GSM8K, router_pipeline_config


def test_leakage_is_counted_and_the_unseen_prompts_scored_apart(tmp_path):
    from replaylab.sources.routellm import import_routellm_gsm8k

    outcomes = import_routellm_gsm8k(GSM8K)
    cfg = router_pipeline_config()
    matrix, texts, _ = router_pipeline.test_prompts(outcomes, cfg)
    n = len(texts)
    # a champion trained with another split seed: its train/calibration prompts
    other = router_pipeline_config(seed=3)
    from replaylab.router.replay import outcome_matrix

    m = outcome_matrix(outcomes, other.cost, candidates=other.candidates)
    split = seeded_split(m.n_prompts, other.split, other.seed)
    first = outcomes.drop_duplicates("prompt_id").set_index("prompt_id")["prompt_text"]
    fit = set(prompt_hashes(first.reindex(m.prompt_ids[split != "test"]).astype(str)))
    seen = seen_mask(texts, fit)
    assert 0 < seen.sum() < n  # another seed: most of these test prompts, not all
    assert seen.sum() == sum(prompt_hash(t) in fit for t in texts)
    rng = np.random.default_rng(0)
    k = len(matrix.candidates)
    routed = {r: ("margin", rng.integers(0, k, n), rng.random((n, k)))
              for r in ("challenger", "champion")}
    ev = cfg.evaluation
    out = compare_routers(matrix, texts, routed, fit, ev)
    ov = out["champion_fit_overlap"]
    assert ov["known"] and (ov["seen"], ov["unseen"], ov["prompts"]) == (
        int(seen.sum()), int((~seen).sum()), n)
    rows = np.arange(n)
    ca, cb = routed["challenger"][1], routed["champion"][1]
    for part, mask in (("all", np.ones(n, bool)), ("unseen", ~seen)):
        for key, x in (("quality", matrix.score), ("cost", matrix.cost)):
            d = out["delta"][part][key]
            want = float((x[rows, ca] - x[rows, cb])[mask].mean())
            assert abs(d["mean"] - want) < 1e-12
            assert d["ci"][0] <= d["mean"] <= d["ci"][1]
    unseen_q = out["scores_unseen"]["champion"]["policy"]["quality"]
    assert abs(unseen_q - float(matrix.score[rows, cb][~seen].mean())) < 1e-12
    # no record of the champion's prompts: leakage unknown, said so
    unknown = compare_routers(matrix, texts, routed, None, ev)
    assert not unknown["champion_fit_overlap"]["known"] and "scores_unseen" not in unknown

    # the compare page: the warning and both tables, the deltas with their intervals
    doc = {"kind": "router", "rows": n, "rows_source": "outcomes gsm8k",
           "champion": {"version": 1, "content_hash": "sha256:a"},
           "scores": {r: score_choices(rule, matrix, ch, pr, ev)
                      for r, (rule, ch, pr) in routed.items()},
           "champion_fit_overlap": ov, "scores_unseen": out["scores_unseen"],
           "comparison": {"delta": out["delta"], "champion_fit_overlap": ov}}
    side = {"tags": {"replaylab.kind": "router"}, "summary": {}}
    html = write_compare_report("r", {"version": 2, **side}, {"version": 1, **side}, tmp_path,
                                rescore=doc).read_text()
    assert f"Warning: {ov['seen']} of {n} test prompts" in html
    assert "Only the prompts the champion never saw" in html
    assert "paired 95% CI" in html
    d = out["delta"]["all"]["quality"]
    assert f"{d['mean']:.4g} <span class='ci'>[{d['ci'][0]:.4g}, {d['ci'][1]:.4g}]</span>" in html
