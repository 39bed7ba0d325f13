"""Energy-ranked serving policies and the grid-carbon signal they may weigh by.

Energy of one replica comes from its profile (hardware/profiles.py): P(n) the replica's
watts at batch n (logistic in log2 n, all its GPUs), dt(n, K) one iteration
with n sequences and K reserved KV tokens (decode; the prefill-chunk term is
left out). One iteration yields n tokens.

- Reference energy (`reference_j_per_token`): P(n) * dt(n, n * ctx) / n at a
  reference batch n = min(reference_batch, max_batch) and a reference context
  per sequence: the average joules per output token of a replica running there,
  idle share included. StaticEfficientPolicy ranks pools by it, once.
- Marginal energy (`marginal_j_per_token`): what one more sequence costs, per
  token it adds, from the replica's current state (batch n, K):

      [P(n+1) - P(n)] / [(n+1) / dt(n+1, K + k) - n / dt(n, K)]      (J / token)

  extra watts over extra tokens per second, k the new request's expected KV
  (hint, else prompt). Idle power is sunk (the router does not switch replicas
  off; a controller does), so an idle replica costs P(1) - P(0) for its first
  sequence. inf when the batch is full or throughput would not grow.

Carbon (`CarbonSignal`): a separate input, versioned and time-stamped: grid
intensity (gCO2/kWh) of one region valid over [valid_from_s, valid_until_s).
At a decision, a region's signal is the valid one with the highest version; an
expired or not-yet-valid signal is ignored. EnergyAwarePolicy multiplies each
candidate's marginal joules by its region's intensity (gCO2 per token) only
when every candidate replica's region has a valid signal; otherwise it ranks
by joules for that decision (`carbon_ignored` counts them): units never mix,
nothing is assumed for a region without a signal. Carbon only re-ranks the
eligible replicas the simulator offers, so it can never override residency.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from replaylab.config import fail_field
from replaylab.fleet.policies.common import Spread, expected_kv

J_PER_KWH = 3.6e6


class _Tables:
    """Power tables per profile, computed once (profiles are immutable)."""

    def __init__(self) -> None:
        self._t: dict[int, tuple] = {}

    def __call__(self, profile) -> list[float]:
        hit = self._t.get(id(profile))
        if hit is None or hit[0] is not profile:
            hit = self._t[id(profile)] = (profile, profile.power_table())
        return hit[1]


def marginal_j_per_token(profile, table: Sequence[float], n: int, kv_tokens: float,
                         extra_kv: float) -> float:
    """Joules per added token of one more sequence on a replica at batch n with kv_tokens."""
    if n < 0 or n + 1 > profile.max_batch:
        return math.inf
    dt1 = profile.iteration_s(n + 1, kv_tokens + extra_kv)
    thr0 = n / profile.iteration_s(n, kv_tokens) if n else 0.0
    d_thr = (n + 1) / dt1 - thr0
    if d_thr <= 0:
        return math.inf
    return (table[n + 1] - table[n]) / d_thr


def reference_j_per_token(profile, table: Sequence[float], batch: int = 16,
                          context_tokens: int = 1024) -> float:
    """Average joules per output token at batch min(batch, max_batch), context per sequence."""
    n = max(1, min(batch, profile.max_batch))
    return table[n] * profile.iteration_s(n, n * context_tokens) / n


@dataclass(frozen=True)
class CarbonSignal:
    """Grid carbon intensity of `region`, valid over [valid_from_s, valid_until_s) (sim seconds).

    version: a revision number; among signals valid at the same time for one
    region the highest version wins (a re-issued forecast supersedes the old one).
    """

    region: str
    intensity_g_per_kwh: float
    valid_from_s: float
    valid_until_s: float
    version: int

    def __post_init__(self) -> None:
        c = "CarbonSignal"
        if not isinstance(self.region, str) or not self.region:
            fail_field(c, "region", self.region, "must be a non-empty string")
        if not (math.isfinite(self.intensity_g_per_kwh) and self.intensity_g_per_kwh >= 0):
            fail_field(c, "intensity_g_per_kwh", self.intensity_g_per_kwh,
                       "must be finite and >= 0")
        if not (math.isfinite(self.valid_from_s) and self.valid_until_s > self.valid_from_s):
            fail_field(c, "valid_until_s", self.valid_until_s,
                       f"must be after a finite valid_from_s ({self.valid_from_s})")
        if isinstance(self.version, bool) or not isinstance(self.version, int) or self.version < 0:
            fail_field(c, "version", self.version, "must be an integer >= 0")

    def valid_at(self, now: float) -> bool:
        return self.valid_from_s <= now < self.valid_until_s


def _carbon_book(signals: Sequence[CarbonSignal]) -> dict[str, list[CarbonSignal]]:
    book: dict[str, list[CarbonSignal]] = defaultdict(list)
    for s in signals:
        if not isinstance(s, CarbonSignal):
            fail_field("EnergyAwarePolicy", "carbon", type(s).__name__,
                       "must be a sequence of CarbonSignal")
        book[s.region].append(s)
    for region, lst in book.items():
        lst.sort(key=lambda s: -s.version)
        for a, b in zip(lst, lst[1:], strict=False):
            if a.version == b.version and a.valid_from_s < b.valid_until_s \
                    and b.valid_from_s < a.valid_until_s and a != b:
                fail_field("EnergyAwarePolicy", "carbon", (region, a.version),
                           "two different signals of one version overlap in time")
    return dict(book)


class StaticEfficientPolicy:
    """Most efficient pool first (reference J/token), least-loaded within, spill when it is full.

    Pools among the eligible replicas are ranked by `reference_j_per_token` of
    their profile (ties: pool_id). The first pool with a replica that is not
    full takes the request, at its least-loaded such replica (ties spread). A
    replica is full at max_batch (running + queued) or when the request's
    expected KV (hint, else prompt) does not fit in its free KV. All full:
    least-loaded among every eligible replica (it queues).
    """

    def __init__(self, reference_batch: int = 16, context_tokens: int = 1024) -> None:
        c = "StaticEfficientPolicy"
        for name, v in (("reference_batch", reference_batch), ("context_tokens", context_tokens)):
            if not isinstance(v, int) or v < 1:
                fail_field(c, name, v, "must be an integer >= 1")
        self.reference_batch, self.context_tokens = reference_batch, context_tokens
        self._tables = _Tables()
        self._ref: dict[int, tuple] = {}
        self._spread = Spread()
        self.spills = 0

    def efficiency(self, profile) -> float:
        """Reference joules per output token of `profile` (cached)."""
        hit = self._ref.get(id(profile))
        if hit is None or hit[0] is not profile:
            e = reference_j_per_token(profile, self._tables(profile), self.reference_batch,
                                      self.context_tokens)
            hit = self._ref[id(profile)] = (profile, e)
        return hit[1]

    def admit(self, request, fleet, now):  # noqa: ARG002 - the Policy signature
        return None

    def choose(self, request, eligible, fleet, now):  # noqa: ARG002
        reps, load = fleet.replicas, fleet.load
        need = expected_kv(request)
        pools: dict[str, list[int]] = {}
        rank: dict[str, float] = {}
        for r in eligible:
            rep = reps[r]
            if rep.pool_id not in pools:
                pools[rep.pool_id] = []
                rank[rep.pool_id] = self.efficiency(rep.profile)
            if load[r] < rep.max_batch and rep.kv_used + need <= rep.kv_capacity:
                pools[rep.pool_id].append(r)
        order = sorted(pools, key=lambda p: (rank[p], p))
        for k, pool in enumerate(order):
            if pools[pool]:
                self.spills += k > 0
                return self._spread.least_loaded(pools[pool], load)
        return self._spread.least_loaded(eligible, load)


class EnergyAwarePolicy:
    """Lowest marginal energy (or carbon) per token among replicas below max_load, sticky per model.

    Candidates: eligible replicas with running + queued < max_load_per_replica
    (none: least-loaded among all eligible, counted in `saturated`). They are
    grouped into energy classes: same profile (by value) and same region, i.e.
    pools that cost the same per token. A class's score is
    `marginal_j_per_token` at its candidates' mean batch (running + queued,
    linear between integer batches), context per sequence = its reserved KV /
    running, k = the request's expected KV (hint, else prompt); with carbon,
    times the region's intensity (gCO2 per token). Classes that score the same
    go by label ('profile-name@region'), never by the order the fleet lists them.

    Hysteresis (per model): the class chosen last time keeps the request while
    its score is within `hysteresis` (relative) of the best class's; only one
    better by more takes over (a flip, `flips[model]`). If the preferred class
    has no candidate left (all its replicas at max_load) the request spills to
    the best class and the preference stays (`spills`); if it has no eligible
    replica at all (drained, off) the preference moves (`forced_flips` too).
    Within the class: the candidate with the lowest marginal at its own batch,
    ties spread.
    """

    def __init__(self, max_load_per_replica: int = 8, hysteresis: float = 0.1,
                 carbon: Sequence[CarbonSignal] = ()) -> None:
        c = "EnergyAwarePolicy"
        if not isinstance(max_load_per_replica, int) or max_load_per_replica < 1:
            fail_field(c, "max_load_per_replica", max_load_per_replica, "must be an integer >= 1")
        if not (isinstance(hysteresis, int | float) and math.isfinite(hysteresis)
                and hysteresis >= 0):
            fail_field(c, "hysteresis", hysteresis, "must be finite and >= 0")
        self.max_load, self.hysteresis = max_load_per_replica, float(hysteresis)
        self._carbon = _carbon_book(tuple(carbon))
        self._tables = _Tables()
        self._spread = Spread()
        self._canon: dict[int, tuple] = {}        # id(profile) -> (profile, canonical index)
        self._by_value: dict = {}                 # profile -> canonical index
        self._classes: dict[tuple, int] = {}      # (canonical profile, region) -> class id
        self._labels: list[str] = []
        self._pref: dict[str, int] = {}
        self.flips: Counter = Counter()
        self.forced_flips: Counter = Counter()
        self.decisions: Counter = Counter()
        self.saturated = self.spills = self.carbon_used = self.carbon_ignored = 0

    def flips_per_1000(self, model: str | None = None) -> float:
        """Preferred-class flips per 1,000 decisions (one model, or all)."""
        f = self.flips[model] if model else sum(self.flips.values())
        d = self.decisions[model] if model else sum(self.decisions.values())
        return 1000.0 * f / d if d else 0.0

    def preferred(self, model: str) -> str | None:
        """The preferred energy class of `model` as 'profile-name@region', None before any."""
        k = self._pref.get(model)
        return None if k is None else self._labels[k]

    def intensity(self, region: str | None, now: float) -> float | None:
        """gCO2/kWh of `region` at `now` from the valid signal of highest version, else None."""
        for s in self._carbon.get(region, ()) if region is not None else ():
            if s.valid_at(now):
                return s.intensity_g_per_kwh
        return None

    def _class_of(self, rep) -> int:
        prof = rep.profile
        hit = self._canon.get(id(prof))
        if hit is None or hit[0] is not prof:
            hit = self._canon[id(prof)] = (prof, self._by_value.setdefault(prof, len(self._by_value)))
        key = (hit[1], rep.region)
        k = self._classes.get(key)
        if k is None:
            k = self._classes[key] = len(self._labels)
            self._labels.append(f"{prof.name}@{rep.region}")
        return k

    def _replica_score(self, rep, load: int, extra: float) -> float:
        n = min(load, rep.max_batch)
        run = rep.running
        kv = rep.kv_used * (n / run) if run else 0.0
        return marginal_j_per_token(rep.profile, self._tables(rep.profile), n, kv, extra)

    def _class_score(self, rs: list[int], reps, load, extra: float) -> float:
        prof = reps[rs[0]].profile
        table = self._tables(prof)
        nbar = sum(min(load[r], prof.max_batch) for r in rs) / len(rs)
        run = sum(reps[r].running for r in rs)
        ctx = sum(reps[r].kv_used for r in rs) / run if run else 0.0
        lo = int(nbar)
        m0 = marginal_j_per_token(prof, table, lo, lo * ctx, extra)
        frac = nbar - lo
        if not frac:
            return m0
        m1 = marginal_j_per_token(prof, table, lo + 1, (lo + 1) * ctx, extra)
        return m0 + frac * (m1 - m0) if math.isfinite(m1) else m0

    def admit(self, request, fleet, now):  # noqa: ARG002 - the Policy signature
        return None

    def choose(self, request, eligible, fleet, now):
        reps, load, cap = fleet.replicas, fleet.load, self.max_load
        model = request.model
        self.decisions[model] += 1
        cands = [r for r in eligible if load[r] < cap]
        if not cands:
            self.saturated += 1
            return self._spread.least_loaded(eligible, load)
        extra = expected_kv(request)
        groups: dict[int, list[int]] = {}
        for r in cands:
            groups.setdefault(self._class_of(reps[r]), []).append(r)
        score = {k: self._class_score(rs, reps, load, extra) for k, rs in groups.items()}
        if self._carbon:
            w = {k: self.intensity(reps[rs[0]].region, now) for k, rs in groups.items()}
            if all(v is not None for v in w.values()):
                score = {k: s * w[k] / J_PER_KWH for k, s in score.items()}
                self.carbon_used += 1
            else:
                self.carbon_ignored += 1
        # ties: by class label (profile@region), not by the order classes were first seen
        best_k = min(score, key=lambda k: (score[k], self._labels[k], k))
        best = score[best_k]
        if math.isinf(best):  # every candidate's batch is full: nothing to rank by energy
            self.saturated += 1
            return self._spread.least_loaded(cands, load)
        k = best_k
        prev = self._pref.get(model)
        if prev is None or prev == best_k:
            self._pref[model] = best_k
        elif prev in score:
            if score[prev] - best <= self.hysteresis * abs(best):
                k = prev  # within the band: stay
            else:
                self.flips[model] += 1
                self._pref[model] = best_k
        elif any(self._class_of(reps[r]) == prev for r in eligible):
            self.spills += 1  # the preferred class is full: spill, keep the preference
        else:
            self.flips[model] += 1  # the preferred class is gone (drained, off): move on
            self.forced_flips[model] += 1
            self._pref[model] = best_k
        members = groups[k]
        return self._spread.pick(members, [self._replica_score(reps[r], load[r], extra)
                                           for r in members])
