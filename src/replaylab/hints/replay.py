"""Replay a ledger through the demand runtime and a stand-in downstream admission consumer.

`replay_hints(ledger, predictor, consumer_for)` walks a validated ledger-v1
frame in dispatch order, as serving would have:

1. the request's pre-dispatch fields plus its session history at dispatch (the
   projection's `hist_*` fields: what a session-telemetry store holds then,
   `replaylab.projection.dispatch_time_features`; the request built by
   `replaylab.projection.requests.ledger_requests`) go to `predictor.predict_batch`;
2. the request's consumer (`consumer_for(row)`, e.g. by pool or region: a
   partial deployment has consumers without hint support) negotiates a hint
   version; with none in common no hint is sent and the ack is `unsupported`;
3. the consumer decides with or without the hint and acknowledges
   (`used` / `ignored`, its decision), or says nothing (`absent`);
4. `ledger_record` joins request, hint, ack and the actual outcome of the
   ledger row (usage, finish reason, cancellation) and derives the residuals.

The output is a ledger-v1 frame (every input row, every input column, plus
`hint_*`, `ack_*` and the residual columns) that `validate_ledger` accepts;
`python -m evaluation residuals` reads it.

Online recalibration (`replaylab.runtime.online`, on when the predictor has it
on): rows are then hinted one at a time in dispatch order, and a row's actual
(prompt + completion, a lower bound when censored) is fed back through
`predictor.acknowledge` only once the request has ENDED: a heap of pending
actuals ordered by end time is drained of those with end <= the next
dispatch before that request is hinted. The end is the ledger's (`ended_at`,
else `timestamp + duration_ms`); a row with neither gets the modeled end of
`latency` (`ModeledLatency`: time to first token + ms per output token),
flagged in `feedback_modeled`; `latency=None` never feeds such rows back. The
replay works on a fresh online state of the predictor (`with_fresh_online`),
never the caller's; the final state is `frame.attrs["online_state"]`. Added
columns: `online_drift` (the hint's cell's drift flag when it was made),
`feedback_at_ms` (when its actual was fed back; null: never), `feedback_modeled`.

`AdmissionConsumer` is a stand-in, not a scheduler: it keeps a token budget of
requests in flight (reserved at dispatch, released at the ledger's end time)
and decides `admitted` when the reservation fits, else `queued`. A trusted hint
reserves `hint_p90`; without one (unsupported, a fallback it ignores) it
reserves prompt + max_tokens (or its default cap), the conservative rule.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from replaylab.contracts.columns import HISTORY_COLUMNS
from replaylab.contracts.columns import Ledger as L
from replaylab.contracts.enums import AckState
from replaylab.contracts.hints import (
    HINT_COLUMNS,
    RESIDUAL,
    RESIDUAL_COVERED,
    RESIDUAL_LOWER_BOUND,
    SUPPORTED_HINT_VERSIONS,
    Acknowledgement,
    DemandHint,
    is_lower_bound,
    ledger_record,
    negotiate,
)
from replaylab.projection import dispatch_time_features
from replaylab.projection.requests import ledger_requests, plain_records


@dataclass
class AdmissionConsumer:
    """Stand-in downstream admission with a budget of in-flight tokens.

    hint_versions: versions it understands (empty: no hint support);
    capacity_tokens: in-flight token budget; default_max_tokens: the cap it
    assumes for a request without max_tokens; use_fallback: whether it acts on a
    hint marked `hint_fallback` (default no: it ignores it and reserves the cap);
    responds: False models a consumer that never acknowledges (`absent`).
    """

    name: str = "admission"
    hint_versions: tuple[str, ...] = SUPPORTED_HINT_VERSIONS
    capacity_tokens: float = 500_000.0
    default_max_tokens: int = 4096
    use_fallback: bool = False
    responds: bool = True
    _in_flight: list[tuple[int, float]] = field(default_factory=list, repr=False)
    _reserved: float = 0.0

    @property
    def reserved_tokens(self) -> float:
        """Tokens held by the admitted requests in flight (as of the last `decide`)."""
        return self._reserved

    def decide(self, request: Mapping[str, Any], hint: DemandHint | None, now_ms: int,
               end_ms: int | None) -> Acknowledgement | None:
        """Admit or queue `request`; the acknowledgement (None when it does not respond)."""
        while self._in_flight and self._in_flight[0][0] <= now_ms:
            self._reserved -= heapq.heappop(self._in_flight)[1]
        if hint is None:
            state = AckState.UNSUPPORTED
        elif hint.hint_fallback and not self.use_fallback:
            state = AckState.IGNORED
        else:
            state = AckState.USED
        if state == AckState.USED:
            need = hint.hint_p90
        else:
            prompt = _num(request.get(L.PROMPT_TOKENS), 0.0)
            need = prompt + _num(request.get(L.MAX_TOKENS), float(self.default_max_tokens))
        decision = "admitted" if self._reserved + need <= self.capacity_tokens else "queued"
        if decision == "admitted" and end_ms is not None:
            self._reserved += need
            heapq.heappush(self._in_flight, (end_ms, need))
        if not self.responds:
            return None
        return Acknowledgement(state, decision)


def _num(v: Any, default: float) -> float:
    if v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v)):
        return default
    return float(v)


def _end_ms(row: Mapping[str, Any]) -> int | None:
    end = row.get(L.ENDED_AT)
    if end is not None:
        return int(end)
    dur = row.get(L.DURATION_MS)
    return None if dur is None else int(row[L.TIMESTAMP]) + int(dur)


@dataclass(frozen=True)
class ModeledLatency:
    """A request's end when the ledger has none: dispatch + ttft_ms + ms_per_token x output.

    MODELED, not measured (defaults: 1 s to the first token, 40 ms per output
    token, about a 70B model's decode step at a moderate batch, Splitwise's
    H100 figures); it only decides when a replay may feed an actual back.
    """

    ttft_ms: float = 1000.0
    ms_per_token: float = 40.0

    def end_ms(self, start_ms: int, completion_tokens: float) -> int:
        return int(start_ms + self.ttft_ms + self.ms_per_token * max(completion_tokens, 0.0))


def feedback_end_ms(row: Mapping[str, Any], latency: ModeledLatency | None,
                    ) -> tuple[int | None, bool]:
    """(when the row's actual may be fed back, whether that end is modeled); None: never."""
    end = _end_ms(row)
    if end is not None:
        return max(end, int(row[L.TIMESTAMP])), False
    comp = row.get(L.COMPLETION_TOKENS)
    if latency is None or comp is None:
        return None, False
    return latency.end_ms(int(row[L.TIMESTAMP]), float(comp)), True


def actual_total(row: Mapping[str, Any]) -> tuple[float | None, bool]:
    """(prompt + completion or None when usage is absent, whether it is a lower bound)."""
    prompt, comp = row.get(L.PROMPT_TOKENS), row.get(L.COMPLETION_TOKENS)
    lower = is_lower_bound(row.get(L.FINISH_REASON), row.get(L.LIFECYCLE_STATE))
    if prompt is None or comp is None:
        return None, lower
    return float(prompt) + float(comp), lower


def replay_hints(ledger: pd.DataFrame, predictor: Any,
                 consumer_for: Callable[[Mapping[str, Any]], AdmissionConsumer] | None = None,
                 *, online: Any = None, latency: ModeledLatency | None = ModeledLatency(),
                 online_from_ms: int | None = None) -> pd.DataFrame:
    """Replay `ledger` (validated ledger-v1, `validate_ledger(...).valid`) through the runtime.

    predictor: a `replaylab.runtime.DemandPredictor` (or anything with
    `predict_batch(requests) -> list[DemandHint]`). consumer_for: the consumer
    of a row (one shared AdmissionConsumer by default). online: the online
    recalibration of the replay (None: the predictor's config; False: off, the
    frozen hints in one batch; an `OnlineConfig`); latency: the modeled end of
    rows without one (see the module docstring); online_from_ms: when the
    artifact was deployed (e.g. the first dispatch of its test window): the
    actuals of requests dispatched earlier are never fed back (they trained or
    calibrated the model, so their residuals are in-sample); None: every
    row's. Returns one row per input
    row, in dispatch order, with hint, ack and residual columns added; rows
    and columns are never dropped.
    """
    consumer_for = consumer_for or _single(AdmissionConsumer())
    ordered = ledger.sort_values([L.TIMESTAMP, L.SESSION_ID, L.TURN_INDEX], kind="stable")
    history = dispatch_time_features(ordered)[list(HISTORY_COLUMNS)]
    rows = plain_records(ordered)
    requests = ledger_requests(ordered, history)
    live = None
    if hasattr(predictor, "with_fresh_online") and predictor.loaded:
        live = predictor.with_fresh_online(online)
        if not live.online_config.enabled:
            live = None
    if live is None:
        hints = predictor.predict_batch(requests) if requests else []
        extra = None
    else:
        hints, extra = _online_hints(live, rows, requests, latency, online_from_ms)
    out = []
    for row, req, hint in zip(rows, requests, hints, strict=True):
        consumer = consumer_for(row)
        sent = hint if negotiate(consumer.hint_versions) is not None else None
        ack = consumer.decide(req, sent, int(row[L.TIMESTAMP]), _end_ms(row))
        request = {k: v for k, v in row.items() if not k.startswith(("hint_", "ack_"))}
        out.append(ledger_record(request, sent, ack))
    columns = _columns(ordered)
    if extra is not None:
        for rec, e in zip(out, extra, strict=True):
            rec.update(e)
        columns += [c for c in ONLINE_REPLAY_COLUMNS if c not in columns]
    frame = pd.DataFrame(out, columns=columns)
    frame = _restore_dtypes(frame, ordered).reset_index(drop=True)
    if live is not None:
        frame.attrs["online_state"] = live.online_state()
    return frame


ONLINE_REPLAY_COLUMNS = ("online_drift", "feedback_at_ms", "feedback_modeled")


def _online_hints(predictor: Any, rows: list[dict], requests: list[dict],
                  latency: ModeledLatency | None, online_from_ms: int | None = None,
                  ) -> tuple[list[DemandHint], list[dict]]:
    """Hint rows one by one in dispatch order, feeding back actuals of requests ENDED by then.

    pending: a heap of (end ms, row position, hint, actual, lower bound); before
    row i is hinted, every entry with end <= row i's dispatch is acknowledged
    (ties: an end at the very dispatch ms has ended). A request still running at
    a dispatch contributes nothing to that hint. Rows dispatched before
    `online_from_ms` are hinted but never fed back.
    """
    pending: list[tuple[int, int, DemandHint, float, bool]] = []
    hints, extra = [], []
    for i, (row, req) in enumerate(zip(rows, requests, strict=True)):
        now = int(row[L.TIMESTAMP])
        while pending and pending[0][0] <= now:
            _, _, h, y, lower = heapq.heappop(pending)
            predictor.acknowledge(h, y, lower)
        hint = predictor.predict(req)
        hints.append(hint)
        end, modeled = feedback_end_ms(row, latency)
        y, lower = actual_total(row)
        fed = end is not None and y is not None and hint.correction_cell is not None \
            and (online_from_ms is None or now >= online_from_ms)
        if fed:
            heapq.heappush(pending, (end, i, hint, y, lower))
        extra.append({"online_drift": predictor.online_drift(hint.correction_cell)
                      if hint.correction_cell is not None else None,
                      "feedback_at_ms": end if fed else None,
                      "feedback_modeled": modeled if fed else None})
    return hints, extra


def _single(consumer: AdmissionConsumer) -> Callable[[Mapping[str, Any]], AdmissionConsumer]:
    return lambda _row: consumer


_ADDED = (*HINT_COLUMNS, L.ACK_STATE, L.ACK_DECISION, RESIDUAL, RESIDUAL_LOWER_BOUND,
          RESIDUAL_COVERED)


def _columns(ordered: pd.DataFrame) -> list[str]:
    """The input's columns (old hint/ack columns replaced), then the added ones."""
    cols = [c for c in ordered.columns if not str(c).startswith(("hint_", "ack_"))]
    return cols + [c for c in _ADDED if c not in cols]


def _restore_dtypes(frame: pd.DataFrame, ordered: pd.DataFrame) -> pd.DataFrame:
    """Carried columns keep their input dtypes (Int64 token counts stay integers)."""
    for c in frame.columns:
        if c in ordered.columns and frame[c].dtype != ordered[c].dtype:
            try:
                frame[c] = frame[c].astype(ordered[c].dtype)
            except (TypeError, ValueError):
                pass  # keep what the record produced; validate_ledger reads it either way
    return frame
