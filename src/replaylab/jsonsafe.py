"""JSON-safe summaries: numpy scalars to Python, NaN / inf to null, recursively."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np


def json_safe(tree: Any) -> Any:
    """Mappings (keys as str), lists, tuples and arrays walked; numpy scalars -> Python;
    non-finite floats -> None.

    An undefined metric (an unbounded interval, an APGR without a trade-off)
    becomes `null` rather than the non-standard `NaN` / `Infinity` tokens.
    """
    if isinstance(tree, Mapping):
        return {str(k): json_safe(v) for k, v in tree.items()}
    if isinstance(tree, list | tuple):
        return [json_safe(v) for v in tree]
    if isinstance(tree, np.ndarray):
        return [json_safe(v) for v in tree.tolist()]
    if isinstance(tree, np.generic):
        tree = tree.item()
    if isinstance(tree, float) and not math.isfinite(tree):
        return None
    return tree
