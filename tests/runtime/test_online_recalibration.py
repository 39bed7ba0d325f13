"""Online recalibration (replaylab.runtime.online) and the time-ordered replay that feeds it.

Tiny seeded data, no model training: the tracker is exercised directly, and the
replay with a recording stand-in predictor over a seeded synthetic ledger.
"""

from __future__ import annotations

import math
import threading

import numpy as np
import pytest

from replaylab.contracts import validate_ledger
from replaylab.contracts.hints import HINT_VERSION, DemandHint
from replaylab.hints.replay import feedback_end_ms, replay_hints
from replaylab.runtime.online import (
    FALLBACK,
    GLOBAL_CELL,
    OK,
    RETRAIN,
    OnlineConfig,
    OnlineConformal,
    binomial_band,
)
from replaylab.sources.synthetic import SyntheticLedgerConfig, generate_synthetic_ledger

Q0 = {"a": 0.10, "b": -0.05}


def _tracker(**kw) -> OnlineConformal:
    return OnlineConformal(Q0, 0.02, 0.8, OnlineConfig(**kw))


def test_binomial_band_holds_its_mass():
    k_lo, k_hi = binomial_band(500, 0.8, 0.99)
    rng = np.random.default_rng(0)
    k = rng.binomial(500, 0.8, 200_000)
    inside = np.mean((k >= k_lo) & (k <= k_hi))
    assert 0.99 <= inside <= 0.995
    assert 0.74 < k_lo / 500 < 0.8 < k_hi / 500 < 0.86


def test_one_update_moves_at_most_the_step_and_never_below_the_floor():
    t = _tracker(step=0.01, max_narrowing=0.05)
    bound = 0.01 * 0.8 + 1e-15
    q = t.current("a")[0]
    for _ in range(3000):  # covers only: q walks down to the floor and stays
        t.update("a", 0.0, 10.0, 0.0, 10.0, 5.0)
        q2 = t.current("a")[0]
        assert abs(q2 - q) <= bound and q2 >= Q0["a"] - 0.05 - 1e-12
        q = q2
    assert q == pytest.approx(Q0["a"] - 0.05)
    v_floor = t.current("a")[1]
    t.update("a", 0.0, 10.0, 0.0, 10.0, 5.0)  # clipped: value and version unchanged
    assert t.current("a") == (q, v_floor)
    t.update("a", 0.0, 10.0, 0.0, 10.0, 50.0)  # a miss widens by step * (1 - alpha)
    assert t.current("a") == (pytest.approx(q + 0.008), v_floor + 1)


def test_lower_bound_actuals_only_prove_misses():
    t = _tracker()
    t.update("a", 0.0, 10.0, 0.0, 10.0, 5.0, lower_bound=True)  # inside: says nothing
    assert t.current("a") == (Q0["a"], 0)
    assert t.state()["cells"]["a"]["lower_bound_skipped"] == 1
    t.update("a", 0.0, 10.0, 0.0, 10.0, 11.0, lower_bound=True)  # above hi: a proven miss
    assert t.current("a")[0] > Q0["a"]
    s = t.state()["cells"]["a"]
    assert s["misses"] == 1 and s["window_rows"] == 0  # never an exact outcome in the window


def test_unknown_cells_and_absent_usage_are_ignored():
    t = _tracker()
    assert not t.update("zzz", 0, 1, 0, 1, 0.5)
    assert not t.update("a", 0, 1, 0, 1, math.nan)
    assert t.state()["ignored"] == 2 and t.current(GLOBAL_CELL) == (0.02, 0)


def test_off_switch_keeps_the_exported_corrections():
    t = _tracker(enabled=False)
    rng = np.random.default_rng(1)
    for y in rng.uniform(-5, 15, 2000):
        t.update("a", 0.0, 10.0, 0.0, 10.0, float(y))
    assert t.current("a") == (Q0["a"], 0) and t.state()["updates"] == 2000


def test_many_threads_conserve_counts_and_memory_stays_fixed():
    t = _tracker(window=200)
    buffers = {k: (len(c.served.buf), len(c.frozen.buf)) for k, c in t.cells.items()}
    errors = []

    def work(seed: int) -> None:
        rng = np.random.default_rng(seed)
        try:
            for y in rng.uniform(-2, 12, 12_500):
                t.update("a" if y > 5 else "b", 0.0, 10.0, 0.0, 10.0, float(y))
                t.current("a")
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors
    s = t.state()
    assert s["updates"] == 100_000
    for k in ("a", "b"):
        c = s["cells"][k]
        assert c["window_rows"] == 200
        assert t.cells[k].served.hits == sum(t.cells[k].served.buf)  # running sum consistent
        assert c["version"] <= c["updates"]
    assert {k: (len(c.served.buf), len(c.frozen.buf)) for k, c in t.cells.items()} == buffers


def _simulate(t: OnlineConformal, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Base band [-1, 1] on the model scale; noise sd 0.78 then 1.3 after n/2 (a shift)."""
    rng = np.random.default_rng(seed)
    sd = np.where(np.arange(n) < n // 2, 0.78, 1.3)
    y = rng.normal(0, sd)
    served, frozen = np.empty(n, bool), np.empty(n, bool)
    for i in range(n):
        q = t.current(GLOBAL_CELL)[0]
        lo, hi, flo, fhi = -1 - q, 1 + q, -1 - 0.02, 1 + 0.02
        served[i], frozen[i] = lo <= y[i] <= hi, flo <= y[i] <= fhi
        t.update(GLOBAL_CELL, lo, hi, flo, fhi, float(y[i]))
    return served, frozen


def test_coverage_recovers_to_the_band_after_a_shift_and_drift_is_flagged():
    t = OnlineConformal({}, 0.02, 0.8, OnlineConfig(step=0.02, max_widening=2.0))
    served, frozen = _simulate(t, 12_000, seed=3)
    tail = slice(9_000, 12_000)
    assert frozen[tail].mean() < 0.6  # the frozen band no longer covers
    assert 0.77 <= served[tail].mean() <= 0.83
    assert t.drift(GLOBAL_CELL) == RETRAIN  # frozen out of band, served inside
    assert t.state()["alarms"] >= 1


def test_served_under_coverage_flags_fallback():
    t = OnlineConformal({}, 0.02, 0.8, OnlineConfig(max_widening=0.0, window=100))
    for _ in range(100):
        t.update(GLOBAL_CELL, 0.0, 1.0, 0.0, 1.0, 5.0)
    assert t.drift() == FALLBACK
    assert _tracker().drift() == OK


# ---------------------------------------------------------------- the time-ordered replay
class _Recording:
    """A stand-in predictor: one cell; records which actuals it had received at each hint."""

    loaded = True
    version = "test"

    def __init__(self) -> None:
        self.acked: list[str] = []
        self.seen: dict[str, set[str]] = {}
        self.online_config = OnlineConfig()

    def with_fresh_online(self, online=None):
        return self

    def predict(self, request):
        rid = request["request_id"]
        self.seen[rid] = set(self.acked)
        # the interval widens with every actual received: using one changes the hint
        w = float(len(self.acked))
        return DemandHint(HINT_VERSION, self.version, 100.0, 150.0, 50.0, 200.0 + w, 0.8, 0,
                          False, None, rid, "*", w, len(self.acked), 50.0, 200.0)

    def acknowledge(self, hint, y, lower):
        self.acked.append(hint.request_id)
        return True

    def online_drift(self, cell):
        return OK

    def online_state(self):
        return {"acked": len(self.acked)}


def test_the_replay_never_uses_an_actual_of_a_request_still_in_flight():
    raw = generate_synthetic_ledger(SyntheticLedgerConfig(n_sessions=60, sessions_per_s=2.0),
                                    seed=5)
    ledger = validate_ledger(raw, source="test").valid
    p = _Recording()
    out = replay_hints(ledger, p)
    rows = {r["request_id"]: r for r in ledger.to_dict("records")}
    end = {k: feedback_end_ms(r, None)[0] for k, r in rows.items()}
    in_flight_somewhere = 0
    for rid, seen in p.seen.items():
        t = int(rows[rid]["timestamp"])
        for other in seen:
            assert end[other] is not None and end[other] <= t  # ended before this dispatch
        running = [o for o, e in end.items() if o != rid and e is not None
                   and int(rows[o]["timestamp"]) <= t < e]
        in_flight_somewhere += bool(running)
        assert not set(running) & seen
    assert in_flight_somewhere > 0  # the case exists: some request was running at a dispatch
    # and a used actual changes the hint, so a leak would have shown in hint_hi
    got = out.set_index("request_id")["hint_hi"]
    assert all(got[rid] == 200.0 + len(seen) for rid, seen in p.seen.items())
    assert out.attrs["online_state"]["acked"] == len(p.acked) > 0
