"""The one line every entry point ends with, the run's tags, and the run facts on its reports.

One story per verdict: the line is read off the summary the pipeline returned (the
gate's own `go` and reasons, never recomputed here), it is printed on the console,
written to summary.json (`verdict`), set as the MLflow run's `verdict` and `go` tags,
and stamped on every HTML report with the run date, test window, run link and commit.

    demand: NO-GO (coverage 0.807 ... ; mean pinball vs best baseline ...)
    forecast: GO (mstl vs seasonal naive: MASE ... (95% CI [...]): beats it; 80% coverage ...)
    router: NO-GO (quality vs rules -0.0227, CI lower bound -0.0568 is below -0.01); ...
    promote replaylab-router v3->champion: REFUSED (go=false: ...)
"""

from __future__ import annotations

import datetime as dt
import math
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from replaylab.tracking.html import escape
from replaylab.verdict import GO, NO_GO, VERDICTS


def num(x: Any, fmt: str = ".3f") -> str:
    """A number for a verdict line ('n/a' for None and NaN)."""
    try:
        v = float(x)
    except (TypeError, ValueError):
        return "n/a"
    return "n/a" if not math.isfinite(v) else format(v, fmt)


def go_word(go: Any) -> str:
    return "GO" if go is True else ("NO-GO" if go is False else "no verdict")


def interval_text(d: Any, fmt: str = ".3f") -> str:
    """'0.81 [0.79, 0.83]' from {"mean", "ci95": [lo, hi]} (or {"mean", "ci": [...]}), or a
    plain number."""
    if not isinstance(d, dict):
        return num(d, fmt)
    ci = d.get("ci95") or d.get("ci") or [None, None]
    return f"{num(d.get('mean'), fmt)} [{num(ci[0], fmt)}, {num(ci[1], fmt)}]"


# ---------------------------------------------------------------- one line per pipeline
def demand_line(s: dict) -> str:
    gate = s.get("gate")
    if not isinstance(gate, dict):
        return "demand: no verdict (this summary carries no gate)"
    word = gate.get("verdict") or go_word(gate.get("go"))  # GO / NO-GO / NOT ENOUGH EVIDENCE
    objective = f"objective: {gate['objective']}; " if gate.get("objective") else ""
    return f"demand: {word} ({objective}{'; '.join(map(str, gate.get('reasons') or []))})"


def router_line(s: dict) -> str:
    """The verdict (its first reason names the objective); outcomes mode adds the SERVED
    point's test figures (the headline), its spread over head seeds, and cost_ratio_at_95
    labelled as the curve figure it is."""
    word = verdict_word(s) or go_word(s.get("go"))  # GO / NO-GO / NOT ENOUGH EVIDENCE
    head = f"router: {word} ({'; '.join(map(str, s.get('go_reasons') or []))})"
    learned = (s.get("test") or {}).get("learned")
    if s.get("mode") == "receipts" or not isinstance(learned, dict):
        return head
    h = s.get("headline") or {}
    sp = s.get("spread") or {}
    cr = sp.get("cost") or {}
    spread = (f" (over head seeds {sp['seeds']}: {num(cr.get('min'), '.4g')}.."
              f"{num(cr.get('max'), '.4g')})" if len(sp.get("seeds") or []) > 1 else "")
    served = (f"; served point on test: quality {num(learned.get('quality'))}, cost "
              f"{num(learned.get('cost'), '.4g')} USD/prompt{spread}"
              + (f" = {num(h.get('cost_vs_strong_only'))} of strong-only, "
                 f"{num(h.get('cost_vs_incumbent'))} of {h.get('incumbent')}" if h else ""))
    return (f"{head}{served}; curve figure cost_ratio_at_95 "
            f"{num(learned.get('cost_ratio_at_95'))}")


def project_line(s: dict) -> str:
    return (f"{s.get('pipeline')}: {s.get('rows_read', 'n/a')} rows read, "
            f"{s.get('rows_valid', 'n/a')} valid, {s.get('rows_quarantined', 'n/a')} quarantined"
            + (f"; {(s.get('ledger') or {}).get('sessions')} sessions"
               if (s.get("ledger") or {}).get("sessions") is not None else ""))


def import_line(s: dict) -> str:
    """project_line's counts; an import that says what the ledger is ready for (Router
    Replay: `readiness`, per pipeline) adds that after them."""
    ready = (s.get("readiness") or {}).get("line")
    return project_line(s) + (f"; {ready}" if ready else "")


def forecast_line(s: dict) -> str:
    """The backtest's gate (`replaylab.forecast.gate`): GO, NO-GO or NOT ENOUGH EVIDENCE and
    why; a summary written before the gate existed gets its targets instead."""
    shape = (f"; {s['series']} series x {s['horizon_buckets']} buckets ahead"
             if s.get("series") is not None and s.get("horizon_buckets") is not None else "")
    gate = s.get("gate")
    if isinstance(gate, dict) and gate.get("decision"):
        return (f"forecast: {gate['decision']} ({'; '.join(map(str, gate.get('reasons') or []))})"
                f"{shape}")
    best, scores = s.get("best"), s.get("backtest") or {}
    t = s.get("targets") or {}
    b = scores.get(best) or {}
    naive = (scores.get("seasonal_naive") or {}).get("mase")
    ok = bool(t) and all(bool(v) for v in t.values())
    from replaylab.forecast.config import COVERAGE_TARGET

    lo, hi = COVERAGE_TARGET
    return (f"forecast: {'targets met' if ok else 'targets not met'} (best {best}: MASE "
            f"{num(b.get('mase'))} vs seasonal naive {num(naive)}, 80% coverage "
            f"{num(b.get('coverage_80'))} [target {lo:g}-{hi:g}]{shape})")


def fleet_line(s: dict) -> str:
    name = s.get("experiment", "fleet")
    parts = []
    for policy, p in list((s.get("policies") or {}).items())[:4]:
        att = p.get("slo_attainment") if isinstance(p, dict) else None
        if att is not None:
            parts.append(f"{policy} SLO {interval_text(att)}")
    for scenario, w in list((s.get("winners") or {}).items())[:4]:  # autoscaling
        if isinstance(w, dict) and w.get("policy"):
            parts.append(f"{scenario}: {w['policy']} wins ({num(w.get('gpu_hours'), '.0f')} "
                         f"GPU-hours at SLO {num(w.get('slo_attainment'), '.4f')})")
    conserved = s.get("conserved")
    return (f"fleet {name}: requests {'conserved' if conserved else 'NOT conserved'}"
            + (f"; {', '.join(parts)}" if parts else ""))


def residuals_line(s: dict) -> str:
    """residuals: 1148 of 1275 hinted rows scored; 80% coverage 0.783 [0.758, 0.807];
    drift: 0 buckets flagged, groups flagged: category=rag"""
    o = s.get("overall") or {}
    drift = s.get("drift") or {}
    groups = drift.get("groups_flagged") or []
    cov = {"mean": o.get("coverage"), "ci95": o.get("coverage_ci95") or [None, None]}
    nominal = o.get("nominal", s.get("nominal"))
    level = f"{float(nominal):.0%}" if isinstance(nominal, int | float) else "interval"
    return (f"residuals: {o.get('scored', 'n/a')} of {o.get('hinted', s.get('rows', 'n/a'))} "
            f"hinted rows scored; {level} coverage {interval_text(cov)}; drift: "
            f"{drift.get('flagged', 'n/a')} buckets flagged"
            + (f", groups flagged: {', '.join(map(str, groups))}" if groups else ""))


def synthesize_line(s: dict) -> str:
    """synthesize: 20000000 rows in 40 files (0.6 GB) at 612k rows/s -> DIR"""
    size, rate = s.get("bytes"), s.get("rows_per_s")
    size_text = ("n/a" if not isinstance(size, int | float) else
                 f"{size / 1e9:.1f} GB" if size >= 1e9 else f"{size / 1e6:.1f} MB")
    rate_text = f"{rate / 1e3:.0f}k" if isinstance(rate, int | float) else "n/a"
    defects = sum((s.get("defects") or {}).values())
    return (f"synthesize: {s.get('rows', 'n/a')} rows in {s.get('files', 'n/a')} files "
            f"({size_text}) at {rate_text} rows/s -> {s.get('out')}"
            + (f"; {defects} rows with injected defects" if defects else ""))


def export_line(s: dict) -> str:
    action = s.get("action", "export")
    if action == "promote":
        p = s.get("promotion") or {}
        word = {"promoted": "PROMOTED", "refused": "REFUSED", "forced": "FORCED"}.get(
            str(p.get("decision")), str(p.get("decision")).upper())
        why = "; ".join(map(str, p.get("reasons") or []))
        if p.get("decision") == "forced":
            why = f"reason: {p.get('reason')}; the gate said: {why}"
        return f"promote {p.get('name')} v{p.get('version')}->{p.get('alias')}: {word} ({why})"
    if action == "fetch":
        f = s.get("fetch") or {}
        head = (f"fetch {f.get('name')} v{f.get('version')}"
                + (f" (@{f['alias']})" if f.get("alias") else ""))
        if f.get("forced"):
            return (f"{head}: FORCED version served at {f.get('path')} (reason: "
                    f"{f.get('forced_reason')})")
        if f.get("allowed_ungated") or f.get("gated") is False:
            return (f"{head}: UNGATED version served at {f.get('path')} (export.allow_ungated="
                    f"true: {f.get('ungated_reason') or 'no promote run placed this alias'})")
        return f"{head}: verified, served at {f.get('path')} (content {str(f.get('content_hash'))[:12]})"
    if action == "compare":
        c = s.get("compare") or {}
        return (f"compare {c.get('name')} v{c.get('challenger')} vs v{c.get('champion')}: "
                f"report {(s.get('reports') or {}).get('compare')}")
    if action == "register":
        regs = s.get("registry") or []
        got = ", ".join(f"{r.get('name')} v{r.get('version')}"
                        + (" (same content: reused)" if r.get("reused") else "")
                        for r in regs) or "nothing"
        r = s.get("relogged") or {}
        return (f"register {s.get('source')}: registered {got}; logged again: "
                f"{r.get('metrics', 0)} metrics, {r.get('reports', 0)} reports"
                + (f" (run {r['previous_run']} marked FAILED)" if r.get("previous_marked_failed")
                   else ""))
    e = s.get("export") or {}
    return f"export: {e.get('path')} version {e.get('version')} (content {str(e.get('content_hash'))[:12]})"


LINES = {"demand": demand_line, "router": router_line, "project": project_line,
         "import": import_line, "forecast": forecast_line, "fleet": fleet_line,
         "residuals": residuals_line, "export": export_line, "synthesize": synthesize_line}


def verdict_line(summary: dict) -> str:
    """The one line the run ends with (by the summary's `pipeline`)."""
    line = LINES.get(str(summary.get("pipeline")))
    return line(summary) if line else f"{summary.get('pipeline')}: finished"


def summary_go(summary: dict) -> bool | None:
    """The run's go/no-go where it has one (demand gate, forecast gate, router gate, a
    promotion); None where the gate could not decide (the forecast's NOT ENOUGH EVIDENCE)."""
    if isinstance(summary.get("gate"), dict) and "go" in summary["gate"]:
        go = summary["gate"]["go"]
        return None if go is None else bool(go)
    if isinstance(summary.get("go"), bool):
        return summary["go"]
    p = summary.get("promotion")
    if isinstance(p, dict):
        return p.get("decision") == "promoted"  # a forced promotion is not a GO
    return None


def run_tags(summary: dict) -> dict[str, str]:
    """The MLflow run's verdict tags (the runs list shows them as columns) and, for a
    promotion, the name that says how it ended."""
    go = summary_go(summary)
    tags = {"go": "n/a" if go is None else str(go).lower(),
            "verdict": str(summary.get("verdict") or verdict_line(summary))[:4000]}
    p = summary.get("promotion")
    if isinstance(p, dict):
        # the decision first: the runs list truncates long names from the right
        tags["mlflow.runName"] = (f"{str(p.get('decision')).upper()} promote "
                                  f"{str(p.get('name')).removeprefix('replaylab-')} "
                                  f"v{p.get('version')}->{p.get('alias')}")
        tags["forced"] = str(p.get("decision") == "forced").lower()
    return tags


def verdict_word(summary: dict) -> str | None:
    """The verdict word of a training run (GO, NO-GO, NOT ENOUGH EVIDENCE) for its run
    name: the gate's `verdict` when it records one, else GO / NO-GO from its go; None for
    runs without a gate."""
    g = summary.get("gate")
    if isinstance(g, dict) and g.get("verdict") in VERDICTS:
        return str(g["verdict"])
    d = summary.get("go_detail")  # the router's gate (summary["verdict"] becomes the line)
    if isinstance(d, dict) and d.get("verdict") in VERDICTS:
        return str(d["verdict"])
    if summary.get("verdict") in VERDICTS:
        return str(summary["verdict"])
    if summary.get("promotion") is not None or summary.get("pipeline") == "export":
        return None
    go = summary_go(summary)
    return None if go is None else (GO if go else NO_GO)


# ---------------------------------------------------------------- run facts on the reports
def run_link(summary: dict) -> str | None:
    """Where the run is in the tracking UI (an HTTP server) or how to open it (a file store)."""
    m = summary.get("mlflow") or {}
    uri, run_id = str(m.get("tracking_uri") or ""), m.get("run_id")
    if not run_id:
        return None
    if urlparse(uri).scheme in ("http", "https"):
        # the classic run page (MLflow 3 may open an experiment in its GenAI view)
        return (f"{uri.rstrip('/')}/#/experiments/{m.get('experiment_id', '0')}/runs/{run_id}"
                "?workflowType=machine_learning")
    return f"run {run_id} in {uri} (mlflow ui --backend-store-uri {uri})"


def test_window_text(summary: dict) -> str:
    """The test rows a run was judged on, as its summary states them."""
    splits = summary.get("splits") or {}
    rows = splits.get("rows") if isinstance(splits.get("rows"), dict) else splits
    window = ((summary.get("time_window") or {}).get("test")
              or (summary.get("split_windows") or {}).get("test"))
    text = []
    if isinstance(window, dict | list):
        vals = list(window.values()) if isinstance(window, dict) else window  # first, last ms
        try:
            stamps = [dt.datetime.fromtimestamp(float(v) / 1000, dt.UTC).strftime("%Y-%m-%d %H:%M")
                      for v in vals[:2]]
            text.append(" to ".join(stamps) + " UTC")
        except (TypeError, ValueError, OverflowError, OSError):
            text.append(str(window))
    if isinstance(rows, dict) and rows.get("test") is not None:
        text.append(f"{rows['test']} test rows")
    prompts = summary.get("prompts")
    if summary.get("pipeline") == "router" and isinstance(prompts, dict) and prompts.get("test"):
        text.append(f"{prompts['test']} test prompts")
    plan = summary.get("plan") or {}
    if plan.get("test_buckets"):
        text.append(f"last {plan['test_buckets']} buckets over {plan.get('n_windows')} origins")
    return "; ".join(text) or "n/a"


def run_facts(summary: dict, commit: str | None) -> dict[str, str]:
    return {"run date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "test window": test_window_text(summary),
            "run": run_link(summary) or "not tracked (tracking=off)",
            "commit": commit or "unknown (not a git checkout)",
            "verdict": str(summary.get("verdict") or verdict_line(summary))}


RUN_FACTS_MARK = "<!-- replaylab:run-facts -->"


def stamp_html(path: Path, facts: dict[str, str]) -> None:
    """Put the run facts at the top of an HTML report's body (replacing an earlier stamp)."""
    text = Path(path).read_text(encoding="utf-8")
    if RUN_FACTS_MARK in text:
        a = text.index(RUN_FACTS_MARK)
        b = text.index(RUN_FACTS_MARK, a + 1) + len(RUN_FACTS_MARK)
        text = text[:a] + text[b:]
    rows = "".join(f"<tr><th style='text-align:left;padding-right:1em'>{escape(k)}</th>"
                   f"<td>{escape(v)}</td></tr>" for k, v in facts.items())
    block = (f"{RUN_FACTS_MARK}<div class='run-facts' style='border:1px solid #bbb;"
             f"padding:.4em .8em;margin:.5em 0;font-size:90%'><table>{rows}</table></div>"
             f"{RUN_FACTS_MARK}")
    i = text.find("<body")
    i = text.index(">", i) + 1 if i >= 0 else 0
    Path(path).write_text(text[:i] + block + text[i:], encoding="utf-8")


def stamp_reports(summary: dict) -> None:
    """Stamp every HTML report the summary names with the run facts."""
    from replaylab.apps.provenance import git_commit

    reports = [Path(p) for p in (summary.get("reports") or {}).values()
               if str(p).endswith(".html") and Path(p).is_file()]
    if not reports:
        return
    facts = run_facts(summary, git_commit())
    for path in reports:
        stamp_html(path, facts)
