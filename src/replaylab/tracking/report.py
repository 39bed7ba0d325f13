"""Report rendering: figures of a ledger and its projection, and a one-page HTML report.

Pure functions of data plus the output paths they are handed; no MLflow here
(the entry points log what these write).
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from replaylab.contracts import Ledger as L
from replaylab.contracts import has_values

_SPLIT_COLORS = {"train": "#4C72B0", "calibration": "#DD8452", "test": "#55A868",
                 "embargo": "#999999"}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only, no screen
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, plt, path: Path) -> Path:
    """Write a figure as PNG (tight layout, 110 dpi) into a folder made if needed; close it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _token_histograms(ledger: pd.DataFrame, ax_prompt, ax_output) -> None:
    cats = ledger[L.CATEGORY].fillna("(none)") if has_values(ledger, L.CATEGORY) else pd.Series(
        "(all)", index=ledger.index)
    bins = np.logspace(0, 5.5, 50)
    for cat in sorted(cats.unique()):
        sel = cats == cat
        for ax, col in ((ax_prompt, L.PROMPT_TOKENS), (ax_output, L.COMPLETION_TOKENS)):
            vals = ledger.loc[sel, col].dropna().astype(float)
            vals = vals[vals > 0]
            if len(vals):
                ax.hist(vals, bins=bins, histtype="step", label=f"{cat} (n={len(vals):,})")
    for ax, name in ((ax_prompt, "prompt tokens"), (ax_output, "completion tokens")):
        ax.set_xscale("log")
        ax.set_xlabel(name)
        ax.set_ylabel("requests")
        ax.legend(fontsize=7)


def ledger_figures(ledger: pd.DataFrame, features: pd.DataFrame | None,
                   out_dir: Path) -> dict[str, Path]:
    """Write PNG figures of the ledger's distributions; return {name: path}."""
    plt = _pyplot()
    out_dir.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path] = {}

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 3.8))
    _token_histograms(ledger, a, b)
    fig.suptitle("Token lengths by category (measured in this ledger)")
    fig.tight_layout()
    paths["tokens_by_category"] = out_dir / "tokens_by_category.png"
    fig.savefig(paths["tokens_by_category"], dpi=110)
    plt.close(fig)

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 3.8))
    ts = pd.to_datetime(ledger[L.TIMESTAMP], unit="ms", utc=True)
    split = None
    if features is not None and "split" in features:
        split = ledger[L.REQUEST_ID].map(features.set_index(L.REQUEST_ID)["split"])
    groups = [("all", ts)] if split is None else [(s, ts[split == s]) for s in _SPLIT_COLORS]
    for name, t in groups:
        if len(t):
            per_min = t.dt.floor("min").value_counts().sort_index()
            a.plot(per_min.index, per_min.values, lw=0.8, label=name,
                   color=_SPLIT_COLORS.get(name))
    a.set_ylabel("requests per minute")
    a.set_title("Arrivals, coloured by split")
    a.legend(fontsize=7)
    a.tick_params(axis="x", labelrotation=30, labelsize=7)
    turns = ledger.groupby(L.SESSION_ID).size()
    b.hist(turns, bins=np.arange(1, turns.max() + 2) - 0.5)
    b.set_yscale("log")
    b.set_xlabel("turns per session")
    b.set_ylabel("sessions")
    b.set_title(f"Session lengths (n={turns.size:,} sessions)")
    fig.tight_layout()
    paths["arrivals_sessions"] = out_dir / "arrivals_sessions.png"
    fig.savefig(paths["arrivals_sessions"], dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 3.2))
    states = ledger[L.LIFECYCLE_STATE].astype(str)
    if has_values(ledger, L.FINISH_REASON):
        states = states + " / " + ledger[L.FINISH_REASON].fillna("-").astype(str)
    states.value_counts().sort_values().plot.barh(ax=ax)
    ax.set_xscale("log")
    ax.set_xlabel("requests")
    ax.set_title("Lifecycle state / finish reason")
    fig.tight_layout()
    paths["outcomes"] = out_dir / "lifecycle.png"
    fig.savefig(paths["outcomes"], dpi=110)
    plt.close(fig)
    return paths


def write_html_report(path: Path, title: str, facts: dict[str, Any],
                      figures: dict[str, Path]) -> Path:
    """A self-contained page: a facts table and the figures (relative links)."""
    rows = "".join(
        f"<tr><th>{html.escape(str(k))}</th><td><code>"
        f"{html.escape(json.dumps(v, default=str) if isinstance(v, (dict, list)) else str(v))}"
        f"</code></td></tr>" for k, v in facts.items())
    imgs = "".join(
        f'<figure><img src="{html.escape(str(p.relative_to(path.parent)))}" '
        f'style="max-width:100%"><figcaption>{html.escape(n)}</figcaption></figure>'
        for n, p in figures.items())
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        f"<!doctype html><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<body style='font-family:sans-serif;max-width:1100px;margin:auto'>"
        f"<h1>{html.escape(title)}</h1><table>{rows}</table>{imgs}</body>")
    return path
