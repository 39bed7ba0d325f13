"""Two static-tier router artifacts for timing the tuned table against the plain one.

    python bench/static_tuned_routers.py OUT_DIR [--cache-dir outputs/cache]

- OUT_DIR/plain: model2vec's distillation of MiniLM (PCA 256), the table as shipped;
- OUT_DIR/tuned: the same table tuned on GSM8K's training-split prompts (seed 0, the
  default 60/20/20 split; lambda chosen on its calibration prompts;
  `replaylab.router.static_encoder.tune_on_split`), 384 columns.

Both heads are trained as `bench_router_encoder.build_static_router` trains its own (400
GSM8K prompts, 30 epochs). Then `python bench/bench_rust_scorer.py --router OUT_DIR/plain`
and `--router OUT_DIR/tuned` time each route in Python (numpy) and in the Rust crate.
`--cache-dir` holds the MiniLM export (`encoder-minilm`; `make run` writes it) and the
embedding cache.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from replaylab.apps.inputs import default_outcomes
from replaylab.artifacts.router_export import export_router
from replaylab.artifacts.static_export import export_static_encoder
from replaylab.pipelines.router import seeded_split, train_router
from replaylab.router.embed_cache import cached_embed
from replaylab.router.pipeline_config import router_config
from replaylab.router.static_encoder import distill_minilm, static_model_from_export, tune_on_split
from replaylab.runtime.encoder import load_encoder
from replaylab.runtime.static_encoder import load_static_encoder
from replaylab.sources.routellm import import_routellm_gsm8k

CHEAP, STRONG = "mistralai/Mixtral-8x7B-Instruct-v0.1", "gpt-4-1106-preview"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--cache-dir", type=Path, default=Path("outputs/cache"))
    args = ap.parse_args()
    outcomes = import_routellm_gsm8k(str(default_outcomes()))
    first = outcomes.drop_duplicates("prompt_id")
    texts = first["prompt_text"].astype(str).tolist()
    split = seeded_split(len(texts), (0.6, 0.2, 0.2), 0)
    minilm = load_encoder(args.cache_dir / "encoder-minilm", variant="fp32", threads=1)
    embed, _ = cached_embed(minilm, args.cache_dir / "embeddings")
    y = np.asarray(embed(texts), dtype=np.float64)
    plain = args.cache_dir / "encoder-static"  # the plain distillation, when exported there
    base = static_model_from_export(plain) if plain.is_dir() else distill_minilm()
    tuned, tuning = tune_on_split(base, texts, y, split)
    train = [t for t, s in zip(texts, split, strict=True) if s == "train"]
    cfg = router_config({"candidates": [CHEAP, STRONG],
                         "cost": {"call_cost_usd": {CHEAP: 0.00012, STRONG: 0.01235}},
                         "head": {"max_epochs": 30, "num_threads": 1}, "go": {"n_boot": 100},
                         "evaluation": {"n_boot": 50}, "lgbm_estimators": 20})
    sub = outcomes[outcomes["prompt_id"].isin(first["prompt_id"].to_numpy()[:400])]
    for name, model, tun in (("plain", base, None), ("tuned", tuned, tuning)):
        enc_dir = args.out / f"encoder-{name}"
        export_static_encoder(model, enc_dir, parity_texts=train[:200], overwrite=True,
                              tuning=tun)
        enc = load_static_encoder(enc_dir)
        _, run = train_router(sub, cfg, args.out / f"run-{name}", enc.encode,
                              head_scorer="numpy")
        path = export_router(run, enc_dir, args.out / name)
        print(json.dumps({"router": str(path), "encoder_id": enc.encoder_id,
                          "dimension": enc.dimension}), flush=True)


if __name__ == "__main__":
    main()
