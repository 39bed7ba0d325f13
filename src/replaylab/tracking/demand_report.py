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

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from replaylab.demand.gate import COVERAGE_BAND, GROUP_BAND, coverage_target, within_target
from replaylab.tracking.demand_figures import demand_figures
from replaylab.tracking.demand_scores import (
    MIN_GROUP_N,
    MODEL,
    flag_column,
    fmt_metric,
    group_rows,
    interval_columns,
    predictors,
    prepare_predictions,
    quantile_levels,
    recompute_metrics,
    scored_mask,
    summary_scores,
)
from replaylab.tracking.html import (
    badge,
    embedded_figure,
    escape,
    facts_table,
    page,
    section,
    table,
    write_page,
)
from replaylab.tracking.summary import lookup, to_float

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


def _kind(key: str) -> str:
    return "cov" if key == "coverage" else "tok"


def _verdict(scores, key, b, interval) -> tuple[bool | None, str]:
    """(model wins?, how the baseline was chosen) for one metric against baseline b."""
    mv, bv = to_float(lookup(scores[MODEL], key)), to_float(lookup(scores[b], key))
    if key == "coverage":
        if within_target(mv, interval):
            return True, f"closest to {interval:.2f}"
        return abs(mv - interval) <= abs(bv - interval), f"closest to {interval:.2f}"
    if key == "mean_width":
        if to_float(scores[MODEL].get("coverage")) < interval - COVERAGE_BAND:
            return None, "narrowest that covers"
        return mv <= bv, "narrowest that covers"
    return mv <= bv, "lowest"


def _baseline_section(scores, interval, src) -> str:
    rows, cls = [], []
    present = _metrics_present(scores)
    for p in scores:
        cells = [f"<td class='l'>{escape(p)}</td>"]
        for key, _ in present:
            best = _best_of(scores, key, interval, include_model=True) == p
            cells.append(f"<td class='{'best' if best else ''}'>"
                         f"{_with_ci(scores[p], key)}</td>")
        rows.append(cells)
        cls.append("model" if p == MODEL else "")
    verdicts, beaten = [], []
    for key, label in present:
        b = _best_of(scores, key, interval, include_model=False)
        if b is None:
            verdicts.append([f"<td class='l'>{label}</td>", "<td class='l'>none that "
                             f"covers {interval - COVERAGE_BAND:.2f}</td>", "—",
                             fmt_metric(lookup(scores[MODEL], key), _kind(key)), badge(None)])
            continue
        mv, bv = to_float(lookup(scores[MODEL], key)), to_float(lookup(scores[b], key))
        wins, how = _verdict(scores, key, b, interval)
        rel = "" if key == "coverage" or not bv else f" ({(mv - bv) / bv:+.1%})"
        if wins is False:
            beaten.append(f"{escape(b)} beats the model on {label}: {fmt_metric(bv, _kind(key))} "
                          f"against {fmt_metric(mv, _kind(key))}")
        verdicts.append([f"<td class='l'>{label}</td>", f"<td class='l'>{escape(b)} ({how})</td>",
                         _with_ci(scores[b], key), _with_ci(scores[MODEL], key) + rel,
                         badge(wins, "model within target" if key == "coverage"
                               else "model better", "baseline better")])
    plain = ("<div class='box'><b>Where a baseline beats the model:</b><ul>" + "".join(
        f"<li>{s}</li>" for s in beaten) + "</ul></div>") if beaten else (
        "<p><span class='ok'>No baseline beats the model on any metric below.</span></p>")
    return (f"<p class='src'>From summary.json <code>test.model</code> and "
            f"<code>test.baselines</code>; {src}. Underlined: best in column (coverage: "
            f"closest to {interval:.2f}; width: narrowest with coverage ≥ "
            f"{interval - COVERAGE_BAND:.2f}); [lo, hi]: 95% session-bootstrap intervals "
            f"(summary.json <code>test.*.ci</code>).</p>"
            + table(["predictor", *[label for _, label in present]], rows, cls)
            + "<h3>Best baseline per metric</h3>" + plain
            + table(["metric", "best baseline", "baseline", "model", "verdict"], verdicts))


def _metrics_present(scores) -> list[tuple[str, str]]:
    return [(k, label) for k, label in _METRICS
            if any(not math.isnan(to_float(lookup(m, k))) for m in scores.values())]


def _best_of(scores, key, interval, include_model) -> str | None:
    """Lowest value; coverage: closest to nominal; width: narrowest among those whose
    coverage reaches nominal - COVERAGE_BAND (a zero-width interval that covers nothing is no win)."""
    cands = []
    for p, m in scores.items():
        v = to_float(lookup(m, key))
        if (p == MODEL and not include_model) or math.isnan(v):
            continue
        if key == "mean_width" and not to_float(m.get("coverage")) >= interval - COVERAGE_BAND:
            continue
        cands.append((abs(v - interval) if key == "coverage" else v, p))
    return min(cands)[1] if cands else None


def _with_ci(m: dict, key: str) -> str:
    """A figure with its interval from the metrics' `ci` ('—' when none is recorded)."""
    v = fmt_metric(lookup(m, key), _kind(key))
    ci = (m.get("ci") or {}).get(key)
    if not isinstance(ci, list | tuple) or len(ci) != 2:
        return v
    return (f"{v} <span class='ci'>[{fmt_metric(ci[0], _kind(key))}, "
            f"{fmt_metric(ci[1], _kind(key))}]</span>")


def gate_verdict(gate: dict | None) -> str:
    """The verdict the report prints: the gate's own word (summary.json `gate.verdict`: GO,
    NO-GO or NOT ENOUGH EVIDENCE; a gate recorded before the word: its `go`)."""
    if not gate:
        return "no gate recorded"
    return str(gate.get("verdict") or ("GO" if gate.get("go") else "NO-GO"))


def _gate_box(gate: dict | None) -> str:
    """The gate's rule, verdict and reasons, as summary.json `gate` recorded them (the
    registry reads the same dict from the manifest: one verdict)."""
    if not gate:
        return ("<div class='box'><b>Gate:</b> no gate recorded in summary.json (a run from "
                "before the gate was recorded): the registry refuses to promote it.</div>")
    verdict = gate_verdict(gate)
    look = "ok" if gate.get("go") else ("bad" if verdict in ("GO", "NO-GO") else "thin")
    objective = (f"<p>Objective: {escape(str(gate['objective']))}.</p>"
                 if gate.get("objective") else "")
    return (f"<div class='box' id='gate'><b>Gate verdict: <span class='gate-verdict "
            f"{look}'>{escape(verdict)}</span></b>{objective}"
            f"<p class='src'>Rule: {escape(str(gate.get('rule', '')))}. The registry's "
            f"promotion gate reads this verdict (manifest <code>training.gate</code>); it is "
            f"computed once, by <code>replaylab.demand.gate</code>.</p><ul>"
            + "".join(f"<li>{escape(str(r))}</li>" for r in gate.get("reasons") or [])
            + "</ul></div>")


def _targets(scores, groups, interval, gate: dict | None = None) -> str:
    m = scores.get(MODEL, {})
    cov = to_float(m.get("coverage"))
    lo, hi = coverage_target(interval)
    big = [g for rows in groups.values() for g in rows if g["n"] >= MIN_GROUP_N]
    off = [g for g in big if abs(to_float(g["coverage"]) - interval) > GROUP_BAND + 1e-12]
    base = [b for b in scores if b != MODEL]
    p9 = [b for b in base if not to_float(lookup(m, "pinball.0.9"))
          < to_float(lookup(scores[b], "pinball.0.9"))]
    mp = [b for b in base if not to_float(m.get("mean_pinball"))
          < to_float(scores[b].get("mean_pinball"))]
    vs = (gate or {}).get("vs_best_baseline") or {}
    ci = vs.get("ci") or [math.nan, math.nan]
    gcov = (gate or {}).get("coverage") or {}
    served = gcov.get("interval") == "served"
    rows = [
        [f"<td class='l'>gated: coverage of the {'served ' if served else ''}{interval:.0%} "
         f"interval within {lo:.2f}–{hi:.2f}"
         + (" (online recalibration replayed over the test window; the exported band's "
            "coverage is the model row's below)" if served else "") + "</td>",
         (_with_ci({"coverage": gcov.get("value"), "ci": {"coverage": gcov.get("ci")}},
                   "coverage") if gcov else _with_ci(m, "coverage")),
         badge(lookup(gate, "coverage.ok") if gate else within_target(cov, interval))],
        [f"<td class='l'>gated: mean pinball below the best baseline's "
         f"({escape(str(vs.get('baseline', '—')))}), upper bound of the paired 95% "
         "session-bootstrap interval of model − baseline below 0</td>",
         (f"{to_float(vs.get('delta')):+.4g} [{to_float(ci[0]):+.4g}, {to_float(ci[1]):+.4g}]"
          if vs else "no gate recorded"),
         badge(bool(vs.get("ok")) if vs else None)],
        [f"<td class='l'>every group with n ≥ {MIN_GROUP_N} within "
         f"{interval - GROUP_BAND:.2f}–{interval + GROUP_BAND:.2f} (not gated)</td>",
         f"{len(big) - len(off)} of {len(big)} groups" + (
             "; outside: " + ", ".join(f"{escape(g['by'])}={escape(g['value'])} "
                                       f"({fmt_metric(g['coverage'], 'cov')})" for g in off)
             if off else ""), badge(not off if big else None)],
        ["<td class='l'>pinball q0.9 below every baseline (not gated)</td>",
         "not below: " + ", ".join(p9) if p9 else "below all", badge(not p9 if base else None)],
        ["<td class='l'>mean pinball below every baseline (not gated)</td>",
         "not below: " + ", ".join(mp) if mp else "below all", badge(not mp if base else None)],
    ]
    return _gate_box(gate) + table(["target", "measured [95% CI]", ""], rows)


def _absent_note(summary: dict, by: str) -> str:
    """The values of `by` the model trained on that the test rows do not have."""
    gone = (lookup(summary, "test.groups_absent_from_test") or {}).get(by) or []
    if not gone:
        return ""
    return (f"<p class='warn'>In train, absent from the labelled test rows (not measured "
            f"here): {escape(', '.join(map(str, gone)))}. From summary.json "
            "<code>test.groups_absent_from_test</code>.</p>")


def _group_table(rows, interval, src) -> str:
    body = []
    for g in sorted(rows, key=lambda r: -r["n"]):
        small = g["n"] < MIN_GROUP_N
        body.append([f"<td class='l'>{escape(g['value'])}</td>", fmt_metric(g["n"], "int"),
                     fmt_metric(g.get("coverage"), "cov"),
                     *[fmt_metric(lookup(g, f"pinball.{t}")) for t in ("0.1", "0.5", "0.9")],
                     fmt_metric(g.get("model_mean_pinball")),
                     fmt_metric(g.get("best_mean_pinball")) + f" ({escape(g.get('best', '—'))})",
                     f"<span class='warn'>n &lt; {MIN_GROUP_N}: not held to the band</span>"
                     if small else badge(
                         abs(to_float(g.get("coverage")) - interval) <= GROUP_BAND + 1e-12)])
    whence = {g.get("best_from") for g in rows} - {None}
    return (f"<p class='src'>n, coverage and model pinball from summary.json "
            f"<code>test.groups</code>; best baseline's mean pinball from "
            f"{' and '.join(sorted(w.replace('summary', 'summary.json') for w in whence)) or '—'}"
            f"; {src}.</p>"
            + table(["group", "n", "coverage", "pinball q0.1", "pinball q0.5", "pinball q0.9",
                     "mean pinball", "best baseline's mean pinball", "band"], body))


_LOWER_BOUND = ("length", "cancelled", "failed", "censored")


def _classes(pred: pd.DataFrame) -> pd.Series:
    """Each test row's label class: the pipeline's label_class, else from the flags."""
    if "label_class" in pred:
        return pred["label_class"].astype(str)
    conds = [flag_column(pred, "absent_usage"), flag_column(pred, "cancelled"),
             flag_column(pred, "censored"), scored_mask(pred)]
    return pd.Series(np.select(conds, ["absent_usage", "cancelled", "censored", "label"],
                               "no_total"), index=pred.index)


def _counts_section(pred, summary, n_eval, src) -> str:
    labels = summary.get("labels") or {}
    by_reason = labels.get("censored_by_reason") or {}
    cls = _classes(pred)
    usable = [labels.get(k) for k in ("train", "calibration", "test", "embargo")]
    all_splits = {"label": sum(int(to_float(v)) for v in usable if not math.isnan(to_float(v)))
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
        rows.append([f"<td class='l'>{escape(c)}</td>",
                     fmt_metric(n_test, "int") if known else "—",
                     fmt_metric(n_all, "int"), f"<td class='l'>{escape(how)}</td>"])
    out = (f"<p class='src'>Test rows by class from the predictions ({len(pred):,} test rows"
           f"{', column label_class' if 'label_class' in pred else ''}); all splits from "
           f"summary.json <code>labels</code> (usable labels: train "
           f"{fmt_metric(labels.get('train'), 'int')}, calibration "
           f"{fmt_metric(labels.get('calibration'), 'int')}, test "
           f"{fmt_metric(labels.get('test'), 'int')}"
           f"{', embargo ' + fmt_metric(labels['embargo'], 'int') if 'embargo' in labels else ''})"
           "; lower bounds count in every split.</p>"
           + table(["class", "test rows", "all splits", "treatment"], rows))
    preds = predictors(pred)
    crows = []
    for c in [c for c in order if c in _LOWER_BOUND]:
        sub = pred[(cls == c) & pred["y"].notna()]
        if len(sub):
            y = sub["y"].to_numpy(float)
            crows.append([f"<td class='l'>{escape(c)}</td>", fmt_metric(len(sub), "int"), *[
                fmt_metric(np.mean(sub[interval_columns(sub, p)[1]].to_numpy(float) >= y), "cov")
                if interval_columns(sub, p)[1] in sub else "—" for p in preds]])
    if crows:
        cs = lookup(summary, "test.censored") or {}
        out += ("<h3>Lower-bounded rows: does the upper bound reach the observed total?</h3>"
                "<p class='src'>Share of rows with interval upper bound ≥ observed total, "
                "recomputed from the predictions (a miss is a sure miss of the true demand; a "
                "hit is necessary, not sufficient). summary.json <code>test.censored</code>: "
                f"n = {fmt_metric(cs.get('n'), 'int')}, model share "
                f"{fmt_metric(cs.get('hi_at_least_observed'), 'cov')}; {src}.</p>"
                + table(["class", "rows", *[escape(p) for p in preds]], crows))
    return out


def _censoring_section(summary) -> str:
    """Which censoring variant was trained, why, and every candidate's figures."""
    c = summary.get("censoring")
    if not c:
        return "<p class='src'>summary.json has no <code>censoring</code> section.</p>"
    rounds = f", {c['pinball_rounds']} censored rounds" if c.get("pinball_rounds") else ""
    out = (f"<p>Trained: <b>{escape(str(c.get('method')))}</b>{escape(rounds)} (configured "
           f"<code>{escape(str(c.get('configured')))}</code>, classes "
           f"{escape(', '.join(c.get('classes') or []))}; cut rows in train "
           f"{fmt_metric(c.get('train_censored_rows'), 'int')}, calibration "
           f"{fmt_metric(c.get('calibration_censored_rows'), 'int')}). "
           f"{escape(str(c.get('reason')))}</p>")
    cands = c.get("candidates") or {}
    rows, chosen = [], c.get("candidate", c.get("method"))
    for name, figs in cands.items():
        for split in ("calibration", "test_report_only"):
            f = figs.get(split) or {}
            rows.append([f"<td class='l'>{escape(name)}{' ✓' if name == chosen else ''}"
                         "</td>", f"<td class='l'>{escape(split.replace('_report_only', ''))}</td>",
                         fmt_metric(f.get("mean_pinball")), fmt_metric(f.get("coverage"), "cov"),
                         fmt_metric(f.get("mean_width")), fmt_metric(f.get("capped_n"), "int"),
                         fmt_metric(f.get("capped_hi_ge_obs"), "cov"),
                         fmt_metric(f.get("consumption_mean_pinball"))])
    if rows:
        out += ("<p class='src'>summary.json <code>censoring.candidates</code>: the choice uses "
                "the calibration rows only; test figures are reported, never used to choose. "
                "Pinball, coverage and width on label rows; capped: rows cut at their cap, share "
                "with hi ≥ observed; consumption pinball: label and cut rows against what they "
                "consumed (docs/design/demand-target.md).</p>"
                + table(["variant", "split", "mean pinball", "coverage", "mean width",
                         "capped rows", "capped hi ≥ obs", "consumption pinball"], rows))
    return out


def _versions_section(summary, pred, n_eval) -> str:
    facts = {
        "ledger fingerprint": summary.get("ledger_fingerprint"),
        "projection version": lookup(summary, "projection.version"),
        "pipeline": summary.get("pipeline", "demand"),
        "interval (nominal)": summary.get("interval"),
        "rows read / valid / quarantined": " / ".join(
            fmt_metric(summary.get(k), "int")
            for k in ("rows_read", "rows_valid", "rows_quarantined")),
        "quarantine by reason": json.dumps(summary.get("quarantine_by_reason") or {}),
        "labels": json.dumps(summary.get("labels") or {}),
        "test rows in predictions / scored": f"{len(pred):,} / {n_eval:,}",
    }
    return (facts_table(facts)
            + "<details><summary>Full summary.json</summary><pre>"
            + escape(json.dumps(summary, indent=2, default=str)) + "</pre></details>")


def _scored_sections(predictions, summary, figs, mask, scores, src) -> list[str]:
    """Targets, baselines, reliability, groups, residuals and the scatter of a scored run."""
    preds, qs = predictors(predictions), quantile_levels(predictions)
    interval = to_float(summary.get("interval", 0.8))
    groups = group_rows(predictions, summary, preds, qs, interval)
    n_check = recompute_metrics(predictions[mask], MODEL, qs)
    diff = abs(n_check["coverage"] - to_float(scores[MODEL].get("coverage")))
    check = (f"<p class='src'>Cross-check from the predictions on the same rows: model "
             f"coverage {fmt_metric(n_check['coverage'], 'cov')}, mean pinball "
             f"{fmt_metric(n_check['mean_pinball'])} "
             + (badge(True, "agrees with summary") if diff < 0.005 else
                "<span class='warn'>differs from summary.json</span>") + "</p>")
    rel = lookup(summary, "test.reliability") or []
    rel_table = table(["nominal", "observed", "gap"], [
        [fmt_metric(r.get("nominal"), "cov"), fmt_metric(r.get("observed"), "cov"),
         f"{to_float(r.get('observed')) - to_float(r.get('nominal')):+.3f}"] for r in rel])
    by_group = [section(f"By {escape(by)}", embedded_figure(figs.get(f"groups_{by}"), (
        f"Left: coverage per {escape(by)}; dashed line {interval:.2f}, green band "
        f"{interval - GROUP_BAND:.2f}–{interval + GROUP_BAND:.2f}; red: outside it; grey: "
        f"n &lt; {MIN_GROUP_N}. Right: model's mean pinball over the best baseline's "
        f"in the same group; {src}.")), _group_table(rows, interval, src),
        _absent_note(summary, by), level=3)
        for by, rows in groups.items()]
    return [
        section("Targets", "<p class='src'>The issue's targets, from summary.json "
                f"<code>test.model</code>, <code>test.baselines</code>, "
                f"<code>test.groups</code>; {src}.</p>",
                _targets(scores, groups, interval, summary.get("gate"))),
        section("Model against baselines", _baseline_section(scores, interval, src), check,
                embedded_figure(figs.get("baselines"), (
                    "Left: pinball loss per quantile and their mean (a bar far above the "
                    "rest is clipped, its value printed on it). Right: coverage against mean "
                    f"width; green band is the coverage target. From summary.json; {src}."))),
        section("Reliability", "<div class='row'>", embedded_figure(figs.get("reliability"), (
            f"Observed coverage of the calibrated model's interval at several nominal levels "
            f"(summary.json <code>test.reliability</code>); {src}.") if rel else
            "summary.json has no test.reliability"), rel_table if rel else "", "</div>"),
        section("Coverage and pinball per group", *by_group),
        section("Residuals", embedded_figure(figs.get("residuals"), (
            "Left: y − p50 for the model and the best baseline by mean pinball (symlog axis; "
            "bins are 2.5 tokens wide within ±10 and widen logarithmically beyond). "
            "Right: share of rows below q0.1, between the quantiles, above q0.9 (raw "
            f"quantiles, before calibration); dashed: the share a calibrated model gives; "
            f"{src}."))),
        section("Predicted against actual", embedded_figure(figs.get("scatter"), (
            f"p50 against actual total tokens, log-log, up to 4,000 sampled rows "
            f"per kind; censored rows (triangles) are lower bounds; {src}.")))]


def write_demand_report(predictions: pd.DataFrame, summary: dict, out_dir: Path) -> Path:
    """Write out_dir/demand_report.html (figures embedded) and its PNGs; return the path."""
    out_dir = Path(out_dir)
    figs = demand_figures(predictions, summary, out_dir / "figures")
    predictions = prepare_predictions(predictions)
    preds, qs = predictors(predictions), quantile_levels(predictions)
    interval = to_float(summary.get("interval", 0.8))
    mask = scored_mask(predictions)
    n_eval = next((int(v) for v in (lookup(summary, "test.model.n"),
                                    lookup(summary, "test.labelled_rows")) if to_float(v) >= 0),
                  int(mask.sum()))
    fp = str(summary.get("ledger_fingerprint") or "unknown")
    src = (f"measured on {n_eval:,} scored test rows of ledger <code>{escape(fp[:16])}</code>, "
           f"projection <code>{escape(lookup(summary, 'projection.version', '?'))}</code>")
    scores = summary_scores(summary)
    reason = summary.get("error") or summary.get("reason") or summary.get("not_trained_reason")
    parts = [f"<h1>Demand model: total tokens before dispatch</h1><p class='src'>Quantiles "
             f"{', '.join(str(q) for q in qs)}, calibrated {interval:.0%} interval; {src}; "
             f"predictors: {escape(', '.join(preds) or 'none')}.</p>"]
    if reason or MODEL not in preds or not mask.any() or not scores[MODEL]:
        why = reason or ("no test row has a usable label" if MODEL in preds
                         else "no model predictions were written")
        parts.append(f"<div class='box'><b>Nothing could be trained or scored:</b> "
                     f"{escape(why)}</div>")
    else:
        parts += _scored_sections(predictions, summary, figs, mask, scores, src)
    parts += [section("Censored, cancelled and absent usage",
                      _counts_section(predictions, summary, n_eval, src)),
              section("Censoring-aware training", _censoring_section(summary)),
              section("Data and versions", _versions_section(summary, predictions, n_eval))]
    return write_page(out_dir / "demand_report.html", page("Demand model report", parts))
