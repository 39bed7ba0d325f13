"""Privacy of ledger -> aggregates: no id, no free text, no high-cardinality label gets out.

The adversarial ledger puts a unique string per request in every label column the
aggregation reads (slo_class, region) and in id / text columns it must never read;
the output may hold only allow-listed values, the fixed archetype vocabulary and
the reserved labels, and every request is accounted for (kept, dropped or edge).
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replaylab.contracts.columns import Aggregates as A
from replaylab.contracts.columns import Ledger as L
from replaylab.forecast import AggregationConfig, get_taxonomy
from replaylab.forecast.aggregate import ORDER, ledger_to_aggregates
from replaylab.forecast.config import RESERVED_LABELS

SLO_ALLOW = ("interactive", "batch")
REGION_ALLOW = ("us-east", "eu-west")
VOCAB = set(get_taxonomy("arch-1").vocabulary) | {"other"}


def _adversarial_ledger(n: int, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    uniq = [f"secret-{seed}-{i:06d}" for i in range(n)]
    labels = rng.choice(["interactive", "batch", "us-east", "eu-west"], n)
    return pd.DataFrame({
        L.VERSION: "1", L.REQUEST_ID: [f"req-{u}" for u in uniq],
        L.SESSION_ID: [f"sess-{u}" for u in uniq], L.TURN_INDEX: rng.integers(0, 8, n),
        L.TIMESTAMP: 1_700_000_000_000 + np.sort(rng.integers(0, 3 * 3_600_000, n)),
        L.PROMPT_TOKENS: pd.array(rng.integers(0, 30_000, n), dtype="Int64"),
        L.COMPLETION_TOKENS: pd.array(rng.integers(0, 3_000, n), dtype="Int64"),
        L.LIFECYCLE_STATE: "completed", L.SELECTED_MODEL: [f"model-{u}" for u in uniq],
        # half the rows hold an allowed value, half a unique per-request string
        L.SLO_CLASS: np.where(rng.random(n) < 0.5, labels, [f"slo-{u}" for u in uniq]),
        L.REGION: np.where(rng.random(n) < 0.5, labels, [f"region-{u}" for u in uniq]),
        L.PROMPT_TEXT: [f"my password is {u}" for u in uniq],
        "caller": [f"caller-{u}" for u in uniq], "user_id": uniq, L.CATEGORY: uniq,
    })


def _cfg(**kw) -> AggregationConfig:
    return AggregationConfig(**{"bucket_seconds": 600, "k_min": 10, "slo_classes": SLO_ALLOW,
                                "regions": REGION_ALLOW, **kw})


def _assert_private(out, ledger: pd.DataFrame) -> None:
    agg = out.aggregates
    assert list(agg.columns) == list(ORDER)  # contract columns only: no id survives
    assert not {L.REQUEST_ID, L.SESSION_ID, L.PROMPT_TEXT, "caller", "user_id",
                L.SELECTED_MODEL, L.CATEGORY} & set(agg.columns)
    assert set(agg[A.ARCHETYPE]) <= VOCAB
    assert set(agg[A.SLO_CLASS]) <= set(SLO_ALLOW) | set(RESERVED_LABELS)
    assert set(agg[A.REGION]) <= set(REGION_ALLOW) | set(RESERVED_LABELS)
    # no string cell of the output, nor the report, holds any per-request string
    text = " ".join(agg.select_dtypes(exclude="number").astype(str).to_numpy().ravel())
    text += json.dumps(out.report)
    assert "secret-" not in text and "password" not in text
    rep = out.report
    assert rep["requests_kept"] + rep["dropped_requests"] + rep["edge_requests"] == len(ledger)
    assert int(agg[A.REQUESTS].sum()) == rep["requests_kept"]
    assert (agg[A.REQUESTS] >= rep["k_min"]).all()


def test_unique_labels_never_reach_the_output():
    ledger = _adversarial_ledger(5000, seed=1)
    out = ledger_to_aggregates(ledger, _cfg())
    _assert_private(out, ledger)
    assert set(out.aggregates[A.SLO_CLASS]) == {"interactive", "batch", "other"}
    assert out.report["slo_class_values"]["other"] > 2000  # the unique strings, counted
    assert out.report["suppressed_cells"] > 0


def test_pooled_dimensions_are_all():
    ledger = _adversarial_ledger(2000, seed=2)
    out = ledger_to_aggregates(ledger, _cfg(slo_classes=None, regions=None))
    _assert_private(out, ledger)
    assert set(out.aggregates[A.SLO_CLASS]) == {"all"} == set(out.aggregates[A.REGION])


def test_null_labels_become_unknown():
    ledger = _adversarial_ledger(1000, seed=3)
    ledger.loc[ledger.index[::2], L.REGION] = None
    out = ledger_to_aggregates(ledger, _cfg(k_min=1))
    assert "unknown" in set(out.aggregates[A.REGION])
    assert out.report["region_values"]["unknown"] == 500


def test_an_all_null_label_column_is_an_absent_one():
    """A region column that is null on every row says as much as no column: `all`, the same
    aggregates as without it (absent and all-null optional columns read the same)."""
    ledger = _adversarial_ledger(1000, seed=3)
    out = ledger_to_aggregates(ledger.assign(**{L.REGION: None}), _cfg(k_min=1))
    absent = ledger_to_aggregates(ledger.drop(columns=[L.REGION]), _cfg(k_min=1))
    assert set(out.aggregates[A.REGION]) == {"all"}
    pd.testing.assert_frame_equal(out.aggregates, absent.aggregates)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(1, 400), seed=st.integers(0, 10_000), k_min=st.integers(1, 30),
       mode=st.sampled_from(["merge", "drop"]), width=st.sampled_from([60, 600, 3600]),
       trim=st.booleans(), null_share=st.floats(0, 1))
def test_property_private_and_conserving(n, seed, k_min, mode, width, trim, null_share):
    ledger = _adversarial_ledger(n, seed)
    rng = np.random.default_rng(seed)
    ledger.loc[rng.random(n) < null_share, L.COMPLETION_TOKENS] = pd.NA
    cfg = _cfg(k_min=k_min, suppression=mode, bucket_seconds=width, trim_edges=trim)
    try:
        out = ledger_to_aggregates(ledger, cfg)
    except ValueError as e:  # everything sat in the (trimmed) edge buckets
        assert trim and "edge" in str(e)
        return
    _assert_private(out, ledger)
    kept = out.aggregates
    # token sums: what was kept never exceeds the ledger's (suppression only removes)
    assert kept[A.PROMPT_TOKENS_SUM].fillna(0).sum() <= ledger[L.PROMPT_TOKENS].sum()
    if k_min == 1 and not trim:  # nothing suppressed or trimmed: exact conservation
        assert int(kept[A.REQUESTS].sum()) == n
        assert int(kept[A.PROMPT_TOKENS_SUM].sum()) == int(ledger[L.PROMPT_TOKENS].sum())
        assert int(kept[A.COMPLETION_TOKENS_SUM].fillna(0).sum()) == int(
            ledger[L.COMPLETION_TOKENS].sum())
