"""What the receipts router runs on each partition (`pipelines/router_receipts.py` is the driver).

Every function here takes one partition (a pandas frame of whole sessions, or of
decisions) and returns a frame or a small picklable result (a dict of additive counts,
an array of sums): the opening decisions in the fixed `DEC_COLUMNS` schema, the split,
the embeddings as float32 columns, the served head's scores, the test decisions and the
replay plan of a partition. The driver hands them to the engine (`Engine.map` for
frames, `Engine.each` for small results), sums what they return and decides; nothing
here reads another partition, and the same functions run on either engine.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from replaylab.contracts import Ledger as L
from replaylab.contracts.columns import QUARANTINE_DETAIL
from replaylab.pipelines.router_fit import decision_cost_sums, session_uniform
from replaylab.router.ope_sums import prob_of
from replaylab.router.receipts import (
    EMBARGO,
    OPENING_REQUEST,
    ReceiptsError,
    assign_session_splits,
    finish_decisions,
    opening_decisions,
    representation_counts,
    session_times,
)
from replaylab.router.receipts_counts import exploration_counts, policy_counts, rule_counts
from replaylab.router.replay import Label
from replaylab.router.replay_plan import replay_plan
from replaylab.runtime.routing import choose_by_threshold, routing_scores

EMB = "emb_"           # embedding columns emb_0000..: float32
# the decision columns every partition carries (a column absent from a partition: null)
DEC_COLUMNS = {
    Label.SESSION_ID: object, Label.BINDING_ID: object, Label.CONTEXT_KEY: object,
    Label.CANDIDATE: object, Label.REWARD: "float64", Label.COST: "float64",
    Label.PROPENSITY: "float64", Label.LABEL_SOURCE: object, Label.POLICY_DECISION: "bool",
    Label.BINDING_TURNS: "float64",
    Label.BINDING_COST: "float64", Label.SESSION_COST: "float64", OPENING_REQUEST: object,
    "opening_ms": "int64", "last_ms": "int64", L.PROMPT_TEXT: object,
    L.PROMPT_EMBEDDING: object, L.EMBEDDING_MODEL: object, "category": object,
    "prompt_tokens": "float64", "action": "int64", "split": object}
SESSION_META = pd.DataFrame({L.SESSION_ID: pd.Series([], dtype=object),
                             "opening_ms": pd.Series([], dtype="int64"),
                             "last_ms": pd.Series([], dtype="int64")})


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
        elif dtype == "bool":
            out[col] = np.array([False if x is None or (isinstance(x, float) and np.isnan(x))
                                 else bool(x) for x in v], dtype=bool)
        else:
            out[col] = pd.to_numeric(pd.Series(v), errors="coerce").astype("float64")
    return out


# ------------------------------------------------------------------ read and decisions


def propensity_quarantined(quarantine: pd.DataFrame) -> int:
    """Quarantined rows whose reason names the propensity (outside (0, 1])."""
    if quarantine.empty or QUARANTINE_DETAIL not in quarantine:
        return 0
    return int(quarantine[QUARANTINE_DETAIL].astype(str).str.contains(
        L.PROPENSITY, regex=False).sum())


def ledger_facts(frame: pd.DataFrame) -> dict:
    """What the ledger refusals read of a partition: the valued routing_source cells and
    the models selected."""
    has_source = L.ROUTING_SOURCE in frame.columns
    return {"routing_source": int(frame[L.ROUTING_SOURCE].count()) if has_source else 0,
            "models": set(frame[L.SELECTED_MODEL].dropna().astype(str).unique())}


def session_part(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per session of the partition: its opening and last turn time."""
    if frame.empty:
        return SESSION_META.copy()
    return session_times(frame).astype({L.SESSION_ID: object})


def decision_frame(frame: pd.DataFrame, cands: tuple[str, ...]) -> pd.DataFrame:
    """The partition's opening decisions (sessions whole), conformed, with last_ms."""
    if frame.empty:
        return conform(pd.DataFrame())
    dec, sessions, _ = opening_decisions(frame, cands)
    dec = finish_decisions(dec, pd.Series(dtype=object), cands)
    dec["last_ms"] = dec[Label.SESSION_ID].astype(str).map(
        sessions.set_index(L.SESSION_ID)["last_ms"]).to_numpy()
    return conform(dec)


def decision_counts(frame: pd.DataFrame, cands: tuple[str, ...], encoder_id: str) -> dict:
    """The partition's additive counts: the report's, the exploration's and the openings'
    representation (`add_counts` sums them over partitions)."""
    if frame.empty:
        return {"counts": {}, "exploration": {}, "representation": {}}
    dec, _, counts = opening_decisions(frame, cands)
    return {"counts": counts, "exploration": exploration_counts(dec, cands),
            "representation": representation_counts(dec, encoder_id)}


# ------------------------------------------------------------------ split


def with_split(dec: pd.DataFrame, t_cal: int, t_test: int, embargo_ms: int) -> pd.DataFrame:
    out = dec.copy()
    out["split"] = assign_session_splits(out["opening_ms"].to_numpy(np.int64),
                                         out["last_ms"].to_numpy(np.int64), t_cal, t_test,
                                         embargo_ms) if len(out) else \
        np.array([], dtype=object)
    return out


def session_split_counts(sessions: pd.DataFrame, t_cal: int, t_test: int,
                         embargo_ms: int) -> dict:
    s = assign_session_splits(sessions["opening_ms"].to_numpy(np.int64),
                              sessions["last_ms"].to_numpy(np.int64), t_cal, t_test,
                              embargo_ms) if len(sessions) else np.array([], dtype=object)
    return {str(k): int(v) for k, v in pd.Series(s, dtype=object).value_counts().items()}


def split_counts(dec: pd.DataFrame) -> dict:
    return {str(k): int(v) for k, v in dec["split"].value_counts().items()}


def without_embargo(dec: pd.DataFrame) -> pd.DataFrame:
    return dec[dec["split"] != EMBARGO].reset_index(drop=True)


def kept_facts(dec: pd.DataFrame) -> dict:
    """The kept decisions' logging-policy counts, rule counts and openings with text."""
    return {"policy": policy_counts(dec), "rules": rule_counts(dec),
            "text": int(sum(isinstance(t, str) for t in dec[L.PROMPT_TEXT]))}


# ------------------------------------------------------------------ embeddings and fits


def embed_part(dec: pd.DataFrame, encoder: Any) -> pd.DataFrame:
    """The partition's decisions with their embedding as float32 columns (text embedded by
    `encoder.embed`, one encoder per process, all of the partition's texts in one call; a
    ledger vector of the configured encoder used as given; a width other than the
    encoder's: ReceiptsError). `encoder.dimension` None (an embedding function): the width
    of what it returns."""
    text = dec[L.PROMPT_TEXT].to_numpy(dtype=object)
    has = np.array([isinstance(t, str) for t in text], dtype=bool)
    got = encoder.embed([str(t) for t in text[has]]) if has.any() else None
    vec = (np.stack([np.asarray(v, dtype=np.float32)
                     for v in dec[L.PROMPT_EMBEDDING].to_numpy(dtype=object)[~has]])
           if (~has).any() else None)
    d = encoder.dimension
    if d is None:
        d = got.shape[1] if got is not None else (vec.shape[1] if vec is not None else 0)
    if vec is not None and vec.shape[1] != d:
        raise ReceiptsError(f"data.ledger: prompt_embedding width {vec.shape[1]} differs "
                            f"from the encoder's {d}")
    E = np.full((len(dec), d), np.nan, dtype=np.float32)
    if got is not None:
        E[has] = got
    if vec is not None:
        E[~has] = vec
    out = dec.drop(columns=[L.PROMPT_EMBEDDING]).reset_index(drop=True)
    return pd.concat([out, pd.DataFrame(E, columns=emb_columns(d))], axis=1)


def rows_of(part: pd.DataFrame, splits: tuple[str, ...], columns: list[str] | None = None
            ) -> pd.DataFrame:
    """The partition's rows of `splits` (`columns` of them, default all)."""
    rows = part[part["split"].isin(list(splits))]
    return rows if columns is None else rows[columns]


def cost_sums_part(part: pd.DataFrame, k: int) -> np.ndarray:
    """`router_fit.decision_cost_sums` of the partition's train decisions."""
    return decision_cost_sums(part[part["split"] == "train"], k)


def with_u(part: pd.DataFrame, seed: int) -> pd.DataFrame:
    return part.assign(u=session_uniform(part[Label.SESSION_ID].to_numpy(dtype=object), seed))


def below(part: pd.DataFrame, column: str, threshold: float) -> pd.DataFrame:
    return part[part[column] <= threshold].drop(columns=[column])


def fit_part(part: pd.DataFrame, cols: list[str]) -> tuple[pd.DataFrame, np.ndarray]:
    """A partition's fit rows as (the decision columns, the (n, d) float32 embeddings)."""
    return part.drop(columns=cols), part[cols].to_numpy(np.float32)


def matched_part(part: pd.DataFrame, ids: set[str]) -> pd.DataFrame:
    """The decisions a replay names (the columns `receipts.replay_rows` reads)."""
    rows = part[part[OPENING_REQUEST].astype(str).isin(ids)]
    return rows[[OPENING_REQUEST, "split", Label.CANDIDATE, Label.SESSION_ID]]


# ------------------------------------------------------------------ judge and write


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


def score_values(part: pd.DataFrame, k: int, rule: str) -> pd.DataFrame:
    """The test rows' routing scores, flattened (the thresholds' quantiles are over them)."""
    t = part[part["split"] == "test"]
    return pd.DataFrame({"score": routing_scores(prob_of(t, k), rule).ravel() if len(t)
                         else np.zeros(0)}, dtype="float64")


def sequential_part(part: pd.DataFrame) -> pd.DataFrame:
    """What `router.sequential` reads of the test rows: the served policy's weight on the
    logged choice, the logged quality and cost, the opening time."""
    t = part[part["split"] == "test"]
    w = (t["choice"].to_numpy() == t["action"].to_numpy()) / t[Label.PROPENSITY].to_numpy(float)
    return pd.DataFrame({Label.SESSION_ID: t[Label.SESSION_ID].to_numpy(dtype=object),
                         "weight": w, "reward": t[Label.REWARD].to_numpy(float),
                         "cost": t[Label.COST].to_numpy(float),
                         "opening_ms": t["opening_ms"].to_numpy(np.int64)})


def test_decisions(te_d: pd.DataFrame, cands: tuple[str, ...], prob: np.ndarray,
                   choice: np.ndarray) -> pd.DataFrame:
    """router_decisions_test rows: ids, the logged choice and propensity, the served
    choice and its P(success) per candidate."""
    out = pd.DataFrame({"prompt_id": te_d[OPENING_REQUEST].to_numpy(),
                        "session_id": te_d[Label.SESSION_ID].to_numpy(),
                        "logged": te_d[Label.CANDIDATE].to_numpy(),
                        "propensity": te_d[Label.PROPENSITY].to_numpy(float),
                        "candidate": np.asarray(cands, dtype=object)[choice]})
    for j, c in enumerate(cands):
        out[f"p_{c}"] = prob[:, j]
    return out


def decisions_part(part: pd.DataFrame, cands: tuple[str, ...]) -> pd.DataFrame:
    t = part[part["split"] == "test"]
    return test_decisions(t, cands, prob_of(t, len(cands)), t["choice"].to_numpy(np.int64))


def label_part(dec: pd.DataFrame) -> pd.DataFrame:
    """router_labels rows: ids, labels, metadata; no text, no embeddings."""
    return dec.drop(columns=[L.PROMPT_TEXT, L.PROMPT_EMBEDDING])


def plan_meta(d: pd.DataFrame) -> pd.DataFrame:
    """The ids `replay_plan` ranks openings by."""
    return pd.DataFrame({"prompt_id": d[OPENING_REQUEST].to_numpy(),
                         "session_id": d[Label.SESSION_ID].to_numpy(),
                         "opening_ms": d["opening_ms"].to_numpy()})


def plan_part(part: pd.DataFrame, k: int, threshold: float, rule: str,
              cands: tuple[str, ...], budget: int, splits: tuple[str, ...]) -> pd.DataFrame:
    rows = part[part["split"].isin(list(splits))]
    return replay_plan(prob_of(rows, k), rows["action"].to_numpy(np.int64), threshold, rule,
                       plan_meta(rows), cands, budget)
