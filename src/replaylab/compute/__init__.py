"""The compute engine: WHERE the partitions of a pipeline are processed.

    with compute.engine(ComputeConfig(kind="dask")) as eng:   # or kind="local"
        ledger = eng.read_ledger(spec)                        # validated partitions
        features = eng.map(fn, ledger.valid)                  # fn(pd.DataFrame) -> pd.DataFrame
        sums = eng.each(count_fn, features)                   # small results, partition order
        summary["compute"] = eng.facts()

`LocalEngine` holds the partitions as pandas DataFrames in this process, `DaskEngine`
as a dask DataFrame on a LocalCluster or the scheduler at `compute.address`; a pipeline
is written once against either (`engine.Engine`). The operations built on them
(exact order statistics, hashed samples, the one session bootstrap, the one ledger
fingerprint) are `compute.ops`; the ledger reader (a file or a dataset, validated
per partition) is `compute.ledger`; the numbered stage lines `compute.stages`.
This is the only package that imports dask, distributed or lightgbm.dask (inside
functions); the names here are imported lazily, so `compute.config` costs no pandas.
"""

from replaylab.contracts.lazy import lazy_exports

_LAZY = {
    "ComputeConfig": ".config",
    "DaskEngine": ".engines", "Engine": ".engines", "Frame": ".engines",
    "LedgerFrame": ".engines", "LocalEngine": ".engines", "engine": ".engines",
    "StageFailed": ".stages",
}

__all__ = sorted(_LAZY)

__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
