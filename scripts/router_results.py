"""The runs behind docs/results/router.md: every outcome set, replay share, seed and tier.

    python scripts/router_results.py OUT.json [DATA_DIR | --shared DIR] [--seeds 0 1 2] [--shares 0.25 1.0]
        [--sets gsm8k mmlu llmrouter routerarena] [--tier minilm|static] [--cache-dir DIR]
        [--override head.prior_strength=10 ...]

DATA_DIR holds the public outcome sets (`routellm/mmlu/responses/`, `llmrouter/`,
`routerarena/`); default DIR/outcomes of `--shared DIR` or $REPLAYLAB_SHARED_DATA (what to
download: docs/howto/import-data.md), needed unless only gsm8k runs; GSM8K is the package resource
(`replaylab.apps.inputs.default_outcomes`). Each run composes the training config
(conf/train.yaml, `pipeline=router seed=<seed>`, Hydra's compose API),
applies the set's candidates and costs (`replaylab.router.public_sets`), the
replay share and any `--override KEY=VALUE` (a dotted key of the `router` config,
a YAML value), and calls `train_router` with the tier's encoder export from
`--cache-dir` (default the config's `router.encoder.cache_dir`): `encoder-minilm`
(run `make run` once to export it) or, for `--tier static`, `encoder-static`
(`python -m training pipeline=router router.encoder.tier=static` once), and the
embedding cache `embeddings/` there. One JSON line per run on stdout (its `tier`,
every policy's `<policy>_cr95` / `<policy>_apgr`, `rules_equal` included, the paired
gaps), all of them in OUT.json.
"""

from __future__ import annotations

import argparse
import copy
import json
import time
import traceback
from pathlib import Path
from typing import Any

import yaml
from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf

from replaylab.apps.inputs import default_outcomes
from replaylab.apps.schemas import register_schemas
from replaylab.apps.shared_data import add_shared_argument, shared_data_or_exit
from replaylab.pipelines.router import train_router
from replaylab.router.embed_cache import cached_embed
from replaylab.router.pipeline_config import router_config
from replaylab.router.public_sets import SETS, public_outcome_sets, result_row

REPO = Path(__file__).resolve().parents[1]
SHARES = (0.25, 1.0)
TIERS = ("minilm", "static")


def router_values(seed: int) -> dict:
    """The composed `router` config at `seed` as plain values (encoder settings included)."""
    register_schemas()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose(config_name="train", overrides=["pipeline=router", f"seed={seed}"],
                      return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)  # resolves ${hydra:runtime.cwd}
    return OmegaConf.to_container(cfg.router, resolve=True)


def load_tier_encoder(tier: str, cache_dir: Path, enc: dict) -> Any:
    """The tier's cached encoder export (the static runtime is imported only for it)."""
    if tier == "static":
        from replaylab.runtime.static_encoder import load_static_encoder  # noqa: PLC0415

        return load_static_encoder(cache_dir / "encoder-static")
    from replaylab.runtime.encoder import load_encoder  # noqa: PLC0415

    return load_encoder(cache_dir / "encoder-minilm", variant=enc["variant"],
                        threads=int(enc["threads"]))


def apply_overrides(values: dict, overrides: list[str]) -> dict:
    """`a.b=v` sets values["a"]["b"] = yaml(v) (a new mapping where missing)."""
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"--override {item!r}: expected KEY=VALUE")
        *path, last = key.split(".")
        node = values
        for part in path:
            node = node.setdefault(part, {})
        node[last] = yaml.safe_load(raw)
    return values


def run_all(args: argparse.Namespace) -> list[dict]:
    base0 = router_values(args.seeds[0])
    enc = base0["encoder"]
    cache_dir = Path(args.cache_dir or enc["cache_dir"])
    encoder = load_tier_encoder(args.tier, cache_dir, enc)
    embed, _ = cached_embed(encoder, cache_dir / "embeddings")
    scorer = "numpy" if args.tier == "static" else "onnx"  # how the runtime scores the head
    rows, replicates = [], []
    for name, outcomes, over in public_outcome_sets(outcomes_root(args), default_outcomes(),
                                                    tuple(args.sets)):
        for seed in args.seeds:
            base = router_values(seed)
            base.pop("encoder")
            for share in args.shares:
                vals = apply_overrides({**copy.deepcopy(base), **copy.deepcopy(over)},
                                       args.override)
                vals["replay"]["share"] = share
                out = Path(args.runs_dir) / f"{name}_{args.tier}_{share}_s{seed}"
                t = time.perf_counter()
                try:
                    kw = {"head_scorer": scorer} if scorer != "onnx" else {}
                    s, run = train_router(outcomes, router_config(vals), out, embed, **kw)
                except Exception as exc:  # noqa: BLE001 - record and go on to the next run
                    traceback.print_exc()
                    rows.append({"data": name, "tier": args.tier, "replay": share, "seed": seed,
                                 "error": str(exc)[:300]})
                    continue
                rows.append(result_row(name, share, seed, s, time.perf_counter() - t,
                                       tier=args.tier))
                replicates.append({"data": name, "tier": args.tier, "replay": share,
                                   "seed": seed, **{k: v.tolist() for k, v in
                                                    run.gap_replicates.items()}})
                print(json.dumps(rows[-1], default=str), flush=True)
    if args.replicates:
        args.replicates.write_text(json.dumps(replicates))
    return rows


def add_outcomes_arguments(ap: argparse.ArgumentParser) -> None:
    """DATA_DIR (the outcome sets' folder) or --shared DIR (DATA_DIR = DIR/outcomes)."""
    ap.add_argument("data_dir", nargs="?", default=None,
                    help="the public outcome sets' folder (default: DIR/outcomes of --shared)")
    add_shared_argument(ap)


def outcomes_root(args: argparse.Namespace) -> str:
    """DATA_DIR as given, else DIR/outcomes of --shared / $REPLAYLAB_SHARED_DATA (one line and
    exit code 2 without either); unused ('') when only gsm8k (the package resource) runs."""
    if args.data_dir:
        return str(args.data_dir)
    if set(args.sets) <= {"gsm8k"}:
        return ""
    return str(shared_data_or_exit(args.shared) / "outcomes")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path, help="OUT.json: every run's row")
    add_outcomes_arguments(ap)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--shares", type=float, nargs="+", default=list(SHARES))
    ap.add_argument("--sets", nargs="+", choices=SETS, default=list(SETS))
    ap.add_argument("--tier", choices=TIERS, default="minilm")
    ap.add_argument("--cache-dir", default=None,
                    help="encoder exports and embeddings (default router.encoder.cache_dir)")
    ap.add_argument("--override", nargs="*", default=[], metavar="KEY=VALUE",
                    help="router config values, e.g. head.prior_strength=10")
    ap.add_argument("--runs-dir", default="outputs/router_results",
                    help="where each run's tables go")
    ap.add_argument("--replicates", type=Path, default=None,
                    help="also write each run's bootstrap replicates of the learned - rules "
                         "cost_ratio_at_95 gaps here (paired intervals of means over seeds)")
    args = ap.parse_args()
    rows = run_all(args)
    args.out.write_text(json.dumps(rows, indent=1, default=str))


if __name__ == "__main__":
    main()
