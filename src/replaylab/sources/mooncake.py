"""Mooncake FAST'25 traces -> ledger-v1.

Source: Mooncake (kvcache-ai/Mooncake, `FAST25-release/traces/`), request
traces of Kimi, the LLM service of Moonshot AI: `conversation_trace.jsonl`
(~1 h), `synthetic_trace.jsonl` (and `toolagent_trace.jsonl`, same format).
License Apache-2.0. Cite: R. Qin et al., "Mooncake: Trading More Storage for
Less Computation - A KVCache-centric Architecture for Serving LLM Chatbot",
FAST 2025.

A line is one request: `timestamp` (ms since the first request, several
requests can share one), `input_length`, `output_length` (tokens) and
`hash_ids`, "the remapped block hash" of the prompt, one id per prompt block;
two requests whose `hash_ids` start with the same ids share that prefix.

Mapping:

- `timestamp` = `origin_ms` + `timestamp`. The trace gives no calendar time:
  `origin_ms` is a placeholder (default DEFAULT_ORIGIN_MS, 2024-01-01T00:00:00Z).
- `request_id` = `mooncake-<trace>-<row>` (trace: file stem before `_trace`,
  row: 0-based line). No sessions: `session_id` = `request_id`, `turn_index` 0.
- `prompt_tokens` = `input_length`, `completion_tokens` = `output_length`;
  `lifecycle_state` = `completed` (the trace lists served requests with their
  output lengths; it records no failures).
- `selected_model` = `mooncake-kimi`: a PLACEHOLDER, the trace names no model.
- `category` = `chat` for the conversation trace, `agent` for the tool-agent
  trace; absent for the synthetic trace (no domain stated).
- `hash_ids` is kept as an extra column (list of int).
- `prefix_reuse_tokens` (extra column): prompt tokens whose prefix blocks all
  appeared in an EARLIER line of the trace (file order; equal timestamps keep
  file order), i.e. (length of the leading run of already-seen `hash_ids`) x
  `block_tokens`, capped at `input_length`. `block_tokens` = 512: it matches
  every line of both published traces (`len(hash_ids)` = ceil(`input_length`
  / 512)). This is what an unbounded prefix cache could have served, an UPPER
  BOUND: the trace does not record what the serving cache actually hit
  (eviction, placement). So `cached_prompt_tokens` ("served from a prefix
  cache") is NOT set by default; `reuse_as_cached=True` copies the bound into
  it, for experiments that accept that assumption and say so.
- Not set: `ended_at`, `duration_ms`, `finish_reason`, `max_tokens`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from replaylab.contracts.columns import Ledger as L
from replaylab.contracts.enums import LifecycleState
from replaylab.contracts.ledger import LEDGER_VERSION
from replaylab.contracts.schema import ContractError

DEFAULT_ORIGIN_MS = 1_704_067_200_000  # 2024-01-01T00:00:00Z, placeholder (no date in the trace)
BLOCK_TOKENS = 512
COLUMNS = ("timestamp", "input_length", "output_length", "hash_ids")
CATEGORY = {"conversation": "chat", "toolagent": "agent"}
HASH_IDS = "hash_ids"
PREFIX_REUSE_TOKENS = "prefix_reuse_tokens"


def _trace_name(path: Path) -> str:
    stem = path.name.split(".")[0].lower()
    return stem.split("_trace")[0] if "_trace" in stem else stem


def prefix_reuse_tokens(hash_ids: pd.Series, input_length: pd.Series,
                        block_tokens: int = BLOCK_TOKENS) -> pd.Series:
    """Tokens of each prompt's prefix already seen in an earlier row (see module doc).

    `hash_ids`: one list of block ids per row, rows in dispatch order.
    Returns int64, index of `hash_ids`; capped at `input_length`.
    """
    pos = np.arange(len(hash_ids))
    lens = hash_ids.map(len).to_numpy(dtype="int64")
    blocks = pd.DataFrame({
        "row": np.repeat(pos, lens),
        "block": np.concatenate([np.asarray(h, dtype="int64") for h in hash_ids])
        if len(hash_ids) else np.array([], dtype="int64"),
    })
    first_row = blocks.groupby("block")["row"].transform("min")
    seen = (first_row < blocks["row"]).astype("int64")
    # leading run of seen blocks: a running product along each row's block list
    run = seen.groupby(blocks["row"]).cumprod().groupby(blocks["row"]).sum()
    n_seen = run.reindex(pos, fill_value=0).to_numpy(dtype="int64")
    tokens = np.minimum(n_seen * block_tokens, input_length.to_numpy(dtype="int64"))
    return pd.Series(tokens, index=hash_ids.index, dtype="int64")


def import_mooncake(path: str | Path, *, origin_ms: int = DEFAULT_ORIGIN_MS,
                    block_tokens: int = BLOCK_TOKENS,
                    reuse_as_cached: bool = False) -> pd.DataFrame:
    """Read a Mooncake FAST'25 JSONL trace into a ledger-v1 frame.

    See the module docstring for the source, license, citation and every
    mapping choice. Raises ContractError when the file lacks the trace's fields.
    """
    path = Path(path)
    if block_tokens <= 0:
        raise ValueError(f"block_tokens must be > 0 (got {block_tokens})")
    raw = pd.read_json(path, lines=True, dtype=False)
    missing = [c for c in COLUMNS if c not in raw.columns]
    if missing:
        raise ContractError(f"{path}: missing field(s) {', '.join(missing)} "
                            f"(expected a Mooncake trace: {', '.join(COLUMNS)})")
    trace = _trace_name(path)
    rid = f"mooncake-{trace}-" + pd.Series(np.arange(len(raw)), dtype="int64").astype(str)
    out = pd.DataFrame({
        L.VERSION: LEDGER_VERSION,
        L.REQUEST_ID: rid,
        L.SESSION_ID: rid,
        L.TURN_INDEX: np.zeros(len(raw), dtype="int64"),
        L.TIMESTAMP: origin_ms + raw["timestamp"].astype("int64"),
        L.PROMPT_TOKENS: raw["input_length"].astype("Int64"),
        L.COMPLETION_TOKENS: raw["output_length"].astype("Int64"),
        L.LIFECYCLE_STATE: LifecycleState.COMPLETED,
        L.SELECTED_MODEL: "mooncake-kimi",
    })
    reuse = prefix_reuse_tokens(raw[HASH_IDS], raw["input_length"], block_tokens)
    if reuse_as_cached:
        out[L.CACHED_PROMPT_TOKENS] = reuse.astype("Int64")
    if trace in CATEGORY:
        out[L.CATEGORY] = CATEGORY[trace]
    out[HASH_IDS] = raw[HASH_IDS]
    out[PREFIX_REUSE_TOKENS] = reuse
    return out
