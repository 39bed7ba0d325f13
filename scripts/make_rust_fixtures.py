"""The Rust crate's test fixtures (scorers/rust/tests/fixtures): three tiny real artifacts.

`cargo test --offline` in scorers/rust checks these without any environment variable
(scorers/rust/tests/{golden,demand,binder}.rs): manifest verification, golden vectors,
a tampered copy refused. Regenerate them (seeded, deterministic, ~60 s on 2 cores) with

    HF_HUB_OFFLINE=1 .venv/bin/python scripts/make_rust_fixtures.py

(`--out DIR` writes elsewhere; tests/scorers/test_rust_crate.py regenerates them into a temp
folder and checks every file's sha256 against the committed ones). Rerun it and commit
the result whenever an exporter's output changes on purpose (its format, the golden
vectors, `replaylab.__version__` in the router manifest).

- `demand/`: `replaylab.artifacts.demand_export.export_demand` of a demand run
  (`train_demand`) on a seeded synthetic ledger of 300 sessions (the same run
  tests/scorers/test_rust_demand.py trains): manifest, golden.json, model.onnx and the flat
  trees (trees.safetensors, a few dozen small trees), ~70 KB.
- `router/`: `replaylab.artifacts.router_export.export_router` of a static-tier router trained
  by `replaylab.pipelines.router.train_router` on the shipped RouteLLM GSM8K outcomes,
  with a tiny stand-in encoder exported by the real static exporter
  (`replaylab.artifacts.static_export.export_static_encoder`, its model2vec parity gate
  included): a BERT WordPiece tokenizer over ~400 tokens (specials, ASCII characters
  and their `##` pieces, the 300 most frequent words of the prompts) and seeded random
  16-dimensional embeddings in a model2vec `StaticModel`; a small head (hidden 32, 16).
  Its BertNormalizer keeps `lowercase` but not `clean_text` and `strip_accents`:
  their per-codepoint table rows (private-use deletion, NFD of Hangul and accented
  letters) alone weigh 1.3-3 MB, while lowercasing and the punctuation / whitespace
  classes make a 26 KB charmap.tsv. The full MiniLM-distilled encoder (34 MB) is still
  checked when REPLAYLAB_ROUTER_ARTIFACT names such an artifact (tests/scorers/test_rust_scorer.py).
- `router-minilm/`: a MiniLM-tier router (`export_router` over `export_encoder`, fp32 only)
  on the same outcomes, over a seeded random 1-layer BERT (hidden 16, the tiny vocabulary)
  in a sentence-transformers pipeline of all-MiniLM-L6-v2's shape (mean pooling, L2
  normalization): 68 KB of ONNX instead of 90 MB. The crate loads it for embedding-only
  routing; its golden.json carries the (text, embedding, decision) triples a host proves
  its encoder on (docs/specs/router-scorer.md, "Routing on the host's embedding"). Its
  head is trained on torch's embeddings and its threshold picked on the numpy head (both
  pinned below), so every file but the onnxruntime-computed golden vectors (and the
  manifests hashing them) is the same bytes on any CPU; tests/scorers/test_rust_crate.py
  compares those within the artifact's fp32 tolerances.

Both are created at a fixed time (2026-01-01T00:00:00Z) and valid for 100 years, so
they verify on any clock the tests meet, and their golden.json files record
`replaylab.contracts.golden.ANY_MACHINE` instead of the CPU that wrote them (its model,
flags and int8 probe would change the bytes and the manifests' content hashes on every
other CPU): nothing in them depends on the machine (docs/specs/artifacts.md "What a
committed fixture holds").

The numbers are pinned too (`PINNED_NUMERICS`, set before numpy, torch or onnxruntime
load): numpy, torch, MKL and OpenBLAS pick their kernels by CPU (numpy's AVX-512 expm1
/ log1p, torch's AVX2 / AVX-512 ATen kernels, MKL's and OpenBLAS's GEMMs), and those
differ in the last bits, enough to change a golden hint's repr, the head's float32
weights and every hash above them. Pinned to their baseline code paths and one thread,
they compute the same bits on any x86-64 CPU with AVX2 (checked natively on AVX-512 VNNI
+ AMX and under `qemu-x86_64 -cpu Haswell`: `make test-haswell`). Real exports keep every
kernel.
"""

from __future__ import annotations

import os

# numpy: baseline (x86-64-v2) loops only; torch: ATen's default (non-AVX) kernels; MKL
# (torch's BLAS and VML): its AVX2 code path on any AVX2 CPU, AVX-512 and AMD included
# (conditional numerical reproducibility; its AVX-512 VML sqrt, which AdamW calls, is not
# correctly rounded: 629 of 100,000 float32 differ, its AVX2 one is); OpenBLAS (numpy's,
# scipy's): the Nehalem kernels; one thread each (a threaded reduction sums in another order).
PINNED_NUMERICS = {"NPY_DISABLE_CPU_FEATURES": "X86_V3 X86_V4 AVX512_ICL AVX512_SPR",
                   "ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "AVX2",
                   "OPENBLAS_CORETYPE": "Nehalem", "OMP_NUM_THREADS": "1",
                   "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
os.environ.update(PINNED_NUMERICS)  # before the imports below load any of them

import argparse  # noqa: E402
import collections  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from datetime import UTC, datetime  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from replaylab.contracts.golden import ANY_MACHINE  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "scorers" / "rust" / "tests" / "fixtures"
CREATED = datetime(2026, 1, 1, tzinfo=UTC)
VALID_DAYS = 36500.0
SEED = 7
TINY_MODEL_ID = "replaylab/tiny-fixture-encoder"
CHEAP, STRONG = "mistralai/Mixtral-8x7B-Instruct-v0.1", "gpt-4-1106-preview"
# the small router both router fixtures train (static and MiniLM tiers)
ROUTER_CONFIG = {
    "candidates": [CHEAP, STRONG],
    "cost": {"call_cost_usd": {CHEAP: 0.00012, STRONG: 0.01235}},
    "head": {"max_epochs": 5, "num_threads": 1, "hidden": [32, 16]},
    "go": {"n_boot": 100}, "evaluation": {"n_boot": 20}, "lgbm_estimators": 10,
    "seed": SEED}
N_WORDS = 300
DIM = 16
TINY_BERT_ID = "replaylab/tiny-fixture-bert"
MAX_SEQ = 128
FIXTURES = ("demand", "router", "router-minilm")


def demand_fixture(work: Path, out: Path) -> Path:
    """A demand artifact of a seeded 300-session synthetic run."""
    from replaylab.artifacts.demand_export import export_demand
    from replaylab.demand import DemandConfig
    from replaylab.pipelines.demand import train_demand
    from replaylab.pipelines.project import LedgerInput, load_ledger
    from replaylab.projection import ProjectionConfig, SplitConfig
    from replaylab.sources.synthetic import SyntheticLedgerConfig

    loaded = load_ledger(LedgerInput(synthetic=SyntheticLedgerConfig(n_sessions=300,
                                                                     sessions_per_s=0.25)))
    summary, run = train_demand(loaded, ProjectionConfig(), SplitConfig(embargo_ms=60_000),
                                DemandConfig(), work / "demand-run")
    return export_demand(run, summary, out, created=CREATED, valid_days=VALID_DAYS,
                         built_on=ANY_MACHINE)


def tiny_vocab(prompts: list[str]) -> list[str]:
    """~400 WordPiece tokens: specials, ASCII characters and their `##` pieces, the
    N_WORDS most frequent words of the prompts."""
    words = collections.Counter(w for p in prompts for w in re.findall(r"[a-z]+", p.lower()))
    top = sorted(words, key=lambda w: (-words[w], w))[:N_WORDS]
    chars = [chr(c) for c in range(0x21, 0x7F) if not chr(c).isupper()]
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *chars,
             *("##" + c for c in chars if c.isalnum())]
    return vocab + [w for w in top if w not in vocab]


def tiny_static_model(prompts: list[str]):
    """A model2vec StaticModel over a ~400-token WordPiece vocabulary, seeded embeddings."""
    from model2vec import StaticModel
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

    vocab = tiny_vocab(prompts)
    tok = Tokenizer(models.WordPiece({t: i for i, t in enumerate(vocab)}, unk_token="[UNK]",
                                     max_input_chars_per_word=100))
    tok.normalizer = normalizers.BertNormalizer(clean_text=False, handle_chinese_chars=False,
                                                strip_accents=False, lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    vectors = np.random.default_rng(SEED).standard_normal((len(vocab), DIM)).astype(np.float32)
    return StaticModel(vectors, tok, normalize=True, base_model_name=TINY_MODEL_ID)


def router_fixture(work: Path, out: Path) -> Path:
    """A static-tier router artifact over the tiny encoder."""
    from replaylab.apps.inputs import default_outcomes
    from replaylab.artifacts.router_export import export_router
    from replaylab.artifacts.static_export import export_static_encoder
    from replaylab.pipelines.router import train_router
    from replaylab.router.pipeline_config import router_config
    from replaylab.runtime.static_encoder import load_static_encoder
    from replaylab.sources.routellm import import_routellm_gsm8k

    outcomes = import_routellm_gsm8k(str(default_outcomes()))
    prompts = outcomes.drop_duplicates("prompt_id")["prompt_text"].astype(str).tolist()
    enc_dir = work / "encoder-static"
    export_static_encoder(tiny_static_model(prompts), enc_dir, parity_texts=prompts[:50],
                          model_id=TINY_MODEL_ID, created=CREATED, valid_days=VALID_DAYS,
                          built_on=ANY_MACHINE)
    encoder = load_static_encoder(enc_dir)
    if encoder.golden_status != "passed":
        raise RuntimeError(f"the tiny encoder misses its golden vectors: {encoder.golden_status}")
    cfg = router_config(ROUTER_CONFIG)
    _, run = train_router(outcomes, cfg, work / "router-run", encoder.encode,
                          head_scorer="numpy")
    return export_router(run, enc_dir, out, created=CREATED, valid_days=VALID_DAYS,
                         built_on=ANY_MACHINE)


def tiny_minilm_model(prompts: list[str], work: Path):
    """A sentence-transformers pipeline of all-MiniLM-L6-v2's shape (BERT -> mean pooling
    -> L2 normalization) over the tiny vocabulary: a seeded random 1-layer BERT, hidden 16."""
    import torch
    from sentence_transformers import SentenceTransformer, models
    from tokenizers import Tokenizer, normalizers, pre_tokenizers, processors
    from tokenizers import models as tk_models
    from transformers import BertConfig, BertModel, BertTokenizerFast

    folder = work / "tiny-bert"
    folder.mkdir(parents=True)
    vocab = tiny_vocab(prompts)
    wordpiece = Tokenizer(tk_models.WordPiece({t: i for i, t in enumerate(vocab)},
                                              unk_token="[UNK]", max_input_chars_per_word=100))
    wordpiece.normalizer = normalizers.BertNormalizer(handle_chinese_chars=False,
                                                      strip_accents=False, lowercase=True)
    wordpiece.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    wordpiece.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", vocab.index("[CLS]")), ("[SEP]", vocab.index("[SEP]"))])
    tok = BertTokenizerFast(tokenizer_object=wordpiece, unk_token="[UNK]", pad_token="[PAD]",
                            cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]")
    torch.manual_seed(SEED)
    bert = BertModel(BertConfig(vocab_size=len(tok), hidden_size=DIM, num_hidden_layers=1,
                                num_attention_heads=2, intermediate_size=2 * DIM,
                                max_position_embeddings=MAX_SEQ))
    bert.save_pretrained(folder)
    tok.save_pretrained(folder)
    return SentenceTransformer(modules=[models.Transformer(str(folder), max_seq_length=MAX_SEQ),
                                        models.Pooling(DIM, pooling_mode="mean"),
                                        models.Normalize()], device="cpu")


def router_minilm_fixture(work: Path, out: Path) -> Path:
    """A MiniLM-tier router artifact over the tiny BERT (exported by the real encoder
    exporter, fp32 only): its golden.json carries the (text, embedding, decision) triples a
    host that embeds prompts itself proves its encoder on."""
    from replaylab.apps.inputs import default_outcomes
    from replaylab.artifacts.encoder_export import export_encoder
    from replaylab.artifacts.router_export import export_router
    from replaylab.pipelines.router import train_router
    from replaylab.router.encoder import SentenceTransformerEncoder
    from replaylab.router.pipeline_config import router_config
    from replaylab.sources.routellm import import_routellm_gsm8k

    outcomes = import_routellm_gsm8k(str(default_outcomes()))
    prompts = outcomes.drop_duplicates("prompt_id")["prompt_text"].astype(str).tolist()
    model = tiny_minilm_model(prompts, work)
    enc_dir = work / "encoder-minilm"
    export_encoder(model, enc_dir, parity_texts=prompts[:50], model_id=TINY_BERT_ID, int8=False,
                   created=CREATED, valid_days=VALID_DAYS, built_on=ANY_MACHINE)
    cfg = router_config(ROUTER_CONFIG)
    # trained on torch's embeddings (pinned: the same bits on any CPU; the exporter's parity
    # gate holds onnxruntime's within 1e-4 in cosine) and its threshold picked on the numpy
    # head, so that head.*, router.json and the encoder's files are the same bytes anywhere;
    # the golden vectors are onnxruntime's (encoder and head.onnx), as served
    _, run = train_router(outcomes, cfg, work / "router-minilm-run",
                          SentenceTransformerEncoder(model, TINY_BERT_ID).encode,
                          head_scorer="numpy")
    return export_router(run, enc_dir, out, created=CREATED, valid_days=VALID_DAYS,
                         built_on=ANY_MACHINE)


def make(out: Path) -> dict[str, Path]:
    """The fixtures written under `out` (replacing `out/<name>` for each of FIXTURES)."""
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="rust-fixtures-") as tmp:
        work = Path(tmp)
        built = {"demand": demand_fixture(work, work / "demand"),
                 "router": router_fixture(work, work / "router"),
                 "router-minilm": router_minilm_fixture(work, work / "router-minilm")}
        for name, path in built.items():
            shutil.rmtree(out / name, ignore_errors=True)
            # plain copies (the router export hard-links its encoder files)
            shutil.copytree(path, out / name, copy_function=shutil.copyfile)
    return {name: out / name for name in FIXTURES}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=OUT, help=f"default: {OUT.relative_to(REPO)}")
    args = ap.parse_args(argv)
    for name, path in make(args.out).items():
        files = sorted(p for p in path.rglob("*") if p.is_file())
        size = sum(p.stat().st_size for p in files)
        print(f"{name}: {path} ({len(files)} files, {size / 1024:.1f} KiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
