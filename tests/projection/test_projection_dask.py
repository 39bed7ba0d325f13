"""compute=dask projection and splits (issue 31.2): equal to the pandas path, row for row.

`project_dask` (lazy, shuffled on session_id once, the pandas projection per
partition), `split_boundaries_dask` (exact row-weighted order statistics of the
session opening times by distributed histogram refinement), `assign_splits_dask`
(labels per partition) and `split_summary_dask` (counts on the cluster) against
`dispatch_time_features`, `split_boundaries` and `time_ordered_splits`.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

dd = pytest.importorskip("dask.dataframe")
dask = pytest.importorskip("dask")

from replaylab.contracts import Ledger as L  # noqa: E402
from replaylab.contracts.ledger import validate_ledger  # noqa: E402
from replaylab.projection import (  # noqa: E402
    RUN_CODE_VERSION,
    SPLITS,
    ProjectionConfig,
    SplitConfig,
    dispatch_time_features,
    ledger_fingerprint,
    ledger_fingerprint_dask,
    project,
    projection_version,
    split_counts,
    time_ordered_splits,
)
from replaylab.projection.distributed import no_string_conversion, project_dask  # noqa: E402
from replaylab.projection.splits import assign_splits, split_boundaries  # noqa: E402
from replaylab.projection.splits_dask import (  # noqa: E402
    assign_splits_dask,
    project_and_split_dask,
    split_boundaries_dask,
    split_summary_dask,
)
from tests.helpers.projection import check_splits  # noqa: E402

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


def _assert_same_as_pandas(valid: pd.DataFrame, cfg: SplitConfig) -> None:
    want, want_bounds = _reference(valid, cfg)
    features, summary = project_and_split_dask(dd.from_pandas(valid, npartitions=4), split=cfg)
    # no session in two partitions (what makes the per-partition steps exact)
    sessions = features[L.SESSION_ID].map_partitions(pd.Series.unique, meta=(L.SESSION_ID, object))
    parts = [set(p) for p in dask.compute(*sessions.to_delayed())]
    assert sum(len(p) for p in parts) == len(set().union(*parts)) == valid[L.SESSION_ID].nunique()
    got = features.compute().sort_values(L.REQUEST_ID, ignore_index=True)
    pd.testing.assert_frame_equal(got, want)  # features and the split of every row
    bounds = dict(summary["boundaries"])
    assert bounds.pop("selection")["histogram_passes"] >= 1
    assert bounds == want_bounds
    assert summary["rows"] == split_counts(want["split"])
    assert summary["sessions"] == _session_counts(want)
    kept = got[got["split"] != "embargo"]
    assert (kept.groupby(L.SESSION_ID)["split"].nunique() == 1).all()


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: f"{c.train}-{c.purge}-{c.embargo_ms}")
def test_default_scheduler_equals_pandas(valid, cfg):
    _assert_same_as_pandas(valid, cfg)


def test_project_means_the_same_under_local_and_dask(valid):
    """`projection.project`, the one recipe: the same features and split of every row in
    both modes; the fingerprint's scheme differs, and the version follows its fingerprint."""
    cfg = CONFIGS[0]
    local = project(valid, ProjectionConfig(), cfg)
    remote = project(dd.from_pandas(valid, npartitions=4), ProjectionConfig(), cfg,
                     compute="dask")
    assert local.compute == "local" and remote.compute == "dask"
    want = local.with_split_column().sort_values(L.REQUEST_ID, ignore_index=True)
    got = remote.with_split_column().compute().sort_values(L.REQUEST_ID, ignore_index=True)
    pd.testing.assert_frame_equal(got, want)
    assert local.fingerprint == ledger_fingerprint(valid)
    assert remote.fingerprint == ledger_fingerprint_dask(dd.from_pandas(valid, npartitions=3))
    assert local.version == projection_version(ProjectionConfig(), local.fingerprint,
                                               RUN_CODE_VERSION, cfg)
    assert remote.version == projection_version(ProjectionConfig(), remote.fingerprint,
                                                RUN_CODE_VERSION, cfg)
    assert set(local.timings) == {"fingerprint", "features", "splits"}
    assert set(remote.timings) == {"fingerprint", "project"}
    with pytest.raises(ValueError, match="compute="):
        project(valid, compute="spark")


@pytest.mark.slow
@pytest.mark.integration
def test_local_cluster_equals_pandas(valid):
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster, \
            distributed.Client(cluster):
        for cfg in CONFIGS[:2]:
            _assert_same_as_pandas(valid, cfg)


def test_boundaries_are_in_the_summary_with_iso_times(valid):
    cfg = CONFIGS[0]
    _, summary = project_and_split_dask(dd.from_pandas(valid, npartitions=3), split=cfg)
    b = summary["boundaries"]
    for name in ("calibration", "test"):
        first = b["first_session"][name]
        assert b["boundary_ms"][name] == first["start_ms"]
        assert pd.Timestamp(b["boundary_iso"][name]) == pd.Timestamp(first["start_ms"], unit="ms",
                                                                     tz="UTC")
        assert first["rows_before"] >= b["rows_before_threshold"][name]
    assert b["rows"] == len(valid) and b["sessions"] == valid[L.SESSION_ID].nunique()


def test_project_dask_is_lazy_and_takes_pyarrow_strings(valid):
    """Building the graph computes nothing; pyarrow-string input gives the pandas dtypes."""
    def refuse(*args, **kwargs):
        raise AssertionError("project_dask computed something")

    with dask.config.set({"dataframe.convert-string": True}):
        ddf = dd.from_pandas(valid.assign(**{L.REGION: valid[L.REGION].mask(
            valid.index % 7 == 0)}), npartitions=3)
    assert str(ddf[L.SESSION_ID].dtype) != "object"
    with dask.config.set(scheduler=refuse):
        lazy = project_dask(ddf, ProjectionConfig())
    assert isinstance(lazy, dd.DataFrame)
    with no_string_conversion():
        got = lazy.compute().sort_values(L.REQUEST_ID, ignore_index=True)
    local = valid.assign(**{L.REGION: valid[L.REGION].mask(valid.index % 7 == 0, None)})
    want = dispatch_time_features(local).sort_values(L.REQUEST_ID, ignore_index=True)
    pd.testing.assert_frame_equal(got, want)
    assert got[L.REGION].map(type).isin([str, type(None)]).all()


def test_project_dask_refuses_pandas(valid):
    with pytest.raises(TypeError, match="dask DataFrame"):
        project_dask(valid)


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
def test_distributed_selection_is_exact_under_ties(seed, n_sessions, grid, span, buckets, parts,
                                                  fr, purge, embargo):
    f = _tied_frame(seed, n_sessions, grid, span)
    cfg = SplitConfig(train=fr[0], calibration=fr[1], test=fr[2], embargo_ms=embargo, purge=purge)
    want = time_ordered_splits(f, cfg)
    bounds = split_boundaries(f, cfg)
    pd.testing.assert_series_equal(assign_splits(f, bounds, cfg), want)
    with dask.config.set(scheduler="sync"):
        ddf = dd.from_pandas(f, npartitions=parts).shuffle(on=L.SESSION_ID,
                                                           shuffle_method="tasks")
        got_bounds = split_boundaries_dask(ddf, cfg, buckets=buckets)
        got_bounds.pop("selection")
        assert got_bounds == bounds
        labels = assign_splits_dask(ddf, got_bounds, cfg)
        got = ddf.assign(split=labels).compute().sort_index()
        summary = split_summary_dask(ddf, got_bounds, labels)
    pd.testing.assert_series_equal(got["split"], want, check_names=False)
    assert summary["rows"] == split_counts(want)


def test_empty_features_give_empty_boundaries():
    f = pd.DataFrame({L.SESSION_ID: pd.Series([], dtype=object),
                      L.TIMESTAMP: pd.Series([], dtype="int64")})
    with dask.config.set(scheduler="sync"):
        got = split_boundaries_dask(dd.from_pandas(f, npartitions=1))
    got.pop("selection")
    assert got == split_boundaries(f)
    assert got["first_session"] == {"calibration": None, "test": None}
