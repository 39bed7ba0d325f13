"""Figures of a ledger and its projection (the project pipeline's report).

Pure functions of data plus the folder they are handed; no MLflow here (the
entry points log what these write). The page itself is
`replaylab.tracking.html.write_html_report`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from replaylab.contracts import Ledger as L
from replaylab.contracts import has_values
from replaylab.tracking.figures import pyplot, save_figure

_SPLIT_COLORS = {"train": "#4C72B0", "calibration": "#DD8452", "test": "#55A868",
                 "embargo": "#999999"}


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
    plt = pyplot()
    out_dir.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path] = {}

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 3.8))
    _token_histograms(ledger, a, b)
    fig.suptitle("Token lengths by category (measured in this ledger)")
    paths["tokens_by_category"] = save_figure(fig, plt, out_dir / "tokens_by_category.png")

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
    paths["arrivals_sessions"] = save_figure(fig, plt, out_dir / "arrivals_sessions.png")

    fig, ax = plt.subplots(figsize=(7, 3.2))
    states = ledger[L.LIFECYCLE_STATE].astype(str)
    if has_values(ledger, L.FINISH_REASON):
        states = states + " / " + ledger[L.FINISH_REASON].fillna("-").astype(str)
    states.value_counts().sort_values().plot.barh(ax=ax)
    ax.set_xscale("log")
    ax.set_xlabel("requests")
    ax.set_title("Lifecycle state / finish reason")
    paths["outcomes"] = save_figure(fig, plt, out_dir / "lifecycle.png")
    return paths
