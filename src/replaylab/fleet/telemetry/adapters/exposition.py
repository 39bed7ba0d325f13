"""Prometheus text exposition: parsing and the arithmetic adapters share.

`parse_exposition` uses the maintained parser
`prometheus_client.parser.text_string_to_metric_families` (imported lazily, so this
module imports with the standard library alone) and flattens samples to
`name -> [(labels, value)]`. Counters are looked up as `name` and `name_total`:
exporters and the parser disagree on the suffix (Triton writes
`nv_energy_consumption`; the parser renames it `nv_energy_consumption_total`).

`histogram_quantile` follows PromQL: the bucket holding rank q*N is found and the
quantile interpolated linearly between its lower bound (0 for the first bucket)
and upper bound; a rank in the +Inf bucket returns the largest finite bound.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

Labels = tuple[tuple[str, str], ...]  # sorted (name, value) pairs


class ExpositionError(ValueError):
    """The scrape is not valid Prometheus text exposition (message says where)."""


@dataclass(frozen=True)
class Scrape:
    """Flattened samples of one exposition: sample name -> [(labels, value)]."""

    samples: Mapping[str, tuple[tuple[Labels, float], ...]]

    def series(self, names: Sequence[str], select: Mapping[str, str],
               label_filter: Mapping[str, str], counter: bool = False
               ) -> tuple[str, list[tuple[Labels, float]]] | None:
        """(name found, matching series) for the first of `names` present, else None."""
        for name in names:
            for candidate in ((name, name + "_total") if counter else (name,)):
                # a series with the selected labels must exist for the metric to count as
                # present; the label filter (which replica/model) may then leave none
                rows = [(lb, v) for lb, v in self.samples.get(candidate, ())
                        if matches_labels(lb, select, {})]
                if rows:
                    return candidate, [(lb, v) for lb, v in rows
                                       if matches_labels(lb, {}, label_filter)]
        return None

    def has_any(self, names: Sequence[str]) -> bool:
        return any(n in self.samples or n + "_total" in self.samples
                   or n + "_bucket" in self.samples for n in names)


def matches_labels(labels: Labels, select: Mapping[str, str],
                   label_filter: Mapping[str, str]) -> bool:
    """True when every `select` label equals its value and every `label_filter` label the
    series has equals its value."""
    d = dict(labels)
    if any(d.get(k) != v for k, v in select.items()):
        return False
    # the filter pins a label only where the series has it (GPU series carry no model label)
    return all(d[k] == v for k, v in label_filter.items() if k in d)


def parse_exposition(text: str) -> Scrape:
    """Parse Prometheus text exposition with prometheus_client's parser; ExpositionError if bad."""
    from prometheus_client.parser import text_string_to_metric_families

    if not isinstance(text, str):
        raise ExpositionError(f"exposition must be text, got {type(text).__name__}")
    samples: dict[str, list[tuple[Labels, float]]] = defaultdict(list)
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                samples[s.name].append((tuple(sorted(s.labels.items())), float(s.value)))
    except Exception as e:  # the parser raises ValueError, IndexError, ... on bad lines
        raise ExpositionError(f"malformed Prometheus exposition: {e}") from e
    return Scrape(MappingProxyType({k: tuple(v) for k, v in samples.items()}))


def histogram_quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float | None:
    """PromQL-style quantile of cumulative `buckets` [(le, count)] sorted by le, ending at +Inf.

    None when there are no observations or no +Inf bucket. Counts are made
    monotone (running max) as Prometheus does for scrape races.
    """
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile must be in [0, 1], got {q!r}")
    if len(buckets) < 2 or not math.isinf(buckets[-1][0]):
        return None
    les = [b[0] for b in buckets]
    counts, run = [], 0.0
    for _, c in buckets:
        run = max(run, c)
        counts.append(run)
    total = counts[-1]
    if total <= 0:
        return None
    rank = q * total
    i = next(k for k, c in enumerate(counts) if c >= rank)
    if i == len(buckets) - 1:
        return les[-2]  # rank falls in the +Inf bucket: the largest finite bound
    upper = les[i]
    lower = 0.0 if i == 0 else les[i - 1]
    if i == 0 and upper <= 0:
        return upper
    below = 0.0 if i == 0 else counts[i - 1]
    in_bucket = counts[i] - below
    if in_bucket <= 0:
        return upper
    return lower + (upper - lower) * (rank - below) / in_bucket


def selector_text(select: Mapping[str, str]) -> str:
    """`{k="v",...}` for origins, "" for no selector."""
    return "{" + ",".join(f'{k}="{v}"' for k, v in sorted(select.items())) + "}" if select else ""


def counter_sum(scrape: Scrape, names: Sequence[str], select: Mapping[str, str],
                label_filter: Mapping[str, str]) -> tuple[str, dict[Labels, float]] | None:
    """(name found, {series labels: value}) of the first counter of `names` present."""
    found = scrape.series(names, select, label_filter, counter=True)
    if found is None:
        return None
    return found[0], {lb: v for lb, v in found[1] if math.isfinite(v)}


def counter_delta(cur: tuple[str, dict[Labels, float]] | None,
                  prev: tuple[str, dict[Labels, float]] | None) -> float | None:
    """Sum of per-series deltas; None on a reset, a renamed metric or a changed series set."""
    if cur is None or prev is None or cur[0] != prev[0] or set(cur[1]) != set(prev[1]):
        return None
    deltas = [cur[1][lb] - prev[1][lb] for lb in cur[1]]
    if any(d < 0 for d in deltas):
        return None
    return sum(deltas)


@dataclass(frozen=True)
class HistogramSeries:
    """One histogram series (labels without `le`): cumulative buckets {le: count}, sum, count."""

    buckets: Mapping[float, float]
    total: float
    count: float


def histogram_series(scrape: Scrape, names: Sequence[str], select: Mapping[str, str],
                     label_filter: Mapping[str, str]
                     ) -> tuple[str, dict[Labels, HistogramSeries]] | None:
    """(name, {series labels: HistogramSeries}) of the first of `names` with buckets, else None."""
    for name in names:
        rows = [(lb, v) for lb, v in scrape.samples.get(name + "_bucket", ())
                if "le" in dict(lb) and matches_labels(lb, select, {})]
        if not rows:
            continue
        buckets: dict[Labels, dict[float, float]] = defaultdict(dict)
        for labels, v in rows:
            if matches_labels(labels, {}, label_filter):
                key = tuple(kv for kv in labels if kv[0] != "le")
                buckets[key][float(dict(labels)["le"])] = v
        sums = dict(scrape.samples.get(name + "_sum", ()))
        counts = dict(scrape.samples.get(name + "_count", ()))
        out = {key: HistogramSeries(MappingProxyType(b), sums.get(key, 0.0),
                                    counts.get(key, b.get(math.inf, 0.0)))
               for key, b in buckets.items()}
        return name, out
    return None


def histogram_window(cur: Mapping[Labels, HistogramSeries],
                     prev: Mapping[Labels, HistogramSeries] | None
                     ) -> tuple[list[tuple[float, float]], float, float] | None:
    """Summed cumulative buckets [(le, count)], sum and count: of `cur` alone (prev None) or of
    the per-series difference cur - prev. None when a series reset (any decrease), the
    series set or the bucket bounds changed, or the bounds differ between series."""
    if prev is not None and set(prev) != set(cur):
        return None
    bounds = None
    summed: dict[float, float] = defaultdict(float)
    total = count = 0.0
    for key, s in cur.items():
        if bounds is None:
            bounds = set(s.buckets)
        if set(s.buckets) != bounds:
            return None
        b, t, c = dict(s.buckets), s.total, s.count
        if prev is not None:
            p = prev[key]
            if set(p.buckets) != bounds:
                return None
            b = {le: v - p.buckets[le] for le, v in b.items()}
            t, c = t - p.total, c - p.count
            if c < 0 or any(v < 0 for v in b.values()):
                return None
        for le, v in b.items():
            summed[le] += v
        total += t
        count += c
    return sorted(summed.items()), total, count
