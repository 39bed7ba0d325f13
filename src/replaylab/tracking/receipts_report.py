"""The receipts-mode router report: `router_report.html` of `pipeline=router data.ledger=...`.

Everything on the page is read from summary.json and the curve table the run wrote
(`artifacts.curves`): the data window and the split dates, the logging policy, the
off-policy table with its intervals, the paired differences, the cost/quality curve
of the served head on the test sessions (DR estimates) with the served and the
logging point, and the verdict with its rule. The verdict shown is `summary.go`,
the one the registry gate reads from the artifact manifest.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pandas as pd

from replaylab.tracking.figures import pyplot, save_figure
from replaylab.tracking.head_selection import head_selection_section
from replaylab.tracking.html import (
    CSS,
    embedded_figure,
    escape,
    facts_table,
    page,
    section,
    table,
    write_page,
)
from replaylab.tracking.router_evidence import (
    criteria_table,
    ope_evidence_section,
    verdict_word,
    word_badge,
)


def _f(x: Any, digits: int = 4) -> str:
    if x is None:
        return "—"
    if isinstance(x, float):
        return f"{x:.{digits}g}" if abs(x) < 1e-3 and x != 0 else f"{x:.{digits}f}"
    return escape(x)


def _ci(d: dict | None, digits: int = 4) -> str:
    if not isinstance(d, dict):
        return "—"
    ci = d.get("ci") or [None, None]
    return f"{_f(d.get('estimate'), digits)} [{_f(ci[0], digits)}, {_f(ci[1], digits)}]"


def _curve_figure(summary: dict, out: Path) -> Path | None:
    path = (summary.get("artifacts") or {}).get("curves")
    if not path or not Path(path).is_file():
        return None
    curve = pd.read_parquet(path)
    ope = summary.get("ope") or {}
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.2, 4.4))
    c = curve.sort_values("cost")
    ax.plot(c["cost"], c["quality"], "-", color="#4a78b5", lw=1.4,
            label="served head, threshold sweep (DR)")
    for key, color, name in (("dr", "#1f4e8c", "served router"), (None, "#a12a1d", "logging")):
        q = ope.get(key) if key else (ope.get("logging") or {}).get("quality")
        cost = ope.get("cost") if key else (ope.get("logging") or {}).get("cost")
        if not isinstance(q, dict) or not isinstance(cost, dict):
            continue
        ax.errorbar([cost["estimate"]], [q["estimate"]],
                    xerr=[[cost["estimate"] - cost["ci"][0]], [cost["ci"][1] - cost["estimate"]]],
                    yerr=[[q["estimate"] - q["ci"][0]], [q["ci"][1] - q["estimate"]]],
                    fmt="o", color=color, capsize=3, label=f"{name} (95% CI)")
    ax.set_xlabel("cost per opening call, USD (DR estimate)")
    ax.set_ylabel("opening-turn quality (DR estimate)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    return save_figure(fig, plt, out / "receipts_curve.png")


def _ope_rows(ope: dict) -> list[list[str]]:
    rows = []
    for name, what in (("ips", "IPS"), ("snips", "SNIPS"), ("dr", "DR")):
        rows.append([what, "quality", _ci(ope.get(name))])
    rows.append(["DR", "cost per opening call (USD)", _ci(ope.get("cost"), 4)])
    if "session_cost" in ope:
        rows.append(["DR", "session cost incl. escalations (USD)", _ci(ope["session_cost"], 4)])
    log = ope.get("logging") or {}
    rows.append(["on-policy", "logging quality", _ci(log.get("quality"))])
    rows.append(["on-policy", "logging cost per opening call (USD)", _ci(log.get("cost"), 4)])
    if "session_cost" in log:
        rows.append(["on-policy", "logging session cost (USD)", _ci(log["session_cost"], 4)])
    diff = ope.get("diff") or {}
    rows.append(["DR, paired", "quality learned − logging", _ci(diff.get("quality"))])
    rows.append(["DR, paired", "cost learned − logging (USD)", _ci(diff.get("cost"), 4)])
    return [[f"<td class='l'>{a}</td>", f"<td class='l'>{escape(b)}</td>", c] for a, b, c in rows]


def attribution_section(summary: dict) -> str:
    """"Where the gain came from": the three heads (own decisions, + exploration, +
    replays), the increments with their paired intervals and readings, what each replay
    group added (`summary.attribution`, `summary.replays.value`)."""
    a = summary.get("attribution")
    if not isinstance(a, dict):
        return section("Where the gain came from",
                       "<p class='src'>Not computed (router.evaluation.attribution=off).</p>")
    if a.get("status") != "done":
        return section("Where the gain came from",
                       f"<p class='src'>Skipped: {escape(a.get('reason', ''))}</p>")
    unit = (a.get("gain") or {}).get("unit", "")
    pts = a.get("points") or {}
    rows = []
    for name, p in pts.items():
        rows.append([f"<td class='l'>{escape(name)}</td>",
                     f"<td class='l'>{escape(p.get('what', ''))}"
                     + (f" <i>({escape(p['note'])})</i>" if p.get("note") else "") + "</td>",
                     _f((p.get("calibration") or {}).get("gain"), 6),
                     _f((p.get("test") or {}).get("gain"), 6),
                     _ci((p.get("test") or {}).get("quality_vs_logging"))])
    inc_rows = []
    for name, inc in (a.get("increments") or {}).items():
        inc_rows.append([f"<td class='l'>{escape(name.replace('_', ' '))}</td>",
                         _ci(inc.get("calibration"), 6) + f" {escape(inc['calibration']['reading'])}",
                         _ci(inc.get("test"), 6) + f" {escape(inc['test']['reading'])}"])
    value = (summary.get("replays") or {}).get("value") or {}
    grp_rows = [[f"<td class='l'>{escape(g)}</td>", str(v.get("replays")),
                 _ci(v.get("calibration"), 6) + f" {escape(v['calibration']['reading'])}",
                 _ci(v.get("test"), 6) + f" {escape(v['test']['reading'])}"]
                for g, v in (value.get("groups") or {}).items()]
    return section(
        "Where the gain came from",
        f"<p class='src'>{escape((a.get('gain') or {}).get('what', ''))}; unit: "
        f"{escape(unit)}. {escape(a.get('how', ''))}; {a.get('refits')} refits. "
        f"Intervals: {escape(a.get('interval', ''))}.</p>",
        table(["head", "trained on", "gain, calibration", "gain, test",
               "quality − logging, test [95% CI]"], rows),
        table(["increment", "calibration [95% CI]", "test [95% CI]"], inc_rows),
        (f"<p class='src'>What each replay group added (by {escape(value.get('by', ''))}; "
         "logged decisions + the group's replays against logged decisions alone):</p>"
         + table(["group", "replays", "calibration [95% CI]", "test [95% CI]"], grp_rows))
        if grp_rows else "")


def write_receipts_report(summary: dict, out_dir: Path) -> Path:
    """Write out_dir/router_report.html (figure embedded); return the path."""
    out_dir = Path(out_dir)
    ope = summary.get("ope") or {}
    sp = summary.get("splits") or {}
    rec = summary.get("receipts") or {}
    verdict = (f"<p>{word_badge(verdict_word(summary))} "
               f"{escape(summary.get('go_reason', ''))}</p>"
               + criteria_table(summary.get("go_detail") or {})
               + f"<p class='src'>{escape((summary.get('go_detail') or {}).get('rule', ''))}; "
               "the registry gate and serving read this verdict from the artifact manifest.</p>")
    sp_ = summary.get("spread") or {}
    if sp_.get("seeds"):
        dq, dc = sp_.get("diff_quality") or {}, sp_.get("diff_cost") or {}
        verdict += (f"<p class='src'>Seed-to-seed spread (head seeds {sp_['seeds']}, same "
                    f"sessions): quality vs logging {_f(dq.get('min'))} .. {_f(dq.get('max'))}, "
                    f"cost vs logging {_f(dc.get('min'))} .. {_f(dc.get('max'))} USD/call; GO in "
                    f"{sum(sp_.get('go') or [])} of {len(sp_['seeds'])}.</p>")
    warn = "".join(f"<div class='box'>{escape(w)}</div>" for w in ope.get("warnings") or [])
    window = {"generated": datetime.now(UTC).isoformat(timespec="seconds"),
              "data window": f"{sp.get('train_start')} .. {sp.get('test_end')}",
              "calibration from": sp.get("calibration_start"),
              "test from (the latest sessions)": sp.get("test_start"),
              "embargo_ms": sp.get("embargo_ms"), "sessions per split": sp.get("sessions"),
              "split rule": sp.get("rule")}
    op = summary.get("operating_point") or {}
    figure = _curve_figure(summary, out_dir / "figures")
    served = table(["candidate", "test openings served"],
                   [[f"<td class='l'>{escape(c)}</td>", str(n)]
                    for c, n in (ope.get("served_choice") or {}).items()])
    parts = [
        "<h1>Router from your receipts: the verdict</h1>"
        f"<p class='src'>{escape(summary.get('data', {}).get('ledger', ''))}; candidates, "
        f"cheapest first: {escape(', '.join(summary.get('candidates') or []))}</p>",
        verdict, warn,
        section("Data window and splits", facts_table(window)),
        ope_evidence_section(ope),
        section("The logging policy", facts_table(summary.get("logging_policy") or {}),
                facts_table(rec.get("exploration") or {})),
        section("Off-policy evaluation on the test sessions",
                f"<p class='src'>{ope.get('n')} opening decisions of {ope.get('sessions')} test "
                f"sessions ({ope.get('explored_sessions')} explored); effective sample size "
                f"{_f(ope.get('ess'), 3)}, support {_f(ope.get('support'), 3)}, the served "
                f"router agrees with {_f(ope.get('agreement'), 3)} of the logged decisions. "
                "Intervals: 95% session bootstrap, clipped to the feasible range.</p>",
                table(["estimator", "figure", "estimate [95% CI]"], _ope_rows(ope)), served,
                embedded_figure(figure, "Figure 1. The served head's threshold sweep on the "
                                "test sessions (DR quality and cost from logged data), the "
                                "served operating point and the logging policy, 95% intervals.")),
        section("Operating point (chosen on calibration)", facts_table(op)),
        head_selection_section(summary),
        attribution_section(summary),
        section("Replay plan", facts_table(summary.get("replay_plan") or {})),
        section("Receipts and replays", facts_table({k: v for k, v in rec.items()
                                                     if k != "exploration"}),
                facts_table({k: v for k, v in (summary.get("replays") or {}).items()
                             if k != "value"})),
        section("Data and versions", facts_table({k: summary[k] for k in (
            "data", "encoder", "head", "timings_s", "artifacts") if k in summary})),
        "<details><summary>Full summary.json</summary><pre>"
        + escape(json.dumps(summary, indent=2, default=str)) + "</pre></details>"]
    return write_page(out_dir / "router_report.html",
                      page("Router from receipts: go/no-go", parts, css=CSS))
