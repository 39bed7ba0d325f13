"""Demand: calibrated pre-dispatch prediction of total tokens (prompt + completion).

Light at import (configs, labels, errors); the LightGBM model, baselines,
conformal calibration and metrics load on first use (`replaylab.demand.X`).
See docs/design/demand-target.md for the target, censoring and evaluation rules.
"""

from replaylab.contracts.lazy import lazy_exports
from replaylab.demand.config import DemandConfig, QuantileModelConfig
from replaylab.demand.labels import DemandDataError, DemandLabels, demand_labels

_LAZY = {
    "QuantileDemandModel": "replaylab.demand.model",
    "GroupConformal": "replaylab.demand.conformal",
    "conformal_quantile": "replaylab.demand.conformal",
    "reliability_curve": "replaylab.demand.conformal",
    "PromptLengthBaseline": "replaylab.demand.baselines",
    "MaxTokensCapBaseline": "replaylab.demand.baselines",
    "CategoryBucketBaseline": "replaylab.demand.baselines",
    "SessionEwmaBaseline": "replaylab.demand.baselines",
    "make_baselines": "replaylab.demand.baselines",
    "interval_metrics": "replaylab.demand.metrics",
}

__all__ = ["DemandConfig", "DemandDataError", "DemandLabels", "QuantileModelConfig",
           "demand_labels", *_LAZY]

# lazy: keep lightgbm / sklearn out of `import replaylab.demand`
__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
