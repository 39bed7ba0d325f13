"""Azure LLM inference trace 2023 -> ledger-v1.

Source: Azure Public Dataset, "Azure LLM inference trace 2023"
(`AzureLLMInferenceTrace_code.csv`, `AzureLLMInferenceTrace_conv.csv`), two
production LLM inference services at Azure sampled for about one hour on
2023-11-16. License CC-BY-4.0. Cite: P. Patel et al., "Splitwise: Efficient
Generative LLM Inference Using Phase Splitting", ISCA 2024.

A row of the file is one request: `TIMESTAMP, ContextTokens, GeneratedTokens`.

Mapping (one ledger row per file row, file order kept):

- `timestamp`: `TIMESTAMP` (e.g. `2023-11-16 18:17:03.9799600`, 7 fractional
  digits, no zone; read as UTC) truncated to int64 epoch milliseconds.
- `prompt_tokens` = `ContextTokens`; `completion_tokens` = `GeneratedTokens`.
- `request_id` = `azure-<service>-<row>` (row: 0-based data row of the file).
  The trace has no sessions: `session_id` = `request_id`, `turn_index` = 0.
- `lifecycle_state` = `completed`: the trace lists served requests with their
  generated token counts; it records no failures or cancellations.
- `selected_model` = `azure-llm-2023-<service>`: a PLACEHOLDER. The trace does
  not name the model; each service is one logical model as far as the ledger
  can tell.
- `category` = `code` for the code service, `chat` for the conversation one.
- Not set (the trace does not say them): `ended_at`, `duration_ms`,
  `finish_reason`, `max_tokens`, `streaming`, `cached_prompt_tokens`.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd

from replaylab.contracts.columns import Ledger as L
from replaylab.contracts.enums import LifecycleState
from replaylab.contracts.ledger import LEDGER_VERSION
from replaylab.contracts.schema import ContractError

COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
# service (as in the file name) -> ledger category
CATEGORY = {"code": "code", "conv": "chat"}
_ALIASES = {"conversation": "conv", "chat": "conv"}


def _service_from_name(path: Path) -> str:
    m = re.search(r"(?:^|_)(code|conv)(?:_|\.|$)", path.name.lower())
    if m is None:
        raise ValueError(f"{path}: cannot tell the service (code/conv) from the file name; "
                         f"pass service='code' or service='conv'")
    return m.group(1)


def import_azure_llm_2023(path: str | Path, *, service: str | None = None) -> pd.DataFrame:
    """Read one Azure LLM inference trace 2023 CSV into a ledger-v1 frame.

    `service` is `code` or `conv` (aliases `chat`, `conversation`); None infers
    it from the file name (`..._code.csv` / `..._conv.csv`). See the module
    docstring for the source, license, citation and every mapping choice.
    Raises ContractError when the file lacks the trace's columns.
    """
    path = Path(path)
    svc = _service_from_name(path) if service is None else _ALIASES.get(service, service)
    if svc not in CATEGORY:
        raise ValueError(f"service must be one of code, conv (got {service!r})")
    raw = pd.read_csv(path)
    missing = [c for c in COLUMNS if c not in raw.columns]
    if missing:
        raise ContractError(f"{path}: missing column(s) {', '.join(missing)} "
                            f"(expected an Azure LLM trace 2023 file: {', '.join(COLUMNS)})")
    # No zone in the file: the Azure Public Dataset timestamps are UTC.
    ts = pd.to_datetime(raw["TIMESTAMP"], format="ISO8601", utc=True)
    ts_ms = ts.astype("datetime64[ns, UTC]").astype("int64") // 1_000_000
    rid = f"azure-{svc}-" + pd.Series(np.arange(len(raw)), dtype="int64").astype(str)
    return pd.DataFrame({
        L.VERSION: LEDGER_VERSION,
        L.REQUEST_ID: rid,
        L.SESSION_ID: rid,
        L.TURN_INDEX: np.zeros(len(raw), dtype="int64"),
        L.TIMESTAMP: ts_ms.to_numpy(dtype="int64"),
        L.PROMPT_TOKENS: raw["ContextTokens"].astype("Int64"),
        L.COMPLETION_TOKENS: raw["GeneratedTokens"].astype("Int64"),
        L.LIFECYCLE_STATE: LifecycleState.COMPLETED,
        L.SELECTED_MODEL: f"azure-llm-2023-{svc}",
        L.CATEGORY: CATEGORY[svc],
    })
