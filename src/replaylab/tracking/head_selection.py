"""The `head_selection` table of both router reports (summary.json `head_selection`).

The candidate heads the run tried (clip, teachers, width), each one's calibration
figures (the criterion and the quality at its calibration operating point), which one
is served, and why (`replaylab.router.head_select`). Read from the summary only.
"""

from __future__ import annotations

from typing import Any

from replaylab.tracking.html import escape, facts_table, section, table


def _num(x: Any) -> str:
    if x is None:
        return "—"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, float):
        return f"{x:.4g}"
    if isinstance(x, list):
        return "[" + ", ".join(_num(v) for v in x) + "]"
    return escape(x)


def head_selection_section(summary: dict) -> str:
    """`<h2>` section: the candidates table and the reason ('' without a head_selection)."""
    sel = summary.get("head_selection")
    if not isinstance(sel, dict):
        return ""
    if not sel.get("enabled"):
        return section("Head hyperparameters (fixed)",
                       f"<p class='src'>{escape(sel.get('reason', ''))}</p>",
                       facts_table(sel.get("chosen") or {}))
    rows = sel.get("candidates") or []
    quality = "dr_quality" if any("dr_quality" in r for r in rows) else "quality"
    body = [[f"<td class='l'>{escape(r.get('stage', ''))}</td>", _num(r.get("max_weight")),
             _num(r.get("teachers")), _num(r.get("hidden")), _num(r.get("met")),
             _num(r.get("criterion")), _num(r.get(quality)), _num(r.get("threshold")),
             "<b>served</b>" if r.get("chosen") else ""] for r in rows]
    cls = ["model" if r.get("chosen") else "" for r in rows]
    return section(
        "Head hyperparameters, chosen on calibration",
        f"<p class='src'>Chosen on <b>{escape(sel.get('chosen_on', ''))}</b> "
        f"({escape(sel.get('search', ''))} search; test never looked at). Criterion, lower "
        f"is better: {escape(sel.get('criterion', ''))}. {escape(sel.get('reason', ''))}.</p>",
        table(["stage", "IPS clip (max_weight)", "teachers", "hidden", "target met",
               "criterion (calibration)", f"{quality.replace('_', ' ')} (calibration)",
               "threshold", ""], body, row_cls=cls))
