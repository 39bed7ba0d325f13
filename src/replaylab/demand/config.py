"""Typed configs of the demand pipeline: target handling, baselines, model, calibration.

Frozen dataclasses (YAML carries the values, conf/demand/default.yaml). A bad value
fails at construction with a message naming the field and the value; `from_mapping`
turns it into a ConfigError at the entry point.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field

from replaylab.config import fail_field as _fail
from replaylab.config import from_mapping
from replaylab.runtime.online import OnlineConfig

SCALES = ("log1p", "linear")
CENSORING_METHODS = ("auto", "none", "realized", "pinball")
CENSORED_CLASSES = ("length", "cancelled", "failed")  # labels.LOWER_BOUND_CLASSES


def _names(cls: str, name: str, value: object) -> tuple[str, ...]:
    if isinstance(value, str) or not all(isinstance(c, str) for c in value):  # type: ignore[union-attr]
        _fail(cls, name, value, "must be a sequence of column names")
    return tuple(value)  # type: ignore[arg-type]


@dataclass(frozen=True)
class QuantileModelConfig:
    """LightGBM hyperparameters of the quantile model (one booster per quantile).

    n_estimators: most boosting rounds; early stopping picks fewer.
    early_stopping_rounds: rounds without improvement of the pinball loss on the
        time-ordered tail of train before stopping; 0 disables early stopping.
    early_stopping_fraction: share of train ROWS, latest sessions first (the same
        session-grouped, time-ordered cut as the splits), held out for early stopping.
    refit_full_train: after early stopping, refit on all of train with the best
        number of rounds (the tail is the most recent data; twice the training time).
    num_threads: LightGBM threads (the shared machine has 2 cores).
    """

    n_estimators: int = 500
    learning_rate: float = 0.05
    num_leaves: int = 15
    min_child_samples: int = 50
    feature_fraction: float = 0.9
    bagging_fraction: float = 1.0
    bagging_freq: int = 0
    lambda_l2: float = 1.0
    max_bin: int = 255
    early_stopping_rounds: int = 50
    early_stopping_fraction: float = 0.15
    refit_full_train: bool = True
    num_threads: int = 2

    def __post_init__(self) -> None:
        name = type(self).__name__
        for f in ("n_estimators", "num_leaves", "num_threads", "max_bin"):
            v = getattr(self, f)
            if isinstance(v, bool) or int(v) != v or v < 1:
                _fail(name, f, v, "must be an integer >= 1")
        for f in ("min_child_samples", "bagging_freq", "early_stopping_rounds"):
            v = getattr(self, f)
            if isinstance(v, bool) or int(v) != v or v < 0:
                _fail(name, f, v, "must be an integer >= 0")
        if self.num_leaves < 2:
            _fail(name, "num_leaves", self.num_leaves, "must be >= 2")
        if not 0.0 < float(self.learning_rate) <= 1.0:
            _fail(name, "learning_rate", self.learning_rate, "must be in (0, 1]")
        for f in ("feature_fraction", "bagging_fraction"):
            if not 0.0 < float(getattr(self, f)) <= 1.0:
                _fail(name, f, getattr(self, f), "must be in (0, 1]")
        if float(self.lambda_l2) < 0:
            _fail(name, "lambda_l2", self.lambda_l2, "must be >= 0")
        if not 0.0 <= float(self.early_stopping_fraction) < 0.5:
            _fail(name, "early_stopping_fraction", self.early_stopping_fraction,
                  "must be in [0, 0.5)")
        if not isinstance(self.refit_full_train, bool):
            _fail(name, "refit_full_train", self.refit_full_train, "must be a bool")

    def lightgbm_params(self, quantile: float, seed: int) -> dict:
        """LightGBM native parameters for the booster of one quantile."""
        return {
            "objective": "quantile", "alpha": float(quantile), "metric": "quantile",
            "learning_rate": float(self.learning_rate), "num_leaves": int(self.num_leaves),
            "min_data_in_leaf": int(self.min_child_samples),
            "feature_fraction": float(self.feature_fraction),
            "bagging_fraction": float(self.bagging_fraction),
            "bagging_freq": int(self.bagging_freq), "lambda_l2": float(self.lambda_l2),
            "num_threads": int(self.num_threads), "seed": int(seed), "deterministic": True,
            "force_col_wise": True, "verbosity": -1,
        }


@dataclass(frozen=True)
class CensoringConfig:
    """How rows whose observed total is only a lower bound enter training.

    method: "none": dropped (the label rows alone; biased low near the cap);
        "realized": the observed total taken as the label (a hint cannot exceed
        prompt + cap anyway, `clip_to_cap`); "pinball": a censored pinball loss,
        under-prediction of the bound penalised and over-prediction free,
        boosted for the largest of `rounds` more rounds from the native model;
        "auto" (default): each variant is fitted (pinball judged at every count of
        `rounds`: the trees are appended, so the first r of them are the r-round
        model) and the one chosen on the CALIBRATION split
        (`replaylab.demand.censoring.select_censoring`), "none" unless another
        raises the capped rows' hi >= observed by at least `min_capped_gain`
        (absolute share) without raising the uncensored mean pinball more than
        `max_pinball_increase` (relative).
    classes: lower-bound classes used (docs/design/demand-target.md); a cancellation
        says little about the demand the user wanted, so only `length` by default.
    rounds: boosting round counts of the censored-pinball stage, ascending (learning
        rate of `model`); more rounds move the quantiles further toward the bounds.
    min_rows: censored train rows needed to fit a variant, and censored
        calibration rows needed for "auto" to judge one; fewer: "none", said why.
    """

    method: str = "auto"
    classes: tuple[str, ...] = ("length",)
    rounds: tuple[int, ...] = (10, 30, 100)
    min_rows: int = 20
    max_pinball_increase: float = 0.01
    min_capped_gain: float = 0.05

    def __post_init__(self) -> None:
        name = type(self).__name__
        if self.method not in CENSORING_METHODS:
            _fail(name, "method", self.method, f"must be one of {', '.join(CENSORING_METHODS)}")
        classes = _names(name, "classes", self.classes)
        if not classes or any(c not in CENSORED_CLASSES for c in classes):
            _fail(name, "classes", self.classes,
                  f"must be a non-empty subset of {', '.join(CENSORED_CLASSES)}")
        object.__setattr__(self, "classes", classes)
        v = self.min_rows
        if isinstance(v, bool) or int(v) != v or v < 1:
            _fail(name, "min_rows", v, "must be an integer >= 1")
        try:
            rounds = tuple(int(r) for r in self.rounds)  # type: ignore[union-attr]
        except (TypeError, ValueError):
            rounds = ()
        if (not rounds or any(r < 1 for r in rounds) or list(rounds) != sorted(set(rounds))
                or any(isinstance(r, bool) or int(r) != r for r in self.rounds)):
            _fail(name, "rounds", self.rounds, "must be ascending distinct integers >= 1")
        object.__setattr__(self, "rounds", rounds)
        for f in ("max_pinball_increase", "min_capped_gain"):
            if not 0.0 <= float(getattr(self, f)) < 1.0:
                _fail(name, f, getattr(self, f), "must be in [0, 1)")


_SERVED = OnlineConfig()  # what DemandPredictor.load serves with unless told otherwise


@dataclass(frozen=True)
class ServedConfig:
    """The interval serving will serve, which the gate judges (`replaylab.demand.served`).

    online: True (default): the runtime's online recalibration
        (`replaylab.runtime.online.OnlineConformal`, on by default in
        `DemandPredictor.load`) replayed over the test window in dispatch order, each
        actual fed back once its request has ended; False: the exported (frozen)
        correction, served as is (`DemandPredictor.load(online=False)`).
    step, max_narrowing, max_widening, window, band: the runtime's `OnlineConfig`
        (defaults read from it): what serving runs with unless it is told otherwise.
    modeled_ttft_ms, modeled_ms_per_token: a row whose ledger has neither `ended_at`
        nor `duration_ms` ends at dispatch + ttft + ms per output token (MODELED, as
        `hints.replay.ModeledLatency`); counted in the summary.
    """

    online: bool = _SERVED.enabled
    step: float = _SERVED.step
    max_narrowing: float = _SERVED.max_narrowing
    max_widening: float = _SERVED.max_widening
    window: int = _SERVED.window
    band: float = _SERVED.band
    modeled_ttft_ms: float = 1000.0
    modeled_ms_per_token: float = 40.0

    def __post_init__(self) -> None:
        name = type(self).__name__
        if not isinstance(self.online, bool):
            _fail(name, "online", self.online, "must be a bool")
        for f in ("modeled_ttft_ms", "modeled_ms_per_token"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int | float) or not v >= 0:
                _fail(name, f, v, "must be a number >= 0")
        try:
            self.online_config()
        except ValueError as exc:  # the runtime's own check, naming the field here
            raise ValueError(str(exc).replace("OnlineConfig.", f"{name}.", 1)) from None

    def online_config(self) -> OnlineConfig:
        """The runtime's `OnlineConfig` these settings give (enabled = `online`)."""
        return OnlineConfig(enabled=self.online, step=self.step,
                            max_narrowing=self.max_narrowing, max_widening=self.max_widening,
                            window=self.window, band=self.band)


@dataclass(frozen=True)
class DemandConfig:
    """What the demand pipeline predicts, how it is calibrated and evaluated.

    quantiles: predicted quantile levels, ascending, must hold 0.5 (the point
        estimate) and one level on each side of it; the lowest and highest form the
        base band that conformal calibration widens or narrows to `interval`.
    interval: nominal coverage of the calibrated interval [lo, hi] (0.8 -> `lo-80`).
    reliability_levels: nominal levels at which the model's band is recalibrated
        to report observed test coverage (reliability diagram).
    scale: "log1p" (default): the model fits log1p(output tokens) and the conformal
        score is measured on that scale (a multiplicative correction); "linear":
        raw tokens (an additive correction). Total = prompt + output either way.
    default_max_tokens: the cap assumed by the `max_tokens_cap` baseline when a
        request has none; null: learned on train (the largest cap seen, else the
        largest output).
    clip_to_cap: a request cannot generate more than its `max_tokens`: the model's
        quantiles and every calibrated interval are clipped to prompt + max_tokens
        when the cap is known (never changes the coverage of an uncensored row).
    failed_is_censored: a failed request's output (an upstream error or a deadline
        cut it) is a lower bound like a cancellation, not a label.
    bucket_columns: the `category_bucket` baseline's bucket (finest first); a bucket
        with fewer than `min_bucket_size` train rows falls back to its prefix, then global.
    group_columns: conformal groups: the COMBINATION of these columns is one
        Mondrian cell; a cell with fewer than `min_group_size` calibration rows
        uses the global correction. Empty: one global correction.
    min_train_rows, min_calibration_rows: usable labels needed in those splits, else
        a DemandDataError says why nothing was trained.
    censoring: how lower-bound rows enter training (`CensoringConfig`).
    served: the interval serving will serve and the gate judges (`ServedConfig`).
    """

    quantiles: tuple[float, ...] = (0.1, 0.5, 0.9)
    interval: float = 0.8
    reliability_levels: tuple[float, ...] = (0.5, 0.6, 0.7, 0.8, 0.9, 0.95)
    scale: str = "log1p"
    default_max_tokens: int | None = 4096
    clip_to_cap: bool = True
    failed_is_censored: bool = True
    bucket_columns: tuple[str, ...] = ("category", "decision")
    min_bucket_size: int = 30
    group_columns: tuple[str, ...] = ("selected_model", "category", "slo_class")
    min_group_size: int = 200
    min_train_rows: int = 50
    min_calibration_rows: int = 30
    seed: int = 0
    model: QuantileModelConfig = field(default_factory=QuantileModelConfig)
    censoring: CensoringConfig = field(default_factory=CensoringConfig)
    served: ServedConfig = field(default_factory=ServedConfig)

    def __post_init__(self) -> None:
        name = type(self).__name__
        for f, kind in (("model", QuantileModelConfig), ("censoring", CensoringConfig),
                        ("served", ServedConfig)):
            value = getattr(self, f)
            if isinstance(value, Mapping):  # YAML / Hydra give a mapping
                object.__setattr__(self, f, from_mapping(kind, dict(value), f"demand.{f}"))
            elif not isinstance(value, kind):
                _fail(name, f, value, f"must be a {kind.__name__} or a mapping")
        qs = tuple(float(q) for q in self.quantiles)
        if (not qs or any(not 0.0 < q < 1.0 for q in qs) or list(qs) != sorted(set(qs))
                or 0.5 not in qs or qs[0] >= 0.5 or qs[-1] <= 0.5):
            _fail(name, "quantiles", self.quantiles, "must be ascending distinct levels in "
                  "(0, 1) holding 0.5 and at least one level on each side of it")
        object.__setattr__(self, "quantiles", qs)
        if not 0.0 < float(self.interval) < 1.0:
            _fail(name, "interval", self.interval, "must be in (0, 1)")
        levels = tuple(float(x) for x in self.reliability_levels)
        if any(not 0.0 < x < 1.0 for x in levels):
            _fail(name, "reliability_levels", self.reliability_levels, "must be in (0, 1)")
        object.__setattr__(self, "reliability_levels", levels)
        if self.scale not in SCALES:
            _fail(name, "scale", self.scale, f"must be one of {', '.join(SCALES)}")
        cap = self.default_max_tokens
        if cap is not None and (isinstance(cap, bool) or int(cap) != cap or cap < 1):
            _fail(name, "default_max_tokens", cap, "must be an integer >= 1 or null")
        for f in ("clip_to_cap", "failed_is_censored"):
            if not isinstance(getattr(self, f), bool):
                _fail(name, f, getattr(self, f), "must be a bool")
        object.__setattr__(self, "bucket_columns",
                           _names(name, "bucket_columns", self.bucket_columns))
        object.__setattr__(self, "group_columns",
                           _names(name, "group_columns", self.group_columns))
        for f in ("min_bucket_size", "min_group_size", "min_train_rows", "min_calibration_rows"):
            v = getattr(self, f)
            if isinstance(v, bool) or int(v) != v or v < 1:
                _fail(name, f, v, "must be an integer >= 1")

    @property
    def median_index(self) -> int:
        """Column of the 0.5 quantile in a (n, len(quantiles)) prediction."""
        return self.quantiles.index(0.5)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)
