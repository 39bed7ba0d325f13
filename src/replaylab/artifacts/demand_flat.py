"""The demand model as flat tree arrays (`trees.safetensors`), for engines without onnxruntime.

`flat_trees(model)` turns a fitted QuantileDemandModel into LightGBM's own node
arrays (docs/specs/demand-scorer.md is the byte-level specification):

    tree_output     I32 (T,)    the quantile column (position in outputs.quantiles) a tree adds to
    tree_root       I32 (T,)    its root: a node index >= 0, or ~leaf (< 0) for a one-leaf tree
    node_feature    I32 (N,)    feature index (position in the manifest's `features`)
    node_threshold  F64 (N,)    LightGBM's double threshold, exact (numerical splits; 0 else)
    node_decision   U8  (N,)    LightGBM's decision_type bits: 1 categorical, 2 default_left,
                                (missing type << 2): 0 None, 1 Zero, 2 NaN
    node_left       I32 (N,)    child taken on "left": a node index, or ~leaf
    node_right      I32 (N,)    child taken on "right"
    node_cat_offset I32 (N+1,)  categories of node i: cat_values[offset[i]:offset[i+1]]
    cat_values      I32 (M,)    category codes that go left, ascending (LightGBM's `a||b||c`)
    leaf_value      F64 (L,)    leaf outputs, exact
    leaf_index      I32 (L,)    the leaf's index within its tree (LightGBM's `leaf_index`,
                                what `booster.predict(..., pred_leaf=True)` reports)

The trees of quantile j are its booster's first `best_iterations_[j]` trees, in
booster order; raw[j] = 0.0 + leaf(t0) + leaf(t1) + ... in file order is the
booster's raw score bit for bit (LightGBM's `GBDT::PredictRaw` sums the same way).
`flat_predict` is the numpy reference walk (LightGBM's `Tree::NumericalDecision`
and `CategoricalDecision`), used by the export's parity gate and the tests.

Why a flat file and not the ONNX graph: reading model.onnx needs a protobuf
decoder and the TreeEnsemble attribute semantics (modes, missing tracks, the
3-node chains the exact export emits for missing_type Zero); these arrays are
LightGBM's decision rule itself, a dozen lines to walk in any language.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from replaylab.runtime.demand.spec import FeatureSpec

TREES_FILE = "trees.safetensors"
TREES_FORMAT = "replaylab-demand-trees-1"
CATEGORICAL, DEFAULT_LEFT = 1, 2  # decision_type bits (LightGBM's kCategoricalMask, kDefaultLeftMask)
MISSING = {"None": 0, "Zero": 1, "NaN": 2}  # missing type, decision_type bits 2-3
K_ZERO = float(np.float32(1e-35))  # LightGBM kZeroThreshold (1e-35f, widened to double)


class FlatTreesError(ValueError):
    """The booster uses a LightGBM feature the flat export does not carry."""


class _Flat:
    def __init__(self) -> None:
        self.feature: list[int] = []
        self.threshold: list[float] = []
        self.decision: list[int] = []
        self.left: list[int] = []
        self.right: list[int] = []
        self.cats: list[list[int]] = []
        self.leaves: list[float] = []
        self.leaf_index: list[int] = []

    def child(self, sub: dict) -> int:
        """Emit a dumped subtree; its reference (node index, or ~leaf index)."""
        if "leaf_value" in sub:
            if "leaf_coeff" in sub or "leaf_features" in sub:
                raise FlatTreesError("linear trees (linear_tree=true) are not supported")
            self.leaves.append(float(sub["leaf_value"]))
            self.leaf_index.append(int(sub.get("leaf_index", 0)))  # a one-leaf tree has none: 0
            return ~(len(self.leaves) - 1)
        i = len(self.feature)
        missing = sub.get("missing_type", "None")
        if missing not in MISSING:
            raise FlatTreesError(f"missing_type {missing!r} is not supported")
        bits = (DEFAULT_LEFT if sub.get("default_left", False) else 0) | (MISSING[missing] << 2)
        if sub["decision_type"] == "<=":
            thr, cats = float(sub["threshold"]), []
        elif sub["decision_type"] == "==":
            bits |= CATEGORICAL
            thr = 0.0
            cats = sorted({int(v) for v in str(sub["threshold"]).split("||") if v != ""})
            if any(c < 0 for c in cats):
                raise FlatTreesError(f"negative category in split {sub['threshold']!r}")
        else:
            raise FlatTreesError(f"decision_type {sub['decision_type']!r} is not supported")
        self.feature.append(int(sub["split_feature"]))
        self.threshold.append(thr)
        self.decision.append(bits)
        self.cats.append(cats)
        self.left.append(0)
        self.right.append(0)
        self.left[i] = self.child(sub["left_child"])  # depth first, left subtree first
        self.right[i] = self.child(sub["right_child"])
        return i


def flat_trees(model: Any) -> dict[str, np.ndarray]:
    """A fitted QuantileDemandModel -> the named arrays of trees.safetensors (module docstring)."""
    flat, outputs, roots = _Flat(), [], []
    for j, (booster, k) in enumerate(zip(model.boosters_, model.best_iterations_, strict=True)):
        dump = booster.dump_model(num_iteration=int(k))
        if int(dump.get("num_tree_per_iteration", 1)) != 1 or dump.get("average_output", False):
            raise FlatTreesError("only single-output gradient-boosted boosters")
        if list(booster.feature_name()) != list(model.feature_names_):
            raise FlatTreesError("a booster's features differ from the model's")
        for tree in dump["tree_info"]:
            roots.append(flat.child(tree["tree_structure"]))
            outputs.append(j)
    offset = np.cumsum([0, *(len(c) for c in flat.cats)])
    i32 = np.int32
    return {
        "tree_output": np.asarray(outputs, i32), "tree_root": np.asarray(roots, i32),
        "node_feature": np.asarray(flat.feature, i32),
        "node_threshold": np.asarray(flat.threshold, np.float64),
        "node_decision": np.asarray(flat.decision, np.uint8),
        "node_left": np.asarray(flat.left, i32), "node_right": np.asarray(flat.right, i32),
        "node_cat_offset": offset.astype(i32),
        "cat_values": np.asarray([c for cs in flat.cats for c in cs], i32),
        "leaf_value": np.asarray(flat.leaves, np.float64),
        "leaf_index": np.asarray(flat.leaf_index, i32),
    }


def trees_bytes(arrays: dict[str, np.ndarray], n_features: int, quantiles: list[float]) -> bytes:
    """trees.safetensors bytes (safetensors, little endian; metadata: format, widths)."""
    from safetensors.numpy import save  # export side only: the runtime never writes it

    meta = {"format": TREES_FORMAT, "n_features": str(int(n_features)),
            "quantiles": ",".join(f"{float(q):.17g}" for q in quantiles)}
    return canonical_header(save({k: np.ascontiguousarray(v) for k, v in arrays.items()},
                                 metadata=meta))


def canonical_header(blob: bytes) -> bytes:
    """The same safetensors file with its JSON header written with sorted keys.

    safetensors writes `__metadata__` from a hash map, so its key order (and the file's
    bytes, its SHA-256 and the manifest's content hash) changed from call to call on the
    same arrays; sorted, one export of one run is one content hash. The tensors' offsets
    are relative to the data section, which is kept byte for byte; the header is padded
    with spaces to a multiple of 8 bytes, as safetensors does."""
    import json

    n = int.from_bytes(blob[:8], "little")
    header = json.dumps(json.loads(blob[8:8 + n]), sort_keys=True, separators=(",", ":"))
    raw = header.encode("utf-8")
    raw += b" " * (-len(raw) % 8)
    return len(raw).to_bytes(8, "little") + raw + blob[8 + n:]


def _goes_left(x: float, bits: int, thr: float, cats: np.ndarray) -> bool:
    """LightGBM's `Tree::Decision` for one node (numerical or categorical)."""
    if bits & CATEGORICAL:
        if x != x:  # NaN: always right
            return False
        code = int(x)  # C++ static_cast<int>: truncation toward zero
        return code >= 0 and bool(np.any(cats == code))
    missing = (bits >> 2) & 3
    if x != x and missing != MISSING["NaN"]:
        x = 0.0
    if (missing == MISSING["Zero"] and -K_ZERO <= x <= K_ZERO) or \
            (missing == MISSING["NaN"] and x != x):
        return bool(bits & DEFAULT_LEFT)
    return x <= thr


def flat_predict(arrays: dict[str, np.ndarray], X: np.ndarray, n_outputs: int) -> np.ndarray:
    """Raw scores (n, n_outputs) of feature rows X (n, f) float64: every tree walked, summed in order.

    A plain loop (the reference, not a fast path): a few thousand node visits per row.
    """
    a = {k: np.asarray(v) for k, v in arrays.items()}
    feat, thr, dec = a["node_feature"].tolist(), a["node_threshold"].tolist(), \
        a["node_decision"].tolist()
    left, right, off = a["node_left"].tolist(), a["node_right"].tolist(), \
        a["node_cat_offset"].tolist()
    cats, leaf = a["cat_values"], a["leaf_value"].tolist()
    trees = list(zip(a["tree_output"].tolist(), a["tree_root"].tolist(), strict=True))
    out = np.zeros((len(X), n_outputs), dtype=np.float64)
    for r, row in enumerate(np.asarray(X, dtype=np.float64).tolist()):
        acc = [0.0] * n_outputs
        for j, node in trees:
            while node >= 0:
                go = _goes_left(row[feat[node]], dec[node], thr[node],
                                cats[off[node]:off[node + 1]])
                node = left[node] if go else right[node]
            acc[j] += leaf[~node]
        out[r] = acc
    return out


def schema_matrix(frame: pd.DataFrame, features: Sequence[FeatureSpec]) -> np.ndarray:
    """Projection rows -> (n, f) float64 as LightGBM sees them, from the manifest's feature schema
    (the typed records, `FeatureSpec.from_dict` of each `features` entry).

    Numeric and bool columns as float64 (NaN = missing); a category column as the
    position of str(value) in its vocabulary, NaN when missing or unseen (the
    training design's encoding, `QuantileDemandModel` + `design_to_matrix`).
    """
    out = np.empty((len(frame), len(features)), dtype=np.float64)
    for j, f in enumerate(features):
        s = frame[f.name] if f.name in frame else pd.Series(np.nan, index=frame.index)
        if f.kind == "category":
            index = {v: i for i, v in enumerate(f.vocabulary or ())}
            out[:, j] = [np.nan if pd.isna(v) else index.get(str(v), np.nan) for v in s]
        else:
            out[:, j] = s.to_numpy(dtype="float64", na_value=np.nan)
    return out
