"""Deployable artifacts of trained models (exact ONNX export of the demand boosters)."""

from replaylab.artifacts.onnx_lgbm import (
    UnsupportedBoosterError,
    booster_to_onnx,
    demand_model_to_onnx,
    design_to_matrix,
)

__all__ = ["UnsupportedBoosterError", "booster_to_onnx", "demand_model_to_onnx",
           "design_to_matrix"]
