"""The demand report: the model against its baselines, calibration, groups, residuals.

Pure functions of a test-predictions frame and the run summary plus the output
folder they are handed; no MLflow here (the pipeline logs what these write).
The HTML embeds its figures as base64 PNG, so the single file opens anywhere.

Predictions: one row per test request with ``y`` (actual total tokens, NaN when
usage is absent), ``censored``, ``absent_usage`` (optionally ``cancelled``), the
group columns, and per predictor P the columns ``P-q0.1``, ``P-q0.5``,
``P-q0.9``, ``P-lo-80``, ``P-hi-80``.
"""

from __future__ import annotations

import base64
import html
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from replaylab.tracking.report import _pyplot

MODEL = "model"
BASELINES = ("prompt_length", "max_tokens_cap", "category_bucket", "session_ewma")
GROUP_COLUMNS = ("selected_model", "category", "slo_class")
MIN_GROUP_N = 200
COLORS = {MODEL: "#1f5fa8", "prompt_length": "#e39b54", "max_tokens_cap": "#9a9a9a",
          "category_bucket": "#6aa56a", "session_ewma": "#b07cc6"}
GOOD, BAD, GREY = "#1f5fa8", "#c0392b", "#c8c8c8"


# ---------------------------------------------------------------- data helpers
def _get(d: Any, dotted: str, default: Any = None) -> Any:
    """``d['a']['b']`` for 'a.b'; keys may hold dots themselves ('pinball.0.9')."""
    if not isinstance(d, dict):
        return default
    if dotted in d:
        return d[dotted]
    parts = dotted.split(".")
    for i in range(len(parts) - 1, 0, -1):
        head = ".".join(parts[:i])
        if head in d:
            found = _get(d[head], ".".join(parts[i:]), _MISSING)
            if found is not _MISSING:
                return found
    return default


_MISSING = object()


def _num(x: Any) -> float:
    try:
        return float(x)
    except (TypeError, ValueError):
        return math.nan


def _fmt(x: Any, kind: str = "tok") -> str:
    v = _num(x)
    if math.isnan(v):
        return "—"
    if kind == "cov":
        return f"{v:.3f}"
    if kind == "int":
        return f"{int(round(v)):,}"
    return f"{v:,.1f}" if abs(v) < 1000 else f"{v:,.0f}"


def _predictors(pred: pd.DataFrame) -> list[str]:
    found = {c.rsplit("-q", 1)[0] for c in pred.columns if c.endswith("-q0.5")}
    order = [MODEL, *BASELINES]
    return [p for p in order if p in found] + sorted(found - set(order))


def _quantiles(pred: pd.DataFrame) -> list[float]:
    qs = sorted({float(c.rsplit("-q", 1)[1]) for c in pred.columns
                 if c.startswith(f"{MODEL}-q")})
    return qs or [0.1, 0.5, 0.9]


def _band(pred: pd.DataFrame, p: str) -> tuple[str, str]:
    """The calibrated interval's columns of predictor p ('P-lo-80', 'P-hi-80')."""
    lo = next((c for c in pred.columns if c.startswith(f"{p}-lo-")), f"{p}-lo-80")
    return lo, lo.replace("-lo-", "-hi-", 1)


def _flag(pred: pd.DataFrame, col: str) -> pd.Series:
    if col not in pred:
        return pd.Series(False, index=pred.index)
    return pred[col].fillna(False).astype(bool)


def _eval_mask(pred: pd.DataFrame) -> pd.Series:
    """Rows scored by pinball and coverage: usage present, not censored, not cancelled."""
    y = pd.to_numeric(pred["y"], errors="coerce") if "y" in pred else pd.Series(
        np.nan, index=pred.index)
    return (y.notna() & ~_flag(pred, "censored") & ~_flag(pred, "absent_usage")
            & ~_flag(pred, "cancelled"))


def _prepare(pred: pd.DataFrame) -> pd.DataFrame:
    """Plain float64 for y and every predictor column (nullable Parquet dtypes become NaN)."""
    pred = pred.copy()
    for c in pred.columns:
        if c == "y" or any(c.startswith(f"{p}-") for p in _predictors(pred)):
            pred[c] = pd.to_numeric(pred[c], errors="coerce").astype("float64")
    if "y" not in pred:
        pred["y"] = np.nan
    return pred


def _pinball(y: np.ndarray, q: np.ndarray, tau: float) -> float:
    ok = np.isfinite(y) & np.isfinite(q)
    if not ok.any():
        return math.nan
    d = y[ok] - q[ok]
    return float(np.mean(np.maximum(tau * d, (tau - 1) * d)))


def _metrics(pred: pd.DataFrame, p: str, qs: list[float]) -> dict[str, Any]:
    """Recompute one predictor's metrics on the given (already masked) rows."""
    y = pred["y"].to_numpy(float)
    pin = {str(t): _pinball(y, pred[f"{p}-q{t}"].to_numpy(float), t) for t in qs
           if f"{p}-q{t}" in pred}
    lo_c, hi_c = _band(pred, p)
    lo = pred.get(lo_c, pred.get(f"{p}-q{qs[0]}"))
    hi = pred.get(hi_c, pred.get(f"{p}-q{qs[-1]}"))
    cov = width = math.nan
    if lo is not None and hi is not None and len(pred):
        lo_a, hi_a = lo.to_numpy(float), hi.to_numpy(float)
        cov = float(np.mean((y >= lo_a) & (y <= hi_a)))  # a missing bound covers nothing
        w = hi_a - lo_a
        width = float(np.mean(w[np.isfinite(w)])) if np.isfinite(w).any() else math.nan
    vals = [v for v in pin.values() if not math.isnan(v)]
    return {"pinball": pin, "mean_pinball": float(np.mean(vals)) if vals else math.nan,
            "coverage": cov, "mean_width": width}


def _mean_pinball(m: dict | None) -> float:
    if not m:
        return math.nan
    if "mean_pinball" in m:
        return _num(m["mean_pinball"])
    vals = [_num(v) for v in (m.get("pinball") or {}).values()]
    return float(np.mean(vals)) if vals else math.nan


def _scores(summary: dict) -> dict[str, dict]:
    """{predictor: metrics} from summary.json's test.model and test.baselines."""
    out = {MODEL: dict(_get(summary, "test.model") or {})}
    out.update({b: dict(m) for b, m in (_get(summary, "test.baselines") or {}).items()})
    for m in out.values():
        m.setdefault("mean_pinball", _mean_pinball(m))
    return out


def _best_baseline(scores: dict[str, dict], key: str) -> str | None:
    cands = [(v, b) for b, m in scores.items() if b != MODEL
             and not math.isnan(v := _num(_get(m, key)))]
    return min(cands)[1] if cands else None


# ---------------------------------------------------------------- figures
def _save(fig, plt, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _fig_baselines(plt, scores, qs, interval, path):
    from matplotlib.ticker import FuncFormatter, NullFormatter

    preds = list(scores)
    fig, (a, b) = plt.subplots(1, 2, figsize=(11.5, 4.4), gridspec_kw={"width_ratios": [3, 2]})
    labels = [f"q{t}" for t in qs] + ["mean"]
    vals = {p: [_num(_get(scores[p], f"pinball.{t}")) for t in qs] + [scores[p]["mean_pinball"]]
            for p in preds}
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
        cw, cc = _num(scores[p].get("mean_width")), _num(scores[p].get("coverage"))
        if math.isnan(cc) or not cw > 0:
            skipped.append(f"{p} (width {_fmt(cw)}, coverage {_fmt(cc, 'cov')})")
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
    return _save(fig, plt, path)


def _fig_reliability(plt, rel, interval, path):
    fig, ax = plt.subplots(figsize=(5.6, 4.6))
    nom = np.array([_num(r.get("nominal")) for r in rel])
    obs = np.array([_num(r.get("observed")) for r in rel])
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
    return _save(fig, plt, path)


def _fig_groups(plt, rows, by, interval, path, most=25):
    shown = sorted(rows, key=lambda r: -r["n"])[:most][::-1]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11.5, 1.4 + 0.36 * len(shown)), sharey=True)
    a.axvspan(interval - 0.08, interval + 0.08, color="#dff0d8")
    a.axvline(interval, color="black", lw=0.8, ls="--")
    b.axvline(1.0, color="black", lw=0.8)
    ratios = [_num(r.get("ratio")) for r in shown]
    d = max([0.1, *[abs(v - 1) * 1.6 for v in ratios if not math.isnan(v)]])
    for i, r in enumerate(shown):
        cov, small, ratio = _num(r["coverage"]), r["n"] < MIN_GROUP_N, ratios[i]
        inside = abs(cov - interval) <= 0.08 + 1e-12
        ink = "#777" if small else "black"
        a.barh(i, cov, color=GREY if small else (GOOD if inside else BAD), height=0.7)
        a.text((0 if math.isnan(cov) else min(cov, 1.0)) + 0.01, i,
               f"{_fmt(cov, 'cov')}  n={r['n']:,}", va="center", fontsize=8, color=ink)
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
    return _save(fig, plt, path)


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
    return _save(fig, plt, path)


def _fig_scatter(plt, pred, ev_mask, best, path, seed=0, sample=4000):
    panels = [p for p in (MODEL, best) if p]
    fig, axes = plt.subplots(1, len(panels), figsize=(5.6 * len(panels), 4.6), squeeze=False)
    cens = _flag(pred, "censored") & pd.to_numeric(pred["y"], errors="coerce").notna()
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
    return _save(fig, plt, path)


def _group_rows(pred: pd.DataFrame, summary: dict, preds: list[str], qs, interval):
    """Per (by, value): n, coverage, pinball from summary (else recomputed), plus the
    model's mean pinball over the best baseline's in that group (summary's
    best_baseline when given, else recomputed from the predictions)."""
    ev = pred[_eval_mask(pred)]
    listed = _get(summary, "test.groups") or []
    bys = list(dict.fromkeys([g["by"] for g in listed] or
                             [c for c in GROUP_COLUMNS if c in pred]))
    out: dict[str, list[dict]] = {}
    for by in bys:
        rows = [dict(g) for g in listed if g["by"] == by]
        if not rows and by in ev:
            rows = [{"by": by, "value": v, "n": len(sub), **_metrics(sub, MODEL, qs)}
                    for v, sub in ev.groupby(by, observed=True)]
        for r in rows:
            if r.get("best_baseline") and not math.isnan(_num(r.get("best_baseline_mean_pinball"))):
                r["best"], r["best_mean_pinball"] = r["best_baseline"], _num(
                    r["best_baseline_mean_pinball"])
                r["model_mean_pinball"] = _mean_pinball(r)
                r["best_from"] = "summary"
            else:  # recompute from the predictions
                sub = ev[ev[by].astype(str) == str(r["value"])] if by in ev else ev.iloc[:0]
                mp = {p: _metrics(sub, p, qs)["mean_pinball"] for p in preds} if len(sub) else {}
                base = {b: v for b, v in mp.items() if b != MODEL and not math.isnan(v)}
                r["model_mean_pinball"] = _mean_pinball(r) if r.get("pinball") else mp.get(MODEL)
                if base:
                    r["best"] = min(base, key=base.get)
                    r["best_mean_pinball"] = base[r["best"]]
                    r["best_from"] = "predictions"
            b = _num(r.get("best_mean_pinball"))
            r["ratio"] = _num(r.get("model_mean_pinball")) / b if b > 0 else math.nan
        out[by] = rows
    return out


def demand_figures(predictions: pd.DataFrame, summary: dict, out_dir: Path) -> dict[str, Path]:
    """Write the report's PNG figures under out_dir; return {name: path} (none when no
    test row could be scored)."""
    plt = _pyplot()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    predictions = _prepare(predictions)
    preds, qs = _predictors(predictions), _quantiles(predictions)
    interval = _num(summary.get("interval", 0.8))
    scores = _scores(summary)
    paths: dict[str, Path] = {}
    mask = _eval_mask(predictions)
    if MODEL not in preds or not mask.any():
        return paths
    best = _best_baseline(scores, "mean_pinball")
    best = best if best in preds else None
    if any(scores[p].get("pinball") for p in scores):
        paths["baselines"] = _fig_baselines(plt, scores, qs, interval,
                                            out_dir / "demand_baselines.png")
    rel = _get(summary, "test.reliability") or []
    if rel:
        paths["reliability"] = _fig_reliability(plt, rel, interval,
                                                out_dir / "demand_reliability.png")
    for by, rows in _group_rows(predictions, summary, preds, qs, interval).items():
        if rows:
            paths[f"groups_{by}"] = _fig_groups(plt, rows, by, interval,
                                                out_dir / f"demand_groups_{by}.png")
    ev = predictions[mask]
    paths["residuals"] = _fig_residuals(plt, ev, qs, preds, best,
                                        out_dir / "demand_residuals.png")
    paths["scatter"] = _fig_scatter(plt, predictions, mask, best, out_dir / "demand_scatter.png")
    return paths


# ---------------------------------------------------------------- HTML
_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;max-width:1180px;
 margin:24px auto;padding:0 20px;color:#222;line-height:1.45}
h1{margin-bottom:4px}h2{border-bottom:2px solid #e4e4e4;padding-bottom:4px;margin-top:36px}
.src{color:#666;font-size:.88em;margin:4px 0 10px}
table{border-collapse:collapse;margin:8px 0 14px;font-size:.92em}
th,td{border:1px solid #ddd;padding:4px 10px;text-align:right}
th:first-child,td:first-child,td.l,th.l{text-align:left}thead th{background:#f4f6f9}
tr.model td{background:#eef4fc;font-weight:600}td.best{text-decoration:underline}
.ok,.bad,.warn{border-radius:4px;padding:1px 7px;font-weight:600;font-size:.9em}
.ok{background:#dff0d8;color:#2d6a2d}.bad{background:#f8d7d4;color:#a12a1d}
.warn{background:#fcf0cf;color:#7a5a00}
.box{border-left:4px solid #a12a1d;background:#fbeeed;padding:8px 14px;margin:10px 0}
figure{margin:10px 0 18px}img{max-width:100%;display:block;border:1px solid #eee}
figcaption{color:#555;font-size:.88em;margin-top:4px}
code{background:#f3f3f3;padding:0 3px;border-radius:3px}
pre{background:#f7f7f7;padding:10px;overflow-x:auto;font-size:.82em}
ul{margin-top:4px}.row{display:flex;gap:28px;align-items:flex-start}
.row figure{flex:0 1 620px}
"""

_TREATMENT = {
    "label": "Usage present, prompt known, output not cut: a regression label in training and "
             "calibration; on test, scored by pinball, coverage and width.",
    "length": "finish_reason = length: the output hit the cap, so the observed total is a "
              "lower bound (the cap itself is never a label). Not a label; kept out of "
              "pinball and coverage; scored apart below.",
    "censored": "The output is a lower bound (cut by the cap, cancelled or failed). Not a "
                "label; kept out of pinball and coverage; scored apart below.",
    "cancelled": "finish_reason = cancelled or lifecycle aborted: partial output, a lower "
                 "bound. Treated like length rows.",
    "failed": "Lifecycle failed or finish_reason = error: partial output, a lower bound. "
              "Treated like length rows.",
    "absent_usage": "completion_tokens null (not zero): no label. Excluded from training and "
                    "scoring; counted.",
    "prompt_absent": "Usage present but prompt_tokens null: no total. Excluded from training "
                     "and scoring; counted.",
}

_METRICS = (("pinball.0.1", "pinball q0.1"), ("pinball.0.5", "pinball q0.5"),
            ("pinball.0.9", "pinball q0.9"), ("mean_pinball", "mean pinball"),
            ("coverage", "coverage"), ("mean_width", "mean width"), ("mae_p50", "MAE of p50"))


def _e(x: Any) -> str:
    return html.escape(str(x))


def _badge(ok: bool | None, yes: str = "pass", no: str = "fail") -> str:
    if ok is None:
        return "<span class='warn'>n/a</span>"
    return f"<span class='{'ok' if ok else 'bad'}'>{_e(yes if ok else no)}</span>"


def _table(head: list[str], rows: list[list[str]], row_cls: list[str] | None = None) -> str:
    """Cells are text (right-aligned) or ready '<td ...>' markup; a header is left-aligned
    when its column's first cell is."""
    first = rows[0] if rows else []
    th = "".join(f"<th class='{'l' if j < len(first) and first[j].startswith(TD_L) else ''}'>"
                 f"{h}</th>" for j, h in enumerate(head))
    body = "".join(
        f"<tr class='{(row_cls or [''] * len(rows))[i]}'>" + "".join(
            c if c.startswith("<td") else f"<td>{c}</td>" for c in r) + "</tr>"
        for i, r in enumerate(rows))
    return f"<table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"


TD_L = "<td class='l'"


def _img(path: Path | None, caption: str) -> str:
    if path is None or not Path(path).exists():
        return f"<p class='src'>(figure not drawn: {_e(caption)})</p>"
    data = base64.b64encode(Path(path).read_bytes()).decode("ascii")
    return (f"<figure><img alt='{_e(Path(path).stem)}' src='data:image/png;base64,{data}'>"
            f"<figcaption>{caption}</figcaption></figure>")


def _kind(key: str) -> str:
    return "cov" if key == "coverage" else "tok"


def _verdict(scores, key, b, interval) -> tuple[bool | None, str]:
    """(model wins?, how the baseline was chosen) for one metric against baseline b."""
    mv, bv = _num(_get(scores[MODEL], key)), _num(_get(scores[b], key))
    if key == "coverage":
        if abs(mv - interval) <= 0.03 + 1e-12:
            return True, f"closest to {interval:.2f}"
        return abs(mv - interval) <= abs(bv - interval), f"closest to {interval:.2f}"
    if key == "mean_width":
        if _num(scores[MODEL].get("coverage")) < interval - 0.03:
            return None, "narrowest that covers"
        return mv <= bv, "narrowest that covers"
    return mv <= bv, "lowest"


def _baseline_section(scores, interval, src) -> str:
    rows, cls = [], []
    present = _metrics_present(scores)
    for p in scores:
        cells = [f"<td class='l'>{_e(p)}</td>"]
        for key, _ in present:
            best = _best_of(scores, key, interval, include_model=True) == p
            cells.append(f"<td class='{'best' if best else ''}'>"
                         f"{_fmt(_get(scores[p], key), _kind(key))}</td>")
        rows.append(cells)
        cls.append("model" if p == MODEL else "")
    verdicts, beaten = [], []
    for key, label in present:
        b = _best_of(scores, key, interval, include_model=False)
        if b is None:
            verdicts.append([f"<td class='l'>{label}</td>", "<td class='l'>none that "
                             f"covers {interval - 0.03:.2f}</td>", "—",
                             _fmt(_get(scores[MODEL], key), _kind(key)), _badge(None)])
            continue
        mv, bv = _num(_get(scores[MODEL], key)), _num(_get(scores[b], key))
        wins, how = _verdict(scores, key, b, interval)
        rel = "" if key == "coverage" or not bv else f" ({(mv - bv) / bv:+.1%})"
        if wins is False:
            beaten.append(f"{_e(b)} beats the model on {label}: {_fmt(bv, _kind(key))} "
                          f"against {_fmt(mv, _kind(key))}")
        verdicts.append([f"<td class='l'>{label}</td>", f"<td class='l'>{_e(b)} ({how})</td>",
                         _fmt(bv, _kind(key)), _fmt(mv, _kind(key)) + rel,
                         _badge(wins, "model within target" if key == "coverage"
                                else "model better", "baseline better")])
    plain = ("<div class='box'><b>Where a baseline beats the model:</b><ul>" + "".join(
        f"<li>{s}</li>" for s in beaten) + "</ul></div>") if beaten else (
        "<p><span class='ok'>No baseline beats the model on any metric below.</span></p>")
    return (f"<p class='src'>From summary.json <code>test.model</code> and "
            f"<code>test.baselines</code>; {src}. Underlined: best in column (coverage: "
            f"closest to {interval:.2f}; width: narrowest with coverage ≥ "
            f"{interval - 0.03:.2f}).</p>"
            + _table(["predictor", *[label for _, label in present]], rows, cls)
            + "<h3>Best baseline per metric</h3>" + plain
            + _table(["metric", "best baseline", "baseline", "model", "verdict"], verdicts))


def _metrics_present(scores) -> list[tuple[str, str]]:
    return [(k, label) for k, label in _METRICS
            if any(not math.isnan(_num(_get(m, k))) for m in scores.values())]


def _best_of(scores, key, interval, include_model) -> str | None:
    """Lowest value; coverage: closest to nominal; width: narrowest among those whose
    coverage reaches nominal - 0.03 (a zero-width interval that covers nothing is no win)."""
    cands = []
    for p, m in scores.items():
        v = _num(_get(m, key))
        if (p == MODEL and not include_model) or math.isnan(v):
            continue
        if key == "mean_width" and not _num(m.get("coverage")) >= interval - 0.03:
            continue
        cands.append((abs(v - interval) if key == "coverage" else v, p))
    return min(cands)[1] if cands else None


def _targets(scores, groups, interval) -> str:
    m = scores.get(MODEL, {})
    cov = _num(m.get("coverage"))
    big = [g for rows in groups.values() for g in rows if g["n"] >= MIN_GROUP_N]
    off = [g for g in big if abs(_num(g["coverage"]) - interval) > 0.08 + 1e-12]
    base = [b for b in scores if b != MODEL]
    p9 = [b for b in base if not _num(_get(m, "pinball.0.9")) < _num(_get(scores[b], "pinball.0.9"))]
    mp = [b for b in base if not _num(m.get("mean_pinball")) < _num(scores[b].get("mean_pinball"))]
    rows = [
        [f"<td class='l'>coverage of the {interval:.0%} interval within "
         f"{interval - 0.03:.2f}–{interval + 0.03:.2f}</td>", _fmt(cov, "cov"),
         _badge(None if math.isnan(cov) else abs(cov - interval) <= 0.03 + 1e-12)],
        [f"<td class='l'>every group with n ≥ {MIN_GROUP_N} within "
         f"{interval - 0.08:.2f}–{interval + 0.08:.2f}</td>",
         f"{len(big) - len(off)} of {len(big)} groups" + (
             "; outside: " + ", ".join(f"{_e(g['by'])}={_e(g['value'])} "
                                       f"({_fmt(g['coverage'], 'cov')})" for g in off)
             if off else ""), _badge(not off if big else None)],
        ["<td class='l'>pinball q0.9 below every baseline</td>",
         "not below: " + ", ".join(p9) if p9 else "below all", _badge(not p9 if base else None)],
        ["<td class='l'>mean pinball below every baseline</td>",
         "not below: " + ", ".join(mp) if mp else "below all", _badge(not mp if base else None)],
    ]
    return _table(["target", "measured", ""], rows)


def _group_table(rows, interval, src) -> str:
    body = []
    for g in sorted(rows, key=lambda r: -r["n"]):
        small = g["n"] < MIN_GROUP_N
        body.append([f"<td class='l'>{_e(g['value'])}</td>", _fmt(g["n"], "int"),
                     _fmt(g.get("coverage"), "cov"),
                     *[_fmt(_get(g, f"pinball.{t}")) for t in ("0.1", "0.5", "0.9")],
                     _fmt(g.get("model_mean_pinball")),
                     _fmt(g.get("best_mean_pinball")) + f" ({_e(g.get('best', '—'))})",
                     f"<span class='warn'>n &lt; {MIN_GROUP_N}: not held to the band</span>" if small
                     else _badge(abs(_num(g.get("coverage")) - interval) <= 0.08 + 1e-12)])
    whence = {g.get("best_from") for g in rows} - {None}
    return (f"<p class='src'>n, coverage and model pinball from summary.json "
            f"<code>test.groups</code>; best baseline's mean pinball from "
            f"{' and '.join(sorted(w.replace('summary', 'summary.json') for w in whence)) or '—'}"
            f"; {src}.</p>"
            + _table(["group", "n", "coverage", "pinball q0.1", "pinball q0.5", "pinball q0.9",
                      "mean pinball", "best baseline's mean pinball", "band"], body))


_LOWER_BOUND = ("length", "cancelled", "failed", "censored")


def _classes(pred: pd.DataFrame) -> pd.Series:
    """Each test row's label class: the pipeline's label_class, else from the flags."""
    if "label_class" in pred:
        return pred["label_class"].astype(str)
    conds = [_flag(pred, "absent_usage"), _flag(pred, "cancelled"), _flag(pred, "censored"),
             _eval_mask(pred)]
    return pd.Series(np.select(conds, ["absent_usage", "cancelled", "censored", "label"],
                               "no_total"), index=pred.index)


def _counts_section(pred, summary, n_eval, src) -> str:
    labels = summary.get("labels") or {}
    by_reason = labels.get("censored_by_reason") or {}
    cls = _classes(pred)
    usable = [labels.get(k) for k in ("train", "calibration", "test", "embargo")]
    all_splits = {"label": sum(int(_num(v)) for v in usable if not math.isnan(_num(v)))
                  if any(v is not None for v in usable) else None,
                  "censored": labels.get("censored"), "cancelled": by_reason.get(
                      "cancelled", labels.get("cancelled")),
                  "absent_usage": labels.get("absent_usage"),
                  "prompt_absent": labels.get("prompt_absent"),
                  "length": by_reason.get("length"), "failed": by_reason.get("failed")}
    order = (["label", "length", "cancelled", "failed", "absent_usage", "prompt_absent"]
             if "label_class" in pred else ["label", "censored", "cancelled", "absent_usage"])
    order += sorted(set(cls) - set(order))
    treat = {**_TREATMENT, **(summary.get("treatment") or {})}
    rows = []
    for c in order:
        n_test, n_all = int((cls == c).sum()), all_splits.get(c)
        known = "label_class" in pred or c in pred or n_all is not None or c == "label"
        how = treat.get(c, "") if known else (
            "not reported by this run (no column in the predictions, no count in "
            "summary.labels)")
        rows.append([f"<td class='l'>{_e(c)}</td>", _fmt(n_test, "int") if known else "—",
                     _fmt(n_all, "int"), f"<td class='l'>{_e(how)}</td>"])
    out = (f"<p class='src'>Test rows by class from the predictions ({len(pred):,} test rows"
           f"{', column label_class' if 'label_class' in pred else ''}); all splits from "
           f"summary.json <code>labels</code> (usable labels: train "
           f"{_fmt(labels.get('train'), 'int')}, calibration "
           f"{_fmt(labels.get('calibration'), 'int')}, test {_fmt(labels.get('test'), 'int')}"
           f"{', embargo ' + _fmt(labels['embargo'], 'int') if 'embargo' in labels else ''})"
           "; lower bounds count in every split.</p>"
           + _table(["class", "test rows", "all splits", "treatment"], rows))
    preds = _predictors(pred)
    crows = []
    for c in [c for c in order if c in _LOWER_BOUND]:
        sub = pred[(cls == c) & pred["y"].notna()]
        if len(sub):
            y = sub["y"].to_numpy(float)
            crows.append([f"<td class='l'>{_e(c)}</td>", _fmt(len(sub), "int"), *[
                _fmt(np.mean(sub[_band(sub, p)[1]].to_numpy(float) >= y), "cov")
                if _band(sub, p)[1] in sub else "—" for p in preds]])
    if crows:
        cs = _get(summary, "test.censored") or {}
        out += ("<h3>Lower-bounded rows: does the upper bound reach the observed total?</h3>"
                "<p class='src'>Share of rows with interval upper bound ≥ observed total, "
                "recomputed from the predictions (a miss is a sure miss of the true demand; a "
                "hit is necessary, not sufficient). summary.json <code>test.censored</code>: "
                f"n = {_fmt(cs.get('n'), 'int')}, model share "
                f"{_fmt(cs.get('hi_at_least_observed'), 'cov')}; {src}.</p>"
                + _table(["class", "rows", *[_e(p) for p in preds]], crows))
    return out


def _versions_section(summary, pred, n_eval) -> str:
    facts = {
        "ledger fingerprint": summary.get("ledger_fingerprint"),
        "projection version": _get(summary, "projection.version"),
        "pipeline": summary.get("pipeline", "demand"),
        "interval (nominal)": summary.get("interval"),
        "rows read / valid / quarantined": " / ".join(
            _fmt(summary.get(k), "int") for k in ("rows_read", "rows_valid", "rows_quarantined")),
        "quarantine by reason": json.dumps(summary.get("quarantine_by_reason") or {}),
        "labels": json.dumps(summary.get("labels") or {}),
        "test rows in predictions / scored": f"{len(pred):,} / {n_eval:,}",
    }
    rows = [[f"<td class='l'>{_e(k)}</td>", f"<td class='l'><code>{_e(v)}</code></td>"]
            for k, v in facts.items()]
    return (_table(["fact", "value"], rows)
            + "<details><summary>Full summary.json</summary><pre>"
            + _e(json.dumps(summary, indent=2, default=str)) + "</pre></details>")


def write_demand_report(predictions: pd.DataFrame, summary: dict, out_dir: Path) -> Path:
    """Write out_dir/demand_report.html (figures embedded) and its PNGs; return the path."""
    out_dir = Path(out_dir)
    figs = demand_figures(predictions, summary, out_dir / "figures")
    predictions = _prepare(predictions)
    preds, qs = _predictors(predictions), _quantiles(predictions)
    interval = _num(summary.get("interval", 0.8))
    mask = _eval_mask(predictions)
    n_eval = next((int(v) for v in (_get(summary, "test.model.n"),
                                    _get(summary, "test.labelled_rows")) if _num(v) >= 0),
                  int(mask.sum()))
    fp = str(summary.get("ledger_fingerprint") or "unknown")
    src = (f"measured on {n_eval:,} scored test rows of ledger <code>{_e(fp[:16])}</code>, "
           f"projection <code>{_e(_get(summary, 'projection.version', '?'))}</code>")
    scores = _scores(summary)
    reason = summary.get("error") or summary.get("reason") or summary.get("not_trained_reason")
    parts = [f"<h1>Demand model: total tokens before dispatch</h1><p class='src'>Quantiles "
             f"{', '.join(str(q) for q in qs)}, calibrated {interval:.0%} interval; {src}; "
             f"predictors: {_e(', '.join(preds) or 'none')}.</p>"]
    if reason or MODEL not in preds or not mask.any() or not scores[MODEL]:
        why = reason or ("no test row has a usable label" if MODEL in preds
                         else "no model predictions were written")
        parts.append(f"<div class='box'><b>Nothing could be trained or scored:</b> "
                     f"{_e(why)}</div>")
    else:
        groups = _group_rows(predictions, summary, preds, qs, interval)
        n_check = _metrics(predictions[mask], MODEL, qs)
        diff = abs(n_check["coverage"] - _num(scores[MODEL].get("coverage")))
        check = (f"<p class='src'>Cross-check from the predictions on the same rows: model "
                 f"coverage {_fmt(n_check['coverage'], 'cov')}, mean pinball "
                 f"{_fmt(n_check['mean_pinball'])} "
                 + (_badge(True, "agrees with summary") if diff < 0.005 else
                    "<span class='warn'>differs from summary.json</span>") + "</p>")
        parts += ["<h2>Targets</h2>", "<p class='src'>The issue's targets, from summary.json "
                  f"<code>test.model</code>, <code>test.baselines</code>, "
                  f"<code>test.groups</code>; {src}.</p>",
                  _targets(scores, groups, interval),
                  "<h2>Model against baselines</h2>", _baseline_section(scores, interval, src),
                  check, _img(figs.get("baselines"), (
                      "Left: pinball loss per quantile and their mean (a bar far above the "
                      "rest is clipped, its value printed on it). Right: coverage against mean "
                      f"width; green band is the coverage target. From summary.json; {src}."))]
        rel = _get(summary, "test.reliability") or []
        rel_table = _table(["nominal", "observed", "gap"], [
            [_fmt(r.get("nominal"), "cov"), _fmt(r.get("observed"), "cov"),
             f"{_num(r.get('observed')) - _num(r.get('nominal')):+.3f}"] for r in rel])
        parts += ["<h2>Reliability</h2><div class='row'>", _img(figs.get("reliability"), (
            f"Observed coverage of the calibrated model's interval at several nominal levels "
            f"(summary.json <code>test.reliability</code>); {src}.") if rel else
            "summary.json has no test.reliability"), rel_table if rel else "", "</div>"]
        parts.append("<h2>Coverage and pinball per group</h2>")
        for by, rows in groups.items():
            parts += [f"<h3>By {_e(by)}</h3>", _img(figs.get(f"groups_{by}"), (
                f"Left: coverage per {_e(by)}; dashed line {interval:.2f}, green band "
                f"{interval - 0.08:.2f}–{interval + 0.08:.2f}; red: outside it; grey: "
                f"n &lt; {MIN_GROUP_N}. Right: model's mean pinball over the best baseline's "
                f"in the same group; {src}.")), _group_table(rows, interval, src)]
        parts += ["<h2>Residuals</h2>", _img(figs.get("residuals"), (
            "Left: y − p50 for the model and the best baseline by mean pinball (symlog axis; "
            "bins are 2.5 tokens wide within ±10 and widen logarithmically beyond). "
            "Right: share of rows below q0.1, between the quantiles, above q0.9 (raw "
            f"quantiles, before calibration); dashed: the share a calibrated model gives; "
            f"{src}.")),
                  "<h2>Predicted against actual</h2>", _img(figs.get("scatter"), (
                      f"p50 against actual total tokens, log-log, up to 4,000 sampled rows "
                      f"per kind; censored rows (triangles) are lower bounds; {src}."))]
    parts += ["<h2>Censored, cancelled and absent usage</h2>",
              _counts_section(predictions, summary, n_eval, src),
              "<h2>Data and versions</h2>", _versions_section(summary, predictions, n_eval)]
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "demand_report.html"
    path.write_text("<!doctype html><html lang='en'><head><meta charset='utf-8'>"
                    "<title>Demand model report</title>"
                    f"<style>{_CSS}</style></head><body>{''.join(parts)}</body></html>")
    return path
