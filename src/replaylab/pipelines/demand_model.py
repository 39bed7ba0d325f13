"""The demand pipeline's data and model fit: the projected, labelled rows and the quantile
model trained on them (`pipelines.demand.train_demand` calls these).

`prepare_data` projects the valid ledger rows by the one projection recipe
(`projection.project`), labels them (`demand.labels`) and checks they can train a
model; `DemandData` holds the rows, the split of each and the selections every stage
shares. `choose_censoring` fits the quantile model with the configured censoring
variant, or under `auto` every variant, choosing on the calibration split
(`demand.censoring.select_censoring`; the test figures of each are reported, never
used); `validation_pinball` is an HPO trial's score.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from replaylab.contracts import Ledger as L
from replaylab.demand.censoring import NONE, PINBALL, VARIANTS, select_censoring
from replaylab.demand.config import DemandConfig
from replaylab.demand.conformal import GroupConformal
from replaylab.demand.labels import (
    DemandDataError,
    DemandLabels,
    check_trainable,
    demand_labels,
)
from replaylab.demand.metrics import interval_metrics, lower_bound_metrics, mean_pinball
from replaylab.demand.model import QuantileDemandModel, base_band, request_cap
from replaylab.pipelines.project import LoadedLedger
from replaylab.projection import ProjectionConfig, SplitConfig, project


@dataclass
class DemandData:
    """The projected ledger, its labels and the row selections every stage shares."""

    features: pd.DataFrame
    splits: np.ndarray  # (n,) train / calibration / test / embargo
    labels: DemandLabels
    masks: dict[str, np.ndarray]  # labelled rows of train and calibration; all test rows
    fingerprint: str
    version: str
    _frames: dict[str, pd.DataFrame] = field(default_factory=dict)

    def frame(self, split: str) -> pd.DataFrame:
        if split not in self._frames:  # one copy per split
            self._frames[split] = self.features[self.masks[split]]
        return self._frames[split]

    def y(self, split: str) -> np.ndarray:
        return self.labels.y_total[self.masks[split]]


def prepare_data(loaded: LoadedLedger, projection: ProjectionConfig, split: SplitConfig,
                 demand: DemandConfig) -> DemandData:
    """Project, split and label the valid rows; DemandDataError when nothing can be trained."""
    ledger = loaded.result.valid
    if len(ledger) == 0:
        raise DemandDataError(f"{loaded.origin}: no valid ledger rows "
                              f"({loaded.result.rows_quarantined} "
                              "quarantined, see quarantine/ledger.jsonl): nothing to train on")
    projected = project(ledger, projection, split)
    features, splits = projected.features, projected.splits
    labels = demand_labels(features, ledger, demand.failed_is_censored)
    check_trainable(labels, splits, int(features[L.SESSION_ID].nunique()),
                    demand.min_train_rows, demand.min_calibration_rows)
    masks = {s: labels.usable & (splits == s) for s in ("train", "calibration")}
    masks["test"] = splits == "test"
    return DemandData(features, splits, labels, masks, projected.fingerprint, projected.version)


def censored_rows(data: DemandData, split: str, demand: DemandConfig) -> np.ndarray:
    """Rows of `split` whose observed total is a lower bound of a class training may use."""
    lab = data.labels
    return ((data.splits == split) & np.isin(lab.label_class, demand.censoring.classes)
            & np.isfinite(lab.y_total))


def fit_model(data: DemandData, demand: DemandConfig, method: str) -> QuantileDemandModel:
    """The quantile model on train: label rows, plus censored rows unless method is none."""
    model = QuantileDemandModel(demand.quantiles, demand.model, demand.scale, demand.clip_to_cap,
                                demand.seed, censoring=method,
                                censored_rounds=demand.censoring.rounds[-1])
    if method == NONE:
        return model.fit(data.frame("train"), data.y("train"))
    censored = censored_rows(data, "train", demand)
    rows = data.masks["train"] | censored
    return model.fit(data.features[rows], data.labels.y_total[rows], censored=censored[rows])


def censoring_figures(model: QuantileDemandModel, data: DemandData, demand: DemandConfig,
                       split: str, calibrator: GroupConformal) -> dict:
    """Figures of one censoring variant on `split`.

    Label rows: mean pinball, coverage, width. Censored rows: share with hi >=
    observed. Both: `consumption_mean_pinball`, the pinball against what each
    request consumed (a request cut at its cap used prompt + cap): the quantity
    admission budgets for, which the label rows alone understate.
    `halves_mean_pinball`: the label rows' mean pinball on the earlier and the
    later half of the split by dispatch time (a choice must hold in both).
    """
    lab, qs = data.labels, demand.quantiles

    def interval(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        f = data.features[rows]
        q, *band = base_band(model, f)
        return (q, *calibrator.predict_interval(
            f, *band, request_cap(f) if demand.clip_to_cap else None))

    rows = lab.usable & (data.splits == split)
    q, lo, hi = interval(rows)
    y = lab.y_total[rows]
    m = interval_metrics(y, q, lo, hi, qs)
    t = data.features.loc[rows, L.TIMESTAMP].to_numpy(dtype="int64")
    later = t > np.median(t)
    out = {"n": m["n"], "mean_pinball": m["mean_pinball"],
           "halves_mean_pinball": [mean_pinball(y[~later], q[~later], qs),
                                   mean_pinball(y[later], q[later], qs)]
           if later.any() and (~later).any() else None,
           "coverage": m["coverage"], "mean_width": m["mean_width"]}
    cens = censored_rows(data, split, demand)
    out["capped_n"] = int(cens.sum())
    out["capped_hi_ge_obs"] = out["consumption_mean_pinball"] = None
    if cens.any():
        qc, _, hic = interval(cens)
        out["capped_hi_ge_obs"] = lower_bound_metrics(
            lab.y_total[cens], hic, lab.label_class[cens])["hi_at_least_observed"]
        # what the requests consumed (a cut request used prompt + cap): all rows
        out["consumption_mean_pinball"] = mean_pinball(
            np.concatenate([y, lab.y_total[cens]]), np.vstack([q, qc]), qs)
    return out


def choose_censoring(data: DemandData, demand: DemandConfig
                      ) -> tuple[QuantileDemandModel, dict]:
    """The model to keep and the summary's `censoring` section.

    `auto` fits every variant and picks on the calibration split
    (`select_censoring`); the test figures of each are reported, never used.
    """
    cfg = demand.censoring
    n_train = int(censored_rows(data, "train", demand).sum())
    section: dict[str, Any] = {"configured": cfg.method, "classes": list(cfg.classes),
                               "train_censored_rows": n_train,
                               "calibration_censored_rows":
                                   int(censored_rows(data, "calibration", demand).sum())}
    if n_train < cfg.min_rows:
        section.update(method=NONE, candidate=NONE, reason=f"{n_train} censored train rows < "
                       f"censoring.min_rows={cfg.min_rows}: trained on the label rows alone")
        return fit_model(data, demand, NONE), section
    if cfg.method != "auto":
        section.update(method=cfg.method, candidate=cfg.method, reason="configured")
        if cfg.method == PINBALL:
            section["pinball_rounds"] = cfg.rounds[-1]
        return fit_model(data, demand, cfg.method), section
    calib = data.frame("calibration")
    models, candidates = {}, {}
    for method in VARIANTS:
        model = fit_model(data, demand, method)
        # the pinball stage's trees are appended: its first r trees are the r-round model
        for name, m in ({f"{PINBALL}@{r}": model.with_censored_rounds(r) for r in cfg.rounds}
                        if method == PINBALL else {method: model}).items():
            _, *band = base_band(m, calib)
            cq = GroupConformal(demand.interval, demand.group_columns, demand.min_group_size,
                                demand.scale).fit(calib, *band, data.y("calibration"))
            models[name] = m
            candidates[name] = {
                "calibration": censoring_figures(m, data, demand, "calibration", cq),
                "test_report_only": censoring_figures(m, data, demand, "test", cq)}
    chosen, reason = select_censoring({k: v["calibration"] for k, v in candidates.items()},
                                      cfg.min_rows, cfg.max_pinball_increase,
                                      cfg.min_capped_gain)
    model = models[chosen]
    section.update(method=model.censoring, candidate=chosen, reason=reason,
                   candidates=candidates)
    if model.censoring == PINBALL:
        section["pinball_rounds"] = model.censored_rounds_
    return model, section


def validation_pinball(data: DemandData, demand: DemandConfig, model_cfg) -> float:
    """An HPO trial: fit on train with early stopping; mean pinball on the train tail."""
    model = QuantileDemandModel(demand.quantiles, model_cfg, demand.scale, demand.clip_to_cap,
                                demand.seed).fit(data.frame("train"), data.y("train"))
    val = model.validation_pinball_
    return float(np.mean(list(val.values()))) if val else math.nan
