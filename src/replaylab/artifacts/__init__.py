"""Deployable artifacts of trained models (exact ONNX export of the demand boosters).

The exporter (`onnx_lgbm`, which needs numpy, pandas and onnx) is imported lazily
on first attribute access, so `replaylab.artifacts.manifest` (standard library
only) can be imported by the runtime without pulling the training stack.
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
