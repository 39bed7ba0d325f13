"""Reading the results: paired differences per replicate and their materiality
(`compare_modes`), the answer in words (`answer_text`) and the figures (`write_figures`).

Part of the hint_admission experiment (`hint_admission/__init__.py`).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from replaylab.fleet.experiments.harness import pyplot, save_figure
from replaylab.fleet.experiments.hint_admission.config import HintConfig, mode_of
from replaylab.stats import mean_ci, paired_diff

_METRICS = (("slo_attainment", "slo_attainment"), ("rejected_share", "rejected_share"),
            ("goodput_rps", "goodput_rps_rel"))


def _material(d: dict, threshold: float, relative_to: float | None = None) -> bool:
    m = d["mean"]
    if m is None or not math.isfinite(m) or not d.get("excludes_zero"):
        return False
    size = abs(m) / abs(relative_to) if relative_to else abs(m)
    return bool(size >= threshold)


def compare_modes(names: list[str], c: HintConfig, per_rep: dict, per_rep_own: dict,
                 sizing: dict, spread: list[dict]) -> dict[str, Any]:
    """hint - none and perfect - hint (same fleet; own sizing), paired per replicate."""
    by_mode = {mode_of(c.modes[n]): n for n in names}
    pairs = [(a, b) for a, b in (("hint", "none"), ("perfect", "hint"), ("perfect", "none"))
             if a in by_mode and b in by_mode]
    out: dict[str, Any] = {}
    for a, b in pairs:
        na, nb = by_mode[a], by_mode[b]
        cell: dict[str, Any] = {"same_fleet": {}, "own_sizing": {}}
        for key, mkey in _METRICS:
            for where, table in (("same_fleet", per_rep), ("own_sizing", per_rep_own)):
                d = paired_diff(table[na][key], table[nb][key])
                base = float(np.nanmean(table[nb][key])) if key == "goodput_rps" else None
                d["threshold"] = float(c.materiality.get(mkey, 0.0))
                d["relative"] = key == "goodput_rps"
                d["material"] = _material(d, d["threshold"], base)
                cell[where][key] = d
        gh = paired_diff(per_rep_own[na]["gpu_hours"], per_rep_own[nb]["gpu_hours"])
        ra, rb = sizing[a]["replicas"], sizing[b]["replicas"]
        rel = (ra - rb) / rb if rb else math.nan
        thr = float(c.materiality.get("replicas_rel", 0.1))
        # the sizing rule applied to every replicate ledger's calibration window
        by_ledger = [(x[a] - x[b]) / x[b] for x in spread if x.get(b)]
        rel_ci = mean_ci(by_ledger)
        lo, hi = rel_ci["ci95"]
        rel_ci["excludes_zero"] = bool(lo is not None and math.isfinite(lo) and (lo > 0 or hi < 0))
        material = (_material(rel_ci, thr) if rel_ci["n"] >= 2
                    else bool(math.isfinite(rel) and abs(rel) >= thr))
        cell["capacity"] = {"replicas": {a: ra, b: rb}, "replicas_rel_diff": rel,
                            "replicas_rel_diff_by_ledger": rel_ci, "threshold": thr,
                            "material": material, "gpu_hours_diff": gh}
        out[f"{a}_vs_{b}"] = cell
    return out


def _fmt_diff(d: dict, pct: bool = True) -> str:
    lo, hi = d["ci95"]
    if not (lo is not None and math.isfinite(lo)):
        return f"{d['mean']:+.4f} (no interval)"
    if pct:
        return f"{100 * d['mean']:+.2f} pp [95% CI {100 * lo:+.2f}, {100 * hi:+.2f}]"
    return f"{d['mean']:+.3f} [95% CI {lo:+.3f}, {hi:+.3f}]"


def answer_text(comparisons: dict, c: HintConfig, sizing: dict) -> str:
    cell = comparisons.get("hint_vs_none")
    if cell is None:
        return "No hint-vs-none comparison was configured (modes need mode: hint and none)."
    m = c.materiality
    sf, cap = cell["same_fleet"], cell["capacity"]
    parts = []
    slo_d, rej_d, gp_d = sf["slo_attainment"], sf["rejected_share"], sf["goodput_rps"]
    material_outcome = slo_d["material"] or rej_d["material"] or gp_d["material"]
    parts.append(
        f"On the same hint-sized fleet ({sizing['hint']['replicas']} replicas), admission with "
        f"the demand hint instead of prompt + {c.default_max_tokens}-token cap changes SLO "
        f"attainment by {_fmt_diff(slo_d)}, the rejected share by {_fmt_diff(rej_d)} and "
        f"goodput by {_fmt_diff(gp_d, pct=False)} req/s.")
    if material_outcome:
        which = [k for k, d in (("SLO attainment", slo_d), ("rejections", rej_d),
                                ("goodput", gp_d)) if d["material"]]
        parts.append(f"That is a material change in {', '.join(which)} (interval excludes zero "
                     f"and the mean exceeds the threshold: SLO {m.get('slo_attainment')}, "
                     f"rejections {m.get('rejected_share')}, goodput "
                     f"{m.get('goodput_rps_rel')} relative).")
    else:
        parts.append("That is NOT a material change in SLO or admission outcomes: no interval "
                     "both excludes zero and exceeds the stated threshold (SLO "
                     f"{m.get('slo_attainment')}, rejections {m.get('rejected_share')}, goodput "
                     f"{m.get('goodput_rps_rel')} relative).")
    rh, rn = cap["replicas"]["hint"], cap["replicas"]["none"]
    bl = cap["replicas_rel_diff_by_ledger"]
    lo, hi = bl["ci95"]
    spread = (f"; over the {bl['n']} replicate ledgers' calibration windows "
              f"{100 * bl['mean']:+.0f}% [95% CI {100 * lo:+.0f}, {100 * hi:+.0f}]"
              if bl["n"] >= 2 and lo is not None and math.isfinite(lo) else "")
    parts.append(
        f"Capacity: sizing from hint_p90 x the {c.sizing.multiplier_quantile} residual "
        f"multiplier ({sizing['hint']['kv_need_tokens'] / 1e3:.0f}k KV tokens in flight) asks "
        f"for {rh} replicas against {rn} for the cap rule "
        f"({100 * cap['replicas_rel_diff']:+.0f}%{spread}): "
        + ("a material difference in capacity" if cap["material"] else
           "not a material difference in capacity")
        + f" (threshold {100 * cap['threshold']:.0f}%).")
    own = cell["own_sizing"]["slo_attainment"]
    parts.append(f"Each rule on the fleet it sized: SLO attainment differs by {_fmt_diff(own)}"
                 + (" (material)." if own["material"] else " (not material)."))
    verdict = (f"Answer: the demand hint {'DOES' if material_outcome else 'does NOT'} "
               f"materially change SLO/admission outcomes on a given fleet, and "
               f"{'DOES' if cap['material'] else 'does NOT'} materially change the capacity "
               f"the sizing rule asks for.")
    parts.insert(0, verdict)
    pv = comparisons.get("perfect_vs_hint")
    if pv is not None:
        d = pv["same_fleet"]["slo_attainment"]
        parts.append(f"Headroom left to a perfect estimate (perfect - hint, same fleet): SLO "
                     f"{_fmt_diff(d)}.")
    return " ".join(parts)


def write_figures(summary: dict, names: list[str], per_rep: dict, out: Path) -> dict[str, str]:
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    panels = (("slo_attainment", "SLO attainment"), ("rejected_share", "rejected share"),
              ("goodput_rps", "goodput (req/s)"))
    x = np.arange(len(names))
    for ax, (key, label) in zip(axes, panels, strict=True):
        means, errs = [], [[], []]
        for n in names:
            ci = summary["ci95"][n][key]
            m = ci["mean"]
            lo, hi = ci["ci95"]
            means.append(m)
            ok = lo is not None and math.isfinite(lo)
            errs[0].append(m - lo if ok else 0.0)
            errs[1].append(hi - m if ok else 0.0)
        ax.bar(x, means, yerr=errs, capsize=5, color=["#999", "#3a7", "#37a", "#a73"][:len(x)])
        for s in range(len(per_rep[names[0]][key])):
            ax.plot(x, [per_rep[n][key][s] for n in names], color="k", alpha=0.25, lw=0.8)
        ax.set_xticks(x, names)
        ax.set_ylabel(label)
    fig.suptitle(f"Admission by estimate, same fleet ({summary['sizing']['common_fleet_replicas']}"
                 f" replicas); bars: 95% CI over {summary['replicates']} replicates, lines: pairs")
    paths = {"hint_outcomes": save_figure(fig, plt, out / "hint_outcomes.png")}
    fig, ax = plt.subplots(figsize=(5.5, 4))
    modes = list(summary["sizing"]["by_mode"])
    ax.bar(modes, [summary["sizing"]["by_mode"][m]["replicas"] for m in modes],
           color=["#999", "#3a7", "#37a"])
    ax.set_ylabel("replicas sized from the calibration window")
    ax.set_title("Capacity each admission rule asks for")
    paths["hint_capacity"] = save_figure(fig, plt, out / "hint_capacity.png")
    return paths
