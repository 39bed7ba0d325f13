"""Scraping off the decision path: pollers feed a store the decision path reads without waiting.

`TelemetryStore` keeps the latest `Observation` per replica. Writers take a lock
and swap in a new immutable mapping; readers (`get`, `snapshot`) read the current
reference without locking, so a policy never waits on a scrape, a slow engine or
another reader. What they read is still subject to TTL: a field whose scrape is
old returns None from `Observation.get`.

`TelemetryPoller` owns one adapter and one `fetch` callable (() -> exposition
text; `http_fetch(url)` for a live server, a fake in tests). Each tick runs fetch
on a daemon thread and waits at most `fetch_timeout_s`:
- success: `adapter.observe(text, clock())` replaces the replica's observation;
- timeout, exception or malformed exposition: health becomes `unknown` (after
  `unhealthy_after_failures` consecutive failures, `unhealthy`), observed by the
  router now; every other field keeps its original expiry, so it becomes
  unreadable after its TTL rather than being refreshed or zeroed.
A hung fetch is not started again until it returns (one in flight per replica),
and no exception escapes the polling thread.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from replaylab.config import fail_field
from replaylab.contracts.observation import FieldValue, Health, Observation, ObsField, Source
from replaylab.fleet.telemetry.adapters.base import PrometheusAdapter

log = logging.getLogger(__name__)

Fetch = Callable[[], str]


class TelemetryStore:
    """Latest observation per replica; lock-free reads, locked copy-on-write updates."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._latest: Mapping[str, Observation] = MappingProxyType({})
        self._errors: Mapping[str, str] = MappingProxyType({})

    # --- decision path (never blocks) -----------------------------------------------------
    def get(self, replica_id: str) -> Observation | None:
        return self._latest.get(replica_id)

    def snapshot(self) -> Mapping[str, Observation]:
        """An immutable view of every replica's latest observation."""
        return self._latest

    def last_error(self, replica_id: str) -> str | None:
        return self._errors.get(replica_id)

    # --- pollers ------------------------------------------------------------------------
    def put(self, obs: Observation) -> None:
        """Store `obs` unless the store already holds a later one for that replica."""
        with self._lock:
            cur = self._latest.get(obs.replica_id)
            if cur is not None and cur.observed_at > obs.observed_at:
                return
            self._latest = MappingProxyType({**self._latest, obs.replica_id: obs})
            self._errors = MappingProxyType(
                {k: v for k, v in self._errors.items() if k != obs.replica_id})

    def record_failure(self, adapter: PrometheusAdapter, now: float, reason: str,
                       health: Health = Health.UNKNOWN) -> None:
        """Mark a failed scrape: a fresh router-observed health, all else left to expire."""
        hv = FieldValue.observed(health, source=Source.ROUTER_OBSERVED, at=now,
                                 ttl_s=adapter.config.ttl_for(ObsField.HEALTH),
                                 origin=f"scrape failed: {reason}"[:200])
        ident = adapter.identity
        with self._lock:
            cur = self._latest.get(ident.replica_id)
            if cur is None:
                obs = Observation(ident.replica_id, ident.pool_id, adapter.engine,
                                  ident.engine_version, ident.model, now, {ObsField.HEALTH: hv})
            else:
                obs = cur.with_fields({ObsField.HEALTH: hv})
            self._latest = MappingProxyType({**self._latest, ident.replica_id: obs})
            self._errors = MappingProxyType({**self._errors, ident.replica_id: reason})


@dataclass(frozen=True)
class PollerConfig:
    """interval_s between scrapes; fetch_timeout_s the longest a tick waits for fetch."""

    interval_s: float = 1.0
    fetch_timeout_s: float = 0.5
    unhealthy_after_failures: int = 3

    def __post_init__(self) -> None:
        for name in ("interval_s", "fetch_timeout_s"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float) or not (
                    math.isfinite(v) and v > 0):
                fail_field("PollerConfig", name, v, "must be a positive finite number")
        n = self.unhealthy_after_failures
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            fail_field("PollerConfig", "unhealthy_after_failures", n, "must be an integer >= 1")


class _FetchCall:
    """One fetch on a daemon thread (a hung fetch never blocks interpreter exit)."""

    def __init__(self, fetch: Fetch) -> None:
        self.done = threading.Event()
        self.text: str | None = None
        self.error: BaseException | None = None
        threading.Thread(target=self._run, args=(fetch,), daemon=True,
                         name="telemetry-fetch").start()

    def _run(self, fetch: Fetch) -> None:
        try:
            self.text = fetch()
        except BaseException as e:  # noqa: BLE001 - reported to the poller, never raised here
            self.error = e
        finally:
            self.done.set()


class TelemetryPoller:
    """Scrape one replica on a background thread into a `TelemetryStore`."""

    def __init__(self, adapter: PrometheusAdapter, fetch: Fetch, store: TelemetryStore,
                 config: PollerConfig | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.adapter = adapter
        self.store = store
        self.config = config or PollerConfig()
        self._fetch = fetch
        self._clock = clock
        self._inflight: _FetchCall | None = None
        self._failures = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def consecutive_failures(self) -> int:
        return self._failures

    def poll_once(self) -> bool:
        """One scrape; True when an observation was stored. Never raises."""
        try:
            return self._poll()
        except Exception as e:  # noqa: BLE001 - the poller must survive anything
            log.exception("telemetry poll of %s failed", self.adapter.identity.replica_id)
            self._fail(f"internal error: {e!r}")
            return False

    def _poll(self) -> bool:
        if self._inflight is not None and not self._inflight.done.is_set():
            self._fail("previous fetch still running")
            return False
        call = _FetchCall(self._fetch)
        if not call.done.wait(self.config.fetch_timeout_s):
            self._inflight = call
            self._fail(f"fetch timed out after {self.config.fetch_timeout_s}s")
            return False
        self._inflight = None
        if call.error is not None:
            self._fail(f"fetch failed: {call.error!r}")
            return False
        try:
            obs = self.adapter.observe(call.text, self._clock())
        except ValueError as e:  # ExpositionError, non-monotone clock
            self._fail(str(e))
            return False
        self.store.put(obs)
        self._failures = 0
        return True

    def _fail(self, reason: str) -> None:
        self._failures += 1
        health = (Health.UNHEALTHY if self._failures >= self.config.unhealthy_after_failures
                  else Health.UNKNOWN)
        log.warning("telemetry %s: %s", self.adapter.identity.replica_id, reason)
        self.store.record_failure(self.adapter, self._clock(), reason, health)

    # --- background thread --------------------------------------------------------------
    def start(self) -> TelemetryPoller:
        if self._thread is not None:
            raise RuntimeError("poller already started")
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, daemon=True,
                                        name=f"telemetry-{self.adapter.identity.replica_id}")
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.poll_once()
            self._stop.wait(self.config.interval_s)

    def stop(self, timeout_s: float = 2.0) -> None:
        """Stop polling; waits up to `timeout_s` (a hung fetch thread is left to die)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None

    def __enter__(self) -> TelemetryPoller:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def http_fetch(url: str, timeout_s: float = 2.0) -> Fetch:
    """A fetch callable that GETs `url` (e.g. http://host:8000/metrics) as UTF-8 text."""
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"url must be http(s), got {url!r}")

    def fetch() -> str:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:  # noqa: S310
            return resp.read().decode("utf-8")

    return fetch
