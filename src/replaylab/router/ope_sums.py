"""Off-policy evaluation of a served router's test decisions as sums over rows.

The receipts pipeline judges the served router on its test sessions (one opening
decision per session) with IPS, SNIPS and DR of quality, call cost and session cost,
the paired differences learned - logging, the logging policy's own values and a
threshold sweep. Every one of them is a ratio of sums of per-row terms (`TERMS`), so
`ope_part` computes a block of rows' sums and `add_ope` adds blocks: the receipts
pipeline (`pipelines.router_receipts`) passes one block per partition of the engine, and
`ope_from_sums` turns the totals into the summary's
`ope` section. Both modes therefore report the same numbers.

Intervals: a session-cluster Poisson bootstrap (Hanley & MacGibbon 2006; Chamandy et
al. 2012, "Estimating uncertainty for massive data streams"): replicate b weights
session s by w[b, s] ~ Poisson(1), a function of (session id, b, seed) only
(`compute.ops.poisson_weights`, the one session bootstrap), so any partitioning of the rows gives the same
replicates. Percentile intervals of the replicate ratios (`stats.percentile_interval`).
It replaces the multinomial session resampling of `router.ope.ope_estimates` here
(equally valid, asymptotically the same; a receipts run before this change reports
intervals that differ by bootstrap noise). The offline-replay mode keeps `router.ope`.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from replaylab.router.gate import GateBoundary, gate_interval, one_sided_lower
from replaylab.router.ope import clip_interval, feasible_interval, support_check
from replaylab.router.replay import Label
from replaylab.runtime.routing import choose_by_threshold
from replaylab.stats import percentile_interval

# fewer explored test sessions than this showing the served router's departures: flagged
LOW_DEPARTURE_SUPPORT = 20
BOOT_CHUNK = 4_096     # rows per Poisson-weight block (n_boot x rows float64)
TERMS = ("one", "w", "wr", "dr_q", "dm_q", "wc", "dr_c", "dm_c", "ws", "dr_s", "dm_s",
         "d_q", "d_c", "r", "c", "s")
# The clip sensitivity (issue 45): every estimator at each clip of the importance weight,
# the automatic clip chosen among them (`auto_clip`). None: no clip (unbiased).
CLIPS = (None, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0)
# per clip: weights and weighted terms of quality, cost and the strongest constant policy
# (`wt`: its weight), DR terms, then what the automatic clip reads (bias residuals and
# squares for the variance)
CLIP_TERMS = ("w", "wr", "dr_q", "wc", "dr_c", "wt", "wtr", "dr_t",
              "ips_b", "ips_b2", "dr_b", "dr_b2", "wr2", "dr_q2")


def prob_of(part: pd.DataFrame, k: int) -> np.ndarray:
    """(n, K) the served head's P(success) columns p0..p{K-1} of scored rows."""
    return part[[f"p{j}" for j in range(k)]].to_numpy(float).reshape(len(part), k)


def scored_rows(d: pd.DataFrame, prob: np.ndarray, choice: np.ndarray) -> pd.DataFrame:
    """Test decisions (receipts columns) with the served head's P(success) and choice, in
    the layout `ope_part` reads."""
    out = d.assign(split="test", choice=np.asarray(choice, np.int64)).reset_index(drop=True)
    for j in range(prob.shape[1]):
        out[f"p{j}"] = np.asarray(prob[:, j], dtype="float64")
    return out


def ope_part(part: pd.DataFrame, k: int, unit_cost: np.ndarray, unit_session: np.ndarray,
             n_boot: int, seed: int, max_weight: float | None, thresholds: np.ndarray | None,
             fallback: int, rule: str) -> dict:
    """One partition's OPE sums over its test rows (one opening decision per session):
    point sums of every term, their Poisson-bootstrap replicate sums (n_boot, terms), the
    diagnostics' counts, and the threshold sweep's sums when `thresholds` is given."""
    t = part[part["split"] == "test"]
    n = len(t)
    m = len(TERMS)
    out: dict = {"sums": np.zeros(m), "reps": np.zeros((n_boot, m)), "w2": 0.0, "wpos": 0,
                 "wmax": -np.inf, "agree": 0, "explored": 0, "own": 0, "own_depart": 0,
                 "depart_support": 0, "served": np.zeros(k, np.int64), "session_nan": 0, "n": n}
    out.update(clip_sums=np.zeros((len(CLIPS), len(CLIP_TERMS))),
               clip_reps=np.zeros((n_boot, len(CLIPS), len(CLIP_TERMS))),
               clip_bmax=np.zeros((len(CLIPS), 2)), weights=np.zeros(0))
    if thresholds is not None:
        out["sweep"] = np.zeros((5, len(thresholds)))
    if n == 0:
        return out
    prob = prob_of(t, k)
    choice = t["choice"].to_numpy(np.int64)
    a = t["action"].to_numpy(np.int64)
    p = t[Label.PROPENSITY].to_numpy(float)
    r = t[Label.REWARD].to_numpy(float)
    c = t[Label.COST].to_numpy(float)
    s_raw = t[Label.SESSION_COST].to_numpy(float)
    out["session_nan"] = int((~np.isfinite(s_raw)).sum())
    s = np.nan_to_num(s_raw)
    rows = np.arange(n)
    w = (choice == a) / p
    if max_weight is not None:
        w = np.minimum(w, max_weight)
    uc, us = unit_cost[None, :].repeat(n, 0), unit_session[None, :].repeat(n, 0)
    dr_q = prob[rows, choice] + w * (r - prob[rows, a])
    dr_c = uc[rows, choice] + w * (c - uc[rows, a])
    dr_s = us[rows, choice] + w * (s - us[rows, a])
    terms = np.stack([np.ones(n), w, w * r, dr_q, prob[rows, choice], w * c, dr_c,
                      uc[rows, choice], w * s, dr_s, us[rows, choice], dr_q - r, dr_c - c,
                      r, c, s])  # (m, n), TERMS order
    out["sums"] = terms.sum(axis=1)
    w_raw = (choice == a) / p
    ct = clip_terms(w_raw, (a == fallback) / p, prob, choice, a, r, c, uc, fallback)  # (C, m2, n)
    out["clip_sums"] = ct.sum(axis=2)
    out["clip_bmax"] = np.abs(ct[:, [CLIP_TERMS.index("ips_b"), CLIP_TERMS.index("dr_b")]]
                              ).max(axis=2)
    out["weights"] = w_raw
    if n_boot:
        from replaylab.compute.ops import key_hash, poisson_weights

        h = key_hash(t[Label.SESSION_ID].to_numpy(dtype=object))
        flat = ct.reshape(-1, n)
        for lo in range(0, n, BOOT_CHUNK):
            W = poisson_weights(h[lo:lo + BOOT_CHUNK], n_boot, seed)  # (B, rows)
            out["reps"] += W @ terms[:, lo:lo + BOOT_CHUNK].T
            out["clip_reps"] += (W @ flat[:, lo:lo + BOOT_CHUNK].T).reshape(out["clip_reps"].shape)
    explored = (t[Label.LABEL_SOURCE] == "exploration").to_numpy()
    own = ~explored
    out.update(w2=float((w ** 2).sum()), wpos=int((w > 0).sum()), wmax=float(w.max()),
               agree=int((choice == a).sum()), explored=int(explored.sum()),
               own=int(own.sum()), own_depart=int((choice[own] != a[own]).sum()),
               depart_support=int((explored & (choice == a)).sum()),
               served=np.bincount(choice, minlength=k)[:k].astype(np.int64))
    if thresholds is not None:
        sweep = choose_by_threshold(prob, thresholds, fallback=fallback, rule=rule)  # (T, n)
        match = sweep == a[None, :]
        ww = match / p[None, :]
        if max_weight is not None:
            ww = np.minimum(ww, max_weight)
        dm_q = np.take_along_axis(prob, sweep.T, axis=1).T
        dm_c = np.take_along_axis(uc, sweep.T, axis=1).T
        out["sweep"] = np.stack([
            (sweep == fallback).sum(axis=1),
            (ww * r[None, :]).sum(axis=1),
            (dm_q + ww * (r - prob[rows, a])[None, :]).sum(axis=1),
            (dm_c + ww * (c - uc[rows, a])[None, :]).sum(axis=1),
            np.full(len(thresholds), n)])
    return out


def clip_terms(w: np.ndarray, wt: np.ndarray, prob: np.ndarray, choice: np.ndarray,
               a: np.ndarray, r: np.ndarray, c: np.ndarray, uc: np.ndarray,
               fallback: int) -> np.ndarray:
    """(len(CLIPS), len(CLIP_TERMS), n) per-row terms at each clip: w the served policy's
    unclipped weights (n,), wt the strongest constant policy's, prob (n, K) the reward
    model, uc (n, K) the cost model."""
    rows = np.arange(len(w))
    q_a, q_pi, q_fb = prob[rows, a], prob[rows, choice], prob[:, fallback]
    out = []
    for clip in CLIPS:
        wc_ = w if clip is None else np.minimum(w, clip)
        wt_ = wt if clip is None else np.minimum(wt, clip)
        dr_q = q_pi + wc_ * (r - q_a)
        out.append(np.stack([
            wc_, wc_ * r, dr_q, wc_ * c, uc[rows, choice] + wc_ * (c - uc[rows, a]),
            wt_, wt_ * r, q_fb + wt_ * (r - q_a),
            (w - wc_) * r, ((w - wc_) * r) ** 2, (w - wc_) * (r - q_a),
            ((w - wc_) * (r - q_a)) ** 2, (wc_ * r) ** 2, dr_q ** 2]))
    return np.stack(out)


def add_ope(a: dict, b: dict) -> dict:
    out = {}
    for key, v in a.items():
        if key in ("wmax", "clip_bmax"):
            out[key] = np.maximum(v, b[key]) if key == "clip_bmax" else max(v, b[key])
        elif key == "weights":
            out[key] = np.concatenate([v, b[key]])
        else:
            out[key] = v + b[key]
    return out


def estimator_dict(num: str, den: str, sums: np.ndarray, reps: np.ndarray, level: float,
                   tag: str, key: str) -> dict:
    """{key, key-lo-tag, key-hi-tag} of the ratio num/den with its percentile interval."""
    i, j = TERMS.index(num), TERMS.index(den)
    with np.errstate(invalid="ignore", divide="ignore"):  # no support: nan, said as such
        rep = reps[:, i] / reps[:, j]
        value = float(sums[i] / sums[j])
    lo, hi = percentile_interval(rep, level) if len(rep) else (float("nan"), float("nan"))
    return {key: value, f"{key}-lo-{tag}": lo, f"{key}-hi-{tag}": hi}


def assemble_test_ope(est: dict, cost: dict, session: dict | None, diff: dict, logging: dict,
                      counts: dict, tag: str) -> dict:
    """The summary's `ope` section from the estimators' outputs (`ope_estimates`' keys for
    quality, cost and session cost; paired differences; the logging policy's own values)
    and the decision counts; both compute modes (local arrays, Dask partition sums)."""
    out: dict = {name: feasible_interval(est, name, 0.0, 1.0, tag) for name in ("ips", "snips", "dr")}
    out["cost"] = feasible_interval(cost, "dr", 0.0, math.inf, tag)
    out["cost"]["ips"] = feasible_interval(cost, "ips", 0.0, math.inf, tag)
    if session is not None:
        out["session_cost"] = feasible_interval(session, "dr", 0.0, math.inf, tag)
    out["diff"] = diff
    for key, (lo, hi) in (("quality", (-1.0, 1.0)), ("cost", (-math.inf, math.inf))):
        dd = out["diff"][key]
        a, b = clip_interval(dd["ci"], lo, hi)
        dd["ci"] = [min(a, dd["estimate"]), max(b, dd["estimate"])]
    out["logging"] = logging
    out.update(n=int(est["n"]), sessions=int(est["sessions"]), ess=float(est["ess"]),
               support=float(est["support"]), mean_weight=float(est["mean_weight"]),
               max_weight=float(est["max_weight"]), agreement=float(counts["agreement"]),
               explored_sessions=int(counts["explored_sessions"]),
               served_choice=dict(counts["served_choice"]))
    # Departures: where the served router chooses other than the logging policy did, the
    # only direct evidence is explored sessions that happened to log the served choice;
    # with few of them the DR interval leans on the reward model (seen: a round-1 run with
    # 5 such sessions missed the truth by 0.13 with ESS 93 > LOW_ESS)
    out["departure_share"] = float(counts["departure_share"])
    out["departure_support"] = int(counts["departure_support"])
    warn = []
    if out["departure_share"] >= 0.05 and out["departure_support"] < LOW_DEPARTURE_SUPPORT:
        warn.append(f"low support: the served router departs from the logging policy on "
                    f"{out['departure_share']:.0%} of test sessions, and only "
                    f"{out['departure_support']} explored test sessions show its choice there "
                    "(the interval leans on the reward model)")
    out["warnings"] = warn + support_check(out)
    return out


def ope_from_sums(total: dict, cands: tuple[str, ...], n_sessions_test: int, level: float,
                  tag: str, objective_fraction: float | None = None,
                  boundary: GateBoundary | None = None) -> dict:
    """The `ope` section (router_receipts.assemble_test_ope) from the summed partition
    results, with the OPE evidence (`ope_evidence`; `objective_fraction`: the
    quality_floor objective's fraction of strong-only, else None)."""
    S, R = total["sums"], total["reps"]
    n = int(total["n"])
    w_sum = float(S[TERMS.index("w")])
    diag = {"n": n, "sessions": int(n_sessions_test), "mean_weight": w_sum / max(n, 1),
            "max_weight": float(total["wmax"]) if n else float("nan"),
            "ess": (w_sum ** 2 / total["w2"]) if total["wpos"] else 0.0,
            "support": total["wpos"] / n if n else float("nan")}

    def est(pairs: dict[str, tuple[str, str]]) -> dict:
        out = dict(diag)
        for key, (num, den) in pairs.items():
            out.update(estimator_dict(num, den, S, R, level, tag, key))
        return out

    quality = est({"ips": ("wr", "one"), "snips": ("wr", "w"), "dr": ("dr_q", "one"),
                   "dm": ("dm_q", "one")})
    cost = est({"ips": ("wc", "one"), "snips": ("wc", "w"), "dr": ("dr_c", "one"),
                "dm": ("dm_c", "one")})
    session = (est({"ips": ("ws", "one"), "snips": ("ws", "w"), "dr": ("dr_s", "one"),
                    "dm": ("dm_s", "one")}) if total["session_nan"] == 0 else None)

    def plain(num: str, key: str) -> dict:
        e = estimator_dict(num, "one", S, R, level, tag, "v")
        return {"estimate": e["v"], "ci": [e[f"v-lo-{tag}"], e[f"v-hi-{tag}"]], **(
            {"estimator": "dr"} if key == "diff" else {})}

    diff = {"quality": plain("d_q", "diff"), "cost": plain("d_c", "diff")}
    logging = {"quality": plain("r", "log"), "cost": plain("c", "log"),
               **({"session_cost": plain("s", "log")} if session is not None else {})}
    counts = {"agreement": total["agree"] / n if n else float("nan"),
              "explored_sessions": int(total["explored"]),
              "served_choice": {c: int(total["served"][j]) for j, c in enumerate(cands)},
              "departure_share": (total["own_depart"] / total["own"] if total["own"]
                                  else float("nan")),
              "departure_support": int(total["depart_support"])}
    out = assemble_test_ope(quality, cost, session, diff, logging, counts, tag)
    out["evidence"] = ope_evidence(
        total, {"share": out["departure_share"], "support": out["departure_support"]},
        boundary or GateBoundary(level=level), objective_fraction)
    return out


def sweep_curve(total: dict, thresholds: np.ndarray) -> pd.DataFrame:
    """The test threshold curve from `ope_part`'s sweep sums: share of the strongest
    candidate, DR and IPS quality and DR cost per threshold."""
    sw = total["sweep"]
    n = np.maximum(sw[4], 1)
    return pd.DataFrame({"threshold": thresholds, "strong_share": sw[0] / n,
                         "quality": sw[2] / n, "quality_ips": sw[1] / n, "cost": sw[3] / n,
                         "policy": "learned"})


# ---------------------------------------------------------------- the OPE evidence (issue 45)
ESTIMATOR_NAMES = ("ips", "snips", "dr")
DELTA = 0.05  # the automatic clip's bias bound holds with probability 1 - DELTA (OBP's default)
MIN_ESS_SHARE = 0.3  # CJE refuses below 30% of n ... only where ESS is also under LOW_ESS
MAX_TOP1_SHARE = 0.5  # the top 1% of sessions holding more than half the weight: concentrated
WEIGHT_TOP = 0.01


def _clip_value(S: np.ndarray, C: np.ndarray, est: str, what: str) -> np.ndarray:
    """Value of the served policy (`q` quality, `c` cost) or of strong-only (`t`) under an
    estimator, from base sums S (..., TERMS) and one clip's sums C (..., CLIP_TERMS); works
    on points (1-d) and replicates (2-d)."""
    T, K = TERMS.index, CLIP_TERMS.index
    one = S[..., T("one")]
    num = {"q": ("wr", "dr_q"), "c": ("wc", "dr_c"), "t": ("wtr", "dr_t")}[what]
    den_w = {"q": "w", "c": "w", "t": "wt"}[what]
    with np.errstate(invalid="ignore", divide="ignore"):
        if est == "ips":
            return C[..., K(num[0])] / one
        if est == "snips":
            return C[..., K(num[0])] / C[..., K(den_w)]
        return C[..., K(num[1])] / one


def auto_clip(total: dict, estimator: str) -> dict:
    """The clip Open Bandit Pipeline's tuning would choose (obp.ope `*Tuning` with
    use_bias_upper_bound=True, delta=0.05; Su et al., "Doubly Robust Off-Policy Evaluation
    with Shrinkage", ICML 2020): among CLIPS, the least estimated MSE = variance / n +
    (a high-probability upper bound on the clip's bias)^2, the bias bound the empirical
    Bernstein bound of the mean residual (w - w_clip) x (r or r - q) (Thomas et al. 2015).
    Written here because obp pins old scikit-learn/torch releases; it is 20 lines of sums."""
    n = float(total["n"])
    kb = {"ips": 0, "snips": 0, "dr": 1}[estimator]
    b_name = ("ips_b", "dr_b")[kb]
    v_name = ("wr2", "dr_q2")[kb]
    K = CLIP_TERMS.index
    rows = []
    for i, clip in enumerate(CLIPS):
        Cs = total["clip_sums"][i]
        if n < 2:
            rows.append({"clip": clip, "mse": float("nan")})
            continue
        mean_v = (Cs[K("wr")] if kb == 0 else Cs[K("dr_q")]) / n
        var_v = max(Cs[K(v_name)] / n - mean_v ** 2, 0.0)
        mb = Cs[K(b_name)] / n
        var_b = max(Cs[K(b_name + "2")] / n - mb ** 2, 0.0)
        log_t = math.log(2.0 / DELTA)
        bias = (abs(mb) + math.sqrt(2.0 * var_b * log_t / n)
                + 7.0 * float(total["clip_bmax"][i][kb]) * log_t / (3.0 * (n - 1.0)))
        if clip is None:
            bias = 0.0  # no clip, no bias
        rows.append({"clip": clip, "variance": var_v / n, "bias_bound": bias,
                     "mse": var_v / n + bias ** 2})
    finite = [r for r in rows if math.isfinite(r["mse"])]
    best = min(finite, key=lambda r: r["mse"]) if finite else rows[0]
    return {"clip": best["clip"], "estimator": estimator, "candidates": rows,
            "by": "least variance / n + (bias upper bound)^2 over the clips (Open Bandit "
                  f"Pipeline's tuning, delta {DELTA:g})"}


def weight_diagnostics(total: dict, departure: dict) -> dict:
    """ESS, the largest weight and the share of the total weight held by the top 1% of
    sessions (one opening per session), of the served policy's unclipped weights; which
    overlap diagnostic fails and the factor n_needed / n at which it would pass."""
    w = np.asarray(total["weights"], float)
    n = len(w)
    tot = float(w.sum())
    ess = tot ** 2 / float((w ** 2).sum()) if tot > 0 else 0.0
    top = max(1, math.ceil(WEIGHT_TOP * n))
    top_share = float(np.sort(w)[::-1][:top].sum() / tot) if tot > 0 else float("nan")
    failed, factors = [], []
    from replaylab.router.ope import LOW_ESS

    if ess < LOW_ESS:
        failed.append(f"ESS {ess:.1f} of {n} sessions < {LOW_ESS:g}")
        factors.append(LOW_ESS / max(ess, 1e-9))
    if departure["share"] >= 0.05 and departure["support"] < LOW_DEPARTURE_SUPPORT:
        failed.append(f"{departure['support']} explored test sessions show the served choice "
                      f"where it departs from the logging policy ({departure['share']:.0%} of "
                      f"sessions) < {LOW_DEPARTURE_SUPPORT}")
        factors.append(LOW_DEPARTURE_SUPPORT / max(departure["support"], 0.5))
    if n and top_share > MAX_TOP1_SHARE:
        failed.append(f"the top 1% of sessions ({top}) hold {top_share:.0%} of the weight "
                      f"> {MAX_TOP1_SHARE:.0%}")
        factors.append(1.0)  # more sessions alone need not spread the weight: no factor
    return {"n": n, "ess": ess, "ess_share": ess / n if n else float("nan"),
            "max_weight": float(w.max()) if n else float("nan"),
            "top1pct_sessions": top, "top1pct_weight_share": top_share,
            "failed": failed, "factors": factors}


def ope_variants(total: dict, boundary: GateBoundary,
                 objective_fraction: float | None) -> dict:
    """Every estimator (IPS, SNIPS, DR) at the clips none and auto (`auto_clip`, chosen per
    estimator; SNIPS takes IPS's): value, paired quality difference vs the logging policy,
    cost, paired cost difference, strong-only value and, with `objective_fraction`, the
    quality minus that fraction of strong-only; each {"estimate", "ci", "reps"} (the
    replicates are dropped before the summary)."""
    S, R = total["sums"], total["reps"]
    T = TERMS.index
    with np.errstate(invalid="ignore", divide="ignore"):
        log_q, log_q_r = S[T("r")] / S[T("one")], R[:, T("r")] / R[:, T("one")]
        log_c, log_c_r = S[T("c")] / S[T("one")], R[:, T("c")] / R[:, T("one")]
    out = {}
    autos = {e: auto_clip(total, "ips" if e == "snips" else e) for e in ESTIMATOR_NAMES}
    for est in ESTIMATOR_NAMES:
        for label, clip in (("none", None), ("auto", autos[est]["clip"])):
            i = CLIPS.index(clip)
            Cs, Cr = total["clip_sums"][i], total["clip_reps"][:, i, :]

            def fig(point: float, reps: np.ndarray) -> dict:
                return {"estimate": float(point), "ci": gate_interval(reps, point, boundary),
                        "reps": reps}

            q, qr = _clip_value(S, Cs, est, "q"), _clip_value(R, Cr, est, "q")
            c, cr = _clip_value(S, Cs, est, "c"), _clip_value(R, Cr, est, "c")
            t, tr = _clip_value(S, Cs, est, "t"), _clip_value(R, Cr, est, "t")
            v = {"estimator": est, "clip_level": label, "clip": clip,
                 "quality": fig(q, qr), "diff_quality": fig(q - log_q, qr - log_q_r),
                 "cost": fig(c, cr), "diff_cost": fig(c - log_c, cr - log_c_r),
                 "strong_only_quality": fig(t, tr)}
            if objective_fraction is not None:
                v["quality_vs_floor"] = fig(q - objective_fraction * t,
                                            qr - objective_fraction * tr)
            out[f"{est}@{label}"] = v
    return {"variants": out, "auto_clip": autos}


CHOSEN = "dr@none"  # the gate's estimator and clip: DR, no clip (unbiased if p or q is right)


def ope_evidence(total: dict, departure: dict, boundary: GateBoundary,
                 objective_fraction: float | None) -> dict:
    """The report's OPE evidence for the served policy against the logging policy: IPS,
    SNIPS and DR at the clips none and auto, the weight diagnostics, and the
    high-confidence lower bounds of the gain (one-sided at the boundary's level, on the
    gate's own estimator and clip `CHOSEN`)."""
    got = ope_variants(total, boundary, objective_fraction)
    ch = got["variants"][CHOSEN]
    hclb = {"level": boundary.level, "estimator": CHOSEN,
            "quality_gain": one_sided_lower(ch["diff_quality"]["reps"], boundary.level),
            "cost_saving": one_sided_lower(-ch["diff_cost"]["reps"], boundary.level),
            "what": "one-sided session-bootstrap lower bounds: quality of the served policy "
                    "minus the logging policy's, and the logging policy's cost per opening "
                    "call minus the served policy's"}
    variants = {k: {f: ({"estimate": x["estimate"], "ci": x["ci"]} if isinstance(x, dict) else x)
                    for f, x in v.items()} for k, v in got["variants"].items()}
    return {"chosen": CHOSEN, "variants": variants, "auto_clip": got["auto_clip"],
            "weights": weight_diagnostics(total, departure), "hclb": hclb,
            "clips_considered": [c for c in CLIPS]}
