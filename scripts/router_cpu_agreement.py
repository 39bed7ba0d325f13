"""Router decisions across CPUs (issue 12): the same artifact served on AVX-512 VNNI and AVX2.

A router artifact built on one machine is served on another whose onnxruntime
kernels differ, so its P(success) differ by the encoder's rounding and a
decision sitting on the threshold may flip. This script measures how many do.

    P=.venv/bin/python; S=scripts/router_cpu_agreement.py; D=outputs/router_cpu
    $P $S prepare --run outputs/make-run/router --out $D --n 60   # native: pick queries
    $P $S route --out $D --cpu native                             # runtime only
    qemu-x86_64 -cpu Haswell $P $S route --out $D --cpu qemu-haswell   # AVX2 model, slow
    $P $S report --out $D --json docs/results/router-cpus.json

`prepare` takes the run's test decisions (`router_decisions_test.parquet`) and
the prompts from the run's outcome table, and keeps `--n` queries: half a seeded
random sample (the agreement a fleet sees) and half the test prompts nearest the
threshold under int8 (where flips happen). `route` needs only the runtime
(numpy, onnxruntime, tokenizers), so it runs under qemu-user; it routes each
query with every published encoder variant, one query per call, and records the
int8 kernel probe (`replaylab.contracts.golden.int8_kernel_probe`), which says
which kernel family actually ran. `report` compares CPUs per variant: decision
agreement (on the random half and the near-threshold half), max |P(success)|
difference, and whether the golden-vector check passed.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def prepare(run: Path, out: Path, n: int, seed: int) -> None:
    import numpy as np
    import pandas as pd

    from replaylab.contracts import read_outcomes
    from replaylab.router.config import RouterCostConfig
    from replaylab.router.replay import Label, outcome_matrix

    summary = json.loads((run / "summary.json").read_text())
    decisions = pd.read_parquet(summary["artifacts"]["test_decisions"])
    origin = summary["data"]["outcomes"].split(":", 1)[-1]
    if origin.endswith(".csv"):  # the shipped RouteLLM GSM8K table, imported
        from replaylab.sources.routellm import import_routellm_gsm8k

        outcomes = import_routellm_gsm8k(origin)
    else:
        outcomes = read_outcomes(origin).valid
    # the prompt metadata (task, length) as training derived it; prices do not enter it
    flat = RouterCostConfig(call_cost_usd={c: 1.0 for c in summary["candidates"]})
    m = outcome_matrix(outcomes, flat, candidates=summary["candidates"])
    meta = m.meta.set_index(m.prompt_ids.astype(str))
    text = outcomes.drop_duplicates("prompt_id").set_index("prompt_id")["prompt_text"]
    rng = np.random.default_rng(seed)
    ids = decisions["prompt_id"].to_numpy()
    random = rng.choice(ids, size=min(n // 2, len(ids)), replace=False)
    # nearest the threshold: the run's fp32 margins (int8 ones are not in the run)
    near = decisions.sort_values("margin")["prompt_id"]
    near = [i for i in near if i not in set(random)][: n - len(random)]
    queries = [{"prompt_id": str(i), "part": part, "text": str(text[i]),
                "category": str(meta.loc[i, "task"]),
                "prompt_tokens": float(meta.loc[i, Label.PROMPT_LENGTH])}
               for part, chosen in (("random", random), ("near_threshold", near))
               for i in chosen]
    out.mkdir(parents=True, exist_ok=True)
    (out / "queries.json").write_text(json.dumps(
        {"artifact": str(run / "artifacts" / "router"), "queries": queries}, ensure_ascii=False))
    print(f"{len(queries)} queries -> {out / 'queries.json'}")


def route(out: Path, cpu: str, variants: list[str], limit: int | None) -> None:
    from replaylab.contracts.golden import int8_kernel_probe
    from replaylab.runtime import Router

    spec = json.loads((out / "queries.json").read_text())
    result = {"cpu": cpu, "probe": int8_kernel_probe(), "variants": {}}
    queries = spec["queries"]
    if limit is not None:  # as many of each part (random, near threshold), in order
        queries = [q for p in ("random", "near_threshold")
                   for q in [q for q in queries if q["part"] == p][:limit // 2]]
    for variant in variants:
        t0 = time.perf_counter()
        router = Router.load(spec["artifact"], variant=variant)
        load_s = time.perf_counter() - t0
        if not router.loaded or router.variant != variant:
            result["variants"][variant] = {"load_report": router.load_report()}
            continue
        rows = []
        for q in queries:
            d = router.route(q["text"], q["category"], q["prompt_tokens"])
            rows.append({"prompt_id": q["prompt_id"], "candidate": d.candidate,
                         "scores": [d.scores[c] for c in router.candidates]})
        result["variants"][variant] = {"load_seconds": load_s, "rows": rows,
                                       "load_report": router.load_report()}
        print(f"{cpu} {variant}: {len(rows)} routed, golden {router.golden_status}", flush=True)
    (out / f"routes-{cpu}.json").write_text(json.dumps(result))


def report(out: Path, json_out: Path | None) -> None:
    import numpy as np

    spec = json.loads((out / "queries.json").read_text())
    part = {q["prompt_id"]: q["part"] for q in spec["queries"]}
    runs = {p.stem.removeprefix("routes-"): json.loads(p.read_text())
            for p in sorted(out.glob("routes-*.json"))}
    base = runs.pop("native")
    figures: dict = {"native_probe": base["probe"], "cpus": {}}
    for cpu, run in runs.items():
        per = {"probe": run["probe"]}
        for variant, here in run["variants"].items():
            there = base["variants"].get(variant, {})
            if "rows" not in here or "rows" not in there:
                per[variant] = {"missing": True, "load_report": here.get("load_report")}
                continue
            a = {r["prompt_id"]: r for r in there["rows"]}
            b = {r["prompt_id"]: r for r in here["rows"]}
            ids = [i for i in a if i in b]
            same = np.array([a[i]["candidate"] == b[i]["candidate"] for i in ids])
            diff = np.array([np.abs(np.subtract(a[i]["scores"], b[i]["scores"])).max()
                             for i in ids])
            parts = np.array([part[i] for i in ids])
            per[variant] = {
                "n": len(ids), "agreement": float(same.mean()),
                **{f"agreement_{p}": float(same[parts == p].mean()) for p in set(parts)},
                "prob_max_abs_diff": float(diff.max()), "prob_mean_abs_diff": float(diff.mean()),
                "golden": (here["load_report"].get("golden") or {}).get("ok")}
        figures["cpus"][cpu] = per
    print(json.dumps(figures, indent=1))
    if json_out:
        json_out.write_text(json.dumps(figures, indent=1) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("--run", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--n", type=int, default=60)
    p.add_argument("--seed", type=int, default=0)
    r = sub.add_parser("route")
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--cpu", required=True)
    r.add_argument("--variants", nargs="+", default=["fp32", "int8"])
    r.add_argument("--limit", type=int, default=None,
                   help="route only this many queries (half random, half near the threshold); "
                        "fp32 under qemu is slow (TCG emulates AVX2 float math)")
    rep = sub.add_parser("report")
    rep.add_argument("--out", type=Path, required=True)
    rep.add_argument("--json", type=Path)
    args = ap.parse_args()
    if args.cmd == "prepare":
        prepare(args.run, args.out, args.n, args.seed)
    elif args.cmd == "route":
        route(args.out, args.cpu, args.variants, args.limit)
    else:
        report(args.out, args.json)


if __name__ == "__main__":
    main()
