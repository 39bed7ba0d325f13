"""The router's MLP head: size, learning the cluster structure, IPS, calibration, ONNX.

Synthetic data with a known structure: embeddings in 8 clusters; the cheap
candidate succeeds on clusters 0-3, the middle one on 0-5, the strong one on
0-6, nobody on 7 (success probability 0.97 where it "succeeds", 0.03 elsewhere).
Training rows mix logged bandit rows (a logging policy 0.6 / 0.3 / 0.1, weight
1/propensity) with full-information replay rows for 20% of the prompts.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from sklearn.metrics import roc_auc_score

from replaylab.artifacts.router_head import KIND, export_head, head_to_onnx, onnx_inputs, parity
from replaylab.config import ConfigError, from_mapping
from replaylab.contracts.manifest import verify_manifest
from replaylab.router.head import (
    HeadConfig,
    SuccessHead,
    grouped_validation_mask,
    parameter_count,
)
from replaylab.router.inputs import TrainingRows, ips_weights
from tests.helpers.router import CALIB, TEST, TRAIN, K, clustered, confounded, logged_rows

torch.set_num_threads(1)


def subset(meta: dict, idx: np.ndarray) -> dict:
    return {k: v[idx] for k, v in meta.items()}


@pytest.fixture(scope="module")
def data() -> dict:
    return clustered()


@pytest.fixture(scope="module")
def head(data: dict) -> SuccessHead:
    return SuccessHead(seed=0).fit(data["emb"], data["meta"], logged_rows(data, TRAIN), K)


def test_parameter_count_is_in_the_issue_range() -> None:
    for k in range(2, 10):
        for vocab in (1, 60):
            assert 100_000 <= parameter_count(384, k, vocab) <= 250_000, (k, vocab)
    assert parameter_count(384, 2, 1) == 136_362  # hidden (256, 128), category_dim 16, wide 6


def test_head_learns_the_cluster_structure(data: dict, head: SuccessHead) -> None:
    prob = head.predict_proba(data["emb"][TEST], subset(data["meta"], TEST))
    assert prob.shape == (len(TEST), K) and ((prob >= 0) & (prob <= 1)).all()
    auc = [roc_auc_score(data["score"][TEST, k], prob[:, k]) for k in range(K)]
    assert min(auc) > 0.9, auc
    assert head.n_parameters_ == parameter_count(32, K, 3)
    rep = head.report()
    assert rep["has_cost"] and rep["categories"] == 3 and rep["epochs"] >= rep["best_epoch"] + 1


def test_cost_head_predicts_the_cost_scale(data: dict, head: SuccessHead) -> None:
    cost = head.predict_cost(data["emb"][TEST], subset(data["meta"], TEST))
    assert (cost > 0).all()
    r = np.corrcoef(np.log(cost.ravel()), np.log(data["cost"][TEST].ravel()))[0, 1]
    assert r > 0.9
    # the cost ordering of the candidates is learned
    assert (np.median(cost, axis=0) == np.sort(np.median(cost, axis=0))).all()


def test_ips_weighting_corrects_a_biased_logging_policy() -> None:
    emb, score, act, prop = confounded()
    rows = np.arange(len(act))
    mean = {}
    for name, w in (("plain", None), ("ips", ips_weights(prop))):
        head = SuccessHead(seed=0).fit(emb, None, TrainingRows(rows, act, score[rows, act], w), 2)
        mean[name] = head.predict_proba(emb)[:, 0].mean()
    truth = score[:, 0].mean()  # ~0.5
    assert mean["plain"] > truth + 0.25  # sees mostly the easy half: ~0.85
    assert abs(mean["ips"] - truth) < 0.12
    assert abs(mean["ips"] - truth) < abs(mean["plain"] - truth) / 2


def test_fit_is_deterministic_and_leaves_global_state(data: dict) -> None:
    cfg = HeadConfig(max_epochs=3, hidden=(32, 16))
    rows = logged_rows(data, TRAIN[:400])
    torch.manual_seed(123)
    rng_before, threads_before = torch.get_rng_state(), torch.get_num_threads()
    a = SuccessHead(cfg, seed=7).fit(data["emb"], data["meta"], rows, K)
    assert torch.equal(torch.get_rng_state(), rng_before)
    assert torch.get_num_threads() == threads_before
    b = SuccessHead(cfg, seed=7).fit(data["emb"], data["meta"], rows, K)
    c = SuccessHead(cfg, seed=8).fit(data["emb"], data["meta"], rows, K)
    sa, sb, sc = (h.net_.state_dict() for h in (a, b, c))
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not all(torch.equal(sa[k], sc[k]) for k in sa)
    assert a.history_ == b.history_


def test_validation_slice_is_grouped_by_prompt() -> None:
    row = np.repeat(np.arange(100), 3)
    val = grouped_validation_mask(row, 0.2, seed=0)
    assert set(row[val]).isdisjoint(row[~val]) and len(set(row[val])) == 20


def test_unseen_rare_and_missing_categories_share_the_other_slot(data: dict,
                                                                 head: SuccessHead) -> None:
    e = data["emb"][TEST[:50]]
    tok = data["meta"]["prompt_tokens"][TEST[:50]]
    base = head.predict_proba(e, {"category": np.full(50, None, object), "prompt_tokens": tok})
    for other in ("never-seen", float("nan")):
        got = head.predict_proba(e, {"category": np.full(50, other, object), "prompt_tokens": tok})
        np.testing.assert_array_equal(got, base)
    np.testing.assert_array_equal(head.predict_proba(e, {"prompt_tokens": tok}), base)
    # a category seen fewer than min_category_count times is not in the vocabulary
    meta = {"category": np.r_[np.full(299, "big", object), ["rare"]], "prompt_tokens": np.ones(300)}
    rows = TrainingRows(np.arange(300), np.zeros(300, np.int64), np.ones(300))
    small = SuccessHead(HeadConfig(max_epochs=1, hidden=(8,)), seed=0).fit(
        data["emb"][:300], meta, rows, 2)
    assert small.encoder_.vocabulary_ == ("big",)


@pytest.mark.parametrize("method", ["platt", "isotonic"])
def test_calibration_matches_the_observed_rate(data: dict, head: SuccessHead,
                                               method: str) -> None:
    calib = logged_rows(data, CALIB, replay_share=1.0, seed=5)
    h = copy.deepcopy(head).calibrate(data["emb"], data["meta"], calib, method=method)
    p = h.predict_proba(data["emb"], data["meta"])[calib.row, calib.action]
    for k in range(K):  # weighted mean prediction = weighted mean reward, per candidate
        m = calib.action == k
        assert abs(np.average(p[m], weights=calib.weight[m])
                   - np.average(calib.reward[m], weights=calib.weight[m])) < 0.01
    test = TEST
    prob = h.predict_proba(data["emb"][test], subset(data["meta"], test))
    assert min(roc_auc_score(data["score"][test, k], prob[:, k]) for k in range(K)) > 0.88
    assert h.calibration_["method"] == method and h.calibration_["identity"] == []
    if method == "isotonic":
        with pytest.raises(ValueError, match="isotonic"):
            head_to_onnx(h)


def test_onnx_export_matches_torch(data: dict, head: SuccessHead, tmp_path) -> None:
    h = copy.deepcopy(head).calibrate(
        data["emb"], data["meta"], logged_rows(data, CALIB, replay_share=1.0, seed=5))
    model = head_to_onnx(h)
    meta = subset(data["meta"], TEST)
    figures = parity(h, model, data["emb"][TEST], meta)
    assert figures["success_prob_max_abs"] <= 1e-5 and figures["cost_max_rel"] <= 1e-5
    # unknown categories and missing / negative token counts go through the same graph
    odd = {"category": np.r_[["zzz", None], meta["category"][2:]].astype(object),
           "prompt_tokens": np.r_[np.nan, -5.0, meta["prompt_tokens"][2:]]}
    parity(h, model, data["emb"][TEST], odd)
    import onnxruntime as ort

    sess = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    assert [i.name for i in sess.get_inputs()] == ["embedding", "category", "prompt_tokens"]
    assert [o.name for o in sess.get_outputs()] == ["success_prob", "cost"]
    feed = onnx_inputs(h, data["emb"][TEST[:3]], subset(data["meta"], TEST[:3]))
    feed["category"] = np.array([-1, 999, len(h.encoder_.vocabulary_)], np.int64)  # all `other`
    other = h.predict_proba(data["emb"][TEST[:3]], {"prompt_tokens": feed["prompt_tokens"]})
    np.testing.assert_allclose(sess.run(None, feed)[0], other, atol=1e-5)

    manifest = export_head(h, tmp_path / "head", version="0.1.0", candidates=["c", "m", "s"],
                           embedding_model="synthetic", parity_embedding=data["emb"][TEST],
                           parity_meta=meta, threshold=0.6)
    assert verify_manifest(tmp_path / "head", required_kind=KIND)["content_hash"] == \
        manifest["content_hash"]
    assert manifest["outputs"]["candidates"] == ["c", "m", "s"]
    assert manifest["features"][1]["vocabulary"] == list(h.encoder_.vocabulary_)
    assert manifest["calibration"]["method"] == "platt"
    assert (tmp_path / "head" / "model.onnx").read_bytes() == model
    with pytest.raises(FileExistsError):
        export_head(h, tmp_path / "head", version="0.1.0", candidates=["c", "m", "s"],
                    embedding_model="synthetic", parity_embedding=data["emb"][TEST])


def test_served_copy_predicts_with_the_runtime_scorer_and_pickles(data: dict,
                                                                   head: SuccessHead) -> None:
    import pickle

    from replaylab.artifacts.router_head import served_head

    h = copy.deepcopy(head).calibrate(
        data["emb"], data["meta"], logged_rows(data, CALIB, replay_share=1.0, seed=5))
    emb, meta = data["emb"][TEST], subset(data["meta"], TEST)
    meta["category"] = meta["category"].astype(object)
    meta["category"][:3] = [np.nan, None, "zzz"]  # missing and unseen: the `other` slot
    for kind in ("onnx", "numpy"):
        served = served_head(h, scorer=kind, parity_embedding=emb[:20],
                             parity_meta=subset(meta, np.arange(20)))
        assert served is not h and not hasattr(h, "served_") and served.served_.kind == kind
        got = served.predict_proba(emb, meta)
        want = served.served_.proba(emb, [None, None, "zzz", *meta["category"][3:]],
                                    meta["prompt_tokens"])
        np.testing.assert_array_equal(got, want)  # the runtime scorer decides, bit for bit
        assert np.abs(got - h.predict_proba(emb, meta)).max() <= 1e-5  # torch agrees
        report = served.report()
        assert kind in report["decisions_from"] and report["onnx_parity"]["n"] == 20
        assert "decisions_from" not in h.report()  # the fitted head is left as it was
        back = pickle.loads(pickle.dumps(served.served_))  # a Dask worker's copy
        assert back.kind == kind and back.digest() == served.served_.digest()
        np.testing.assert_array_equal(back.predict_proba(emb, meta), got)
        assert pickle.loads(pickle.dumps(served.served_)) is back  # built once per process


def test_config_and_rows_are_validated() -> None:
    with pytest.raises(ValueError, match="HeadConfig.hidden"):
        HeadConfig(hidden=())
    with pytest.raises(ValueError, match="HeadConfig.calibration"):
        HeadConfig(calibration="temperature")
    with pytest.raises(ConfigError, match="unknown field"):
        from_mapping(HeadConfig, {"hiden": [8]}, "router.head")
    assert from_mapping(HeadConfig, {"hidden": [64, 32]}, "router.head").hidden == (64, 32)
    with pytest.raises(ValueError, match="reward"):
        TrainingRows([0, 1], [0, 1], [0.5, 1.5])
    with pytest.raises(ValueError, match="weight"):
        TrainingRows([0, 1], [0, 1], [0.5, 1.0], [1.0, 0.0])
    np.testing.assert_allclose(ips_weights([0.5, np.nan, 0.01], max_weight=20), [2.0, 1.0, 20.0])
    with pytest.raises(ValueError, match="propensities"):
        ips_weights([0.0])
    with pytest.raises(RuntimeError, match="not fitted"):
        SuccessHead().predict_proba(np.zeros((1, 4), np.float32))


def test_wide_part_starts_at_the_shrunk_category_success() -> None:
    from replaylab.router.head import category_logits

    # 2 categories (codes 0, 1) + `other` (2); candidate 0 seen 4x in cat 0 (3 wins), 1x in cat 1
    codes = np.array([0, 0, 0, 0, 1])
    rows = TrainingRows(row=np.array([0, 1, 2, 3, 4, 0]), action=np.array([0, 0, 0, 0, 0, 1]),
                        reward=np.array([1.0, 1.0, 1.0, 0.0, 0.0, 1.0]),
                        weight=np.array([1.0, 1.0, 1.0, 1.0, 1.0, 1.0]))
    got = 1.0 / (1.0 + np.exp(-category_logits(codes, rows, 2, 2, strength=2.0)))
    overall0 = 3 / 5
    np.testing.assert_allclose(got[0, 0], (4 * 0.75 + 2 * overall0) / 6)
    np.testing.assert_allclose(got[1, 0], (1 * 0.0 + 2 * overall0) / 3)
    np.testing.assert_allclose(got[2, 0], overall0)  # `other`: the overall success
    np.testing.assert_allclose(got[1, 1], 1 - 1e-3)  # unseen cell: overall (1.0, clipped)
    # with the wide part on, an untrained head already predicts the category table
    data = clustered()
    cfg = HeadConfig(max_epochs=1, patience=1, wide=True)
    h = SuccessHead(cfg, seed=0).fit(data["emb"], data["meta"], logged_rows(data, TRAIN), K)
    assert h.net_.wide_category.weight.abs().sum() > 0
    assert HeadConfig(wide=False).wide is False
    with pytest.raises(ValueError, match="prior_strength"):
        HeadConfig(prior_strength=-1.0)


def graded(n: int, seed: int) -> dict:
    """Candidate 0 succeeds with a smooth p(x) = sigmoid(2 x_0), candidate 1 with 0.8; one
    logged action per prompt at random (few labels per prompt: one head's noise shows)."""
    rng = np.random.default_rng(seed)
    emb = rng.normal(size=(n, 16)).astype(np.float32)
    p = np.c_[1.0 / (1.0 + np.exp(-2.0 * emb[:, 0])), np.full(n, 0.8)]
    meta = {"category": rng.choice(["a", "b", "c"], n).astype(object),
            "prompt_tokens": rng.integers(5, 200, n).astype(float)}
    act = rng.integers(0, 2, n)
    rows = TrainingRows(np.arange(n), act, (rng.random(n) < p[np.arange(n), act]).astype(float),
                        np.ones(n), rng.lognormal(-8, 0.1, n))
    return {"emb": emb, "meta": meta, "p": p, "rows": rows}


def test_distilled_head_is_closer_to_the_truth_than_one_head() -> None:
    from replaylab.router.head import member_seed

    train, held = graded(600, 0), graded(600, 1)
    cfg = HeadConfig(hidden=(32, 16))
    err = {1: [], 5: []}
    for seed in (0, 1, 2):
        for m in err:
            h = SuccessHead(HeadConfig(hidden=(32, 16), teachers=m), seed=seed).fit(
                train["emb"], train["meta"], train["rows"], 2)
            prob = h.predict_proba(held["emb"], held["meta"])
            err[m].append(float(np.mean((prob[:, 0] - held["p"][:, 0]) ** 2)))
    # held-out Brier distance to the true success curve: the student of 5 beats one head
    assert np.mean(err[5]) < 0.85 * np.mean(err[1]), err
    one = SuccessHead(cfg, seed=3).fit(train["emb"], train["meta"], train["rows"], 2)
    five = SuccessHead(HeadConfig(hidden=(32, 16), teachers=5), seed=3).fit(
        train["emb"], train["meta"], train["rows"], 2)
    rep = five.report()
    assert [t["seed"] for t in rep["teachers"]] == [member_seed(3, j) for j in range(5)]
    assert rep["teachers"][0]["seed"] == 3 and len({t["seed"] for t in rep["teachers"]}) == 5
    # teacher 0 is the single head (same seed, same rows): its fit is the one above
    assert rep["teachers"][0]["best_val_loss"] == pytest.approx(one.report()["best_val_loss"])
    assert rep["rows_per_candidate"] == one.report()["rows_per_candidate"]  # the observed rows
    assert five.has_cost_ and np.isfinite(five.predict_cost(held["emb"], held["meta"])).all()
    assert one.report()["teachers"] is None
    model = head_to_onnx(five)  # one head of the usual shape: the same export
    assert parity(five, model, held["emb"], held["meta"])["success_prob_max_abs"] <= 1e-5
    with pytest.raises(ValueError, match="teachers"):
        HeadConfig(teachers=0)
