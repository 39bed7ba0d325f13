"""Serving runtime: load verified artifacts and answer in microseconds.

Installed by `replaylab[serve]`: numpy and onnxruntime (and tokenizers for the
router's MiniLM encoder; a static-tier router needs numpy alone), nothing heavier; a test imports it with torch, lightgbm,
pandas, sklearn and mlflow made unimportable. Names are imported lazily.

    from replaylab.runtime import DemandPredictor
    from replaylab.contracts import negotiate, Acknowledgement  # the hint/ack contract
    predictor = DemandPredictor.load("artifacts/demand", hmac_key=key)
    hint = predictor.predict({"prompt_tokens": 812, "max_tokens": 1024, ...})
"""

from __future__ import annotations

from replaylab.contracts.lazy import lazy_exports

_LAZY = {
    "DemandPredictor": "replaylab.runtime.demand",
    "FallbackBaseline": "replaylab.runtime.demand",
    "Router": "replaylab.runtime.router",
    "RouteDecision": "replaylab.runtime.router",
    "SessionBinder": "replaylab.runtime.binder",
    "BindingReceipt": "replaylab.runtime.binder",
}

__all__ = sorted(_LAZY)

__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
