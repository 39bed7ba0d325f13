"""The folder of downloaded public files a results script reads: `--shared DIR`, else
$REPLAYLAB_SHARED_DATA. Never guessed: without either, one line and exit code 2.

What each file is and where to download it: `replaylab.sources.registry.SOURCES`
(docs/howto/import-data.md "Where to get each file"); the scripts name paths inside the
folder (e.g. `traces/azure_llm_2023/AzureLLMInferenceTrace_code.csv`).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from replaylab.contracts.errors import InputError

SHARED_DATA_ENV = "REPLAYLAB_SHARED_DATA"


class SharedDataMissing(InputError):
    """No folder of public files was named, or the one named is not a folder."""


def add_shared_argument(parser: argparse.ArgumentParser) -> None:
    """`--shared DIR` (default: $REPLAYLAB_SHARED_DATA, read by `shared_data_dir`)."""
    parser.add_argument("--shared", type=Path, default=None, metavar="DIR",
                        help=f"the folder of downloaded public files (default: ${SHARED_DATA_ENV}"
                             "; what to download: docs/howto/import-data.md)")


def shared_data_dir(given: str | Path | None) -> Path:
    """The folder `given` names, else $REPLAYLAB_SHARED_DATA's; SharedDataMissing when neither
    names one, or it is not a folder."""
    raw = str(given) if given not in (None, "") else os.environ.get(SHARED_DATA_ENV, "")
    if not raw:
        raise SharedDataMissing(f"no folder of public files: give --shared DIR or set "
                                f"{SHARED_DATA_ENV}=DIR (what to download into it: "
                                "docs/howto/import-data.md)")
    path = Path(raw).expanduser()
    if not path.is_dir():
        where = "--shared" if given not in (None, "") else SHARED_DATA_ENV
        raise SharedDataMissing(f"{where}={raw}: not a folder (what to download into it: "
                                "docs/howto/import-data.md)")
    return path.resolve()


def shared_data_or_exit(given: str | Path | None) -> Path:
    """`shared_data_dir`, or its one `error:` line on stderr and exit code 2 (for scripts)."""
    try:
        return shared_data_dir(given)
    except SharedDataMissing as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
