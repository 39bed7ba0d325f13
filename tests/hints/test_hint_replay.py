"""End-to-end replay of a ledger through the demand runtime and a stand-in admission consumer.

One small demand run is trained and exported once per module; the replay
ledger is a separate seeded synthetic ledger, edited so that it surely holds
streaming and non-streaming requests, cancellations mid-stream (partial output)
and absent usage. The checks are on the output ledger: rows and columns
conserved, valid ledger-v1, hints equal to the runtime's own answers, the
estimate independent of the actual, censoring and absent usage in the
residuals, partial deployment, and every fallback (stale, tampered, missing
artifact) recorded with its reason.
"""

from __future__ import annotations

import math
import shutil
import zlib
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from replaylab.artifacts.demand_export import export_demand
from replaylab.contracts import validate_ledger
from replaylab.contracts.columns import HISTORY_COLUMNS
from replaylab.contracts.hints import (
    HINT_COLUMNS,
    RESIDUAL,
    RESIDUAL_COVERED,
    RESIDUAL_LOWER_BOUND,
    DemandHint,
    negotiate,
)
from replaylab.demand import DemandConfig
from replaylab.hints.replay import AdmissionConsumer, replay_hints
from replaylab.pipelines.demand import train_demand
from replaylab.pipelines.project import LedgerInput, load_ledger
from replaylab.projection import ProjectionConfig, SplitConfig, dispatch_time_features
from replaylab.projection.requests import REQUEST_FIELDS
from replaylab.runtime.demand import DemandPredictor, FallbackBaseline
from replaylab.sources.synthetic import SyntheticLedgerConfig, generate_synthetic_ledger

SPLIT = SplitConfig(embargo_ms=300_000)
CREATED = datetime(2026, 1, 1, tzinfo=UTC)
NOW_S = (CREATED + timedelta(hours=1)).timestamp()  # the replay clock: artifact 1 h old
ACK_COLUMNS = ("ack_state", "ack_decision")
RESIDUAL_COLUMNS = (RESIDUAL, RESIDUAL_LOWER_BOUND, RESIDUAL_COVERED)
CENSORED_FINISH = ("length", "cancelled", "error")
CENSORED_LIFECYCLE = ("aborted", "failed")


# ---------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A demand run on 700 synthetic sessions, exported once (created = CREATED)."""
    root = tmp_path_factory.mktemp("hint_replay")
    loaded = load_ledger(LedgerInput(
        synthetic=SyntheticLedgerConfig(n_sessions=700, sessions_per_s=0.25)))
    summary, run = train_demand(loaded, ProjectionConfig(), SPLIT, DemandConfig(), root / "run")
    art = export_demand(run, summary, root / "art", created=CREATED)
    return SimpleNamespace(root=root, run=run, summary=summary, art=art)


@pytest.fixture(scope="module")
def ledger() -> pd.DataFrame:
    """A validated replay ledger (another seed) with cancellations mid-stream and absent usage."""
    raw = generate_synthetic_ledger(SyntheticLedgerConfig(n_sessions=300, sessions_per_s=0.25),
                                    seed=11)
    raw = raw.reset_index(drop=True)
    done = raw.index[(raw["lifecycle_state"] == "completed") & (raw["streaming"] == True)  # noqa: E712
                     & (raw["completion_tokens"].fillna(0) >= 8)]
    cancel, absent = done[:6], done[6:10]
    raw.loc[cancel, "lifecycle_state"] = "aborted"
    raw.loc[cancel, "finish_reason"] = "cancelled"
    raw.loc[cancel, "terminal_reason"] = "client_canceled"
    raw.loc[cancel, "completion_tokens"] = raw.loc[cancel, "completion_tokens"] // 2  # partial
    raw.loc[absent, "completion_tokens"] = pd.NA
    raw.loc[absent, "actual_cost"] = np.nan
    res = validate_ledger(raw, source="test")
    assert res.rows_quarantined == 0
    v = res.valid
    assert v["streaming"].eq(True).any() and v["streaming"].eq(False).any()
    mid = (v["streaming"] == True) & (v["lifecycle_state"] == "aborted") & (  # noqa: E712
        v["completion_tokens"].fillna(0) > 0)
    assert mid.sum() >= 6
    assert v["completion_tokens"].isna().sum() >= 4
    assert v["finish_reason"].eq("length").any()
    return v


def _all_to(consumer: AdmissionConsumer):
    """consumer_for: every row goes to this one consumer."""
    return lambda _row: consumer


def _predictor(path, now_s: float = NOW_S, **kw) -> DemandPredictor:
    return DemandPredictor.load(path, clock=lambda: now_s, **kw)


@pytest.fixture(scope="module")
def predictor(trained) -> DemandPredictor:
    p = _predictor(trained.art)
    assert p.loaded, p.reason
    return p


@pytest.fixture(scope="module")
def replayed(ledger, predictor) -> pd.DataFrame:
    # the frozen runtime: online recalibration (tests/runtime/test_online_recalibration.py) makes a
    # hint's interval depend on earlier requests' actuals, by design
    return replay_hints(ledger, predictor,
                        _all_to(AdmissionConsumer(capacity_tokens=1e12)), online=False)


# ---------------------------------------------------------------- helpers
def _cell(v):
    """A frame cell as a comparable plain value (NA/NaN -> None, numpy -> Python)."""
    if v is None or v is pd.NA or v is pd.NaT or (isinstance(v, float) and math.isnan(v)):
        return None
    return v.item() if isinstance(v, np.generic) else v


def _cells(frame: pd.DataFrame, col: str) -> list:
    return [_cell(v) for v in frame[col].astype(object)]


def _by_id(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.set_index("request_id", drop=False).sort_index()


def _requests_from_projection(ledger: pd.DataFrame) -> dict[str, dict]:
    """Each row's request built from the projection (not from replay's code): id -> request."""
    f = dispatch_time_features(ledger, ProjectionConfig())
    keep = [c for c in f.columns if c in REQUEST_FIELDS or c in HISTORY_COLUMNS]
    return {r["request_id"]: {k: _cell(v) for k, v in r.items()}
            for r in f[keep].to_dict("records")}


def _censored(frame: pd.DataFrame) -> np.ndarray:
    return (frame["finish_reason"].isin(CENSORED_FINISH)
            | frame["lifecycle_state"].isin(CENSORED_LIFECYCLE)).to_numpy()


def _num(frame: pd.DataFrame, col: str) -> np.ndarray:
    return pd.to_numeric(frame[col], errors="coerce").to_numpy(dtype="float64", na_value=np.nan)


# ---------------------------------------------------------------- conservation
def test_replay_conserves_rows_columns_and_values(ledger, replayed):
    out = replayed
    assert len(out) == len(ledger)
    assert out["request_id"].is_unique
    assert set(out["request_id"]) == set(ledger["request_id"])
    # dispatch order
    assert (np.diff(out["timestamp"].to_numpy(dtype="int64")) >= 0).all()
    # every input column first, in order, then hint, ack and residual columns
    assert list(out.columns[:len(ledger.columns)]) == list(ledger.columns)
    assert set(out.columns[len(ledger.columns):]) == {*HINT_COLUMNS, *ACK_COLUMNS,
                                                      *RESIDUAL_COLUMNS}
    a, b = _by_id(ledger), _by_id(out)
    for col in ledger.columns:
        assert _cells(a, col) == _cells(b, col), col
    res = validate_ledger(out, source="replayed")
    assert res.rows_quarantined == 0 and len(res.valid) == len(out)


def test_hint_columns_equal_the_runtime_on_the_same_requests(ledger, replayed, predictor):
    reqs = _requests_from_projection(ledger)
    ids = list(_by_id(replayed)["request_id"])
    hints = predictor.predict_batch([reqs[i] for i in ids])
    expected = pd.DataFrame([h.columns() for h in hints], index=ids)
    got = _by_id(replayed)
    for col in HINT_COLUMNS:
        assert _cells(got, col) == _cells(expected, col), col
    # single requests answer as the batch does
    for i in ids[:40]:
        assert _same(predictor.predict(reqs[i]), hints[ids.index(i)])
    # the model answered (synthetic prompts are never null), with the artifact's version
    assert not got["hint_fallback"].any()
    assert (got["hint_model_version"] == predictor.version).all()
    assert (got["hint_interval"] == 0.8).all() and (got["hint_age_ms"] == 3_600_000).all()
    assert (got["hint_lo"] <= got["hint_hi"]).all() and (got["hint_p50"] <= got["hint_p90"]).all()
    assert (got["hint_lo"] >= got["prompt_tokens"]).all()
    streaming = got["streaming"].astype(bool)
    assert streaming.any() and (~streaming).any()  # both kinds hinted
    assert (got["ack_state"] == "used").all() and (got["ack_decision"] == "admitted").all()


def test_estimate_is_independent_of_the_actual(ledger, predictor, replayed):
    # change the actual of every session's last turn: no later turn can see it as history
    last = ledger.groupby("session_id")["turn_index"].transform("max") == ledger["turn_index"]
    changed = ledger.copy()
    old = changed.loc[last, "completion_tokens"]
    changed.loc[last, "completion_tokens"] = (old.fillna(2) * 3 + 7).astype("Int64")
    again = replay_hints(changed, predictor,
                         _all_to(AdmissionConsumer(capacity_tokens=1e12)), online=False)
    a, b = _by_id(replayed), _by_id(again)
    for col in (*HINT_COLUMNS, *ACK_COLUMNS):
        assert _cells(a, col) == _cells(b, col), col
    moved = set(ledger.loc[last, "request_id"])
    is_moved = a.index.isin(list(moved))
    for col in ("completion_tokens", RESIDUAL):
        diff = np.array([x != y for x, y in zip(_cells(a, col), _cells(b, col), strict=True)])
        assert diff[is_moved].all() and not diff[~is_moved].any(), col
    for col in set(ledger.columns) - {"completion_tokens"}:
        assert _cells(a, col) == _cells(b, col), col


# ---------------------------------------------------------------- censoring, absent usage
def test_residuals_respect_censoring_and_absent_usage(replayed):
    out = replayed
    total = _num(out, "prompt_tokens") + _num(out, "completion_tokens")
    lo, hi, p50 = _num(out, "hint_lo"), _num(out, "hint_hi"), _num(out, "hint_p50")
    censored = _censored(out)
    usage = np.isfinite(total)
    residual = _num(out, RESIDUAL)
    lower = out[RESIDUAL_LOWER_BOUND].astype(object).to_numpy()
    covered = out[RESIDUAL_COVERED].astype(object).to_numpy()
    # absent usage: no residual, nothing claimed
    assert (~usage).sum() >= 4
    assert np.isnan(residual[~usage]).all()
    assert all(_cell(x) is None for x in lower[~usage])
    assert all(_cell(x) is None for x in covered[~usage])
    # known usage: residual = actual total - p50; lower bound = censored
    np.testing.assert_allclose(residual[usage], (total - p50)[usage])
    assert [bool(x) for x in lower[usage]] == list(censored[usage])
    # uncensored: covered says whether the actual is inside [lo, hi]
    exact = usage & ~censored
    assert [bool(x) for x in covered[exact]] == list(((total >= lo) & (total <= hi))[exact])
    # censored: a lower bound above hi is a proven miss; otherwise unknowable, never True
    cens = usage & censored
    assert cens.sum() >= 6
    for c, t, h in zip(covered[cens], total[cens], hi[cens], strict=True):
        assert (c is False) if t > h else (_cell(c) is None)
    # the cancellations mid-stream are among them, with their partial output
    mid = (out["lifecycle_state"] == "aborted").to_numpy() & out["streaming"].astype(bool) \
        .to_numpy() & usage
    assert mid.sum() >= 6 and all(bool(x) for x in lower[mid])
    # coverage of the uncensored rows is in the nominal neighbourhood (0.8 interval)
    share = np.mean([bool(x) for x in covered[exact]])
    assert 0.6 <= share <= 0.95, share


# ---------------------------------------------------------------- partial deployment
def test_partial_deployment_and_silent_consumers(ledger, predictor):
    new = AdmissionConsumer(name="new", capacity_tokens=1e12)
    legacy = AdmissionConsumer(name="legacy", hint_versions=(), capacity_tokens=1e12)
    mute = AdmissionConsumer(name="mute", capacity_tokens=1e12, responds=False)
    pools = (new, legacy, mute)

    def pool(row) -> AdmissionConsumer:
        return pools[zlib.crc32(row["session_id"].encode()) % 3]

    out = replay_hints(ledger, predictor, pool)
    which = np.array([zlib.crc32(s.encode()) % 3 for s in out["session_id"]])
    assert {0, 1, 2} <= set(which)
    used, unsup, silent = out[which == 0], out[which == 1], out[which == 2]
    assert (used["ack_state"] == "used").all() and used["hint_p50"].notna().all()
    # no version in common: no hint sent, every hint column null, no residual
    assert (unsup["ack_state"] == "unsupported").all()
    assert (unsup["ack_decision"] == "admitted").all()
    for col in (*HINT_COLUMNS, *RESIDUAL_COLUMNS):
        assert all(_cell(v) is None for v in unsup[col].astype(object)), col
    # a consumer that never answers: the hint was sent, the ack is absent
    assert (silent["ack_state"] == "absent").all()
    assert silent["ack_decision"].isna().all() and silent["hint_p50"].notna().all()
    assert validate_ledger(out).rows_quarantined == 0
    assert negotiate(()) is None and negotiate(("1", "2")) == "1"
    assert negotiate(("1", "1.1", "2"), offered=("1", "1.1")) == "1.1"


# ---------------------------------------------------------------- fallbacks
def _stale_at_load(trained, tmp_path):
    old = export_demand(trained.run, trained.summary, tmp_path / "old", valid_days=30,
                        created=CREATED - timedelta(days=40))
    return _predictor(old), "expired", 4096


def _stale_while_loaded(trained, tmp_path):
    clock = {"now": NOW_S}
    p = DemandPredictor.load(trained.art, clock=lambda: clock["now"])
    assert p.loaded
    clock["now"] = (CREATED + timedelta(days=31)).timestamp()  # past valid_until (30 days)
    return p, "expired", p.manifest["fallback"]["default_max_tokens"]


def _tampered(trained, tmp_path):
    art = shutil.copytree(trained.art, tmp_path / "tampered")
    model = art / "model.onnx"
    data = bytearray(model.read_bytes())
    data[len(data) // 2] ^= 0x01
    model.write_bytes(bytes(data))
    return _predictor(art), "hash_mismatch", 4096


def _missing(trained, tmp_path):
    return _predictor(tmp_path / "no-such-artifact"), "missing_artifact", 4096


@pytest.mark.parametrize("scenario", [_stale_at_load, _stale_while_loaded, _tampered, _missing],
                         ids=["stale-at-load", "stale-while-loaded", "tampered", "missing"])
def test_bad_artifacts_fall_back_with_their_reason(trained, ledger, tmp_path, scenario):
    p, reason, default_cap = scenario(trained, tmp_path)
    if scenario is not _stale_while_loaded:
        assert not p.loaded and p.reason == reason
    out = replay_hints(ledger, p, _all_to(AdmissionConsumer(capacity_tokens=1e12)))
    assert len(out) == len(ledger)
    assert out["hint_fallback"].astype(bool).all()
    assert (out["hint_fallback_reason"] == reason).all()
    assert out["hint_model_version"].str.startswith("baseline:").all()
    assert out["hint_interval"].isna().all()  # a reservation claims no coverage
    # the consumer does not act on a fallback hint; it reserves the cap itself
    assert (out["ack_state"] == "ignored").all()
    prompt = _num(out, "prompt_tokens")
    cap = np.nan_to_num(_num(out, "max_tokens"), nan=default_cap)
    np.testing.assert_array_equal(_num(out, "hint_lo"), prompt)
    for col in ("hint_p50", "hint_p90", "hint_hi"):
        np.testing.assert_array_equal(_num(out, col), prompt + cap)
    assert out["max_tokens"].isna().any() and out["max_tokens"].notna().any()
    assert validate_ledger(out).rows_quarantined == 0


def test_missing_path_none_and_custom_fallback():
    p = DemandPredictor.load(None, fallback=FallbackBaseline(default_max_tokens=1000))
    h = p.predict({"prompt_tokens": 10, "request_id": "r1"})
    assert (h.hint_fallback, h.fallback_reason, h.request_id) == (True, "missing_artifact", "r1")
    assert (h.hint_lo, h.hint_p50, h.hint_p90, h.hint_hi) == (10, 1010, 1010, 1010)
    assert p.predict({"prompt_tokens": 10, "max_tokens": 64}).hint_p90 == 74


def test_a_bad_request_falls_back_alone(predictor):
    good = {"request_id": "ok", "prompt_tokens": 100, "max_tokens": 256, "category": "chat"}
    bad = {"request_id": "bad", "prompt_tokens": "a lot", "max_tokens": "x"}
    h_good, h_bad, h_none = predictor.predict_batch([good, bad, {"max_tokens": 64}])
    assert not h_good.hint_fallback and h_good.hint_model_version == predictor.version
    assert (h_bad.hint_fallback, h_bad.fallback_reason, h_bad.request_id) == (
        True, "bad_request", "bad")
    cap = predictor.manifest["fallback"]["default_max_tokens"]
    assert (h_bad.hint_lo, h_bad.hint_p90) == (0.0, float(cap))  # unreadable: prompt 0, cap
    assert (h_none.fallback_reason, h_none.hint_p90) == ("missing_prompt_tokens", 64.0)
    assert _same(predictor.predict(good), h_good)


def _same(a: DemandHint, b: DemandHint) -> bool:
    """Equal hints; the single-request path (Python floats) may differ from the batch
    (numpy) in the last bit of a token estimate."""
    num = ("hint_p50", "hint_p90", "hint_lo", "hint_hi", "hint_lo_frozen", "hint_hi_frozen")
    ca, cb = a.columns(), b.columns()
    close = all(ca[f] == cb[f] or math.isclose(ca[f], cb[f], rel_tol=1e-12) for f in num)
    rest = {k: v for k, v in ca.items() if k not in num}
    return close and rest == {k: v for k, v in cb.items() if k not in num}


# ---------------------------------------------------------------- admission consumer
def _hint(p90: float, fallback: bool = False) -> DemandHint:
    return DemandHint("1", "m", p90 / 2, p90, 0.0, p90, None if fallback else 0.8, 0,
                      fallback)


def test_admission_admits_while_the_budget_fits_and_queues_otherwise():
    c = AdmissionConsumer(capacity_tokens=1000)
    req = {"prompt_tokens": 50, "max_tokens": 100}
    assert c.decide(req, _hint(400), 0, 100).decision == "admitted"  # 400 in flight
    assert c.decide(req, _hint(400), 10, 200).decision == "admitted"  # 800
    assert c.decide(req, _hint(400), 20, 300).decision == "queued"  # 1200 > 1000: not reserved
    assert c.decide(req, _hint(200), 30, 300).decision == "admitted"  # exactly 1000
    assert c.decide(req, _hint(1), 40, 300).decision == "queued"
    assert c.decide(req, _hint(400), 100, 400).decision == "admitted"  # the first ended at 100
    # no hint (unsupported): prompt + max_tokens, or prompt + the consumer's default cap
    c = AdmissionConsumer(capacity_tokens=1000)
    ack = c.decide(req, None, 0, 10)
    assert (ack.state, ack.decision) == ("unsupported", "admitted")
    assert c.decide({"prompt_tokens": 50}, None, 1, 10).decision == "queued"  # 50 + 4096
    # a fallback hint is ignored (cap reserved) unless the consumer opts in
    c = AdmissionConsumer(capacity_tokens=1000)
    ack = c.decide({"prompt_tokens": 50}, _hint(100, fallback=True), 0, 10)
    assert (ack.state, ack.decision) == ("ignored", "queued")
    c = AdmissionConsumer(capacity_tokens=1000, use_fallback=True)
    ack = c.decide({"prompt_tokens": 50}, _hint(100, fallback=True), 0, 10)
    assert (ack.state, ack.decision) == ("used", "admitted")
    # a silent consumer still decides (and reserves), it just does not say so
    c = AdmissionConsumer(capacity_tokens=1000, responds=False)
    assert c.decide(req, _hint(800), 0, 100) is None
    assert c.decide(req, _hint(800), 1, 100) is None and c.reserved_tokens == 800


def _admission_oracle(out: pd.DataFrame, capacity: float) -> list[str]:
    """Recompute each decision from the output rows (in dispatch order): reserve hint_p90."""
    in_flight: list[tuple[int, float]] = []
    decisions = []
    for r in out.to_dict("records"):
        now = int(r["timestamp"])
        in_flight = [(e, n) for e, n in in_flight if e > now]
        need = float(r["hint_p90"])
        ok = sum(n for _, n in in_flight) + need <= capacity
        decisions.append("admitted" if ok else "queued")
        end = _cell(r["ended_at"])
        if end is None and _cell(r["duration_ms"]) is not None:
            end = now + int(r["duration_ms"])
        if ok and end is not None:
            in_flight.append((int(end), need))
    return decisions


def test_replay_admission_with_tiny_and_enormous_capacity(ledger, predictor, replayed):
    assert (replayed["ack_decision"] == "admitted").all()  # capacity 1e12
    capacity = float(replayed["hint_p90"].median())
    out = replay_hints(ledger, predictor,
                       _all_to(AdmissionConsumer(capacity_tokens=capacity)), online=False)
    counts = out["ack_decision"].value_counts()
    assert counts.get("admitted", 0) > 0 and counts.get("queued", 0) > 0
    assert list(out["ack_decision"]) == _admission_oracle(out, capacity)
    # hints and residuals do not depend on the decision
    for col in (*HINT_COLUMNS, *RESIDUAL_COLUMNS):
        assert _cells(_by_id(out), col) == _cells(_by_id(replayed), col), col


def test_empty_ledger_replays_to_an_empty_hinted_ledger(ledger, predictor):
    out = replay_hints(ledger.iloc[:0], predictor)
    assert len(out) == 0
    assert {*HINT_COLUMNS, *ACK_COLUMNS, *RESIDUAL_COLUMNS} <= set(out.columns)


def test_artifact_from_slightly_ahead_clock_yields_a_valid_ledger(trained, ledger):
    p = _predictor(trained.art, now_s=(CREATED - timedelta(minutes=2)).timestamp())
    assert p.loaded  # within the 5-minute clock skew
    out = replay_hints(ledger, p)
    assert validate_ledger(out).rows_quarantined == 0
