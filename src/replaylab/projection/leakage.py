"""Label-leakage guard: refuse a feature that is (nearly) a function of a label.

Three tests, any of which refuses a feature column:

1. name: it starts with a prefix that names an outcome (`label_`, `completion`,
   `ended`, `duration`, `finish`, ...) and is not explicitly allowed;
2. equality: on the rows where both are present, its values equal a label's;
3. rank correlation: |Spearman(feature, label)| > threshold on a seeded sample
   of up to `max_rows` rows (monotone transforms of a label, e.g.
   `2 * completion_tokens + noise`, have |rho| ~ 1).

Only numeric and boolean columns take tests 2-3 (a string column cannot be
ranked meaningfully); every column takes test 1.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pandas as pd

from replaylab.config import ConfigError

# Names that say "this was known only after the response": refused as features.
FORBIDDEN_PREFIXES = (
    "label_", "completion", "ended", "duration", "finish", "lifecycle", "terminal",
    "outcome", "actual_cost", "ack_", "total_demand",
)


class LeakageError(ConfigError):
    """A feature column that carries the label (or looks like it does).

    A ConfigError: the fix is a setting (drop the feature from
    `projection.extra_feature_columns`, or `projection.canary_checks=false` to
    decide by hand), and the entry points report it in one line, exit code 2.
    """


def _as_float(s: pd.Series) -> np.ndarray | None:
    """Numeric/bool column as float64 with NaN for null; None for other kinds."""
    if pd.api.types.is_bool_dtype(s) or pd.api.types.is_numeric_dtype(s):
        return s.to_numpy(dtype="float64", na_value=np.nan)
    return None


def _spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman rho of two equal-length float arrays without nulls (average ranks)."""
    ra = pd.Series(a).rank(method="average").to_numpy()
    rb = pd.Series(b).rank(method="average").to_numpy()
    ra -= ra.mean()
    rb -= rb.mean()
    denom = np.sqrt((ra * ra).sum() * (rb * rb).sum())
    return float((ra * rb).sum() / denom) if denom > 0 else 0.0


def _name_offenders(columns: Iterable[str], allowed: set[str]) -> list[str]:
    return [f"feature {c!r}: name looks like an outcome (prefix of {FORBIDDEN_PREFIXES})"
            for c in columns if c not in allowed and str(c).startswith(FORBIDDEN_PREFIXES)]


def _pair_problem(fname: str, lname: str, x: np.ndarray, y: np.ndarray,
                  full: tuple[pd.Series, pd.Series] | None, threshold: float,
                  min_rows: int) -> str | None:
    """Test 2-3 for one (feature, label) pair on sampled values x, y (float, NaN = null).

    `full` holds the unsampled columns: equality seen on the sample is confirmed there.
    """
    both = ~np.isnan(x) & ~np.isnan(y)
    xs, ys = x[both], y[both]
    if len(xs) < min_rows or np.ptp(xs) == 0 or np.ptp(ys) == 0:
        return None  # too little data, or a constant side that carries no label information
    if np.array_equal(xs, ys):
        fx, fy = (x, y) if full is None else (_as_float(full[0]), _as_float(full[1]))
        fb = ~np.isnan(fx) & ~np.isnan(fy)
        if np.array_equal(fx[fb], fy[fb]):
            return f"feature {fname!r} equals label {lname!r} on every row"
    rho = _spearman(xs, ys)
    if abs(rho) > threshold:
        return f"feature {fname!r} tracks label {lname!r}: |spearman|={abs(rho):.4f} > {threshold}"
    return None


def check_no_label_leakage(features: pd.DataFrame, labels: pd.DataFrame | pd.Series,
                           threshold: float = 0.99, *, allowed: Iterable[str] = (),
                           max_rows: int = 20_000, min_rows: int = 30, seed: int = 0) -> None:
    """Raise LeakageError naming every feature column that leaks one of `labels`.

    features: (n, p) frame of feature columns only; labels: (n,) series or
    (n, q) frame aligned row by row. Tests 2-3 run on a seeded sample of
    `max_rows` rows (equality is confirmed on all rows); a pair with fewer than
    `min_rows` rows where both are present, or with a constant side, is skipped.
    """
    allowed_set = set(allowed)
    problems = _name_offenders(features.columns, allowed_set)
    label_frame = labels.to_frame() if isinstance(labels, pd.Series) else labels
    n = len(features)
    sampled = n > max_rows
    if sampled:
        pick = np.sort(np.random.default_rng(seed).choice(n, size=max_rows, replace=False))
        fs, ls = features.iloc[pick], label_frame.iloc[pick]
    else:
        fs, ls = features, label_frame
    xs = {c: _as_float(fs[c]) for c in features.columns if c not in allowed_set}
    for lname in label_frame.columns:
        y = _as_float(ls[lname])
        if y is None:
            continue
        for fname, x in xs.items():
            if x is None:
                continue
            full = (features[fname], label_frame[lname]) if sampled else None
            problem = _pair_problem(str(fname), str(lname), x, y, full, threshold, min_rows)
            if problem:
                problems.append(problem)
    if problems:
        raise LeakageError("label leakage refused: " + "; ".join(problems))


def canary_self_test(labels: pd.Series, threshold: float, *, min_rows: int = 30,
                     seed: int = 0) -> bool:
    """Prove the guard fires on this data: a column 2*label + noise must be refused.

    Returns False when the data cannot carry the test (too few labelled rows or
    a constant label); raises LeakageError when the guard misses the canary.
    """
    y = _as_float(labels)
    if y is None:
        return False
    present = ~np.isnan(y)
    if present.sum() < min_rows or np.ptp(y[present]) == 0:
        return False
    noise = np.random.default_rng(seed).uniform(0.0, 0.5, size=len(y))
    probe = pd.DataFrame({"probe": 2.0 * y + noise}, index=labels.index)
    try:
        check_no_label_leakage(probe, labels, threshold, min_rows=min_rows, seed=seed)
    except LeakageError:
        return True
    raise LeakageError(f"canary self-test failed: a copy of {labels.name!r} (2*label + noise) "
                       "was not detected; the leakage guard cannot vouch for this projection")
