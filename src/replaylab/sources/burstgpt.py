"""BurstGPT traces (v1 and v3 layouts) -> ledger-v1.

Source: BurstGPT, HPMLL (github.com/HPMLL/BurstGPT): ChatGPT (GPT-3.5) and
GPT-4 requests of a university LLM service on Azure OpenAI. License CC-BY-4.0.
Cite: Y. Wang et al., "BurstGPT: A Real-World Workload Dataset to Optimize LLM
Serving Systems", KDD 2025 (arXiv:2401.17644).

Two layouts, told apart by their header:

- v1 (`BurstGPT_1.csv`, `BurstGPT_2.csv`): `Timestamp, Model, Request tokens,
  Response tokens, Total tokens, Log Type`.
- v3 (`BurstGPT_3.csv`): adds `Session ID` and `Elapsed time`.

What the upstream README says (quoted):

- `Timestamp`: "request submission time, seconds from `0:00:00` on the first day."
- `Session ID`: "conversation ID, only conversation mode have this, traces that
  share the same value of `Session ID` are in the same conversation session."
- `Elapsed time`: "time between the request submission time and system
  response time, in seconds."
- failures: `BurstGPT_1.csv` "contains all of our trace in the first 2 months
  with some failure that `Response tokens` are `0`s" (the `without_fails`
  files drop them).
- `Log Type`: "the way users call the model, in conversation mode or using
  API, including `Conversation log` and `API log`."

Mapping:

- `timestamp` = `origin_ms` + round(`Timestamp` x 1000). The trace gives no
  calendar date: `origin_ms` is a placeholder (default DEFAULT_ORIGIN_MS,
  2024-01-01T00:00:00Z, a midnight so that time of day is kept); weekday and
  date are NOT the real ones.
- `request_id` = `<prefix>-<row>` (row: 0-based data row). The prefix defaults
  to `burstgpt<N>` from a file name holding `burstgpt_<N>` / `burstgpt<N>`,
  else `burstgpt-v1` / `burstgpt-v3` by layout; pass `id_prefix` to choose.
- Sessions: v3 `Session ID` (kept as is); `turn_index` = order inside the
  session by `Timestamp` (file order on ties). v1 rows, and v3 rows without a
  `Session ID` (the `API log` rows), are their own session (`session_id` =
  `request_id`, `turn_index` = 0).
- `selected_model` = `Model` (`ChatGPT`, `GPT-4`), as written.
- Failed requests (`Response tokens` = 0): `lifecycle_state` = `failed`,
  `finish_reason` = `error`, `completion_tokens` = null (usage absent, not
  zero). In these rows `Request tokens` and `Total tokens` are 0 as well, which
  is a placeholder, not a prompt length: `prompt_tokens` is null when it is 0
  on a failed row. Other rows: `completed`, `finish_reason` null (not given).
- v3 `Elapsed time` (integer seconds, 1 s resolution) is read as the response
  duration (submission to response; it correlates with `Response tokens`,
  r = 0.68 on the first 400 rows): `duration_ms` = x 1000 and `ended_at` =
  `timestamp` + `duration_ms` on completed rows. On failed rows it is 0 with
  every other count, so `duration_ms` / `ended_at` stay null there. The raw
  value is kept in the extra column `elapsed_time_s` on every row.
- `Log Type` is kept in the extra column `log_type`. `Conversation log` (the
  chat UI mode) maps to `category` = `chat`; `API log` says how the service was
  called, not the domain, so `category` is null there. No `slo_class` is set:
  the trace does not say which calls were interactive.
- `Total tokens` is dropped (= request + response tokens).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd

from replaylab.contracts.columns import Ledger as L
from replaylab.contracts.enums import FinishReason, LifecycleState
from replaylab.contracts.ledger import LEDGER_VERSION
from replaylab.contracts.schema import ContractError

DEFAULT_ORIGIN_MS = 1_704_067_200_000  # 2024-01-01T00:00:00Z, placeholder (no date in the trace)
V1_COLUMNS = ("Timestamp", "Model", "Request tokens", "Response tokens", "Total tokens",
              "Log Type")
V3_EXTRA = ("Session ID", "Elapsed time")
CONVERSATION_LOG = "Conversation log"


def _default_prefix(path: Path, v3: bool) -> str:
    m = re.search(r"burstgpt_?(\d+)", path.name.lower())
    return f"burstgpt{m.group(1)}" if m else ("burstgpt-v3" if v3 else "burstgpt-v1")


def import_burstgpt(path: str | Path, *, origin_ms: int = DEFAULT_ORIGIN_MS,
                    id_prefix: str | None = None) -> pd.DataFrame:
    """Read a BurstGPT CSV (v1 or v3 layout) into a ledger-v1 frame.

    `origin_ms` is the epoch-ms instant that `Timestamp` = 0 stands for (a
    documented placeholder by default). See the module docstring for the
    source, license, citation and every mapping choice. Raises ContractError
    when the file lacks the BurstGPT columns.
    """
    path = Path(path)
    raw = pd.read_csv(path, dtype={"Session ID": "string", "Model": "string",
                                   "Log Type": "string"})
    missing = [c for c in V1_COLUMNS if c not in raw.columns]
    if missing:
        raise ContractError(f"{path}: missing column(s) {', '.join(missing)} "
                            f"(expected a BurstGPT file: {', '.join(V1_COLUMNS)})")
    present = [c for c in V3_EXTRA if c in raw.columns]
    if len(present) == 1:
        raise ContractError(f"{path}: has {present[0]!r} but not the other v3 column "
                            f"({', '.join(V3_EXTRA)})")
    v3 = len(present) == 2
    prefix = id_prefix or _default_prefix(path, v3)
    n = len(raw)

    rid = prefix + "-" + pd.Series(np.arange(n), dtype="int64").astype(str)
    ts = origin_ms + np.rint(raw["Timestamp"].to_numpy(dtype="float64") * 1000).astype("int64")
    failed = (raw["Response tokens"] == 0).to_numpy()
    prompt = raw["Request tokens"].astype("Int64").mask(failed & (raw["Request tokens"] == 0))
    completion = raw["Response tokens"].astype("Int64").mask(failed)
    log_type = raw["Log Type"]

    if v3:
        session = raw["Session ID"].astype(object).where(raw["Session ID"].notna(), rid)
    else:
        session = rid
    out = pd.DataFrame({
        L.VERSION: LEDGER_VERSION,
        L.REQUEST_ID: rid,
        L.SESSION_ID: session,
        L.TIMESTAMP: ts,
    })
    # order inside the session by dispatch time; the stable sort keeps file order on ties
    order = out.sort_values(L.TIMESTAMP, kind="stable")
    out[L.TURN_INDEX] = order.groupby(L.SESSION_ID, sort=False).cumcount().reindex(out.index)
    out[L.TURN_INDEX] = out[L.TURN_INDEX].astype("int64")
    out[L.PROMPT_TOKENS] = prompt
    out[L.COMPLETION_TOKENS] = completion
    out[L.LIFECYCLE_STATE] = np.where(failed, LifecycleState.FAILED, LifecycleState.COMPLETED)
    out[L.SELECTED_MODEL] = raw["Model"].astype(object)
    if v3:
        elapsed = raw["Elapsed time"].astype("Int64")
        duration = (elapsed * 1000).mask(failed)
        out[L.ENDED_AT] = (pd.Series(ts, dtype="Int64") + duration).astype("Int64")
        out[L.DURATION_MS] = duration.astype("Int64")
    out[L.FINISH_REASON] = pd.Series(np.where(failed, FinishReason.ERROR, None), dtype=object)
    conversation = (log_type == CONVERSATION_LOG).fillna(False).to_numpy(dtype=bool)
    out[L.CATEGORY] = pd.Series(np.where(conversation, "chat", None), dtype=object)
    out["log_type"] = log_type.astype(object)
    if v3:
        out["elapsed_time_s"] = raw["Elapsed time"].astype("Int64")
    cols = [L.VERSION, L.REQUEST_ID, L.SESSION_ID, L.TURN_INDEX]
    return out[cols + [c for c in out.columns if c not in cols]]
