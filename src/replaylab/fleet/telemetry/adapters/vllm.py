"""vLLM adapter: `vllm:*` metrics from the OpenAI server's /metrics.

Sources (metric names as documented and as registered in code):
- https://docs.vllm.ai/en/stable/usage/metrics/ (production metrics list)
- vllm-project/vllm docs/design/metrics.md (v1 metrics: prefix_cache_queries/hits counters)
- vllm-project/vllm vllm/v1/metrics/loggers.py (PrometheusStatLogger: names, types, labels
  `model_name` and `engine`; `gpu_cache_usage_perc` and `gpu_prefix_cache_*` deprecated in 0.9)

Names are tried newest first, so one adapter reads v0 and v1 servers. vLLM exports
no power or energy metric (scrape DCGM or the host separately).
"""

from __future__ import annotations

from types import MappingProxyType

from replaylab.contracts.observation import ObsField
from replaylab.fleet.telemetry.adapters.base import (
    CounterRatio,
    Gauge,
    HistogramSummary,
    PrometheusAdapter,
    Unsupported,
)

VLLM_MAPPING = MappingProxyType({
    ObsField.QUEUE_DEPTH: (Gauge(("vllm:num_requests_waiting",)),),
    ObsField.RUNNING_REQUESTS: (Gauge(("vllm:num_requests_running",)),),
    ObsField.KV_CACHE_USAGE: (
        Gauge(("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"), agg="max"),),
    ObsField.PREFIX_CACHE_HIT_RATE: (
        # v1: token counters; the rate needs two scrapes
        CounterRatio(("vllm:prefix_cache_hits",), ("vllm:prefix_cache_queries",)),
        CounterRatio(("vllm:gpu_prefix_cache_hits",), ("vllm:gpu_prefix_cache_queries",)),
        # v0: a gauge computed by the engine
        Gauge(("vllm:gpu_prefix_cache_hit_rate",), agg="mean"),
    ),
    ObsField.TTFT_SECONDS: (HistogramSummary(("vllm:time_to_first_token_seconds",)),),
    ObsField.TPOT_SECONDS: (HistogramSummary((
        "vllm:request_time_per_output_token_seconds",  # per-request mean TPOT (newer)
        "vllm:time_per_output_token_seconds",          # v0/v1 per-token (deprecated alias of ITL)
        "vllm:inter_token_latency_seconds",
    )),),
    ObsField.POWER_WATTS: Unsupported("vLLM exports no GPU power metric"),
    ObsField.ENERGY_JOULES: Unsupported("vLLM exports no energy metric"),
})


class VLLMAdapter(PrometheusAdapter):
    """vLLM (v0 and v1 engines); model from the `model_name` label."""

    engine = "vllm"
    mapping = VLLM_MAPPING
    model_label = "model_name"
