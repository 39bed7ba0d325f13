"""The static tier tuned on the team's prompts (`replaylab.router.static_encoder`, issue 46
item 4): the ridge map recovers a linear relation and is chosen on calibration, the tuned
table is deterministic, test rows never enter it, the export serves the folded vectors
under a tuned encoder id, and (slow) the Rust crate routes a tuned-table router as the
numpy runtime does."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from replaylab.router.static_encoder import (
    RIDGE_GRID,
    fit_prompt_projection,
    tune_on_split,
)

DIM, TARGET_DIM = 16, 24


def _unit(a: np.ndarray) -> np.ndarray:
    return a / np.linalg.norm(a, axis=1, keepdims=True)


@pytest.fixture(scope="module")
def prompts() -> list[str]:
    from replaylab.apps.inputs import default_outcomes
    from replaylab.sources.routellm import import_routellm_gsm8k

    df = import_routellm_gsm8k(str(default_outcomes())).drop_duplicates("prompt_id")
    return df["prompt_text"].astype(str).tolist()[:300]


@pytest.fixture(scope="module")
def tiny_model(prompts):
    """A model2vec StaticModel over a ~350-token WordPiece vocabulary, seeded rows."""
    from model2vec import StaticModel
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

    words = Counter(w for p in prompts for w in re.findall(r"[a-z]+", p.lower()))
    chars = [chr(c) for c in range(0x21, 0x7F) if not chr(c).isupper()]
    vocab = ["[PAD]", "[UNK]", *chars, *("##" + c for c in chars if c.isalnum())]
    vocab += [w for w in sorted(words, key=lambda w: (-words[w], w))[:200] if w not in vocab]
    tok = Tokenizer(models.WordPiece({t: i for i, t in enumerate(vocab)}, unk_token="[UNK]",
                                     max_input_chars_per_word=100))
    tok.normalizer = normalizers.BertNormalizer(clean_text=False, handle_chinese_chars=False,
                                                strip_accents=False, lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    rows = np.random.default_rng(3).standard_normal((len(vocab), DIM)).astype(np.float32)
    return StaticModel(rows, tok, normalize=True, base_model_name="replaylab/tiny-static")


@pytest.fixture(scope="module")
def targets(tiny_model, prompts) -> np.ndarray:
    """A 'MiniLM' the tiny table can nearly reach: a fixed nonlinear function of its vector."""
    x = tiny_model.encode(prompts, normalize=True, use_multiprocessing=False)
    w = np.random.default_rng(5).standard_normal((DIM, TARGET_DIM))
    return _unit(np.tanh(x @ w) + 0.05 * np.random.default_rng(6).standard_normal(
        (len(prompts), TARGET_DIM)))


def _split(n: int) -> np.ndarray:
    return np.array(["train", "calibration", "test"])[np.arange(n) % 5 // 2]


def test_the_ridge_map_recovers_a_linear_relation_and_is_chosen_on_calibration():
    rng = np.random.default_rng(0)
    x = _unit(rng.standard_normal((500, DIM)))
    y = _unit(x @ rng.standard_normal((DIM, TARGET_DIM)))
    t = fit_prompt_projection(x[:350], y[:350], x[350:], y[350:])
    assert t.calibration_cosine[t.ridge] > 0.995
    assert t.calibration_cosine[t.ridge] == max(t.calibration_cosine.values())
    assert t.ridge <= 1.0  # nearly noiseless: little shrinkage wins
    assert set(t.calibration_cosine) == set(RIDGE_GRID) and t.projection.shape == (DIM, TARGET_DIM)
    # unrelated targets: no map reaches them (the statistic can fail)
    z = _unit(rng.standard_normal((500, TARGET_DIM)))
    u = fit_prompt_projection(x[:350], z[:350], x[350:], z[350:])
    assert u.calibration_cosine[u.ridge] < 0.3


def test_tuning_is_deterministic_and_test_rows_never_enter_the_table(tiny_model, prompts,
                                                                     targets):
    split = _split(len(prompts))
    a, ta = tune_on_split(tiny_model, prompts, targets, split)
    b, tb = tune_on_split(tiny_model, prompts, targets, split)
    assert ta.tag == tb.tag and np.array_equal(a.embedding, b.embedding)
    assert a.embedding.shape == (len(tiny_model.tokens), TARGET_DIM)
    # other test prompts and random test targets: the same table, byte for byte
    test = split == "test"
    other_texts = [("unrelated text about " + p[::-1]) if s else p
                   for p, s in zip(prompts, test, strict=True)]
    other_y = targets.copy()
    other_y[test] = _unit(np.random.default_rng(9).standard_normal((test.sum(), TARGET_DIM)))
    c, tc = tune_on_split(tiny_model, other_texts, other_y, split)
    assert tc.tag == ta.tag and np.array_equal(c.embedding, a.embedding)
    assert (ta.n_fit, ta.n_calibration) == ((split == "train").sum(),
                                            (split == "calibration").sum())
    # a changed training target does change it
    moved = targets.copy()
    moved[split == "train"] = np.roll(moved[split == "train"], 1, axis=0)
    _, td = tune_on_split(tiny_model, prompts, moved, split)
    assert td.tag != ta.tag


def test_tuned_vectors_are_closer_to_the_target_than_a_random_map(tiny_model, prompts,
                                                                  targets):
    split = _split(len(prompts))
    tuned, t = tune_on_split(tiny_model, prompts, targets, split)
    test = split == "test"
    v = tuned.encode([p for p, s in zip(prompts, test, strict=True) if s], normalize=True,
                     use_multiprocessing=False)
    cos = np.sum(_unit(v) * targets[test], axis=1).mean()
    x = tiny_model.encode(prompts, normalize=True, use_multiprocessing=False)[test]
    rand = np.sum(_unit(x @ np.random.default_rng(1).standard_normal((DIM, TARGET_DIM)))
                  * targets[test], axis=1).mean()
    assert cos > 0.9 and cos > rand + 0.3, (cos, rand)


def _export_tuned(tiny_model, prompts, targets, out: Path):
    from datetime import UTC, datetime

    from replaylab.artifacts.static_export import export_static_encoder
    from replaylab.contracts.golden import ANY_MACHINE

    split = _split(len(prompts))
    tuned, t = tune_on_split(tiny_model, prompts, targets, split)
    export_static_encoder(tuned, out, parity_texts=[p for p, s in zip(prompts, split,
                                                                      strict=True)
                                                    if s == "train"][:50],
                          model_id="replaylab/tiny-static", tuning=t, built_on=ANY_MACHINE,
                          created=datetime(2026, 1, 1, tzinfo=UTC), valid_days=36500.0)
    return tuned, t


def test_the_tuned_export_serves_the_folded_vectors(tiny_model, prompts, targets, tmp_path):
    from replaylab.runtime.static_encoder import load_static_encoder

    _, t = _export_tuned(tiny_model, prompts, targets, tmp_path / "enc")
    enc = load_static_encoder(tmp_path / "enc")
    assert enc.golden_status == "passed" and enc.dimension == TARGET_DIM
    assert enc.encoder_id == f"replaylab/tiny-static+model2vec-pca{DIM}-tuned{TARGET_DIM}-{t.tag}"
    # the served vector is normalize(x W): the map folded into the table changes nothing else
    x = tiny_model.encode(prompts, normalize=True, use_multiprocessing=False)
    want = _unit(np.where(np.abs(x).sum(axis=1, keepdims=True) > 0, x @ t.projection, 1.0))
    got = enc.encode(prompts).astype(np.float64)
    assert np.sum(want * got, axis=1).min() > 0.99999
    config = json.loads((tmp_path / "enc" / "static_config.json").read_text())
    assert config["distillation"]["tuning"]["ridge"] == t.ridge
    assert config["distillation"]["pca_dims"] == DIM and config["dimension"] == TARGET_DIM


def test_a_plain_export_reads_back_as_the_model_it_was(tiny_model, prompts, tmp_path):
    from datetime import UTC, datetime

    from replaylab.artifacts.static_export import export_static_encoder
    from replaylab.router.static_encoder import static_model_from_export

    export_static_encoder(tiny_model, tmp_path / "plain", parity_texts=prompts[:50],
                          model_id="replaylab/tiny-static",
                          created=datetime(2026, 1, 1, tzinfo=UTC))
    back = static_model_from_export(tmp_path / "plain")
    assert np.array_equal(back.embedding, tiny_model.embedding)
    assert back.tokenize(prompts) == tiny_model.tokenize(prompts)
    assert np.array_equal(back.encode(prompts, use_multiprocessing=False),
                          tiny_model.encode(prompts, use_multiprocessing=False))


def test_too_few_prompts_is_refused():
    x = np.ones((1, DIM))
    with pytest.raises(ValueError, match="needs >= 2 fit"):
        fit_prompt_projection(x, np.ones((1, TARGET_DIM)), x, np.ones((1, TARGET_DIM)))


@pytest.mark.slow
def test_rust_routes_a_tuned_table_router_as_numpy_does(tiny_model, prompts, targets,
                                                       tmp_path):
    from tests.helpers.rust import build_binary, cargo_or_skip, router_texts, run_bin

    cargo = cargo_or_skip()
    binary = build_binary(cargo)
    from replaylab.apps.inputs import default_outcomes
    from replaylab.artifacts.router_export import export_router
    from replaylab.pipelines.router import train_router
    from replaylab.router.pipeline_config import router_config
    from replaylab.runtime import Router
    from replaylab.runtime.static_encoder import load_static_encoder
    from replaylab.sources.routellm import import_routellm_gsm8k

    _export_tuned(tiny_model, prompts, targets, tmp_path / "enc")
    encoder = load_static_encoder(tmp_path / "enc")
    cheap, strong = "mistralai/Mixtral-8x7B-Instruct-v0.1", "gpt-4-1106-preview"
    cfg = router_config({"candidates": [cheap, strong],
                         "cost": {"call_cost_usd": {cheap: 0.00012, strong: 0.01235}},
                         "head": {"max_epochs": 5, "num_threads": 1, "hidden": [32, 16]},
                         "go": {"n_boot": 100}, "evaluation": {"n_boot": 20},
                         "lgbm_estimators": 10, "seed": 7})
    outcomes = import_routellm_gsm8k(str(default_outcomes()))
    _, run = train_router(outcomes, cfg, tmp_path / "run", encoder.encode, head_scorer="numpy")
    art = export_router(run, tmp_path / "enc", tmp_path / "router")
    proc = run_bin(binary, "golden", str(art))
    assert proc.returncode == 0 and json.loads(proc.stdout)["ok"], proc.stdout + proc.stderr
    router = Router.load(art)
    assert router.loaded and router.tier == "static", router.reason
    texts = router_texts()
    proc = run_bin(binary, "route", str(art),
                   stdin="".join(json.dumps({"text": t}) + "\n" for t in texts))
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = [json.loads(line) for line in proc.stdout.splitlines()]
    want = [router.route(t) for t in texts]
    assert [g["token_ids"] for g in got] == router.encoder.token_ids(texts)
    p_py = np.array([[w.scores[c] for c in router.candidates] for w in want])
    assert np.abs(p_py - np.array([g["success_prob"] for g in got])).max() <= 1e-5
    same = np.mean([g["candidate"] == w.candidate for g, w in zip(got, want, strict=True)])
    assert same > 0.99
