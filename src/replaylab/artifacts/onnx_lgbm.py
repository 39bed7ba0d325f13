"""Exact ONNX export of LightGBM boosters (no float32 thresholds).

The graph is built from `booster.dump_model()` (thresholds and leaf values are
printed with 17 significant digits there, so they round-trip exactly to double)
as one `TreeEnsemble` node of the `ai.onnx.ml` domain, opset 5: double input,
double thresholds, double leaf weights and a double output, summed in double.
(`TreeEnsembleRegressor` can take double thresholds since opset 3 but its output
is float32, which alone loses ~1e-7 relative; onnxmltools' default converter
also stores float32 thresholds, which flips branches near a threshold.)

Input `X`: (n, n_features) float64 in the booster's feature order, exactly as
LightGBM sees it: numeric values as they are (NaN = missing), categorical
columns as their pandas category codes in the vocabulary LightGBM trained on
(`booster.pandas_categorical`), NaN for missing or unseen (see
`design_to_matrix`). Output `raw`: (n, 1) float64, the raw score
(`booster.predict(X, raw_score=True)`).

LightGBM decision rules reproduced (LightGBM `Tree::NumericalDecision` /
`CategoricalDecision`):
- numerical `<=` split, missing_type None: NaN is treated as 0.0 -> one
  BRANCH_LEQ node with NaN going where 0.0 goes;
- missing_type NaN: NaN goes to the `default_left` side -> BRANCH_LEQ with
  `nodes_missing_value_tracks_true = default_left`;
- missing_type Zero (with `zero_as_missing=true`): NaN and the zero band
  |x| <= 1e-35f go to the default side: one node when the band already lies on
  that side of the threshold, else a 3-node chain (the two subtrees duplicated);
- categorical `==` split `a||b||c`: left iff int(x) is in the set; NaN and
  negative values go right -> one BRANCH_MEMBER node (NaN not tracked). Codes
  are integers, so the truncation int(x) is the identity on valid inputs.
Refused: linear trees, multi-output (multiclass) models, `average_output`
(random forest) and any other decision type.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
import pandas as pd
from onnx import TensorProto, helper, numpy_helper

ML_DOMAIN = "ai.onnx.ml"
ML_OPSET = 5  # TreeEnsemble (double in / out) first appears in ai.onnx.ml opset 5
ONNX_OPSET = 21
_K_ZERO = float(np.float32(1e-35))  # LightGBM kZeroThreshold (1e-35f)
_LEQ, _LT, _MEMBER = 0, 1, 6  # TreeEnsemble node modes


class UnsupportedBoosterError(ValueError):
    """The booster uses a LightGBM feature the exact export does not reproduce."""


def design_to_matrix(design: pd.DataFrame,
                     pandas_categorical: Sequence[Sequence[Any]] | None = None) -> np.ndarray:
    """The model's design frame -> (n, f) float64 exactly as LightGBM sees it.

    Numeric columns as float64 (NaN = missing); categorical columns as their
    category codes with -1 (missing / not in the vocabulary) -> NaN.
    pandas_categorical: the booster's `pandas_categorical` (one list per
    categorical column, in column order); when given, categorical columns are
    recoded to that vocabulary as LightGBM's own predict does.
    """
    cat_cols = [c for c in design.columns if isinstance(design[c].dtype, pd.CategoricalDtype)]
    if pandas_categorical is not None and len(pandas_categorical) != len(cat_cols):
        raise ValueError(f"{len(cat_cols)} categorical columns but the booster has "
                         f"{len(pandas_categorical)} vocabularies")
    out = np.empty((len(design), design.shape[1]), dtype="float64")
    vocab = dict(zip(cat_cols, pandas_categorical or [None] * len(cat_cols), strict=True))
    for j, c in enumerate(design.columns):
        s = design[c]
        if c in vocab:
            if vocab[c] is not None:
                s = s.cat.set_categories(list(vocab[c]))
            codes = np.asarray(s.cat.codes, dtype="float64")
            codes[codes < 0] = np.nan
            out[:, j] = codes
        else:
            out[:, j] = s.to_numpy(dtype="float64", na_value=np.nan)
    return out


class _TreeBuilder:
    """Flattens dumped LightGBM trees into TreeEnsemble (opset 5) attribute lists."""

    def __init__(self) -> None:
        self.feature: list[int] = []
        self.split: list[float] = []
        self.mode: list[int] = []
        self.true_id: list[int] = []
        self.true_leaf: list[int] = []
        self.false_id: list[int] = []
        self.false_leaf: list[int] = []
        self.missing_true: list[int] = []
        self.members: list[float] = []
        self.leaf_weight: list[float] = []
        self.leaf_target: list[int] = []
        self.roots: list[int] = []

    def _leaf(self, value: float, target: int) -> int:
        self.leaf_weight.append(float(value))
        self.leaf_target.append(target)
        return len(self.leaf_weight) - 1

    def _node(self) -> int:
        for lst in (self.feature, self.split, self.mode, self.true_id, self.true_leaf,
                    self.false_id, self.false_leaf, self.missing_true):
            lst.append(0)
        return len(self.feature) - 1

    def _child(self, sub: dict, target: int) -> tuple[int, int]:
        """(id, is_leaf) of a subtree, emitting it."""
        if "leaf_value" in sub:
            if "leaf_coeff" in sub or "leaf_features" in sub:
                raise UnsupportedBoosterError("linear trees (linear_tree=true) are not supported")
            return self._leaf(sub["leaf_value"], target), 1
        return self._split(sub, target), 0

    def _split(self, node: dict, target: int) -> int:
        i = self._node()
        self.feature[i] = int(node["split_feature"])
        decision = node["decision_type"]
        default_left = bool(node.get("default_left", False))
        missing = node.get("missing_type", "None")
        if decision == "<=":
            thr = float(node["threshold"])
            self.mode[i], self.split[i] = _LEQ, thr
            if missing == "None":  # NaN -> 0.0, then compared
                self.missing_true[i] = int(0.0 <= thr)
            elif missing == "NaN":
                self.missing_true[i] = int(default_left)
            elif missing == "Zero":
                # NaN -> 0 -> the default side; |x| <= kZero -> the default side too
                band_ok = thr >= _K_ZERO if default_left else thr < -_K_ZERO
                if not band_ok:  # the zero band straddles the threshold: a 3-node chain
                    self._zero_chain(i, node, thr, default_left, target)
                    return i
                self.missing_true[i] = int(default_left)
            else:
                raise UnsupportedBoosterError(f"missing_type {missing!r} is not supported")
        elif decision == "==":
            cats = [float(int(v)) for v in str(node["threshold"]).split("||") if v != ""]
            if any(c < 0 for c in cats):
                raise UnsupportedBoosterError(f"negative category in split {node['threshold']!r}")
            self.mode[i], self.split[i] = _MEMBER, 0.0
            self.members.extend([*cats, np.nan])
            self.missing_true[i] = 0  # NaN (and negatives) -> right
        else:
            raise UnsupportedBoosterError(f"decision_type {decision!r} is not supported")
        self.true_id[i], self.true_leaf[i] = self._child(node["left_child"], target)
        self.false_id[i], self.false_leaf[i] = self._child(node["right_child"], target)
        return i

    def _zero_chain(self, i: int, node: dict, thr: float, default_left: bool,
                    target: int) -> None:
        """missing_type=Zero where [-kZero, kZero] is not on the default side of `thr`.

        default_left: x <= thr (NaN too) -> L; x < -kZero -> R; x <= kZero -> L; else R.
        default right: x < -kZero -> L; x <= kZero (NaN too) -> R; x <= thr -> L; else R.
        Each side's subtree is emitted twice (once per path that reaches it).
        """
        left, right = node["left_child"], node["right_child"]
        first = (_LEQ, thr, 1, left) if default_left else (_LT, -_K_ZERO, 0, left)
        second = (_LT, -_K_ZERO, 0, right) if default_left else (_LEQ, _K_ZERO, 1, right)
        last = (_LEQ, _K_ZERO, 0, left, right) if default_left else (_LEQ, thr, 0, left, right)
        feature = int(node["split_feature"])
        ids = [i, self._node(), self._node()]
        for j, (mode, split, miss, true_sub, *false_sub) in enumerate((first, second, last)):
            n = ids[j]
            self.feature[n], self.mode[n], self.split[n] = feature, mode, split
            self.missing_true[n] = miss
            self.true_id[n], self.true_leaf[n] = self._child(true_sub, target)
            if false_sub:
                self.false_id[n], self.false_leaf[n] = self._child(false_sub[0], target)
            else:
                self.false_id[n], self.false_leaf[n] = ids[j + 1], 0

    def add_tree(self, structure: dict, target: int) -> None:
        if "leaf_value" in structure:  # a single-leaf tree: a node whose sides meet
            i = self._node()
            leaf, _ = self._child(structure, target)
            self.true_id[i] = self.false_id[i] = leaf
            self.true_leaf[i] = self.false_leaf[i] = 1
            self.missing_true[i] = 1
        else:
            i = self._split(structure, target)
        self.roots.append(i)

    def attributes(self, n_targets: int) -> dict[str, Any]:
        def dbl(name: str, values: list[float]) -> onnx.TensorProto:
            return numpy_helper.from_array(np.asarray(values, dtype="float64"), name)

        attrs: dict[str, Any] = dict(
            aggregate_function=1, post_transform=0, n_targets=n_targets,
            tree_roots=self.roots,
            nodes_featureids=self.feature,
            nodes_splits=dbl("nodes_splits", self.split),
            nodes_modes=numpy_helper.from_array(np.asarray(self.mode, dtype="uint8"),
                                                "nodes_modes"),
            nodes_truenodeids=self.true_id, nodes_trueleafs=self.true_leaf,
            nodes_falsenodeids=self.false_id, nodes_falseleafs=self.false_leaf,
            nodes_missing_value_tracks_true=self.missing_true,
            leaf_targetids=self.leaf_target,
            leaf_weights=dbl("leaf_weights", self.leaf_weight),
        )
        if self.members:
            attrs["membership_values"] = dbl("membership_values", self.members)
        return attrs


def _add_booster(builder: _TreeBuilder, booster: Any, target: int,
                 num_iteration: int | None) -> dict:
    dump = booster.dump_model(num_iteration=num_iteration)
    if int(dump.get("num_tree_per_iteration", 1)) != 1 or int(dump.get("num_class", 1)) != 1:
        raise UnsupportedBoosterError("only single-output boosters (one tree per iteration)")
    if dump.get("average_output", False):
        raise UnsupportedBoosterError("average_output (boosting=rf) is not supported")
    for tree in dump["tree_info"]:
        builder.add_tree(tree["tree_structure"], target)
    return dump


def _model(builder: _TreeBuilder, n_features: int, n_targets: int, doc: str,
           metadata: dict[str, str]) -> onnx.ModelProto:
    node = helper.make_node("TreeEnsemble", ["X"], ["raw"], domain=ML_DOMAIN,
                            name="lightgbm_trees", **builder.attributes(n_targets))
    graph = helper.make_graph(
        [node], "lightgbm_raw_score",
        [helper.make_tensor_value_info("X", TensorProto.DOUBLE, [None, n_features])],
        [helper.make_tensor_value_info("raw", TensorProto.DOUBLE, [None, n_targets])])
    model = helper.make_model(graph, producer_name="replaylab", doc_string=doc, opset_imports=[
        helper.make_opsetid("", ONNX_OPSET), helper.make_opsetid(ML_DOMAIN, ML_OPSET)])
    model.ir_version = 10
    helper.set_model_props(model, metadata)
    onnx.checker.check_model(model, full_check=True)
    return model


def _check_features(booster: Any, feature_names: Sequence[str]) -> list[str]:
    names = list(feature_names)
    if names != list(booster.feature_name()):
        raise ValueError(f"feature_names {names} differ from the booster's "
                         f"{booster.feature_name()}")
    return names


def booster_to_onnx(booster: Any, feature_names: Sequence[str], *,
                    num_iteration: int | None = None, opset: int = ML_OPSET) -> onnx.ModelProto:
    """One booster -> ONNX: input `X` (n, f) float64 (see `design_to_matrix`), output `raw` (n, 1).

    num_iteration: trees used (None: the booster's best iteration, else all),
    as in `booster.predict`. Raises UnsupportedBoosterError for what the exact
    export does not reproduce (module docstring).
    """
    if opset != ML_OPSET:
        raise ValueError(f"only ai.onnx.ml opset {ML_OPSET} (TreeEnsemble, double) is supported")
    names = _check_features(booster, feature_names)
    builder = _TreeBuilder()
    _add_booster(builder, booster, 0, num_iteration)
    return _model(builder, len(names), 1, "LightGBM raw score (exact, double)",
                  {"feature_names": ",".join(names)})


def demand_model_to_onnx(model: Any) -> onnx.ModelProto:
    """A fitted QuantileDemandModel -> one graph: `X` (n, f) float64 -> `raw` (n, q) float64.

    Column j is the raw (model-scale, before sorting) prediction of the booster
    of `model.quantiles[j]` with its `best_iterations_[j]` trees. The rest of
    `predict_quantiles` (sort, inverse of `model.scale`, + prompt, clip to the
    cap) is NOT in the graph: the runtime applies it in numpy.
    """
    boosters, iters = model.boosters_, model.best_iterations_
    names = list(model.feature_names_)
    builder = _TreeBuilder()
    for j, (b, k) in enumerate(zip(boosters, iters, strict=True)):
        _check_features(b, names)
        _add_booster(builder, b, j, int(k))
    meta = {"feature_names": ",".join(names),
            "quantiles": ",".join(f"{float(q):.17g}" for q in model.quantiles),
            "scale": str(model.scale)}
    return _model(builder, len(names), len(boosters),
                  "QuantileDemandModel raw quantile scores (exact, double)", meta)
