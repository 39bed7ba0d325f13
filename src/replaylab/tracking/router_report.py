"""The router's go/no-go report: verdict, policies, cost-quality curves, OPE, learning curve.

A pure function of the summary `train_router` returns (pipelines/router.py), the test
curves parquet it names (``artifacts.curves``, read only) and the folder it is handed:
writes out_dir/router_report.html (figures embedded as base64 PNG, like the demand
report, so the single file opens anywhere) and the PNGs under out_dir/figures/.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from replaylab.tracking.figures import GOOD, pyplot, save_figure
from replaylab.tracking.head_selection import head_selection_section
from replaylab.tracking.html import (
    CSS,
    badge,
    embedded_figure,
    escape,
    facts_table,
    page,
    section,
    table,
    write_page,
)
from replaylab.tracking.router_evidence import ope_evidence_section, verdict_box
from replaylab.tracking.summary import lookup, to_float

LEARNED = "learned"
REFERENCE = ("oracle",)  # reads the outcomes it routes on: a bound, never ranked
COLORS = {"learned": GOOD, "knn": "#2ca02c", "lgbm": "#9467bd", "rules": "#e07b24",
          "random": "#8c8c8c", "cheap_only": "#8c564b", "strong_only": "#c0392b",
          "oracle": "#222222"}
MARKS = "oDs^vPXh<>"  # no star: it marks the first significant point of the learning curve
# summary key, header, which way is better (None: descriptive), format
COLUMNS = (("quality", "quality [95% CI]", "max", "q"),
           ("cost", "cost USD/prompt [95% CI]", "min", "usd"),
           ("strong_share", "strong share", None, "q"), ("apgr", "APGR", "max", "q"),
           ("cpt50", "CPT50", "min", "q"), ("cpt80", "CPT80", "min", "q"),
           ("cost_ratio_at_95", "cost ratio at 95% (curve figure)", "min", "q"))
_MORE_CSS = """
.verdict{border-radius:6px;padding:12px 18px;margin:14px 0}.verdict .big{font-size:1.7em;
 font-weight:800;margin-right:10px}.go{background:#dff0d8;border-left:8px solid #2d6a2d}
.nogo{background:#f8d7d4;border-left:8px solid #a12a1d}.verdict ul{margin:6px 0 0}
td.best{background:#e3f1de;font-weight:700}.ci{color:#666;font-weight:400;font-size:.9em}
"""


def _f(x: Any, kind: str = "q") -> str:
    """'—' for NaN/None, ∞ for infinities; q: 3 decimals, usd: 4 significant, int, d: days,
    cos: 4 decimals."""
    v = to_float(x)
    if math.isnan(v):
        return "—"
    if math.isinf(v):
        return "∞" if v > 0 else "−∞"
    return {"usd": f"{v:.4g}", "+usd": f"{v:+.4g}", "+q": f"{v:+.4f}", "int": f"{v:,.0f}",
            "d": f"{v:,.3g}", "cos": f"{v:.4f}"}.get(kind, f"{v:.3f}")


def _ci(x: Any) -> list[float]:
    ci = list(x) if isinstance(x, (list, tuple)) else []
    return [to_float(v) for v in (ci + [None, None])[:2]]


def _mci(d: Any, kind: str) -> str:
    """'mean [lo, hi]' of a {mean, ci} dict."""
    lo, hi = _ci(lookup(d, "ci"))
    return f"{_f(lookup(d, 'mean'), kind)} <span class='ci'>[{_f(lo, kind)}, {_f(hi, kind)}]</span>"


def _pct(x: Any) -> str:
    v = to_float(x)
    return "—" if math.isnan(v) else f"{v:.1%}"


def _encoder_section(summary: dict) -> str:
    """Which encoder variants were published (their export gates), which one trained, the
    golden-vector check on this CPU, and how many test decisions sit near the threshold."""
    enc = summary.get("encoder") if isinstance(summary.get("encoder"), dict) else {}
    variants = enc.get("variants") if isinstance(enc.get("variants"), dict) else {}
    if not variants:
        return "<p class='src'>summary.json has no encoder verdicts.</p>"
    rows = []
    for name, v in variants.items():
        v = v if isinstance(v, dict) else {}
        rows.append([f"<td class='l'>{escape(name)}</td>",
                     f"<td class='l'>{'published' if v.get('published') else 'not published'}"
                     "</td>", _f(v.get("mean_cosine_prompts"), "cos"),
                     _f(v.get("min_cosine_prompts"), "cos"), _f(v.get("min_cosine_edge_cases"), "cos"),
                     f"<td class='l'>{escape(v.get('reason') or '')}</td>"])
    golden = enc.get("golden") if isinstance(enc.get("golden"), dict) else {}
    cpu = ", ".join(lookup(golden, "cpu.cpu_flags") or []) or "unknown"
    stab = summary.get("decision_stability") if isinstance(
        summary.get("decision_stability"), dict) else {}
    used = (f"trained and scored with <b>{escape(enc.get('variant'))}</b>"
            + (f" (asked: {escape(enc.get('requested_variant'))}, "
               f"{escape(enc.get('variant_reason'))})" if enc.get("variant_reason") else ""))
    return ("<p class='src'>The int8 variant is optional: when its cosine to "
            "sentence-transformers misses the export gate on this CPU it is left out and "
            f"the run goes on. {used}; golden vectors on this CPU ({escape(cpu)}): "
            f"{escape(enc.get('golden_status'))} in "
            f"{_f(to_float(golden.get('seconds')) * 1e3)} ms. "
            f"Share of test decisions within reach of another CPU's rounding (summary.json "
            f"<code>decision_stability</code>): fp32 {_pct(stab.get('fp32_near_threshold_share'))}"
            f", int8 {_pct(stab.get('int8_near_threshold_share'))}.</p>"
            + table(["variant", "export", "mean cos (prompts)", "min cos (prompts)",
                     "min cos (edge cases)", "why not"], rows))


def _parts(s: dict) -> tuple[dict, dict, list[dict], float]:
    """(test per policy, ope, learning curve, exploration rate), malformed entries dropped."""
    test = {str(p): t for p, t in (s.get("test") or {}).items() if isinstance(t, dict)}
    curve = [c for c in s.get("learning_curve") or [] if isinstance(c, dict)]
    return test, s.get("ope") or {}, curve, to_float(lookup(s, "exploration.rate"))


def _spd(curve: list[dict], rate: float) -> float:
    """Sessions per day the run planned for, recovered from the curve's days column."""
    for c in curve:
        n, d = to_float(c.get("explored_sessions")), to_float(c.get("days_of_live_exploration"))
        if n > 0 and d > 0 and rate > 0:
            return n / (rate * d)
    return math.nan


# ---------------------------------------------------------------- figures
def _err(v: float, ci: list[float]):
    ok = all(map(math.isfinite, ci))
    return [[max(v - ci[0], 0)], [max(ci[1] - v, 0)]] if ok else None


def _fig_curves(plt, test: dict, curves: pd.DataFrame | None, path: Path) -> Path:
    from matplotlib.lines import Line2D

    s_cost = to_float(lookup(test, "strong_only.cost"))
    s_q = to_float(lookup(test, "strong_only.quality"))
    scale = s_cost if s_cost > 0 else 1.0
    fig, (a, b) = plt.subplots(1, 2, figsize=(13, 5), sharey=True)
    drawn = set()
    if curves is not None and {"policy", "cost", "quality", "strong_share"} <= set(curves):
        for p, c in curves.groupby("policy", sort=False):
            c = c.sort_values(["strong_share", "quality"])
            kw = {"color": COLORS.get(p), "lw": 2.4 if p == LEARNED else 1.2, "alpha": 0.85}
            a.plot(c["cost"] / scale, c["quality"], **kw)
            b.plot(c["strong_share"], c["quality"], **kw)
            drawn.add(p)
    handles = []
    for i, (p, t) in enumerate(test.items()):
        q, c, sh = (to_float(t.get(k)) for k in ("quality", "cost", "strong_share"))
        if not math.isfinite(q):
            continue
        kw = {"fmt": MARKS[i % len(MARKS)], "color": COLORS.get(p), "mec": "black",
              "ms": 10 if p == LEARNED else 7, "capsize": 3, "zorder": 4}
        yerr = _err(q, _ci(lookup(t, "ci.quality")))
        if math.isfinite(c):
            xci = [v / scale for v in _ci(lookup(t, "ci.cost"))]
            a.errorbar(c / scale, q, yerr=yerr, xerr=_err(c / scale, xci), **kw)
        if math.isfinite(sh):
            b.errorbar(sh, q, yerr=yerr, **kw)
        handles.append(Line2D([], [], color=COLORS.get(p), marker=kw["fmt"], mec="black",
                              ls="-" if p in drawn else "none", label=p + (
                                  " (curve + point)" if p in drawn else " (operating point)")))
    if math.isfinite(s_q):
        for ax in (a, b):
            ax.axhline(0.95 * s_q, ls="--", color="black", lw=0.9)
        handles.append(Line2D([], [], ls="--", color="black",
                              label=f"95% of strong-only quality ({0.95 * s_q:.3f})"))
    a.set(xlabel="cost ÷ strong-only cost (1 = every prompt to the strong candidate)"
          if s_cost > 0 else "cost (USD per prompt)", title="Quality against cost, test split",
          ylabel="quality on test (mean score per prompt)")
    b.set(xlabel="share of prompts sent to the strong candidate",
          title="Quality against strong-call share (RouteLLM's axis)")
    a.grid(alpha=0.3)
    b.grid(alpha=0.3)
    b.legend(handles=handles, fontsize=8, loc="center left", bbox_to_anchor=(1.02, 0.5))
    return save_figure(fig, plt, path)


def _fig_ope(plt, ope: dict, path: Path) -> Path:
    names = [n for n in ("ips", "snips", "dr") if isinstance(ope.get(n), dict)]
    covers = ope.get("covers_truth") or {}
    fig, ax = plt.subplots(figsize=(8, 4.6))
    for i, n in enumerate(names):
        est, ci, ok = to_float(ope[n].get("estimate")), _ci(ope[n].get("ci")), covers.get(n)
        col = "#2d6a2d" if ok else ("#a12a1d" if ok is False else GOOD)
        ax.errorbar(i, est, yerr=_err(est, ci), fmt="o", ms=9, capsize=8, lw=2, color=col)
        ax.annotate(f"{_f(est)}\n[{_f(ci[0])}, {_f(ci[1])}]", (i, est), xytext=(12, -4),
                    textcoords="offset points", fontsize=8)
    truth, logging = to_float(ope.get("truth")), to_float(ope.get("logging_policy_truth"))
    if math.isfinite(truth):
        ax.axhline(truth, color=GOOD, lw=2, label=f"truth: learned router on the full table "
                                                  f"({truth:.3f})")
    if math.isfinite(logging):
        ax.axhline(logging, color="grey", lw=1, ls=":",
                   label=f"logging policy (rules + exploration), true value ({logging:.3f})")
    ax.set_xticks(range(len(names)), [n.upper() for n in names])
    ax.set(xlim=(-0.6, len(names) - 0.1),
           xlabel="estimator (green: 95% interval covers the truth; red: misses it)",
           ylabel="learned router's quality (mean score per session)",
           title=f"Off-policy estimates against the truth (ESS {_f(ope.get('ess'), 'd')} "
                 f"of {_f(ope.get('sessions', ope.get('n')), 'int')} sessions)")
    if math.isfinite(truth) or math.isfinite(logging):
        ax.legend(fontsize=8, loc="lower left")
    ax.grid(axis="y", alpha=0.3)
    return save_figure(fig, plt, path)


def _fig_learning(plt, curve: list[dict], rate: float, path: Path) -> Path:
    n = np.array([to_float(c.get("explored_sessions")) for c in curve])
    sig = np.array([bool(c.get("significant")) for c in curve])
    spd = _spd(curve, rate)
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.6))
    panels = (("cost_saving", "cost saving vs rules (USD per prompt)",
               "Cost saving of the learned router over the rules"),
              ("quality_delta", "quality − rules' quality (score)",
               "Quality difference at the same operating point"))
    for ax, (key, ylabel, title) in zip(axes, panels, strict=True):
        m = np.array([to_float(lookup(c, f"{key}.mean")) for c in curve])
        lo, hi = np.array([_ci(lookup(c, f"{key}.ci")) for c in curve]).reshape(-1, 2).T
        ax.fill_between(n, lo, hi, color=GOOD, alpha=0.18, label="95% paired bootstrap CI")
        ax.errorbar(n, m, yerr=[np.maximum(m - lo, 0), np.maximum(hi - m, 0)], color=GOOD,
                    capsize=4, lw=1.6, marker="none", label="mean over test prompts")
        for on, kw in ((sig, {"color": GOOD, "label": "significant"}),
                       (~sig, {"facecolor": "white", "label": "not significant"})):
            if on.any():
                ax.scatter(n[on], m[on], s=60, edgecolor=GOOD, zorder=4, **kw)
        if sig.any():
            j = int(np.argmax(sig))
            ax.scatter(n[j], m[j], s=320, marker="*", color="gold", edgecolor="black", zorder=5,
                       label=f"first significant: {_f(n[j], 'int')} sessions")
        ax.axhline(0, color="black", lw=0.9)
        ax.set(xlabel="explored sessions in the training labels", ylabel=ylabel, title=title)
        ax.grid(alpha=0.3)
        if rate > 0 and math.isfinite(spd):
            k = rate * spd
            ax.secondary_xaxis("top", functions=(lambda x, k=k: x / k, lambda d, k=k: d * k)
                               ).set_xlabel(f"days of live exploration "
                                            f"(rate {rate:g} × {spd:,.0f} sessions/day)")
    axes[0].legend(fontsize=8)  # the same entries on both panels
    return save_figure(fig, plt, path)


def router_figures(summary: dict, out_dir: Path) -> dict[str, Path]:
    """Write the report's PNGs under out_dir; return {name: path} for those drawn."""
    plt, (test, ope, curve, rate) = pyplot(), _parts(summary)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path] = {}
    if test:
        src, curves = lookup(summary, "artifacts.curves"), None
        try:
            curves = pd.read_parquet(src) if src and Path(src).is_file() else None
        except (OSError, ValueError):  # unreadable: operating points only
            pass
        paths["curves"] = _fig_curves(plt, test, curves, out_dir / "router_curves.png")
    if any(isinstance(ope.get(n), dict) for n in ("ips", "snips", "dr")):
        paths["ope"] = _fig_ope(plt, ope, out_dir / "router_ope.png")
    if curve:
        paths["learning"] = _fig_learning(plt, curve, rate, out_dir / "router_learning_curve.png")
    return paths


# ---------------------------------------------------------------- HTML sections
def _verdict(s: dict) -> str:
    """The verdict word, its objective, every criterion (router_evidence.verdict_box)."""
    box = verdict_box(s)
    if "go" not in s:
        box = "<div class='box'>summary.json has no go verdict</div>" + box
    return box


def _headline(s: dict) -> str:
    """The served point's test figures beside the incumbent's; cost_ratio_at_95 labelled as
    the curve figure it is (summary.json `headline`)."""
    h = s.get("headline")
    if not isinstance(h, dict):
        return ""
    cf = h.get("curve_figures") or {}
    rows = [["served threshold (router.json)", _f(h.get("threshold"))],
            ["quality on test", _f(h.get("quality"))],
            ["cost on test, USD/prompt", _f(h.get("cost"), "usd")],
            ["cost / strong-only cost", _f(h.get("cost_vs_strong_only"))],
            [f"cost / {h.get('incumbent')}' cost", _f(h.get("cost_vs_incumbent"))],
            [f"{h.get('incumbent')}: quality, cost", f"{_f(h.get('incumbent_quality'))}, "
             f"{_f(h.get('incumbent_cost'), 'usd')}"],
            ["curve figure: cost_ratio_at_95 (learned, not served)",
             _f(cf.get("cost_ratio_at_95"))]]
    return table(["the served point (headline)", "value"],
                 [[f"<td class='l'>{escape(k)}</td>", v] for k, v in rows])


def _needed(d: dict, curve: list[dict], rate: float) -> str:
    spd = _spd(curve, rate)
    per = f" at exploration rate {rate:g}" + (
        f" of {spd:,.0f} sessions/day" if math.isfinite(spd) else "")
    if d.get("explored_sessions_needed") is not None:
        n = to_float(d["explored_sessions_needed"])
        again = ", ".join(_f(c.get("explored_sessions"), "int") for c in curve
                          if to_float(c.get("explored_sessions")) > n and not c.get("significant"))
        return (f"The advantage is first significant (every criterion of the objective passes) at <b>{_f(n, 'int')} explored sessions</b>, i.e. "
                f"<b>{_f(d.get('days_needed'), 'd')} days</b> of live exploration{per}." + (
                    f" <span class='warn'>not stable</span> The later point at {again} explored "
                    "sessions is not significant: read this as a lower bound." if again else ""))
    if not curve:
        return "No learning curve in this run: the exploration needed cannot be read off."
    top = max(curve, key=lambda c: to_float(c.get("explored_sessions")))
    return (f"No point of the learning curve is significant, up to "
            f"{_f(top.get('explored_sessions'), 'int')} explored sessions "
            f"({_f(top.get('days_of_live_exploration'), 'd')} days of live exploration{per}): "
            "more exploration than that is needed, or there is no advantage to find.")


def _why(c: dict) -> str:
    if c.get("significant"):
        return badge(True, "yes", "no")
    lo = _ci(lookup(c, "cost_saving.ci"))[0]
    return badge(False, "yes", "no") + (" quality CI below the margin" if lo > 0
                                         else " cost-saving CI reaches zero")


def _equal_quality(d: dict) -> str:
    rows = [["served threshold (router.json), gated here", _f(d.get("threshold"))],
            ["learned quality on calibration at it", _f(d.get("learned_calibration_quality"))],
            ["rules' quality on calibration", _f(d.get("rules_calibration_quality"))],
            ["rules' cost on test, USD/prompt", _f(d.get("rules_cost"), "usd")],
            ["learned cost on test, USD/prompt", _f(d.get("learned_cost"), "usd")],
            ["cost saving (rules − learned) [95% CI]", _mci(d.get("cost_saving"), "+usd")],
            ["quality (learned − rules) [95% CI]", _mci(d.get("quality_delta"), "+q")],
            ["exploration within its cap", badge(d.get("exploration_within_cap"), "yes", "no")]]
    note = ("<p class='src'>Threshold ∞: the learned router sends every prompt to the "
            "strong candidate.</p>" if to_float(d.get("threshold")) == math.inf else "")
    served = (f"<p class='src' id='served'><b>{escape(str(d['served']))}</b>.</p>"
              if d.get("served") else "")
    return served + table(["at the served threshold", "value"],
                                     [[f"<td class='l'>{escape(k)}</td>", v] for k, v in rows]
                                     ) + note


def _policy_table(test: dict) -> str:
    ranked, best = [p for p in test if p not in REFERENCE], {}
    for key, _, better, _k in COLUMNS:
        vals = {p: v for p in ranked if math.isfinite(v := to_float(test[p].get(key)))}
        if better and vals:
            top = (max if better == "max" else min)(vals.values())
            best[key] = {p for p, v in vals.items() if abs(v - top) <= 1e-9 * max(1, abs(top))}
    rows, cls = [], []
    for p, t in test.items():
        cells = [f"<td class='l'>{escape(p)}{' (reference)' if p in REFERENCE else ''}</td>"]
        for key, _, _, kind in COLUMNS:
            txt = _f(t.get(key), kind)
            if key in ("quality", "cost"):
                lo, hi = _ci(lookup(t, f"ci.{key}"))
                txt += f" <span class='ci'>[{_f(lo, kind)}, {_f(hi, kind)}]</span>"
            cells.append(f"<td class='{'best' if p in best.get(key, ()) else ''}'>{txt}</td>")
        thr = t.get("threshold")
        cells.append(f"{_f(thr.get('threshold'))} {badge(thr.get('met'), 'goal met', 'missed')}"
                     if isinstance(thr, dict) else "—")
        rows.append(cells)
        cls.append("model" if p == LEARNED else "")
    goals = {str(t["threshold"]["goal"]) for t in test.values()
             if isinstance(t.get("threshold"), dict) and t["threshold"].get("goal")}
    rules = {str(t["threshold"].get("rule")) for t in test.values()
             if isinstance(t.get("threshold"), dict) and t["threshold"].get("rule")}
    rule_note = {"margin": "margin (the cheapest candidate whose predicted success minus the "
                           "best other candidate's reaches the threshold; negative = a tolerance)",
                 "absolute": "absolute (the cheapest candidate whose predicted success reaches "
                             "the threshold)"}
    return (table(["policy", *[escape(h) for _, h, _, _ in COLUMNS], "threshold (calibration)"],
                  rows, cls)
            + "<p class='src'>summary.json <code>test</code>; intervals: session bootstrap over "
            "test prompts. Shaded: best in column (quality, APGR: highest; cost, CPT, cost ratio: "
            "lowest), oracle excluded as a bound; strong share is descriptive. APGR, CPT and the "
            "cost ratio come from a policy's score sweep (— for fixed policies). Threshold goal: "
            f"{escape('; '.join(sorted(goals)) or '—')}. Rule: "
            f"{escape('; '.join(rule_note.get(r, r) for r in sorted(rules)) or '—')}.</p>")


def _ope_table(ope: dict) -> str:
    rows = [[f"<td class='l'>{n.upper()}</td>", _f(ope[n].get("estimate")),
             "[{}, {}]".format(*map(_f, _ci(ope[n].get("ci")))),
             badge((ope.get("covers_truth") or {}).get(n), "covers truth", "misses truth")]
            for n in ("ips", "snips", "dr") if isinstance(ope.get(n), dict)]
    rows.append(["<td class='l'><b>truth</b></td>", f"<b>{_f(ope.get('truth'))}</b>", "", ""])
    clipped = [n.upper() for n in ("ips", "snips", "dr")
               if isinstance(ope.get(n), dict) and ope[n].get("clipped")]
    notes = [f"ESS {_f(ope.get('ess'))} of {_f(ope.get('sessions', ope.get('n')), 'int')} "
             f"sessions; support {_f(ope.get('support'))} (share of logged decisions the router "
             "agrees with)."]
    if clipped:
        notes.append(f"{', '.join(clipped)}: clipped to the feasible quality range [0, 1].")
    warn = "".join(f"<div class='box' style='border-color:#a00;background:#fbeaea'><b>Warning:"
                   f"</b> {escape(w)}</div>" for w in ope.get("warnings") or [])
    return (table(["estimator", "estimate", "95% CI", ""], rows)
            + f"<p class='src'>{escape(' '.join(notes))}</p>" + warn)


def _labels(s: dict) -> str:
    exp, rules = s.get("exploration") or {}, s.get("rules") or {}
    facts = {k: exp[k] for k in ("rate", "cap", "exploration_share", "sessions",
                                 "explored_sessions", "exploration_sessions", "escalations",
                                 "opening_by_candidate", "propensities",
                                 "logged_opening_quality", "logged_cost_usd") if k in exp}
    counts = {str(k): v for k, v in (s.get("labels") or {}).items() if math.isfinite(to_float(v))}
    total = sum(to_float(v) for v in counts.values()) or 1
    lab = table(["label source", "rows", "share"], [[f"<td class='l'>{escape(k)}</td>", _f(
        v, "int"), f"{to_float(v) / total:.1%}"] for k, v in counts.items()]) if counts else ""
    rfacts = {k: rules[k] for k in ("default_candidate", "default_source", "task_candidate",
                                    "long_prompt_tokens", "quality_tolerance", "fitted_on")
              if k in rules}
    note = (f"<div class='box' style='border-color:#7a5a00;background:#fcf6e3'><b>Rules:</b> "
            f"{escape(rules['note'])}</div>" if rules.get("note") else "")
    return (section("Exploration", facts_table(facts), level=3)
            + section("Training labels by source", lab, level=3)
            + section("The rules baseline", note, facts_table(rfacts), level=3))


def _spread_line(s: dict) -> str:
    """The learned router's headline over head seeds (summary.json `spread`)."""
    sp = s.get("spread") or {}
    if len(sp.get("seeds") or []) < 2:
        return ""
    cr, q = sp.get("cost_ratio_at_95") or {}, sp.get("quality") or {}
    return (f"<p class='src'>Seed-to-seed spread of the learned router (head seeds "
            f"{escape(str(sp['seeds']))}, same rows and split, threshold chosen again on "
            f"calibration): cost ratio at 95% {_f(cr.get('min'))} .. {_f(cr.get('max'))}, "
            f"quality {_f(q.get('min'))} .. {_f(q.get('max'))}.</p>")


def write_router_report(summary: dict, out_dir: Path) -> Path:
    """Write out_dir/router_report.html (figures embedded) and its PNGs; return the path."""
    out_dir = Path(out_dir)
    figs = router_figures(summary, out_dir / "figures")
    test, ope, curve, rate = _parts(summary)
    cands, splits = summary.get("candidates") or [], summary.get("splits") or {}
    src = (f"{_f(summary.get('prompts'), 'int')} prompts (train / calibration / test: "
           f"{' / '.join(_f(splits.get(k), 'int') for k in ('train', 'calibration', 'test'))});"
           f" candidates, cheapest first: {escape(', '.join(map(str, cands)) or '—')}")
    ess = (f"ESS {_f(ope.get('ess'), 'd')} of {_f(ope.get('sessions', ope.get('n')), 'int')} "
           f"logged test sessions, mean weight {_f(ope.get('mean_weight'))}, support "
           f"{_f(ope.get('support'))}")
    lc_rows = [[_f(c.get("fraction")), _f(c.get("explored_sessions"), "int"),
                _f(c.get("days_of_live_exploration"), "d"), _mci(c.get("cost_saving"), "+usd"),
                _mci(c.get("quality_delta"), "+q"), f"<td class='l'>{_why(c)}</td>"]
               for c in curve]
    detail = summary.get("go_detail") if isinstance(summary.get("go_detail"), dict) else {}
    parts = [
        f"<h1>Router verdict: learned router against the rules</h1><p class='src'>{src}.</p>",
        _verdict(summary), _headline(summary),
        section("At the served threshold", "<p class='src'>summary.json "
                "<code>go_detail</code>: the learned router at the threshold router.json "
                "serves (chosen on calibration), against the rules' own choices: paired "
                "prompt-bootstrap differences on test.</p>",
                _equal_quality(detail), f"<p>{_needed(detail, curve, rate)}</p>"),
        section("Policies on the test split", _policy_table(test) if test else
                "<p class='src'>summary.json has no test scores.</p>", _spread_line(summary),
                embedded_figure(figs.get("curves"), "Figure 1. Cost-quality curves of every "
                                "scoring policy (threshold sweeps from summary.json "
                                "<code>artifacts.curves</code>) and every policy's operating "
                                "point with 95% session-bootstrap intervals; dashed: 95% of "
                                "strong-only quality.")),
        section("Off-policy evaluation", "<p class='src'>The learned policy's value estimated "
                "by the receipts pipeline from the test sessions the rules logged with "
                "exploration (its own run: summary.json <code>receipts</code>), beside the "
                f"same decisions' true value on the full table; {escape(ess)}.</p>", _ope_table(ope) if ope else "",
                embedded_figure(figs.get("ope"), "Figure 2. IPS, SNIPS and DR estimates with "
                                f"95% intervals; solid line: the truth; {escape(ess)}.")),
        ope_evidence_section(ope) + (
            f"<p><b>What a gate from these receipts alone would say:</b> "
            f"{escape(str((ope.get('ope_verdict') or {}).get('reason', '')))}</p>"
            if isinstance(ope.get("ope_verdict"), dict) else ""),
        section("Learning curve: how much live exploration", "<p class='src'>The head refitted "
                "on shares of the explored sessions (summary.json <code>learning_curve</code>);"
                " significant: every criterion of the objective passes.</p>",
                embedded_figure(figs.get("learning"), "Figure 3. Cost saving and quality "
                                "difference against the rules by explored sessions (top axis: "
                                "days of live exploration); band: 95% paired bootstrap "
                                "interval; star: first significant point."),
                table(["fraction", "explored sessions", "days", "cost saving [CI]",
                       "quality Δ [CI]", "significant"], lc_rows) if lc_rows else ""),
        section("Labels and exploration", _labels(summary)),
        section("Encoder variants and parity on this CPU", _encoder_section(summary)),
        section("Router head", facts_table(summary.get("head") or {})),
        head_selection_section(summary),
        section("Data and versions", facts_table({k: summary[k] for k in (
            "pipeline", "data", "outcomes", "encoder", "timings_s", "wall_seconds", "artifacts")
            if k in summary})),
        "<details><summary>Full summary.json</summary><pre>"
        + escape(json.dumps(summary, indent=2, default=str)) + "</pre></details>"]
    return write_page(out_dir / "router_report.html",
                      page("Router go/no-go report", parts, css=CSS + _MORE_CSS))
