"""ROCm ATOM adapter: `atom:*` metrics from the ATOM OpenAI server's /metrics.

Sources (ROCm/ATOM, commit 1022e6548a362a597d17ccce766d214c7a66de86):
- docs/metrics_guide.md ("ATOM Metrics Reference": engine aggregate state, prefix
  cache, API TTFT/ITL histograms, exporter health)
- atom/metrics/exporter.py (the collector that emits the snapshot gauges)

The state gauges (requests_running/waiting, kv_cache_usage_ratio, prefix-cache
counters) come from an engine snapshot, and the exporter writes 0 for each of them
when no snapshot exists. `atom:metrics_snapshot_available` says which case holds:
when it is 0 the adapter drops those fields (absent, not zero) and reports health
unknown. ATOM exports no GPU power or energy metric; AMD's Device Metrics Exporter
is a separate scrape target and is not mapped here.
"""

from __future__ import annotations

from types import MappingProxyType

from replaylab.contracts.observation import ObsField
from replaylab.fleet.telemetry.adapters.base import (
    CounterRatio,
    Gauge,
    GaugeRatio,
    HistogramSummary,
    PrometheusAdapter,
    Scrape,
    Unsupported,
)

SNAPSHOT_AVAILABLE = "atom:metrics_snapshot_available"

ATOM_MAPPING = MappingProxyType({
    ObsField.QUEUE_DEPTH: (Gauge(("atom:requests_waiting",)),),
    ObsField.RUNNING_REQUESTS: (Gauge(("atom:requests_running",)),),
    ObsField.KV_CACHE_USAGE: (
        Gauge(("atom:kv_cache_usage_ratio",), agg="max"),
        GaugeRatio(Gauge(("atom:kv_cache_blocks_used",)), Gauge(("atom:kv_cache_blocks_total",))),
    ),
    # windowed token hit rate; atom:prefix_cache_hit_ratio is a lifetime ratio, not used
    ObsField.PREFIX_CACHE_HIT_RATE: (
        CounterRatio(("atom:prefix_cache_cached_tokens",), ("atom:prefix_cache_full_tokens",)),),
    ObsField.TTFT_SECONDS: (HistogramSummary(("atom:time_to_first_token_seconds",)),),
    # token-weighted inter-token latency (frontend-observed)
    ObsField.TPOT_SECONDS: (HistogramSummary(("atom:inter_token_latency_seconds",)),),
    ObsField.POWER_WATTS: Unsupported("ATOM exports no GPU power metric"),
    ObsField.ENERGY_JOULES: Unsupported("ATOM exports no energy metric"),
})

# fields read from the engine snapshot (zeros, not measurements, when it is missing)
SNAPSHOT_FIELDS = (ObsField.QUEUE_DEPTH, ObsField.RUNNING_REQUESTS, ObsField.KV_CACHE_USAGE,
                   ObsField.PREFIX_CACHE_HIT_RATE)


class ATOMAdapter(PrometheusAdapter):
    """AMD ROCm ATOM; gates snapshot fields on atom:metrics_snapshot_available."""

    engine = "atom"
    mapping = ATOM_MAPPING

    def _snapshot_missing(self, scrape: Scrape) -> bool:
        rows = scrape.samples.get(SNAPSHOT_AVAILABLE, ())
        return bool(rows) and all(v < 1 for _, v in rows)

    def gated_fields(self, scrape: Scrape) -> tuple[str, ...]:
        return SNAPSHOT_FIELDS if self._snapshot_missing(scrape) else ()

    def engine_ready(self, scrape: Scrape) -> bool:
        return not self._snapshot_missing(scrape)
