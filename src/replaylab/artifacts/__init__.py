"""The export side of every artifact kind (exact ONNX of the demand boosters, flat trees).

Manifests and golden vectors are verified with `replaylab.contracts.manifest` and
`replaylab.contracts.golden`, which the runtime imports too; the exporters here sit
above the runtime and are imported lazily on first attribute access.
"""

from __future__ import annotations

from replaylab.contracts.lazy import lazy_exports

_LAZY = {
    "UnsupportedBoosterError": "replaylab.artifacts.onnx_lgbm",
    "booster_to_onnx": "replaylab.artifacts.onnx_lgbm",
    "demand_model_to_onnx": "replaylab.artifacts.onnx_lgbm",
    "design_to_matrix": "replaylab.artifacts.onnx_lgbm",
}

__all__ = ["UnsupportedBoosterError", "booster_to_onnx", "demand_model_to_onnx",
           "design_to_matrix"]

__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
