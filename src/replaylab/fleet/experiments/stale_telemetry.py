"""Operating a serving policy on scraped telemetry: the `stale_telemetry` experiment.

`python -m evaluation experiment=stale_telemetry`: least-loaded routing on live
state against the same policy fed by modeled telemetry (`TelemetryFeed` as the
simulator's controller, scraped every `scrape_interval_s`) with a scrape outage
inside every window. `TelemetryAware` decides on telemetry while every eligible
replica's observation is fresh and on its deterministic fallback otherwise. The
summary counts decisions per mode, splits SLO attainment into requests that
arrived while the router was blind (outage start + ttl .. outage end + delay)
and the rest, and runs the telemetry-aware policy twice to show the fallback is
deterministic (identical decisions and identical per-request outcomes).
The workload is `fleet.workload`'s ledger (a file or a shipped trace); its time
windows are the replicates, each with its own outage.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from replaylab.config import ConfigError
from replaylab.fleet.experiments.harness import (
    GridRunner,
    SimExperimentConfig,
    build_pools,
    ci_table,
    local_grid,
    make_policy,
    masked_slo,
    pool_mapping,
    pooled_summary,
    pyplot,
    replicate_metrics,
    save_figure,
    sim_config,
    simulate,
)
from replaylab.fleet.experiments.workloads import require_source, trace_workloads
from replaylab.jsonsafe import json_safe
from replaylab.stats import paired_diff

# ---------------------------------------------------------------- stale telemetry


@dataclass(frozen=True)
class FeedSpec:
    scrape_interval_s: float = 1.0
    delay_s: float = 0.0
    ttl_s: float = 3.0
    outage_fraction: tuple[float, float] = (0.4, 0.6)  # of each window's duration


@dataclass(frozen=True)
class StaleConfig(SimExperimentConfig):
    pools: dict = field(default_factory=dict)
    policy: dict = field(default_factory=lambda: {"kind": "least_loaded"})
    feed: FeedSpec = field(default_factory=FeedSpec)


def _stale_config(cfg: Mapping[str, Any]) -> StaleConfig:
    c = StaleConfig.parse(cfg)
    a, b = c.feed.outage_fraction
    if not 0 <= a < b <= 1:
        raise ConfigError(f"experiment.feed.outage_fraction={c.feed.outage_fraction}: "
                          "need 0 <= start < end <= 1")
    if not c.pools:
        raise ConfigError("experiment=stale_telemetry needs pools")
    require_source(c.workload, "stale_telemetry")
    return c


def _telemetry_run(pools, conf, policy_spec, w, spec: FeedSpec, outage: tuple):
    from replaylab.fleet.telemetry.feed import TelemetryAware, TelemetryFeed

    feed = TelemetryFeed(scrape_interval_s=spec.scrape_interval_s, delay_s=spec.delay_s,
                         ttl_s=spec.ttl_s, outage=outage)
    pol = TelemetryAware(make_policy(policy_spec), feed, record=True)
    result = simulate(pools, feed.sim_config(conf), pol, w, controller=feed)
    return result, pol, feed


RUN_KINDS = ("live", "telemetry_no_outage", "telemetry_outage")


def window_outage(c_feed: FeedSpec, w) -> tuple[float, float]:
    """The scrape outage [a, b) of window `w` (simulated seconds)."""
    a, b = (f * w.duration_s for f in c_feed.outage_fraction)
    return a, b


def stale_cell(shared: Mapping[str, Any], cell: tuple[int, str]) -> dict[str, Any]:
    """One cell (window index, run kind) -> {result, decisions (telemetry runs: per mode),
    same (telemetry_outage: a second run made identical decisions and outcomes)}."""
    k, kind = cell
    w, spec, pools = shared["workloads"][k], shared["feed"], shared["pools"]
    conf = sim_config(shared["sim"], w)
    if kind == "live":
        return {"result": simulate(pools, conf, make_policy(shared["policy"]), w),
                "decisions": None, "same": None}
    outage = (window_outage(spec, w),) if kind == "telemetry_outage" else ()
    res, pol, _ = _telemetry_run(pools, conf, shared["policy"], w, spec, outage)
    same = None
    if kind == "telemetry_outage":
        res2, pol2, _ = _telemetry_run(pools, conf, shared["policy"], w, spec, outage)
        same = bool(pol.trace == pol2.trace and np.array_equal(res.state, res2.state)
                    and np.array_equal(res.replica, res2.replica)
                    and np.allclose(res.end_s, res2.end_s, equal_nan=True, rtol=0, atol=0))
    return {"result": res, "decisions": Counter(pol.decisions), "same": same}


def run(cfg: Mapping[str, Any], run_dir: Path,
        runner: GridRunner | None = None) -> dict[str, Any]:
    """Live least-loaded vs telemetry-aware (with and without an outage); see the docstring.
    Cells: window x run kind (`runner`: local loop by default, or Dask)."""
    c = _stale_config(cfg)
    slo = c.slo_targets()
    wls, workload = trace_workloads(c.workload, c.model)
    pools = build_pools(pool_mapping(c.pools), c.model)
    runs: dict[str, list] = {k: [] for k in RUN_KINDS}
    modes: dict[str, Counter] = {k: Counter() for k in runs if k != "live"}
    inside: dict[str, list] = {k: [] for k in runs}
    outside: dict[str, list] = {k: [] for k in runs}
    deterministic = True
    windows = []
    cells = [(k, kind) for k in range(len(wls)) for kind in RUN_KINDS]
    shared = {"pools": pools, "sim": c.sim, "policy": c.policy, "feed": c.feed,
              "workloads": wls}
    outs = iter((runner or local_grid()).map(stale_cell, cells, shared=shared,
                                             desc="stale_telemetry cells (window x run)"))
    for w in wls:
        a, b = window_outage(c.feed, w)
        blind = (a + c.feed.ttl_s, b + c.feed.delay_s)  # decisions on the fallback
        windows.append({"outage_s": [a, b], "blind_s": list(blind)})
        in_mask = (w.arrival_s >= blind[0]) & (w.arrival_s < blind[1])
        for key in RUN_KINDS:
            out = next(outs)
            runs[key].append(out["result"])
            if out["decisions"] is not None:
                modes[key].update(out["decisions"])
            if out["same"] is not None:
                deterministic = deterministic and out["same"]
        for key in runs:
            inside[key].append(masked_slo(runs[key][-1], slo, in_mask))
            outside[key].append(masked_slo(runs[key][-1], slo, ~in_mask))
    policies = {k: pooled_summary(v, slo) for k, v in runs.items()}
    per_rep = {k: replicate_metrics(v, slo) for k, v in runs.items()}

    def side(rows: list[dict]) -> dict[str, Any]:
        n = sum(r["requests"] for r in rows)
        att = (sum(r["slo_attainment"] * r["requests"] for r in rows
                   if math.isfinite(r["slo_attainment"])) / n) if n else math.nan
        return {"requests": n, "slo_attainment": att,
                "per_window": [r["slo_attainment"] for r in rows],
                "ttft_p99_s_per_window": [r["ttft_p99_s"] for r in rows]}

    window_split = {k: {"blind": side(inside[k]), "rest": side(outside[k])} for k in runs}
    blind_diff = paired_diff([r["slo_attainment"] for r in inside["telemetry_outage"]],
                             [r["slo_attainment"] for r in inside["live"]])
    summary: dict[str, Any] = {
        "experiment": "stale_telemetry", "workload": workload, "policies": policies,
        "conserved": all(p["conserved"] for p in policies.values()),
        "feed": {"scrape_interval_s": c.feed.scrape_interval_s, "delay_s": c.feed.delay_s,
                 "ttl_s": c.feed.ttl_s, "outage_fraction": list(c.feed.outage_fraction),
                 "windows": windows, "fallback": "IndexRoundRobin (request index mod eligible)"},
        "wrapped_policy": c.policy,
        "decisions_by_mode": {k: dict(v) for k, v in modes.items()},
        "slo_by_window": window_split,
        "blind_vs_live_slo_diff": blind_diff,
        "deterministic_fallback": deterministic,
        "replicates": len(wls),
        "ci95": {k: ci_table(v) for k, v in per_rep.items()},
    }
    summary["answer"] = _stale_answer(summary)
    summary["reports"] = _stale_figures(summary, runs["telemetry_outage"][0],
                                        runs["live"][0], windows[0], slo,
                                        Path(run_dir) / "figures")
    return json_safe(summary)


def _stale_answer(s: dict) -> str:
    split, modes = s["slo_by_window"], s["decisions_by_mode"]["telemetry_outage"]
    total = sum(modes.values()) or 1
    d = s["blind_vs_live_slo_diff"]
    lo, hi = d["ci95"]
    ci = (f" [95% CI {100 * lo:+.1f}, {100 * hi:+.1f} pp over {d['n']} windows]"
          if lo is not None and math.isfinite(lo) else "")
    pol = s["policies"]
    return (f"With scrapes failing over {s['feed']['outage_fraction']} of every window the "
            f"router decided {100 * modes.get('fallback', 0) / total:.1f}% of requests on its "
            f"fallback (telemetry stale after ttl {s['feed']['ttl_s']:g} s). Requests arriving "
            f"while it was blind met the SLO {100 * split['telemetry_outage']['blind']['slo_attainment']:.1f}"
            f"% of the time against {100 * split['live']['blind']['slo_attainment']:.1f}% with live "
            f"state ({100 * d['mean']:+.1f} pp{ci}); outside that period "
            f"{100 * split['telemetry_outage']['rest']['slo_attainment']:.1f}% vs "
            f"{100 * split['live']['rest']['slo_attainment']:.1f}%. Whole run: SLO "
            f"{pol['telemetry_outage']['slo_attainment']:.4f} (outage) / "
            f"{pol['telemetry_no_outage']['slo_attainment']:.4f} (telemetry, no outage) / "
            f"{pol['live']['slo_attainment']:.4f} (live); TTFT p99 "
            f"{pol['telemetry_outage']['ttft_p99_s']:.2f} / "
            f"{pol['telemetry_no_outage']['ttft_p99_s']:.2f} / {pol['live']['ttft_p99_s']:.2f} s. "
            f"The fallback is deterministic (two runs, identical decisions and outcomes): "
            f"{s['deterministic_fallback']}.")


def _stale_figures(summary: dict, tele, live, window: dict, slo, out: Path) -> dict[str, str]:
    from replaylab.fleet.sim.outcomes import met_slo

    plt = pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4))
    for name, res in (("live least-loaded", live), ("telemetry-aware (outage)", tele)):
        t = res.workload.arrival_s
        ok = met_slo(res, slo).astype(float)
        bins = np.linspace(0, float(t.max()) if t.size else 1.0, 41)
        idx = np.clip(np.digitize(t, bins) - 1, 0, len(bins) - 2)
        att = [ok[idx == k].mean() if (idx == k).any() else np.nan for k in range(len(bins) - 1)]
        ttft = res.ttft_s
        p99 = [np.nanquantile(ttft[idx == k], 0.99) if np.isfinite(ttft[idx == k]).any()
               else np.nan for k in range(len(bins) - 1)]
        a.plot(bins[:-1], att, label=name)
        b.plot(bins[:-1], p99, label=name)
    for ax in (a, b):
        ax.axvspan(*window["outage_s"], color="r", alpha=0.12, label="scrape outage")
        ax.axvspan(*window["blind_s"], color="r", alpha=0.12)
        ax.set_xlabel("arrival time (s), first window")
    a.set_ylabel("SLO attainment per bin")
    b.set_ylabel("TTFT p99 per bin (s)")
    a.legend(fontsize=8)
    fig.suptitle("Telemetry outage: fallback to deterministic round robin while stale")
    return {"stale_telemetry": save_figure(fig, plt, out / "stale_telemetry.png")}
