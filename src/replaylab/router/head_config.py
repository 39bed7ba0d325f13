"""The head's hyperparameters (`router.head`) and the candidates chosen among on
calibration (`router.head_select`, conf/router/), apart from the estimator and its selection.

Why its own module: composing a config (apps/schemas.py, `python -m training --cfg job`)
builds the schema from these dataclasses, and `router/head.py` imports torch (~1.2 s) at
import; the config needs nothing heavier than numpy, so they live here and `head.py`
and `head_select.py` import them (issue 44, item 4: composing a config imports neither torch nor lightgbm).
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Any

import numpy as np

from replaylab.config import fail_field as _fail

CALIBRATIONS = ("platt", "isotonic", "none")
SEARCHES = ("coordinate", "grid")  # HeadSelectConfig.search


@dataclass(frozen=True)
class HeadConfig:
    """Hyperparameters of `SuccessHead` (YAML: conf/router/, key `head`).

    hidden: widths of the two ReLU layers. category_dim: width of the learned
    category embedding. min_category_count: rarer categories map to `other`.
    max_weight: clip of the row weights (null: none). val_share: validation slice
    (of prompts) for early stopping; patience: epochs without improvement.
    cost_loss_weight: lambda of the cost term. calibration: method of `calibrate`.
    teachers: 1 fits the head on the rows; M > 1 fits M heads (seeds `member_seed`)
    on the rows and then the served head on their mean logit for every seen prompt and
    candidate (distillation: the module docstring, "Distillation").
    """

    hidden: tuple[int, ...] = (256, 128)
    category_dim: int = 16
    min_category_count: int = 5
    category_dropout: float = 0.05
    dropout: float = 0.1
    learning_rate: float = 1e-3
    weight_decay: float = 1e-5
    batch_size: int = 256
    max_epochs: int = 100
    patience: int = 8
    val_share: float = 0.15
    max_weight: float | None = 20.0
    cost_loss_weight: float = 0.5
    calibration: str = "platt"
    num_threads: int = 1
    wide: bool = True
    prior_strength: float = 5.0
    teachers: int = 1

    def __post_init__(self) -> None:
        name = type(self).__name__
        hidden = tuple(self.hidden) if not isinstance(self.hidden, str) else ()
        if not hidden or not all(_is_int(h) and h >= 1 for h in hidden):
            _fail(name, "hidden", self.hidden, "must be a non-empty list of integers >= 1")
        object.__setattr__(self, "hidden", tuple(int(h) for h in hidden))
        for f in ("category_dim", "min_category_count", "batch_size", "max_epochs", "patience",
                  "num_threads", "teachers"):
            if not _is_int(getattr(self, f)) or getattr(self, f) < 1:
                _fail(name, f, getattr(self, f), "must be an integer >= 1")
        ranges = {"dropout": (0.0, 1.0), "category_dropout": (0.0, 1.0), "val_share": (1e-9, 0.5),
                  "learning_rate": (1e-12, np.inf), "weight_decay": (0.0, np.inf),
                  "cost_loss_weight": (0.0, np.inf)}
        for f, (lo, hi) in ranges.items():
            if not lo <= float(getattr(self, f)) < hi:
                _fail(name, f, getattr(self, f), f"must be in [{lo:g}, {hi:g})")
        if self.max_weight is not None and not float(self.max_weight) >= 1.0:
            _fail(name, "max_weight", self.max_weight, "must be >= 1 or null")
        if self.calibration not in CALIBRATIONS:
            _fail(name, "calibration", self.calibration, f"must be one of {CALIBRATIONS}")
        if not isinstance(self.wide, bool):
            _fail(name, "wide", self.wide, "must be a bool")
        if not float(self.prior_strength) >= 0.0:
            _fail(name, "prior_strength", self.prior_strength, "must be >= 0")


def _is_int(v: object) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


@dataclass(frozen=True)
class HeadSelectConfig:
    """Which head hyperparameters are chosen on calibration (YAML: conf/router/ `head_select`).

    enabled: choose (true) or fit the configured `head` only (false, the library default;
    the shipped YAML turns it on). max_weight: candidate clips of 1 / propensity (null:
    no clip); teachers: candidate teacher counts; hidden: candidate widths (each a list of
    layer widths); search: `coordinate` (one axis at a time, in that order) or `grid`.
    The configured head's own values are always candidates too.
    """

    enabled: bool = False
    max_weight: tuple[float | None, ...] = (2.0, 20.0)
    teachers: tuple[int, ...] = (1, 5)
    hidden: tuple[tuple[int, ...], ...] = ((256, 128), (64,))
    search: str = "coordinate"

    def __post_init__(self) -> None:
        name = type(self).__name__
        if not isinstance(self.enabled, bool):
            _fail(name, "enabled", self.enabled, "must be a bool")
        if self.search not in SEARCHES:
            _fail(name, "search", self.search, f"must be one of {SEARCHES}")
        mw = _seq(self.max_weight)
        if mw is None or not mw or any(v is not None and (isinstance(v, bool) or not isinstance(
                v, numbers.Real) or not float(v) >= 1.0) for v in mw):
            _fail(name, "max_weight", self.max_weight, "a non-empty list of numbers >= 1 or null")
        object.__setattr__(self, "max_weight",
                           _unique(None if v is None else float(v) for v in mw))
        te = _seq(self.teachers)
        if te is None or not te or any(not _is_int(v) or v < 1 for v in te):
            _fail(name, "teachers", self.teachers, "a non-empty list of integers >= 1")
        object.__setattr__(self, "teachers", _unique(int(v) for v in te))
        hid = _seq(self.hidden)
        widths = [_seq(h) for h in hid] if hid else []
        if not widths or any(w is None or not w or any(not _is_int(x) or x < 1 for x in w)
                             for w in widths):
            _fail(name, "hidden", self.hidden,
                  "a non-empty list of width lists, e.g. [[256, 128], [64]]")
        object.__setattr__(self, "hidden", _unique(tuple(int(x) for x in w) for w in widths))


def _seq(v: Any) -> list | None:
    if isinstance(v, str | bytes) or not hasattr(v, "__iter__"):
        return None
    return list(v)


def _unique(values: Any) -> tuple:
    out: list = []
    for v in values:
        if v not in out:
            out.append(v)
    return tuple(out)
