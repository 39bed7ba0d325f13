"""The static router tier: charmap tokenizer == HF tokenizers, safetensors, the numpy HeadScorer == the
spec's forward pass and the ONNX head, choose_one == choose_by_threshold, and (slow) the
model2vec export and `pipeline=router router.encoder.tier=static` served by `Router`."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from replaylab.artifacts.encoder_export import EDGE_CASE_TEXTS
from replaylab.router.charmap import HEADER, charmap_tsv, check_bert_pipeline
from replaylab.router.encoder import minilm_path
from replaylab.runtime.encoder import EncoderArtifactError
from replaylab.runtime.routing import choose_by_threshold, choose_one
from replaylab.runtime.static_encoder import CharmapTokenizer, read_safetensors
from tests.helpers.entrypoints import train
from tests.helpers.router import ONE_HEAD

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def hf_tokenizer():
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(minilm_path() / "tokenizer.json"))
    tok.no_truncation()
    tok.no_padding()
    return tok


@pytest.fixture(scope="module")
def charmap(hf_tokenizer) -> str:
    return charmap_tsv(hf_tokenizer)


@pytest.fixture(scope="module")
def table_tokenizer(hf_tokenizer, charmap) -> CharmapTokenizer:
    vocab = [t for t, _ in sorted(hf_tokenizer.get_vocab().items(), key=lambda kv: kv[1])]
    return CharmapTokenizer(charmap, vocab, unk_token="[UNK]", drop_unk=False)


@pytest.fixture(scope="module")
def prompts() -> list[str]:
    from replaylab.apps.inputs import default_outcomes
    from replaylab.sources.routellm import import_routellm_gsm8k

    df = import_routellm_gsm8k(str(default_outcomes()))
    return df.drop_duplicates("prompt_id")["prompt_text"].astype(str).tolist()[:400]


def _random_texts(n: int, seed: int) -> list[str]:
    """Mixed scripts, marks, controls, symbols and spaces: the table's hard cases."""
    rng = np.random.default_rng(seed)
    pools = [range(0x20, 0x7F), range(0xA0, 0x250), range(0x300, 0x370), range(0x370, 0x3FF),
             range(0x400, 0x4FF), range(0x590, 0x6FF), range(0x2000, 0x206F),
             range(0x3040, 0x30FF), range(0x4E00, 0x4F00), range(0xAC00, 0xAD00),
             range(0x1F300, 0x1F64F), range(0x0, 0x20), range(0xFE00, 0xFFFF)]
    out = []
    for _ in range(n):
        chars = []
        for _ in range(int(rng.integers(1, 60))):
            pool = pools[int(rng.integers(len(pools)))]
            chars.append(chr(int(rng.integers(pool.start, pool.stop))))
            if rng.random() < 0.2:
                chars.append(" ")
        out.append("".join(chars))
    return out


def test_charmap_rows_say_what_the_normalizer_does(charmap):
    lines = charmap.split("\n")
    assert lines[0] == HEADER and lines[-1] == ""
    rows = {int(c, 16): (k, r) for c, k, r in (ln.split("\t") for ln in lines[1:-1])}
    assert rows[ord("A")] == ("o", "61")                     # lowercase
    assert rows[ord(" ")][0] == "w" and rows[ord("\t")] == ("w", "20")
    assert rows[ord("!")] == ("p", "21") and rows[ord("$")][0] == "p"
    assert rows[ord("é")] == ("o", "65")                     # accent stripped
    assert rows[ord("中")] == ("o", "20 4E2D 20")            # CJK padded with spaces
    assert rows[0] == ("o", "") and rows[0x200B][1] == ""  # NUL, zero-width space dropped
    assert ord("a") not in rows and ord("7") not in rows    # identity rows are left out
    assert 200_000 < len(rows) < 300_000


def test_table_tokenizer_equals_hf_tokenizers(table_tokenizer, hf_tokenizer, prompts):
    texts = prompts + list(EDGE_CASE_TEXTS) + _random_texts(400, seed=0) + [
        "naïve café, ÉCOLE d'été; Straße", "x" * 101, "a" * 100, "don't stop-me now!!",
        "tab\tnew\nline\r\nnbsp\u00a0thin\u2009ideographic\u3000", "\u2028line\u2029para"]
    want = [e.ids for e in hf_tokenizer.encode_batch(texts, add_special_tokens=False)]
    got = [table_tokenizer.ids(t) for t in texts]
    bad = [t for t, a, b in zip(texts, want, got, strict=True) if a != b]
    assert not bad, f"{len(bad)} texts differ, first {bad[0][:60]!r}"
    again = [table_tokenizer.ids(t) for t in texts]  # second pass: from the chunk cache
    assert again == got


def test_truncation_then_unk_dropped(hf_tokenizer, charmap):
    """model2vec's order: cut the characters, tokenize, keep max_tokens ids, drop [UNK]."""
    vocab = [t for t, _ in sorted(hf_tokenizer.get_vocab().items(), key=lambda kv: kv[1])]
    unk = vocab.index("[UNK]")
    tok = CharmapTokenizer(charmap, vocab, unk_token="[UNK]", max_chars=40, max_tokens=5)
    text = "x" * 150 + " hello world"
    want = hf_tokenizer.encode("x" * 40, add_special_tokens=False).ids[:5]
    assert tok.ids(text) == want and len(want) == 5
    keep = CharmapTokenizer(charmap, vocab, unk_token="[UNK]", drop_unk=False, max_tokens=3)
    ids = keep.ids("z" * 101 + " a b c d")
    assert ids[0] == unk and len(ids) == 3  # truncation counts the [UNK] ...
    drop = CharmapTokenizer(charmap, vocab, unk_token="[UNK]", max_tokens=3)
    assert drop.ids("z" * 101 + " a b c d") == [vocab.index("a"), vocab.index("b")]  # ... then drops it
    with pytest.raises(UnicodeEncodeError):
        tok.ids("lone \ud800 surrogate")


def test_chunk_and_word_caches_change_no_id(hf_tokenizer, charmap, prompts, monkeypatch):
    """Cached ids == first-time ids == HF's, on texts whose chunks repeat across texts, with the
    caches bounded to a few entries (cleared while a text is tokenized) or unbounded."""
    import replaylab.runtime.static_encoder as se

    vocab = [t for t, _ in sorted(hf_tokenizer.get_vocab().items(), key=lambda kv: kv[1])]
    texts = prompts[:150] + list(EDGE_CASE_TEXTS) + _random_texts(300, seed=4)
    texts += [" ".join(t.split()[::-1]) for t in texts[:100]]  # the same chunks, other texts
    want = [e.ids for e in hf_tokenizer.encode_batch(texts, add_special_tokens=False)]
    for limit in (None, 7):
        if limit is not None:
            monkeypatch.setattr(se, "WORD_CACHE", limit)
            monkeypatch.setattr(se, "WORDPIECE_CACHE", limit)
        tok = CharmapTokenizer(charmap, vocab, unk_token="[UNK]", drop_unk=False)
        for _ in range(2):  # first pass mostly misses, second mostly hits
            assert [tok.ids(t) for t in texts] == want
            sizes = tok.cache_sizes()
            if limit is None:
                assert sizes["chunks"] > 1000 and sizes["words"] > 1000
            else:
                assert 0 < sizes["chunks"] <= limit and 0 < sizes["words"] <= limit


def test_split_fast_path_is_the_ascii_whitespace_split(table_tokenizer):
    """Without tab/newline/CR the text is split on " " alone (empty chunks for runs of
    spaces): the same ids as the regex over all four ASCII whitespace characters."""
    rng = np.random.default_rng(5)
    for text in _random_texts(200, seed=6):
        spaced = "".join(c if rng.random() > 0.3 else "  " for c in text).replace("\t", " ")
        spaced = spaced.replace("\n", " ").replace("\r", " ")
        mixed = "".join(" \t\n\r"[int(rng.integers(4))] if c == " " else c for c in spaced)
        assert table_tokenizer.ids(spaced) == table_tokenizer.ids(mixed)
        assert table_tokenizer.ids(" " + spaced + "  ") == table_tokenizer.ids(spaced)


def test_ascii_fast_path_is_the_table_path(hf_tokenizer, charmap):
    """A printable-ASCII chunk is normalized by str.lower (and an alphanumeric one is one
    word) only because the table says so: the same ids as the table path, which serves a
    table where it does not hold (here one that maps "q" to "k")."""
    vocab = [t for t, _ in sorted(hf_tokenizer.get_vocab().items(), key=lambda kv: kv[1])]
    fast = CharmapTokenizer(charmap, vocab, unk_token="[UNK]", drop_unk=False)
    slow = CharmapTokenizer(charmap, vocab, unk_token="[UNK]", drop_unk=False)
    assert fast.ascii_lower
    slow.ascii_lower = False
    rng = np.random.default_rng(8)
    texts = ["".join(chr(int(c)) for c in rng.integers(0x20, 0x7F, int(rng.integers(1, 40))))
             for _ in range(400)] + ["Q42 quiz", "ABC123,DEF", "x\x0by", "Hello\x7fWorld"]
    want = [e.ids for e in hf_tokenizer.encode_batch(texts, add_special_tokens=False)]
    assert [fast.ids(t) for t in texts] == [slow.ids(t) for t in texts] == want
    odd = CharmapTokenizer(charmap + "71\to\t6B\n", vocab, unk_token="[UNK]", drop_unk=False)
    assert not odd.ascii_lower and odd.ids("quiz") == slow.ids("kuiz")


def test_unk_filter_survives_a_misaligned_byte_match():
    """The [UNK] test searches the id bytes: a match across two ids must drop nothing."""
    vocab = [f"t{i}" for i in range(300)]
    vocab[1] = "[UNK]"
    tok = CharmapTokenizer("# replaylab charmap 1\n20\tw\t20\n", vocab, unk_token="[UNK]")
    # 256 = bytes 00 01 00 ..: with a next id whose low byte is 0, offset 1 reads 01 00 .. 00
    pair, unk = (np.array(v, dtype=np.intp).tobytes() for v in ([256, 256], [1]))
    assert pair.find(unk) == 1
    assert tok.ids("t256 t256") == [256, 256]
    assert tok.ids("t256 zzz t256 t7") == [256, 256, 7]   # a real [UNK] is dropped
    assert tok.ids_array("zzz").dtype == np.intp and tok.ids("zzz") == []
    keep = CharmapTokenizer("# replaylab charmap 1\n20\tw\t20\n", vocab, unk_token="[UNK]",
                            drop_unk=False, max_tokens=2)
    assert keep.ids("zzz t5 t6") == [1, 5]


def test_pool_is_the_specs_sequential_float64_sum():
    """Step 6 of the spec: rows added in token order, column by column, in float64 (what
    another language's loop gives), then s / sqrt(s . s) rounded to float32."""
    from replaylab.runtime.static_encoder import StaticSentenceEncoder

    rng = np.random.default_rng(7)
    table = rng.normal(size=(500, 32)).astype(np.float32)
    table[3] *= 1e6  # magnitudes far apart: a reordered sum would round differently
    enc = StaticSentenceEncoder(None, table, {"encoder_id": "t", "normalize": True})
    plain = StaticSentenceEncoder(None, table, {"encoder_id": "t", "normalize": False})
    for n in (1, 2, 3, 17, 128, 512):
        ids = np.concatenate(([3], rng.integers(0, 500, n - 1))).astype(np.intp)
        s = [0.0] * 32
        for i in ids:
            s = [a + float(b) for a, b in zip(s, table[i], strict=True)]
        s = np.array(s)
        assert np.array_equal(enc.token_sum(ids), s)  # a pairwise sum misses at n >= 128
        assert np.array_equal(enc.pool(ids), (s / math.sqrt(s @ s)).astype(np.float32))
        assert np.array_equal(plain.pool(list(ids)), (s / n).astype(np.float32))
    assert not enc.pool(np.empty(0, dtype=np.intp)).any()


def test_check_bert_pipeline_refuses_other_tokenizers():
    check_bert_pipeline({"normalizer": {"type": "BertNormalizer"},
                         "pre_tokenizer": {"type": "BertPreTokenizer"},
                         "model": {"type": "WordPiece"}})
    with pytest.raises(ValueError, match="BPE"):
        check_bert_pipeline({"normalizer": {"type": "BertNormalizer"},
                             "pre_tokenizer": {"type": "BertPreTokenizer"},
                             "model": {"type": "BPE"}})


def test_read_safetensors_round_trip_and_bad_files():
    from replaylab.artifacts.static_export import safetensors_bytes

    rng = np.random.default_rng(1)
    tensors = {"a": rng.normal(size=(3, 4)).astype(np.float32), "b": np.arange(5, dtype=np.float32)}
    data = safetensors_bytes(tensors, {"k": "v"})
    back = read_safetensors(data)
    assert set(back) == {"a", "b"} and all(np.array_equal(back[k], v) for k, v in tensors.items())
    for broken in (data[:5], (10 ** 9).to_bytes(8, "little") + data[8:], data[:-4]):
        with pytest.raises(EncoderArtifactError):
            read_safetensors(broken)


@pytest.mark.parametrize("rule", ["margin", "absolute"])
def test_choose_one_is_choose_by_threshold(rule):
    rng = np.random.default_rng(2)
    prob = rng.random((3000, 4))
    prob[:500, 1] = prob[:500, 2]            # ties for the best
    prob[500:800] = np.round(prob[500:800], 1)  # many equal values
    prob[800:900, 0] = prob[800:900, 1]      # ties in the first two columns (K = 2 below)
    for cols in (prob, prob[:, :2], prob[:, :3]):
        for t in (-0.2, 0.0, 0.1, 0.5, 0.9):
            want = choose_by_threshold(cols, t, fallback=1, rule=rule)
            got = np.array([choose_one(p, t, fallback=1, rule=rule) for p in cols])
            assert np.array_equal(want, got)
            assert np.array_equal(want, [choose_one(p.tolist(), t, fallback=1, rule=rule)
                                         for p in cols])


def _spec_forward(t: dict, e: np.ndarray, code: int, tokens: float) -> np.ndarray:
    """docs/specs/router-scorer.md "Head", written out unfolded (the reference for HeadScorer kind numpy)."""
    f = {k: v.astype(np.float64) for k, v in t.items()}
    x = 0.0 if math.isnan(tokens) else (math.log1p(max(tokens, 0.0)) - f["tok_mean"][0]) / \
        f["tok_scale"][0]
    h = np.concatenate(((e.astype(np.float64) - f["emb_mean"]) / f["emb_scale"],
                        f["category"][code], [x]))
    i = 0
    while f"layer{i}.weight" in f:
        h = np.maximum(f[f"layer{i}.weight"] @ h + f[f"layer{i}.bias"], 0.0)
        i += 1
    s = f["success.weight"] @ h + f["success.bias"]
    if "wide_category" in f:
        s = s + f["wide_category"][code] + f["wide_tokens"] * x
    return 1.0 / (1.0 + np.exp(-(f["platt_a"] * s + f["platt_b"])))


@pytest.mark.parametrize("wide", [True, False])
def test_numpy_head_is_the_spec_and_the_onnx_graph(wide):
    from replaylab.artifacts.router_head import head_tensors, served_head
    from replaylab.router.head import HeadConfig, SuccessHead
    from replaylab.router.inputs import TrainingRows

    rng = np.random.default_rng(3)
    n, d, k = 300, 24, 3
    E = rng.normal(size=(n, d)).astype(np.float32)
    E /= np.linalg.norm(E, axis=1, keepdims=True)
    meta = {"category": np.array(["a", "b", "c"])[rng.integers(0, 3, n)],
            "prompt_tokens": rng.integers(1, 500, n).astype(float)}
    rows = TrainingRows(row=np.repeat(np.arange(n), k), action=np.tile(np.arange(k), n),
                        reward=(rng.random(n * k) < 0.5).astype(float), weight=None,
                        cost=np.ones(n * k))
    cfg = HeadConfig(hidden=(16, 8), max_epochs=5, wide=wide, min_category_count=1)
    head = SuccessHead(cfg, seed=0).fit(E, meta, rows, k).calibrate(E, meta, rows)
    meta["prompt_tokens"][:10] = np.nan  # missing -> the training mean
    meta["category"][10:20] = "never-seen"
    numpy_head = served_head(head, scorer="numpy")
    onnx_head = served_head(head, scorer="onnx")
    assert numpy_head.served_.kind == "numpy" and onnx_head.served_.kind == "onnx"
    p_np, p_onnx = numpy_head.predict_proba(E, meta), onnx_head.predict_proba(E, meta)
    assert np.abs(p_np - p_onnx).max() <= 1e-5  # float32 graph vs float64 numpy
    tensors = head_tensors(head)
    codes = numpy_head.served_.codes(meta["category"])
    spec = np.stack([_spec_forward(tensors, E[i], int(codes[i]), meta["prompt_tokens"][i])
                     for i in range(n)])
    # the float32 trunk: ~1e-8 from the float64 spec (docs/specs/router-scorer.md allows 1e-5)
    assert 0 < np.abs(p_np - spec).max() <= 1e-6
    from replaylab.runtime.router_head import HeadScorer

    class Float64Trunk(HeadScorer):
        TRUNK_DTYPE = np.float64

    exact = Float64Trunk.from_tensors(tensors, numpy_head.served_.vocabulary)
    p64 = exact.proba(E, meta["category"], meta["prompt_tokens"])
    assert np.abs(p64 - spec).max() <= 1e-12  # folding at load is exact up to rounding
    one = numpy_head.predict_proba(E[:1], {k2: v[:1] for k2, v in meta.items()})
    assert np.array_equal(one[0], p_np[0])  # a row's answer does not depend on its batch
    scorer = numpy_head.served_  # the serving call: the same floats as a list
    assert scorer.proba_row(E[0], int(codes[0]), meta["prompt_tokens"][0]) == p_np[0].tolist()


# ----------------------------------------------------------------------------- slow: export
def _train(*overrides: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "training", "pipeline=router", "tracking=off", *overrides]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900,
                          env={**__import__("os").environ, "HF_HUB_OFFLINE": "1"})


@pytest.fixture(scope="module")
def static_run(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("static")
    proc = _train("router.encoder.tier=static", f"router.encoder.cache_dir={root / 'cache'}",
                  f"hydra.run.dir={root / 'run'}", "router.head.max_epochs=20", *ONE_HEAD)
    assert proc.returncode == 0, proc.stderr[-3000:]
    from replaylab.apps.verdicts import verdict_line

    # the console ends with the verdict the summary (and the gate) hold
    summary = json.loads((root / "run" / "summary.json").read_text())
    assert proc.stdout.strip().splitlines()[-1] == verdict_line(summary) == summary["verdict"]
    return root


@pytest.mark.slow
def test_static_export_matches_model2vec_and_verifies(static_run):
    from replaylab.runtime.static_encoder import load_static_encoder

    folder = static_run / "cache" / "encoder-static"
    manifest = json.loads((folder / "manifest.json").read_text())
    parity = manifest["training"]["parity"]
    assert parity["token_ids_equal"] and parity["min_cosine"] >= 0.99999
    assert parity["n_texts"] >= 400
    enc = load_static_encoder(folder)
    assert enc.golden_status == "passed" and enc.dimension == 256
    assert enc.encoder_id.endswith("+model2vec-pca256")
    v = enc.encode(["route this prompt", ""])
    assert abs(float(np.linalg.norm(v[0])) - 1.0) < 1e-6 and not v[1].any()


@pytest.mark.slow
def test_static_pipeline_trains_exports_and_serves(static_run, tmp_path):
    from replaylab.runtime import Router

    run = static_run / "run"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["encoder"]["tier"] == "static"
    assert "numpy" in summary["head"]["decisions_from"]
    art = Path(summary["artifacts"]["router"])
    config = json.loads((art / "router.json").read_text())
    assert config["encoder"] == {"tier": "static", "dir": "encoder"}
    golden = json.loads((art / "golden.json").read_text())
    assert all("token_ids" in c["expected"]["static"] for c in golden["cases"])
    router = Router.load(art)
    assert router.loaded and router.tier == "static" and router.head.kind == "numpy"
    assert router.golden_status == "passed"
    # served decisions == the decisions training reported, bit for bit
    import pandas as pd

    from replaylab.apps.inputs import default_outcomes
    from replaylab.sources.routellm import import_routellm_gsm8k

    dec = pd.read_parquet(run / "router_decisions_test.parquet").head(60)
    out = import_routellm_gsm8k(str(default_outcomes())).drop_duplicates("prompt_id")
    text = out.set_index("prompt_id").loc[dec["prompt_id"], "prompt_text"].astype(str)
    assert out["prompt_tokens"].isna().all()  # RouteLLM: tokens estimated from characters
    for (_, row), t in zip(dec.iterrows(), text, strict=True):
        got = router.route(t, "gsm8k")  # the router estimates tokens as training did
        assert got.candidate == row["candidate"]
        assert [got.scores[c] for c in router.candidates] == [
            row[f"p_{c}"] for c in router.candidates]
    # a tampered table is refused: the caller's fallback answers
    bad = tmp_path / "router"
    shutil.copytree(art, bad)
    emb = bad / "encoder" / "embeddings.safetensors"
    data = bytearray(emb.read_bytes())
    data[-1] ^= 1
    emb.write_bytes(bytes(data))
    r2 = Router.load(bad, fallback_candidate="strong")
    assert not r2.loaded and r2.reason == "hash_mismatch"
    assert r2.route("hello").candidate == "strong"


@pytest.mark.slow
def test_unknown_tier_is_a_config_error(tmp_path):
    run = train("pipeline=router", "tracking=off", "router.encoder.tier=tiny",
                run_dir=tmp_path, check=False)  # in process: the CLI's smoke is elsewhere
    assert run.returncode == 2 and "router.encoder.tier" in run.stderr


@pytest.mark.slow
def test_static_tier_serves_without_an_ml_runtime(static_run):
    """numpy only: onnxruntime, tokenizers, torch, pandas, ... unimportable in the child."""
    art = json.loads((static_run / "run" / "summary.json").read_text())["artifacts"]["router"]
    code = f"""
import importlib.abc, json, sys
BLOCK = {{"torch", "transformers", "sentence_transformers", "pandas", "sklearn", "lightgbm",
         "onnxruntime", "tokenizers", "onnx", "model2vec", "mlflow"}}
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in BLOCK:
            raise ImportError("blocked in serving: " + name)
sys.meta_path.insert(0, Block())
from replaylab.runtime import Router
r = Router.load({str(art)!r})
d = r.route("How many apples does Tom have?", "gsm8k")
print(json.dumps({{"loaded": r.loaded, "golden": r.golden_status, "fallback": d.fallback,
                  "heavy": sorted(m for m in sys.modules if m.split(".")[0] in BLOCK)}}))
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out == {"loaded": True, "golden": "passed", "fallback": False, "heavy": []}
