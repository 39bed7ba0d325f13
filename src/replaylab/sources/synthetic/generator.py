"""Seeded synthetic replay ledger (ledger-v1), distributions fitted to public traces.

The embedded default data of the product (docs/design/synthetic-ledger.md: model, fits, and a
real-vs-synthetic table). Per session, then per turn:

- turns L = ceil(LogNormal) (BurstGPT v3), shifted per category, at most `max_turns`;
- prompt of turn 0 = s (first-turn context, per category); of turn k = min(W_c, s +
  sum_{1<=j<=k} u_j + sum_{j<k} completion_j), as a chat API resends the conversation, u the
  new user message (ShareGPT), W_c a sliding context window; desired output per category.
  Token distributions are quantile functions fitted to the traces (params);
- lifecycle: max_tokens cuts the output (finish_reason=length); aborted rows keep the tokens
  made before the cancel (a lower bound); failures; absent usage; lifecycle unknown;
- routing: one binding per session (classifier, exploration or client-fixed) with its
  propensity; after a failing turn, maybe an escalation rebind to the next larger model;
- time: service time = TTFT + completion * ITL; turn k+1 is dispatched at the end of turn k
  plus a think time (BurstGPT v3), or at `overlap_rate` before it ended; a per-category
  ON/OFF time warp gives the inter-arrival CV of the Azure 2023 traces; session starts may
  follow a daily and weekly profile (off by default); the ledger ends
  where an export would (sessions still running lose their later turns).

Vectorized numpy; times are int64 epoch milliseconds (UTC). The config lives in
config.py; the stages' typed outputs, their integer codes and the ledger-v1
assembly in frame.py. Imports go one way: generator -> frame -> config.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from replaylab.sources.defects import DEFECT_REASONS, inject_defects
from replaylab.sources.synthetic import params as P
from replaylab.sources.synthetic.config import SyntheticLedgerConfig
from replaylab.sources.synthetic.frame import (
    ABORTED,
    CANCELLED,
    CLASSIFIED,
    COMPLETED,
    EXPLORED,
    FAILED,
    FAILURE,
    FIXED,
    HEURISTIC,
    STATUS_UNKNOWN,
    STICKY,
    SUCCESS,
    UNKNOWN,
    LedgerDraws,
    RouteDraws,
    SessionDraws,
    SessionRows,
    Timing,
    TurnDraws,
    assemble_frame,
)

__all__ = ["DEFECT_REASONS", "SyntheticLedgerConfig", "accumulate_prompts", "draw_ledger",
           "draw_turn_tokens", "generate_synthetic_ledger", "inject_defects",
           "profile_offsets", "sample_sessions", "session_rows", "start_rate",
           "steady_request_rate", "token_quantiles"]

_DEFAULT_ARRIVAL = "chat"  # categories without an arrival trace of their own
# Chosen constants (not fitted), documented in docs/design/synthetic-ledger.md.
_TRIM = 0.02  # an overflowing prompt is cut to [W * (1 - _TRIM), W]: cuts at message borders
_BLOCK = 16  # tokens per prefix-cache block (vLLM default block size)
_TTFT_JITTER = 0.3  # lognormal sigma of queueing noise on TTFT
_ITL_JITTER = 0.1  # lognormal sigma of the per-request decode speed
_SCORE_SPREAD = 1.5  # sd of the per-turn logit noise around a model's success rate
_MAX_THINK_MS = 86_400_000
_DAY_MS = 86_400_000


# ---------------------------------------------------------------- building blocks


def _pick(rng: np.random.Generator, weights: Sequence[float], size: int) -> np.ndarray:
    """Categorical draws, int64 (size,), of indices into `weights` (normalized here)."""
    cdf = np.cumsum(np.asarray(weights, dtype=float))
    return np.minimum(np.searchsorted(cdf / cdf[-1], rng.random(size), side="right"),
                      len(cdf) - 1)


def sample_sessions(fit: P.LogNormal, rng: np.random.Generator, n_sessions: int,
                    max_turns: int = 200, mix: Sequence[float] = (1.0,),
                    shift: Sequence[float] = (0.0,)) -> tuple[np.ndarray, np.ndarray]:
    """Category index and turns per session, int64 (n_sessions,) each.

    Category ~ `mix`; turns L = clip(ceil(exp(mu + shift[category] + sigma Z)), 1, max_turns).
    """
    cat = _pick(rng, mix, n_sessions)
    x = np.ceil(np.exp(fit.mu + np.asarray(shift, dtype=float)[cat]
                       + fit.sigma * rng.standard_normal(n_sessions)))
    return cat, np.clip(x, 1, max_turns).astype(np.int64)


def session_rows(turns: np.ndarray) -> SessionRows:
    """Row layout of sessions with `turns` turns each (S,), sessions contiguous."""
    first = np.cumsum(turns) - turns
    sess = np.repeat(np.arange(turns.size), turns)
    first_row = first[sess]
    return SessionRows(sess=sess, turn=np.arange(sess.size) - first_row, first_row=first_row,
                       first=first)


def token_quantiles(z: np.ndarray, log_q: np.ndarray, row: np.ndarray) -> np.ndarray:
    """Tokens exp(g_row(z)), float (n,): g piecewise linear through (Z_KNOTS, log_q[row]).

    z: standard normal scores (n,); log_q: (K, len(Z_KNOTS)) log-token quantiles, one line
    per distribution; row: which line each element uses. Flat beyond the end knots.
    """
    zk = np.asarray(P.Z_KNOTS)
    zc = np.clip(z, zk[0], zk[-1])
    j = np.clip(np.searchsorted(zk, zc, side="right"), 1, zk.size - 1)
    w = (zc - zk[j - 1]) / (zk[j] - zk[j - 1])
    return np.exp(log_q[row, j - 1] * (1.0 - w) + log_q[row, j] * w)


def draw_turn_tokens(cat: np.ndarray, turn: np.ndarray, fits: Sequence[P.CategoryTokens],
                     user: P.TokenQuantiles, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """New prompt tokens and desired output tokens per row, int64 (n,) each.

    `cat` indexes `fits`. New tokens are the first-turn context s on turn 0 and the user
    message u on later turns; the normal scores of new and output tokens have correlation
    `log_corr` (a Gaussian copula). Clipped to [1, context_window] and [1, output_max].
    """
    z, e = rng.standard_normal(cat.size), rng.standard_normal(cat.size)
    table = np.array([f.first_turn.log_q for f in fits] + [user.log_q])
    new = token_quantiles(z, table, np.where(turn == 0, cat, len(fits)))
    window = np.array([f.context_window for f in fits])[cat]
    rho = np.array([f.log_corr for f in fits])[cat]
    out = token_quantiles(rho * z + np.sqrt(1.0 - rho**2) * e,
                          np.array([f.output.log_q for f in fits]), cat)
    out_max = np.array([f.output_max for f in fits])[cat]
    return (np.clip(np.rint(new), 1, window).astype(np.int64),
            np.clip(np.rint(out), 1, out_max).astype(np.int64))


def accumulate_prompts(new: np.ndarray, carried: np.ndarray, first_row: np.ndarray,
                       window: np.ndarray, trim_u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Prompt tokens as a chat API resends the conversation: int64 (n,), overflow bool (n,).

    new: tokens new in this turn; carried: the previous answer's tokens carried into this
    prompt (0 on turn 0, or when the previous turn had not ended); first_row: row of the
    session's turn 0; window: context window W in tokens; trim_u: U(0, 1) per row. A prompt
    over W is cut to W * (1 - 0.02 * trim_u) (sliding window, cut at a message border).
    """
    inc = new + carried
    cs = np.cumsum(inc)
    raw = cs - (cs[first_row] - inc[first_row])
    over = raw > window
    cut = (window * (1.0 - _TRIM * trim_u)).astype(np.int64)
    return np.where(over, np.minimum(cut, raw), raw), over


def _shift(x: np.ndarray, turn: np.ndarray) -> np.ndarray:
    """Value of the previous turn of the same session (0 on turn 0)."""
    prev = np.zeros_like(x)
    prev[1:] = x[:-1]
    prev[turn == 0] = 0
    return prev


# ---------------------------------------------------------------- generation stages


def _draw_sessions(cfg: SyntheticLedgerConfig, cat: np.ndarray, turns: np.ndarray,
                   rng: np.random.Generator) -> SessionDraws:
    """Per-session attributes, arrays (S,): indices into the config's lists, cap -1 = none."""
    n = turns.size
    slo = _pick(rng, cfg.slo_mix, n)
    batch = np.array([c == "batch" for c in cfg.slo_classes])[slo]
    cap = np.asarray(cfg.cap_values, dtype=np.int64)[_pick(rng, cfg.cap_weights, n)]
    asked = rng.integers(0, len(cfg.models), n)
    return SessionDraws(turns=turns, cat=cat, slo=slo,
                        region=_pick(rng, cfg.region_mix, n),
                        stream=~batch & (rng.random(n) < cfg.streaming_share),
                        cap=np.where(rng.random(n) < cfg.capped_share, cap, -1),
                        asked=np.where(rng.random(n) < cfg.auto_model_share, -1, asked))


def _draw_tokens(cfg: SyntheticLedgerConfig, s: SessionDraws, r: SessionRows,
                 rng: np.random.Generator) -> TurnDraws:
    """Lifecycle, tokens generated (internal truth) and reported, prompts, cache hits; (n,)."""
    n, turn = r.sess.size, r.turn
    cat = s.cat[r.sess]
    fits = [P.CATEGORY_TOKENS[c] for c in cfg.categories]
    new, desired = draw_turn_tokens(cat, turn, fits, P.USER_TURN, rng)
    u = rng.random(n)
    f, a, k = cfg.failure_rate, cfg.abort_rate, cfg.unknown_state_rate
    state = np.select([u < f, u < f + a, u < f + a + k], [FAILED, ABORTED, UNKNOWN],
                      COMPLETED)
    cap = s.cap[r.sess]
    allowed = np.where(cap >= 0, np.minimum(desired, cap), desired)
    partial = np.floor(rng.random(n) * allowed).astype(np.int64)  # generated before the cut
    upstream = rng.random(n) < 0.5  # failed: an error before the first token, else deadline
    gen = np.where(state == ABORTED, partial, allowed)
    gen = np.where(state == FAILED, np.where(upstream, 0, partial), gen)
    absent = (state == UNKNOWN) | ((state == COMPLETED) & (rng.random(n) < cfg.absent_usage_rate))
    overlap = (turn > 0) & (rng.random(n) < cfg.overlap_rate)
    # A turn fired before its predecessor ended cannot carry the predecessor's answer.
    carried = np.where(overlap, 0, _shift(gen, turn))
    window = np.array([x.context_window for x in fits])[cat]
    prompt, over = accumulate_prompts(new, carried, r.first_row, window, rng.random(n))
    prefix = _shift(prompt, turn) + carried  # what the previous call left in the prefix cache
    hit = (turn > 0) & ~over & (rng.random(n) < cfg.cache_hit_rate)
    cached = np.where(hit, np.minimum(prefix, prompt) // _BLOCK * _BLOCK, 0)
    return TurnDraws(cat=cat, state=state, gen=gen, absent=absent, overlap=overlap,
                     length=(state == COMPLETED) & (cap >= 0) & (desired > cap),
                     upstream=upstream, prompt=prompt, cached=cached, cap=cap)


def _route(cfg: SyntheticLedgerConfig, s: SessionDraws, r: SessionRows, tok: TurnDraws,
           rng: np.random.Generator) -> RouteDraws:
    """Bindings, routing receipts and outcomes per row; escalation rebinds after a failure."""
    n_s, n_m, n = s.turns.size, len(cfg.models), r.sess.size
    sess, rows = r.sess, np.arange(n)
    policy = np.array([cfg.router_policy[c] for c in cfg.categories], dtype=float)
    pol = (policy / policy.sum(1, keepdims=True))[s.cat]  # (S, M)
    explore = rng.random(n_s) < cfg.exploration_rate
    classified = np.minimum((rng.random(n_s)[:, None] >= np.cumsum(pol, 1)).sum(1), n_m - 1)
    fixed = s.asked >= 0
    model0 = np.where(fixed, s.asked, np.where(explore, rng.integers(0, n_m, n_s), classified))
    eps = cfg.exploration_rate  # logging policy = (1 - eps) * classifier + eps * uniform
    prop0 = np.where(fixed, 1.0, (1 - eps) * pol[np.arange(n_s), model0] + eps / n_m)
    source0 = np.where(fixed, FIXED, np.where(explore, EXPLORED, CLASSIFIED))
    quality = np.array([P.MODEL_PROFILES[m].success_rate for m in cfg.models])
    noise = _SCORE_SPREAD * rng.standard_normal(n)

    def score(model: np.ndarray) -> np.ndarray:
        q = quality[model]
        return 1.0 / (1.0 + np.exp(-(np.log(q / (1 - q)) + noise)))

    failing = (tok.state == FAILED) | ((tok.state == COMPLETED) & (score(model0[sess]) < 0.5))
    trigger = failing & (r.turn < s.turns[sess] - 1) & (model0[sess] < n_m - 1) & ~fixed[sess]
    first_trigger = np.minimum.reduceat(np.where(trigger, rows, n), r.first)
    esc_row = np.where((first_trigger < n) & (rng.random(n_s) < cfg.escalation_rate),
                       first_trigger + 1, n)[sess]
    rebound, rebind = rows >= esc_row, rows == esc_row
    model = model0[sess] + rebound
    source = np.where(r.turn == 0, source0[sess], STICKY)
    source[rebind] = HEURISTIC  # a rule (failure -> next larger model), not the classifier
    propensity = np.where(r.turn == 0, prop0[sess], np.nan)
    propensity[rebind] = 1.0
    sc, st = score(model), tok.state
    status = np.select([st == ABORTED, st == FAILED, st == UNKNOWN, sc >= 0.5],
                       [CANCELLED, FAILURE, STATUS_UNKNOWN, SUCCESS], FAILURE)
    receipt = rng.random(n) < cfg.receipt_rate
    return RouteDraws(model=model, rebound=rebound, rebind=rebind, source=source,
                      propensity=propensity, status=np.where(receipt, status, STATUS_UNKNOWN),
                      score=np.where(receipt & (st == COMPLETED), sc, np.nan))


def _timing(cfg: SyntheticLedgerConfig, s: SessionDraws, r: SessionRows, tok: TurnDraws,
            route: RouteDraws, rng: np.random.Generator) -> Timing:
    """Dispatch time (epoch ms) and service time (ms) per row, int64 (n,).

    Service time (modeled): TTFT = (base + prefill_ms_per_token * uncached prompt) * jitter,
    duration = TTFT + generated tokens * ITL * jitter. Turn k >= 1 is dispatched at the end
    of turn k-1 plus a think time, or (overlap) before turn k-1 ended.
    """
    n, turn = r.sess.size, r.turn
    prof = [P.MODEL_PROFILES[m] for m in cfg.models]
    base, prefill, itl = (np.array([getattr(p, k) for p in prof])[route.model]
                          for k in ("ttft_base_ms", "prefill_ms_per_token", "itl_ms"))
    ttft = (base + prefill * (tok.prompt - tok.cached)) * np.exp(
        _TTFT_JITTER * rng.standard_normal(n))
    dur = ttft + tok.gen * itl * np.exp(_ITL_JITTER * rng.standard_normal(n))
    dur = np.where((tok.state == ABORTED) & (tok.gen == 0), ttft * rng.random(n), dur)
    dur_ms = np.maximum(1, np.rint(dur)).astype(np.int64)
    think = np.exp(P.THINK_TIME_S.mu + P.THINK_TIME_S.sigma * rng.standard_normal(n))
    think_ms = np.clip(np.rint(1000.0 * think), 1, _MAX_THINK_MS).astype(np.int64)
    prev_dur = _shift(dur_ms, turn)
    early = 1 + np.floor(rng.random(n) * np.maximum(prev_dur - 1, 0)).astype(np.int64)
    step = np.where(tok.overlap, early, prev_dur + _shift(think_ms, turn))
    step[turn == 0] = 0
    cs = np.cumsum(step)
    # Session starts: Poisson in each category's active time, compressed by the expected
    # stretch of its OFF periods so that every category spans about the same wall time;
    # with a daily / weekly profile, at the rate `start_rate` (the OFF warp damps it in a
    # category whose time is mostly OFF: code).
    span_s = max(s.turns.size / cfg.sessions_per_s, cfg.min_window_s)
    rate, span_ms = s.turns.size / span_s, 1000.0 * span_s  # sessions/s, ms
    kappa = np.array([1.0 + _arrival(c).off_per_request * _arrival(c).mean_off
                      for c in cfg.categories])
    offset = rng.random(s.turns.size) * span_ms  # uniform: a constant start rate
    if cfg.diurnal_amplitude > 0 or cfg.weekend_factor != 1.0:
        offset = profile_offsets(offset / span_ms, span_ms, cfg)
    start = np.floor(offset / kappa[s.cat]).astype(np.int64)
    active = start[r.sess] + cs - cs[r.first_row]
    # mean steady-state gap of each category's requests in active time, ms
    mix = np.asarray(cfg.category_mix, dtype=float) / sum(cfg.category_mix)
    gap_ms = 1000.0 / (rate * mix * kappa * _mean_turns(cfg) + 1e-12)
    return Timing(timestamp=cfg.start_ms + _warp(active, tok.cat, gap_ms, cfg.categories, rng),
                  duration=dur_ms)


def start_rate(clock_ms: np.ndarray, cfg: SyntheticLedgerConfig) -> np.ndarray:
    """Relative session start rate at epoch-ms clock times (float, mean ~1 over whole days
    and weeks): 1 + diurnal_amplitude x cos(2 pi (hour UTC - diurnal_peak_hour) / 24), times
    weekend_factor on Saturdays and Sundays (UTC)."""
    hour = (clock_ms % _DAY_MS) / 3_600_000.0
    rate = 1.0 + cfg.diurnal_amplitude * np.cos(2 * np.pi * (hour - cfg.diurnal_peak_hour) / 24)
    weekday = (clock_ms // _DAY_MS + 3) % 7  # 0 = Monday (1970-01-01 was a Thursday)
    return rate * np.where(weekday >= 5, cfg.weekend_factor, 1.0)


def profile_offsets(u: np.ndarray, span_ms: float, cfg: SyntheticLedgerConfig) -> np.ndarray:
    """Session start offsets in [0, span_ms] (ms, float) whose rate follows `start_rate` from
    `cfg.start_ms`: uniform draws u (n,) through the inverse of the cumulative rate (a
    one-minute grid, linear in between). The same number of sessions over the same span."""
    grid = np.linspace(0.0, span_ms, max(2, int(np.ceil(span_ms / 60_000.0)) + 1))
    rate = start_rate(cfg.start_ms + grid, cfg)
    cum = np.concatenate([[0.0], np.cumsum((rate[1:] + rate[:-1]) / 2 * np.diff(grid))])
    return np.interp(u * cum[-1], cum, grid)


def _arrival(category: str) -> P.OnOffBurst:
    return P.ARRIVALS.get(category, P.ARRIVALS[_DEFAULT_ARRIVAL])


def _warp(active: np.ndarray, cat: np.ndarray, gap_ms: np.ndarray, categories: Sequence[str],
          rng: np.random.Generator) -> np.ndarray:
    """ON/OFF time warp per category: wall = active + OFF time inserted before it (ms, int64).

    After each request of category c, with probability `off_per_request`, an OFF period
    follows: LogNormal in units of gap_ms[c], the mean steady-state inter-arrival gap of c
    in active time, at most `off_max` units. The warp is a non-decreasing function of the
    active time with slope >= 1: order and gaps within sessions survive.
    """
    wall = active.copy()
    for c, name in enumerate(categories):
        rows = np.flatnonzero(cat == c)
        b, t = _arrival(name), active[rows]
        pos = np.sort(t[rng.random(rows.size) < b.off_per_request])
        d = np.minimum(np.exp(b.off_gap.mu + b.off_gap.sigma * rng.standard_normal(pos.size)),
                       b.off_max)
        cum = np.concatenate([[0], np.cumsum(np.rint(gap_ms[c] * d).astype(np.int64))])
        wall[rows] = t + cum[np.searchsorted(pos, t, side="right")]
    return wall


def _mean_turns(cfg: SyntheticLedgerConfig) -> np.ndarray:
    """Expected turns per session of each category, (C,): E[ceil X] ~ E[X] + 1/2."""
    shift = np.array([P.CATEGORY_TOKENS[c].session_shift for c in cfg.categories])
    mean = np.exp(P.SESSION_TURNS.mu + shift + P.SESSION_TURNS.sigma**2 / 2) + 0.5
    return np.minimum(mean, cfg.max_turns)


def _sessions_for(cfg: SyntheticLedgerConfig, n_requests: int) -> int:
    """Sessions to draw so that about 1.2 x n_requests turns exist."""
    w = np.asarray(cfg.category_mix, dtype=float) / sum(cfg.category_mix)
    return int(1.2 * n_requests / float(w @ _mean_turns(cfg))) + 64


def steady_request_rate(cfg: SyntheticLedgerConfig, n_requests: int) -> float:
    """Requests per second of wall time, once sessions overlap, in a draw of `n_requests`
    rows: session starts per second (`sessions_per_s`, lower where `min_window_s` spreads a
    small ledger) x expected turns per session."""
    n_sessions = _sessions_for(cfg, n_requests)
    span_s = max(n_sessions / cfg.sessions_per_s, cfg.min_window_s)
    w = np.asarray(cfg.category_mix, dtype=float) / sum(cfg.category_mix)
    return n_sessions / span_s * float(w @ _mean_turns(cfg))


def _export_window(ts: np.ndarray, turn: np.ndarray, n_requests: int | None) -> np.ndarray | None:
    """Rows a ledger exported at time T holds, bool (n,): T = the n_requests-th dispatch, or
    the last session start. Sessions still running at T lose their later turns, as in a
    real export; no sparse tail of long sessions. None: fewer than n_requests rows by then."""
    last_start = ts[turn == 0].max()
    if n_requests is None:
        return ts <= last_start
    if int((ts <= last_start).sum()) < n_requests:
        return None
    keep = np.zeros(ts.size, dtype=bool)
    keep[np.argsort(ts, kind="stable")[:n_requests]] = True
    return keep


def draw_ledger(cfg: SyntheticLedgerConfig, rng: np.random.Generator) -> LedgerDraws:
    """One draw of the generator from `rng`: every stage's arrays and the export window.

    Rows kept: exactly `cfg.n_requests` if set (the export window ends at that dispatch), else
    the turns of `cfg.n_sessions` sessions dispatched up to the last session start.
    """
    n_sessions = cfg.n_sessions if cfg.n_requests is None else _sessions_for(cfg, cfg.n_requests)
    shift = [P.CATEGORY_TOKENS[c].session_shift for c in cfg.categories]
    while True:
        cat, turns = sample_sessions(P.SESSION_TURNS, rng, n_sessions, cfg.max_turns,
                                     cfg.category_mix, shift)
        s = _draw_sessions(cfg, cat, turns, rng)
        r = session_rows(turns)
        tok = _draw_tokens(cfg, s, r, rng)
        route = _route(cfg, s, r, tok, rng)
        times = _timing(cfg, s, r, tok, route, rng)
        keep = _export_window(times.timestamp, r.turn, cfg.n_requests)
        if keep is not None:
            return LedgerDraws(s, r, tok, route, times, keep)
        n_sessions = int(1.5 * n_sessions) + 64  # rare: draw again with more sessions


def generate_synthetic_ledger(cfg: SyntheticLedgerConfig, seed: int) -> pd.DataFrame:
    """A ledger-v1 frame (one row per request, dispatch order) drawn from `cfg` with `seed`.

    Same config and seed give the same frame. Rows: exactly `cfg.n_requests` if set (the
    export window ends at that dispatch), else the turns of `cfg.n_sessions` sessions
    dispatched up to the last session start (1.7 per session at n_sessions=4000).
    """
    return assemble_frame(cfg, seed, draw_ledger(cfg, np.random.default_rng(seed)))
