"""Prometheus adapters on real-name exposition fixtures (tests/data/telemetry) and the poller."""

from __future__ import annotations

import http.server
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("prometheus_client")

from replaylab.contracts.observation import (  # noqa: E402
    FieldStatus,
    Freshness,
    Health,
    ObsField,
    Source,
    freshness,
)
from replaylab.fleet.telemetry.adapters import (  # noqa: E402
    ADAPTERS,
    AdapterConfig,
    ExpositionError,
    PollerConfig,
    ReplicaIdentity,
    TelemetryPoller,
    TelemetryStore,
    histogram_quantile,
    http_fetch,
    make_adapter,
)

DATA = Path(__file__).resolve().parents[1] / "data" / "telemetry"
T1, T2 = 100.0, 110.0  # the two fixture scrapes are 10 s apart
F = ObsField


def _text(name: str) -> str:
    return (DATA / name).read_text()


def _adapter(engine: str, **cfg):
    return make_adapter(engine, ReplicaIdentity("replica-1", "pool-a", engine_version="x"),
                        AdapterConfig(**{"ttl_s": 30.0, **cfg}))


def _two_scrapes(engine: str, **cfg):
    a = _adapter(engine, **cfg)
    first = a.observe(_text(f"{engine}_scrape_1.prom"), T1)
    second = a.observe(_text(f"{engine}_scrape_2.prom"), T2)
    return first, second


# Expected values, checked by hand against the fixtures (see tests/data/telemetry/README.md).
# gauges: scrape 1 and scrape 2; windowed: scrape 2 against scrape 1.
EXPECTED = {
    "vllm": dict(
        gauges_1={F.QUEUE_DEPTH: 5.0, F.RUNNING_REQUESTS: 10.0, F.KV_CACHE_USAGE: 0.57},
        gauges_2={F.QUEUE_DEPTH: 1.0, F.RUNNING_REQUESTS: 12.0, F.KV_CACHE_USAGE: 0.62},
        windowed={F.PREFIX_CACHE_HIT_RATE: 3000 / 8000},  # delta hits / delta queries
        ttft=(0.25, 0.5, 0.725, 30.9 / 100, 100),
        tpot=(0.025, 0.05, 0.0975, 1.75 / 50, 50),
        unsupported={F.POWER_WATTS, F.ENERGY_JOULES},
        model="meta-llama/Llama-3.1-8B-Instruct",
        origins={F.QUEUE_DEPTH: "vllm:num_requests_waiting",
                 F.TPOT_SECONDS: "vllm:request_time_per_output_token_seconds"},
    ),
    "sglang": dict(
        gauges_1={F.QUEUE_DEPTH: 4.0, F.RUNNING_REQUESTS: 18.0, F.KV_CACHE_USAGE: 0.28,
                  F.PREFIX_CACHE_HIT_RATE: 0.0075},
        gauges_2={F.QUEUE_DEPTH: 7.0, F.RUNNING_REQUESTS: 21.0, F.KV_CACHE_USAGE: 0.35,
                  F.PREFIX_CACHE_HIT_RATE: 0.42},
        windowed={},
        ttft=(0.3, 0.72, 0.792, 7.25 / 20, 20),
        tpot=(0.010, 0.015, 0.058, 14.3 / 1000, 1000),
        unsupported={F.POWER_WATTS, F.ENERGY_JOULES},
        model="Qwen/Qwen2.5-7B-Instruct",
        origins={F.KV_CACHE_USAGE: "sglang:token_usage",
                 F.TPOT_SECONDS: "sglang:inter_token_latency_seconds"},
    ),
    "triton_trtllm": dict(
        gauges_1={F.QUEUE_DEPTH: 2.0, F.RUNNING_REQUESTS: 8.0, F.KV_CACHE_USAGE: 0.4875,
                  F.POWER_WATTS: 281.5 + 275.0},
        gauges_2={F.QUEUE_DEPTH: 6.0, F.RUNNING_REQUESTS: 11.0, F.KV_CACHE_USAGE: 0.61,
                  F.POWER_WATTS: 301.25 + 298.75},
        windowed={F.ENERGY_JOULES: 3011.25 + 2985.25},
        ttft=(0.3, 1.25, 1.925, 0.35, 40),  # ms buckets of model "tensorrt_llm", in seconds
        tpot=None,
        unsupported={F.PREFIX_CACHE_HIT_RATE, F.TPOT_SECONDS},
        model=None,
        origins={F.QUEUE_DEPTH: 'nv_trt_llm_request_metrics{request_type="waiting"}',
                 F.RUNNING_REQUESTS: 'nv_trt_llm_request_metrics{request_type="scheduled"}'},
    ),
    "atom": dict(
        gauges_1={F.QUEUE_DEPTH: 3.0, F.RUNNING_REQUESTS: 9.0, F.KV_CACHE_USAGE: 0.52},
        gauges_2={F.QUEUE_DEPTH: 5.0, F.RUNNING_REQUESTS: 11.0, F.KV_CACHE_USAGE: 0.58},
        windowed={F.PREFIX_CACHE_HIT_RATE: 30000 / 40000},
        ttft=(0.5625, 1.75, 2.425, 0.7, 10),  # streaming="true" and "false" summed
        tpot=(0.0225, 0.04375, 0.049375, 0.028, 100),
        unsupported={F.POWER_WATTS, F.ENERGY_JOULES},
        model=None,
        origins={F.RUNNING_REQUESTS: "atom:requests_running"},
    ),
}


def test_every_engine_has_an_adapter_and_fixtures():
    assert set(ADAPTERS) == set(EXPECTED)
    for engine in EXPECTED:
        assert (DATA / f"{engine}_scrape_1.prom").is_file()


@pytest.mark.parametrize("engine", sorted(EXPECTED))
def test_adapter_maps_documented_metrics(engine):
    exp = EXPECTED[engine]
    first, second = _two_scrapes(engine)
    for obs, gauges, now in ((first, exp["gauges_1"], T1), (second, exp["gauges_2"], T2)):
        for name, value in gauges.items():
            assert obs.get(name, now) == pytest.approx(value), name
            assert obs.fields[name].source is Source.BACKEND_MEASURED
        assert obs.get(F.HEALTH, now) is Health.HEALTHY
        assert obs.fields[F.HEALTH].source is Source.ROUTER_OBSERVED
    for name, value in exp["windowed"].items():
        assert second.get(name, T2) == pytest.approx(value), name
        assert second.fields[name].window_s == pytest.approx(T2 - T1)
    for name, want in ((F.TTFT_SECONDS, exp["ttft"]), (F.TPOT_SECONDS, exp["tpot"])):
        if want is None:
            continue
        got = second.get(name, T2)
        assert (got.p50, got.p90, got.p99, got.mean, got.count) == pytest.approx(want), name
        assert second.fields[name].window_s == pytest.approx(T2 - T1)
    for name, origin in exp["origins"].items():
        assert second.fields[name].origin == origin
    assert (second.engine, second.model, second.engine_version) == (engine, exp["model"], "x")


@pytest.mark.parametrize("engine", sorted(EXPECTED))
def test_unsupported_fields_are_absent_not_fabricated(engine):
    _, second = _two_scrapes(engine)
    unsupported = {n for n, fv in second.fields.items() if not fv.supported}
    assert unsupported == EXPECTED[engine]["unsupported"]
    for name in unsupported:
        assert second.get(name, T2) is None
        assert second.status(name, T2) is FieldStatus.UNSUPPORTED
        assert second.fields[name].origin  # says why


@pytest.mark.parametrize("engine", sorted(EXPECTED))
def test_first_scrape_has_no_windowed_values(engine):
    first = _adapter(engine).observe(_text(f"{engine}_scrape_1.prom"), T1)
    windowed = set(EXPECTED[engine]["windowed"]) | {F.TTFT_SECONDS, F.TPOT_SECONDS}
    for name in windowed - EXPECTED[engine]["unsupported"]:
        assert first.status(name, T1) is FieldStatus.MISSING, name


@pytest.mark.parametrize("engine", sorted(EXPECTED))
def test_adapter_fields_expire(engine):
    a = _adapter(engine, ttl_s=5.0, ttl_overrides={F.TTFT_SECONDS: 60.0})
    a.observe(_text(f"{engine}_scrape_1.prom"), T1)
    obs = a.observe(_text(f"{engine}_scrape_2.prom"), T2)
    assert obs.get(F.QUEUE_DEPTH, T2 + 4.9) is not None
    assert obs.get(F.QUEUE_DEPTH, T2 + 5.0) is None
    assert obs.status(F.RUNNING_REQUESTS, T2 + 5.0) is FieldStatus.STALE
    assert obs.get(F.HEALTH, T2 + 5.0) is None
    assert obs.get(F.TTFT_SECONDS, T2 + 30.0) is not None  # per-field TTL override
    assert freshness(obs, T2 + 1) is Freshness.FRESH
    assert freshness(obs, T2 + 6) is Freshness.STALE


def test_cumulative_histogram_mode_needs_one_scrape():
    obs = _adapter("vllm", histogram_window="cumulative").observe(
        _text("vllm_scrape_1.prom"), T1)
    ttft = obs.get(F.TTFT_SECONDS, T1)
    # 20 samples in (0.04, 0.06], 30 in (0.1, 0.25], 10 in (0.25, 0.5]: rank 30 -> 0.1 + 0.15/3
    assert ttft.count == 60 and ttft.p50 == pytest.approx(0.15)
    assert obs.fields[F.TTFT_SECONDS].window_s is None


def test_triton_label_filter_selects_the_trtllm_model():
    _, default = _two_scrapes("triton_trtllm")
    _, ensemble = _two_scrapes("triton_trtllm", label_filter={"model": "ensemble"})
    # ensemble cumulative deltas 4 / 25 / 40 (le 100 / 500 / 2000 ms): rank 20 lies in
    # (100, 500] with 4 below and 21 inside -> a different p50; GPU series unaffected
    assert default.get(F.TTFT_SECONDS, T2).p50 == pytest.approx(0.3)
    assert ensemble.get(F.TTFT_SECONDS, T2).p50 == pytest.approx(0.1 + 0.4 * 16 / 21)
    assert ensemble.get(F.POWER_WATTS, T2) == pytest.approx(600.0)
    assert ensemble.status(F.QUEUE_DEPTH, T2) is FieldStatus.MISSING  # no trt-llm series there


def test_triton_kv_falls_back_to_used_over_max():
    strip = lambda t: "\n".join(ln for ln in t.splitlines()  # noqa: E731
                                if 'kv_cache_block_type="fraction"' not in ln) + "\n"
    obs = _adapter("triton_trtllm").observe(strip(_text("triton_trtllm_scrape_2.prom")), T1)
    assert obs.get(F.KV_CACHE_USAGE, T1) == pytest.approx(3806 / 6239)
    assert obs.fields[F.KV_CACHE_USAGE].origin.startswith("nv_trt_llm_kv_cache_block_metrics")


VLLM_V0 = """# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{model_name="m"}} 2.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{model_name="m"}} 1.0
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{{model_name="m"}} 0.3
# TYPE vllm:gpu_prefix_cache_hit_rate gauge
vllm:gpu_prefix_cache_hit_rate{{model_name="m"}} 0.25
# TYPE vllm:time_per_output_token_seconds histogram
vllm:time_per_output_token_seconds_bucket{{le="0.01",model_name="m"}} 0.0
vllm:time_per_output_token_seconds_bucket{{le="0.025",model_name="m"}} {b1}
vllm:time_per_output_token_seconds_bucket{{le="+Inf",model_name="m"}} {b1}
vllm:time_per_output_token_seconds_count{{model_name="m"}} {b1}
vllm:time_per_output_token_seconds_sum{{model_name="m"}} {s}
"""


def test_vllm_v0_names_are_read():
    a = _adapter("vllm")
    a.observe(VLLM_V0.format(b1=10, s=0.2), T1)
    obs = a.observe(VLLM_V0.format(b1=30, s=0.6), T2)
    assert obs.get(F.KV_CACHE_USAGE, T2) == 0.3
    assert obs.get(F.PREFIX_CACHE_HIT_RATE, T2) == 0.25
    tpot = obs.get(F.TPOT_SECONDS, T2)
    assert tpot.count == 20 and tpot.mean == pytest.approx(0.02)
    assert tpot.p50 == pytest.approx(0.01 + 0.015 * 0.5)
    assert obs.fields[F.TPOT_SECONDS].origin == "vllm:time_per_output_token_seconds"
    assert obs.status(F.TTFT_SECONDS, T2) is FieldStatus.MISSING  # not in this exposition


def test_counter_reset_gives_no_rate():
    a = _adapter("vllm")
    a.observe(_text("vllm_scrape_2.prom"), T1)
    obs = a.observe(_text("vllm_scrape_1.prom"), T2)  # every counter went down: restart
    assert obs.status(F.PREFIX_CACHE_HIT_RATE, T2) is FieldStatus.MISSING
    assert obs.status(F.TTFT_SECONDS, T2) is FieldStatus.MISSING
    assert obs.get(F.QUEUE_DEPTH, T2) == 5.0  # gauges are unaffected


def test_atom_without_snapshot_drops_placeholder_zeros():
    a = _adapter("atom")
    obs = a.observe(_text("atom_no_snapshot.prom"), T1)
    for name in (F.QUEUE_DEPTH, F.RUNNING_REQUESTS, F.KV_CACHE_USAGE, F.PREFIX_CACHE_HIT_RATE):
        assert obs.status(name, T1) is FieldStatus.MISSING, name
    assert obs.get(F.HEALTH, T1) is Health.UNKNOWN
    assert freshness(obs, T1) is Freshness.MISSING
    # the placeholder scrape is no baseline: the next good scrape has gauges but no rate yet
    after = a.observe(_text("atom_scrape_2.prom"), T2)
    assert after.get(F.QUEUE_DEPTH, T2) == 5.0
    assert after.status(F.PREFIX_CACHE_HIT_RATE, T2) is FieldStatus.MISSING


def test_malformed_exposition_is_a_clear_error_and_keeps_state():
    a = _adapter("vllm")
    a.observe(_text("vllm_scrape_1.prom"), T1)
    with pytest.raises(ExpositionError, match="malformed Prometheus exposition"):
        a.observe('vllm:num_requests_running{model_name="m" 3\n', T1 + 5)
    with pytest.raises(ExpositionError):
        a.observe("<html>502 Bad Gateway</html>\n", T1 + 6)
    obs = a.observe(_text("vllm_scrape_2.prom"), T2)  # baseline is still scrape 1
    assert obs.get(F.PREFIX_CACHE_HIT_RATE, T2) == pytest.approx(0.375)
    with pytest.raises(ValueError, match="not after the previous"):
        a.observe(_text("vllm_scrape_2.prom"), T2)


def test_foreign_exposition_is_not_healthy():
    obs = _adapter("sglang").observe(_text("vllm_scrape_1.prom"), T1)
    assert obs.get(F.HEALTH, T1) is Health.UNKNOWN
    assert freshness(obs, T1) is Freshness.MISSING


@pytest.mark.parametrize("buckets, q, want", [
    ([(1.0, 0), (2.0, 10), (float("inf"), 10)], 0.5, 1.5),
    ([(1.0, 10), (float("inf"), 10)], 0.5, 0.5),           # first bucket: lower bound 0
    ([(1.0, 5), (2.0, 5), (float("inf"), 10)], 0.9, 2.0),  # +Inf bucket -> largest bound
    ([(1.0, 0), (float("inf"), 0)], 0.5, None),            # no observations
    ([(1.0, 3), (2.0, 5)], 0.5, None),                     # no +Inf bucket
])
def test_histogram_quantile(buckets, q, want):
    got = histogram_quantile(q, buckets)
    assert got == (None if want is None else pytest.approx(want))


@pytest.mark.parametrize("kwargs, match", [
    (dict(ttl_s=0), "AdapterConfig.ttl_s=0"),
    (dict(histogram_window="lifetime"), "histogram_window"),
    (dict(ttl_overrides={"gpu_temp": 1.0}), "unknown observation field"),
])
def test_adapter_config_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        AdapterConfig(**kwargs)


# --- the poller: off the decision path ------------------------------------------------------
class FakeClock:
    def __init__(self, t: float = T1) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _poller(fetch, clock, **cfg):
    store = TelemetryStore()
    adapter = _adapter("vllm", ttl_s=5.0)
    config = PollerConfig(**{"interval_s": 0.02, "fetch_timeout_s": 0.05, **cfg})
    return TelemetryPoller(adapter, fetch, store, config, clock=clock), store


def test_poller_success_feeds_the_store():
    clock = FakeClock()
    texts = iter([_text("vllm_scrape_1.prom"), _text("vllm_scrape_2.prom")])
    poller, store = _poller(lambda: next(texts), clock)
    assert poller.poll_once()
    clock.t = T2
    assert poller.poll_once()
    obs = store.get("replica-1")
    assert obs.get(F.PREFIX_CACHE_HIT_RATE, T2) == pytest.approx(0.375)
    assert store.last_error("replica-1") is None
    assert store.snapshot()["replica-1"] is obs


def test_hanging_fetch_does_not_block_the_decision_path():
    release = threading.Event()
    clock = FakeClock()
    calls = []

    def fetch():
        calls.append(1)
        if len(calls) > 1:
            release.wait(10)  # hangs until the test ends
        return _text("vllm_scrape_1.prom")

    poller, store = _poller(fetch, clock, unhealthy_after_failures=3)
    try:
        assert poller.poll_once()
        clock.t = T1 + 1
        t0 = time.perf_counter()
        assert not poller.poll_once()          # times out after fetch_timeout_s
        assert time.perf_counter() - t0 < 1.0
        t0 = time.perf_counter()
        obs = store.get("replica-1")           # the decision path reads without waiting
        assert time.perf_counter() - t0 < 0.05
        assert obs.get(F.HEALTH, clock.t) is Health.UNKNOWN
        assert "timed out" in store.last_error("replica-1")
        assert obs.get(F.QUEUE_DEPTH, T1 + 1) == 5.0  # still within its TTL ...
        assert obs.get(F.QUEUE_DEPTH, T1 + 5) is None  # ... and gone after it
        clock.t = T1 + 2
        assert not poller.poll_once()          # the hung fetch is not started again
        assert len(calls) == 2
        assert "still running" in store.last_error("replica-1")
    finally:
        release.set()


def test_erroring_fetch_marks_health_and_lets_fields_expire():
    clock = FakeClock()
    state = {"fail": False}

    def fetch():
        if state["fail"]:
            raise ConnectionRefusedError("connection refused")
        return _text("vllm_scrape_1.prom")

    poller, store = _poller(fetch, clock, unhealthy_after_failures=2)
    assert poller.poll_once()
    state["fail"] = True
    clock.t = T1 + 3
    assert not poller.poll_once()
    obs = store.get("replica-1")
    assert obs.get(F.HEALTH, clock.t) is Health.UNKNOWN
    assert obs.fields[F.HEALTH].source is Source.ROUTER_OBSERVED
    assert "connection refused" in obs.fields[F.HEALTH].origin
    clock.t = T1 + 6
    assert not poller.poll_once()
    obs = store.get("replica-1")
    assert obs.get(F.HEALTH, clock.t) is Health.UNHEALTHY
    assert obs.get(F.QUEUE_DEPTH, clock.t) is None      # expired, not refreshed, not zeroed
    assert freshness(obs, clock.t) is Freshness.STALE
    state["fail"] = False
    clock.t = T1 + 7
    assert poller.poll_once() and poller.consecutive_failures == 0
    assert store.get("replica-1").get(F.HEALTH, clock.t) is Health.HEALTHY


def test_malformed_exposition_does_not_crash_the_poller_thread():
    clock = FakeClock()
    n = {"i": 0}

    def fetch():
        n["i"] += 1
        clock.t += 1.0
        return "this is not exposition\n" if n["i"] % 2 else _text("vllm_scrape_1.prom")

    poller, store = _poller(fetch, clock)
    with poller:
        deadline = time.monotonic() + 5
        while n["i"] < 5 and time.monotonic() < deadline:
            time.sleep(0.01)
    assert n["i"] >= 5
    assert store.get("replica-1") is not None
    assert not [t for t in threading.enumerate()  # stopped cleanly: its thread is gone
                if t.name == "telemetry-replica-1" and t.is_alive()]


def test_a_replica_never_scraped_is_missing():
    store = TelemetryStore()
    assert store.get("replica-9") is None
    assert freshness(store.get("replica-9"), T1) is Freshness.MISSING


def test_store_keeps_the_latest_observation():
    store = TelemetryStore()
    a = _adapter("vllm")
    old = a.observe(_text("vllm_scrape_1.prom"), T1)
    new = a.observe(_text("vllm_scrape_2.prom"), T2)
    store.put(new)
    store.put(old)  # a late, older result does not overwrite
    assert store.get("replica-1") is new


def test_http_fetch_reads_a_metrics_endpoint():
    body = _text("sglang_scrape_1.prom").encode()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        fetch = http_fetch(f"http://127.0.0.1:{server.server_port}/metrics", timeout_s=2.0)
        obs = _adapter("sglang").observe(fetch(), T1)
        assert obs.get(F.RUNNING_REQUESTS, T1) == 18.0
    finally:
        server.shutdown()
        server.server_close()
    with pytest.raises(ValueError, match="http"):
        http_fetch("file:///etc/passwd")
