"""What the Dask router pipeline runs on each partition (`pipelines/router_dask.py` is the driver).

Every function here takes one partition (a pandas frame of whole sessions, or of
decisions) and returns a frame or a dict of additive counts: the opening decisions in
the fixed `DEC_COLUMNS` schema, the split, the embeddings as float32 columns, the
served head's scores, the test decisions and the replay plan of a partition. The
driver plans them, sums what they return and decides; nothing here reads another
partition.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from replaylab.contracts import Ledger as L
from replaylab.pipelines.router_fit import session_uniform
from replaylab.pipelines.router_receipts import plan_meta, test_decisions
from replaylab.router.ope_sums import prob_of
from replaylab.router.receipts import (
    OPENING_REQUEST,
    assign_session_splits,
    finish_decisions,
    opening_decisions,
    representation_counts,
)
from replaylab.router.receipts_counts import exploration_counts
from replaylab.router.replay import Label
from replaylab.router.replay_plan import replay_plan
from replaylab.router.worker_encoder import EncoderSpec
from replaylab.runtime.routing import choose_by_threshold, routing_scores

EMB = "emb_"           # embedding columns emb_0000..: float32
# the decision columns every partition carries (a column absent from a partition: null)
DEC_COLUMNS = {
    Label.SESSION_ID: object, Label.BINDING_ID: object, Label.CONTEXT_KEY: object,
    Label.CANDIDATE: object, Label.REWARD: "float64", Label.COST: "float64",
    Label.PROPENSITY: "float64", Label.LABEL_SOURCE: object, Label.BINDING_TURNS: "float64",
    Label.BINDING_COST: "float64", Label.SESSION_COST: "float64", OPENING_REQUEST: object,
    "opening_ms": "int64", "last_ms": "int64", L.PROMPT_TEXT: object,
    L.PROMPT_EMBEDDING: object, L.EMBEDDING_MODEL: object, "category": object,
    "prompt_tokens": "float64", "action": "int64", "split": object}


def emb_columns(d: int) -> list[str]:
    return [f"{EMB}{j:04d}" for j in range(d)]


def conform(dec: pd.DataFrame) -> pd.DataFrame:
    """A partition's decisions in the fixed `DEC_COLUMNS` schema."""
    out = pd.DataFrame(index=range(len(dec)))
    for col, dtype in DEC_COLUMNS.items():
        v = dec[col].to_numpy() if col in dec.columns else np.full(len(dec), None, dtype=object)
        if dtype is object:
            col_v = pd.Series(v, dtype=object)
            out[col] = col_v.where(col_v.notna(), None)
        elif dtype == "int64":
            out[col] = pd.to_numeric(pd.Series(v), errors="coerce").fillna(-1).astype("int64")
        else:
            out[col] = pd.to_numeric(pd.Series(v), errors="coerce").astype("float64")
    return out


def decision_part(frame: pd.DataFrame, cands: tuple[str, ...], encoder_id: str) -> dict:
    """One partition (sessions whole): its opening decisions (conformed), its sessions'
    times and the additive counts."""
    if frame.empty:
        empty = conform(pd.DataFrame())
        return {"dec": empty, "sessions": pd.DataFrame({
                    L.SESSION_ID: pd.Series([], dtype=object),
                    "opening_ms": pd.Series([], dtype="int64"),
                    "last_ms": pd.Series([], dtype="int64")}),
                "counts": {}, "exploration": {}, "representation": {}}
    dec, sessions, counts = opening_decisions(frame, cands)
    dec = finish_decisions(dec, pd.Series(dtype=object), cands)
    dec["last_ms"] = dec[Label.SESSION_ID].astype(str).map(
        sessions.set_index(L.SESSION_ID)["last_ms"]).to_numpy()
    return {"dec": conform(dec), "sessions": sessions.astype({L.SESSION_ID: object}),
            "counts": counts, "exploration": exploration_counts(dec, cands),
            "representation": representation_counts(dec, encoder_id)}


def with_split(dec: pd.DataFrame, t_cal: int, t_test: int, embargo_ms: int) -> pd.DataFrame:
    out = dec.copy()
    out["split"] = assign_session_splits(out["opening_ms"].to_numpy(np.int64),
                                         out["last_ms"].to_numpy(np.int64), t_cal, t_test,
                                         embargo_ms) if len(out) else \
        np.array([], dtype=object)
    return out


def session_split_counts(sessions: pd.DataFrame, t_cal: int, t_test: int,
                         embargo_ms: int) -> pd.DataFrame:
    s = assign_session_splits(sessions["opening_ms"].to_numpy(np.int64),
                              sessions["last_ms"].to_numpy(np.int64), t_cal, t_test,
                              embargo_ms) if len(sessions) else np.array([], dtype=object)
    v = pd.Series(s, dtype=object).value_counts()
    return pd.DataFrame({"split": [str(k) for k in v.index], "n": v.to_numpy(np.int64)})


def embed_part(dec: pd.DataFrame, spec: EncoderSpec) -> pd.DataFrame:
    """The partition's decisions with their embedding as float32 columns (text embedded by
    the worker's encoder; a ledger vector of the configured encoder used as given)."""
    d = spec.dimension
    E = np.full((len(dec), d), np.nan, dtype=np.float32)
    text = dec[L.PROMPT_TEXT].to_numpy(dtype=object)
    has = np.array([isinstance(t, str) for t in text], dtype=bool)
    if has.any():
        E[has] = spec.embed([str(t) for t in text[has]])
    if (~has).any():
        vec = dec[L.PROMPT_EMBEDDING].to_numpy(dtype=object)[~has]
        E[~has] = np.stack([np.asarray(v, dtype=np.float32) for v in vec])
    out = dec.drop(columns=[L.PROMPT_EMBEDDING]).reset_index(drop=True)
    return pd.concat([out, pd.DataFrame(E, columns=emb_columns(d))], axis=1)


def fit_part(part: pd.DataFrame, cols: list[str]) -> tuple[pd.DataFrame, np.ndarray]:
    """A partition's fit rows as (the decision columns, the (n, d) float32 embeddings)."""
    return part.drop(columns=cols), part[cols].to_numpy(np.float32)


def with_u(part: pd.DataFrame, seed: int) -> pd.DataFrame:
    return part.assign(u=session_uniform(part[Label.SESSION_ID].to_numpy(dtype=object), seed))


def score_part(part: pd.DataFrame, head: Any, threshold: float, fallback: int, rule: str, k: int,
               d: int, splits: tuple[str, ...]) -> pd.DataFrame:
    """Rows of `splits` with the served head's P(success) per candidate and its choice;
    the embedding columns dropped."""
    part = part[part["split"].isin(list(splits))]
    out = part[[c for c in part.columns if not c.startswith(EMB) and c != L.PROMPT_TEXT]
               ].reset_index(drop=True)
    if len(part):
        E = part[emb_columns(d)].to_numpy(np.float32)
        prob = head.predict_proba(E, {"category": part["category"].to_numpy(dtype=object),
                                      "prompt_tokens": part["prompt_tokens"].to_numpy(float)})
        choice = choose_by_threshold(prob, threshold, fallback=fallback, rule=rule)
    else:
        prob, choice = np.zeros((0, k)), np.zeros(0, np.int64)
    for j in range(k):
        out[f"p{j}"] = prob[:, j].astype("float64")
    out["choice"] = choice.astype("int64")
    return out


def score_values(part: pd.DataFrame, k: int, rule: str) -> pd.Series:
    """The test rows' routing scores, flattened (the thresholds' quantiles are over them)."""
    t = part[part["split"] == "test"]
    return pd.Series(routing_scores(prob_of(t, k), rule).ravel() if len(t) else
                     np.zeros(0), dtype="float64")


def decisions_part(part: pd.DataFrame, cands: tuple[str, ...]) -> pd.DataFrame:
    return test_decisions(part, cands, prob_of(part, len(cands)),
                          part["choice"].to_numpy(np.int64))


def plan_part(part: pd.DataFrame, k: int, threshold: float, rule: str,
               cands: tuple[str, ...], budget: int, splits: tuple[str, ...]) -> pd.DataFrame:
    rows = part[part["split"].isin(list(splits))]
    return replay_plan(prob_of(rows, k), rows["action"].to_numpy(np.int64), threshold, rule,
                       plan_meta(rows), cands, budget)
