"""`compute.lgbm.fit_layout` and `QuantileDemandModel.lightgbm_categorical`: what
LightGBM's ranks are given under lightgbm.dask (issue 41: a categorical feature with no
value on the rank that bins it segfaults LightGBM's distributed Dataset; a rank with no
rows fails its Dataset)."""

from __future__ import annotations

import dask.dataframe as dd
import numpy as np
import pandas as pd

from replaylab.compute.lgbm import MIN_SAMPLE_VALUES, fit_layout
from replaylab.demand.model import QuantileDemandModel


def frame(n: int, values: dict[str, object]) -> pd.DataFrame:
    return pd.DataFrame({c: pd.Categorical([v] * n, categories=["a", "b"])
                         for c, v in values.items()} | {"x": np.arange(n, dtype="float64")})


def test_empty_partitions_are_left_out_and_sparse_categoricals_train_as_codes():
    parts = [frame(50, {"dense": "a", "here": "a"}),
             frame(0, {"dense": "a", "here": "a"}),
             frame(50, {"dense": "b", "here": None})]  # `here`: no value in partition 2
    X = dd.from_delayed([dd.from_pandas(p, npartitions=1).to_delayed()[0] for p in parts],
                        meta=parts[0].iloc[:0], verify_meta=False)
    keep, cats = fit_layout(X, ["dense", "here"])
    assert keep == [0, 2]
    assert cats == ["dense"]


def test_a_rare_categorical_is_kept_only_when_every_rank_samples_enough_values():
    n, sample = 10_000, 1_000  # a rank may sample 1,000 of its rows
    rare = frame(n, {"c": None})
    rare.loc[: MIN_SAMPLE_VALUES * n // sample - 2, "c"] = "a"  # just under the bound
    enough = frame(n, {"c": None})
    enough.loc[: MIN_SAMPLE_VALUES * n // sample, "c"] = "a"
    for got, want in ((rare, []), (enough, ["c"])):
        X = dd.from_pandas(got, npartitions=1)
        assert fit_layout(X, ["c"], sample_rows=sample)[1] == want
    # no sampling when the whole frame fits one rank's sample: one value is enough
    one = frame(100, {"c": None})
    one.loc[0, "c"] = "b"
    assert fit_layout(dd.from_pandas(one, npartitions=1), ["c"], sample_rows=sample)[1] == ["c"]


def test_lightgbm_bins_as_categorical_only_the_features_with_a_category():
    model = QuantileDemandModel()
    model.feature_names_ = ["x", "region", "category"]
    model.categories_ = {"region": [], "category": ["chat"]}
    assert model.lightgbm_categorical() == ["category"]
