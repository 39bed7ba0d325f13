"""The demand pipeline over engine partitions, the test figures: every predictor on every
test partition, summed (`pipelines.demand_partitions`, module docstring steps 6 and 7).

`eval_part` writes one test partition's predictions (the local
`predictions_test.parquet` columns) and returns its sums: pinball per level, coverage,
width, MAE, the raw band, per-group tables, censored rows, reliability, and the
session bootstrap's replicate sums (w[b, s] ~ Poisson(1) from a hash of
(session_id, b), `demand.metrics.session_replicates`, the one bootstrap of both
engines); `eval_sum` adds partitions;
`test_section` turns the sums into the summary's `test` section and the gate
(`demand.gate.demand_gate`, the local rule).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pandas as pd

from replaylab.contracts.columns import Ledger as L
from replaylab.contracts.columns import Projected as P
from replaylab.demand.baselines import bucket_keys
from replaylab.demand.config import DemandConfig
from replaylab.demand.conformal import cell_keys
from replaylab.demand.gate import CI_LEVEL, RESAMPLED, demand_gate
from replaylab.demand.inputs import prompt_tokens
from replaylab.demand.labels import CLASS_COLUMN, LABEL, LOWER_BOUND_CLASSES
from replaylab.demand.metrics import quantile_key, row_figures, session_replicates
from replaylab.demand.model import MODEL, base_band, request_cap
from replaylab.demand.served import (
    END_MS,
    SERVED,
    feedback_actuals,
    rows_per_day,
    served_band,
    served_section,
)
from replaylab.pipelines.demand_outputs import intervals_text, predictions_frame, write_served


def _predict_all(part: pd.DataFrame, predictors: dict, calibrators: dict,
                 demand: DemandConfig) -> dict:
    cap = request_cap(part) if demand.clip_to_cap else None
    out = {}
    for name, pred in predictors.items():
        q, lo_b, hi_b = base_band(pred, part)
        lo, hi = calibrators[name].predict_interval(part, lo_b, hi_b, cap)
        out[name] = (q, lo, hi, (lo_b, hi_b))
    return out


def eval_part(part: pd.DataFrame, predictors: dict, calibrators: dict, reliability: dict,
              demand: DemandConfig, n_boot: int, out_dir: str,
              file_name: Callable[[pd.DataFrame], str]) -> dict:
    """One test partition: write its predictions (`out_dir/file_name(part)`); return its
    sums (module docstring, 6)."""
    names = list(predictors)
    qs = list(demand.quantiles)
    if len(part) == 0:
        return {"rows": 0}
    got = _predict_all(part, predictors, calibrators, demand)
    cls = part[CLASS_COLUMN].to_numpy(dtype=object)
    y_all = part[P.LABEL_TOTAL_DEMAND].to_numpy(dtype="float64", na_value=np.nan)
    predictions_frame(part, y_all.copy(), cls, np.isin(cls, LOWER_BOUND_CLASSES),
                      {k: v[:3] for k, v in got.items()}, demand).to_parquet(
        os.path.join(out_dir, file_name(part)), index=False)
    u = cls == LABEL
    y = y_all[u]
    cols: dict[str, np.ndarray] = {}
    for name in names:
        q, lo, hi, _ = got[name]
        for k, v in row_figures(y, q[u], lo[u], hi[u], qs).items():
            cols[f"{name}|{k}"] = v
        cols[f"{name}|coverage_raw"] = ((y >= q[u, 0]) & (y <= q[u, -1])).astype(float)
        cols[f"{name}|mean_width_raw"] = q[u, -1] - q[u, 0]
    keys = list(cols)
    X = np.column_stack([cols[k] for k in keys]) if len(y) else np.zeros((0, len(keys)))
    res: dict[str, Any] = {"rows": len(part), "n": int(u.sum()), "keys": keys,
                           "sums": X.sum(axis=0)}
    # the one session bootstrap (`demand.metrics.session_replicates`): this partition's sums
    sess = part[L.SESSION_ID].to_numpy(dtype=object)[u]
    res["boot"], res["boot_n"], res["sessions"] = session_replicates(X, sess, n_boot,
                                                                     demand.seed)
    # per group value: n, model pinball per level, covered, width, baselines' mean pinball
    test_u = part[u]
    gkeys = bucket_keys(test_u, demand.group_columns)
    mq, mlo, mhi, mband = got[MODEL]
    d = y[:, None] - mq[u]
    tau = np.asarray(qs)[None, :]
    mpin = np.maximum(tau * d, (tau - 1.0) * d)
    bmp = np.column_stack([cols[f"{b}|mean_pinball"] for b in names if b != MODEL]) \
        if len(y) else np.zeros((0, len(names) - 1))
    per = np.column_stack([np.ones(len(y)), mpin, ((y >= mlo[u]) & (y <= mhi[u])),
                           mhi[u] - mlo[u], bmp]) if len(y) else np.zeros((0, 0))
    groups: dict = {}
    for by in demand.group_columns:
        vals = gkeys[by].to_numpy(dtype=object)
        for v in set(vals.tolist()):
            groups[(by, str(v))] = per[vals == v].sum(axis=0)
    res["groups"] = groups
    # rows whose total is a lower bound: hi >= observed, by reason
    lb = np.isin(cls, LOWER_BOUND_CLASSES)
    res["censored"] = {str(r): np.array([int(((cls == r) & lb).sum()),
                                         int(((cls == r) & lb & (mhi >= y_all)).sum())])
                       for r in set(cls[lb].tolist())}
    # the model's band recalibrated to each reliability level
    cap = request_cap(test_u) if demand.clip_to_cap else None
    rel = {}
    for level, cq in reliability.items():
        lo, hi = cq.predict_interval(test_u, mband[0][u], mband[1][u], cap)
        rel[level] = np.array([float(((y >= lo) & (y <= hi)).sum()), float((hi - lo).sum())])
    res["reliability"] = rel
    res["served_rows"] = _served_rows(part, got[MODEL], y_all, cls, demand)
    return res


def _served_rows(part: pd.DataFrame, model: tuple, y_all: np.ndarray, cls: np.ndarray,
                 demand: DemandConfig) -> pd.DataFrame:
    """What the served-interval replay needs of each test row (module docstring of
    `pipelines.demand_partitions`, step 8): the model's base band and exported band
    included."""
    _, lo, hi, (blo, bhi) = model
    n = len(part)
    return pd.DataFrame({
        L.REQUEST_ID: part[L.REQUEST_ID].to_numpy(dtype=object),
        L.SESSION_ID: part[L.SESSION_ID].to_numpy(dtype=object),
        "t": part[L.TIMESTAMP].to_numpy(dtype="float64"),
        "end": part[END_MS].to_numpy(dtype="float64", na_value=np.nan),
        "cell": cell_keys(part, demand.group_columns),
        "blo": blo, "bhi": bhi, "prompt": prompt_tokens(part),
        "cap": request_cap(part) if demand.clip_to_cap else np.full(n, np.nan),
        "y": feedback_actuals(y_all, cls), "lower_bound": np.isin(cls, LOWER_BOUND_CLASSES),
        "usable": cls == LABEL, "frozen_lo": lo, "frozen_hi": hi})


def served_replay(rows: pd.DataFrame, calibrator, demand: DemandConfig, n_boot: int,
                  out_dir) -> dict:
    """The served interval over the whole test window, replayed on the driver in dispatch
    order by the local function (`demand.served.served_band`): its `test.served` section,
    the coverage interval from the same Poisson(1) session weights as every other figure;
    writes OUT/served_test.parquet (request_id and the served interval)."""
    rows = rows.sort_values(["t", L.REQUEST_ID], kind="stable").reset_index(drop=True)
    band = served_band(rows["t"].to_numpy(), rows["end"].to_numpy(), rows["cell"].to_numpy(),
                       calibrator.corrections_, calibrator.global_correction_,
                       demand.interval, rows["blo"].to_numpy(), rows["bhi"].to_numpy(),
                       rows["prompt"].to_numpy(), rows["cap"].to_numpy(), rows["y"].to_numpy(),
                       rows["lower_bound"].to_numpy(), demand.scale, demand.served)
    write_served(rows[L.REQUEST_ID], band, demand, out_dir)
    u = rows["usable"].to_numpy(dtype=bool)
    y = rows["y"].to_numpy()
    hit = ((y >= band.lo) & (y <= band.hi))[u].astype(float)
    sums, counts, sessions = session_replicates(
        hit[:, None], rows[L.SESSION_ID].to_numpy(dtype=object)[u], n_boot, demand.seed)
    return served_section(band, y, u, rows["frozen_lo"].to_numpy(),
                          rows["frozen_hi"].to_numpy(), demand.served,
                          _ci(sums[:, 0] / counts), rows_per_day(rows["t"].to_numpy()[u]),
                          int(sessions))


def eval_sum(parts: list[dict]) -> dict:
    parts = [p for p in parts if p.get("n") is not None]
    out: dict[str, Any] = {"rows": 0, "n": 0, "sessions": 0, "groups": {}, "censored": {},
                           "reliability": {}}
    served = [p.pop("served_rows") for p in parts]
    out["served_rows"] = pd.concat(served, ignore_index=True) if served else pd.DataFrame()
    for p in parts:
        out["rows"] += p["rows"]
        out["n"] += p["n"]
        out["sessions"] += p["sessions"]
        out["keys"] = p["keys"]
        for k in ("sums", "boot", "boot_n"):
            out[k] = p[k] if k not in out else out[k] + p[k]
        for field in ("groups", "censored", "reliability"):
            for k, v in p[field].items():
                out[field][k] = v if k not in out[field] else out[field][k] + v
    return out


def groups_absent(train_groups: dict[str, set[str]], tested: dict[str, set[str]],
                  group_columns: Sequence[str]) -> dict[str, list[str]]:
    """Per group column, the values the model trained on (train label rows) that no labelled
    test row has: their coverage and pinball are not measured by this run (the report
    lists them)."""
    out = {}
    for by in group_columns:
        gone = sorted(set(train_groups.get(by, set())) - set(tested.get(by, set())))
        if gone:
            out[by] = gone
    return out


def _ci(reps: np.ndarray) -> list[float]:
    from replaylab.stats import percentile_interval

    return [float(v) for v in percentile_interval(reps, CI_LEVEL)]


def test_section(agg: dict, names: list[str], demand: DemandConfig, n_boot: int,
                  train_groups: dict, test_rows: int, served: dict) -> dict:
    """The summary's `test` section and the gate, which judges `served` (`served_replay`)."""
    qs = list(demand.quantiles)
    keys, n = agg["keys"], agg["n"]
    mean = dict(zip(keys, agg["sums"] / n, strict=True))
    reps = agg["boot"] / agg["boot_n"][:, None]  # (B, m) replicate means
    col = {k: j for j, k in enumerate(keys)}
    tests = {}
    for name in names:
        pin = {quantile_key(q): float(mean[f"{name}|pinball.{quantile_key(q)}"]) for q in qs}
        tests[name] = {
            "n": int(n), "pinball": pin, "mean_pinball": float(np.mean(list(pin.values()))),
            "coverage": float(mean[f"{name}|coverage"]),
            "mean_width": float(mean[f"{name}|mean_width"]),
            "mae_p50": float(mean[f"{name}|mae_p50"]),
            "coverage_raw": float(mean[f"{name}|coverage_raw"]),
            "mean_width_raw": float(mean[f"{name}|mean_width_raw"]),
            "ci": {k.split("|", 1)[1]: _ci(reps[:, j]) for k, j in col.items()
                   if k.startswith(f"{name}|") and not k.endswith("_raw")}}
    baselines = {k: v for k, v in tests.items() if k != MODEL}
    best = min(baselines, key=lambda k: baselines[k]["mean_pinball"])
    top = quantile_key(qs[-1])
    m_mp, b_mp = mean[f"{MODEL}|mean_pinball"], mean[f"{best}|mean_pinball"]
    delta = reps[:, col[f"{MODEL}|mean_pinball"]] - reps[:, col[f"{best}|mean_pinball"]]
    gate = demand_gate(
        demand.interval,
        {"value": served["coverage"], "ci": served["ci"], "n": int(n),
         "sessions": int(agg["sessions"]),
         "interval": SERVED if demand.served.online else "frozen",
         "frozen": tests[MODEL]["coverage"], "rows_per_day": served["rows_per_day"]},
        {"baseline": best, "model_mean_pinball": float(m_mp),
         "baseline_mean_pinball": float(b_mp), "delta": float(m_mp - b_mp),
         "ci": _ci(delta), "resampled": RESAMPLED,
         "n_boot": int(n_boot)})
    groups = []
    others = [b for b in names if b != MODEL]
    for by in demand.group_columns:
        for value in sorted(v for (b, v) in agg["groups"] if b == by):
            s = agg["groups"][(by, value)]
            k = s[0]
            pin = {quantile_key(q): float(s[1 + j] / k) for j, q in enumerate(qs)}
            base = {b: float(s[3 + len(qs) + i] / k) for i, b in enumerate(others)}
            bb = min(base, key=base.get)
            groups.append({"by": by, "value": value, "n": int(k),
                           "coverage": float(s[1 + len(qs)] / k),
                           "mean_width": float(s[2 + len(qs)] / k), "pinball": pin,
                           "mean_pinball": float(np.mean(list(pin.values()))),
                           "best_baseline": bb, "best_baseline_mean_pinball": base[bb]})
    tested = {by: {v for (b, v) in agg["groups"] if b == by} for by in demand.group_columns}
    absent = groups_absent(train_groups, tested, demand.group_columns)
    cens = agg["censored"]
    c_n = int(sum(v[0] for v in cens.values()))
    censored = {"n": c_n, "hi_at_least_observed":
                float(sum(v[1] for v in cens.values()) / c_n) if c_n else None,
                "by_reason": {r: {"n": int(v[0]), "hi_at_least_observed": float(v[1] / v[0])}
                              for r, v in sorted(cens.items())}}
    reliability = [{"nominal": float(level), "observed": float(v[0] / n),
                    "mean_width": float(v[1] / n)}
                   for level, v in sorted(agg["reliability"].items())]
    return {
        "gate": gate,
        "served": served,
        "intervals": intervals_text(n_boot),
        "rows": int(test_rows), "labelled_rows": int(n),
        "model": tests[MODEL], "baselines": baselines, "best_baseline": best,
        "model_beats": {
            "best_baseline_mean_pinball":
                tests[MODEL]["mean_pinball"] < baselines[best]["mean_pinball"],
            f"every_baseline_pinball_{top}":
                all(tests[MODEL]["pinball"][top] < b["pinball"][top]
                    for b in baselines.values())},
        "groups": groups, "groups_absent_from_test": absent, "censored": censored,
        "reliability": reliability,
    }
