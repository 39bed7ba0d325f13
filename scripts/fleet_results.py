"""The runs behind docs/results/fleet.md: the fleet experiments at their defaults and on a ledger.

    python scripts/fleet_results.py --data DIR --out outputs/fleet-results \
        --write-doc docs/results/fleet.md
    python scripts/fleet_results.py --from outputs/fleet-results --write-doc docs/results/fleet.md
    python scripts/fleet_results.py --out OUT --sets mine --ledger mine=my_ledger.parquet \
        --experiments energy rollout --override fleet.workload.time_scale=6
    python scripts/fleet_results.py --out OUT --sets shipped    # the defaults, nothing downloaded

A *set* is a list of experiments on one workload (SETS): `shipped`, the five at their
defaults (the Azure conversation slice the package ships, the overload token CDF, the
synthetic ledger of hint_admission: nothing outside the checkout); `azure`, the same but
energy, stale_telemetry and rollout on the full Azure LLM 2023 conversation trace
(`fleet.workload.source=azure_conv fleet.workload.path=DIR/traces/azure_llm_2023/...`);
`mooncake`, the Mooncake FAST'25 conversation trace imported as ledger-v1 (`python -m
training pipeline=import source=mooncake source.path=DIR/...`) and replayed by
`fleet.workload.ledger`; `burstgpt` likewise. DIR (`--data`, default
$REPLAYLAB_SHARED_DATA) is the folder of the full public downloads (layout of
../shared/data: SOURCES there); the sets that need it stop with one line without it.
`--ledger NAME=PATH` makes a set NAME of `--experiments` on a ledger of yours, with
`--override` (`key=value` for every run, `exp:key=value` for one).
Each run is the user command, one at a time:

    python -m evaluation experiment=<name> tracking=off hydra.run.dir=OUT/<set>/<name> ...

OUT/<set>/<name>/run.json keeps its command, exit code, wall time, peak RSS and, for the
experiments replaying a ledger on a fixed fleet (energy, stale_telemetry, rollout), the
offered rate against the fleet's capacity measured on the simulator
(`replaylab.fleet.sim.saturation.saturated_capacity` for the run's pools and its replayed token
counts: the completion rate of a saturated backlog, ~0.2 s, cached per fingerprint in
memory and in OUT/data/capacity), the capacity `overload` also uses; the analytic formula
(`overload.capacity_estimate`: full KV-limited batches, no queueing) is kept beside it
for comparison only (it overstates the simulated capacity, `docs/design/fleet.md` "Capacity").
`--from DIR` renders existing runs; a run.json written before the simulated capacity
(its `load` without `capacity_source`) has its load recomputed from its overrides.

Every table is rendered from the summaries into OUT/results-fleet-tables.md, each between
`<!-- fleet_results:<set>/<block> -->` and `<!-- /fleet_results:<set>/<block> -->`.
`--write-doc DOC` replaces the text between each such pair in DOC; the blocks of a set
that is not in OUT are left as they are (and listed); a block that cannot be rendered
from a set that is there is an error.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
EXPERIMENTS = ("energy", "hint_admission", "stale_telemetry", "rollout", "overload")
FIXED_FLEET = ("energy", "stale_telemetry", "rollout")   # a ledger replayed on a fixed fleet
SIMULATED = "simulated saturation run"   # replaylab.fleet.sim.saturation.SOURCE
MARKER = re.compile(r"<!-- fleet_results:(\S+) -->\n.*?<!-- /fleet_results:\1 -->", re.S)


@dataclass(frozen=True)
class ResultSet:
    """Experiments on one workload: each experiment's default (ledger None), a ledger file,
    the ledger `python -m training pipeline=import source=<source> source.path=DATA/<file>`
    writes, or (`trace`) a full downloaded trace DATA/<trace> that the fixed-fleet
    experiments replay as `fleet.workload.source=azure_conv`."""

    experiments: tuple[str, ...] = EXPERIMENTS
    ledger: str | None = None
    source: str | None = None
    file: str | None = None        # the source's download under DATA
    trace: str | None = None       # azure_conv: its download under DATA
    overrides: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # "*": every run


# Mooncake: 3.4 req/s of 12k-token prompts. energy and rollout: the time scale puts the
# offered rate near the share of the fleet's capacity that the Azure default has (chosen
# against the analytic formula; run.json `load`, of the simulated capacity: energy 6x ->
# 0.36 vs Azure 12x -> 0.32, rollout 8x -> 0.48 vs 16x -> 0.43). stale_telemetry: Azure's
# share (20x -> 0.87) would be 7.5x, 1.02 of what 3 H100s serve of these prompts (SLO
# 0.28 with live state), so 4x (0.54), where live routing keeps the SLO near its
# light-load level. overload sets its own rates, hint_admission sizes its fleet (both at
# their defaults).
AZURE_CONV = "traces/azure_llm_2023/AzureLLMInferenceTrace_conv.csv"
# stale_telemetry's defaults are sized for the shipped 15-minute slice (3 windows, outage
# [0.2, 0.8]); on an hour-long trace the runs keep 4 windows and the [0.4, 0.6] outage
FULL_TRACE_STALE = ("fleet.workload.windows=4", "experiment.feed.outage_fraction=[0.4,0.6]")
SETS = {
    "shipped": ResultSet(),
    "azure": ResultSet(trace=AZURE_CONV, overrides={"stale_telemetry": FULL_TRACE_STALE}),
    "mooncake": ResultSet(source="mooncake", file="traces/mooncake_fast25/conversation_trace.jsonl",
                          overrides={
        "energy": ("fleet.workload.time_scale=6",),
        "stale_telemetry": ("fleet.workload.time_scale=4", *FULL_TRACE_STALE),
        "rollout": ("fleet.workload.time_scale=8",)}),
    # BurstGPT's first 400 rows (11.5 h, one failed row without usage): the row accounting
    # on a real trace with a failure; 9000x: 0.35 of its simulated capacity (Azure 0.32).
    "burstgpt": ResultSet(("energy",), source="burstgpt",
                          file="traces/burstgpt/burstgpt3_first400.csv",
                          overrides={"energy": ("fleet.workload.time_scale=9000",)}),
}


# ---------------------------------------------------------------- running


def measured(cmd: list[str], log: Path) -> dict[str, Any]:
    """Run `cmd` in the repo root, output to `log`; its exit code, wall s and peak RSS MB."""
    t = time.perf_counter()
    with log.open("w") as fh:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=fh, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return {"command": " ".join(cmd[1:]), "rc": proc.returncode,
            "wall_s": round(time.perf_counter() - t, 2),
            "max_rss_mb": round(usage.ru_maxrss / 1024)}   # Linux: ru_maxrss in KiB


def checked(cmd: list[str], log: Path) -> dict[str, Any]:
    run = measured(cmd, log)
    if run["rc"] != 0:
        sys.exit(f"{run['command']}: exit {run['rc']}\n" + log.read_text()[-2000:])
    print(f"{run['command']}: {run['wall_s']} s, {run['max_rss_mb']} MB", flush=True)
    return run


def composed(name: str, overrides: Sequence[str]):
    """The evaluate config of `experiment=name` with `overrides` (Hydra's compose API)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.hydra_config import HydraConfig

    from replaylab.apps.schemas import register_schemas

    register_schemas()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose(config_name="evaluate", overrides=[f"experiment={name}", *overrides],
                      return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)   # resolves ${hydra:runtime.cwd}
    return cfg


def offered_load(cfg, cache_dir: Path | None = None) -> dict[str, Any]:
    """Mean offered req/s of the replayed windows against the fleet's simulated capacity.

    `capacity_rps` is `saturated_capacity` (the run's pools, its sim queueing mode, the
    replayed windows' token counts; cached in memory and in `cache_dir`), `ratio` the
    offered rate over it; `formula_rps` / `formula_ratio` are the analytic
    `capacity_estimate`'s, for comparison only.
    """
    import numpy as np
    from omegaconf import OmegaConf

    from replaylab.config import from_mapping
    from replaylab.fleet.experiments.harness import SimSpec, build_pools
    from replaylab.fleet.experiments.overload import capacity_estimate
    from replaylab.fleet.experiments.workloads import (
        ledger_windows,
        read_workload_ledger,
        window_workloads,
        workload_spec,
    )
    from replaylab.fleet.sim.saturation import saturated_capacity

    exp = OmegaConf.to_container(cfg.experiment, resolve=True)
    spec = workload_spec(OmegaConf.to_container(cfg.fleet.workload, resolve=True))
    led = read_workload_ledger(spec)
    parts, _ = ledger_windows(led.result.valid, spec.windows, spec.window_s, spec.max_requests)
    wls = window_workloads(parts, exp["model"], spec.time_scale, spec.cancel_aborted)
    pools = build_pools(exp["pools"], exp["model"])
    prompt_tok = np.concatenate([w.prompt_tokens for w in wls])
    completion_tok = np.concatenate([w.completion_tokens for w in wls])
    prompt, completion = prompt_tok.astype(float), completion_tok.astype(float)
    queueing = from_mapping(SimSpec, dict(exp.get("sim") or {}), "experiment.sim").queueing
    sim = saturated_capacity(pools, prompt_tok, completion_tok, queueing=queueing,
                             cache_dir=cache_dir)
    formula = capacity_estimate(pools, prompt, completion)
    rate = sum(w.n for w in wls) / sum(w.duration_s for w in wls)

    def spread(x: np.ndarray) -> dict[str, float]:
        return {"mean": float(x.mean()), **{f"p{q}": float(np.percentile(x, q))
                                            for q in (50, 90, 99)}, "max": float(x.max())}

    return {"offered_rps": rate, "capacity_rps": sim["req_per_s"],
            "capacity_source": sim["source"], "ratio": rate / sim["req_per_s"],
            "pools": sim["pools"],
            "saturation": {k: sim[k] for k in ("requests", "seed", "warmup", "queueing",
                                               "duration_s", "completions", "fingerprint")},
            "formula_rps": formula["rps"], "formula_ratio": rate / formula["rps"],
            "formula_over_simulated": formula["rps"] / sim["req_per_s"],
            "formula_pools": {p: v["rps"] for p, v in formula["pools"].items()},
            "native_rps": rate / spec.time_scale,
            "tokens": {"prompt": spread(prompt), "completion": spread(completion)}}


def downloaded(data: Path | None, rel: str) -> Path:
    """DATA/rel, a full public download; one line and exit when it is not there."""
    if data is None:
        sys.exit(f"{rel}: a full public download; name its folder with --data DIR "
                 "(or REPLAYLAB_SHARED_DATA)")
    path = (data / rel).resolve()
    if not path.exists():
        sys.exit(f"{path}: no such file (--data {data}: the layout of ../shared/data)")
    return path


def import_ledger(source: str, file: Path, data: Path) -> Path:
    """OUT/data/<source>.parquet from `python -m training pipeline=import source=<source>
    source.path=<file>`."""
    data.mkdir(parents=True, exist_ok=True)
    out = data / f"{source}.parquet"
    run = checked([sys.executable, "-m", "training", "pipeline=import", f"source={source}",
                   f"source.path={file}", f"out={out}", "tracking=off",
                   f"hydra.run.dir={data / ('import_' + source)}"],
                  data / f"import_{source}.log")
    (data / f"import_{source}.json").write_text(json.dumps(run, indent=1))
    return out


def run_set(name: str, rs: ResultSet, out: Path, data: Path | None) -> None:
    ledger = rs.ledger or (str(import_ledger(rs.source, downloaded(data, rs.file), out / "data"))
                           if rs.source else None)
    for exp in rs.experiments:
        over = [*rs.overrides.get("*", ()), *rs.overrides.get(exp, ())]
        if ledger:
            over.insert(0, f"fleet.workload.ledger={Path(ledger).resolve()}")
        elif rs.trace and exp in FIXED_FLEET:
            over[:0] = ["fleet.workload.source=azure_conv",
                        f"fleet.workload.path={downloaded(data, rs.trace)}"]
        run_dir = out / name / exp
        run_dir.mkdir(parents=True, exist_ok=True)
        run = checked([sys.executable, "-m", "evaluation", f"experiment={exp}", "tracking=off",
                       f"hydra.run.dir={run_dir}", *over], run_dir / "run.log")
        cfg = composed(exp, over)
        run["overrides"] = over
        run["default_max_tokens"] = cfg.experiment.get("default_max_tokens")
        if exp in FIXED_FLEET:
            run["load"] = offered_load(cfg, out / "data" / "capacity")
        (run_dir / "run.json").write_text(json.dumps(run, indent=1))


# ---------------------------------------------------------------- numbers


def sig3(x: float | None) -> str:
    """Three significant digits, trailing zeros kept (0.0822, 1.30, 14.9, 108)."""
    if x is None:
        return "-"
    return f"{x:.0f}" if abs(x) >= 100 else format(x, "#.3g")


def ttft(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}" if x < 1 else sig3(x)


def num(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def pct(x: float | None, spec: str = ".0f") -> str:
    return "-" if x is None else f"{100 * x:{spec}} %"


def ci(d: Mapping[str, Any], spec: str = "+.4f", scale: float = 1.0) -> str:
    """`mean [lo, hi]` of a {mean, ci95} mapping (95 % t-interval)."""
    lo, hi = d["ci95"]
    if lo is None and hi is None:   # one replicate: no interval
        return f"{scale * d['mean']:{spec}} (n={d['n']})"
    return (f"{scale * d['mean']:{spec}} [{num(lo and scale * lo, spec)}, "
            f"{num(hi and scale * hi, spec)}]")


def table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def counts(d: Mapping[str, int] | None) -> str:
    """`reason n, ...` of the nonzero counts, `0` if none."""
    nz = [f"{k} {v}" for k, v in (d or {}).items() if v]
    return ", ".join(nz) or "0"


# ---------------------------------------------------------------- blocks

POLICY_HEADER = ("policy", "arrived", "completed", "rejected", "timed out", "cancelled",
                 "SLO att.", "TTFT p99 s", "e2e p99 s", "goodput req/s", "GPU-h", "cost $",
                 "J/success", "J/output tok", "energy")


def policy_row(label: str, p: Mapping[str, Any]) -> list[str]:
    return [label, p["arrived"], p["completed"], p["rejected"], p["timed_out"], p["cancelled"],
            num(p["slo_attainment"], ".4f"), ttft(p["ttft_p99_s"]), sig3(p["e2e_p99_s"]),
            sig3(p["goodput_rps"]), num(p["gpu_hours"], ".3f"), num(p["cost"], ".3f"),
            num(p["joules_per_success"], ".1f"), num(p["joules_per_output_token"], ".4f"),
            p["energy_provenance"]]


def policy_label(s: Mapping[str, Any], name: str) -> str:
    """How the document names a policy of summary `s`."""
    if s["experiment"] == "stale_telemetry" and name == "live":
        return "live (LeastLoaded on live state)"
    if s["experiment"] == "hint_admission":
        mode, _, own = name.partition("@")
        if own:
            return f"{name} ({s['sizing']['by_mode'][mode]['replicas']})"
        return f"{name} ({s['sizing']['common_fleet_replicas']} replicas)"
    return name


def policies_block(s: Mapping[str, Any], run: Mapping[str, Any]) -> str:
    return table(POLICY_HEADER, [policy_row(policy_label(s, n), p)
                                 for n, p in s["policies"].items()])


def workload_block(s: Mapping[str, Any], run: Mapping[str, Any]) -> str:
    w = s["workload"]
    if w.get("seeds"):
        reps = f"{len(w['seeds'])} seeds ({', '.join(map(str, w['seeds']))})"
    else:
        reps = f"{w['windows']} windows"
    ts = w["time_scale"]
    if isinstance(ts, Mapping):   # overload on a ledger: per load factor, per window
        flat = [x for v in ts.values() for x in v]
        ts = f"{min(flat):.1f}-{max(flat):.1f}x (per load)"
    else:
        ts = "-" if ts is None else f"{ts:g}x"
    return table(("source", "file", "sha256", "rows read", "quarantined", "used", "skipped",
                  "censored", "simulated", "replicates", "time scale"),
                 [[w["source"], f"`{Path(w['file']).name}`" if w["file"] else "-",
                   f"`{w['fingerprint'][:12]}`" if w["fingerprint"] else "-",
                   num(w["rows_read"], "d"), num(w["rows_quarantined"], "d"),
                   num(w["rows_used"], "d"), counts(w["rows_skipped"]),
                   counts(w["rows_censored"]), w["requests_simulated"], reps, ts]])


def energy_pools(s: Mapping[str, Any], run: Mapping[str, Any]) -> str:
    rows = [[n, pool, pct(v["served_share"]), pct(v["utilization"]), pct(v["energy_share"])]
            for n, per in s["pools"].items() for pool, v in per.items()]
    return table(("policy", "pool", "served share", "busy share", "energy share"), rows)


def energy_paired(s: Mapping[str, Any], run: Mapping[str, Any]) -> str:
    lead = s["lead_over_best"]
    best = lead["best"]
    ref = s["policies"][best]["joules_per_output_token"]
    rows = [[n, ci(d), pct(d["mean"] / ref, "+.1f"),
             ci(lead["slo_attainment_diff"][n], "+.2f", 100)]
            for n, d in lead["joules_per_output_token_diff"].items()]
    return table(("policy", f"J/output tok minus {best} [95 % CI]", "relative",
                  f"SLO att. minus {best}, pp [95 % CI]"), rows)


def perturbation_label(err: Mapping[str, float]) -> str:
    vals = set(round(v, 6) for v in err.values())
    if len(vals) == 1:
        return f"all {100 * next(iter(vals)):+.0f} %"
    return ", ".join(f"{p.upper()} {100 * v:+.0f} %" for p, v in err.items())


def energy_power_error(s: Mapping[str, Any], run: Mapping[str, Any]) -> str:
    names = list(s["policies"])
    rows = [["nominal", *(num(s["policies"][n]["joules_per_output_token"], ".4f")
                          for n in names), "–", "–"]]
    for pe in s["power_error"].values():
        fixed, informed = pe["decisions_fixed"], pe["policy_informed"]
        rows.append([perturbation_label(pe["relative_error"]),
                     *(f"{fixed['joules_per_output_token'][n]:.4f} / "
                       f"{informed['joules_per_output_token'][n]:.4f}" for n in names),
                     "yes" if fixed["ranking_holds"] else "**no**",
                     "yes" if informed["ranking_holds"] else "**no**"])
    return table(("perturbation", *names, "ranking holds (fixed)",
                  "ranking holds (re-decided)"), rows)


def hint_sizing(s: Mapping[str, Any], run: Mapping[str, Any]) -> str:
    sz, cap = s["sizing"], run.get("default_max_tokens")
    cap_text = f"prompt + {cap}" if cap else "prompt + `default_max_tokens`"
    reserves = {"none": f"{cap_text} (the cap; the Workload has no per-request max_tokens)",
                "hint": f"hint_p90 x {s['residuals']['multiplier']:.3f}",
                "perfect": "prompt + true completion"}
    q = f"q{100 * sz['need_quantile']:g}"
    return table(("rule", "reserves per request", f"KV need ({q})", "replicas"),
                 [[m, reserves.get(m, m), f"{v['kv_need_tokens'] / 1e3:,.0f}k", v["replicas"]]
                  for m, v in sz["by_mode"].items()])


def hint_comparisons(s: Mapping[str, Any], run: Mapping[str, Any]) -> str:
    rows = []
    for comp, d in s["comparisons"].items():
        for fleet in ("same_fleet", "own_sizing"):
            c = d[fleet]
            material = any(c[k]["material"] for k in c)
            rows.append([comp.replace("_vs_", " - "), fleet.replace("_", " "),
                         ci(c["slo_attainment"], "+.2f", 100),
                         ci(c["rejected_share"], "+.2f", 100),
                         ci(c["goodput_rps"], "+.3f"), "yes" if material else "no"])
        k = d["capacity"]
        rows.append([comp.replace("_vs_", " - "), "replicas",
                     " vs ".join(f"{m} {r}" for m, r in k["replicas"].items()),
                     f"{100 * k['replicas_rel_diff']:+.0f} %",
                     "by ledger " + ci(k["replicas_rel_diff_by_ledger"], "+.0f", 100) + " %",
                     "yes" if k["material"] else "no"])
    return table(("comparison", "fleet", "SLO att. pp [95 % CI]", "rejected pp [95 % CI]",
                  "goodput req/s [95 % CI]", "material"), rows)


def stale_blind(s: Mapping[str, Any], run: Mapping[str, Any]) -> str:
    total = sum(s["decisions_by_mode"].get("telemetry_outage", {}).values()) or None
    rows = []
    for n, by in s["slo_by_window"].items():
        fb = s["decisions_by_mode"].get(n, {}).get("fallback", 0) if n != "live" else None
        rows.append([n, "-" if fb is None else f"{fb} ({pct(fb / total, '.1f')})",
                     by["blind"]["requests"], num(by["blind"]["slo_attainment"], ".3f"),
                     ", ".join(num(x, ".3f") for x in by["blind"]["per_window"]),
                     num(by["rest"]["slo_attainment"], ".3f")])
    d = s["blind_vs_live_slo_diff"]
    return (table(("policy", "fallback decisions", "arrived blind", "SLO blind",
                   "SLO blind per window", "SLO otherwise"), rows)
            + f"\n\nBlind, outage minus live: {ci(d, '+.1f', 100)} pp over {d['n']} windows.")


def rollout_gates(s: Mapping[str, Any], run: Mapping[str, Any]) -> str:
    rows = []
    for cand, c in s["candidates"].items():
        sh = c["shadow"]
        rows.append([cand, "shadow", f"agreement {pct(sh['agreement'], '.1f')}",
                     f"{sh['candidate_violations']} violations, {sh['candidate_errors']} errors",
                     "identical to baseline" if sh.get("identical_to_baseline_run") else "-",
                     "yes" if sh["canary_ready"] else "no"])
        for step, g in c["gates"].items():
            viol = sum(g["hard_constraint_violations"].values())
            rows.append([cand, step, ci(g["slo_attainment_diff_vs_baseline"], "+.2f", 100),
                         ci(g["joules_per_output_token_diff_vs_baseline"]),
                         f"{viol} violations", "yes" if g["promote"] else "**no**"])
    return table(("candidate", "step", "SLO att. minus baseline, pp [95 % CI]",
                  "J/output tok minus baseline [95 % CI]", "hard constraints", "promote"), rows)


def rollout_rollback(s: Mapping[str, Any], run: Mapping[str, Any]) -> str:
    rows = [[cand, k, f"{w['rolled_back_at_s']:g}", w["reason"],
             num(w["before"]["slo_attainment"], ".4f"), num(w["after"]["slo_attainment"], ".4f")]
            for cand, c in s["candidates"].items()
            for k, w in enumerate(c["rollback"]["windows"])]
    return table(("candidate", "window", "rolled back at s", "why", "SLO before",
                  "SLO after"), rows)


def overload_capacity(s: Mapping[str, Any], run: Mapping[str, Any]) -> str:
    """Where the capacity the load factors multiply came from (`capacity.source`), the
    formula beside it, and per load the rates targeted, offered and served (`loads`)."""
    cap = s["capacity"]
    if "source" not in cap:   # a summary from before the simulated capacity (issue 30.5)
        used = ("stated (experiment.capacity_rps)" if cap["stated"] else
                "the analytic formula, overload.capacity_estimate: an upper bound; "
                "this run predates the simulated capacity")
        return f"Capacity used for the load factors: {cap['rps']:.1f} req/s ({used})."
    how = cap["source"]
    sim = cap.get("simulated") or {}
    if cap["source"] == SIMULATED and sim:
        how += (f": {sim['requests']:,} requests, {sim['completions']:,} completions in a "
                f"{sim['duration_s']:.0f} s window")
    elif cap.get("simulated_req_per_s") is not None:
        how += f"; the saturation run measured {cap['simulated_req_per_s']:.1f} req/s"
    text = (f"Capacity used for the load factors: {cap['req_per_s']:.1f} req/s ({how}); "
            f"formula said {cap['formula_req_per_s']:.1f} ({cap['formula_over_simulated']:.2f}x "
            "the simulated).")
    loads = s.get("loads") or {}
    if not loads:
        return text
    names = list(next(iter(loads.values()))["served_rps"])
    rows = [[key, f"{ld['target_rps']:.1f}", f"{ld['offered_rps']:.1f}",
             *(f"{ld['served_rps'][n]:.1f} ({ld['served_over_offered'][n]:.2f})"
               for n in names)]
            for key, ld in loads.items()]
    return text + "\n\n" + table(("load", "target req/s", "offered req/s",
                                    *(f"served {n} (/ offered)" for n in names)), rows)


def answer_block(s: Mapping[str, Any], run: Mapping[str, Any]) -> str:
    """The experiment's own answer (`summary["answer"]`), quoted."""
    return "\n".join("> " + line for line in textwrap.wrap(s["answer"], 80))


BLOCKS: dict[str, dict[str, Callable[[Mapping, Mapping], str]]] = {
    "energy": {"workload": workload_block, "policies": policies_block, "pools": energy_pools,
               "paired": energy_paired, "power_error": energy_power_error,
               "answer": answer_block},
    "hint_admission": {"workload": workload_block, "sizing": hint_sizing,
                       "policies": policies_block, "comparisons": hint_comparisons,
                       "answer": answer_block},
    "stale_telemetry": {"workload": workload_block, "policies": policies_block,
                        "blind": stale_blind, "answer": answer_block},
    "rollout": {"workload": workload_block, "policies": policies_block, "gates": rollout_gates,
                "rollback": rollout_rollback, "answer": answer_block},
    "overload": {"workload": workload_block, "capacity": overload_capacity,
                 "policies": policies_block, "answer": answer_block},
}


def span(xs: Sequence[float], spec: str) -> str:
    """`lo-hi` of `xs` (one value if they agree to `spec`), `-` if none."""
    if not xs:
        return "-"
    lo, hi = format(min(xs), spec), format(max(xs), spec)
    return lo if lo == hi else f"{lo}-{hi}"


def load_cells(s: Mapping[str, Any], run: Mapping[str, Any]) -> list[str]:
    """offered req/s, simulated capacity req/s, offered / capacity, formula / simulated.

    Fixed-fleet runs: run.json `load` (a `load` without `capacity_source` predates the
    simulated capacity and is not shown as one); overload: its summary's `capacity`
    (simulated_req_per_s, also when the loads used a stated capacity) and `loads`
    (offered rate per load factor, as a range)."""
    ld = run.get("load") or {}
    if ld:
        if ld.get("capacity_source") != SIMULATED:
            return [num(ld.get("offered_rps"), ".1f"), "-", "-", "-"]
        return [num(ld["offered_rps"], ".1f"), num(ld["capacity_rps"], ".1f"),
                num(ld["ratio"], ".2f"), num(ld.get("formula_over_simulated"), ".2f")]
    cap = s.get("capacity") or {}
    sim = cap.get("simulated_req_per_s")
    if s.get("experiment") != "overload" or sim is None:
        return ["-"] * 4
    offered = [v["offered_rps"] for v in (s.get("loads") or {}).values()]
    return [span(offered, ".1f"), num(sim, ".1f"), span([o / sim for o in offered], ".2f"),
            num(cap.get("formula_over_simulated"), ".2f")]


def runs_block(runs: Mapping[str, tuple[Mapping, Mapping]]) -> str:
    rows = [[exp, s["workload"]["requests_simulated"], *load_cells(s, run),
             num(run.get("wall_s", s.get("wall_seconds")), ".1f"),
             num(run.get("max_rss_mb"), "d")]
            for exp, (s, run) in runs.items()]
    return table(("experiment", "requests simulated", "offered req/s",
                  "capacity req/s (simulated)", "offered / capacity", "formula / simulated",
                  "wall s", "peak RSS MB"), rows)


def tokens_block(runs: Mapping[str, tuple[Mapping, Mapping]]) -> str | None:
    """The replayed requests' token counts (of the first run that recorded them)."""
    for s, run in runs.values():
        tok = (run.get("load") or {}).get("tokens")
        if tok:
            cells = [f"{tok[k][q]:,.0f}" for k in ("prompt", "completion")
                     for q in ("mean", "p50", "p90", "p99", "max")]
            return table(("requests", "req/s (uncompressed)", "prompt mean", "p50", "p90",
                          "p99", "max", "completion mean", "p50", "p90", "p99", "max"),
                         [[s["workload"]["requests_simulated"],
                           f"{run['load']['native_rps']:.2f}", *cells]])
    return None


def refreshed(exp: str, run: dict[str, Any], cache_dir: Path) -> dict[str, Any]:
    """`run` with its `load` recomputed when it predates the simulated capacity (a
    fixed-fleet run.json whose `load` has no `capacity_source`), from its overrides."""
    ld = run.get("load")
    if exp not in FIXED_FLEET or not ld or ld.get("capacity_source") == SIMULATED:
        return run
    if "overrides" not in run:
        sys.exit(f"{exp}: run.json has a formula-based load and no overrides to recompute it")
    print(f"{exp}: recomputing the offered load against the simulated capacity", flush=True)
    return {**run, "load": offered_load(composed(exp, run["overrides"]), cache_dir)}


def render_set(root: Path, refresh: bool = False) -> dict[str, str]:
    """block id (without the set) -> markdown, for every experiment run under `root`;
    `refresh`: recompute the loads of run.json files from before the simulated capacity."""
    runs: dict[str, tuple[Mapping, Mapping]] = {}
    for exp in EXPERIMENTS:
        path = root / exp / "summary.json"
        if path.is_file():
            run_path = root / exp / "run.json"
            run = json.loads(run_path.read_text()) if run_path.is_file() else {}
            if refresh:
                run = refreshed(exp, run, root.parent / "data" / "capacity")
            runs[exp] = (json.loads(path.read_text()), run)
    blocks = {"runs": runs_block(runs)} if runs else {}
    if (tok := tokens_block(runs)) is not None:
        blocks["tokens"] = tok
    for exp, (s, run) in runs.items():
        for name, fn in BLOCKS[exp].items():
            blocks[f"{exp}.{name}"] = fn(s, run)
    return blocks


def wrapped(block_id: str, text: str) -> str:
    return f"<!-- fleet_results:{block_id} -->\n\n{text}\n\n<!-- /fleet_results:{block_id} -->"


def write_doc(doc: Path, blocks: Mapping[str, str], sets: Sequence[str]) -> list[str]:
    """Replace every marked block of `doc` whose set was rendered; the ids left as they were."""
    kept, missing = [], []

    def sub(m: re.Match) -> str:
        block_id = m.group(1)
        if block_id in blocks:
            return wrapped(block_id, blocks[block_id])
        (missing if block_id.split("/")[0] in sets else kept).append(block_id)
        return m.group(0)

    text = MARKER.sub(sub, doc.read_text())
    if missing:
        sys.exit(f"{doc}: no data for the blocks {', '.join(missing)}")
    doc.write_text(text)
    return kept


def parse_sets(args: argparse.Namespace) -> dict[str, ResultSet]:
    sets = dict(SETS)
    overrides: dict[str, list[str]] = {}
    for o in args.override:
        exp, sep, kv = o.partition(":")
        key = exp if sep and exp in EXPERIMENTS else "*"
        overrides.setdefault(key, []).append(kv if key != "*" else o)
    for spec in args.ledger:
        name, sep, path = spec.partition("=")
        if not sep:
            sys.exit(f"--ledger {spec!r}: expected NAME=PATH")
        sets[name] = ResultSet(tuple(args.experiments), ledger=path,
                               overrides={k: tuple(v) for k, v in overrides.items()})
    return sets


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=REPO / "outputs" / "fleet-results")
    ap.add_argument("--from", dest="src", type=Path, help="render the runs under this DIR")
    ap.add_argument("--sets", nargs="+", help="default: every set (--from: every set there)")
    ap.add_argument("--ledger", action="append", default=[], metavar="NAME=PATH")
    ap.add_argument("--experiments", nargs="+", default=list(EXPERIMENTS), choices=EXPERIMENTS)
    ap.add_argument("--override", action="append", default=[], metavar="[EXP:]KEY=VALUE")
    ap.add_argument("--write-doc", type=Path, metavar="DOC")
    ap.add_argument("--data", type=Path, default=os.environ.get("REPLAYLAB_SHARED_DATA"),
                    help="the folder of the full public downloads (azure, mooncake, burstgpt)")
    args = ap.parse_args()
    known = parse_sets(args)
    root = (args.src or args.out).resolve()
    if args.src:
        names = args.sets or sorted(p.name for p in root.iterdir()
                                    if p.is_dir() and p.name != "data")
    else:
        names = args.sets or [*SETS, *(s.partition("=")[0] for s in args.ledger)]
        for name in names:
            if name not in known:
                sys.exit(f"--sets {name}: unknown; one of {', '.join(known)}")
            run_set(name, known[name], root, args.data)
    blocks = {f"{n}/{k}": v for n in names
              for k, v in render_set(root / n, refresh=bool(args.src)).items()}
    tables = root / "results-fleet-tables.md"
    tables.write_text("\n\n".join(wrapped(k, v) for k, v in blocks.items()) + "\n")
    print(f"wrote {tables} ({len(blocks)} blocks)")
    if args.write_doc:
        kept = write_doc(args.write_doc, blocks, names)
        print(f"wrote {args.write_doc}" + (f"; kept {', '.join(kept)}" if kept else ""))


if __name__ == "__main__":
    main()
