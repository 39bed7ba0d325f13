"""Online recalibration of the demand interval from acknowledged actuals (standard library + math).

The artifact freezes one conformal correction Q0 per cell (`calibration.corrections`,
the global one for other cells) on the model scale g (log1p of output tokens by
default). Between retrains the runtime keeps, per cell c, an adaptive correction
q_c updated from the actuals of requests that have ended (docs/design/online-recalibration.md):

    err_t = 1 if the actual fell outside the SERVED [hint_lo, hint_hi], else 0
    q_c  <- clip(q_c + step * (err_t - alpha),  floor_c,  ceiling_c)      alpha = 1 - level

the quantile tracker of adaptive conformal inference (Gibbs & Candes 2021, ACI,
in the form of Angelopoulos, Candes & Tibshirani 2023, "Conformal PID control",
eq. 1): a miss widens the band by step * (1 - alpha), a cover narrows it by
step * alpha, so one update moves q by at most step * max(alpha, 1 - alpha), and
over T updates the served miscoverage is within (ceiling - floor + step) / (step T)
of alpha while the clip does not bind. floor_c = Q0_c - max_narrowing and
ceiling_c = Q0_c + max_widening (model-scale units): the band is never narrower
than the exported one narrowed by `max_narrowing` on each side.

Censoring: a lower-bound actual (cap hit, cancelled, failed) only proves a miss,
when it is above hint_hi; then err = 1. Otherwise it says nothing: no update,
counted as `lower_bound_skipped`.

Versions: each cell's correction carries a counter, +1 every time its value
changes (0 = the exported value). A hint records (cell, correction, version).

Drift: per cell, two ring buffers of the last `window` exact (uncensored)
outcomes: covered by the frozen band (Q0) and by the served band. Their rolling
coverage k / n is checked against the `band` (99%) acceptance region of
Binomial(n, level): frozen coverage outside it means the exported calibration no
longer holds (`retrain`); served coverage below it means even the adapted band
under-covers (`fallback`); served coverage above it (the floor binds) is
`retrain` too. Evaluated once the window is full.

Thread safety: one lock around every update; readers take a snapshot tuple
(correction, version) that updates replace whole (a reference read is atomic),
so the hint path takes no lock. Memory: one state per exported cell plus the
global one, each with two bytearrays of `window` bytes: fixed at construction.

Why by hand: the update is three lines on Python floats; MAPIE's online
(`MapieTimeSeriesRegressor.adapt_conformal_inference`) refits a numpy array per
call and is not part of the runtime's dependencies.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from types import MappingProxyType
from typing import Any

GLOBAL_CELL = "<global>"  # the state shared by cells without their own exported correction
OK, RETRAIN, FALLBACK = "ok", "retrain", "fallback"
DRIFT_STATES = (OK, RETRAIN, FALLBACK)
_SEVERITY = {OK: 0, RETRAIN: 1, FALLBACK: 2}


@dataclass(frozen=True)
class OnlineConfig:
    """Online recalibration settings (model-scale units: log1p of output tokens by default).

    enabled: False serves the exported (frozen) correction, exactly as before;
    step: the tracker's learning rate (one update moves q by at most
    step * max(alpha, 1 - alpha)); max_narrowing / max_widening: floor = Q0 -
    max_narrowing, ceiling = Q0 + max_widening; window: exact outcomes in the drift
    detector's rolling window; band: mass of its binomial acceptance region.
    The defaults suit the log1p scale; a linear-scale artifact needs them in tokens.
    """

    enabled: bool = True
    step: float = 0.005
    max_narrowing: float = 0.15
    max_widening: float = 1.0
    window: int = 500
    band: float = 0.99

    def __post_init__(self) -> None:
        def bad(name: str, why: str) -> None:
            raise ValueError(f"OnlineConfig.{name}={getattr(self, name)!r}: {why}")

        if not isinstance(self.enabled, bool):
            bad("enabled", "must be a bool")
        for name in ("step", "max_narrowing", "max_widening"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) \
                    or v < 0:
                bad(name, "must be a finite number >= 0")
        if not self.step > 0:
            bad("step", "must be > 0")
        if isinstance(self.window, bool) or not isinstance(self.window, int) or \
                not 10 <= self.window <= 1_000_000:
            bad("window", "must be an int in [10, 1000000]")
        if not isinstance(self.band, int | float) or not 0.5 < self.band < 1.0:
            bad("band", "must be in (0.5, 1)")

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any] | None) -> OnlineConfig:
        """From a config mapping (unknown keys are an error naming them)."""
        values = dict(values or {})
        unknown = set(values) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"online: unknown keys {sorted(unknown)}")
        return cls(**values)

    def to_dict(self) -> dict:
        return asdict(self)


def binomial_band(n: int, p: float, mass: float) -> tuple[int, int]:
    """(k_lo, k_hi): the central acceptance region of Binomial(n, p) with >= `mass` inside.

    k_lo is the largest k with P(X < k) <= (1 - mass) / 2, k_hi the smallest k with
    P(X > k) <= (1 - mass) / 2 (exact pmf from lgamma; computed once per detector).
    """
    tail = (1.0 - mass) / 2.0
    lp, lq = math.log(p), math.log1p(-p)
    pmf = [math.exp(math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)
                    + k * lp + (n - k) * lq) for k in range(n + 1)]
    below, k_lo = 0.0, 0
    for k in range(n + 1):
        if below + pmf[k] > tail:
            k_lo = k
            break
        below += pmf[k]
    above, k_hi = 0.0, n
    for k in range(n, -1, -1):
        if above + pmf[k] > tail:
            k_hi = k
            break
        above += pmf[k]
    return k_lo, k_hi


class _Window:
    """A fixed-size ring buffer of 0/1 outcomes with its running sum."""

    __slots__ = ("buf", "n", "pos", "full", "hits")

    def __init__(self, n: int) -> None:
        self.buf, self.n, self.pos, self.full, self.hits = bytearray(n), n, 0, False, 0

    def push(self, hit: int) -> None:
        old = self.buf[self.pos]
        self.buf[self.pos] = hit
        self.hits += hit - old  # an empty slot holds 0
        self.pos += 1
        if self.pos == self.n:
            self.pos, self.full = 0, True

    def size(self) -> int:
        return self.n if self.full else self.pos


class _Cell:
    """One cell's adaptive correction, counters and drift windows (guarded by the owner's lock)."""

    __slots__ = ("exported", "floor", "ceiling", "q", "version", "updates", "misses",
                 "lower_bound_skipped", "frozen", "served", "drift", "alarms")

    def __init__(self, exported: float, cfg: OnlineConfig) -> None:
        self.exported = exported
        self.floor = exported - cfg.max_narrowing
        self.ceiling = exported + cfg.max_widening
        self.q, self.version = exported, 0
        self.updates = self.misses = self.lower_bound_skipped = self.alarms = 0
        self.frozen, self.served = _Window(cfg.window), _Window(cfg.window)
        self.drift = OK


class OnlineConformal:
    """Per-cell adaptive conformal corrections from acknowledged actuals (see module docstring).

    corrections: the exported per-cell corrections (None: unbounded, the runtime
    falls back for that cell and nothing adapts); global_correction: the others';
    level: the interval's nominal coverage.
    """

    def __init__(self, corrections: Mapping[str, float | None], global_correction: float | None,
                 level: float, config: OnlineConfig | None = None) -> None:
        self.config = config or OnlineConfig()
        self.level = float(level)
        self.alpha = 1.0 - self.level
        cfg = self.config
        self._up = cfg.step * (1.0 - self.alpha)  # a miss widens by this much
        self._down = cfg.step * self.alpha  # a cover narrows by this much
        exported = {k: v for k, v in corrections.items() if v is not None and math.isfinite(v)}
        if global_correction is not None and math.isfinite(global_correction):
            exported[GLOBAL_CELL] = float(global_correction)
        self._cells = {k: _Cell(float(v), cfg) for k, v in exported.items()}
        # what the hint path reads without a lock: cell -> (correction, version)
        self._snapshot = {k: (c.q, 0) for k, c in self._cells.items()}
        self._k_lo, self._k_hi = binomial_band(cfg.window, self.level, cfg.band)
        self._lock = threading.Lock()
        self.ignored = 0  # acknowledgements of unknown cells or unreadable actuals

    @property
    def enabled(self) -> bool:
        return self.config.enabled

    @property
    def cells(self) -> Mapping[str, _Cell]:
        """Each cell's live state, read-only (`state()` is its JSON summary)."""
        return MappingProxyType(self._cells)

    def current(self, cell: str) -> tuple[float, int] | None:
        """(correction, version) the next hint of `cell` uses; None for a cell without state."""
        return self._snapshot.get(cell)

    def update(self, cell: str | None, lo: float, hi: float, frozen_lo: float, frozen_hi: float,
               actual_total: float, lower_bound: bool = False) -> bool:
        """Feed one ended request's actual total back; True when it was used.

        lo / hi: the served interval; frozen_lo / frozen_hi: the exported
        correction's interval for the same request (the drift detector's
        reference); lower_bound: the actual is censored. Disabled: counts only.
        """
        state = self._cells.get(cell) if cell is not None else None
        y = actual_total
        if state is None or y is None or y != y:  # NaN: usage absent
            with self._lock:
                self.ignored += 1
            return False
        with self._lock:
            if lower_bound:
                if y <= hi:  # a lower bound inside the band proves nothing
                    state.lower_bound_skipped += 1
                    return False
                err = 1  # even a lower bound above hi proves a miss
            else:
                err = 0 if lo <= y <= hi else 1
                state.served.push(1 - err)
                state.frozen.push(1 if frozen_lo <= y <= frozen_hi else 0)
                self._check_drift(state)
            state.updates += 1
            state.misses += err
            if not self.config.enabled:
                return True
            q = state.q + (self._up if err else -self._down)
            q = min(max(q, state.floor), state.ceiling)
            if q != state.q:
                state.q, state.version = q, state.version + 1
                self._snapshot[cell] = (q, state.version)
            return True

    def _check_drift(self, s: _Cell) -> None:
        if not s.served.full:
            return
        lo, hi = self._k_lo, self._k_hi
        if s.served.hits < lo:
            new = FALLBACK
        elif not lo <= s.frozen.hits <= hi or s.served.hits > hi:
            new = RETRAIN
        else:
            new = OK
        if new != OK and _SEVERITY[new] > _SEVERITY[s.drift]:
            s.alarms += 1
        s.drift = new

    def drift(self, cell: str | None = None) -> str:
        """The drift flag of one cell, or the worst over all cells."""
        if cell is not None:
            s = self._cells.get(cell)
            return OK if s is None else s.drift
        return max((s.drift for s in self._cells.values()), key=_SEVERITY.get, default=OK)

    def state(self) -> dict:
        """A consistent snapshot for the serving log: config, band, per-cell figures, drift."""
        with self._lock:
            cells = {}
            for k, s in self._cells.items():
                n = s.served.size()
                cells[k] = {
                    "exported": s.exported, "correction": s.q, "floor": s.floor,
                    "ceiling": s.ceiling, "version": s.version, "updates": s.updates,
                    "misses": s.misses, "lower_bound_skipped": s.lower_bound_skipped,
                    "window_rows": n,
                    "coverage_served": s.served.hits / n if n else None,
                    "coverage_frozen": s.frozen.hits / n if n else None,
                    "drift": s.drift, "alarms": s.alarms}
            n = self.config.window
            return {"enabled": self.config.enabled, "config": self.config.to_dict(),
                    "level": self.level,
                    "band": {"window": n, "k_lo": self._k_lo, "k_hi": self._k_hi,
                             "coverage_lo": self._k_lo / n, "coverage_hi": self._k_hi / n},
                    "cells": cells, "ignored": self.ignored,
                    "updates": sum(c["updates"] for c in cells.values()),
                    "drift": max((c["drift"] for c in cells.values()), key=_SEVERITY.get,
                                 default=OK),
                    "alarms": sum(c["alarms"] for c in cells.values())}

    def fresh(self, config: OnlineConfig | None = None) -> OnlineConformal:
        """A new tracker from the same exported corrections (state back to version 0)."""
        corr = {k: c.exported for k, c in self._cells.items() if k != GLOBAL_CELL}
        glob = self._cells.get(GLOBAL_CELL)
        return OnlineConformal(corr, None if glob is None else glob.exported, self.level,
                               config or self.config)
