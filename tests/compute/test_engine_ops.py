"""The engine's operations (`replaylab.compute.ops`) on LocalEngine and on DaskEngine (the
session's LocalCluster, `dask_address`) give equal results on tiny seeded data; the order
statistics equal numpy's; the hashed sample and the fingerprint do not depend on the engine
or the partitioning; the ledger reader's accounting is the same both ways."""

from __future__ import annotations

import sys

import numpy as np
import pandas as pd
import pytest

from replaylab.compute import ComputeConfig, LocalEngine, engine, ops
from replaylab.config import ConfigError, from_mapping
from replaylab.contracts.columns import Ledger as L


def frame(n: int = 3000, seed: int = 7) -> pd.DataFrame:
    """n rows of 300 sessions: a heavy-tailed float with ties and NaNs, int64 ms times."""
    rng = np.random.default_rng(seed)
    x = np.round(rng.lognormal(0.0, 1.5, n), 2)  # rounded: ties
    x[rng.random(n) < 0.03] = np.nan
    x[:5] = -x[:5]  # a few negatives: the sortable keys of signed floats
    return pd.DataFrame({"session_id": [f"s{int(i):04d}" for i in rng.integers(0, 300, n)],
                         "x": x, "t": rng.integers(0, 10**9, n).astype("int64")})


@pytest.fixture(scope="module")
def dask_engine(dask_address):
    with engine(ComputeConfig(kind="dask", address=dask_address)) as eng:
        yield eng


def engines(dask_engine):
    return [LocalEngine(), dask_engine]


def test_importing_the_engine_imports_no_dask():
    import subprocess

    code = ("import sys, replaylab.compute, replaylab.compute.ops; "
            "print(any(m.split('.')[0] in ('dask', 'distributed') for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_compute_config_refuses_a_bad_kind_naming_the_field():
    with pytest.raises(ConfigError, match=r"compute\.kind='spark'; choose local or dask"):
        from_mapping(ComputeConfig, {"kind": "spark"}, "compute")
    with pytest.raises(ConfigError, match=r"compute\.n_workers=0"):
        from_mapping(ComputeConfig, {"kind": "dask", "n_workers": 0}, "compute")


@pytest.mark.parametrize("parts", [1, 3])
def test_map_each_collect_agree_between_engines(dask_engine, parts):
    df = frame()
    got = []
    for eng in engines(dask_engine):
        f = eng.from_pandas(df, npartitions=parts)
        doubled = eng.map(lambda p: p.assign(y=p["x"] * 2), f, meta=df.assign(y=0.0).iloc[:0])
        sums = eng.each(lambda p: (len(p), float(np.nansum(p["y"]))), doubled)
        assert eng.npartitions(doubled) == parts
        got.append((sum(s[0] for s in sums), sum(s[1] for s in sums),
                    eng.collect(doubled, ["session_id", "y"])))
    (n0, s0, c0), (n1, s1, c1) = got
    assert n0 == n1 == len(df) and s0 == pytest.approx(s1)
    pd.testing.assert_frame_equal(c0, c1)  # row order = partition order, both ways


def _join_part(part: pd.DataFrame, other: pd.DataFrame) -> pd.DataFrame:
    """Each row's `z` from the other frame's partition (same sessions there, or KeyError)."""
    z = other.drop_duplicates("session_id").set_index("session_id")["z"]
    return part.assign(z=z.loc[part["session_id"]].to_numpy())


def test_map_aligned_pairs_partition_i_with_partition_i_and_each_sum_sums(dask_engine):
    df = frame()
    other = df[["session_id"]].drop_duplicates().assign(
        z=lambda d: d["session_id"].str[1:].astype(int))
    want = df.assign(z=df["session_id"].str[1:].astype(int))
    for eng in engines(dask_engine):
        a = eng.shuffle_by(eng.from_pandas(df, npartitions=3), "session_id")
        b = eng.shuffle_by(eng.from_pandas(other, npartitions=3), "session_id")
        joined = eng.map_aligned(_join_part, a, b, meta=want.iloc[:0])
        got = eng.collect(joined).sort_values(["session_id", "t"]).reset_index(drop=True)
        pd.testing.assert_frame_equal(
            got, want.sort_values(["session_id", "t"]).reset_index(drop=True))
        assert eng.each_sum(len, joined) == len(df)
        assert eng.each_sum(lambda p, k: k * int(p["z"].sum()), joined, 2) == 2 * int(
            want["z"].sum())
        with pytest.raises(ValueError, match="3 partitions against 2"):
            eng.map_aligned(_join_part, a, eng.from_pandas(other, npartitions=2))


def test_shuffle_by_puts_every_session_in_one_partition(dask_engine):
    df = frame()
    for eng in engines(dask_engine):
        f = eng.shuffle_by(eng.from_pandas(df, npartitions=4), "session_id")
        ids = eng.each(lambda p: set(p["session_id"]), f)
        assert sum(len(s) for s in ids) == df["session_id"].nunique()  # disjoint
        assert len(eng.collect(f)) == len(df)
        by = eng.each(lambda p: set(p["session_id"]), eng.from_pandas(df, 3, by="session_id"))
        assert sum(len(s) for s in by) == df["session_id"].nunique()


@pytest.mark.parametrize("parts", [1, 4])
def test_order_statistics_and_quantiles_equal_numpy(dask_engine, parts):
    df = frame()
    x = df["x"].to_numpy()
    finite = np.sort(x[np.isfinite(x)])
    ranks = [0, 1, 17, len(finite) // 2, len(finite) - 1]
    qs = [0.0, 0.1, 0.5, 0.9, 0.975, 1.0]
    for eng in engines(dask_engine):
        f = eng.from_pandas(df, npartitions=parts)
        assert ops.order_statistics(eng, f, "x", ranks) == [float(finite[r]) for r in ranks]
        # numpy's "linear" quantile, bit for bit
        assert ops.exact_quantiles(eng, f, "x", qs) == np.quantile(finite, qs).tolist()
    with pytest.raises(ValueError, match="outside"):
        ops.order_statistics(LocalEngine(), [df], "x", [len(finite)])


def test_kth_smallest_is_the_sorted_value_and_inf_past_the_count(dask_engine):
    """The cap of a hashed sample: the k-th smallest key keeps k rows; k >= n keeps all."""
    df = frame()
    finite = np.sort(df["x"].to_numpy()[np.isfinite(df["x"].to_numpy())])
    n = len(finite)
    for eng in engines(dask_engine):
        f = eng.from_pandas(df, npartitions=3)
        assert [ops.kth_smallest(eng, f, "x", n, k) for k in (1, 40, n - 1)] == \
            [float(finite[0]), float(finite[39]), float(finite[n - 2])]
        assert ops.kth_smallest(eng, f, "x", n, n) == float("inf")


def test_weighted_refinement_finds_the_first_key_reaching_each_threshold(dask_engine):
    df = frame()
    t, w = df["t"].to_numpy(), np.arange(len(df)) % 5 + 1
    df = df.assign(w=w)
    order = np.argsort(t, kind="stable")
    cum = np.cumsum(w[order])
    targets = {"a": 1.0, "b": 0.3 * cum[-1], "c": float(cum[-1]), "d": cum[-1] + 1.0}
    want = {k: (int(t[order][np.argmax(cum >= v)]) if v <= cum[-1] else None)
            for k, v in targets.items()}
    for eng in engines(dask_engine):
        f = eng.from_pandas(df, npartitions=3)
        found, passes = ops.refine(eng, f, weighted_t, targets, int(t.min()), int(t.max()))
        assert found == want and passes >= 1


def weighted_t(part: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    return part["t"].to_numpy(dtype="int64"), part["w"].to_numpy(dtype="int64")


def test_hashed_sample_is_the_same_sessions_whatever_the_engine(dask_engine):
    df = frame()
    kept = []
    for eng, parts in ((LocalEngine(), 1), (LocalEngine(), 5), (dask_engine, 3)):
        f = ops.hashed_sample(eng, eng.from_pandas(df, npartitions=parts), 0.3, seed=4)
        kept.append(eng.collect(f).sort_values(["session_id", "t"], ignore_index=True))
    pd.testing.assert_frame_equal(kept[0], kept[1])
    pd.testing.assert_frame_equal(kept[0], kept[2])
    sessions = kept[0]["session_id"].nunique() / df["session_id"].nunique()
    assert 0.2 < sessions < 0.4  # about frac of the sessions, each whole
    whole = df[df["session_id"].isin(set(kept[0]["session_id"]))]
    assert len(whole) == len(kept[0])


def test_poisson_weights_are_a_function_of_the_key_and_mean_one():
    h = ops.key_hash(pd.Series([f"s{i}" for i in range(4000)]))
    w = ops.poisson_weights(h, 50, seed=3)
    assert w.shape == (50, 4000)
    np.testing.assert_array_equal(ops.poisson_weights(h[::-1], 50, seed=3), w[:, ::-1])
    assert abs(w.mean() - 1.0) < 0.02 and abs(w.var() - 1.0) < 0.05  # Poisson(1)
    assert not np.array_equal(ops.poisson_weights(h, 50, seed=4), w)


def test_one_fingerprint_for_every_engine_and_partitioning(dask_engine):
    df = frame()
    want = ops.frame_fingerprint(df)
    shuffled = df.sample(frac=1.0, random_state=1)[["t", "x", "session_id"]]
    assert ops.frame_fingerprint(shuffled) == want  # row and column order do not count
    for eng, parts in ((LocalEngine(), 1), (LocalEngine(), 4), (dask_engine, 3)):
        f = eng.from_pandas(shuffled, npartitions=parts)
        assert ops.ledger_fingerprint(eng, f) == want
        assert ops.ledger_fingerprint(eng, f, chunk_rows=500) == want  # many range passes
    changed = df.assign(x=df["x"].where(df.index != 10, 123.0))
    assert ops.frame_fingerprint(changed) != want


def test_the_ledger_reader_accounts_the_same_both_ways(dask_engine, tmp_path):
    from replaylab.contracts.io import write_table
    from replaylab.sources.defects import inject_defects
    from replaylab.sources.synthetic import SyntheticLedgerConfig, generate_synthetic_ledger

    raw = generate_synthetic_ledger(SyntheticLedgerConfig(n_requests=900), seed=5)
    raw, _ = inject_defects(raw, rate=0.03, seed=5)
    ds = tmp_path / "ds"
    ds.mkdir()
    third = len(raw) // 3
    for i in range(3):
        write_table(raw.iloc[i * third:(i + 1) * third if i < 2 else None], ds / f"p{i}.jsonl")
    local = LocalEngine().read_ledger(str(ds))
    dask = dask_engine.read_ledger(str(ds), blocksize=20_000)
    assert dask.npartitions > 1
    assert local.accounting == dask.accounting
    assert local.accounting.rows_quarantined > 0
    assert local.summary()["rows_valid"] == dask.summary()["rows_valid"]
    a = LocalEngine().collect(local.valid).sort_values(L.REQUEST_ID, ignore_index=True)
    b = dask_engine.collect(dask.valid).sort_values(L.REQUEST_ID, ignore_index=True)
    pd.testing.assert_frame_equal(a, b[a.columns], check_dtype=False)
    assert ops.ledger_fingerprint(LocalEngine(), local.valid) == ops.ledger_fingerprint(
        dask_engine, dask.valid)
    assert local.write_quarantine(tmp_path / "ql").endswith("ledger.jsonl")
    written = dask.write_quarantine(tmp_path / "qd")
    quarantined = pd.read_parquet(written)
    assert len(quarantined) == dask.accounting.rows_quarantined


def test_local_stages_are_numbered_timed_lines():
    lines: list[str] = []
    stages = LocalEngine().stages({"read": "read the ledger", "write": "write"}, lines.append)
    with stages, stages("read"):
        pass
    assert lines[0] == "stage 1/2: read the ledger"
    assert lines[1].startswith("stage 1/2 done in ") and lines[1].endswith(" s: read")
    assert set(stages.timings) == {"read"}


def test_submit_all_runs_one_task_per_item_in_order(dask_engine):
    for eng in engines(dask_engine):
        assert eng.submit_all(pow, [1, 2, 3], 2) == [1, 4, 9]
    facts = dask_engine.facts()
    assert facts["kind"] == "dask" and facts["n_workers"] == 2
    assert LocalEngine().facts() == {"kind": "local"}


def test_a_client_current_in_the_callers_process_does_not_take_the_engines_work(dask_address):
    """The engine's client is current for the run: with another client already current (a
    notebook's, the test session's `with Client(...)`), the run's persists land on the
    engine's scheduler, where lightgbm.dask submits (else: "lost dependencies", CI of stop
    52), and the caller's client is current again after."""
    from distributed import Client, LocalCluster, default_client, futures_of, wait

    with LocalCluster(n_workers=1, processes=False, dashboard_address=None) as other, \
            Client(other) as caller:
        with engine(ComputeConfig(kind="dask", address=dask_address)) as eng:
            f = eng.persist(eng.from_pandas(frame(300), npartitions=2))
            owners = {fut.client.scheduler.address for fut in futures_of(f)}
            assert owners == {eng.client.scheduler.address} != {caller.scheduler.address}
            wait(futures_of(f))
            held = {k for keys in eng.client.has_what().values() for k in keys}
            assert {fut.key for fut in futures_of(f)} <= held
        assert default_client() is caller
