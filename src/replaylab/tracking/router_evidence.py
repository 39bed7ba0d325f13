"""The router reports' verdict box and OPE evidence, both modes (summary.json in, HTML out).

`verdict_box`: the word (GO, NO-GO, NOT ENOUGH EVIDENCE: `replaylab.verdict`), the objective
it was judged on, each criterion with its interval and line, and for NOT ENOUGH EVIDENCE
the sessions and days that would decide it. `ope_evidence_section`: IPS, SNIPS and DR side
by side at no clip and the automatic clip, the weight diagnostics, the high-confidence lower
bounds of the gain, and which other estimator or clip would flip the verdict
(`summary["ope"]["evidence"]`, router/ope_sums.py).
"""

from __future__ import annotations

from typing import Any

from replaylab.tracking.html import escape, section, table
from replaylab.verdict import GO, NO_GO, NOT_ENOUGH_EVIDENCE


def _f(x: Any, fmt: str = ".4f") -> str:
    try:
        return format(float(x), fmt)
    except (TypeError, ValueError):
        return "n/a"


def verdict_word(summary: dict) -> str:
    """The summary's verdict word; GO / NO-GO from its go for a summary without one."""
    for v in (summary.get("verdict"), (summary.get("headline") or {}).get("verdict")):
        if v in (GO, NO_GO, NOT_ENOUGH_EVIDENCE):
            return str(v)
    return GO if summary.get("go") is True else NO_GO


def word_badge(word: str) -> str:
    """GO green, NO-GO red, NOT ENOUGH EVIDENCE yellow."""
    cls = {GO: "ok", NO_GO: "bad"}.get(word, "warn")
    return f"<span class='{cls}'>{escape(word)}</span>"


def criteria_table(detail: dict) -> str:
    rows = []
    for c in detail.get("criteria") or []:
        op = (">" if c.get("strict") else ">=") if c.get("side") == "lower" else (
            "<" if c.get("strict") else "<=")
        bound = "lower" if c.get("side") == "lower" else "upper"
        rows.append([f"<td class='l'>{escape(str(c.get('name')))}</td>",
                     _f(c.get("estimate"), ".4g"),
                     f"[{_f((c.get('ci') or [None])[0], '.4g')}, "
                     f"{_f((c.get('ci') or [None, None])[1], '.4g')}]",
                     f"{bound} {op} {_f(c.get('line'), '.4g')}",
                     word_badge("pass") if c.get("passed") else "<span class='bad'>fails</span>"])
    return table(["criterion", "estimate", "95% CI", "must be", ""], rows) if rows else ""


def verdict_box(summary: dict) -> str:
    """The verdict, its objective, its criteria and (thin evidence) the data it needs."""
    word = verdict_word(summary)
    detail = summary.get("go_detail") or {}
    objective = (summary.get("objective") or {}).get("label", "")
    reasons = [str(r) for r in summary.get("go_reasons") or []]
    more = detail.get("more_data") or {}
    need = (f"<p><b>More data would decide it:</b> {escape(str(more.get('text')))}.</p>"
            if word == NOT_ENOUGH_EVIDENCE and more.get("text") else "")
    items = "".join(f"<li>{escape(r)}</li>" for r in reasons) or "<li>no reasons given</li>"
    cls = {GO: "go", NO_GO: "nogo"}.get(word, "nogo")
    return (f"<div class='verdict {cls}'><span class='big'>{escape(word)}</span>"
            f"{escape(objective)}<ul>{items}</ul></div>" + need + criteria_table(detail))


def ope_evidence_section(ope: dict) -> str:
    """IPS, SNIPS, DR at no clip and the automatic clip; weights; lower bounds; flips."""
    ev = ope.get("evidence")
    if not isinstance(ev, dict):
        return ""
    rows = []
    for key, v in (ev.get("variants") or {}).items():
        clip = "none" if v.get("clip") is None else f"auto: {_f(v.get('clip'), 'g')}"
        if v.get("clip_level") == "auto" and v.get("clip") is None:
            clip = "auto: none"
        if v.get("clip_level") == "sequential":  # router.sequential: this look's intervals
            seq = ope.get("sequential") or {}
            clip = (f"none; sequential, look {seq.get('look')} of {seq.get('looks')} at alpha "
                    f"{_f(seq.get('alpha_look'), '.3g')} ({seq.get('spending')} spending)")

        def ci(d: Any, fmt: str = ".4f") -> str:
            d = d or {}
            lo, hi = (d.get("ci") or [None, None])[:2]
            return f"{_f(d.get('estimate'), fmt)} [{_f(lo, fmt)}, {_f(hi, fmt)}]"

        chosen = " (the gate's)" if key == ev.get("chosen") else ""
        rows.append([f"<td class='l'>{escape(str(v.get('estimator', '')).upper())}{chosen}</td>",
                     f"<td class='l'>{escape(clip)}</td>", ci(v.get("quality")),
                     ci(v.get("diff_quality"), "+.4f"), ci(v.get("diff_cost"), "+.3g")])
    w = ev.get("weights") or {}
    h = ev.get("hclb") or {}
    flips = ev.get("flips") or []
    diag = (f"<p class='src'>Weights of the served policy (1 / propensity where it agrees with "
            f"the logged choice): ESS {_f(w.get('ess'), '.1f')} of {w.get('n')} sessions "
            f"({_f(w.get('ess_share'), '.1%')}), largest weight {_f(w.get('max_weight'), '.3g')}, "
            f"the top 1% of sessions ({w.get('top1pct_sessions')}) hold "
            f"{_f(w.get('top1pct_weight_share'), '.0%')} of the total weight.</p>")
    failed = "".join(f"<div class='box'>overlap diagnostic fails: {escape(str(x))}</div>"
                     for x in w.get("failed") or [])
    bound = (f"<p>High-confidence lower bounds ({_f(h.get('level'), '.0%')} one-sided, "
             f"{escape(str(h.get('estimator')))}): quality gain "
             f"<b>{_f(h.get('quality_gain'), '+.4f')}</b>, cost saving "
             f"<b>{_f(h.get('cost_saving'), '+.3g')}</b> USD per opening call.</p>")
    flip = ("<div class='box'>Another reasonable choice would flip the verdict: "
            + escape("; ".join(flips)) + ".</div>" if flips else
            "<p class='src'>Every estimator at no clip and at the automatic clip gives the "
            "same verdict.</p>")
    auto = ev.get("auto_clip") or {}
    how = escape(str((auto.get("dr") or {}).get("by", "")))
    return section("OPE evidence: the served policy against the logging policy",
                   table(["estimator", "clip", "quality [95% CI]", "quality − logging",
                          "cost − logging (USD/call)"], rows),
                   f"<p class='src'>Automatic clip: {how}.</p>", diag, failed, bound, flip)
