"""Prometheus adapters: real engine metrics -> observation-v1 (see docs/specs/telemetry.md).

`make_adapter(engine, identity)` picks the adapter; `TelemetryPoller` runs it off
the decision path and feeds a `TelemetryStore` that policies read.
"""

from __future__ import annotations

from types import MappingProxyType

from replaylab.fleet.telemetry.adapters.atom import ATOMAdapter
from replaylab.fleet.telemetry.adapters.base import (
    AdapterConfig,
    PrometheusAdapter,
    ReplicaIdentity,
    Unsupported,
)
from replaylab.fleet.telemetry.adapters.exposition import (
    ExpositionError,
    histogram_quantile,
    parse_exposition,
)
from replaylab.fleet.telemetry.adapters.poller import (
    PollerConfig,
    TelemetryPoller,
    TelemetryStore,
    http_fetch,
)
from replaylab.fleet.telemetry.adapters.sglang import SGLangAdapter
from replaylab.fleet.telemetry.adapters.triton_trtllm import TritonTRTLLMAdapter
from replaylab.fleet.telemetry.adapters.vllm import VLLMAdapter

ADAPTERS: MappingProxyType[str, type[PrometheusAdapter]] = MappingProxyType({
    cls.engine: cls for cls in (VLLMAdapter, SGLangAdapter, TritonTRTLLMAdapter, ATOMAdapter)})


def make_adapter(engine: str, identity: ReplicaIdentity,
                 config: AdapterConfig | None = None) -> PrometheusAdapter:
    """The adapter for `engine` (one of ADAPTERS: vllm, sglang, triton_trtllm, atom)."""
    try:
        cls = ADAPTERS[engine]
    except KeyError:
        raise ValueError(f"unknown engine {engine!r}; known: {', '.join(ADAPTERS)}") from None
    return cls(identity, config)


__all__ = [
    "ADAPTERS", "ATOMAdapter", "AdapterConfig", "ExpositionError", "PollerConfig",
    "PrometheusAdapter", "ReplicaIdentity", "SGLangAdapter", "TelemetryPoller",
    "TelemetryStore", "TritonTRTLLMAdapter", "Unsupported", "VLLMAdapter", "histogram_quantile",
    "http_fetch", "make_adapter", "parse_exposition",
]
