"""Figures of the demand report (demand_report.py renders them into one HTML page).

Pure functions of the predictions and the summary (read through demand_scores);
figures go to the folder they are handed. The predictions frame is described in
demand_report.py.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from replaylab.tracking.demand_scores import (
    MIN_GROUP_N,
    MODEL,
    best_baseline,
    flag_column,
    fmt_metric,
    group_rows,
    predictors,
    prepare_predictions,
    quantile_levels,
    scored_mask,
    summary_scores,
)
from replaylab.tracking.figures import BAD, GOOD, GREY, pyplot, save_figure
from replaylab.tracking.summary import lookup, to_float

COLORS = {MODEL: GOOD, "prompt_length": "#e39b54", "max_tokens_cap": "#9a9a9a",
          "category_bucket": "#6aa56a", "session_ewma": "#b07cc6"}


def _fig_baselines(plt, scores, qs, interval, path):
    from matplotlib.ticker import FuncFormatter, NullFormatter

    preds = list(scores)
    fig, (a, b) = plt.subplots(1, 2, figsize=(11.5, 4.4), gridspec_kw={"width_ratios": [3, 2]})
    labels = [f"q{t}" for t in qs] + ["mean"]
    vals = {p: [to_float(lookup(scores[p], f"pinball.{t}")) for t in qs]
            + [scores[p]["mean_pinball"]] for p in preds}
    peaks = sorted((np.nanmax(v) if not np.all(np.isnan(v)) else 0.0) for v in vals.values())
    # one far-off baseline (the cap) would flatten the rest: clip it and print its values
    top = peaks[-2] * 1.35 if len(peaks) > 1 and peaks[-1] > 3 * peaks[-2] > 0 else \
        peaks[-1] * 1.12 or 1.0
    x, w = np.arange(len(labels)), 0.8 / max(len(preds), 1)
    for i, p in enumerate(preds):
        xs = x + (i - (len(preds) - 1) / 2) * w
        a.bar(xs, np.minimum(vals[p], top), w, label=p, color=COLORS.get(p),
              edgecolor="black" if p == MODEL else "none", linewidth=1.2)
        for xi, v in zip(xs, vals[p], strict=True):
            if v > top:
                a.text(xi, top * 0.45, f"{v:,.0f} ↑", rotation=90, ha="center",
                       va="center", fontsize=8, color="white", fontweight="bold")
    a.set_ylim(0, top)
    a.set_xticks(x, labels)
    a.set_ylabel("pinball loss (tokens, lower is better)")
    a.set_title("Pinball loss per quantile")
    a.legend(fontsize=8, ncol=len(preds), loc="upper center", bbox_to_anchor=(0.5, -0.1),
             frameon=False, columnspacing=1.0, handlelength=1.2)
    a.grid(axis="y", alpha=0.3)
    lo, hi = interval - 0.03, interval + 0.03
    b.axhspan(lo, hi, color="#dff0d8", label=f"target {lo:.2f}–{hi:.2f}")
    b.axhline(interval, color="black", lw=0.8, ls="--")
    skipped, widths = [], []
    for p in preds:
        cw, cc = to_float(scores[p].get("mean_width")), to_float(scores[p].get("coverage"))
        if math.isnan(cc) or not cw > 0:
            skipped.append(f"{p} (width {fmt_metric(cw)}, coverage {fmt_metric(cc, 'cov')})")
            continue
        widths.append(cw)
        b.scatter(cw, cc, s=90 if p == MODEL else 50, color=COLORS.get(p), zorder=3,
                  edgecolor="black" if p == MODEL else "none")
        b.annotate(p, (cw, cc), xytext=(5, 4), textcoords="offset points", fontsize=8)
    if widths and max(widths) / min(widths) > 20:
        b.set_xscale("log")
        b.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
        b.xaxis.set_minor_formatter(NullFormatter())
    elif widths:
        b.set_xlim(min(widths) * 0.85, max(widths) * 1.2)
    if skipped:
        b.text(0.02, 0.03, "not drawn: " + "; ".join(skipped), transform=b.transAxes,
               fontsize=7, color="#555")
    b.set_ylim(0, 1.02)
    b.set_xlabel("mean interval width (tokens)")
    b.set_ylabel(f"coverage of the {interval:.0%} interval")
    b.set_title("Calibration against sharpness")
    b.legend(fontsize=8, loc="center right")
    b.grid(alpha=0.3)
    return save_figure(fig, plt, path)


def _fig_reliability(plt, rel, interval, path):
    fig, ax = plt.subplots(figsize=(5.6, 4.6))
    nom = np.array([to_float(r.get("nominal")) for r in rel])
    obs = np.array([to_float(r.get("observed")) for r in rel])
    ax.plot([0, 1], [0, 1], ls="--", color="grey", lw=1, label="perfect calibration")
    ax.fill_between([0, 1], [-0.03, 0.97], [0.03, 1.03], color="#dff0d8", label="±0.03")
    ax.plot(nom, obs, "o-", color=GOOD, label="model (calibrated)")
    for n, o in zip(nom, obs, strict=True):
        ax.annotate(f"{o:.2f}", (n, o), xytext=(-10, 7), textcoords="offset points", fontsize=8)
    sel = np.isclose(nom, interval)
    ax.scatter(nom[sel], obs[sel], s=120, facecolor="none", edgecolor="black",
               label=f"{interval:.0%} interval", zorder=4)
    lo = max(0.0, min(np.nanmin(nom), np.nanmin(obs)) - 0.1)
    ax.set_xlim(lo, 1)
    ax.set_ylim(lo, 1)
    ax.set_xlabel("nominal interval level")
    ax.set_ylabel("observed coverage on test")
    ax.set_title("Reliability: nominal against observed coverage")
    ax.legend(fontsize=8, loc="upper left")
    ax.grid(alpha=0.3)
    return save_figure(fig, plt, path)


def _fig_groups(plt, rows, by, interval, path, most=25):
    shown = sorted(rows, key=lambda r: -r["n"])[:most][::-1]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11.5, 1.4 + 0.36 * len(shown)), sharey=True)
    a.axvspan(interval - 0.08, interval + 0.08, color="#dff0d8")
    a.axvline(interval, color="black", lw=0.8, ls="--")
    b.axvline(1.0, color="black", lw=0.8)
    ratios = [to_float(r.get("ratio")) for r in shown]
    d = max([0.1, *[abs(v - 1) * 1.6 for v in ratios if not math.isnan(v)]])
    for i, r in enumerate(shown):
        cov, small, ratio = to_float(r["coverage"]), r["n"] < MIN_GROUP_N, ratios[i]
        inside = abs(cov - interval) <= 0.08 + 1e-12
        ink = "#777" if small else "black"
        a.barh(i, cov, color=GREY if small else (GOOD if inside else BAD), height=0.7)
        a.text((0 if math.isnan(cov) else min(cov, 1.0)) + 0.01, i,
               f"{fmt_metric(cov, 'cov')}  n={r['n']:,}", va="center", fontsize=8, color=ink)
        if not math.isnan(ratio):
            b.barh(i, ratio - 1, left=1, height=0.7,
                   color=GREY if small else (GOOD if ratio <= 1 else BAD))
            b.text(1 + (d * 0.03 if ratio <= 1 else -d * 0.03), i,
                   f"{ratio:.2f} vs {r.get('best', '?')}", va="center", fontsize=8, color=ink,
                   ha="left" if ratio <= 1 else "right")
    a.set_yticks(np.arange(len(shown)), [str(r["value"]) for r in shown])
    a.set_xlim(0, 1.25)
    more = f" ({len(shown)} largest of {len(rows)})" if len(rows) > len(shown) else ""
    a.set_xlabel(f"coverage of the {interval:.0%} interval "
                 f"(band {interval - 0.08:.2f}–{interval + 0.08:.2f}; grey: n < {MIN_GROUP_N})")
    a.set_title(f"Coverage by {by}{more}")
    b.set_xlim(1 - d, 1 + d)
    b.set_xlabel("mean pinball, model ÷ best baseline in the group (left of 1: model better)")
    b.set_title(f"Mean pinball against the best baseline, by {by}")
    for ax in (a, b):
        ax.grid(axis="x", alpha=0.3)
    return save_figure(fig, plt, path)


def _symlog_bins(r: np.ndarray, lin: float = 10.0) -> np.ndarray:
    top = max(float(np.nanmax(np.abs(r))) if r.size else lin, lin * 1.5)
    pos = np.logspace(np.log10(lin), np.log10(top) + 0.01, 28)
    return np.concatenate([-pos[::-1], np.linspace(-lin, lin, 9)[1:-1], pos])


def _fig_residuals(plt, ev, qs, preds, best, path):
    fig, (a, b) = plt.subplots(1, 2, figsize=(11.5, 4.0))
    y = ev["y"].to_numpy(float)
    res = {p: y - ev[f"{p}-q0.5"].to_numpy(float) for p in [MODEL, best] if p}
    res = {p: r[np.isfinite(r)] for p, r in res.items() if np.isfinite(r).any()}
    bins = _symlog_bins(np.concatenate([*res.values(), np.zeros(1)]))
    for p, r in res.items():
        a.hist(r, bins=bins, histtype="stepfilled" if p == MODEL else "step",
               alpha=0.55 if p == MODEL else 1, color=COLORS.get(p), lw=1.5,
               label=f"{p}: median {np.median(r):+,.0f}, y > p50 in {np.mean(r > 0):.0%}")
    a.axvline(0, color="black", lw=0.8)
    a.set_xscale("symlog", linthresh=10)
    a.set_xlabel("y − p50 (tokens, symlog; > 0: under-predicted)")
    a.set_ylabel("test requests")
    a.set_title("Residuals of the median")
    a.legend(fontsize=8)
    cats = [f"y < q{qs[0]}", f"q{qs[0]}–q0.5", f"q0.5–q{qs[-1]}", f"y > q{qs[-1]}"]
    expect = [qs[0], 0.5 - qs[0], qs[-1] - 0.5, 1 - qs[-1]]
    x = np.arange(4)
    w = 0.8 / len(preds)
    for i, p in enumerate(preds):
        lo, mid, hi = (ev[f"{p}-q{t}"].to_numpy(float) for t in (qs[0], 0.5, qs[-1]))
        ok = np.isfinite(lo) & np.isfinite(mid) & np.isfinite(hi)
        if not ok.any():
            continue
        yy, lo, mid, hi = y[ok], lo[ok], mid[ok], hi[ok]
        share = [np.mean(yy < lo), np.mean((yy >= lo) & (yy < mid)),
                 np.mean((yy >= mid) & (yy <= hi)), np.mean(yy > hi)]
        b.bar(x + (i - (len(preds) - 1) / 2) * w, share, w, color=COLORS.get(p), label=p,
              edgecolor="black" if p == MODEL else "none")
    for i, e in enumerate(expect):
        b.hlines(e, i - 0.45, i + 0.45, color="black", ls="--", lw=1.2,
                 label="expected if calibrated" if i == 0 else None)
    b.set_xticks(x, cats)
    b.set_ylabel("share of test requests")
    b.set_title("Where y falls among the raw quantiles (PIT-like)")
    b.legend(fontsize=8, ncol=2)
    b.grid(axis="y", alpha=0.3)
    return save_figure(fig, plt, path)


def _fig_scatter(plt, pred, ev_mask, best, path, seed=0, sample=4000):
    panels = [p for p in (MODEL, best) if p]
    fig, axes = plt.subplots(1, len(panels), figsize=(5.6 * len(panels), 4.6), squeeze=False)
    cens = flag_column(pred, "censored") & pd.to_numeric(pred["y"], errors="coerce").notna()
    rng = np.random.default_rng(seed)
    for ax, p in zip(axes[0], panels, strict=True):
        drawn: list[np.ndarray] = []
        for mask, kw in ((ev_mask, {"marker": ".", "label": "scored rows"}),
                         (cens, {"marker": "^", "color": "#e39b54",
                                 "label": "censored (actual is a lower bound)"})):
            idx = np.flatnonzero(mask.to_numpy())
            idx = rng.choice(idx, min(sample, idx.size), replace=False) if idx.size else idx
            xv = pred[f"{p}-q0.5"].to_numpy(float)[idx]
            yv = pred["y"].to_numpy(float)[idx]
            ok = (xv > 0) & (yv > 0)
            ax.scatter(xv[ok], yv[ok], s=6, alpha=0.3, color=kw.pop("color", COLORS.get(p)),
                       **kw)
            drawn += [xv[ok], yv[ok]]
        vals = np.concatenate(drawn) if drawn else np.array([1.0, 10.0])
        vals = vals if vals.size else np.array([1.0, 10.0])
        lims = [max(1.0, float(vals.min()) * 0.7), max(10.0, float(vals.max()) * 1.4)]
        ax.set_xlim(lims)
        ax.set_ylim(lims)
        ax.plot(lims, lims, color="black", lw=0.8, ls="--", label="y = p50")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(f"{p} p50 (tokens)")
        ax.set_ylabel("actual total tokens")
        ax.set_title(f"{p}: predicted median against actual")
        ax.legend(fontsize=8, loc="upper left", markerscale=3)
        ax.grid(alpha=0.3, which="major")
    return save_figure(fig, plt, path)


def demand_figures(predictions: pd.DataFrame, summary: dict, out_dir: Path) -> dict[str, Path]:
    """Write the report's PNG figures under out_dir; return {name: path} (none when no
    test row could be scored)."""
    plt = pyplot()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    predictions = prepare_predictions(predictions)
    preds, qs = predictors(predictions), quantile_levels(predictions)
    interval = to_float(summary.get("interval", 0.8))
    scores = summary_scores(summary)
    paths: dict[str, Path] = {}
    mask = scored_mask(predictions)
    if MODEL not in preds or not mask.any():
        return paths
    best = best_baseline(scores, "mean_pinball")
    best = best if best in preds else None
    if any(scores[p].get("pinball") for p in scores):
        paths["baselines"] = _fig_baselines(plt, scores, qs, interval,
                                            out_dir / "demand_baselines.png")
    rel = lookup(summary, "test.reliability") or []
    if rel:
        paths["reliability"] = _fig_reliability(plt, rel, interval,
                                                out_dir / "demand_reliability.png")
    for by, rows in group_rows(predictions, summary, preds, qs, interval).items():
        if rows:
            paths[f"groups_{by}"] = _fig_groups(plt, rows, by, interval,
                                                out_dir / f"demand_groups_{by}.png")
    ev = predictions[mask]
    paths["residuals"] = _fig_residuals(plt, ev, qs, preds, best,
                                        out_dir / "demand_residuals.png")
    paths["scatter"] = _fig_scatter(plt, predictions, mask, best, out_dir / "demand_scatter.png")
    return paths
