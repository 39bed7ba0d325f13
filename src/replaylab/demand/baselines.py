"""Honest baselines of total demand, each a real predictor with the model's quantile outputs.

Every baseline follows the scikit-learn contract: parameters in `__init__`,
validated in `fit(features, y) -> self`, learned state ends in `_`, and
`predict_quantiles(features) -> ndarray (n, len(quantiles))` of TOTAL tokens,
monotone along the quantile axis. `features` is a projection frame
(`dispatch_time_features`); `y` is total demand (prompt + completion) of rows
with a regression label. Each predicts the known prompt plus output quantiles:

- `PromptLengthBaseline`: prompt + global output quantiles of train;
- `MaxTokensCapBaseline`: what a cap-reserving scheduler assumes: levels below
  0.5 get the prompt alone (output >= 0 is sure), levels at or above 0.5 get
  prompt + cap (the request may use all of it); the cap is `max_tokens`, else
  a default (configured, or learned as the largest cap seen in train);
- `CategoryBucketBaseline`: prompt + output quantiles of the row's bucket
  (e.g. category x decision); a bucket with fewer than `min_bucket_size` train
  rows falls back to its coarser prefix bucket, then to the global quantiles;
- `SessionEwmaBaseline`: prompt + EWMA of the session's earlier completed turns
  (`hist_completion_ewma`, known at dispatch) times quantiles of the ratio
  (output + 1) / (ewma + 1) learned on train; first turns (no ended turn with
  usage yet) fall back to the bucket baseline.

Each saves its fitted state as plain files (`write_state(writer)`, `read_state(reader)`,
`replaylab.demand.state`): `baseline.json` plus `.npy` arrays; `write_baseline` /
`read_baseline` dispatch on the class by its `name` (`BASELINE_TYPES`), never by a
name read from the file to import.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from replaylab.contracts.columns import Ledger as L
from replaylab.contracts.columns import Projected as P
from replaylab.demand.inputs import check_quantiles, output_labels, prompt_tokens
from replaylab.demand.state import RunStateError, StateReader, StateWriter

_NONE = "<none>"  # bucket value of a missing category / decision


def bucket_keys(features: pd.DataFrame, columns: Sequence[str]) -> pd.DataFrame:
    """Bucket columns as strings, missing column or value -> '<none>'."""
    out = {}
    for c in columns:
        if c in features.columns:
            out[c] = features[c].astype(object).where(features[c].notna(), _NONE).astype(str)
        else:
            out[c] = pd.Series(_NONE, index=features.index)
    return pd.DataFrame(out, index=features.index)


def _fitted(baseline: object, attr: str) -> None:
    if not hasattr(baseline, attr):
        raise RunStateError(f"{type(baseline).__name__}.write_state: the baseline is not fitted")


def _header(baseline: object, params: dict, fitted: dict) -> dict:
    return {"kind": baseline.name, "params": params, "fitted": fitted}  # type: ignore[attr-defined]


def _read_header(cls: type, reader: StateReader) -> dict:
    doc = reader.get_json("baseline.json")
    if doc.get("kind") != cls.name:  # type: ignore[attr-defined]
        raise RunStateError(f"{reader.where}: baseline.json is a {doc.get('kind')!r} baseline, "
                            f"not {cls.name!r}")  # type: ignore[attr-defined]
    return doc


class PromptLengthBaseline:
    """Prompt tokens + global output-token quantiles of train."""

    name = "prompt_length"

    def __init__(self, quantiles: Sequence[float] = (0.1, 0.5, 0.9)) -> None:
        self.quantiles = quantiles

    def fit(self, features: pd.DataFrame, y: np.ndarray) -> PromptLengthBaseline:
        qs = check_quantiles(self.quantiles)
        self.output_quantiles_ = np.quantile(output_labels(features, y), qs)  # (q,)
        self.n_train_ = int(len(features))
        return self

    def predict_quantiles(self, features: pd.DataFrame) -> np.ndarray:
        return prompt_tokens(features)[:, None] + self.output_quantiles_[None, :]

    def write_state(self, writer: StateWriter) -> None:
        _fitted(self, "output_quantiles_")
        writer.put_array("output_quantiles.npy", self.output_quantiles_)
        writer.put_json("baseline.json", _header(
            self, {"quantiles": [float(q) for q in self.quantiles]}, {"n_train_": self.n_train_}))

    @classmethod
    def read_state(cls, reader: StateReader) -> PromptLengthBaseline:
        doc = _read_header(cls, reader)
        b = cls(tuple(doc["params"]["quantiles"]))
        b.output_quantiles_ = reader.get_array("output_quantiles.npy")
        b.n_train_ = int(doc["fitted"]["n_train_"])
        return b


class MaxTokensCapBaseline:
    """Prompt (levels < 0.5) or prompt + cap (levels >= 0.5): the conservative reservation.

    default_max_tokens: the cap of a request without `max_tokens`; None: the
    largest cap seen in train, else the largest output seen in train.
    """

    name = "max_tokens_cap"

    def __init__(self, quantiles: Sequence[float] = (0.1, 0.5, 0.9),
                 default_max_tokens: int | None = 4096) -> None:
        self.quantiles = quantiles
        self.default_max_tokens = default_max_tokens

    def fit(self, features: pd.DataFrame, y: np.ndarray) -> MaxTokensCapBaseline:
        qs = check_quantiles(self.quantiles)
        out = output_labels(features, y)
        if self.default_max_tokens is not None:
            if int(self.default_max_tokens) < 1:
                raise ValueError(f"default_max_tokens={self.default_max_tokens!r}: must be >= 1")
            self.default_max_tokens_ = float(self.default_max_tokens)
        else:
            caps = features[L.MAX_TOKENS].to_numpy(dtype="float64", na_value=np.nan)
            seen = caps[np.isfinite(caps)]
            self.default_max_tokens_ = float(seen.max() if seen.size else out.max())
        self.uses_cap_ = qs >= 0.5  # (q,) bool: which levels add the cap
        return self

    def predict_quantiles(self, features: pd.DataFrame) -> np.ndarray:
        cap = features[L.MAX_TOKENS].to_numpy(dtype="float64", na_value=np.nan)
        cap = np.where(np.isfinite(cap), cap, self.default_max_tokens_)
        return prompt_tokens(features)[:, None] + np.outer(cap, self.uses_cap_.astype(float))

    def write_state(self, writer: StateWriter) -> None:
        _fitted(self, "uses_cap_")
        writer.put_array("uses_cap.npy", self.uses_cap_)
        writer.put_json("baseline.json", _header(
            self, {"quantiles": [float(q) for q in self.quantiles],
                   "default_max_tokens": self.default_max_tokens},
            {"default_max_tokens_": float(self.default_max_tokens_)}))

    @classmethod
    def read_state(cls, reader: StateReader) -> MaxTokensCapBaseline:
        doc = _read_header(cls, reader)
        p = doc["params"]
        b = cls(tuple(p["quantiles"]), p["default_max_tokens"])
        b.default_max_tokens_ = float(doc["fitted"]["default_max_tokens_"])
        b.uses_cap_ = reader.get_array("uses_cap.npy")
        return b


class CategoryBucketBaseline:
    """Prompt + output quantiles of the row's bucket, with prefix and global fallback.

    bucket_columns: finest bucket first, e.g. (category, decision): a bucket
    with fewer than `min_bucket_size` train rows uses (category), then global.
    """

    name = "category_bucket"

    def __init__(self, quantiles: Sequence[float] = (0.1, 0.5, 0.9),
                 bucket_columns: Sequence[str] = (L.CATEGORY, L.DECISION),
                 min_bucket_size: int = 30) -> None:
        self.quantiles = quantiles
        self.bucket_columns = bucket_columns
        self.min_bucket_size = min_bucket_size

    def fit(self, features: pd.DataFrame, y: np.ndarray) -> CategoryBucketBaseline:
        qs = check_quantiles(self.quantiles)
        if int(self.min_bucket_size) < 1:
            raise ValueError(f"min_bucket_size={self.min_bucket_size!r}: must be >= 1")
        out = output_labels(features, y)
        self.global_quantiles_ = np.quantile(out, qs)
        keys = bucket_keys(features, self.bucket_columns)
        # tables_[k]: quantiles (q columns) per bucket of the first k+1 columns, big enough only
        self.tables_: list[pd.DataFrame] = []
        for k in range(1, len(self.bucket_columns) + 1):
            cols = list(self.bucket_columns[:k])
            g = pd.Series(out, index=features.index).groupby([keys[c] for c in cols])
            size = g.size()
            big = size.index[size >= int(self.min_bucket_size)]
            table = g.quantile(list(qs)).unstack(-1)
            self.tables_.append(table.loc[big].set_axis(list(range(len(qs))), axis=1)
                                if len(big) else table.iloc[:0])
        return self

    def predict_quantiles(self, features: pd.DataFrame) -> np.ndarray:
        return prompt_tokens(features)[:, None] + self._output_quantiles(features)

    def _output_quantiles(self, features: pd.DataFrame) -> np.ndarray:
        """Output quantiles (n, q): finest bucket with enough train rows, else coarser."""
        out = np.tile(self.global_quantiles_, (len(features), 1))
        keys = bucket_keys(features, self.bucket_columns)
        for k, table in enumerate(self.tables_):  # coarse -> fine: finer overwrites
            if table.empty:
                continue
            cols = list(self.bucket_columns[:k + 1])
            idx = pd.MultiIndex.from_frame(keys[cols]) if len(cols) > 1 else pd.Index(keys[cols[0]])
            hit = table.reindex(idx).to_numpy(dtype=float)
            found = np.isfinite(hit).all(axis=1)
            out[found] = hit[found]
        return out

    def write_state(self, writer: StateWriter) -> None:
        """`baseline.json` (params, each table's index keys and column labels), the global
        quantiles and each table's values (`table-<k>.npy`, (rows, q))."""
        _fitted(self, "tables_")
        writer.put_array("global_quantiles.npy", self.global_quantiles_)
        tables = []
        for k, table in enumerate(self.tables_):
            writer.put_array(f"table-{k}.npy", table.to_numpy(dtype="float64"))
            tables.append({"index_names": [str(n) for n in table.index.names],
                           "keys": [list(t) if isinstance(t, tuple) else t
                                    for t in table.index.tolist()],
                           "columns": [c.item() if isinstance(c, np.generic) else c
                                       for c in table.columns.tolist()]})
        writer.put_json("baseline.json", _header(
            self, {"quantiles": [float(q) for q in self.quantiles],
                   "bucket_columns": list(self.bucket_columns),
                   "min_bucket_size": int(self.min_bucket_size)}, {"tables_": tables}))

    @classmethod
    def read_state(cls, reader: StateReader) -> CategoryBucketBaseline:
        doc = _read_header(cls, reader)
        p = doc["params"]
        b = cls(tuple(p["quantiles"]), tuple(p["bucket_columns"]), int(p["min_bucket_size"]))
        b.global_quantiles_ = reader.get_array("global_quantiles.npy")
        b.tables_ = []
        for k, t in enumerate(doc["fitted"]["tables_"]):
            values, names = reader.get_array(f"table-{k}.npy"), t["index_names"]
            if len(names) > 1:
                levels = [np.array([row[i] for row in t["keys"]], dtype=object)
                          for i in range(len(names))]
                index = pd.MultiIndex.from_arrays(levels, names=names)
            else:
                index = pd.Index(np.array(t["keys"], dtype=object), name=names[0])
            if values.shape != (len(index), len(t["columns"])):
                raise RunStateError(f"{reader.where}: table-{k}.npy has shape {values.shape}, "
                                    f"its keys and columns say ({len(index)}, {len(t['columns'])})")
            b.tables_.append(pd.DataFrame(values, index=index, columns=pd.Index(t["columns"])))
        return b


class SessionEwmaBaseline:
    """Prompt + session EWMA of earlier outputs x learned ratio quantiles; bucket on first turns.

    min_history_rows: train rows with a session history needed to learn the
    ratio; with fewer, every row uses the bucket fallback.
    """

    name = "session_ewma"

    def __init__(self, quantiles: Sequence[float] = (0.1, 0.5, 0.9),
                 bucket_columns: Sequence[str] = (L.CATEGORY, L.DECISION),
                 min_bucket_size: int = 30, min_history_rows: int = 20) -> None:
        self.quantiles = quantiles
        self.bucket_columns = bucket_columns
        self.min_bucket_size = min_bucket_size
        self.min_history_rows = min_history_rows

    def fit(self, features: pd.DataFrame, y: np.ndarray) -> SessionEwmaBaseline:
        qs = check_quantiles(self.quantiles)
        out = output_labels(features, y)
        self.fallback_ = CategoryBucketBaseline(
            qs, self.bucket_columns, self.min_bucket_size).fit(features, y)
        ewma = features[P.COMPLETION_EWMA].to_numpy(dtype="float64", na_value=np.nan)
        has = np.isfinite(ewma)
        self.n_history_ = int(has.sum())
        self.ratio_quantiles_ = (np.quantile((out[has] + 1.0) / (ewma[has] + 1.0), qs)
                                 if self.n_history_ >= int(self.min_history_rows) else None)
        return self

    def predict_quantiles(self, features: pd.DataFrame) -> np.ndarray:
        pred = self.fallback_.predict_quantiles(features)
        if self.ratio_quantiles_ is None:
            return pred
        ewma = features[P.COMPLETION_EWMA].to_numpy(dtype="float64", na_value=np.nan)
        has = np.isfinite(ewma)
        out = np.maximum((ewma[has, None] + 1.0) * self.ratio_quantiles_[None, :] - 1.0, 0.0)
        pred[has] = prompt_tokens(features)[has, None] + out
        return pred

    def write_state(self, writer: StateWriter) -> None:
        """`baseline.json`, the ratio quantiles (if learned) and the bucket fallback's state
        (sub-folder `fallback`)."""
        _fitted(self, "fallback_")
        if self.ratio_quantiles_ is not None:
            writer.put_array("ratio_quantiles.npy", self.ratio_quantiles_)
        self.fallback_.write_state(writer.sub("fallback"))
        writer.put_json("baseline.json", _header(
            self, {"quantiles": [float(q) for q in self.quantiles],
                   "bucket_columns": list(self.bucket_columns),
                   "min_bucket_size": int(self.min_bucket_size),
                   "min_history_rows": int(self.min_history_rows)},
            {"n_history_": self.n_history_, "ratio_quantiles_": self.ratio_quantiles_ is not None}))

    @classmethod
    def read_state(cls, reader: StateReader) -> SessionEwmaBaseline:
        doc = _read_header(cls, reader)
        p = doc["params"]
        b = cls(tuple(p["quantiles"]), tuple(p["bucket_columns"]), int(p["min_bucket_size"]),
                int(p["min_history_rows"]))
        b.fallback_ = CategoryBucketBaseline.read_state(reader.sub("fallback"))
        b.n_history_ = int(doc["fitted"]["n_history_"])
        b.ratio_quantiles_ = (reader.get_array("ratio_quantiles.npy")
                              if doc["fitted"]["ratio_quantiles_"] else None)
        return b


def make_baselines(quantiles: Sequence[float], default_max_tokens: int | None,
                   bucket_columns: Sequence[str], min_bucket_size: int) -> dict:
    """The four baselines, unfitted, by name (the order of the summary)."""
    return {
        PromptLengthBaseline.name: PromptLengthBaseline(quantiles),
        MaxTokensCapBaseline.name: MaxTokensCapBaseline(quantiles, default_max_tokens),
        CategoryBucketBaseline.name: CategoryBucketBaseline(quantiles, bucket_columns,
                                                            min_bucket_size),
        SessionEwmaBaseline.name: SessionEwmaBaseline(quantiles, bucket_columns,
                                                      min_bucket_size),
    }


BASELINE_TYPES: dict[str, type] = {cls.name: cls for cls in (
    PromptLengthBaseline, MaxTokensCapBaseline, CategoryBucketBaseline, SessionEwmaBaseline)}


def write_baseline(baseline: object, writer: StateWriter) -> None:
    """Save a fitted baseline of a class in `BASELINE_TYPES`; any other is a RunStateError
    (it has no pickle-free state: add `write_state` / `read_state` and register it)."""
    name = getattr(baseline, "name", None)
    if BASELINE_TYPES.get(name) is not type(baseline):  # type: ignore[arg-type]
        raise RunStateError(f"baseline {type(baseline).__module__}.{type(baseline).__name__} "
                            f"(name {name!r}) has no pickle-free state; known: "
                            f"{', '.join(BASELINE_TYPES)} (replaylab.demand.baselines)")
    baseline.write_state(writer)  # type: ignore[attr-defined]


def read_baseline(reader: StateReader) -> object:
    """The baseline `write_baseline` saved, of the class its `baseline.json` names."""
    kind = reader.get_json("baseline.json").get("kind")
    if kind not in BASELINE_TYPES:
        raise RunStateError(f"{reader.where}: unknown baseline kind {kind!r}; known: "
                            f"{', '.join(BASELINE_TYPES)}")
    return BASELINE_TYPES[kind].read_state(reader)
