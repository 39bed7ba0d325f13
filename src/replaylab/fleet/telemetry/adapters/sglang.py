"""SGLang adapter: `sglang:*` metrics (server started with --enable-metrics).

Sources:
- https://docs.sglang.io/references/production_metrics.html (example exposition)
- sgl-project/sglang python/sglang/srt/metrics/collector.py (SchedulerMetricsCollector:
  num_running_reqs, num_queue_reqs, token_usage, cache_hit_rate gauges;
  TokenizerMetricsCollector: time_to_first_token_seconds, inter_token_latency_seconds
  histograms; older releases named the latter time_per_output_token_seconds)

Labels include `model_name` (and tp_rank/pp_rank/dp_rank in newer releases). By
default only attention-TP rank 0 of each DP group emits scheduler gauges, so summing
series is right; with --enable-metrics-for-all-schedulers set a label_filter
(e.g. {"tp_rank": "0"}) or counts double. No power or energy metric.
"""

from __future__ import annotations

from types import MappingProxyType

from replaylab.contracts.observation import ObsField
from replaylab.fleet.telemetry.adapters.base import (
    Gauge,
    HistogramSummary,
    PrometheusAdapter,
    Unsupported,
)

SGLANG_MAPPING = MappingProxyType({
    ObsField.QUEUE_DEPTH: (Gauge(("sglang:num_queue_reqs",)),),
    ObsField.RUNNING_REQUESTS: (Gauge(("sglang:num_running_reqs",)),),
    # token_usage = used KV tokens / KV pool capacity
    ObsField.KV_CACHE_USAGE: (Gauge(("sglang:token_usage",), agg="max"),),
    # engine-computed radix-cache hit rate (a gauge: one scrape suffices)
    ObsField.PREFIX_CACHE_HIT_RATE: (Gauge(("sglang:cache_hit_rate",), agg="mean"),),
    ObsField.TTFT_SECONDS: (HistogramSummary(("sglang:time_to_first_token_seconds",)),),
    ObsField.TPOT_SECONDS: (HistogramSummary((
        "sglang:time_per_output_token_seconds",  # older releases
        "sglang:inter_token_latency_seconds",
    )),),
    ObsField.POWER_WATTS: Unsupported("SGLang exports no GPU power metric"),
    ObsField.ENERGY_JOULES: Unsupported("SGLang exports no energy metric"),
})


class SGLangAdapter(PrometheusAdapter):
    """SGLang runtime; model from the `model_name` label."""

    engine = "sglang"
    mapping = SGLANG_MAPPING
    model_label = "model_name"
