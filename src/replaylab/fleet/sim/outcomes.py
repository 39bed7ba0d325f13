"""Per-policy summary of a simulation run: the numbers a fleet experiment compares.

`summarize(result, slo)` returns exactly these keys (SUMMARY_KEYS):

    arrived, completed, rejected, timed_out, cancelled   counts; the four sum to arrived
    slo_attainment        completed within their class's SLO / (arrived - cancelled):
                          rejections and timeouts count as misses, client cancellations
                          are left out (the client, not the fleet, ended them)
    ttft_p99_s, e2e_p99_s 99th percentiles over completed requests (NaN if none)
    goodput_rps           completed within SLO per second of the run window
                          (first arrival to the end of the energy window)
    gpu_hours, cost       switched-on GPU time (cold start and drain included) and its price
    joules_per_success    all energy (busy and idle, every replica) / completed requests
    joules_per_output_token  all energy / output tokens generated (partial streams of
                          cancelled requests included: they cost energy too)
    energy_provenance     the weakest label of the power and service models used
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd

from replaylab.config import fail_field
from replaylab.fleet.hardware.curves import energy_ratios
from replaylab.fleet.sim.result import SimResult

SUMMARY_KEYS = ("arrived", "completed", "rejected", "timed_out", "cancelled", "slo_attainment",
                "ttft_p99_s", "e2e_p99_s", "goodput_rps", "gpu_hours", "cost",
                "joules_per_success", "joules_per_output_token", "energy_provenance")


@dataclass(frozen=True)
class SloTarget:
    """Latency targets of one SLO class (seconds); inf = no target on that measure."""

    ttft_s: float = math.inf
    tpot_s: float = math.inf
    e2e_s: float = math.inf

    def __post_init__(self) -> None:
        for name in ("ttft_s", "tpot_s", "e2e_s"):
            if not getattr(self, name) > 0:
                fail_field("SloTarget", name, getattr(self, name), "must be > 0 (inf: none)")


DEFAULT_SLO = {"interactive": SloTarget(ttft_s=2.0, tpot_s=0.1),
               "batch": SloTarget(e2e_s=3600.0)}


def met_slo(result: SimResult, slo: Mapping[str, SloTarget] | None = None) -> np.ndarray:
    """Boolean (n,): completed and within its class's targets (classes without one: any time)."""
    slo = DEFAULT_SLO if slo is None else slo
    w = result.workload
    ttft, tpot, e2e = result.ttft_s, result.tpot_s, result.e2e_s
    ok = result.completed.copy()
    for code, name in enumerate(w.slo_classes):
        target = slo.get(name)
        if target is None:
            continue
        rows = w.slo_class == code
        # tpot is NaN for one-token answers: no per-token target applies to them
        good = ((ttft <= target.ttft_s) & ~(tpot > target.tpot_s) & (e2e <= target.e2e_s))
        ok[rows] &= good[rows]
    return ok


def _p99(x: np.ndarray) -> float:
    x = x[np.isfinite(x)]
    return float(np.quantile(x, 0.99)) if x.size else math.nan


def summarize(result: SimResult, slo: Mapping[str, SloTarget] | None = None) -> dict:
    """The per-policy summary (SUMMARY_KEYS, in that order); see the module docstring."""
    counts = result.counts()
    good = int(met_slo(result, slo).sum())
    denom = counts["arrived"] - counts["cancelled"]
    w = result.workload
    start = float(w.arrival_s[0]) if w.n else 0.0
    window = result.end_time_s - start
    completed = result.completed
    ratios = energy_ratios(result.energy_j, counts["completed"], int(result.output_tokens.sum()))
    out = {
        **counts,
        "slo_attainment": good / denom if denom else math.nan,
        "ttft_p99_s": _p99(result.ttft_s[completed]),
        "e2e_p99_s": _p99(result.e2e_s[completed]),
        "goodput_rps": good / window if window > 0 else math.nan,
        "gpu_hours": result.gpu_hours,
        "cost": result.cost,
        **ratios,
        "energy_provenance": result.energy_provenance,
    }
    return {k: out[k] for k in SUMMARY_KEYS}


def compare_policies(results: Mapping[str, SimResult],
                     slo: Mapping[str, SloTarget] | None = None) -> pd.DataFrame:
    """One summary row per policy name."""
    return pd.DataFrame([{"policy": name, **summarize(r, slo)} for name, r in results.items()])
