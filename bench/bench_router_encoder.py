"""Benchmark: encode one routing request (<= 128 tokens) on one thread, ONNX vs sentence-transformers.

Target (issue 5): route one request of up to 128 tokens in under 3 ms p99 with
the ONNX encoder on one thread, against the sentence-transformers torch path
measured in the same run.

Prompts: RouteLLM GSM8K + MMLU prompts (../shared/data/outcomes/routellm, or
the slices in tests/data), shuffled with seed 0, each cut to at most 128
tokens with the encoder's own tokenizer (cut at the character offset of the
126th word piece, so [CLS] + 126 + [SEP] <= 128). The encoder folder is
exported into a temporary folder first (or given with --encoder).

Timed per call, one text per call, after 20 warm-up calls, in this order over
the same prompts: ONNX fp32 (1 intra-op thread), ONNX int8 (1 thread),
sentence-transformers `encode([text])` with `torch.set_num_threads(1)`, and a
cache hit (`CachedEncoder` over fp32, every prompt already cached). Wall time
(perf_counter) and this process's CPU time (process_time) are both reported:
on a shared machine wall time includes waiting for a core, CPU time does not.
Also timed: a fixed 128-token prompt (the worst case the target names, 200
calls) and, for the two ONNX variants, fixed 16 / 32 / 64-token prompts (100
calls each): the latency curve that says which token budget would fit 3 ms.
Calls: --calls, default clamp(--rows, 500, 1000).
Prints one JSON object on the last line (bench/run_all.py).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
MAX_TOKENS = 128
TARGET_P99_MS = 3.0


def _routellm_root() -> Path:
    env = os.environ.get("REPLAYLAB_SHARED_DATA")
    for base in ([Path(env)] if env else []) + [REPO.parent / "shared" / "data",
                                                 Path("/work/shared/data")]:
        if (base / "outcomes" / "routellm").is_dir():
            return base / "outcomes" / "routellm"
    return REPO / "tests" / "data" / "routellm"


def load_prompts(limit: int, seed: int = 0) -> tuple[list[str], str]:
    from replaylab.sources.routellm import import_routellm_gsm8k, import_routellm_mmlu

    root = _routellm_root()
    texts: list[str] = []
    for frame in (import_routellm_gsm8k(root / "gsm8k" / "gsm8k_responses.csv"),
                  import_routellm_mmlu(root / "mmlu" / "responses")):
        texts += frame["prompt_text"].drop_duplicates().tolist()
    random.Random(seed).shuffle(texts)
    while len(texts) < limit:  # tiny fallback slices: repeat
        texts += texts
    return texts[:limit], str(root)


def truncate_to_tokens(tokenizer, texts: list[str], max_tokens: int) -> list[str]:
    """Each text cut so that it encodes to <= max_tokens tokens including [CLS]/[SEP]."""
    out = []
    for text in texts:
        enc = tokenizer.encode(text)
        if len(enc.ids) <= max_tokens:
            out.append(text)
            continue
        # offsets of the word pieces (special tokens have (0, 0)); keep max_tokens - 2,
        # fewer when the cut splits a word that then re-tokenizes into more pieces
        pieces = [o for o, s in zip(enc.offsets, enc.special_tokens_mask, strict=True) if not s]
        keep = max_tokens - 2
        while len(tokenizer.encode(text[:pieces[keep - 1][1]]).ids) > max_tokens:
            keep -= 1
        out.append(text[:pieces[keep - 1][1]])
    return out


def _stats(ms: np.ndarray) -> dict:
    return {"p50_ms": round(float(np.percentile(ms, 50)), 3),
            "p90_ms": round(float(np.percentile(ms, 90)), 3),
            "p99_ms": round(float(np.percentile(ms, 99)), 3),
            "mean_ms": round(float(ms.mean()), 3), "max_ms": round(float(ms.max()), 3)}


def time_calls(fn, texts: list[str], warmup: int = 20) -> dict:
    for t in texts[:warmup]:
        fn(t)
    wall, cpu = np.empty(len(texts)), np.empty(len(texts))
    for i, t in enumerate(texts):
        c0, w0 = time.process_time(), time.perf_counter()
        fn(t)
        wall[i], cpu[i] = time.perf_counter() - w0, time.process_time() - c0
    wall, cpu = wall * 1e3, cpu * 1e3
    return {"calls": len(texts), "wall": _stats(wall), "cpu": _stats(cpu),
            "meets_3ms_p99_wall": bool(np.percentile(wall, 99) < TARGET_P99_MS)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1000, help="calls, clamped to [500, 1000]")
    ap.add_argument("--calls", type=int, default=None)
    ap.add_argument("--encoder", default=None, help="an exported encoder folder (else export)")
    ap.add_argument("--json", action="store_true", help="(accepted for bench/run_all.py)")
    args = ap.parse_args()
    calls = args.calls or min(max(args.rows, 500), 1000)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # entry point: the library never reads env

    import torch

    from replaylab.router.embed_cache import CachedEncoder, EmbeddingCache
    from replaylab.router.encoder import SentenceTransformerEncoder, export_encoder, load_minilm
    from replaylab.runtime.encoder import load_encoder

    torch.set_num_threads(1)
    model = load_minilm()
    prompts, source = load_prompts(calls)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(args.encoder) if args.encoder else Path(tmp) / "encoder"
        t0 = time.perf_counter()
        if not args.encoder:
            export_encoder(model, folder, parity_texts=prompts[:100])
        export_s = time.perf_counter() - t0
        fp32 = load_encoder(folder, variant="fp32", threads=1)
        int8 = load_encoder(folder, variant="int8", threads=1)
        texts = truncate_to_tokens(fp32.tokenizer, prompts, MAX_TOKENS)
        tokens = fp32.token_counts(texts)
        assert tokens.max() <= MAX_TOKENS
        st = SentenceTransformerEncoder(model)
        cached = CachedEncoder(fp32, EmbeddingCache(fp32.encoder_id, fp32.dimension))
        cached.encode(texts)
        paths = {"onnx_fp32": fp32.encode_one, "onnx_int8": int8.encode_one,
                 "sentence_transformers_torch": st.encode_one, "cache_hit_fp32": cached.encode_one}
        results = {name: time_calls(fn, texts) for name, fn in paths.items()}
        long_text = " ".join(prompts[:40])
        worst = truncate_to_tokens(fp32.tokenizer, [long_text], MAX_TOKENS) * 200
        at_128 = {name: time_calls(fn, worst)
                  for name, fn in paths.items() if name != "cache_hit_fp32"}
        by_length = {}
        for n_tokens in (16, 32, 64):
            fixed = truncate_to_tokens(fp32.tokenizer, [long_text], n_tokens) * 100
            by_length[str(n_tokens)] = {name: time_calls(enc.encode_one, fixed)
                                        for name, enc in (("onnx_fp32", fp32), ("onnx_int8", int8))}
    out = {
        "measured": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"cpu": platform.processor() or platform.machine(),
                    "cpus_affinity": len(os.sched_getaffinity(0)),
                    "loadavg_1m": round(os.getloadavg()[0], 2)},
        "prompts": {"source": source, "calls": len(texts),
                    "tokens_mean": round(float(tokens.mean()), 1),
                    "tokens_p50": int(np.median(tokens)), "tokens_max": int(tokens.max()),
                    "fixed_prompt_tokens": int(fp32.token_counts(worst[:1])[0])},
        "export_seconds": round(export_s, 1),
        "threads": 1, "target_p99_ms": TARGET_P99_MS,
        "real_prompts": results, "fixed_128_tokens": at_128, "fixed_shorter": by_length,
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
