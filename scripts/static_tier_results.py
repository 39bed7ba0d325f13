"""The static tier tuned on the team's prompts, against MiniLM (docs/results/static-tier.md).

    python scripts/static_tier_results.py OUT.json [DATA_DIR | --shared DIR] [--seeds 0 1 2]
        [--sets gsm8k mmlu llmrouter] [--share 0.25] [--cache-dir DIR] [--work DIR]
        [--override head.num_threads=1 ...]

Per set and seed, with the default config (`pipeline=router seed=<s>`, the set's candidates
and costs from `replaylab.router.public_sets`, as `scripts/router_results.py` runs them):

1. the run's own seeded split (`replaylab.pipelines.router.seeded_split`, the split
   `train_router` makes);
2. model2vec's distillation of MiniLM (`distill_minilm`, or the plain export in
   `--cache-dir`/encoder-static when there: `static_model_from_export`) tuned on the training split's
   prompts, its ridge penalty chosen on the calibration split's prompts
   (`replaylab.router.static_encoder.tune_on_prompts`: MiniLM's vectors of those prompts
   are the targets). No test prompt enters the table;
3. the tuned table exported (`export_static_encoder`, parity texts from the training
   split) into `--work`/<set>_s<seed>/encoder-static and loaded by the serving runtime;
4. `train_router` on it with the numpy head scorer, as the static tier trains.

`--cache-dir` holds the MiniLM export (`encoder-minilm`) and the embedding cache, as for
router_results.py. One JSON line per run (`tier` = `static-tuned`, the columns of
router_results.py, plus `tuning`: ridge, calibration cosines, and the mean cosine of the
tuned vectors to MiniLM's on test prompts, a diagnostic only), all of them in OUT.json.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from router_results import add_outcomes_arguments, apply_overrides, outcomes_root, router_values  # noqa: E402

from replaylab.apps.inputs import default_outcomes  # noqa: E402
from replaylab.artifacts.static_export import export_static_encoder  # noqa: E402
from replaylab.contracts.columns import Outcomes as O  # noqa: E402
from replaylab.pipelines.router import seeded_split, train_router  # noqa: E402
from replaylab.router.embed_cache import cached_embed  # noqa: E402
from replaylab.router.pipeline_config import router_config  # noqa: E402
from replaylab.router.public_sets import public_outcome_sets, result_row  # noqa: E402
from replaylab.router.replay import outcome_matrix  # noqa: E402
from replaylab.router.static_encoder import (  # noqa: E402
    distill_minilm,
    static_model_from_export,
    tune_on_split,
)
from replaylab.runtime.encoder import load_encoder  # noqa: E402
from replaylab.runtime.static_encoder import load_static_encoder  # noqa: E402

TIER = "static-tuned"
SETS = ("gsm8k", "mmlu", "llmrouter")


def prompt_texts(outcomes, prompt_ids) -> list[str]:
    """The first text of each prompt id, in `prompt_ids` order (what train_router embeds)."""
    first = outcomes.drop_duplicates(O.PROMPT_ID).set_index(O.PROMPT_ID)[O.PROMPT_TEXT]
    return first.reindex(prompt_ids).fillna("").astype(str).tolist()


def run_all(args: argparse.Namespace) -> list[dict]:
    base0 = router_values(args.seeds[0])
    enc = base0["encoder"]
    cache_dir = Path(args.cache_dir or enc["cache_dir"])
    minilm = load_encoder(cache_dir / "encoder-minilm", variant=enc["variant"],
                          threads=int(enc["threads"]))
    embed_minilm, _ = cached_embed(minilm, cache_dir / "embeddings")
    plain = cache_dir / "encoder-static"  # the plain distillation, when exported there
    base_model = static_model_from_export(plain) if plain.is_dir() else distill_minilm()
    rows = []
    for name, outcomes, over in public_outcome_sets(outcomes_root(args), default_outcomes(),
                                                    tuple(args.sets)):
        for seed in args.seeds:
            base = router_values(seed)
            base.pop("encoder")
            vals = apply_overrides({**copy.deepcopy(base), **copy.deepcopy(over)},
                                   args.override)
            vals["replay"]["share"] = args.share
            cfg = router_config(vals)
            t = time.perf_counter()
            m = outcome_matrix(outcomes, cfg.cost, candidates=cfg.candidates)
            texts = np.array(prompt_texts(outcomes, m.prompt_ids), dtype=object)
            split = seeded_split(m.n_prompts, cfg.split, cfg.seed)
            y = np.asarray(embed_minilm(texts.tolist()), dtype=np.float64)
            fit, test = split == "train", split == "test"
            tuned, tuning = tune_on_split(base_model, texts.tolist(), y, split)
            folder = Path(args.work) / f"{name}_s{seed}" / "encoder-static"
            export_static_encoder(tuned, folder, parity_texts=texts[fit][:500].tolist(),
                                  overwrite=True, tuning=tuning)
            encoder = load_static_encoder(folder)
            embed, _ = cached_embed(encoder, Path(args.work) / "embeddings")
            v = np.asarray(embed(texts[test].tolist()), dtype=np.float64)
            test_cos = float(np.mean(np.sum(v * y[test], axis=1)))
            tune_s = time.perf_counter() - t
            out = Path(args.runs_dir) / f"{name}_{TIER}_{args.share}_s{seed}"
            s, _run = train_router(outcomes, cfg, out, embed, head_scorer="numpy")
            row = result_row(name, args.share, seed, s, time.perf_counter() - t, tier=TIER)
            chosen = [c for c in (s.get("head_selection") or {}).get("candidates", [])
                      if c.get("chosen")]
            # the chosen head's calibration criterion: what a choice between the plain and
            # the tuned table on this run's calibration split would compare
            row["calibration_criterion"] = chosen[0].get("criterion") if chosen else None
            row["tuning"] = {**tuning.as_dict(), "encoder_id": encoder.encoder_id,
                             "test_mean_cosine_to_minilm": round(test_cos, 6),
                             "tune_seconds": round(tune_s, 1)}
            rows.append(row)
            print(json.dumps(row, default=str), flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path, help="OUT.json: every run's row")
    add_outcomes_arguments(ap)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--share", type=float, default=0.25)
    ap.add_argument("--sets", nargs="+", choices=SETS, default=list(SETS))
    ap.add_argument("--cache-dir", default=None,
                    help="the MiniLM export and embeddings (default router.encoder.cache_dir)")
    ap.add_argument("--work", default="outputs/static_tier",
                    help="where the tuned exports and their embeddings go")
    ap.add_argument("--override", nargs="*", default=[], metavar="KEY=VALUE",
                    help="router config values, e.g. head.num_threads=1")
    ap.add_argument("--runs-dir", default="outputs/static_tier/runs",
                    help="where each run's tables go")
    args = ap.parse_args()
    rows = run_all(args)
    args.out.write_text(json.dumps(rows, indent=1, default=str))


if __name__ == "__main__":
    main()
