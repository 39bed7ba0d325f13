"""Reading a run's summary (summary.json loaded as nested dicts) without trusting its shape.

Reports read keys that an older or a failed run may lack or hold as null; these
return a default or NaN instead of raising.
"""

from __future__ import annotations

import math
from typing import Any

_MISSING = object()


def lookup(d: Any, dotted: str, default: Any = None) -> Any:
    """``d['a']['b']`` for 'a.b', else default; keys may hold dots themselves
    ('pinball.0.9' finds ``d['pinball']['0.9']``). A d that is not a dict gives default."""
    if not isinstance(d, dict):
        return default
    if dotted in d:
        return d[dotted]
    parts = dotted.split(".")
    for i in range(len(parts) - 1, 0, -1):
        head = ".".join(parts[:i])
        if head in d:
            found = lookup(d[head], ".".join(parts[i:]), _MISSING)
            if found is not _MISSING:
                return found
    return default


def to_float(x: Any) -> float:
    """float(x), or NaN when x is None or not a number."""
    try:
        return float(x)
    except (TypeError, ValueError):
        return math.nan
