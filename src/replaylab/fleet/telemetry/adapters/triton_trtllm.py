"""TensorRT-LLM through Triton: `nv_trt_llm_*` batch-manager gauges plus Triton core metrics.

Sources:
- https://docs.nvidia.com/deeplearning/triton-inference-server/user-guide/docs/tensorrtllm_backend/README.html#triton-metrics
  (nv_trt_llm_request_metrics{request_type=waiting|context|scheduled|max|active},
  nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=fraction|tokens_per|used|free|max})
- triton-inference-server/server docs/user_guide/metrics.md
  (nv_gpu_power_usage W, nv_energy_consumption J since start (counter),
  nv_inference_first_response_histogram_ms, opt-in with
  --metrics-config histogram_latencies=true)
- kubernetes-sigs/gateway-api-inference-extension model-server protocol: queue =
  request_type="waiting", running = request_type="scheduled", KV = "fraction"

Model-scoped series carry `model` = the Triton model name, so the default label
filter keeps model="tensorrt_llm" (an ensemble also exports preprocessing and
postprocessing models); GPU series carry only gpu_uuid and are summed over every
GPU the server sees. The first-response histogram is TTFT only for a decoupled
(streaming) model; for a non-streaming one it is the whole request. No per-token
latency and no prefix-reuse hit metric are documented.
"""

from __future__ import annotations

from types import MappingProxyType

from replaylab.contracts.observation import ObsField
from replaylab.fleet.telemetry.adapters.base import (
    CounterDelta,
    Gauge,
    GaugeRatio,
    HistogramSummary,
    PrometheusAdapter,
    Unsupported,
)

_REQ = "nv_trt_llm_request_metrics"
_KV = "nv_trt_llm_kv_cache_block_metrics"

TRITON_TRTLLM_MAPPING = MappingProxyType({
    ObsField.QUEUE_DEPTH: (Gauge((_REQ,), select={"request_type": "waiting"}),),
    ObsField.RUNNING_REQUESTS: (Gauge((_REQ,), select={"request_type": "scheduled"}),),
    ObsField.KV_CACHE_USAGE: (
        Gauge((_KV,), select={"kv_cache_block_type": "fraction"}, agg="max"),
        GaugeRatio(Gauge((_KV,), select={"kv_cache_block_type": "used"}),
                   Gauge((_KV,), select={"kv_cache_block_type": "max"})),
    ),
    ObsField.PREFIX_CACHE_HIT_RATE: Unsupported(
        "Triton TensorRT-LLM backend documents no KV-reuse hit metric"),
    ObsField.TTFT_SECONDS: (
        HistogramSummary(("nv_inference_first_response_histogram_ms",), scale=1e-3),),
    ObsField.TPOT_SECONDS: Unsupported("Triton documents no per-token latency metric"),
    ObsField.POWER_WATTS: (Gauge(("nv_gpu_power_usage",)),),
    ObsField.ENERGY_JOULES: (CounterDelta(("nv_energy_consumption",)),),
})


class TritonTRTLLMAdapter(PrometheusAdapter):
    """Triton Inference Server with the TensorRT-LLM backend."""

    engine = "triton_trtllm"
    mapping = TRITON_TRTLLM_MAPPING
    model_label = None  # the `model` label is the Triton model name, not the served LLM
    default_label_filter = MappingProxyType({"model": "tensorrt_llm"})
