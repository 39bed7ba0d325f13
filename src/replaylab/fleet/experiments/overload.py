"""Fleet experiment `overload`: arrivals at 0.7x .. 2x the fleet's capacity, with and
without admission; every request is accounted for at every load.

Capacity is measured on the simulator itself (`replaylab.fleet.sim.saturation`): the
completion rate of the fleet while saturated (a backlog of `saturation.requests`
requests with the workload's own token mix, offered at once to unbounded queues,
measured between the first 10 % of completions and the moment the first replica's
queue runs dry). A load factor f offers f x that rate, so 1.0x is the load the fleet
can just serve and 1.5x is 50 % more than it can. `experiment.capacity_rps` states it
instead. The analytic formula (`capacity_estimate`: a full KV-limited batch, no
queueing) is reported beside it, never used: it overstates what the simulator serves
(1.20x for the default 2 x H100 pool on the Azure CDF, 2.9x for FleetSim's H100-80GB).
Per load the summary reports the rates offered and served in the second half of every
arrival window (`loads.<f>`: target_rps, offered_rps, served_rps and
served_over_offered per policy).

The workload (`fleet.workload`) is a synthetic stream from a token CDF (source=cdf:
one replicate per seed, `n = rate x duration_s` requests at `rate` = factor x
capacity) or a ledger (ledger=PATH or a shipped trace): its consecutive time
windows are the replicates, each replayed with its real arrivals and tokens,
compressed so that its mean rate is factor x capacity (`time_scale` is then set
by the load, per window; `fleet.workload.time_scale` is not used). Capacity is
measured on the workload's own token counts (cdf: 20,000 draws; a ledger: its
windows' rows). A policy that admits by the hint on a workload without hints is
skipped and reported (`skipped_policies`), or refused when it is the only one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from replaylab.config import ConfigError, from_mapping
from replaylab.fleet.experiments.harness import (
    GridRunner,
    SimExperimentConfig,
    SimSpec,
    build_pools,
    ci_table,
    has_hints,
    hint_policy_check,
    local_grid,
    make_policy,
    pooled_summary,
    pyplot,
    replicate_metrics,
    save_figure,
    sim_config,
    simulate,
)
from replaylab.fleet.experiments.workloads import (
    WorkloadSpec,
    file_sha256,
    ledger_facts,
    ledger_windows,
    read_workload_ledger,
    require_source,
    token_cdf_path,
    window_workloads,
    workload_facts,
    workload_text,
)
from replaylab.fleet.sim.saturation import SOURCE as SATURATION_SOURCE
from replaylab.fleet.sim.saturation import saturated_capacity
from replaylab.jsonsafe import json_safe


@dataclass(frozen=True)
class SaturationSpec:
    """The saturation run that measures capacity (`replaylab.fleet.sim.saturation`)."""

    requests: int = 40_000          # backlog offered at t = 0 (~0.2 s of wall time)
    seed: int = 0                   # resampling of the token mix
    warmup: float = 0.1             # share of completions before the window opens
    cache_dir: str | None = None    # also cache the result here as JSON (null: memory only)


@dataclass(frozen=True)
class OverloadConfig(SimExperimentConfig):
    load_factors: tuple[float, ...] = (1.0, 1.5, 2.0)
    workload: WorkloadSpec = field(default_factory=lambda: WorkloadSpec(source="cdf"))
    pools: dict = field(default_factory=dict)
    policies: dict = field(default_factory=dict)
    capacity_rps: float | None = None  # null: measured by a saturation run (SaturationSpec)
    saturation: dict = field(default_factory=dict)


def capacity_estimate(pools: Sequence, prompt: np.ndarray, completion: np.ndarray) -> dict:
    """Requests/s the fleet can finish at full batch (analytic, from its profiles).

    Reported beside the simulated capacity (`saturation.saturated_capacity`), not
    used to set loads: it overstates what the simulator serves.

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


@dataclass(frozen=True)
class Stream:
    """The replicates an overload run offers at each load, from `fleet.workload`."""

    prompt: np.ndarray        # (n,) tokens the capacity estimate is computed on
    completion: np.ndarray
    at_rate: Callable[[float], tuple[list, list[float] | None]]  # rate -> (workloads, scales)
    facts: Callable[..., dict]                                     # the summary's `workload`
    hinted: bool = True       # any request carries a demand hint (hint_p90)
    no_hint_why: str = ""     # what the workload lacks when not hinted


def cdf_stream(c: OverloadConfig) -> Stream:
    """source=cdf: one synthetic stream per seed, `rate x duration_s` requests."""
    from replaylab.fleet.sim.workload import SyntheticWorkloadConfig, workload_from_cdf

    w = c.workload
    cdf = token_cdf_path(w)
    probe = workload_from_cdf(cdf, SyntheticWorkloadConfig(n_requests=20_000), seed=c.seed)

    def at_rate(rate: float) -> tuple[list, None]:
        n_req = max(1, int(round(rate * w.duration_s)))
        return [workload_from_cdf(cdf, SyntheticWorkloadConfig(
            n_requests=n_req, rate_per_s=rate, arrival=w.arrival, cv=w.cv,
            hint_sigma=w.hint_sigma, cancel_share=w.cancel_share,
            cancel_after_mean_s=w.cancel_after_mean_s, models=(c.model,)),
            seed=c.seed * 1000 + int(s)) for s in w.seeds], None

    def facts(cap_rps: float, n_total: int, scales: dict) -> dict:
        desc = workload_text(
            f"synthetic from the {w.cdf} token CDF"
            + (" (Azure LLM 2023)" if w.cdf == "azure_cdf.json" else "") + ", "
            f"{w.arrival} arrivals cv={w.cv:g}", n_total,
            f"{len(w.seeds)} seeds x {len(c.load_factors)} load factors of "
            f"{cap_rps:.2f} req/s, {w.duration_s:g} s each, "
            f"{w.cancel_share:.0%} client cancellations, p90 hint sigma "
            + (f"{w.hint_sigma:g}" if w.hint_sigma is not None else "none (no hint)"))
        return workload_facts(description=desc, kind="cdf", file=str(cdf),
                              fingerprint=file_sha256(cdf), requests_simulated=n_total,
                              seeds=w.seeds)

    return Stream(probe.prompt_tokens, probe.completion_tokens, at_rate, facts,
                  hinted=w.hint_sigma is not None,
                  no_hint_why="the synthetic stream carries none (fleet.workload.hint_sigma "
                              "is null)")


def ledger_stream(c: OverloadConfig) -> Stream:
    """A ledger: its time windows, each compressed to the offered rate (see the docstring)."""
    w = c.workload
    led = read_workload_ledger(w)
    parts, left_out = ledger_windows(led.result.valid, w.windows, w.window_s, w.max_requests)
    base = window_workloads(parts, c.model, 1.0, w.cancel_aborted)
    for k, b in enumerate(base):
        if b.n < 2 or not b.duration_s > 0:
            raise ConfigError(f"{led.file}: window {k} has {b.n} requests over "
                              f"{b.duration_s:g} s; overload needs a span to compress")

    def at_rate(rate: float) -> tuple[list, list[float]]:
        scales = [rate * b.duration_s / b.n for b in base]   # mean rate n / span = rate
        return [window_workloads([p], c.model, f, w.cancel_aborted)[0]
                for p, f in zip(parts, scales, strict=True)], scales

    def facts(cap_rps: float, n_total: int, scales: dict) -> dict:
        n = sum(b.n for b in base)
        desc = workload_text(
            led.label, n_total, f"{len(base)} windows ({n} requests) x "
            f"{len(c.load_factors)} load factors of {cap_rps:.2f} req/s, arrivals "
            "compressed to each load's rate, all served as " + repr(c.model))
        return ledger_facts(led, parts, left_out, description=desc,
                            requests_simulated=n_total, windows=len(base), time_scale=scales)

    return Stream(np.concatenate([b.prompt_tokens for b in base]),
                  np.concatenate([b.completion_tokens for b in base]), at_rate, facts,
                  hinted=has_hints(base),
                  no_hint_why=f"{led.file} carries none (every hint_p90 null or the column "
                              "absent)")


def served_offered(results: list) -> dict[str, float]:
    """Requests/s offered (arrivals) and served (completions) in the second half of every
    arrival window, pooled over the replicates; the first half is the warm-up."""
    arrived = served = span = 0.0
    for r in results:
        a = r.workload.arrival_s
        if a.size < 2:
            continue
        mid, end = (float(a[0]) + float(a[-1])) / 2.0, float(a[-1])
        arrived += float(((a > mid) & (a <= end)).sum())
        served += float((r.completed & (r.end_s > mid) & (r.end_s <= end)).sum())
        span += end - mid
    return {"offered_rps": arrived / span if span > 0 else float("nan"),
            "served_rps": served / span if span > 0 else float("nan")}


def fleet_capacity(c: OverloadConfig, pools: list, stream: Stream) -> dict[str, Any]:
    """The capacity the load factors multiply, where it came from, and the formula beside it."""
    spec = from_mapping(SaturationSpec, dict(c.saturation or {}), "experiment.saturation")
    queueing = from_mapping(SimSpec, dict(c.sim or {}), "experiment.sim").queueing
    try:
        sim = saturated_capacity(pools, stream.prompt, stream.completion,
                                 requests=spec.requests, seed=spec.seed, warmup=spec.warmup,
                                 queueing=queueing, cache_dir=spec.cache_dir)
    except ValueError as e:
        raise ConfigError(f"experiment.saturation: {e}") from e
    formula = capacity_estimate(pools, stream.prompt, stream.completion)
    stated = c.capacity_rps is not None
    if stated and not float(c.capacity_rps) > 0:
        raise ConfigError(f"experiment.capacity_rps={c.capacity_rps}: must be > 0 (null: "
                          "measured)")
    used = float(c.capacity_rps) if stated else float(sim["req_per_s"])
    return {"source": "stated (experiment.capacity_rps)" if stated else SATURATION_SOURCE,
            "req_per_s": used, "rps": used,
            "simulated_req_per_s": sim["req_per_s"], "formula_req_per_s": formula["rps"],
            "formula_over_simulated": formula["rps"] / sim["req_per_s"],
            "duration_s": sim["duration_s"], "simulated": sim, "estimated": formula,
            "stated": stated}


def overload_cell(shared: Mapping[str, Any], cell: tuple[str, int, str]):
    """One cell (load key, replicate index, policy name) -> its SimResult."""
    key, k, name = cell
    w = shared["workloads"][key][k]
    return simulate(shared["pools"], sim_config(shared["sim"], w),
                    make_policy(shared["policies"][name]), w)


def run(cfg: Mapping[str, Any], run_dir: Path,
        runner: GridRunner | None = None) -> dict[str, Any]:
    """Arrivals ramped past capacity; every policy conserves requests, with/without admission.
    Cells: load factor x replicate x policy (`runner`: local loop by default, or Dask)."""
    c = OverloadConfig.parse(cfg)
    if not c.pools or not c.policies:
        raise ConfigError("experiment=overload needs pools and policies")
    require_source(c.workload, "overload", generated=("cdf",))
    slo = c.slo_targets()
    pools = build_pools(c.pools, c.model)
    stream = ledger_stream(c) if c.workload.replays_ledger else cdf_stream(c)
    policy_specs, skipped = hint_policy_check(c.policies, stream.hinted, "overload",
                                              stream.no_hint_why)
    cap = fleet_capacity(c, pools, stream)
    cap_rps = cap["req_per_s"]
    names = list(policy_specs)
    runs: dict[str, dict[str, list]] = {}
    scales: dict[str, list[float] | None] = {}
    workloads: dict[str, list] = {}
    n_total = 0
    for f in c.load_factors:
        key = f"{float(f):g}x"
        runs[key] = {n: [] for n in names}
        workloads[key], scales[key] = stream.at_rate(cap_rps * float(f))
        n_total += sum(w.n for w in workloads[key])
    cells = [(key, k, n) for key, wls in workloads.items() for k in range(len(wls))
             for n in names]
    shared = {"pools": pools, "sim": c.sim, "policies": policy_specs, "workloads": workloads}
    results = (runner or local_grid()).map(overload_cell, cells, shared=shared,
                                           desc="overload cells (load x replicate x policy)")
    for (key, _, n), result in zip(cells, results, strict=True):
        runs[key][n].append(result)
    policies: dict[str, dict] = {}
    by_load: dict[str, dict] = {}
    loads: dict[str, dict] = {}
    for f, (key, per) in zip(c.load_factors, runs.items(), strict=True):
        by_load[key] = {}
        loads[key] = {"factor": float(f), "target_rps": cap_rps * float(f), "offered_rps": None,
                      "served_rps": {}, "served_over_offered": {}}
        for n, results in per.items():
            s = pooled_summary(results, slo)
            policies[f"{n}@{key}"] = s
            reasons: dict[str, int] = {}
            for r in results:
                for k, v in r.reject_reasons.items():
                    reasons[k] = reasons.get(k, 0) + int(v)
            rates = served_offered(results)
            loads[key]["offered_rps"] = rates["offered_rps"]   # the same requests per policy
            loads[key]["served_rps"][n] = rates["served_rps"]
            loads[key]["served_over_offered"][n] = rates["served_rps"] / rates["offered_rps"]
            by_load[key][n] = {"summary": s, "reject_reasons": reasons,
                               "served_rps": rates["served_rps"],
                               "ci95": ci_table(replicate_metrics(results, slo))}
    summary: dict[str, Any] = {
        "experiment": "overload", "workload": stream.facts(cap_rps, n_total, scales),
        "policies": policies,
        "conserved": all(p["conserved"] for p in policies.values()),
        "capacity": cap, "skipped_policies": skipped,
        "load_factors": list(c.load_factors), "loads": loads, "by_load": by_load,
        "fleet": {p.pool_id: {"profile": p.profile.name, "replicas": p.replicas}
                  for p in pools},
    }
    summary["answer"] = _overload_answer(summary, names)
    summary["reports"] = _overload_figures(summary, names, Path(run_dir) / "figures")
    return json_safe(summary)


def _overload_answer(s: dict, names: list[str]) -> str:
    runs = len(s["policies"])
    ok = sum(bool(p["conserved"]) for p in s["policies"].values())
    cap = s["capacity"]
    parts = [f"Requests are conserved in {ok}/{runs} policy x load runs (arrived = completed + "
             f"rejected + timed_out + cancelled). Capacity {cap['req_per_s']:.1f} req/s "
             f"({cap['source']}; the analytic formula says {cap['formula_req_per_s']:.1f})."]
    parts += [f"Policy {n} {why}." for n, why in s["skipped_policies"].items()]
    for key in (f"{float(f):g}x" for f in s["load_factors"]):
        cells = []
        for n in names:
            x = s["by_load"][key][n]["summary"]
            a = x["arrived"] or 1
            cells.append(f"{n} SLO {x['slo_attainment']:.3f}, goodput {x['goodput_rps']:.1f}/s, "
                         f"rejected {100 * x['rejected'] / a:.0f}%, timed out "
                         f"{100 * x['timed_out'] / a:.0f}%")
        off = s["loads"][key]["offered_rps"]
        parts.append(f"At {key} (offered {off:.1f} req/s): " + "; ".join(cells) + ".")
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
        ax.set_xlabel("offered load / simulated capacity")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle("Overload: offered load beyond capacity, with and without admission")
    return {"overload": save_figure(fig, plt, out / "overload.png")}
