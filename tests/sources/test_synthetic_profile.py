"""The synthetic ledger's daily and weekly profile of session starts (off by default)."""

from __future__ import annotations

import numpy as np
import pytest

from replaylab.sources.synthetic import SyntheticLedgerConfig, generate_synthetic_ledger
from replaylab.sources.synthetic.generator import profile_offsets, start_rate

DAY_MS = 86_400_000


def test_no_profile_by_default_and_a_flat_profile_changes_nothing():
    base = generate_synthetic_ledger(SyntheticLedgerConfig(n_sessions=300), seed=3)
    same = generate_synthetic_ledger(SyntheticLedgerConfig(n_sessions=300, diurnal_amplitude=0.0,
                                                           weekend_factor=1.0), seed=3)
    assert base.equals(same)


def test_session_starts_follow_the_daily_profile():
    cfg = SyntheticLedgerConfig(n_sessions=20_000, sessions_per_s=20_000 / (2 * 86_400),
                                diurnal_amplitude=0.5, diurnal_peak_hour=14.0)
    df = generate_synthetic_ledger(cfg, seed=0)
    chat = df[(df["category"] == "chat") & (df["turn_index"] == 0)]
    hour = ((chat["timestamp"] - cfg.start_ms) % DAY_MS) // 3_600_000
    peak, trough = hour.between(12, 15).sum(), (hour.between(0, 3)).sum()
    # rate 1 + 0.5 cos: about 1.45 at 12-16 h against about 0.55 at 0-4 h UTC
    assert 2.0 < peak / trough < 3.5


def test_weekend_factor_and_offsets_keep_the_span():
    cfg = SyntheticLedgerConfig(weekend_factor=0.5)  # 2023-11-16 was a Thursday
    days = cfg.start_ms + DAY_MS * np.arange(7) + DAY_MS // 2
    assert list(start_rate(days, cfg)) == [1, 1, 0.5, 0.5, 1, 1, 1]
    u = np.random.default_rng(0).random(50_000)
    off = profile_offsets(u, 7 * DAY_MS, cfg)
    assert off.min() >= 0 and off.max() <= 7 * DAY_MS
    day = (off // DAY_MS).astype(int)
    share = np.bincount(day, minlength=7) / len(day)
    assert share[2] == pytest.approx(0.5 / 6, abs=0.01) and share[0] == pytest.approx(1 / 6, abs=0.01)


@pytest.mark.parametrize("field, value", [("diurnal_amplitude", 1.0), ("diurnal_peak_hour", 24),
                                          ("weekend_factor", 0)])
def test_bad_profile_values_fail_naming_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        SyntheticLedgerConfig(**{field: value})
