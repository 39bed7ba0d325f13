"""The runs behind docs/results-router.md: every outcome set, replay share 0.25 and 1.0.

    SEED=0 .venv/bin/python scripts/router_results.py OUT.json [DATA_DIR]

DATA_DIR holds the public outcome sets (default ../shared/data/outcomes, see
../shared/data/SOURCES.md); GSM8K comes from the repo's data/. Each run calls
`train_router` with conf/router/default.yaml, the given seed everywhere, and the
fp32 ONNX MiniLM encoder from outputs/cache (run `make run` once to export it);
embeddings are cached under outputs/cache/embeddings. One JSON line per run on
stdout, all of them in OUT.json.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path

import yaml

from replaylab.pipelines.router import train_router
from replaylab.router.embed_cache import CachedEncoder, EmbeddingCache
from replaylab.router.pipeline_config import router_config
from replaylab.runtime.encoder import load_encoder
from replaylab.sources.llmrouter import import_llmrouter, load_llmrouter_prices
from replaylab.sources.routellm import import_routellm_gsm8k, import_routellm_mmlu
from replaylab.sources.routerarena import import_routerarena

POLICIES = ("learned", "rules", "random", "knn", "lgbm", "oracle")


def _sets(root: str):
    yield "gsm8k", import_routellm_gsm8k("data/routellm_gsm8k/gsm8k_responses.csv"), {}
    yield "mmlu", import_routellm_mmlu(f"{root}/routellm/mmlu/responses"), {}
    prices = load_llmrouter_prices(f"{root}/llmrouter/llm_candidates/default_llm.json")
    lr = import_llmrouter(f"{root}/llmrouter/dcrouter_preprocessed")
    c = prices.loc[sorted(lr.candidate.unique())]
    c = c.assign(t=c.input_usd_per_million + c.output_usd_per_million).sort_values(
        ["t", "output_usd_per_million"])  # cheapest first, by list price
    yield "llmrouter", lr, {"candidates": list(c.index), "cost": {
        "prices": {}, "call_cost_usd": {k: float(r.t * 250 / 1e6) for k, r in c.iterrows()}}}
    ra = import_routerarena(f"{root}/routerarena")
    yield "routerarena", ra, {"candidates": list(ra.groupby("candidate").cost.mean()
                                                 .sort_values().index),
                              "cost": {"prices": {}, "call_cost_usd": {}}}


def main(out_path: str, root: str) -> None:
    seed = int(os.environ.get("SEED", "0"))
    enc = load_encoder("outputs/cache/encoder-minilm", threads=2)
    cache = EmbeddingCache(enc.encoder_id, enc.dimension, path="outputs/cache/embeddings")
    cached = CachedEncoder(enc, cache)

    def embed(texts: list[str]):
        out = cached.encode(texts)
        cache.flush()
        return out

    base = yaml.safe_load(Path("conf/router/default.yaml").read_text())
    base.pop("encoder")
    base["seed"] = seed
    for k in ("exploration", "replay", "evaluation"):
        base[k]["seed"] = seed
    rows = []
    for name, outcomes, over in _sets(root):
        for share in (0.25, 1.0):
            vals = json.loads(json.dumps(base))
            vals.update(over)
            vals["replay"]["share"] = share
            t = time.perf_counter()
            try:
                s, _ = train_router(outcomes, router_config(vals),
                                    Path(f"outputs/router_results/{name}_{share}_s{seed}"), embed)
            except Exception as exc:  # noqa: BLE001 - record and go on to the next set
                traceback.print_exc()
                rows.append({"data": name, "replay": share, "seed": seed, "error": str(exc)[:300]})
                continue
            r = {"data": name, "replay": share, "seed": seed, "prompts": s["prompts"],
                 "explored": s["exploration"]["explored_sessions"],
                 "seconds": round(time.perf_counter() - t, 1)}
            for p in POLICIES:
                r[f"{p}_cr95"] = s["test"][p]["cost_ratio_at_95"]
                r[f"{p}_apgr"] = s["test"][p]["apgr"]
            r.update({f"ope_{k}": (s["ope"][k]["estimate"], s["ope"][k]["ci"])
                      for k in ("ips", "snips", "dr")})
            r.update(truth=s["ope"]["truth"], go=s["go"], go_reasons=s["go_reasons"],
                     days_needed=s["go_detail"]["days_needed"])
            rows.append(r)
            print(json.dumps(r, default=str), flush=True)
    Path(out_path).write_text(json.dumps(rows, indent=1, default=str))


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "../shared/data/outcomes")
