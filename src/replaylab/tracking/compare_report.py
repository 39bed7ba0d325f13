"""The compare view: a challenger version beside the champion on the same test window.

Inputs are plain dicts (the registered version's tags and its training run's
summary.json), so this module never talks to MLflow; `replaylab.apps.registry`
fetches them and logs the page. Demand: first, when recorded, both artifacts
scored on the challenger's own test rows by the same code
(`replaylab.artifacts.rescore_demand`: pinball, coverage and width, coverage by group),
the numbers the promotion gate reads; then each side's own training-run scores
(headline metrics, pinball by quantile, calibration and coverage by group).
Router: first, when recorded, both routers on the challenger's test prompts
(quality and cost with intervals, cost ratio at 95%, both curves on one figure);
then quality and cost of every policy with their bootstrap intervals, and each
side's cost/quality curves drawn by the router report's own figure code
(`router_figures`), each on its own test split.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from replaylab.tracking.figures import BAD, GOOD, GREY, pyplot, save_figure
from replaylab.tracking.html import (
    TD_L,
    badge,
    embedded_figure,
    escape,
    page,
    section,
    table,
    write_page,
)
from replaylab.tracking.router_report import router_figures
from replaylab.tracking.summary import lookup, to_float

TAG = "replaylab."
REPORT = "compare_report.html"
ROLES = ("challenger", "champion")


def _f(x: Any, digits: int = 4) -> str:
    v = to_float(x)
    return "—" if math.isnan(v) else f"{v:.{digits}g}"


def _tag(side: dict, key: str) -> str:
    return str((side.get("tags") or {}).get(TAG + key, "—"))


def _version_table(ch: dict, cp: dict) -> str:
    keys = [("kind", "kind"), ("artifact_version", "artifact version"),
            ("content_hash", "manifest content hash"), ("data_fingerprint", "data fingerprint"),
            ("projection_version", "projection version"), ("test_window", "test window id"),
            ("go", "go/no-go"), ("go_reasons", "gate detail"), ("source_run_id", "training run")]
    metrics = sorted({k[len(TAG):] for s in (ch, cp) for k in (s.get("tags") or {})
                      if k.startswith(TAG + "metric.")})
    rows = []
    for key, label in keys + [(m, m.removeprefix("metric.")) for m in metrics]:
        a, b = _tag(ch, key), _tag(cp, key)
        if key == "go":
            a, b = badge(a == "true", "go", "no-go"), badge(b == "true", "go", "no-go")
        else:
            a, b = escape(a if not key.startswith("metric.") else _f(a)), escape(
                b if not key.startswith("metric.") else _f(b))
        wrap = f"{TD_L} style='word-break:break-all'>"  # hashes: break, never overflow
        rows.append([f"{TD_L}>{escape(label)}</td>", f"{wrap}{a}</td>", f"{wrap}{b}</td>"])
    return table(["", f"challenger v{ch.get('version')}", f"champion v{cp.get('version')}"], rows)


def same_window(ch: dict, cp: dict) -> bool:
    """True when both versions were scored on the same data and test window."""
    a, b = _tag(ch, "test_window"), _tag(cp, "test_window")
    return a != "—" and a == b


# ---------------------------------------------------------------- demand
def _groups(summary: dict) -> dict[tuple[str, str], dict]:
    return {(str(g.get("by")), str(g.get("value"))): g
            for g in lookup(summary, "test.groups") or [] if isinstance(g, dict)}


def _fig_group_coverage(plt, ch: dict, cp: dict, level: float, path: Path) -> Path | None:
    a, b = _groups(ch.get("summary") or {}), _groups(cp.get("summary") or {})
    keys = sorted(set(a) | set(b))
    if not keys:
        return None
    fig, ax = plt.subplots(figsize=(9, 0.32 * len(keys) + 1.6))
    y = list(range(len(keys)))
    for off, side, color, label in ((-0.15, a, GOOD, "challenger"), (0.15, b, GREY, "champion")):
        ax.scatter([to_float(side.get(k, {}).get("coverage")) for k in keys],
                   [i + off for i in y], color=color, label=label, zorder=3)
    if math.isfinite(level):
        ax.axvline(level, color=BAD, ls="--", lw=1, label=f"nominal {level:g}")
    ax.set_yticks(y, [f"{by}={v}" for by, v in keys], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("test coverage of the interval")
    ax.legend(loc="lower right", fontsize=8)
    return save_figure(fig, plt, path)


def _fig_pinball(plt, ch: dict, cp: dict, path: Path) -> Path | None:
    pa = lookup(ch.get("summary") or {}, "test.model.pinball") or {}
    pb = lookup(cp.get("summary") or {}, "test.model.pinball") or {}
    qs = sorted(set(pa) | set(pb), key=to_float)
    if not qs:
        return None
    fig, ax = plt.subplots(figsize=(6, 3.4))
    x = range(len(qs))
    ax.bar([i - 0.2 for i in x], [to_float(pa.get(q)) for q in qs], 0.4, color=GOOD,
           label="challenger")
    ax.bar([i + 0.2 for i in x], [to_float(pb.get(q)) for q in qs], 0.4, color=GREY,
           label="champion")
    ax.set_xticks(list(x), [f"q={q}" for q in qs])
    ax.set_ylabel("test pinball loss (tokens)")
    ax.legend(fontsize=8)
    return save_figure(fig, plt, path)


def _rescore_section(rescore: dict, ch: dict, cp: dict, out_dir: Path) -> str:
    """Both artifacts on the challenger's test rows (the gate's numbers)."""
    title = "Champion re-scored on the challenger's test rows"
    if "error" in rescore:
        return section(title, f"<p class='src'>{escape(rescore['error'])}</p>")
    cmp, scores = rescore.get("comparison") or {}, rescore.get("scores") or {}
    a, b = (scores.get(r) or {} for r in ROLES)
    ma, mb = a.get("model") or {}, b.get("model") or {}
    delta = cmp.get("delta") or {}
    ci = delta.get("ci") or [None, None]
    better = bool(cmp.get("challenger_better_ci")) if delta else False
    rows = [[f"{TD_L}>mean pinball (quantiles {escape(', '.join(cmp.get('levels') or []))})</td>",
             _f(lookup(cmp, "challenger.mean_pinball")), _f(lookup(cmp, "champion.mean_pinball")),
             (f"{_f(delta.get('delta'))} <span class='ci'>[{_f(ci[0])}, {_f(ci[1])}]</span>"
              if delta else f"{_f(cmp.get('delta_mean_pinball'))} (no interval recorded)")]]
    for q in cmp.get("levels") or []:
        pa, pb = to_float((ma.get("pinball") or {}).get(q)), to_float((mb.get("pinball") or {}).get(q))
        rows.append([f"{TD_L}>pinball q={escape(q)}</td>", _f(pa), _f(pb), _f(pa - pb)])
    for k, label in (("coverage", "coverage"), ("coverage_raw", "coverage before conformal"),
                     ("mean_width", "mean width"), ("mae_p50", "MAE of p50"), ("n", "rows scored")):
        va, vb = to_float(ma.get(k)), to_float(mb.get(k))
        rows.append([f"{TD_L}>{escape(label)}</td>", _f(va), _f(vb), _f(va - vb)])
    ga = {(g["by"], g["value"]): g for g in a.get("groups") or []}
    gb = {(g["by"], g["value"]): g for g in b.get("groups") or []}
    grows = [[f"{TD_L}>{escape(k[0])}</td>", f"{TD_L}>{escape(k[1])}</td>",
              _f((ga.get(k) or gb.get(k) or {}).get("n")),
              _f((ga.get(k) or {}).get("coverage"), 3), _f((gb.get(k) or {}).get("coverage"), 3),
              _f((ga.get(k) or {}).get("mean_pinball")), _f((gb.get(k) or {}).get("mean_pinball"))]
             for k in sorted(set(ga) | set(gb))]
    level = to_float(ma.get("interval", (ch.get("summary") or {}).get("interval")))
    if not math.isfinite(level):
        level = to_float(_tag(ch, "interval"))
    fig = _fig_group_coverage(pyplot(), {"summary": {"test": {"groups": list(ga.values())}}},
                              {"summary": {"test": {"groups": list(gb.values())}}}, level,
                              out_dir / "compare_figures" / "rescore_group_coverage.png")
    fallback = {r: sum(((scores.get(r) or {}).get("fallback") or {}).values()) for r in ROLES}
    return section(
        title,
        f"<p class='src'>Both artifacts, each through the serving runtime "
        f"(<code>DemandPredictor.quantiles_batch</code>, online recalibration off), scored by "
        f"the pipeline's metric code on the challenger v{escape(ch.get('version'))}'s "
        f"{escape(rescore.get('labelled_rows'))} labelled test rows "
        f"(of {escape(rescore.get('rows'))}; from the {escape(rescore.get('rows_source'))}). "
        f"Champion: v{escape(lookup(rescore, 'champion.version'))} "
        f"(<code>{escape(str(lookup(rescore, 'champion.content_hash'))[:19])}</code>). "
        f"Labelled rows a model did not answer (left out): "
        f"{escape(', '.join(f'{r} {n}' for r, n in fallback.items() if n) or 'none')}.</p>"
        + ("<p class='src'><b>Warning:</b> the champion was fitted on a time window that "
           "overlaps these rows: it may have seen them, its score may be optimistic.</p>"
           if rescore.get("champion_fit_overlap") else "") +
        f"<p class='src'>challenger's mean pinball below the champion's on these rows, the "
        f"upper bound of the paired 95% interval of the difference below 0 (the promotion "
        f"gate's condition): {badge(better, 'yes', 'no')}"
        + (f"; [lo, hi]: paired bootstrap over {escape(delta.get('resampled'))} "
           f"({escape(delta.get('sessions'))} sessions, {escape(delta.get('n'))} rows both "
           f"answered, {escape(delta.get('n_boot'))} draws)" if delta else
           "; no paired interval recorded (scored before intervals were): the gate refuses")
        + "</p>",
        table(["", "challenger", "champion", "challenger − champion"], rows),
        table(["by", "value", "n", "coverage (challenger)", "coverage (champion)",
               "mean pinball (challenger)", "mean pinball (champion)"], grows)
        if grows else "<p class='src'>no group columns.</p>",
        embedded_figure(fig, "Coverage per group on the challenger's test rows; dashed: the "
                             "nominal level."))


def _demand_sections(ch: dict, cp: dict, out_dir: Path) -> list[str]:
    sa, sb = ch.get("summary") or {}, cp.get("summary") or {}
    if not (sa or sb):
        return [section("Scores", "<p class='src'>no training summary.json found for either "
                        "version: only the registered tags are shown.</p>")]
    level = to_float(sa.get("interval", sb.get("interval")))
    keys = [("n", "test rows"), ("mean_pinball", "mean pinball"), ("coverage", "coverage"),
            ("coverage_raw", "coverage before conformal"), ("mean_width", "mean width"),
            ("mae_p50", "MAE of p50")]
    def own(summary: dict, k: str) -> str:
        ci = lookup(summary, f"test.model.ci.{k}")
        v = _f(lookup(summary, f"test.model.{k}"))
        return (f"{v} <span class='ci'>[{_f(ci[0])}, {_f(ci[1])}]</span>"
                if isinstance(ci, list | tuple) and len(ci) == 2 else v)

    rows = [[f"{TD_L}>{escape(label)}</td>", own(sa, k), own(sb, k),
             _f(to_float(lookup(sa, f"test.model.{k}")) - to_float(lookup(sb, f"test.model.{k}")))]
            for k, label in keys]
    ga, gb = _groups(sa), _groups(sb)
    grows = []
    for k in sorted(set(ga) | set(gb)):
        a, b = ga.get(k, {}), gb.get(k, {})
        ca, cb = to_float(a.get("coverage")), to_float(b.get("coverage"))
        grows.append([f"{TD_L}>{escape(k[0])}</td>", f"{TD_L}>{escape(k[1])}</td>",
                      _f(a.get("n", b.get("n"))), _f(ca, 3), _f(cb, 3),
                      _f(a.get("mean_pinball")), _f(b.get("mean_pinball"))])
    plt = pyplot()
    figs = out_dir / "compare_figures"
    cov = _fig_group_coverage(plt, ch, cp, level, figs / "compare_group_coverage.png")
    pin = _fig_pinball(plt, ch, cp, figs / "compare_pinball.png")
    return [
        section("Scores on each version's own test window",
                table(["", "challenger", "champion", "challenger − champion"], rows),
                "<p class='src'>summary.json <code>test.model</code> of each version's training "
                f"run; nominal interval {_f(level, 3)}; [lo, hi]: each run's 95% "
                "session-bootstrap interval. The difference is of scores on each version's own "
                "rows, so it has no paired interval: the paired one is in the section above, "
                "when the champion was re-scored on the challenger's rows.</p>",
                embedded_figure(pin, "Pinball loss per quantile (lower is better).")),
        section("Calibration and coverage by group",
                table(["by", "value", "n", "coverage (challenger)", "coverage (champion)",
                       "mean pinball (challenger)", "mean pinball (champion)"], grows)
                if grows else "<p class='src'>no group scores in either summary.</p>",
                embedded_figure(cov, "Test coverage per group; dashed: the nominal level.")),
    ]


# ---------------------------------------------------------------- router
def _ci_text(t: dict, key: str) -> str:
    ci = lookup(t, f"ci.{key}")
    lo, hi = (list(ci) + [None, None])[:2] if isinstance(ci, list | tuple) else (None, None)
    return f"{_f(t.get(key))} <span class='ci'>[{_f(lo)}, {_f(hi)}]</span>"


def _fig_rescored_curves(plt, rescore: dict, path: Path) -> Path | None:
    scores = rescore.get("scores") or {}
    if not all((scores.get(r) or {}).get("curve") for r in ROLES):
        return None
    fig, ax = plt.subplots(figsize=(6.4, 4))
    for role, color in (("challenger", GOOD), ("champion", GREY)):
        s = scores[role]
        cur, pol = s["curve"], s["policy"]
        ax.plot(cur["cost"], cur["quality"], color=color, lw=1.5, label=f"{role} (threshold sweep)")
        ci = pol.get("ci") or {}
        q, c = to_float(pol.get("quality")), to_float(pol.get("cost"))
        qlo, qhi = (list(ci.get("quality") or []) + [None, None])[:2]
        clo, chi = (list(ci.get("cost") or []) + [None, None])[:2]
        ax.errorbar([c], [q], yerr=[[q - to_float(qlo)], [to_float(qhi) - q]],
                    xerr=[[c - to_float(clo)], [to_float(chi) - c]], fmt="o", color=color,
                    capsize=3, label=f"{role} operating point (95% CI)")
    ax.set_xlabel("cost per prompt")
    ax.set_ylabel("quality (mean score)")
    ax.legend(fontsize=7, loc="lower right")
    return save_figure(fig, plt, path)


def _router_rescore_section(rescore: dict, ch: dict, out_dir: Path) -> str:
    """Both routers on the challenger's test prompts."""
    title = "Champion re-scored on the challenger's test prompts"
    if "error" in rescore:
        return section(title, f"<p class='src'>{escape(rescore['error'])}</p>")
    overlap = rescore.get("champion_fit_overlap") or lookup(
        rescore, "comparison.champion_fit_overlap") or {}
    deltas = lookup(rescore, "comparison.delta") or {}

    def policy_rows(scores: dict, delta: dict) -> list[list[str]]:
        a, b = ((scores.get(r) or {}).get("policy") or {} for r in ROLES)
        rows = []
        for k, label in (("quality", "quality"), ("cost", "cost per prompt"),
                         ("strong_share", "strong-call share"),
                         ("cost_ratio_at_95", "cost ratio @95% of strong quality"),
                         ("apgr", "APGR")):
            cell = (_ci_text(a, k), _ci_text(b, k)) if k in ("quality", "cost") else \
                (_f(a.get(k)), _f(b.get(k)))
            d = delta.get(k) if k in ("quality", "cost") else None
            diff = (f"{_f(d.get('mean'))} <span class='ci'>[{_f((d.get('ci') or [None])[0])}, "
                    f"{_f((d.get('ci') or [None, None])[1])}]</span>" if d else
                    _f(to_float(a.get(k)) - to_float(b.get(k))))
            rows.append([f"{TD_L}>{escape(label)}</td>", *cell, diff])
        return rows

    heads = ["", "challenger", "champion", "challenger − champion [paired 95% CI]"]
    if not overlap:
        warn = ("<p class='src'>Leakage not checked (scored before the champion's fit prompts "
                "were recorded).</p>")
    elif not overlap.get("known"):
        warn = f"<div class='box'><b>Leakage unknown:</b> {escape(overlap.get('what'))}.</div>"
    elif overlap.get("seen"):
        share = to_float(overlap["seen"]) / max(to_float(overlap.get("prompts")), 1.0)
        warn = (f"<div class='box' id='leakage'><b>Warning: {escape(overlap['seen'])} of "
                f"{escape(overlap.get('prompts'))} test prompts ({share:.0%}) were in the "
                f"champion's training or calibration prompts</b>: on them its scores may be "
                f"optimistic. Both routers are shown on all prompts and on the "
                f"{escape(overlap.get('unseen'))} prompts the champion never saw.</div>")
    else:
        warn = ("<p class='src'>Leakage: none of these test prompts is among the champion's "
                "training or calibration prompts.</p>")
    unseen = ""
    if rescore.get("scores_unseen"):
        unseen = ("<h3>Only the prompts the champion never saw</h3>"
                  + table(heads, policy_rows(rescore["scores_unseen"], deltas.get("unseen") or {})))
    fig = _fig_rescored_curves(pyplot(), rescore,
                               out_dir / "compare_figures" / "rescore_router_curves.png")
    rows = policy_rows(rescore.get("scores") or {}, deltas.get("all") or {})
    return section(
        title, warn,
        f"<p class='src'>Both routers through the serving runtime "
        f"(<code>Router.route_batch</code>: each its own encoder, head and threshold) on the "
        f"challenger v{escape(ch.get('version'))}'s {escape(rescore.get('rows'))} test "
        f"prompts (rebuilt from {escape(rescore.get('rows_source'))}), scored by the "
        f"pipeline's <code>policy_summary</code>; [lo, hi]: 95% bootstrap intervals over "
        f"prompts; challenger − champion: paired differences per prompt with their "
        f"prompt-bootstrap intervals. Champion: v{escape(lookup(rescore, 'champion.version'))} "
        f"(<code>{escape(str(lookup(rescore, 'champion.content_hash'))[:19])}</code>).</p>",
        "<h3>All test prompts</h3>" if unseen else "", table(heads, rows), unseen,
        embedded_figure(fig, "Cost/quality of each router on the same test prompts: the "
                             "threshold sweep of its P(success) and its operating point."))


def _router_sections(ch: dict, cp: dict, out_dir: Path) -> list[str]:
    ta = lookup(ch.get("summary") or {}, "test") or {}
    tb = lookup(cp.get("summary") or {}, "test") or {}
    if not (ta or tb):
        return [section("Scores", "<p class='src'>no training summary.json found for either "
                        "version: only the registered tags are shown.</p>")]
    rows = []
    for p in [p for p in dict.fromkeys([*ta, *tb]) if isinstance((ta.get(p) or tb.get(p)), dict)]:
        a, b = ta.get(p) or {}, tb.get(p) or {}
        rows.append([f"{TD_L}>{escape(p)}</td>", _ci_text(a, "quality"), _ci_text(b, "quality"),
                     _ci_text(a, "cost"), _ci_text(b, "cost"),
                     _f(a.get("cost_ratio_at_95")), _f(b.get("cost_ratio_at_95"))])
    figs = []
    for role, side in (("challenger", ch), ("champion", cp)):
        drawn = router_figures(side.get("summary") or {}, out_dir / "compare_figures" / role)
        figs.append(embedded_figure(drawn.get("curves"),
                                    f"{role} v{side.get('version')}: cost/quality curves "
                                    "(intervals: bootstrap over test prompts)"))
    return [section("Policies on the test split",
                    table(["policy", "quality (challenger)", "quality (champion)",
                           "cost (challenger)", "cost (champion)", "cost ratio @95 (challenger)",
                           "cost ratio @95 (champion)"], rows),
                    "<p class='src'>summary.json <code>test</code> of each version's training "
                    "run; [lo, hi]: 95% bootstrap intervals.</p>"),
            section("Cost/quality curves", f"<div class='row'>{''.join(figs)}</div>")]


def write_compare_report(name: str, challenger: dict, champion: dict, out_dir: Path,
                         rescore: dict | None = None) -> Path:
    """Write out_dir/compare_report.html; each side is {version, tags, summary}; rescore:
    both artifacts scored on the challenger's test rows (registry.rescore_against)."""
    out_dir = Path(out_dir)
    kind = _tag(challenger, "kind")
    same = same_window(challenger, champion)
    rescored = rescore is not None and "error" not in rescore
    head = (f"<h1>{escape(name)}: challenger v{escape(challenger.get('version'))} vs champion "
            f"v{escape(champion.get('version'))}</h1><p class='src'>same data and test window: "
            f"{badge(same, 'yes', 'no — the training-run scores are not on the same rows')}")
    head += (" · champion scored on the challenger's test "
             f"{'rows' if kind == 'demand' else 'prompts'}: {badge(rescored, 'yes', 'no')}</p>")
    body = [head, section("Registered versions", _version_table(challenger, champion))]
    if rescore is not None:
        body.append(_rescore_section(rescore, challenger, champion, out_dir) if kind == "demand"
                    else _router_rescore_section(rescore, challenger, out_dir))
    body += (_demand_sections(challenger, champion, out_dir) if kind == "demand"
             else _router_sections(challenger, champion, out_dir))
    return write_page(out_dir / REPORT, page(f"{name} compare", body))
