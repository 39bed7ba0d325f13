"""Routing on the host's own embedding (`Router.route_embedding`) and a host encoder checked
on the MiniLM tier's golden (text, embedding, decision) triples (`check_host_encoder`,
`Router.load(..., host_encoder=)`), on the committed fixtures (scorers/rust/tests/fixtures:
`router-minilm`, a tiny BERT of all-MiniLM-L6-v2's shape, and the static `router`).
docs/specs/router-scorer.md, "Routing on the host's embedding".
"""

from __future__ import annotations

import logging

import numpy as np
import pytest

from replaylab.contracts.golden import GoldenError
from replaylab.runtime import Router
from tests.conftest import REPO

FIXTURES = REPO / "scorers" / "rust" / "tests" / "fixtures"


@pytest.fixture(scope="module")
def minilm() -> Router:
    r = Router.load(FIXTURES / "router-minilm")
    assert r.loaded and r.tier == "minilm" and r.golden_status == "passed", r.reason
    return r


def _prompts() -> list[str]:
    from replaylab.apps.inputs import default_outcomes
    from replaylab.artifacts.encoder_export import EDGE_CASE_TEXTS
    from replaylab.sources.routellm import import_routellm_gsm8k

    df = import_routellm_gsm8k(str(default_outcomes())).drop_duplicates("prompt_id")
    return df["prompt_text"].astype(str).tolist()[:60] + [t for t in EDGE_CASE_TEXTS if t]


def _drift(router: Router, eps: float, seed: int = 0):
    """The runtime's encoder plus seeded noise of scale `eps` per value, normalized again."""
    rng = np.random.default_rng(seed)

    def embed(text: str) -> np.ndarray:
        v = router.encoder.encode_one(text).astype(np.float64)
        v = v + rng.uniform(-eps, eps, v.shape)
        return (v / np.linalg.norm(v)).astype(np.float32)
    return embed


@pytest.mark.parametrize("tier", ["router-minilm", "router"])
def test_route_embedding_is_route_bit_for_bit_on_the_runtimes_own_embedding(tier, minilm):
    router = minilm if tier == "router-minilm" else Router.load(FIXTURES / tier)
    labels = [*router.head.vocabulary, None, "not a label"]
    for i, text in enumerate(_prompts()):
        category = labels[i % len(labels)]
        tokens = None if i % 3 == 0 else float(7 * i)
        d = router.route(text, category, tokens, keep_embedding=True)
        assert not d.fallback
        e = router.route_embedding(d.embedding, category, router.prompt_tokens(text, tokens))
        # the same floats (==, not approx), the same candidate, threshold and version
        assert (e.candidate, e.scores, e.threshold, e.version) == \
            (d.candidate, d.scores, d.threshold, d.version), text[:40]
        assert e.variant == "host" and not e.fallback


def test_unknown_prompt_tokens_are_the_training_mean(minilm):
    emb = minilm.encoder.encode_one("How many apples are left?")
    a = minilm.route_embedding(emb, None, None)
    # the head's missing value (NaN) is its training mean: the standardized feature is 0,
    # a different answer from any one token count, and finite
    assert all(0.0 < p < 1.0 for p in a.scores.values())
    assert a.scores != minilm.route_embedding(emb, None, 1.0).scores


def test_a_bad_embedding_raises_and_an_unloaded_router_falls_back(minilm):
    d = minilm.dimension
    with pytest.raises(ValueError, match="shape"):
        minilm.route_embedding(np.zeros(d - 1, np.float32))
    bad = np.full(d, 0.1, np.float32)
    bad[2] = np.nan
    with pytest.raises(ValueError, match="finite"):
        minilm.route_embedding(bad)
    with pytest.raises(ValueError, match="infinite"):
        minilm.route_embedding(np.full(d, 0.1, np.float32), None, float("inf"))
    gone = Router.load(None, fallback_candidate="strong")
    out = gone.route_embedding(np.zeros(d, np.float32))
    assert out.candidate == "strong" and out.fallback and out.reason == "missing_artifact"


def test_the_triples_hold_the_runtimes_embeddings_and_decisions(minilm):
    triples = minilm.golden_triples()
    assert len(triples) > 5
    for t in triples:
        q = t["input"]
        d = minilm.route(q["text"], q.get("category"), q.get("prompt_tokens"),
                         keep_embedding=True)
        np.testing.assert_array_equal(np.asarray(t["embedding"], np.float32), d.embedding)
        assert t["candidate"] == d.candidate
        assert t["success_prob"] == [d.scores[c] for c in minilm.candidates]
    # a static-tier router has none: its text is embedded here
    with pytest.raises(GoldenError, match="MiniLM"):
        Router.load(FIXTURES / "router").golden_triples()


def test_a_host_encoder_is_checked_on_the_triples(minilm):
    own = minilm.check_host_encoder(minilm.encoder.encode_one)
    assert own.ok, own.as_dict()
    assert own.figures["min_cosine"] > 0.999999 and own.figures["max_abs_diff"] == 0.0
    assert own.figures["decisions_equal"] == own.figures["n_cases"]
    # float rounding of another runtime passes; another encoder (cosine ~0.99 on 16 dims,
    # int8's distance from fp32 MiniLM) does not
    assert minilm.check_host_encoder(_drift(minilm, 1e-6)).ok
    far = minilm.check_host_encoder(_drift(minilm, 0.05))
    assert not far.ok
    assert far.figures["min_cosine"] < 0.999 and "min_cosine" in far.failed
    with pytest.raises(ValueError, match="host embeddings"):
        minilm.check_host_encoder(lambda t: np.zeros(minilm.dimension + 1, np.float32))


def test_a_drifting_host_encoder_is_told_at_load(minilm, caplog):
    path = FIXTURES / "router-minilm"
    good = Router.load(path, host_encoder=minilm.encoder.encode_one)
    assert good.loaded and good.host_encoder_check.ok
    with caplog.at_level(logging.WARNING, logger="replaylab.runtime.router"):
        bad = Router.load(path, host_encoder=_drift(minilm, 0.05), fallback_candidate="x")
    assert not bad.loaded and bad.reason == "encoder_drift"
    assert not bad.host_encoder_check.ok
    assert bad.route("anything").candidate == "x"
    text = " ".join(r.getMessage() for r in caplog.records)
    assert "does not reproduce" in text and "min cosine" in text and "encoder_drift" in text
    # a static artifact has no triples to check a host encoder on
    static = Router.load(FIXTURES / "router", host_encoder=minilm.encoder.encode_one)
    assert not static.loaded and static.reason == "golden_invalid"
