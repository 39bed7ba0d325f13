"""What a fleet experiment reports: pooled summaries, replicate statistics, per-request
slices and the figure helpers (part of the harness, `harness/__init__.py`).

Every policy's entry in a summary is `replaylab.fleet.sim.outcomes.summarize` pooled
over the replicates (time windows or seeds) the experiment ran; confidence
intervals are two-sided 95 % Student-t intervals over those replicates (paired
where two policies saw the same requests). Non-finite numbers are written as null.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from replaylab.stats import mean_ci


def pooled_summary(results: Sequence, slo: Mapping | None = None,
                   power_factor: Mapping[str, float] | None = None) -> dict[str, Any]:
    """`summarize` over several runs as if one: counts and energy summed, p99s pooled.

    One run gives exactly `summarize(run)`. power_factor: pool_id -> multiplier of
    that pool's energy (a power curve scaled by f draws f times the energy, idle
    included, for the same decisions); pools not named keep 1.
    """
    from replaylab.fleet.hardware.profiles import weakest
    from replaylab.fleet.sim.outcomes import SUMMARY_KEYS, met_slo

    counts = {k: 0 for k in ("arrived", "completed", "rejected", "timed_out", "cancelled")}
    good = 0
    window = energy = gpu_h = cost = 0.0
    tokens = 0
    ttft, e2e, prov = [], [], []
    for r in results:
        for k, v in r.counts().items():
            counts[k] += v
        good += int(met_slo(r, slo).sum())
        w = r.workload
        window += r.end_time_s - (float(w.arrival_s[0]) if w.n else 0.0)
        energy += run_energy_j(r, power_factor)
        gpu_h += r.gpu_hours
        cost += r.cost
        tokens += int(r.output_tokens.sum())
        done = r.completed
        ttft.append(r.ttft_s[done])
        e2e.append(r.e2e_s[done])
        prov.append(r.energy_provenance)
    denom = counts["arrived"] - counts["cancelled"]

    def p99(parts: list[np.ndarray]) -> float:
        x = np.concatenate(parts) if parts else np.zeros(0)
        x = x[np.isfinite(x)]
        return float(np.quantile(x, 0.99)) if x.size else math.nan

    out = {**counts, "slo_attainment": good / denom if denom else math.nan,
           "ttft_p99_s": p99(ttft), "e2e_p99_s": p99(e2e),
           "goodput_rps": good / window if window > 0 else math.nan,
           "gpu_hours": gpu_h, "cost": cost,
           "joules_per_success": energy / counts["completed"] if counts["completed"] else math.nan,
           "joules_per_output_token": energy / tokens if tokens else math.nan,
           "energy_provenance": weakest(prov) if prov else "modeled"}
    summary = {k: out[k] for k in SUMMARY_KEYS}
    summary["conserved"] = conserved(summary)
    return summary


def run_energy_j(result, power_factor: Mapping[str, float] | None = None) -> float:
    """All energy of a run; with power_factor, each pool's energy times its factor."""
    reps = result.replicas
    if not len(reps):
        return 0.0
    if not power_factor:
        return float(reps["energy_j"].sum())
    f = reps["pool_id"].map(lambda p: float(power_factor.get(p, 1.0)))
    return float((reps["energy_j"] * f).sum())


def conserved(summary: Mapping[str, Any]) -> bool:
    """arrived = completed + rejected + timed_out + cancelled."""
    return int(summary["arrived"]) == sum(int(summary[k]) for k in
                                          ("completed", "rejected", "timed_out", "cancelled"))


def replicate_metrics(results: Sequence, slo: Mapping | None = None,
                      power_factor: Mapping[str, float] | None = None) -> dict[str, list]:
    """Per replicate: the summary numbers the experiments put intervals on."""
    keys = ("slo_attainment", "goodput_rps", "gpu_hours", "cost", "joules_per_success",
            "joules_per_output_token", "ttft_p99_s")
    rows = [pooled_summary([r], slo, power_factor) for r in results]
    out = {k: [float(s[k]) for s in rows] for k in keys}
    out["rejected_share"] = [s["rejected"] / s["arrived"] if s["arrived"] else math.nan
                             for s in rows]
    out["timed_out_share"] = [s["timed_out"] / s["arrived"] if s["arrived"] else math.nan
                              for s in rows]
    return out


def ci_table(per_rep: Mapping[str, list]) -> dict[str, dict]:
    return {k: mean_ci(v) for k, v in per_rep.items()}


# ---------------------------------------------------------------- per-request slices


def masked_slo(result, slo, mask: np.ndarray) -> dict[str, Any]:
    """SLO attainment and TTFT p99 of the requests in `mask` (cancellations left out)."""
    from replaylab.fleet.sim.outcomes import met_slo
    from replaylab.fleet.sim.result import CANCELLED

    ok = met_slo(result, slo)
    keep = mask & (result.state != CANCELLED)
    n = int(keep.sum())
    ttft = result.ttft_s[keep & result.completed]
    ttft = ttft[np.isfinite(ttft)]
    return {"requests": n, "slo_attainment": float(ok[keep].mean()) if n else math.nan,
            "ttft_p99_s": float(np.quantile(ttft, 0.99)) if ttft.size else math.nan}


# ---------------------------------------------------------------- figures


def pyplot():
    """`tracking.figures.pyplot`: matplotlib on the Agg backend, imported on first use."""
    from replaylab.tracking import figures

    return figures.pyplot()


def save_figure(fig, plt, path: Path) -> str:
    """`tracking.figures.save_figure`, the path as a string (it goes into summary.json)."""
    from replaylab.tracking import figures

    return str(figures.save_figure(fig, plt, path))

