"""Planned against random replays (issue 46): the tables and the learning curve of
docs/results/router.md "Which prompts to replay".

    python scripts/router_results_selection.py --arm planned P.json P-reps.json \
        --arm random R.json R-reps.json [--arm ...] [--seeds 0 1 2]
        [--figure docs/figures/router-replay-curve.png]

Each --arm names a selection, a `scripts/router_results.py` OUT.json (its rows: one per
set x share x seed) and that run's `--replicates` file. Rows of one set, share and seed
are paired across arms: the same split, the same test prompts and the same bootstrap draws
of them (`evaluation.n_boot`, the seed), and the full-information rules are the same fit,
so replicate i of (learned - rules) in one arm minus replicate i in the other is a
replicate of planned - random. The paired 95% interval of the mean over seeds averages
replicate i over the seeds. Prints markdown: per share and set the learned router's
`cost_ratio_at_95` on test per seed and its mean for each arm, the rules, planned - random
with its interval, and whether learned < rules on every seed; and writes the figure.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import numpy as np

NAMES = {"gsm8k": "GSM8K", "mmlu": "MMLU", "llmrouter": "LLMRouter", "routerarena": "RouterArena"}
TARGETS = {"gsm8k": 0.60, "mmlu": 0.39, "llmrouter": 0.31}  # issue 46: half the gap closed
PAIR = "learned-rules"


def load(arms: list[list[str]]) -> tuple[dict, dict]:
    """{(arm, set, share, seed): row} and {(arm, set, share, seed): (n_boot,) replicates}."""
    rows, reps = {}, {}
    for arm, out, rep in arms:
        for r in json.loads(Path(out).read_text()):
            if "error" not in r:
                rows[(arm, r["data"], float(r["replay"]), int(r["seed"]))] = r
        for r in json.loads(Path(rep).read_text()):
            if PAIR in r:
                reps[(arm, r["data"], float(r["replay"]), int(r["seed"]))] = np.asarray(r[PAIR])
    return rows, reps


def paired(reps: dict, a: str, b: str, data: str, share: float, seeds: list[int]) -> list:
    """Paired 95% interval of mean over seeds of (a - b) in learned cost_ratio_at_95."""
    d = [reps[(a, data, share, s)] - reps[(b, data, share, s)] for s in seeds
         if (a, data, share, s) in reps and (b, data, share, s) in reps]
    if len(d) != len(seeds) or not d:
        return [float("nan"), float("nan")]
    m = np.nanmean(np.stack(d), axis=0)
    return [float(np.nanpercentile(m, 2.5)), float(np.nanpercentile(m, 97.5))]


def cells(rows: dict) -> dict:
    """(set, share) -> arm -> {seed: row}."""
    out: dict = defaultdict(lambda: defaultdict(dict))
    for (arm, data, share, seed), r in rows.items():
        out[(data, share)][arm][seed] = r
    return out


def f3(x: float) -> str:
    return "n/a" if x is None or not np.isfinite(x) else f"{x:.3f}"


def table(rows: dict, reps: dict, arms: list[str], targets: bool = True) -> str:
    a, b = arms[0], arms[1]
    head = (f"| set | share | {a} (per seed) | {a} mean | {b} (per seed) | {b} mean | rules mean "
            f"| {a} - {b}: mean, paired 95% | {a} < rules on every seed | target |")
    lines = [head, "|" + "---|" * 10]
    grid = cells(rows)
    for (data, share) in sorted(grid, key=lambda k: (k[1], list(NAMES).index(k[0]))):
        by = grid[(data, share)]
        seeds = sorted(set(by.get(a, {})) & set(by.get(b, {})))
        if not seeds:
            continue
        va = [by[a][s]["learned_cr95"] for s in seeds]
        vb = [by[b][s]["learned_cr95"] for s in seeds]
        ru = [by[a][s]["rules_cr95"] for s in seeds]
        ci = paired(reps, a, b, data, share, seeds)
        below = all(x < y for x, y in zip(va, ru, strict=True))
        tgt = TARGETS.get(data)
        met = "" if tgt is None or share != 0.25 or not targets else (
            f"<= {tgt:.2f}: {'met' if np.mean(va) <= tgt else f'missed by {np.mean(va) - tgt:.3f}'}")
        lines.append(
            f"| {NAMES.get(data, data)} | {share:g} | {' / '.join(f3(x) for x in va)} "
            f"| {f3(np.mean(va))} | {' / '.join(f3(x) for x in vb)} | {f3(np.mean(vb))} "
            f"| {f3(np.mean(ru))} | {np.mean(va) - np.mean(vb):+.3f} [{ci[0]:+.3f}, {ci[1]:+.3f}]"
            f"{' **significant**' if ci[0] > 0 or ci[1] < 0 else ''} "
            f"| {'yes' if below else 'no'} ({sum(x < y for x, y in zip(va, ru, strict=True))}"
            f"/{len(seeds)}) | {met} |")
    return "\n".join(lines)


def figure(rows: dict, arms: list[str], path: Path) -> None:
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    grid = cells(rows)
    sets = [d for d in NAMES if any(k[0] == d for k in grid)]
    fig, axes = plt.subplots(1, len(sets), figsize=(4.2 * len(sets), 3.4), squeeze=False)
    for ax, data in zip(axes[0], sets, strict=True):
        shares = sorted(s for (d, s) in grid if d == data)
        for arm in arms:
            xs, ys, lo, hi = [], [], [], []
            for s in shares:
                v = [r["learned_cr95"] for r in grid[(data, s)].get(arm, {}).values()]
                if v:
                    xs.append(s)
                    ys.append(np.mean(v))
                    lo.append(min(v))
                    hi.append(max(v))
            ax.plot(xs, ys, marker="o", label=f"learned, {arm}")
            ax.fill_between(xs, lo, hi, alpha=0.15)
        ru = [r["rules_cr95"] for s in shares for arm in arms
              for r in grid[(data, s)].get(arm, {}).values()]
        if ru:
            ax.axhline(np.mean(ru), color="gray", ls="--", label="rules (full information)")
        if data in TARGETS:
            ax.axhline(TARGETS[data], color="red", ls=":", label="issue 46 target")
        ax.set_xscale("log")
        ax.minorticks_off()
        ax.set_xticks(shares, [f"{s:g}" for s in shares])
        ax.set_title(NAMES[data])
        ax.set_xlabel("replay share")
        ax.set_ylabel("cost_ratio_at_95 on test")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arm", nargs=3, action="append", required=True,
                    metavar=("SELECTION", "OUT_JSON", "REPLICATES_JSON"))
    ap.add_argument("--figure", type=Path, default=None)
    ap.add_argument("--seeds", type=int, nargs="+", default=None,
                    help="only these seeds (e.g. the seeds every share was run with)")
    args = ap.parse_args()
    arms = list(dict.fromkeys(a[0] for a in args.arm))
    if len(arms) != 2:
        raise SystemExit("error: --arm must name exactly two selections (e.g. planned, random)")
    rows, reps = load(args.arm)
    if args.seeds is not None:
        rows = {k: v for k, v in rows.items() if k[3] in args.seeds}
    print(table(rows, reps, arms, targets=args.seeds is None))  # targets: 3-seed means
    if args.figure:
        figure(rows, arms, args.figure)
        print(f"\nfigure: {args.figure}")


if __name__ == "__main__":
    main()
