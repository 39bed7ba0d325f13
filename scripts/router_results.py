"""The runs behind docs/results-router.md: every outcome set, replay share 0.25 and 1.0.

    python scripts/router_results.py OUT.json [DATA_DIR] [--seeds 0 1 2]

DATA_DIR holds the public outcome sets (default ../shared/data/outcomes, see
../shared/data/SOURCES.md); GSM8K is the package resource
(`replaylab.apps.router.default_outcomes`). Each run composes the training config
(conf/train.yaml, `pipeline=router seed=<seed>`, Hydra's compose API),
applies the set's candidates and costs (`replaylab.router.public_sets`) and the
replay share, and calls `train_router` with the config's encoder export
(`router.encoder.cache_dir`/encoder-minilm: run `make run` once to export it) and
its embedding cache. One JSON line per run on stdout, all of them in OUT.json.
"""

from __future__ import annotations

import argparse
import copy
import json
import time
import traceback
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf

from replaylab.apps.router import default_outcomes
from replaylab.apps.schemas import register_schemas
from replaylab.pipelines.router import train_router
from replaylab.router.embed_cache import cached_embed
from replaylab.router.pipeline_config import router_config
from replaylab.router.public_sets import public_outcome_sets, result_row
from replaylab.runtime.encoder import load_encoder

REPO = Path(__file__).resolve().parents[1]
SHARES = (0.25, 1.0)


def router_values(seed: int) -> dict:
    """The composed `router` config at `seed` as plain values (encoder settings included)."""
    register_schemas()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose(config_name="train", overrides=["pipeline=router", f"seed={seed}"],
                      return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)  # resolves ${hydra:runtime.cwd}
    return OmegaConf.to_container(cfg.router, resolve=True)


def run_seed(seed: int, root: str) -> list[dict]:
    base = router_values(seed)
    enc = base.pop("encoder")
    encoder = load_encoder(Path(enc["cache_dir"]) / "encoder-minilm", variant=enc["variant"],
                           threads=int(enc["threads"]))
    embed, _ = cached_embed(encoder, Path(enc["cache_dir"]) / "embeddings")
    rows = []
    for name, outcomes, over in public_outcome_sets(root, default_outcomes()):
        for share in SHARES:
            vals = {**copy.deepcopy(base), **over}
            vals["replay"]["share"] = share
            t = time.perf_counter()
            try:
                s, _ = train_router(outcomes, router_config(vals),
                                    Path(f"outputs/router_results/{name}_{share}_s{seed}"), embed)
            except Exception as exc:  # noqa: BLE001 - record and go on to the next set
                traceback.print_exc()
                rows.append({"data": name, "replay": share, "seed": seed, "error": str(exc)[:300]})
                continue
            rows.append(result_row(name, share, seed, s, time.perf_counter() - t))
            print(json.dumps(rows[-1], default=str), flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path, help="OUT.json: every run's row")
    ap.add_argument("data_dir", nargs="?", default="../shared/data/outcomes")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    args = ap.parse_args()
    rows = [r for seed in args.seeds for r in run_seed(seed, args.data_dir)]
    args.out.write_text(json.dumps(rows, indent=1, default=str))


if __name__ == "__main__":
    main()
