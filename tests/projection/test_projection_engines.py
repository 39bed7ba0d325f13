"""The projection and splits on the compute engine (`projection.project_on`,
`projection.partitioned`): equal to the pandas path row for row, on LocalEngine (one or a
few partitions) and on DaskEngine (the session's LocalCluster, `dask_address`).

`project_and_split` (shuffled on session_id once, the pandas projection per partition),
`split_boundaries_on` (exact row-weighted order statistics of the session opening times by
histogram refinement, `compute.ops.refine`) and `split_facts` against
`dispatch_time_features`, `split_boundaries` and `time_ordered_splits`; one fingerprint
and version for every engine.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replaylab.compute import ComputeConfig, LocalEngine, engine
from replaylab.contracts import Ledger as L
from replaylab.contracts.ledger import validate_ledger
from replaylab.projection import (
    RUN_CODE_VERSION,
    SPLITS,
    ProjectionConfig,
    SplitConfig,
    dispatch_time_features,
    ledger_fingerprint,
    project,
    project_on,
    projection_version,
    split_counts,
    time_ordered_splits,
)
from replaylab.projection.partitioned import project_and_split, split_boundaries_on
from replaylab.projection.splits import assign_splits, split_boundaries
from tests.helpers.projection import check_splits, random_ledger

CONFIGS = [
    SplitConfig(embargo_ms=5 * 60_000),
    SplitConfig(embargo_ms=5 * 60_000, purge="sessions"),
    SplitConfig(train=0.5, calibration=0.0, test=0.5, embargo_ms=0),
    SplitConfig(train=0.0, calibration=0.7, test=0.3, embargo_ms=60_000),
    SplitConfig(train=1.0, calibration=0.0, test=0.0),
]


@pytest.fixture(scope="module")
def valid() -> pd.DataFrame:
    from replaylab.sources.synthetic import SyntheticLedgerConfig, generate_synthetic_ledger

    raw = generate_synthetic_ledger(SyntheticLedgerConfig(n_sessions=1500), seed=4)
    return validate_ledger(raw).valid


@pytest.fixture(scope="module")
def dask_engine(dask_address):
    with engine(ComputeConfig(kind="dask", address=dask_address)) as eng:
        yield eng


def _reference(valid: pd.DataFrame, cfg: SplitConfig) -> tuple[pd.DataFrame, dict]:
    """The pandas path: features + split, sorted by request_id; the boundaries."""
    f = dispatch_time_features(valid)
    s = time_ordered_splits(f, cfg)
    check_splits(f, s, cfg)
    return (f.assign(split=s.to_numpy()).sort_values(L.REQUEST_ID, ignore_index=True),
            split_boundaries(f, cfg))


def _session_counts(frame: pd.DataFrame) -> dict[str, int]:
    got = frame.drop_duplicates([L.SESSION_ID, "split"])["split"].value_counts()
    return {s: int(got.get(s, 0)) for s in SPLITS}


def _assert_same_as_pandas(eng, valid: pd.DataFrame, cfg: SplitConfig, parts: int) -> None:
    want, want_bounds = _reference(valid, cfg)
    features, facts = project_and_split(eng, eng.from_pandas(valid, npartitions=parts),
                                        split=cfg)
    # no session in two partitions (what makes the per-partition steps exact)
    ids = [set(p) for p in eng.each(lambda p: p[L.SESSION_ID].unique(), features)]
    assert sum(len(p) for p in ids) == len(set().union(*ids)) == valid[L.SESSION_ID].nunique()
    got = eng.collect(features).sort_values(L.REQUEST_ID, ignore_index=True)
    pd.testing.assert_frame_equal(got, want)  # features and the split of every row
    bounds = dict(facts["boundaries"])
    assert bounds.pop("selection")["histogram_passes"] >= 1
    assert bounds == want_bounds
    assert facts["rows"] == split_counts(want["split"])
    assert facts["sessions"] == _session_counts(want)
    kept = got[got["split"] != "embargo"]
    assert (kept.groupby(L.SESSION_ID)["split"].nunique() == 1).all()


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: f"{c.train}-{c.purge}-{c.embargo_ms}")
def test_local_engine_equals_pandas(valid, cfg):
    _assert_same_as_pandas(LocalEngine(), valid, cfg, parts=4)


def test_one_local_partition_is_the_pandas_path_in_its_row_order(valid):
    cfg = CONFIGS[0]
    eng = LocalEngine()
    p = project_on(eng, eng.from_pandas(valid), ProjectionConfig(), cfg)
    ref = project(valid, ProjectionConfig(), cfg)
    pd.testing.assert_frame_equal(eng.collect(p.features),
                                  ref.with_split_column().reset_index(drop=True))


@pytest.mark.slow
def test_dask_engine_equals_pandas(valid, dask_engine):
    for cfg in CONFIGS[:2]:
        _assert_same_as_pandas(dask_engine, valid, cfg, parts=4)


@pytest.mark.slow
def test_project_means_the_same_on_every_engine(valid, dask_engine):
    """`projection.project_on`, the one recipe: the same features and split of every row,
    the same fingerprint and version, on LocalEngine and DaskEngine, any partitioning."""
    cfg = CONFIGS[0]
    local = project(valid, ProjectionConfig(), cfg)
    want = local.with_split_column().sort_values(L.REQUEST_ID, ignore_index=True)
    for eng, parts in ((LocalEngine(), 1), (LocalEngine(), 3), (dask_engine, 4)):
        got = project_on(eng, eng.from_pandas(valid, npartitions=parts), ProjectionConfig(), cfg)
        assert got.compute == eng.kind
        pd.testing.assert_frame_equal(
            eng.collect(got.features).sort_values(L.REQUEST_ID, ignore_index=True), want)
        assert got.fingerprint == local.fingerprint == ledger_fingerprint(valid)
        assert got.version == local.version == projection_version(
            ProjectionConfig(), local.fingerprint, RUN_CODE_VERSION, cfg)
        assert set(got.timings) == {"fingerprint", "project"}
    assert set(local.timings) == {"fingerprint", "features", "splits"}
    with pytest.raises(ValueError, match="compute="):
        project(valid, compute="spark")


def test_boundaries_are_in_the_facts_with_iso_times(valid):
    eng = LocalEngine()
    _, facts = project_and_split(eng, eng.from_pandas(valid, npartitions=3), split=CONFIGS[0])
    b = facts["boundaries"]
    for name in ("calibration", "test"):
        first = b["first_session"][name]
        assert b["boundary_ms"][name] == first["start_ms"]
        assert pd.Timestamp(b["boundary_iso"][name]) == pd.Timestamp(first["start_ms"], unit="ms",
                                                                     tz="UTC")
        assert first["rows_before"] >= b["rows_before_threshold"][name]
    assert b["rows"] == len(valid) and b["sessions"] == valid[L.SESSION_ID].nunique()


def test_pyarrow_strings_give_the_pandas_dtypes(valid):
    """A partition whose strings arrive as pyarrow strings projects to the pandas dtypes."""
    region = valid[L.REGION].mask(valid.index % 7 == 0)
    arrow = valid.assign(**{L.REGION: region}).astype({L.SESSION_ID: "string[pyarrow]",
                                                       L.REGION: "string[pyarrow]"})
    eng = LocalEngine()
    got, _ = project_and_split(eng, eng.from_pandas(arrow, npartitions=2))
    got = eng.collect(got).drop(columns="split").sort_values(L.REQUEST_ID, ignore_index=True)
    local = valid.assign(**{L.REGION: valid[L.REGION].mask(valid.index % 7 == 0, None)})
    want = dispatch_time_features(local).sort_values(L.REQUEST_ID, ignore_index=True)
    pd.testing.assert_frame_equal(got, want)
    assert got[L.REGION].map(type).isin([str, type(None)]).all()


def test_features_with_assumed_ends_equal_the_pandas_path():
    ledger = random_ledger(120, seed=8).drop(columns=[L.ENDED_AT])
    cfg = ProjectionConfig(assume_ended_before_next=True)
    eng = LocalEngine()
    got, _ = project_and_split(eng, eng.from_pandas(ledger, npartitions=3), cfg)
    got = eng.collect(got).drop(columns="split").sort_values(L.REQUEST_ID, ignore_index=True)
    want = dispatch_time_features(ledger, cfg).sort_values(L.REQUEST_ID, ignore_index=True)
    pd.testing.assert_frame_equal(got, want)


# ------------------------------------------------------------- the selection, adversarial


def _tied_frame(seed: int, n_sessions: int, grid_ms: int, span: int) -> pd.DataFrame:
    """Sessions of 1-6 rows opening on a coarse grid: many sessions share an opening ms."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 7, n_sessions)
    start = 1_700_000_000_000 + rng.integers(0, span, n_sessions) * grid_ms
    ids = np.array([f"s{i:04d}" for i in rng.permutation(n_sessions)], dtype=object)
    offsets = np.concatenate([np.r_[0, np.sort(rng.integers(0, 5 * grid_ms + 1, k - 1))]
                              for k in sizes])
    return pd.DataFrame({L.SESSION_ID: np.repeat(ids, sizes),
                         L.TIMESTAMP: (np.repeat(start, sizes) + offsets).astype(np.int64)}
                        ).sample(frac=1.0, random_state=seed, ignore_index=True)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), n_sessions=st.integers(1, 80),
       grid=st.sampled_from([1, 1000, 86_400_000]), span=st.sampled_from([1, 3, 50, 10_000]),
       buckets=st.sampled_from([2, 3, 4096]), parts=st.integers(1, 4),
       fr=st.sampled_from([(0.6, 0.2, 0.2), (0.0, 0.5, 0.5), (0.5, 0.0, 0.5), (1.0, 0.0, 0.0),
                           (0.0, 0.0, 1.0), (0.34, 0.33, 0.33)]),
       purge=st.sampled_from(["rows", "sessions"]), embargo=st.sampled_from([0, 999, 60_000]))
def test_the_selection_is_exact_under_ties(seed, n_sessions, grid, span, buckets, parts,
                                           fr, purge, embargo):
    f = _tied_frame(seed, n_sessions, grid, span)
    cfg = SplitConfig(train=fr[0], calibration=fr[1], test=fr[2], embargo_ms=embargo, purge=purge)
    want = time_ordered_splits(f, cfg)
    bounds = split_boundaries(f, cfg)
    pd.testing.assert_series_equal(assign_splits(f, bounds, cfg), want)
    eng = LocalEngine()
    frame = eng.shuffle_by(eng.from_pandas(f, npartitions=parts), L.SESSION_ID)
    got_bounds = split_boundaries_on(eng, frame, cfg, buckets=buckets)
    got_bounds.pop("selection")
    assert got_bounds == bounds
    labels = pd.concat([assign_splits(p, got_bounds, cfg) for p in frame]).sort_index()
    pd.testing.assert_series_equal(labels, want, check_names=False)


def test_empty_features_give_empty_boundaries():
    f = pd.DataFrame({L.SESSION_ID: pd.Series([], dtype=object),
                      L.TIMESTAMP: pd.Series([], dtype="int64")})
    got = split_boundaries_on(LocalEngine(), [f])
    got.pop("selection")
    assert got == split_boundaries(f)
    assert got["first_session"] == {"calibration": None, "test": None}
