"""How far a host's own all-MiniLM-L6-v2 embeddings sit from a MiniLM-tier router's, and
what that moves: the measurement behind the host tolerances (docs/specs/router-scorer.md,
"Routing on the host's embedding"; docs/results/host-encoder.md).

    HF_HUB_OFFLINE=1 .venv/bin/python scripts/host_encoder_tolerance.py [--n 200] \
        [--out docs/results/host-encoder.json]

Builds a real MiniLM-tier router (the shipped MiniLM exported by `export_encoder`, fp32 +
int8; a small head trained by `train_router` on the shipped RouteLLM GSM8K outcomes,
exported by `export_router`, so its golden.json carries the triples), then embeds the
golden texts and `--n` GSM8K prompts with several hosts and compares each with the
artifact's fp32 serving path (onnxruntime, one text per call):

- `torch`: sentence-transformers `encode` (torch fp32), a Python host running the model;
- `onnx_batched`: the same ONNX graph in padded batches of 32, stock graph optimizations,
  2 threads: a host that batches;
- `int8`: the artifact's own int8 variant (`+int8r`), another embedding space.

Per host: min cosine, max |difference| (over the texts), max |P(success) difference| and
decision agreement when the head scores the host's embedding (`route_embedding`) rather
than the runtime's (`route`), and `check_host_encoder`'s verdict on the triples.
~5 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]


def measure(n: int) -> dict:
    from replaylab.apps.inputs import default_outcomes
    from replaylab.artifacts.encoder_export import export_encoder
    from replaylab.artifacts.router_export import export_router
    from replaylab.contracts.golden import row_cosines
    from replaylab.pipelines.router import train_router
    from replaylab.router.encoder import SentenceTransformerEncoder, load_minilm
    from replaylab.router.pipeline_config import router_config
    from replaylab.runtime import Router
    from replaylab.runtime.encoder import (
        CONFIG_FILE,
        TOKENIZER_FILE,
        EncoderConfig,
        OnnxSentenceEncoder,
        load_encoder,
    )
    from replaylab.sources.routellm import import_routellm_gsm8k

    outcomes = import_routellm_gsm8k(str(default_outcomes()))
    prompts = outcomes.drop_duplicates("prompt_id")["prompt_text"].astype(str).tolist()
    model = load_minilm()
    with tempfile.TemporaryDirectory(prefix="host-encoder-") as tmp:
        work = Path(tmp)
        export_encoder(model, work / "encoder", parity_texts=prompts[:50])
        fp32 = load_encoder(work / "encoder")
        cheap, strong = "mistralai/Mixtral-8x7B-Instruct-v0.1", "gpt-4-1106-preview"
        cfg = router_config({"candidates": [cheap, strong],
                             "cost": {"call_cost_usd": {cheap: 0.00012, strong: 0.01235}},
                             "head": {"max_epochs": 5, "num_threads": 1},
                             "go": {"n_boot": 100}, "evaluation": {"n_boot": 20},
                             "lgbm_estimators": 10, "seed": 0})
        _, run = train_router(outcomes, cfg, work / "run", fp32.encode)
        art = export_router(run, work / "encoder", work / "router")
        router = Router.load(art)
        if not router.loaded:
            raise RuntimeError(f"the router does not load: {router.reason}")
        test = prompts[-n:]  # the last prompts: outside the 50 parity ones
        ours = np.stack([router.encoder.encode_one(t) for t in test])
        int8 = load_encoder(work / "encoder", variant="int8")
        config = EncoderConfig.from_dict(json.loads((work / "encoder" / CONFIG_FILE).read_text()))
        batched = OnnxSentenceEncoder.from_bytes(
            (work / "encoder" / config.files["fp32"]).read_bytes(),
            (work / "encoder" / TOKENIZER_FILE).read_text(), config, threads=2,
            disabled_optimizers=())
        torch_enc = SentenceTransformerEncoder(model)
        hosts = {"torch": lambda ts: torch_enc.encode(ts, batch_size=1),
                 "onnx_batched": lambda ts: batched.encode(ts, batch_size=32),
                 "int8": lambda ts: np.stack([int8.encode_one(t) for t in ts])}
        out = {"router_version": router.version, "n_prompts": len(test),
               "candidates": list(router.candidates), "rule": router.rule,
               "threshold": router.threshold, "tolerances": {
                   k: v for k, v in json.loads((art / "golden.json").read_text())[
                       "tolerances"].items() if k.startswith("host_")}, "hosts": {}}
        for name, embed in hosts.items():
            theirs = np.asarray(embed(test), dtype=np.float32)
            cos = row_cosines(ours, theirs)
            p_ours, p_theirs, same = [], [], []
            for t, a, b in zip(test, ours, theirs, strict=True):
                da = router.route_embedding(a, "gsm8k", router.prompt_tokens(t))
                db = router.route_embedding(b, "gsm8k", router.prompt_tokens(t))
                p_ours.append([da.scores[c] for c in router.candidates])
                p_theirs.append([db.scores[c] for c in router.candidates])
                same.append(da.candidate == db.candidate)
            by_text = {}
            triple_texts = [tr["input"]["text"] for tr in router.golden_triples()]
            for t, v in zip(triple_texts, embed(triple_texts), strict=True):
                by_text[t] = v
            verdict = router.check_host_encoder(lambda t, m=by_text: m[t])
            out["hosts"][name] = {
                "min_cosine": float(cos.min()), "mean_cosine": float(cos.mean()),
                "max_abs_diff": float(np.abs(ours.astype(np.float64) - theirs).max()),
                "prob_max_abs_diff": float(np.abs(np.array(p_ours) - np.array(p_theirs)).max()),
                "decision_agreement": float(np.mean(same)),
                "check_host_encoder": {"ok": verdict.ok, "failed": list(verdict.failed),
                                       **{k: verdict.figures[k] for k in
                                          ("min_cosine", "max_abs_diff", "prob_max_abs",
                                           "n_stable", "stable_decisions_equal")}}}
        return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=200, help="GSM8K prompts embedded by each host")
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "results" / "host-encoder.json")
    args = ap.parse_args(argv)
    result = measure(args.n)
    args.out.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    print(json.dumps(result["hosts"], indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
