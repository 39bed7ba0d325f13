"""The versioned workload-archetype taxonomy (docs/design/archetypes.md).

An archetype is a band of MEASURABLE demand, never of prompt meaning: the
prompt-length band, the output-length band and the session-depth band of a
request, e.g. `pM.oS.d1` = a 1,024-4,095-token prompt, under 128 output tokens,
first turn of its session. The slo class is not folded into the label: it is its
own (allow-listed) column of aggregates-v1, so the two stay separable.

A version's vocabulary is fixed and finite; a taxonomy never changes in place:
new edges or bands are a new version (`arch-2`), and aggregates carry the
`taxonomy_version` that labelled them.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import product

import numpy as np
import pandas as pd

from replaylab.contracts.columns import Ledger as L

# Suppressed cells merged together (aggregate.py) and the all-archetype total.
OTHER = "other"
ALL = "all"


@dataclass(frozen=True)
class Taxonomy:
    """Band edges (lower bounds, tokens or turns) and one-letter band names.

    `prompt_edges[i]` is the lowest value of band `prompt_bands[i]`; a null token
    count falls in the band `U` (unknown), never in a guessed one.
    """

    version: str
    prompt_edges: tuple[int, ...]
    prompt_bands: tuple[str, ...]
    output_edges: tuple[int, ...]
    output_bands: tuple[str, ...]
    depth_edges: tuple[int, ...]  # on turn_index + 1 (1 = first turn)
    depth_bands: tuple[str, ...]
    unknown: str = "U"

    @property
    def vocabulary(self) -> tuple[str, ...]:
        """Every label this version can emit, in code order (not counting `other`)."""
        prompts = (*self.prompt_bands, self.unknown)
        outputs = (*self.output_bands, self.unknown)
        return tuple(f"p{p}.o{o}.d{d}" for p, o, d in product(prompts, outputs,
                                                               self.depth_bands))


# arch-1 edges: prompt bands follow prefill cost and KV-cache footprint (1k / 4k /
# 16k tokens are the usual context-tier boundaries); output bands follow decode
# time (128 tokens: a short answer or a code completion; 1,024: a long answer;
# reasoning traces are above); depth: first turn, an early follow-up, a long session.
ARCH_1 = Taxonomy(
    version="arch-1",
    prompt_edges=(0, 1024, 4096, 16384), prompt_bands=("S", "M", "L", "X"),
    output_edges=(0, 128, 1024), output_bands=("S", "M", "L"),
    depth_edges=(1, 2, 5), depth_bands=("1", "2", "3"),
)

TAXONOMIES: dict[str, Taxonomy] = {ARCH_1.version: ARCH_1}
TAXONOMY_VERSION = ARCH_1.version  # the current default


def get_taxonomy(version: str = TAXONOMY_VERSION) -> Taxonomy:
    if version not in TAXONOMIES:
        raise ValueError(f"taxonomy_version={version!r} is unknown; known: {sorted(TAXONOMIES)}")
    return TAXONOMIES[version]


def _band_codes(values: pd.Series, edges: tuple[int, ...]) -> np.ndarray:
    """Band index per value; len(edges) (the `U` band) where the value is null."""
    x = pd.to_numeric(values, errors="coerce").astype("float64").to_numpy()
    codes = np.searchsorted(np.asarray(edges, dtype=float), x, side="right") - 1
    codes = np.clip(codes, 0, len(edges) - 1)
    return np.where(np.isnan(x), len(edges), codes)


def assign_archetypes(ledger_features: pd.DataFrame,
                      taxonomy_version: str = TAXONOMY_VERSION) -> pd.Series:
    """One archetype label per row (categorical over the version's fixed vocabulary).

    Needs `prompt_tokens`, `completion_tokens` (nullable) and `turn_index`
    (ledger-v1 names). Output length is the MEASURED completion: archetypes
    describe served demand for aggregates, not a pre-dispatch prediction.
    """
    tax = get_taxonomy(taxonomy_version)
    missing = [c for c in (L.PROMPT_TOKENS, L.COMPLETION_TOKENS, L.TURN_INDEX)
               if c not in ledger_features.columns]
    if missing:
        raise ValueError(f"assign_archetypes needs column(s) {', '.join(missing)}")
    p = _band_codes(ledger_features[L.PROMPT_TOKENS], tax.prompt_edges)
    o = _band_codes(ledger_features[L.COMPLETION_TOKENS], tax.output_edges)
    turns = pd.to_numeric(ledger_features[L.TURN_INDEX], errors="coerce").fillna(0) + 1
    d = np.clip(np.searchsorted(np.asarray(tax.depth_edges, float),
                                turns.to_numpy(float), side="right") - 1,
                0, len(tax.depth_edges) - 1)
    n_o, n_d = len(tax.output_bands) + 1, len(tax.depth_bands)
    codes = (p * n_o + o) * n_d + d
    labels = pd.Categorical.from_codes(codes.astype(int), categories=list(tax.vocabulary))
    return pd.Series(labels, index=ledger_features.index, name="archetype")
