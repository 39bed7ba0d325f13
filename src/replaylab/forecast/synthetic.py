"""Seeded seasonal Poisson aggregates: the forecast tests' and benchmark's data.

Series i has a daily profile (a smooth peak in the afternoon, UTC), a weekly
weekday/weekend factor and Poisson counts around it; volume grows with i. Modeled,
not measured: the real-data runs use ServeGen and Azure (docs/results/forecast.md).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from replaylab.contracts import AGGREGATES_VERSION
from replaylab.contracts.columns import Aggregates as A

DAY_S = 86_400


def seasonal_poisson_aggregates(n_series: int = 10, days: float = 14.0,
                                bucket_seconds: int = 600, base_rate: float = 40.0,
                                weekend_factor: float = 0.7, seed: int = 0,
                                origin_ms: int = 1_700_006_400_000) -> pd.DataFrame:
    """aggregates-v1 rows: `n_series` series x `days` of `bucket_seconds` buckets.

    base_rate: mean requests per bucket of series 0 (series i: (1 + i) x that);
    weekend_factor: Saturday and Sunday volume relative to weekdays (1: no weekly
    season). origin_ms defaults to 2023-11-15 00:00 UTC (a Wednesday).
    """
    rng = np.random.default_rng(seed)
    n = int(round(days * DAY_S / bucket_seconds))
    t_s = np.arange(n) * bucket_seconds + origin_ms // 1000
    day_phase = 2 * np.pi * (t_s % DAY_S) / DAY_S
    dow = (t_s // DAY_S + 3) % 7
    daily = 1.0 + 0.6 * np.sin(day_phase - np.pi / 2 - 0.5)
    weekly = np.where(dow >= 5, weekend_factor, 1.0)
    frames = []
    for i in range(n_series):
        lam = base_rate * (1 + i) * daily * weekly * rng.uniform(0.9, 1.1)
        frames.append(pd.DataFrame({
            A.VERSION: AGGREGATES_VERSION,
            A.BUCKET_START: t_s * 1000, A.BUCKET_SECONDS: bucket_seconds,
            A.ARCHETYPE: f"synthetic-{i:02d}", A.TAXONOMY_VERSION: "synthetic-1",
            A.SLO_CLASS: "all", A.REGION: "all", A.REQUESTS: rng.poisson(lam).astype("int64")}))
    return pd.concat(frames, ignore_index=True)
