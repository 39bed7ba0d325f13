"""Demand hints in serving: a verified demand artifact answering pre-dispatch hints.

- `predictor`: `DemandPredictor` (load, verify, golden check, predict, online
  recalibration) and `BatchQuantiles`;
- `spec`: the manifest's sections as typed records (`DemandSections`, written by the
  exporter; `DemandSpec`, what the runtime reads and checks), `ArtifactError`;
- `request`: a request mapping read into the artifact's feature row, its conformal cell;
- `fallback`: `FallbackBaseline`, the conservative reservation served when the model
  cannot answer.
"""

from replaylab.runtime.demand.fallback import FallbackBaseline
from replaylab.runtime.demand.predictor import BatchQuantiles, DemandPredictor
from replaylab.runtime.demand.spec import KIND, MODEL_FILE, ArtifactError, DemandSpec

__all__ = ["KIND", "MODEL_FILE", "ArtifactError", "BatchQuantiles", "DemandPredictor",
           "DemandSpec", "FallbackBaseline"]
