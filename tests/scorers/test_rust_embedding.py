"""The Rust CLI on the host's embedding (`replaylab-route route-embedding`, `verify-encoder`)
agrees with the Python runtime (`Router.route_embedding`, `check_host_encoder`) on the
MiniLM-tier fixture (scorers/rust/tests/fixtures/router-minilm). Skipped without cargo.
docs/specs/router-scorer.md, "Routing on the host's embedding".
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from replaylab.runtime import Router
from tests.helpers.rust import CRATE, build_binary, cargo_or_skip, run_bin

ART = CRATE / "tests" / "fixtures" / "router-minilm"


@pytest.fixture(scope="module")
def binary() -> Path:
    return build_binary(cargo_or_skip())


@pytest.fixture(scope="module")
def router() -> Router:
    r = Router.load(ART)
    assert r.loaded, r.reason
    return r


def _drifted(router: Router, eps: float, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = []
    for t in router.golden_triples():
        v = np.asarray(t["embedding"], np.float64) + rng.uniform(-eps, eps, router.dimension)
        out.append((v / np.linalg.norm(v)).astype(np.float32))
    return out


def test_route_embedding_is_the_python_runtimes(binary, router):
    rng = np.random.default_rng(5)
    labels = [*router.head.vocabulary, None]
    queries = []
    for i, t in enumerate(router.golden_triples()):
        for eps in (0.0, 0.02, 0.2):  # the stored embedding, near it, far from it
            v = np.asarray(t["embedding"], np.float64) + rng.uniform(-eps, eps, router.dimension)
            queries.append({"embedding": [float(x) for x in (v / np.linalg.norm(v)).astype(
                np.float32)], "category": labels[i % len(labels)],
                "prompt_tokens": None if i % 4 == 0 else float(3 * i + 1)})
    proc = run_bin(binary, "route-embedding", str(ART),
                   stdin="".join(json.dumps(q) + "\n" for q in queries))
    assert proc.returncode == 0, proc.stderr
    got = [json.loads(line) for line in proc.stdout.splitlines()]
    assert len(got) == len(queries)
    tol = 1e-4  # the artifact's fp32_prob_abs: Rust's float64 head vs head.onnx's float32
    for q, g in zip(queries, got, strict=True):
        py = router.route_embedding(np.asarray(q["embedding"], np.float32), q["category"],
                                    q["prompt_tokens"])
        want = [py.scores[c] for c in router.candidates]
        assert max(abs(a - b) for a, b in zip(g["success_prob"], want, strict=True)) <= tol
        assert g["token_ids"] == []
        q_margin = g["margin"]
        if q_margin is not None and q_margin > 2 * tol:  # a decision the tolerance cannot flip
            assert g["candidate"] == py.candidate


def test_verify_encoder_agrees_with_the_python_check(binary, router, tmp_path):
    proc = run_bin(binary, "verify-encoder", str(ART), "--texts")
    assert proc.returncode == 0, proc.stderr
    inputs = [json.loads(line) for line in proc.stdout.splitlines()]
    triples = router.golden_triples()
    assert inputs == [t["input"] for t in triples]
    texts = [t["input"]["text"] for t in triples]
    for eps, ok in ((0.0, True), (1e-6, True), (0.05, False)):
        host = _drifted(router, eps, seed=1)
        lines = "".join(json.dumps({"text": t, "embedding": [float(x) for x in v]}) + "\n"
                        for t, v in zip(texts, host, strict=True))
        proc = run_bin(binary, "verify-encoder", str(ART), stdin=lines)
        assert proc.returncode == (0 if ok else 1), proc.stderr
        rust = json.loads(proc.stdout)
        by_text = dict(zip(texts, host, strict=True))
        py = router.check_host_encoder(lambda text, by_text=by_text: by_text[text])
        assert rust["ok"] is ok and py.ok is ok
        assert math.isclose(rust["min_cosine"], py.figures["min_cosine"], abs_tol=1e-12)
        assert math.isclose(rust["max_abs_diff"], py.figures["max_abs_diff"], abs_tol=1e-12)
        for k in ("n_cases", "n_stable", "stable_decisions_equal", "worst_case"):
            assert rust[k] == py.figures[k], k
    # one golden text without an embedding: one error line, exit 2
    proc = run_bin(binary, "verify-encoder", str(ART), stdin=lines.split("\n", 1)[1])
    assert proc.returncode == 2 and proc.stderr.startswith("error: bad_input: no host embedding")


def test_routing_text_on_the_minilm_tier_is_one_error_line(binary):
    proc = run_bin(binary, "route", str(ART), stdin=json.dumps({"text": "hi"}) + "\n")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith("error: embedding_only: ") and proc.stderr.count("\n") == 1
    proc = run_bin(binary, "route-embedding", str(ART), stdin='{"embedding": [0.5]}\n')
    assert proc.returncode == 2 and proc.stderr.startswith("error: dimension: stdin line 1")
