"""A production receipts ledger as the router's training and evaluation data.

The functions here turn a validated ledger-v1 file (the team's own receipts: sessions
bound once, a bounded share explored with the propensity logged on the binding's first
turn, escalations to a stronger candidate after a failed turn) into one row per OPENING
decision, a partition of whole sessions at a time (`opening_decisions`; the driver,
`pipelines/router_receipts.py`, sums their counts over partitions on either engine):

- one bandit row per binding (`exploration.bandit_rows`); a session's FIRST
  binding is its opening decision. Escalation bindings (`rebind_reason =
  escalation`) are consequences of a failure, not decisions: they are left out
  of training and of the off-policy estimates, but their calls count in the
  session cost (`session_cost`). Other mid-session rebinds (`route_error`,
  `user_override`, ...) are counted and left out: their context is mid-session.
- bindings of models outside `router.candidates` are counted and left out; a
  session whose opening binding is such a model has no usable decision.
- the text of a decision is the opening turn's `prompt_text`, or its
  `prompt_embedding` when `embedding_model` is the configured encoder's id.

Refusals (`ReceiptsError`, one line, exit 2 at the entry point; `check_ledger`,
`exploration_facts`, `representation_refusal`, `split_ranks`): propensities
outside (0, 1] (quarantined by the contract), a policy binding without a
propensity, an explored share of sessions above `router.exploration.cap`, fewer
than `min_explored_per_candidate` explored sessions of some candidate, fewer
than two candidates, openings with neither usable text nor embedding.

Time, not shuffling (`split_ranks`, `assign_session_splits`). Sessions are ordered by their
opening time; the latest `test_share` of them are the test period, the
`calibration_share` before them calibration, the rest train. A split boundary
is the opening time of its first session (sessions opening at the same
millisecond share a split). A session of an earlier split whose last turn is
after the next boundary minus `embargo_ms` is embargoed (counted, not used):
no session's turns reach into a later split.

Replays (`replay_rows`): an outcomes-v1 table of offline calls of logged
opening prompts, `prompt_id` = the opening turn's `request_id`. Replays join
train and calibration openings only; replays of test openings, of unknown
prompts, of other candidates, and of the candidate already logged for that
binding are counted and left out.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

import numpy as np
import pandas as pd

from replaylab.config import fail_field
from replaylab.contracts import LEDGER_SCHEMA, validate_outcomes
from replaylab.contracts.columns import Ledger as L
from replaylab.contracts.columns import Outcomes as O
from replaylab.router.config import RouterCostConfig
from replaylab.router.exploration import bandit_rows
from replaylab.router.replay import Label, resolve_cost

SPLITS = ("train", "calibration", "test")
EMBARGO = "embargo"
OPENING_REQUEST = "opening_request_id"  # the join key of replays (outcomes-v1 prompt_id)


class ReceiptsError(ValueError):
    """A receipts ledger that cannot train or judge a router (the message says why)."""


@dataclass(frozen=True)
class ReceiptsConfig:
    """How a receipts ledger is split and checked (YAML: conf/router/ `receipts`).

    calibration_share, test_share: shares of sessions by opening time (test = the
        latest); embargo_ms: a session of an earlier split still running within this
        many ms of the next split's start is left out; min_explored_per_candidate:
        explored opening sessions every candidate needs (fewer: refused, the off-policy
        estimate of a policy that uses it would rest on too few); n_boot, level: the
        session bootstrap of every interval. (The seed-to-seed spread beside the
        headline: `router.spread_seeds`, both modes.)
    max_train_decisions: the head trains on at most this many train decisions, a seeded
        uniform sample of train sessions (their replays with them; null: all). Uniform
        sampling keeps the IPS weights unbiased; calibration, the cost model and every
        estimate still use every session. It bounds the head's fits (selection, served,
        spread) on large ledgers; the summary says how many were used of how many.
    max_calibration_decisions: the head's calibration, the head selection and the
        threshold read at most this many calibration decisions, a seeded uniform sample of
        calibration sessions by the same hash (null: all). It bounds what the Dask path
        brings to the driver; the cost model and every test estimate use every session.
    """

    calibration_share: float = 0.2
    test_share: float = 0.2
    embargo_ms: int = 300_000
    min_explored_per_candidate: int = 10
    n_boot: int = 1000
    level: float = 0.95
    max_train_decisions: int | None = 50_000
    max_calibration_decisions: int | None = 100_000

    def __post_init__(self) -> None:
        name = type(self).__name__
        for key in ("calibration_share", "test_share"):
            if not 0.0 < float(getattr(self, key)) < 1.0:
                fail_field(name, key, getattr(self, key), "must be in (0, 1)")
        if float(self.calibration_share) + float(self.test_share) >= 0.9:
            fail_field(name, "test_share", self.test_share,
                       "calibration_share + test_share must leave >= 10% of sessions to train")
        for key, low in (("embargo_ms", 0), ("min_explored_per_candidate", 1), ("n_boot", 100)):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                fail_field(name, key, v, f"must be an integer >= {low}")
        if not 0.5 <= float(self.level) < 1.0:
            fail_field(name, "level", self.level, "must be in [0.5, 1)")
        for key in ("max_train_decisions", "max_calibration_decisions"):
            cap = getattr(self, key)
            if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int)
                                    or cap < 100):
                fail_field(name, key, cap, "must be null or an integer >= 100")


def iso(ms: float | int | None) -> str | None:
    """Epoch milliseconds -> RFC 3339 UTC (None for None/NaN)."""
    if ms is None or (isinstance(ms, float) and not np.isfinite(ms)):
        return None
    return datetime.fromtimestamp(int(ms) / 1000.0, UTC).isoformat().replace("+00:00", "Z")


def split_ranks(n: int, config: ReceiptsConfig) -> tuple[int, int]:
    """0-based ranks, in opening-time order of the n sessions, of the first calibration and
    the first test session (ReceiptsError when a split would be empty)."""
    n_test = int(round(float(config.test_share) * n))
    n_cal = int(round(float(config.calibration_share) * n))
    if n_test < 1 or n_cal < 1 or n - n_test - n_cal < 1:
        raise ReceiptsError(f"{n} sessions cannot be split into train / calibration / test "
                            f"({config.calibration_share:g} / {config.test_share:g})")
    return n - n_test - n_cal, n - n_test


def assign_session_splits(opening_ms: np.ndarray, last_ms: np.ndarray, t_cal: int, t_test: int,
                          embargo_ms: int) -> np.ndarray:
    """(n,) split name per session from the two boundaries (sessions are independent of one
    another here, so this runs per partition): test from t_test, calibration from t_cal,
    else train; an earlier split's session still running within embargo_ms of the next
    split's start is embargoed."""
    opening_ms = np.asarray(opening_ms)
    split = np.where(opening_ms >= t_test, "test",
                     np.where(opening_ms >= t_cal, "calibration", "train")).astype(object)
    nxt = np.where(split == "train", t_cal, np.where(split == "calibration", t_test, np.inf))
    embargoed = np.asarray(last_ms, float) > nxt - float(embargo_ms)
    split[embargoed & (split != "test")] = EMBARGO
    return split


def split_boundaries(first_ms: int, t_cal: int, t_test: int, last_open_ms: int,
                     embargo_ms: int, sessions: dict[str, int]) -> dict:
    """The summary's `splits`: boundaries (RFC 3339 and ms), sessions per split, the rule."""
    return {"train_start": iso(first_ms), "calibration_start": iso(t_cal),
            "test_start": iso(t_test), "test_end": iso(last_open_ms),
            "calibration_start_ms": t_cal, "test_start_ms": t_test,
            "embargo_ms": int(embargo_ms),
            "sessions": {s: int(sessions.get(s, 0)) for s in (*SPLITS, EMBARGO)},
            "rule": "sessions by opening time: the latest test_share are test, the "
                    "calibration_share before them calibration; a session still running "
                    "within embargo_ms of the next split's start is embargoed"}


def session_times(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per session of `frame` (every turn of each of its sessions): session_id,
    its opening turn's time `opening_ms` and its last turn's `last_ms`."""
    openings = _openings(frame)
    last = frame.groupby(L.SESSION_ID, sort=False)[L.TIMESTAMP].max()
    return pd.DataFrame({
        L.SESSION_ID: openings[L.SESSION_ID].to_numpy(),
        "opening_ms": openings["opening_ms"].to_numpy(np.int64),
        "last_ms": last.reindex(openings[L.SESSION_ID]).to_numpy(np.int64)})


def _openings(frame: pd.DataFrame) -> pd.DataFrame:
    """The first turn of every session (request id, binding, time, text, embedding)."""
    first = frame.sort_values([L.SESSION_ID, L.TURN_INDEX, L.TIMESTAMP], kind="stable") \
        .drop_duplicates(L.SESSION_ID, keep="first")
    cols = {OPENING_REQUEST: first[L.REQUEST_ID].astype(str).to_numpy(),
            L.SESSION_ID: first[L.SESSION_ID].astype(str).to_numpy(),
            L.BINDING_ID: first[L.BINDING_ID].to_numpy(),
            "opening_ms": first[L.TIMESTAMP].to_numpy(np.int64)}
    for col in (L.PROMPT_TEXT, L.PROMPT_EMBEDDING, L.EMBEDDING_MODEL, L.CATEGORY):
        cols[col] = LEDGER_SCHEMA.column(first, col).to_numpy(dtype=object)
    return pd.DataFrame(cols)


def opening_decisions(frame: pd.DataFrame, candidates: tuple[str, ...], where: str = "data.ledger"
                      ) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    """Valid ledger rows (every turn of each of their sessions) -> (the opening decisions of
    `candidates` that have an outcome, joined with their opening turn; one row per session
    with its opening and last turn time; additive counts for the report).

    Sessions are independent here, so this runs per partition once a shuffle has put each
    session's turns in one partition; the counts add up over partitions (`add_counts`)."""
    try:
        rows = bandit_rows(frame, validated=True)
    except ValueError as exc:
        raise ReceiptsError(f"{where}: {exc}") from exc
    openings = _openings(frame)
    first_binding = set(openings[L.BINDING_ID].astype(str))
    is_opening = rows[Label.BINDING_ID].astype(str).isin(first_binding).to_numpy()
    escal = ~rows[Label.POLICY_DECISION].astype(bool).to_numpy()
    in_cands = rows[Label.CANDIDATE].astype(str).isin(candidates).to_numpy()
    counts: dict = {
        "sessions": int(openings.shape[0]), "bindings": int(len(rows)),
        "escalation_bindings": int(escal.sum()),
        "escalation_cost_usd": float(pd.to_numeric(rows.loc[escal, Label.BINDING_COST],
                                                   errors="coerce").sum()),
        "mid_session_policy_rebinds_left_out": int((~is_opening & ~escal).sum()),
        "bindings_of_other_models": int((~in_cands).sum()),
        "other_models": {str(k): int(v) for k, v in
                         rows.loc[~in_cands, Label.CANDIDATE].value_counts().items()},
    }
    dec = rows[is_opening & ~escal].copy()
    counts["sessions_opening_other_model"] = int((~dec[Label.CANDIDATE].isin(candidates)).sum())
    counts["openings_by_escalation_left_out"] = int(openings.shape[0] - len(dec))
    dec = dec[dec[Label.CANDIDATE].isin(candidates)]
    no_outcome = dec[Label.REWARD].isna()
    counts["openings_without_outcome"] = int(no_outcome.sum())
    dec = dec[~no_outcome]
    dec = dec.join(openings.set_index(L.BINDING_ID), on=L.BINDING_ID, rsuffix="_opening")
    last = frame.groupby(L.SESSION_ID, sort=False)[L.TIMESTAMP].max()
    sessions = pd.DataFrame({
        L.SESSION_ID: openings[L.SESSION_ID].to_numpy(),
        "opening_ms": openings["opening_ms"].to_numpy(np.int64),
        "last_ms": last.reindex(openings[L.SESSION_ID]).to_numpy(np.int64)})
    return dec, sessions, counts


def counts_report(counts: dict) -> dict:
    """`opening_decisions`' counts (summed) as the report's keys and order."""
    out = {k: counts[k] for k in ("sessions", "bindings", "escalation_bindings",
                                  "escalation_cost_usd", "mid_session_policy_rebinds_left_out",
                                  "bindings_of_other_models")}
    other = pd.Series(counts["other_models"], dtype="int64")
    out["other_models"] = {str(k): int(v) for k, v in
                           other.sort_values(ascending=False, kind="stable").head(20).items()}
    for k in ("sessions_opening_other_model", "openings_by_escalation_left_out",
              "openings_without_outcome"):
        out[k] = counts[k]
    return out


def finish_decisions(dec: pd.DataFrame, split_of: pd.Series, candidates: tuple[str, ...]
                     ) -> pd.DataFrame:
    """Opening decisions with their session's split (split_of: session id -> split), the
    candidate column `action`, `category` (a `task` column stands in where absent) and
    `prompt_tokens` (float, NaN unknown). Per partition or whole: rows are independent."""
    dec = dec.copy()
    dec["split"] = split_of.reindex(dec[Label.SESSION_ID].astype(str)).to_numpy()
    dec["action"] = dec[Label.CANDIDATE].map({c: k for k, c in enumerate(candidates)}
                                             ).astype(np.int64)
    cat = dec[L.CATEGORY] if L.CATEGORY in dec else pd.Series(None, index=dec.index)
    if O.TASK in dec:  # an extra `task` column stands in where `category` is absent
        cat = cat.where(cat.notna(), dec[O.TASK])
    dec["category"] = cat.to_numpy(dtype=object)
    dec["prompt_tokens"] = pd.to_numeric(dec[L.PROMPT_TOKENS], errors="coerce").to_numpy(float) \
        if L.PROMPT_TOKENS in dec else np.nan
    return dec


def check_ledger(candidates: tuple[str, ...], bad_propensity: int, accounting: dict,
                 routing_source_values: int, where: str = "data.ledger") -> None:
    """The ledger's refusals, in order (module docstring), from what the partitions sum:
    ReceiptsError for fewer than two distinct candidates, quarantined propensities outside
    (0, 1] (`bad_propensity` rows), no valid row (`accounting`: the ledger's counts), no
    `routing_source` value. A candidate never selected is a support refusal
    (`absent_candidates`), raised by the caller unless it waives support."""
    cands = tuple(str(c) for c in candidates)
    if len(cands) < 2 or len(set(cands)) != len(cands):
        raise ReceiptsError(f"{where}: router.candidates={list(cands)}: a router needs >= 2 "
                            "distinct candidates (cheapest first)")
    if bad_propensity:
        raise ReceiptsError(f"{where}: {bad_propensity} row(s) have a {L.PROPENSITY} outside "
                            "(0, 1] (quarantined): off-policy estimates need the exact logged "
                            "probability of every choice")
    if not accounting["rows_valid"]:
        raise ReceiptsError(f"{where}: no valid ledger-v1 rows "
                            f"({accounting.get('quarantine_by_reason')})")
    if not routing_source_values:
        raise ReceiptsError(f"{where}: column {L.ROUTING_SOURCE} is absent or empty: explored "
                            "sessions cannot be told from the logging policy's own choices")


def absent_candidates(candidates: tuple[str, ...], present: set[str], where: str) -> str | None:
    """The support refusal naming the candidates that never appear in selected_model
    (`present`: the models seen), or None."""
    absent = [c for c in candidates if c not in present]
    if absent:
        return (f"{where}: router.candidates {absent} never appear in "
                f"{L.SELECTED_MODEL} (present: {sorted(present)[:10]})")
    return None


def representation_counts(dec: pd.DataFrame, encoder_id: str) -> dict:
    """Opening decisions with neither text nor a ledger embedding of `encoder_id`, the other
    embedding models seen, and the widths of the usable ledger embeddings (additive over
    partitions with `add_counts`; `representation_refusal` reads them)."""
    text = dec[L.PROMPT_TEXT].to_numpy(dtype=object)
    has_text = np.array([isinstance(t, str) for t in text], dtype=bool)
    vec = dec[L.PROMPT_EMBEDDING].to_numpy(dtype=object)
    has_vec = np.array([v is not None and not (isinstance(v, float) and np.isnan(v))
                        for v in vec], dtype=bool)
    models = dec[L.EMBEDDING_MODEL].to_numpy(dtype=object)
    matching = has_vec & (models == encoder_id)
    missing = ~has_text & ~matching
    other = sorted({str(m) for m, hv, ht in zip(models, has_vec, has_text, strict=True)
                    if hv and not ht and m != encoder_id})
    widths = sorted({len(v) for v in vec[~has_text & matching]})
    return {"missing": int(missing.sum()), "n": int(len(dec)),
            "other_models": dict.fromkeys(other, 1), "widths": {str(w): 1 for w in widths}}


def representation_refusal(counts: dict, encoder_id: str, where: str) -> str | None:
    """The ReceiptsError line for `representation_counts` (None: every opening is seen)."""
    if counts.get("missing"):
        other = sorted(counts.get("other_models", {}))
        why = (f"; their {L.EMBEDDING_MODEL} is {other[:3]}, not the configured encoder "
               f"{encoder_id!r}" if other else "")
        return (f"{where}: {counts['missing']} of {counts['n']} opening decisions have "
                f"neither {L.PROMPT_TEXT} nor a {L.PROMPT_EMBEDDING} of the "
                f"configured encoder{why}: the router cannot see those prompts")
    widths = sorted(int(w) for w in counts.get("widths", {}))
    if len(widths) > 1:
        return f"{where}: {L.PROMPT_EMBEDDING} rows have different widths {widths}"
    return None


def replay_rows(replays: pd.DataFrame | None, decisions: pd.DataFrame,
                candidates: tuple[str, ...], cost: RouterCostConfig | None = None
                ) -> tuple[pd.DataFrame, dict]:
    """Outcomes-v1 replays -> label rows of train / calibration openings (module docstring).

    decisions: the opening decisions the replays may name (OPENING_REQUEST, split,
    candidate, session_id). Returns (rows with Label.* columns, `row` = index into
    decisions, `action`, label_source "replay", propensity NaN; the counts)."""
    cols = [Label.SESSION_ID, Label.CONTEXT_KEY, Label.CANDIDATE, Label.REWARD, Label.COST,
            Label.PROPENSITY, Label.LABEL_SOURCE, "row", "action", "split"]
    if replays is None:
        return pd.DataFrame(columns=cols), {"given": False}
    checked = validate_outcomes(replays, source="data.replays")
    valid = checked.valid
    report = {"given": True, "rows_read": checked.rows_read,
              "rows_quarantined": checked.rows_quarantined,
              "quarantine_by_reason": checked.by_reason()}
    dec = decisions
    key = pd.Series(np.arange(len(dec)), index=dec[OPENING_REQUEST].astype(str))
    pid = valid[O.PROMPT_ID].astype(str)
    known = pid.isin(key.index)
    report["unknown_prompts"] = int((~known).sum())
    valid = valid[known.to_numpy()]
    row = key.reindex(valid[O.PROMPT_ID].astype(str)).to_numpy(np.int64)
    split = dec["split"].to_numpy()[row]
    in_fit = np.isin(split, ("train", "calibration"))
    report["test_prompts_left_out"] = int((~in_fit).sum())
    cand_ok = valid[O.CANDIDATE].astype(str).isin(candidates).to_numpy()
    report["other_candidates_left_out"] = int((in_fit & ~cand_ok).sum())
    logged = dec[Label.CANDIDATE].astype(str).to_numpy()[row] == valid[O.CANDIDATE].astype(str)
    report["logged_candidate_left_out"] = int((in_fit & cand_ok & logged.to_numpy()).sum())
    use = in_fit & cand_ok & ~logged.to_numpy()
    valid, row, split = valid[use], row[use], split[use]
    dup = pd.DataFrame({"row": row, "c": valid[O.CANDIDATE].to_numpy()}).duplicated().to_numpy()
    report["duplicates_left_out"] = int(dup.sum())
    valid, row, split = valid[~dup], row[~dup], split[~dup]
    usd, how = resolve_cost(valid, cost or RouterCostConfig(), "data.replays", strict=False)
    report["cost_source"] = {str(k): int(v) for k, v in how.value_counts().items()}
    lookup = {c: k for k, c in enumerate(candidates)}
    out = pd.DataFrame({
        Label.SESSION_ID: dec[Label.SESSION_ID].to_numpy()[row],
        Label.CONTEXT_KEY: valid[O.PROMPT_ID].astype(str).to_numpy(),
        Label.CANDIDATE: valid[O.CANDIDATE].astype(str).to_numpy(),
        Label.REWARD: pd.to_numeric(valid[O.SCORE], errors="coerce").to_numpy(float),
        Label.COST: usd.to_numpy(float), Label.PROPENSITY: np.nan,
        Label.LABEL_SOURCE: "replay", "row": row,
        "action": valid[O.CANDIDATE].map(lookup).to_numpy(np.int64), "split": split})
    report["used"] = {s: int((split == s).sum()) for s in ("train", "calibration")}
    report["prompts_replayed"] = int(len(np.unique(row)))
    return out[cols], report
