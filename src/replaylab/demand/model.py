"""Quantile LightGBM of total demand on the dispatch-time features.

One booster per quantile level (LightGBM's `quantile` objective). The target is
the OUTPUT tokens on the log1p scale (config `scale`): quantiles commute with a
monotone transform, so q_tau(total) = prompt + expm1(q_tau(log1p(output))) with
the prompt known at dispatch added back exactly; the log scale tames the heavy
tail (outputs span 1..10^4 tokens) so one tree depth fits short and long answers.

Outputs are made non-crossing by sorting each row's quantiles, then clipped to
the physically possible range [prompt, prompt + max_tokens] (the cap when the
request set one and `clip_to_cap`). Early stopping uses a time-ordered,
session-grouped tail of TRAIN (never the calibration split, which must stay
unseen for the conformal guarantee); with `refit_full_train` the booster is then
refit on all of train with the best number of rounds. Under compute=dask the
pipeline trains the same boosters on the cluster's partitions (`compute.lgbm`,
lightgbm.dask) and sets this model's fitted state; the fitted boosters are local
either way.

Rows whose total is only a lower bound (`censored` in `fit`) enter as the
`censoring` variant says (`replaylab.demand.censoring`): dropped, taken as
labels, or boosted further with the censored pinball loss (local, after the
native stage, which trains on the label rows alone).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import asdict

import lightgbm as lgb
import numpy as np
import pandas as pd
from sklearn.metrics import mean_pinball_loss

from replaylab.contracts.columns import KEY_COLUMNS
from replaylab.contracts.columns import Ledger as L
from replaylab.demand.censoring import NONE, PINBALL, REALIZED, VARIANTS, censored_pinball_objective
from replaylab.demand.config import QuantileModelConfig
from replaylab.demand.inputs import check_quantiles, output_labels, prompt_tokens
from replaylab.demand.state import RunStateError, StateReader, StateWriter
from replaylab.projection import SplitConfig, feature_columns, time_ordered_splits
from replaylab.runtime.demand_math import forward, raw_to_total, total_and_band

_NON_FEATURES = ("split",)  # columns a pipeline may add to a projection frame
# fitted attributes of QuantileDemandModel saved as JSON by `write_state` (boosters_ and
# config_ apart); the optional ones exist only after a censored pinball stage
_FITTED = ("censored_rows_", "base_band_", "feature_names_", "categories_", "validation_rows_",
           "best_iterations_", "compute_", "n_features_in_", "validation_pinball_")
_FITTED_OPTIONAL = ("native_iterations_", "censored_rounds_")

MODEL = "model"  # the quantile model's name among a run's predictors (beside the baselines')


def model_feature_names(features: pd.DataFrame) -> list[str]:
    """The columns of a projection frame the model reads (a pipeline's `split` and any
    `label_*` column excluded)."""
    return [c for c in feature_columns(features)
            if c not in _NON_FEATURES and c not in KEY_COLUMNS]


def is_categorical_feature(s: pd.Series) -> bool:
    """Whether the model treats a feature column as categorical (vocabulary fixed on train)."""
    return bool(s.dtype == object or isinstance(s.dtype, pd.CategoricalDtype)
                or pd.api.types.is_string_dtype(s.dtype))


def request_cap(features: pd.DataFrame) -> np.ndarray:
    """max_tokens as float64 (n,), NaN where the request set none."""
    return features[L.MAX_TOKENS].to_numpy(dtype="float64", na_value=np.nan)


def base_band(predictor: object, features: pd.DataFrame
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(quantiles (n, q), base band lo, hi) of any demand predictor, for conformal calibration.

    The model's band is taken before its cap clip (`predict_with_band`); a
    baseline's (which does not clip), or a model fitted before the band moved
    (no `base_band_`), is its lowest and highest quantile.
    """
    if getattr(predictor, "base_band_", None) == "unclipped":
        return predictor.predict_with_band(features)  # type: ignore[attr-defined]
    q = predictor.predict_quantiles(features)  # type: ignore[attr-defined]
    return q, q[:, 0], q[:, -1]


class QuantileDemandModel:
    """Quantile LightGBM of total demand; sklearn-style (`fit` -> self, state ends in `_`).

    quantiles: ascending levels; config: LightGBM hyperparameters; scale: "log1p"
    or "linear" (see the module docstring); clip_to_cap: clip to prompt + max_tokens;
    censoring: none | realized | pinball, how `fit`'s censored rows enter;
    censored_rounds: boosting rounds of the pinball stage (`with_censored_rounds`
    serves fewer of them).
    `features` is a projection frame: its feature columns (`feature_columns`)
    are the inputs; session_id and timestamp cut the early-stopping tail.
    """

    name = "model"

    def __init__(self, quantiles: Sequence[float] = (0.1, 0.5, 0.9),
                 config: QuantileModelConfig | None = None, scale: str = "log1p",
                 clip_to_cap: bool = True, seed: int = 0, censoring: str = NONE,
                 censored_rounds: int = 100) -> None:
        self.quantiles = quantiles
        self.config = config
        self.scale = scale
        self.clip_to_cap = clip_to_cap
        self.seed = seed
        self.censoring = censoring
        self.censored_rounds = censored_rounds

    # ------------------------------------------------------------------ design matrix
    def design(self, features: pd.DataFrame) -> pd.DataFrame:
        """The design matrix the boosters read: an (n, f) float / categorical frame in
        `feature_names_` order, an unseen category NaN (public: a distributed caller builds
        it per partition); `feature_names_` and `categories_` must be set (fit, or by the
        caller)."""
        cols = {}
        for c in self.feature_names_:
            s = features[c] if c in features.columns else pd.Series(np.nan, index=features.index)
            if c in self.categories_:
                if pd.api.types.infer_dtype(s, skipna=True) not in ("string", "empty"):
                    s = s.map(lambda v: v if pd.isna(v) else str(v))
                cols[c] = pd.Categorical(s, categories=self.categories_[c])
            else:
                cols[c] = s.to_numpy(dtype="float64", na_value=np.nan)
        return pd.DataFrame(cols, index=features.index)

    def lightgbm_categorical(self) -> list[str]:
        """The features LightGBM bins as categorical (its `categorical_feature`): those with
        at least one category on train. A categorical feature with none (an optional
        ledger-v1 column the ledger lacks: decision, slo_class, region; every value missing)
        enters as a numeric all-missing column: LightGBM finds it trivial and never splits
        on it, as it would a categorical one, so the trees are the same; the design matrix
        keeps its pandas categorical dtype, so `pandas_categorical` and `categories_` stay
        aligned for the export.

        Why: LightGBM's distributed Dataset construction (lightgbm.dask, num_machines > 1)
        segfaults on a categorical feature with no non-missing value in the bin-finding
        sample of the rank that bins it. Each rank finds the bin mappers of its block of
        features and serialises them for an Allgather (`DatasetLoader::ConstructFromSample
        Data` -> `BinMapper::CopyTo`), which copies `num_bin_` ints from
        `bin_2_categorical_.data()`; with no category that vector is empty, its data() is
        NULL, and the memcpy reads address 0 (SIGSEGV). The single-machine path never
        serialises bin mappers, which is why the local run and a one-partition Dask run
        passed. Proved on the tiled Azure conversation ledger (issue 41): a worker core dump
        under gdb stops in `__memcpy_avx512_unaligned_erms` (rsi = 0) called from
        `LightGBM::DatasetLoader::ConstructFromSampleData` <- `LGBM_DatasetCreateFromMat`;
        lightgbm.dask alone on the two dumped training pieces crashes with the all-missing
        categorical columns and trains with them dropped, or with the same column given as
        numeric; a categorical with values on every rank trains. A categorical that has
        categories but none on one rank's partitions is `compute.lgbm.fit_layout`'s to guard.
        """
        return [c for c in self.feature_names_ if self.categories_.get(c)]

    def _learn_vocabulary(self, features: pd.DataFrame) -> None:
        names = model_feature_names(features)
        self.feature_names_ = names
        self.categories_: dict[str, list[str]] = {}
        for c in names:
            s = features[c]
            if is_categorical_feature(s):
                # vocabulary fixed on train; a value unseen there is NaN at predict time
                self.categories_[c] = sorted({str(v) for v in s.dropna().unique()})

    # ------------------------------------------------------------------ fit
    def _tail_mask(self, features: pd.DataFrame) -> np.ndarray:
        """Rows of the early-stopping tail: the latest sessions, ~fraction of train rows."""
        cfg = self.config_
        frac = float(cfg.early_stopping_fraction)
        if cfg.early_stopping_rounds == 0 or frac == 0.0:
            return np.zeros(len(features), dtype=bool)
        if L.SESSION_ID in features.columns and L.TIMESTAMP in features.columns:
            cut = SplitConfig(train=1.0 - frac, calibration=frac, test=0.0, embargo_ms=0)
            tail = time_ordered_splits(features, cut).to_numpy() == "calibration"
        else:  # no keys: the last rows in the given order
            tail = np.arange(len(features)) >= int(round((1.0 - frac) * len(features)))
        # too small a head or tail to learn or to stop on: no early stopping
        if tail.sum() < 20 or (~tail).sum() < 20:
            return np.zeros(len(features), dtype=bool)
        return tail

    def fit(self, features: pd.DataFrame, y: np.ndarray,
            callbacks: Sequence[Callable] = (), *,
            censored: np.ndarray | None = None) -> QuantileDemandModel:
        """Fit one booster per quantile: features (n, *), y total (n,).

        censored: bool (n,), True where y is only a lower bound (the observed
        total of a request cut at its cap); None: every row is a label. Used per
        `censoring`: none drops them, realized fits them as labels, pinball fits
        the label rows natively, then all rows with the censored pinball loss.
        callbacks: extra LightGBM callbacks for the early-stopped fits (e.g. pruning).
        Trains here (the partitioned pipeline trains on a Dask cluster with
        `compute.lgbm.fit_boosters` and sets the same fitted state).
        """
        qs = check_quantiles(self.quantiles)
        if self.scale not in ("log1p", "linear"):
            raise ValueError(f"scale={self.scale!r}: must be log1p or linear")
        if self.censoring not in VARIANTS:
            raise ValueError(f"censoring={self.censoring!r}: must be one of {', '.join(VARIANTS)}")
        self.config_ = self.config or QuantileModelConfig()
        y = np.asarray(y, dtype="float64")
        cens = (np.zeros(len(y), dtype=bool) if censored is None
                else np.asarray(censored, dtype=bool))
        if cens.shape != y.shape:
            raise ValueError(f"censored has shape {cens.shape}, y {y.shape}")
        self.censored_rows_ = int(cens.sum()) if self.censoring != NONE else 0
        self.base_band_ = "unclipped"  # what `predict_with_band` returns (demand_math)
        all_features, all_y = features, y
        if self.censoring != REALIZED and cens.any():  # native stage: label rows alone
            features, y = features[~cens], y[~cens]
        target = forward(output_labels(features, y), self.scale)
        self._learn_vocabulary(features)
        X = self.design(features)
        tail = self._tail_mask(features)
        self.validation_rows_ = int(tail.sum())
        self.boosters_, self.best_iterations_, tail_raw = self._fit_local(X, target, tail, qs,
                                                                          callbacks)
        self.compute_ = "local"
        self.n_features_in_ = len(self.feature_names_)
        self.validation_pinball_ = (
            self._pinball(features[tail], y[tail], np.column_stack(tail_raw))
            if tail.any() else None)
        if self.censoring == PINBALL and cens.any():
            self._boost_censored(all_features, all_y, cens, qs)
        return self

    def _boost_censored(self, features: pd.DataFrame, y: np.ndarray, censored: np.ndarray,
                        qs: Sequence[float]) -> None:
        """Add `censored_rounds` trees per booster with the censored pinball loss, all rows."""
        cfg = self.config_
        X = self.design(features)
        target = forward(output_labels(features, y), self.scale)
        data = lgb.Dataset(X, target, free_raw_data=False,
                           params={"max_bin": int(cfg.max_bin), "verbosity": -1},
                           categorical_feature=self.lightgbm_categorical())
        boosters, rounds = [], []
        for booster, k, q in zip(self.boosters_, self.best_iterations_, qs, strict=True):
            # only the trees predict uses (an early-stopped booster holds more)
            native = lgb.Booster(model_str=booster.model_to_string(num_iteration=k))
            params = {**cfg.lightgbm_params(q, self.seed), "metric": "None",
                      "objective": censored_pinball_objective(q, censored)}
            params.pop("alpha")
            boosters.append(lgb.train(params, data, num_boost_round=int(self.censored_rounds),
                                      init_model=native))
            rounds.append(int(k) + int(self.censored_rounds))
        self.native_iterations_ = list(self.best_iterations_)
        self.boosters_, self.best_iterations_ = boosters, rounds
        self.censored_rounds_ = int(self.censored_rounds)

    def with_censored_rounds(self, rounds: int) -> QuantileDemandModel:
        """This pinball-fitted model using only the first `rounds` censored trees per booster.

        A shallow copy (the boosters are shared); predict and the export use
        `best_iterations_` trees, so the copy is the `rounds`-round model exactly.
        """
        if getattr(self, "censored_rounds_", None) is None:
            raise ValueError("with_censored_rounds: the model has no censored pinball stage")
        if not 0 <= int(rounds) <= int(self.censored_rounds):
            raise ValueError(f"with_censored_rounds: rounds={rounds} outside "
                             f"0..{self.censored_rounds} (the rounds trained)")
        out = copy.copy(self)
        out.best_iterations_ = [k + int(rounds) for k in self.native_iterations_]
        out.censored_rounds_ = int(rounds)
        return out

    def _fit_local(self, X: pd.DataFrame, target: np.ndarray, tail: np.ndarray,
                   qs: Sequence[float], callbacks: Sequence[Callable],
                   ) -> tuple[list[lgb.Booster], list[int], list[np.ndarray]]:
        """(boosters, best round counts, early-stopped raw predictions on the tail per level)."""
        cfg = self.config_
        data_params = {"max_bin": int(cfg.max_bin), "verbosity": -1}
        cats = self.lightgbm_categorical()
        full_set = lgb.Dataset(X, target, free_raw_data=False, params=data_params,
                               categorical_feature=cats)
        if tail.any():
            head_set = lgb.Dataset(X[~tail], target[~tail], free_raw_data=False,
                                   params=data_params, categorical_feature=cats)
            tail_set = lgb.Dataset(X[tail], target[tail], reference=head_set, params=data_params,
                                   categorical_feature=cats)
        boosters: list[lgb.Booster] = []
        best_iterations: list[int] = []
        tail_raw = []  # early-stopped predictions on the tail, model scale, per level
        for q in qs:
            params = cfg.lightgbm_params(q, self.seed)
            rounds = int(cfg.n_estimators)
            if tail.any():
                stop = lgb.early_stopping(int(cfg.early_stopping_rounds), verbose=False)
                booster = lgb.train(params, head_set, num_boost_round=rounds,
                                    valid_sets=[tail_set], callbacks=[stop, *callbacks])
                rounds = max(int(booster.best_iteration or rounds), 1)
                tail_raw.append(booster.predict(X[tail], num_iteration=rounds))
                if cfg.refit_full_train:
                    booster = lgb.train(params, full_set, num_boost_round=rounds)
            else:
                booster = lgb.train(params, full_set, num_boost_round=rounds)
            boosters.append(booster)
            best_iterations.append(rounds)
        return boosters, best_iterations, tail_raw

    def _pinball(self, features: pd.DataFrame, y: np.ndarray, raw: np.ndarray) -> dict[str, float]:
        """Pinball loss of total tokens per level, from raw (model-scale) predictions.

        On the early-stopping tail, from the boosters fitted on the head only: an
        honest validation figure (an HPO objective), even when the final boosters
        are refit on all of train.
        """
        pred = self.to_total(features, raw)
        return {f"{q:g}": float(mean_pinball_loss(y, pred[:, j], alpha=q))
                for j, q in enumerate(np.asarray(self.quantiles, dtype=float))}

    # ------------------------------------------------------------------ predict
    def predict_quantiles(self, features: pd.DataFrame) -> np.ndarray:
        """Total-demand quantiles (n, q): non-crossing, within [prompt, prompt + cap]."""
        return self.to_total(features, self._raw(features))

    def predict_with_band(self, features: pd.DataFrame
                          ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(quantiles (n, q) as `predict_quantiles`, base band lo (n,), hi (n,)).

        The base band conformal calibration widens: the lowest and highest
        quantile before the cap clip (`demand_math.total_and_band`); the
        calibrated interval is clipped after the correction.
        """
        cap = request_cap(features) if self.clip_to_cap else None
        return total_and_band(self._raw(features), prompt_tokens(features), cap, self.scale,
                              clipped_band=False)

    def _raw(self, features: pd.DataFrame) -> np.ndarray:
        X = self.design(features)
        return np.column_stack([b.predict(X, num_iteration=k)
                                for b, k in zip(self.boosters_, self.best_iterations_, strict=True)])

    def to_total(self, features: pd.DataFrame, raw: np.ndarray) -> np.ndarray:
        """Raw booster scores (n, q) -> total-token quantiles as `predict_quantiles` gives
        them (non-crossing, clipped to the request's cap when `clip_to_cap`)."""
        return raw_to_total(raw, prompt_tokens(features),
                            request_cap(features) if self.clip_to_cap else None, self.scale)

    # ------------------------------------------------------------------ state
    def write_state(self, writer: StateWriter) -> None:
        """Save the fitted model as plain files: `model.json` and one LightGBM text model per
        quantile (`booster-<j>.txt`, every tree; predict uses `best_iterations_` of them)."""
        if not hasattr(self, "boosters_"):
            raise RunStateError("QuantileDemandModel.write_state: the model is not fitted")
        fitted = {k: getattr(self, k) for k in _FITTED}
        fitted.update({k: getattr(self, k) for k in _FITTED_OPTIONAL if hasattr(self, k)})
        boosters = []
        for j, booster in enumerate(self.boosters_):
            name = f"booster-{j}.txt"
            writer.put_text(name, booster.model_to_string(num_iteration=-1))
            boosters.append({"file": name, "best_iteration": int(booster.best_iteration)})
        writer.put_json("model.json", {
            "params": {"quantiles": [float(q) for q in self.quantiles],
                       "config": None if self.config is None else asdict(self.config),
                       "scale": self.scale, "clip_to_cap": bool(self.clip_to_cap),
                       "seed": int(self.seed), "censoring": self.censoring,
                       "censored_rounds": int(self.censored_rounds)},
            "config_": asdict(self.config_), "fitted": fitted, "boosters": boosters})

    @classmethod
    def read_state(cls, reader: StateReader) -> QuantileDemandModel:
        """The model `write_state` saved (its reader's files verified by the caller)."""
        doc = reader.get_json("model.json")
        p = doc["params"]
        model = cls(tuple(p["quantiles"]),
                    None if p["config"] is None else QuantileModelConfig(**p["config"]),
                    p["scale"], p["clip_to_cap"], p["seed"], p["censoring"], p["censored_rounds"])
        model.config_ = QuantileModelConfig(**doc["config_"])
        unknown = set(doc["fitted"]) - set(_FITTED) - set(_FITTED_OPTIONAL)
        if unknown or not set(_FITTED) <= set(doc["fitted"]):
            raise RunStateError(f"{reader.where}: model.json fitted attributes "
                                f"{sorted(doc['fitted'])} are not a QuantileDemandModel's")
        for k, v in doc["fitted"].items():
            setattr(model, k, v)
        model.boosters_ = []
        for entry in doc["boosters"]:
            booster = lgb.Booster(model_str=reader.get_text(entry["file"]))
            booster.best_iteration = int(entry["best_iteration"])
            model.boosters_.append(booster)
        if len(model.boosters_) != len(model.quantiles):
            raise RunStateError(f"{reader.where}: {len(model.boosters_)} boosters for "
                                f"{len(model.quantiles)} quantiles")
        return model

    def feature_importance(self) -> dict[str, float]:
        """Gain importance per feature, summed over the quantile boosters."""
        gain = np.sum([b.feature_importance("gain") for b in self.boosters_], axis=0)
        return {n: float(g) for n, g in zip(self.feature_names_, gain, strict=True)}
