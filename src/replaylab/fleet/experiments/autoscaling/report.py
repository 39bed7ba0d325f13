"""Summary, verdicts and report of the autoscaling experiment on the fleet simulator.

Verdicts are computed from the per-seed numbers, never written by hand:

- per scenario, each policy against the reactive HPA on the same requests:
  paired differences over seeds (`replaylab.stats.paired_diff`) of GPU-hours
  and SLO attainment. "beats": SLO no worse by more than EPS (0.1 point) and
  fewer GPU-hours with an interval that excludes 0; "saves GPU-hours but
  misses more requests"; "costs more for no better SLO"; "buys a better SLO
  with more GPU-hours"; else "on par".
- per scenario, the winner: among the policies whose mean SLO is within EPS of
  the best, the one with the fewest mean GPU-hours.
- at matched SLO (the sweep): for each efficient reactive point (no other
  reactive point has as good an SLO for fewer GPU-hours), the GPU-hours the
  forecast policy needs for that SLO (on its efficient points, linear between
  neighbours), and the same the other way round; each side wins the SLO range
  where it needs fewer (or the other cannot reach it).
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from replaylab.jsonsafe import json_safe
from replaylab.stats import mean_ci, paired_diff

EPS = 0.001  # SLO attainment differences below 0.1 point count as equal
METRICS = ("slo_attainment", "gpu_hours", "energy_kwh", "joules_per_success", "ttft_p99_s",
           "scale_events", "replicas_added", "replicas_removed", "oscillations",
           "mean_replicas", "peak_replicas", "timed_out", "rejected", "arrived")
PAIRED = ("gpu_hours", "slo_attainment", "energy_kwh", "scale_events", "oscillations")
COLORS = {"static": "#8c8c8c", "reactive": "#4C72B0", "forecast": "#DD8452",
          "forecast_no_floor": "#55A868"}


def _group(results: list[dict]) -> tuple[dict, dict]:
    """({scenario: {policy: [run by seed]}}, {policy: {target: [run by seed]}})."""
    main: dict = {}
    sweep: dict = {}
    for job in sorted(results, key=lambda j: j["seed"]):
        for run in job["runs"]:
            if run["target_util"] is None:
                main.setdefault(job["scenario"], {}).setdefault(run["policy"], []).append(run)
            else:
                sweep.setdefault(run["policy"], {}).setdefault(run["target_util"], []).append(run)
    return main, sweep


def _stats(runs: list[dict]) -> dict[str, Any]:
    out: dict[str, Any] = {k: mean_ci([r[k] for r in runs]) for k in METRICS}
    out["conserved"] = all(r["conserved"] for r in runs)
    modes: Counter = Counter()
    events: Counter = Counter()
    for r in runs:
        modes.update(r["modes"])
        events.update(r["events"])
    out["modes"], out["events"] = dict(modes), dict(events)
    out["per_seed"] = {k: [r[k] for r in runs] for k in ("slo_attainment", "gpu_hours",
                                                          "energy_kwh", "scale_events")}
    return out


def _m(stats: dict, key: str) -> float:
    return float(stats[key]["mean"])


def compare(name: str, label: str, d_gpu: dict, d_slo: dict, a: dict, b: dict) -> dict:
    """The verdict of policy `label` (a) against reactive (b) in scenario `name`."""
    g, s = d_gpu["mean"], d_slo["mean"]
    g_lo, g_hi = d_gpu["ci95"]
    pct = 100 * g / _m(b, "gpu_hours") if _m(b, "gpu_hours") else math.nan
    nums = (f"SLO {_m(a, 'slo_attainment'):.4f} vs {_m(b, 'slo_attainment'):.4f}, GPU-hours "
            f"{_m(a, 'gpu_hours'):.0f} vs {_m(b, 'gpu_hours'):.0f} ({pct:+.1f} %, paired 95 % CI "
            f"[{g_lo:+.1f}, {g_hi:+.1f}]), scale events {_m(a, 'scale_events'):.0f} vs "
            f"{_m(b, 'scale_events'):.0f}, oscillations {_m(a, 'oscillations'):.1f} vs "
            f"{_m(b, 'oscillations'):.1f}; mean of {d_gpu['n']} seeds")
    fewer = math.isfinite(g_hi) and g_hi < 0 if d_gpu["n"] > 1 else g < 0
    if s >= -EPS and fewer:
        kind, text = "beats", "beats reactive: as good an SLO with fewer GPU-hours"
    elif s < -EPS and g < 0:
        kind, text = "trade_off", "does not beat reactive: it saves GPU-hours but misses more"
    elif s <= EPS and g >= 0:
        kind, text = "loses", "does not beat reactive: no better SLO for as many or more GPU-hours"
    elif s > EPS and g > 0:
        kind, text = "buys_slo", "does not beat reactive on cost: a better SLO for more GPU-hours"
    else:
        kind, text = "on_par", "is on par with reactive"
    return {"scenario": name, "policy": label, "verdict": kind,
            "text": f"{name}: {label} {text} ({nums}).", "d_gpu_hours": d_gpu,
            "d_slo_attainment": d_slo}


def winner(policies: dict[str, dict]) -> dict[str, Any]:
    """Fewest GPU-hours among the policies within EPS of the best mean SLO."""
    best = max(_m(s, "slo_attainment") for s in policies.values())
    ok = {p: s for p, s in policies.items() if _m(s, "slo_attainment") >= best - EPS}
    win = min(ok, key=lambda p: _m(ok[p], "gpu_hours"))
    return {"policy": win, "slo_attainment": _m(ok[win], "slo_attainment"),
            "gpu_hours": _m(ok[win], "gpu_hours"), "best_slo": best,
            "within_eps_of_best_slo": sorted(ok)}


def efficient(points: list[dict], tol: float = 1e-4) -> list[dict]:
    """Points no other point beats: none has SLO >= this - tol with fewer GPU-hours."""
    return [p for p in points if not any(q["slo"] >= p["slo"] - tol
                                         and q["gpu_hours"] < p["gpu_hours"] for q in points)]


def gpu_hours_at(points: list[dict], slo: float) -> float | None:
    """GPU-hours a sweep needs to reach `slo`: on its efficient points (SLO rising with
    GPU-hours), the cheapest that reaches it, linear between two neighbours; None if none."""
    pts = sorted((q["gpu_hours"], q["slo"]) for q in efficient(points, tol=0.0))
    for (g0, s0), (g1, s1) in zip(pts, pts[1:], strict=False):
        if s0 < slo <= s1:
            return g0 + (g1 - g0) * (slo - s0) / (s1 - s0)
    ok = [g for g, s in pts if s >= slo]
    return min(ok) if ok else None


def frontier(sweep: dict) -> dict[str, list[dict]]:
    out = {}
    for pol, by_target in sweep.items():
        out[pol] = [{"target_util": u, "seeds": len(runs),
                     "slo": float(np.mean([r["slo_attainment"] for r in runs])),
                     "gpu_hours": float(np.mean([r["gpu_hours"] for r in runs])),
                     "slo_ci95": mean_ci([r["slo_attainment"] for r in runs])["ci95"],
                     "gpu_hours_ci95": mean_ci([r["gpu_hours"] for r in runs])["ci95"],
                     "scale_events": float(np.mean([r["scale_events"] for r in runs]))}
                    for u, runs in sorted(by_target.items())]
    return out


def _at_points(of: list[dict], other: list[dict]) -> list[dict]:
    """For each efficient point of `of`: its SLO, its GPU-hours and the other's at that SLO."""
    return [{"target": q["target_util"], "slo": q["slo"], "gpu_hours": q["gpu_hours"],
             "other_gpu_hours_same_slo": gpu_hours_at(other, q["slo"])}
            for q in sorted(efficient(of), key=lambda q: q["slo"])]


def matched_slo(front: dict, scenario: str) -> dict[str, Any]:
    """Both policies at the same SLO, from both sides of the sweep (see the module doc)."""
    if not (front.get("reactive") and front.get("forecast")):
        return {}
    rows = _at_points(front["reactive"], front["forecast"])
    back = _at_points(front["forecast"], front["reactive"])
    wins = [r for r in rows if r["other_gpu_hours_same_slo"] is not None
            and r["other_gpu_hours_same_slo"] < r["gpu_hours"]]
    fwins = [r for r in back if r["other_gpu_hours_same_slo"] is None
             or r["other_gpu_hours_same_slo"] > r["gpu_hours"]]
    seeds = front["reactive"][0]["seeds"]

    def pairs(rs: list[dict]) -> str:
        return "; ".join(f"SLO {r['slo']:.5f}: {r['gpu_hours']:.0f} vs " + (
            "never" if r["other_gpu_hours_same_slo"] is None
            else f"{r['other_gpu_hours_same_slo']:.0f}") for r in rs) or "none"

    rwins = [r for r in rows if r not in wins]
    text = (f"matched SLO ({scenario}, mean of {seeds} seeds per sweep point): reactive is "
            f"cheaper at {len(rwins)} of its {len(rows)} efficient points (GPU-hours reactive vs "
            f"forecast at the same SLO: {pairs(rwins)}); forecast is cheaper at {len(fwins)} of "
            f"its {len(back)} efficient points (forecast vs reactive: {pairs(fwins)}).")
    return {"scenario": scenario, "reactive_points": rows, "forecast_points": back,
            "forecast_wins_at_reactive_points": len(wins),
            "forecast_wins_at_forecast_points": len(fwins),
            "text": text}


def verdict_lines(comparisons: list[dict], winners: dict, matched: dict) -> list[str]:
    """The plain sentences: each comparison, the winner per scenario, the matched-SLO result."""
    out = [x["text"] for x in comparisons]
    out += [f"{n}: {w['policy']} wins (fewest GPU-hours, {w['gpu_hours']:.0f}, among the "
            f"policies within 0.1 point of the best SLO {w['best_slo']:.4f}: "
            f"{', '.join(w['within_eps_of_best_slo'])})." for n, w in winners.items()]
    if matched:
        out.append(matched["text"])
    return out


def summarize_experiment(ctx, results: list[dict]) -> dict[str, Any]:
    """The JSON-safe summary (see the module doc and fleet.experiments.autoscaling.experiment)."""
    c = ctx.cfg
    main, sweep = _group(results)
    scen = {n: {p: _stats(runs) for p, runs in pols.items()} for n, pols in main.items()}
    comparisons, winners = [], {}
    for n, pols in main.items():
        winners[n] = winner(scen[n])
        if "reactive" not in pols:
            continue
        b = pols["reactive"]
        for p, runs in pols.items():
            if p == "reactive":
                continue
            d = {k: paired_diff([r[k] for r in runs], [r[k] for r in b]) for k in PAIRED}
            comparisons.append(compare(n, p, d["gpu_hours"], d["slo_attainment"],
                                       scen[n][p], scen[n]["reactive"]) | {"paired": d})
    front = frontier(sweep)
    matched = matched_slo(front, c.sweep.scenario) if c.sweep else {}
    first = {j["scenario"]: j for j in sorted(results, key=lambda j: j["seed"], reverse=True)
             if all(r["target_util"] is None for r in j["runs"])}
    verdicts = verdict_lines(comparisons, winners, matched)
    all_conserved = all(r["conserved"] for j in results for r in j["runs"])
    summary = {
        "pipeline": "fleet", "experiment": "autoscaling",
        "simulator": "replaylab.fleet.sim.simulator (event-driven: continuous batching, KV limits, "
                     "queues, cold start, drain)",
        "provenance": f"modeled: simulator on a {ctx.profile.service_provenance} service model "
                      f"and {ctx.profile.power_provenance} power from measured points",
        "trace": {"source": c.trace.source, "day": c.trace.day, "hours": c.trace.hours,
                  "scale": c.trace.scale,
                  "mean_rps_day": float(ctx.base.rps.iloc[-(86_400 // ctx.base.width):].mean())},
        "capacity": ctx.capacity,
        "pool": {"cold_start_s": c.pool.cold_start_s, "queue_timeout_s": c.pool.queue_timeout_s,
                 "min_replicas": c.pool.min_replicas, "max_replicas": c.pool.max_replicas,
                 "gpus_per_replica": ctx.profile.gpus, "max_batch": ctx.profile.max_batch},
        "telemetry": {"scrape_interval_s": c.telemetry.scrape_interval_s,
                      "ttl_s": c.telemetry.ttl_s, "delay_s": c.telemetry.delay_s},
        "slo": {k: dict(v) for k, v in c.slo.items()},
        "seeds": list(c.seeds),
        "policy_settings": {"static_quantile": c.static.quantile,
                            "static_target_util": c.static.target_util,
                            "reactive_target_occupancy": c.reactive.target_util,
                            "forecast_target_util": c.forecast.target_util,
                            "forecast_quantile": c.forecast.quantile,
                            "forecast_floor_occupancy": c.forecast_policy.floor_occupancy,
                            "forecaster": c.forecast.forecaster},
        "requests_per_day": {n: j["requests"] for n, j in first.items()},
        "scenario_notes": {n: j["notes"] for n, j in first.items()},
        "static_replicas": {n: j["static_replicas"] for n, j in first.items()},
        "forecast_quality": {n: j["forecast_quality"] for n, j in first.items()},
        "conserved": all_conserved,
        "scenarios": scen, "comparisons": comparisons, "winners": winners,
        "frontier": front, "matched_slo": matched, "verdicts": verdicts,
    }
    return json_safe(summary)


# ---------------------------------------------------------------- figures and page


def _timeline(results: list[dict], path: Path) -> str:
    from replaylab.tracking.figures import pyplot, save_figure

    plt = pyplot()
    jobs = {}
    for j in sorted(results, key=lambda j: j["seed"], reverse=True):
        if all(r["target_util"] is None for r in j["runs"]):
            jobs[j["scenario"]] = j  # the lowest seed wins
    fig, axes = plt.subplots(len(jobs), 1, figsize=(11, 2.6 * len(jobs)), squeeze=False)
    for ax, (name, job) in zip(axes[:, 0], jobs.items(), strict=True):
        hours, need = job["needed"]
        ax.plot(hours, need, color="black", lw=0.6, label="needed at 100 % (1-min arrivals)")
        for run in job["runs"]:
            t = [x[0] / 3600 for x in run["trace"]] + [hours[-1] if hours else 0]
            n = [x[1] for x in run["trace"]]
            ax.step(t, n + n[-1:], where="post", lw=1.0, color=COLORS.get(run["policy"]),
                    label=f"{run['policy']} (SLO {run['slo_attainment']:.3f}, "
                          f"{run['gpu_hours']:.0f} GPU-h)")
        ax.set_title(f"{name} (seed {job['seed']}): replicas vs demand (simulated)", fontsize=9)
        ax.set_ylabel("replicas")
        ax.legend(fontsize=7, loc="upper left")
    axes[-1, 0].set_xlabel("hour of the evaluated day")
    return str(save_figure(fig, plt, path, dpi=100))


def _slo_vs_cost(summary: dict, path: Path) -> str:
    from replaylab.tracking.figures import pyplot, save_figure

    plt = pyplot()
    scen = summary["scenarios"]
    fig, axes = plt.subplots(1, len(scen), figsize=(3.6 * len(scen), 3.6), squeeze=False)
    sweep_on = (summary.get("matched_slo") or {}).get("scenario")
    for ax, (name, pols) in zip(axes[0], scen.items(), strict=True):
        for p, s in pols.items():
            g, y = s["gpu_hours"], s["slo_attainment"]
            xerr = None if g["ci95"][0] is None else [[g["mean"] - g["ci95"][0]],
                                                      [g["ci95"][1] - g["mean"]]]
            yerr = None if y["ci95"][0] is None else [[y["mean"] - y["ci95"][0]],
                                                      [y["ci95"][1] - y["mean"]]]
            ax.errorbar(g["mean"], y["mean"], xerr=xerr, yerr=yerr, fmt="o",
                        color=COLORS.get(p), label=p, zorder=3, capsize=2)
        if name == sweep_on:
            for p, pts in summary["frontier"].items():
                ax.plot([q["gpu_hours"] for q in pts], [q["slo"] for q in pts], "--",
                        color=COLORS.get(p), lw=0.8, label=f"{p} target sweep")
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("GPU-hours (simulated)")
        ax.set_ylabel("SLO attainment (simulated)")
        ax.legend(fontsize=6)
    return str(save_figure(fig, plt, path, dpi=100))


def write_report(results: list[dict], summary: dict, out_dir: Path) -> dict[str, str]:
    """Figures and report.html in `out_dir`; returns {name: path}."""
    from replaylab.tracking.html import write_html_report

    fig_dir = Path(out_dir) / "figures"
    fig_dir.mkdir(parents=True, exist_ok=True)
    figs = {"Replicas vs demand per policy (simulated, first seed)": Path(_timeline(
                results, fig_dir / "replicas_vs_demand.png")),
            "SLO attainment vs GPU-hours per policy and scenario, 95 % CI over seeds": Path(
                _slo_vs_cost(summary, fig_dir / "slo_vs_gpu_hours.png"))}
    facts = {k: summary[k] for k in ("verdicts", "winners", "matched_slo", "capacity", "pool",
                                     "telemetry", "slo", "trace", "policy_settings",
                                     "forecast_quality", "conserved")}
    html = write_html_report(Path(out_dir) / "report.html",
                             "Autoscaling on the fleet simulator: static vs reactive vs forecast",
                             facts, figs)
    return {"html": str(html), **{f"figure_{i}": str(p) for i, p in enumerate(figs.values())}}


def _ci(m: dict, fmt: str) -> str:
    lo, hi = m["ci95"]
    if m["mean"] is None:
        return "n/a"
    if lo is None or hi is None:
        return format(m["mean"], fmt)
    return f"{format(m['mean'], fmt)} [{format(lo, fmt)}, {format(hi, fmt)}]"


def results_markdown(summary: dict) -> str:
    """The results tables of docs/results/autoscaling.md from a summary (means, 95 % CI over seeds)."""
    n = len(summary["seeds"])
    out = [f"Per scenario and policy, mean and 95 % t-interval over {n} seeds "
           f"({', '.join(map(str, summary['seeds']))}):", "",
           "| scenario | policy | SLO attainment | GPU-hours | energy (kWh) | scale events | "
           "oscillations | peak replicas | timed out |", "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name, pols in summary["scenarios"].items():
        for p, m in pols.items():
            out.append(f"| {name} | {p} | {_ci(m['slo_attainment'], '.4f')} | "
                       f"{_ci(m['gpu_hours'], '.0f')} | {_ci(m['energy_kwh'], '.0f')} | "
                       f"{_ci(m['scale_events'], '.0f')} | {_ci(m['oscillations'], '.0f')} | "
                       f"{m['peak_replicas']['mean']:.0f} | {m['timed_out']['mean']:.0f} |")
    fr = summary.get("frontier") or {}
    if fr:
        out += ["", f"Sweep on {summary['matched_slo'].get('scenario', '')} (reactive: target "
                "batch occupancy; forecast: target work utilization; mean over seeds):", "",
                "| policy | target | SLO attainment | GPU-hours | scale events |",
                "|---|---:|---:|---:|---:|"]
        for p, pts in fr.items():
            out += [f"| {p} | {q['target_util']} | {q['slo']:.5f} | {q['gpu_hours']:.0f} | "
                    f"{q['scale_events']:.0f} |" for q in pts]
    ms = summary.get("matched_slo") or {}
    for side, other in (("reactive", "forecast"), ("forecast", "reactive")):
        if ms.get(f"{side}_points"):
            out += ["", f"| {side} target | its SLO | {side} GPU-hours | {other} GPU-hours "
                    "at that SLO |", "|---:|---:|---:|---:|"]
            for r in ms[f"{side}_points"]:
                g = r["other_gpu_hours_same_slo"]
                out.append(f"| {r['target']} | {r['slo']:.5f} | {r['gpu_hours']:.0f} | "
                           f"{'never reaches it' if g is None else f'{g:.0f}'} |")
    out += ["", "Verdicts (computed by `replaylab.fleet.experiments.autoscaling.report`):", ""]
    out += [f"- {v}" for v in summary["verdicts"]]
    return "\n".join(out) + "\n"
