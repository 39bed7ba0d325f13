"""Verdicts and the HTML report of the autoscaling experiment (pure; files into out_dir)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from replaylab.tracking.figures import pyplot, save_figure
from replaylab.tracking.html import write_html_report

_COLORS = {"static": "#8c8c8c", "reactive": "#4C72B0", "proactive": "#DD8452",
           "proactive_no_floor": "#55A868"}
EPS = 0.001  # SLO attainment differences below 0.1 point count as equal


def _pct(a: float, b: float) -> str:
    return f"{100 * (a - b) / b:+.1f}%" if b else "n/a"


def _compare(name: str, p: dict, r: dict, label: str = "proactive") -> str:
    ps, rs, pg, rg = p["slo_attainment"], r["slo_attainment"], p["gpu_hours"], r["gpu_hours"]
    nums = (f"SLO {ps:.4f} vs {rs:.4f}, GPU-hours {pg:.0f} vs {rg:.0f} ({_pct(pg, rg)}), "
            f"scaling actions {p['scaling_actions']} vs {r['scaling_actions']}, "
            f"oscillations {p['oscillations']} vs {r['oscillations']}")
    if ps >= rs - EPS and pg < rg:
        return f"{name}: {label} beats reactive: as good an SLO with fewer GPU-hours ({nums})."
    if ps < rs - EPS and pg < rg:
        return (f"{name}: {label} does not beat reactive: it saves GPU-hours but misses "
                f"more requests ({nums}).")
    if ps <= rs + EPS:
        return (f"{name}: {label} does not beat reactive: no better SLO for as many or more "
                f"GPU-hours ({nums}).")
    return (f"{name}: {label} does not beat reactive on cost: a better SLO bought with more "
            f"GPU-hours ({nums}).")


def _efficient(points: list[dict], tol: float = 1e-4) -> list[dict]:
    """Sweep points no other point beats: none has SLO >= this - tol with fewer GPU-hours."""
    return [p for p in points if not any(
        q["slo_attainment"] >= p["slo_attainment"] - tol and q["gpu_hours"] < p["gpu_hours"]
        for q in points)]


def _frontier_gpu_hours_at(points: list[dict], slo: float) -> float | None:
    """GPU-hours a sweep needs to reach `slo` (linear between sweep points; None if never)."""
    pts = sorted((q["gpu_hours"], q["slo_attainment"]) for q in points)
    for (g0, s0), (g1, s1) in zip(pts, pts[1:], strict=False):
        if s0 < slo <= s1:
            return g0 + (g1 - g0) * (slo - s0) / (s1 - s0)
    ok = [g for g, s in pts if s >= slo]
    return min(ok) if ok else None


def verdicts(summary: dict[str, Any]) -> tuple[list[str], dict[str, Any]]:
    """Plain sentences per scenario, and the issue's target on the burst-free day."""
    out = []
    for name, pol in summary["scenarios"].items():
        r = pol.get("reactive")
        for label in ("proactive", "proactive_no_floor"):
            if r and label in pol:
                out.append(_compare(name, pol[label], r, label))
        s, p = pol.get("static"), pol.get("proactive")
        if s and p and s["slo_attainment"] >= p["slo_attainment"] - EPS and (
                s["gpu_hours"] <= p["gpu_hours"]):
            out.append(f"{name}: static provisioning beats forecasting (SLO "
                       f"{s['slo_attainment']:.4f} for {s['gpu_hours']:.0f} GPU-hours).")
    target: dict[str, Any] = {"scenario": "steady", "met": None}
    steady = summary["scenarios"].get("steady", {})
    if "proactive" in steady and "reactive" in steady:
        p, r = steady["proactive"], steady["reactive"]
        met = p["slo_attainment"] >= r["slo_attainment"] - EPS and p["gpu_hours"] < r["gpu_hours"]
        target.update(met=bool(met), proactive=p, reactive=r)
    fr = summary.get("frontier") or {}
    if fr.get("reactive") and fr.get("proactive"):
        rows = []
        for q in _efficient(fr["reactive"]):  # a wasteful reactive point is no fair bar
            g = _frontier_gpu_hours_at(fr["proactive"], q["slo_attainment"])
            rows.append({"reactive_target_util": q["target_util"], "slo": q["slo_attainment"],
                         "reactive_gpu_hours": q["gpu_hours"],
                         "proactive_gpu_hours_same_slo": None if g is None else round(g, 1)})
        wins = [x for x in rows if x["proactive_gpu_hours_same_slo"] is not None
                and x["proactive_gpu_hours_same_slo"] < x["reactive_gpu_hours"]]
        target.update(frontier_comparison=rows, frontier_wins=len(wins),
                      frontier_points=len(rows),
                      met_on_frontier=len(wins) > len(rows) / 2)
        out.append(f"frontier (burst-free day, mean of {fr['reactive'][0].get('seeds', 1)} "
                   f"arrival draws): the proactive policy reaches the reactive SLO with fewer "
                   f"GPU-hours at {len(wins)} of the {len(rows)} efficient reactive operating "
                   f"points.")
    target["explanation"] = _explain(target, summary.get("policy_settings", {}))
    return out, target


def _explain(target: dict, settings: dict) -> str:
    met, fr = target.get("met"), target.get("met_on_frontier")
    utils = (f" (proactive sized at {settings.get('proactive_target_util')} utilization of "
             f"the forecast q{round(100 * settings.get('proactive_quantile', 0.9))}, reactive "
             f"HPA at {settings.get('reactive_target_util')})") if settings else ""
    if met and fr is False:
        return ("Met at the configured operating points" + utils + ", but not on the frontier: "
                "with both policies swept over target utilization, the reactive HPA reaches "
                "the same SLO with as few or fewer GPU-hours at most points, so the saving "
                "comes from running hotter, which the HPA can do too, not from the forecast.")
    if met:
        return "Met at the configured operating points" + utils + " and on the frontier."
    if met is False:
        return ("Not met" + utils + ": the forecast-driven policy does not reach the reactive "
                "SLO with fewer GPU-hours on the burst-free day; see the verdicts and the "
                "frontier for where it loses.")
    return "Not evaluated: the steady scenario needs both the reactive and proactive policies."


def _timeline(runs: dict, tick_s: float, path: Path) -> Path:
    plt = pyplot()
    names = list(runs)
    fig, axes = plt.subplots(len(names), 1, figsize=(11, 2.6 * len(names)), squeeze=False)
    for ax, name in zip(axes[:, 0], names, strict=True):
        res = runs[name]["results"]
        any_res = next(iter(res.values()))
        hours = np.arange(len(any_res.needed)) * tick_s / 3600
        per = max(1, int(60 // tick_s))  # 1-minute means of the needed replicas
        n = len(hours) // per * per
        ax.plot(hours[:n:per], any_res.needed[:n].reshape(-1, per).mean(1), color="black",
                lw=0.8, label="needed at 100% util (1-min mean)")
        for pname, r in res.items():
            ax.step(hours, r.provisioned, where="post", lw=1.0, color=_COLORS.get(pname),
                    label=f"{pname} (SLO {r.totals['slo_attainment']:.3f}, "
                          f"{r.totals['gpu_hours']:.0f} GPU-h)")
        ax.set_title(f"{name}: replicas vs demand (modeled)", fontsize=9)
        ax.set_ylabel("replicas")
        ax.legend(fontsize=7, loc="upper left")
    axes[-1, 0].set_xlabel("hour of the evaluated day")
    return save_figure(fig, plt, path, dpi=100)


def _slo_vs_cost(summary: dict, path: Path) -> Path:
    plt = pyplot()
    scen = summary["scenarios"]
    fig, axes = plt.subplots(1, len(scen), figsize=(3.4 * len(scen), 3.4), squeeze=False)
    for ax, (name, pol) in zip(axes[0], scen.items(), strict=True):
        for pname, m in pol.items():
            ax.scatter(m["gpu_hours"], m["slo_attainment"], color=_COLORS.get(pname),
                       label=pname, zorder=3)
        fr = summary.get("frontier") or {}
        if name == "steady":
            for pname, pts in fr.items():
                ax.plot([q["gpu_hours"] for q in pts], [q["slo_attainment"] for q in pts],
                        "--", color=_COLORS.get(pname), lw=0.8,
                        label=f"{pname} sweep of target util")
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("GPU-hours (modeled)")
        ax.set_ylabel("SLO attainment (modeled)")
        ax.legend(fontsize=6)
    return save_figure(fig, plt, path, dpi=100)


def write_autoscaling_report(runs: dict, summary: dict, tick_s: float,
                             out_dir: Path) -> dict[str, str]:
    """Figures and report.html in `out_dir`; returns {name: path}."""
    fig_dir = out_dir / "figures"
    fig_dir.mkdir(parents=True, exist_ok=True)
    figs = {"Replicas vs demand per policy (modeled)": _timeline(
                runs, tick_s, fig_dir / "replicas_vs_demand.png"),
            "SLO attainment vs GPU-hours per policy and scenario (modeled)": _slo_vs_cost(
                summary, fig_dir / "slo_vs_gpu_hours.png")}
    facts = {"verdicts": summary["verdicts"], "target": summary["target"],
             "scenarios": summary["scenarios"], "capacity": summary["capacity"],
             "pool": summary["pool"], "trace": summary["trace"],
             "forecast_quality": summary["forecast_quality"], "events": summary["events"]}
    html = write_html_report(out_dir / "report.html",
                             "Autoscaling: static vs reactive (HPA) vs forecast-driven",
                             facts, figs)
    return {"html": str(html), **{f"figure_{i}": str(p) for i, p in enumerate(figs.values())}}
