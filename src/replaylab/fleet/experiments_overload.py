"""Fleet experiment `overload`: arrivals at 1x, 1.5x, 2x the fleet's capacity, with and
without admission; every request is accounted for at every load.
Shared pieces (pools, pooled summaries) live in `experiments.py`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from replaylab.config import ConfigError
from replaylab.fleet.experiments import (
    build_pools,
    ci_table,
    make_policy,
    parse_config,
    pooled_summary,
    pyplot,
    replicate_metrics,
    save_figure,
    sim_config,
    simulate,
    slo_targets,
    workload_text,
)
from replaylab.jsonsafe import json_safe


@dataclass(frozen=True)
class OverloadWorkload:
    """A synthetic stream (token CDF of a real trace) at `factor` x the fleet's capacity."""

    cdf: str = "azure_cdf.json"       # under shared_dir/fleet
    duration_s: float = 300.0
    arrival: str = "gamma"
    cv: float = 1.5
    hint_sigma: float = 0.5           # calibrated p90 hint, log-normal noise
    cancel_share: float = 0.05
    cancel_after_mean_s: float = 30.0
    seeds: tuple[int, ...] = (0, 1, 2)


@dataclass(frozen=True)
class OverloadConfig:
    shared_dir: str
    seed: int = 0
    model: str = "llama-3.1-8b"
    load_factors: tuple[float, ...] = (1.0, 1.5, 2.0)
    workload: OverloadWorkload = field(default_factory=OverloadWorkload)
    pools: dict = field(default_factory=dict)
    policies: dict = field(default_factory=dict)
    sim: dict = field(default_factory=dict)
    slo: dict = field(default_factory=dict)
    capacity_rps: float | None = None  # null: estimated from the profiles (capacity_estimate)


def capacity_estimate(pools: Sequence, prompt: np.ndarray, completion: np.ndarray) -> dict:
    """Requests/s the fleet can finish at full batch (analytic, from its profiles).

    Per replica the batch is min(max_batch, KV capacity / mean reservation); one
    iteration then takes base + per_seq * B + per_kv * K + prefill per chunk; a
    request occupies its slot for ceil(p / chunk) + c - 1 iterations. Queueing,
    head-of-line blocking and batch formation are ignored: an upper bound.
    """
    out = {"pools": {}, "rps": 0.0}
    total = prompt + completion
    for p in pools:
        prof = p.profile
        blk = prof.kv_block_tokens
        reserve = float(np.mean(np.ceil(total / blk) * blk))
        b = max(1.0, min(float(prof.max_batch), prof.kv_capacity_tokens / reserve))
        pf = np.maximum(1, np.ceil(prompt / prof.chunk_tokens))
        iters = float(np.mean(pf + completion - 1))
        share_pf = float(np.mean(pf)) / iters
        dt = prof.iteration_s(b, b * reserve / 2.0, b * share_pf)
        rps = p.replicas * b / (dt * iters)
        out["pools"][p.pool_id] = {"batch": b, "iteration_s": dt, "rps": rps}
        out["rps"] += rps
    return out


def run_overload_experiment(cfg: Mapping[str, Any], run_dir: Path) -> dict[str, Any]:
    """Arrivals ramped past capacity; every policy conserves requests, with/without admission."""
    from replaylab.fleet.workload import SyntheticWorkloadConfig, workload_from_cdf

    c = parse_config(OverloadConfig, cfg, {"workload": OverloadWorkload})
    if not c.pools or not c.policies:
        raise ConfigError("experiment=overload needs pools and policies")
    slo = slo_targets(c.slo)
    pools = build_pools(c.pools, c.shared_dir, c.model)
    cdf = Path(c.shared_dir) / "fleet" / c.workload.cdf
    if not cdf.is_file():
        raise FileNotFoundError(f"{cdf}: token CDF (paths.shared_dir/fleet)")
    probe = workload_from_cdf(cdf, SyntheticWorkloadConfig(n_requests=20_000), seed=c.seed)
    cap = capacity_estimate(pools, probe.prompt_tokens, probe.completion_tokens)
    cap_rps = float(c.capacity_rps or cap["rps"])
    names = list(c.policies)
    runs: dict[str, dict[str, list]] = {}
    n_total = 0
    for f in c.load_factors:
        rate = cap_rps * float(f)
        key = f"{float(f):g}x"
        runs[key] = {n: [] for n in names}
        for s in c.workload.seeds:
            n_req = max(1, int(round(rate * c.workload.duration_s)))
            w = workload_from_cdf(cdf, SyntheticWorkloadConfig(
                n_requests=n_req, rate_per_s=rate, arrival=c.workload.arrival, cv=c.workload.cv,
                hint_sigma=c.workload.hint_sigma, cancel_share=c.workload.cancel_share,
                cancel_after_mean_s=c.workload.cancel_after_mean_s, models=(c.model,)),
                seed=c.seed * 1000 + int(s))
            n_total += w.n
            conf = sim_config(c.sim, w)
            for n in names:
                runs[key][n].append(simulate(pools, conf, make_policy(c.policies[n]), w))
    policies: dict[str, dict] = {}
    by_load: dict[str, dict] = {}
    for key, per in runs.items():
        by_load[key] = {}
        for n, results in per.items():
            s = pooled_summary(results, slo)
            policies[f"{n}@{key}"] = s
            reasons: dict[str, int] = {}
            for r in results:
                for k, v in r.reject_reasons.items():
                    reasons[k] = reasons.get(k, 0) + int(v)
            by_load[key][n] = {"summary": s, "reject_reasons": reasons,
                               "ci95": ci_table(replicate_metrics(results, slo))}
    desc = workload_text(
        f"synthetic from the {c.workload.cdf} token CDF (Azure LLM 2023), "
        f"{c.workload.arrival} arrivals cv={c.workload.cv:g}", n_total,
        f"{len(c.workload.seeds)} seeds x {len(c.load_factors)} load factors of "
        f"{cap_rps:.2f} req/s, {c.workload.duration_s:g} s each, "
        f"{c.workload.cancel_share:.0%} client cancellations, p90 hint sigma "
        f"{c.workload.hint_sigma:g}")
    summary: dict[str, Any] = {
        "experiment": "overload", "workload": desc, "policies": policies,
        "conserved": all(p["conserved"] for p in policies.values()),
        "capacity": {"rps": cap_rps, "estimated": json_safe(cap),
                     "stated": c.capacity_rps is not None},
        "load_factors": list(c.load_factors), "by_load": by_load,
        "fleet": {p.pool_id: {"profile": p.profile.name, "replicas": p.replicas}
                  for p in pools},
    }
    summary["answer"] = _overload_answer(summary, names)
    summary["reports"] = _overload_figures(summary, names, Path(run_dir) / "figures")
    return json_safe(summary)


def _overload_answer(s: dict, names: list[str]) -> str:
    runs = len(s["policies"])
    ok = sum(bool(p["conserved"]) for p in s["policies"].values())
    parts = [f"Requests are conserved in {ok}/{runs} policy x load runs (arrived = completed + "
             f"rejected + timed_out + cancelled). Capacity estimate {s['capacity']['rps']:.1f} "
             "req/s (an upper bound)."]
    for key in (f"{float(f):g}x" for f in s["load_factors"]):
        cells = []
        for n in names:
            x = s["by_load"][key][n]["summary"]
            a = x["arrived"] or 1
            cells.append(f"{n} SLO {x['slo_attainment']:.3f}, goodput {x['goodput_rps']:.1f}/s, "
                         f"rejected {100 * x['rejected'] / a:.0f}%, timed out "
                         f"{100 * x['timed_out'] / a:.0f}%")
        parts.append(f"At {key}: " + "; ".join(cells) + ".")
    return " ".join(parts)


def _overload_figures(summary: dict, names: list[str], out: Path) -> dict[str, str]:
    plt = pyplot()
    loads = summary["load_factors"]
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    panels = (("goodput_rps", "goodput (req/s within SLO)"),
              ("slo_attainment", "SLO attainment"), ("ttft_p99_s", "TTFT p99 (s)"))
    for ax, (key, label) in zip(axes, panels, strict=True):
        for n in names:
            ys, lo, hi = [], [], []
            for f in loads:
                cell = summary["by_load"][f"{float(f):g}x"][n]
                ys.append(cell["summary"][key])
                ci = cell["ci95"].get(key, {}).get("ci95", [None, None])
                lo.append(ci[0])
                hi.append(ci[1])
            ys_a = np.array([np.nan if v is None else v for v in ys], dtype=float)
            ax.plot(loads, ys_a, marker="o", label=n)
            if all(v is not None for v in lo + hi):
                ax.fill_between(loads, lo, hi, alpha=0.15)
        ax.set_xlabel("offered load / estimated capacity")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle("Overload: offered load beyond capacity, with and without admission")
    return {"overload": save_figure(fig, plt, out / "overload.png")}
