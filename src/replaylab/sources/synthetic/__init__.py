"""The seeded synthetic replay ledger (ledger-v1), the embedded default data (docs/design/synthetic-ledger.md).

    generator.py  the draw, session by session and turn by turn: `generate_synthetic_ledger`
    config.py     `SyntheticLedgerConfig`, validated at construction
    params.py     the distributions fitted to public traces (scripts/fit_synthetic.py)
    frame.py      the drawn arrays, their codes and their ledger-v1 columns
    chunks.py     a big ledger in independent seeded chunks, one Parquet file each

The two names most callers need are re-exported here.
"""

from replaylab.sources.synthetic.config import SyntheticLedgerConfig
from replaylab.sources.synthetic.generator import generate_synthetic_ledger

__all__ = ["SyntheticLedgerConfig", "generate_synthetic_ledger"]
