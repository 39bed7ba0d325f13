"""The router's fit, both modes: the head choice, its served graph, its seed spread.

One head choice (`choose_head`): every candidate head of `router.head_select` fitted on
train (`fit_head`: fitted, calibrated on calibration, served as its graph `served_head`),
ranked by its operating point on CALIBRATION (`fit_router`, called by the receipts
pipeline, which the outcomes mode runs too): DR on the logged calibration decisions
(`operating_point`, `choose_threshold`: by default the cheapest whose DR quality reaches
the incumbent's minus the margin), read as a `CalibrationView` says (receipts mode: the
head's model, against the logging policy; outcomes mode: a fully replayed split at its
observed values, against `go.baseline`'s rules). One seed spread (`seed_spread`): the chosen
head refitted with other seeds, each mode's headline figures over them. The receipts
cost model from additive sums of the train calls (`decision_cost_sums`,
`replay_cost_sums`, `unit_costs`) and the seeded hashed session samples that bound the
fits (`session_uniform`, `train_sample`): every engine calls the same functions on the
same rows.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from replaylab.artifacts.router_head import served_head
from replaylab.compute.ops import hash_uniform, key_hash
from replaylab.router.head import HeadConfig, SuccessHead
from replaylab.router.head_select import select_head
from replaylab.router.inputs import TrainingRows, ips_weights
from replaylab.router.metrics import default_thresholds
from replaylab.router.objective import ObjectiveConfig
from replaylab.router.ope import LoggedDecisions, point_values
from replaylab.router.pipeline_config import RouterPipelineConfig
from replaylab.router.receipts import OPENING_REQUEST
from replaylab.router.replay import Label
from replaylab.runtime.routing import choose_by_threshold, routing_scores


def decision_meta(d: pd.DataFrame) -> dict[str, np.ndarray]:
    return {"category": d["category"].to_numpy(dtype=object),
            "prompt_tokens": d["prompt_tokens"].to_numpy(float)}


def _rows(dec: pd.DataFrame, rep: pd.DataFrame, local: pd.Series,
          max_weight: float | None) -> TrainingRows:
    """Decisions (IPS weights) + replays (weight 1) of one split, rows local to it."""
    prop = np.concatenate([dec[Label.PROPENSITY].to_numpy(float), np.full(len(rep), np.nan)])
    return TrainingRows(
        row=np.concatenate([local.reindex(dec.index).to_numpy(np.int64),
                            local.reindex(rep["row"]).to_numpy(np.int64)]),
        action=np.concatenate([dec["action"].to_numpy(np.int64), rep["action"].to_numpy(np.int64)]),
        reward=np.concatenate([dec[Label.REWARD].to_numpy(float), rep[Label.REWARD].to_numpy(float)]),
        weight=ips_weights(prop, max_weight),
        cost=np.concatenate([pd.to_numeric(dec[Label.COST], errors="coerce").to_numpy(float),
                             rep[Label.COST].to_numpy(float)]))


def _logged(d: pd.DataFrame, candidates: tuple[str, ...], reward: str) -> LoggedDecisions:
    r = pd.to_numeric(d[reward], errors="coerce").to_numpy(float)
    return LoggedDecisions(candidates, d["action"].to_numpy(np.int64), r,
                           d[Label.PROPENSITY].to_numpy(float),
                           pd.factorize(d[Label.SESSION_ID])[0],
                           d[OPENING_REQUEST].to_numpy())


def _strongest(b: LoggedDecisions, q: np.ndarray, cost: np.ndarray) -> int:
    """Column whose constant policy has the best DR quality (ties: the cheaper)."""
    k = q.shape[1]
    const = np.repeat(np.arange(k)[:, None], b.n, axis=1)  # (K, n)
    v = point_values(b, const, q)["dr"]
    return int(np.lexsort((np.arange(k), cost, -np.round(v, 12)))[0])


def choose_threshold(prob: np.ndarray, b_q: LoggedDecisions, b_c: LoggedDecisions,
                     q_quality: np.ndarray, q_cost: np.ndarray, target: float | None, rule: str,
                     fallback: int, n_thresholds: int, budget: float | None = None) -> dict:
    """The cheapest threshold whose DR quality on these logged rows reaches `target`, or
    (`budget` set, `target` None) the best DR quality whose DR cost is within `budget`.

    prob: (n, K) the served head on the rows (its routing scores); b_q, b_c: the same rows'
    logged quality and cost; q_quality, q_cost: (n, K) the DR reward and cost models
    (`observed_values`). Ties go to the higher quality (the lower cost
    under a budget); when no point qualifies, the point of best DR quality (the cheapest
    under a budget), `met` False."""
    t = default_thresholds(routing_scores(prob, rule), n_thresholds)
    choice = np.stack([choose_by_threshold(prob, float(x), fallback=fallback, rule=rule) for x in t])
    quality = point_values(b_q, choice, q_quality)["dr"]
    cost = point_values(b_c, choice, q_cost)["dr"]
    if budget is None:
        ok = quality >= float(target) - 1e-12
        order = np.lexsort((-quality, cost))  # cheapest, then better
        unmet = np.lexsort((cost, -quality))  # best quality, then cheaper
    else:
        ok = cost <= float(budget) + 1e-15
        order = np.lexsort((cost, -quality))  # better, then cheaper
        unmet = np.lexsort((-quality, cost))  # cheapest
    best = int(order[ok[order]][0]) if ok.any() else int(unmet[0])
    return {"threshold": float(t[best]), "met": bool(ok.any()),
            "target_quality": None if target is None else float(target),
            "cost_budget": None if budget is None else float(budget),
            "dr_quality": float(quality[best]), "dr_cost": float(cost[best]),
            "curve": pd.DataFrame({"threshold": t, "dr_quality": quality, "dr_cost": cost,
                                   "strong_share": (choice == fallback).mean(axis=1)})}


def fit_head(hc: HeadConfig, seed: int, E: dict, meta: dict, rows: dict, k: int,
             head_scorer: str, pool: dict | None = None) -> tuple[SuccessHead, Any]:
    """The head fitted on train, calibrated on calibration, as the runtime serves it: its
    graph (`artifacts.router_head.served_head`, or for the static tier the numpy forward pass of
    `head_scorer="numpy"`), so every learned decision a run reports is the served one; an
    isotonic head has no graph and scores in torch. E, meta, rows: {"train",
    "calibration"} -> embeddings, metadata, TrainingRows. pool: the head selection's
    `teacher_cache` (`SuccessHead.fit`), whose fits reuse a teacher (the same head)."""
    head = SuccessHead(hc, seed=seed).fit(E["train"], meta["train"], rows["train"], k,
                                          teacher_cache=pool)
    head.calibrate(E["calibration"], meta["calibration"], rows["calibration"])
    if hc.calibration == "isotonic":
        return head, head
    n = min(256, len(E["calibration"]))
    deployed = served_head(head, threads=hc.num_threads,
                           parity_embedding=E["calibration"][:n],
                           parity_meta={key: v[:n] for key, v in meta["calibration"].items()},
                           scorer=head_scorer)
    return head, deployed


def session_uniform(session: np.ndarray | pd.Series, seed: int) -> np.ndarray:
    """(n,) uniform [0, 1) per session id, a function of (id, seed) only: the key of the
    hashed samples (`train_sample`; the receipts pipeline thresholds the same values)."""
    if not len(session):
        return np.zeros(0)
    return hash_uniform(key_hash(np.asarray(session, dtype=object)), int(seed))


def train_sample(session: np.ndarray | pd.Series, cap: int | None, seed: int) -> np.ndarray:
    """(n,) bool: the train decisions the head's fits use. All of them when n <= cap (or no
    cap), else the `cap` sessions with the smallest `session_uniform`: a uniform sample
    that does not depend on row order or partitioning: the receipts pipeline keeps the rows
    whose value is at most the cap-th smallest (`compute.ops.order_statistics`), on either
    engine."""
    n = len(session)
    if cap is None or n <= cap:
        return np.ones(n, dtype=bool)
    u = session_uniform(session, seed)
    keep = np.zeros(n, dtype=bool)
    keep[np.argsort(u, kind="stable")[:cap]] = True
    return keep


@dataclass
class FitData:
    """What the head's fits read (the driver's, bounded): `decisions` {"train",
    "calibration"}: decision frames whose index is the row id `replays["row"]` refers to;
    `E`: their embeddings (rows aligned); `replays`: replay label rows of those splits
    (`receipts.replay_rows`' columns)."""

    decisions: dict[str, pd.DataFrame]
    E: dict[str, np.ndarray]
    replays: pd.DataFrame

    @property
    def meta(self) -> dict[str, dict[str, np.ndarray]]:
        return {s: decision_meta(d) for s, d in self.decisions.items()}

    def with_train(self, keep: np.ndarray) -> FitData:
        """Only the train decisions `keep` (bool, row-aligned) and the replays of their
        openings; calibration as it is (the outcomes mode's learning curve)."""
        tr = self.decisions["train"]
        sub = tr[keep]
        rep = self.replays
        if len(rep):
            rep = rep[(rep["split"] != "train") | rep["row"].isin(sub.index)]
        return FitData({**self.decisions, "train": sub},
                       {**self.E, "train": self.E["train"][keep]}, rep.reset_index(drop=True))


@dataclass(frozen=True)
class CalibrationView:
    """How the operating point reads CALIBRATION (`operating_point`). incumbent: (name,
    calibration quality) of the policy the objective's threshold is set against; None:
    the logging policy, its mean logged reward (receipts mode). observed: the calibration
    openings are fully replayed (the outcomes mode), so DR's models are the observed values
    (`observed_values`); False: the head's P(success) and the unit costs (a user's partial
    calibration replays train the Platt calibration only)."""

    incumbent: tuple[str, float] | None = None
    observed: bool = False


@dataclass
class FittedRouter:
    """The chosen head, its served graph and operating point (chosen on calibration)."""

    head: SuccessHead
    deployed: Any
    config: HeadConfig
    point: dict
    fallback: int
    selection: dict
    data: FitData
    candidates: tuple[str, ...]
    unit_cost: np.ndarray
    rule: str
    n_thresholds: int
    head_scorer: str
    objective: ObjectiveConfig = dataclasses.field(default_factory=ObjectiveConfig)
    view: CalibrationView = dataclasses.field(default_factory=CalibrationView)

    def rows_for(self, max_weight: float | None) -> dict:
        local = {s: pd.Series(np.arange(len(d)), index=d.index)
                 for s, d in self.data.decisions.items()}
        rep = self.data.replays
        return {s: _rows(self.data.decisions[s], rep[rep["split"] == s], local[s], max_weight)
                for s in ("train", "calibration")}

    def refit(self, seed: int) -> tuple[Any, dict, int]:
        """The same head configuration fitted with another seed: (served graph, its
        operating point on calibration, fallback column)."""
        _, dep = fit_head(self.config, seed, self.data.E, self.data.meta,
                          self.rows_for(self.config.max_weight), len(self.candidates),
                          self.head_scorer)
        point, fallback, _ = operating_point(dep, self.data, self.candidates, self.unit_cost,
                                             self.rule, self.n_thresholds, self.objective,
                                             self.view)
        return dep, point, fallback


def observed_values(data: FitData, split: str, prob: np.ndarray, unit_cost: np.ndarray
                    ) -> tuple[np.ndarray, np.ndarray]:
    """(n, K) reward and cost models of a split's decisions for DR: the head's P(success)
    and the per-candidate unit cost, replaced by what was observed where it was: each
    replayed (opening, candidate) pair's outcome and cost, and, on an opening whose every
    candidate was observed (its logged decision plus replays of all the others), the
    logged call's too. DR then equals the observed value on a fully replayed opening (what
    a full-information calibration split gives) and stays unbiased elsewhere: a replayed
    outcome is a function of the prompt, not of the logging draw, and the logged action's
    model is the head's unless every candidate is known."""
    d = data.decisions[split]
    q = np.array(prob, dtype=float, copy=True)
    c = np.repeat(np.asarray(unit_cost, float)[None, :], len(d), axis=0)
    rep = data.replays
    rep = rep[rep["split"] == split] if len(rep) else rep
    if not len(rep) or not len(d):
        return q, c
    at = pd.Series(np.arange(len(d)), index=d.index).reindex(rep["row"]).to_numpy(np.int64)
    a = rep["action"].to_numpy(np.int64)
    q[at, a] = rep[Label.REWARD].to_numpy(float)
    rc = rep[Label.COST].to_numpy(float)
    ok = np.isfinite(rc)
    c[at[ok], a[ok]] = rc[ok]
    k = q.shape[1]
    seen = np.zeros(q.shape, dtype=bool)
    seen[at, a] = True
    logged = d["action"].to_numpy(np.int64)
    seen[np.arange(len(d)), logged] = True
    full = np.flatnonzero(seen.sum(axis=1) == k)
    q[full, logged[full]] = pd.to_numeric(d[Label.REWARD], errors="coerce").to_numpy(float)[full]
    lc = pd.to_numeric(d[Label.COST], errors="coerce").to_numpy(float)[full]
    ok = np.isfinite(lc)
    c[full[ok], logged[full][ok]] = lc[ok]
    return q, c


def operating_point(dep: Any, data: FitData, cands: tuple[str, ...], unit_cost: np.ndarray,
                    rule: str, n_thresholds: int,
                    objective: ObjectiveConfig | None = None,
                    view: CalibrationView | None = None) -> tuple[dict, int, np.ndarray]:
    """The served head's threshold on CALIBRATION for `router.objective` (`choose_threshold`,
    DR read as `view` says: the incumbent is the logging policy, its calibration quality
    the mean logged reward, unless the view names another, e.g. the outcomes mode's rules,
    known on its fully replayed calibration split; strong-only is the DR value of the
    strongest constant policy), its fallback column and its calibration probabilities."""
    objective = objective or ObjectiveConfig()
    view = view or CalibrationView()
    ca_d = data.decisions["calibration"]
    prob_ca = dep.predict_proba(data.E["calibration"], decision_meta(ca_d))
    if view.observed:
        q_model, c_model = observed_values(data, "calibration", prob_ca, unit_cost)
    else:
        q_model, c_model = prob_ca, np.repeat(unit_cost[None, :], len(ca_d), axis=0)
    b_q, b_c = _logged(ca_d, cands, Label.REWARD), _logged(ca_d, cands, Label.COST)
    fallback = _strongest(b_q, q_model, unit_cost)
    name, incumbent_q = view.incumbent or ("logging policy", float(b_q.reward.mean()))
    strong_q = float(point_values(b_q, np.full((1, b_q.n), fallback), q_model)["dr"][0])
    target = objective.quality_floor(incumbent_q, strong_q)
    point = choose_threshold(prob_ca, b_q, b_c, q_model, c_model, target, rule, fallback,
                             n_thresholds,
                             budget=objective.cost_per_call if target is None else None)
    point["logging_quality"] = float(b_q.reward.mean())
    point["incumbent"], point["incumbent_quality"] = name, incumbent_q
    point["strong_only_dr_quality"] = strong_q
    point["objective"] = objective.label(name)
    return point, fallback, prob_ca


@dataclass
class ChosenHead:
    """`choose_head`'s result: the chosen head configuration, the head, its served graph,
    the mode's operating point for it, and the summary's `head_selection`."""

    config: HeadConfig
    head: SuccessHead
    deployed: Any
    point: Any
    selection: dict


def choose_head(cfg: RouterPipelineConfig, E: dict, meta: dict,
                rows_for: Callable[[float | None], dict], k: int, head_scorer: str,
                operating_point_of: Callable[[Any], tuple[bool, float, dict, Any]],
                criterion: str, say: Callable[[str], None]) -> ChosenHead:
    """THE head choice of both modes (`router.head_select`, router/head_select.py): each
    candidate head fitted on train with its clip's rows (`rows_for(max_weight)` ->
    {"train", "calibration"} TrainingRows), calibrated, scored as served (`fit_head`) on
    CALIBRATION only; `operating_point_of(served graph)` -> (met, criterion value, figures,
    point) is the mode's reading of it (`criterion` names it). The test split is not an
    argument."""
    pool, rows_by_clip = {}, {}

    def evaluate(hc: HeadConfig) -> tuple[bool, float, dict, Any]:
        if cfg.head_select.enabled:
            say(f"head candidate: max_weight {hc.max_weight}, teachers {hc.teachers}, "
                f"hidden {list(hc.hidden)}")
        if hc.max_weight not in rows_by_clip:
            rows_by_clip[hc.max_weight] = rows_for(hc.max_weight)
        head, dep = fit_head(hc, cfg.seed, E, meta, rows_by_clip[hc.max_weight], k,
                             head_scorer, pool)
        met, value, figures, point = operating_point_of(dep)
        return met, value, figures, (head, dep, point)

    trial, selection = select_head(cfg.head, cfg.head_select, evaluate, criterion)
    head, deployed, point = trial.fitted
    return ChosenHead(trial.head, head, deployed, point, selection)


def fit_router(data: FitData, cfg: RouterPipelineConfig, unit_cost: np.ndarray,
               candidates: tuple[str, ...], head_scorer: str,
               say: Callable[[str], None],
               view: CalibrationView | None = None) -> FittedRouter:
    """The head (`choose_head`) on `data` (train and calibration only), its served graph
    and DR operating point: the criterion is the DR cost per opening call there (module
    doc of router/head_select.py). view: how calibration is read (`operating_point`;
    None: the receipts mode's, against the logging policy)."""
    view = view or CalibrationView()
    holder = FittedRouter(None, None, cfg.head, {}, 0, {}, data, candidates, unit_cost,  # type: ignore[arg-type]
                          cfg.policy.rule, cfg.evaluation.n_thresholds, head_scorer,
                          cfg.objective, view)
    name = view.incumbent[0] if view.incumbent else "logging policy"

    def dr_point(dep: Any) -> tuple[bool, float, dict, Any]:
        pt, tp, pc = operating_point(dep, data, candidates, unit_cost, cfg.policy.rule,
                                     cfg.evaluation.n_thresholds, cfg.objective, view)
        figures = {"dr_cost": pt["dr_cost"], "dr_quality": pt["dr_quality"],
                   "target_quality": pt["target_quality"], "threshold": pt["threshold"]}
        by_cost = pt["met"] and cfg.objective.kind != "budget"
        return pt["met"], pt["dr_cost"] if by_cost else -pt["dr_quality"], figures, (pt, tp)

    chosen = choose_head(
        cfg, data.E, data.meta, holder.rows_for, len(candidates), head_scorer, dr_point,
        ("-DR quality" if cfg.objective.kind == "budget" else "DR cost per opening call")
        + f" at the calibration operating point of the {cfg.objective.label(name)}"
        " (a head that cannot reach it ranks last)", say)
    holder.head, holder.deployed, holder.config = chosen.head, chosen.deployed, chosen.config
    holder.point, holder.fallback = chosen.point
    holder.selection = chosen.selection
    return holder


def seed_spread(first: dict, seed: int, spread_seeds: int, row_of: Callable[[int], dict],
                figures: dict[str, Callable[[dict], float]], what: str,
                say: Callable[[str], None]) -> dict:
    """THE seed spread of both modes (`router.spread_seeds`): `first` is the served head's
    row (seed `seed`); `row_of(s)` refits the chosen head with seed s on the same rows and
    split, chooses its threshold again on calibration and returns its row, for seeds
    seed + 1 .. seed + spread_seeds - 1. Each figure (name -> how to read it off a row) is
    summarized over the seeds: values, min, max and mean of the finite ones; rows that
    carry a verdict add the `go` and `verdict` lists."""
    rows = [first]
    for j in range(1, int(spread_seeds)):
        say(f"seed-to-seed spread: head seed {seed + j}")
        rows.append(row_of(seed + j))

    def stat(get: Callable[[dict], float]) -> dict:
        v = [float(get(r)) for r in rows]
        finite = [x for x in v if np.isfinite(x)]
        return {"values": v, "min": min(finite, default=float("nan")),
                "max": max(finite, default=float("nan")),
                "mean": float(np.mean(finite)) if finite else float("nan")}

    out: dict = {"seeds": [r["seed"] for r in rows], "what": what,
                 **{name: stat(get) for name, get in figures.items()}}
    if all("verdict" in r for r in rows):
        out["go"] = [bool(r["go"]) for r in rows]
        out["verdict"] = [r["verdict"] for r in rows]
    out["rows"] = rows
    return out


def decision_cost_sums(train: pd.DataFrame, k: int) -> np.ndarray:
    """(4, K) per action: the sum and count of finite call costs, then of finite session
    costs, of train decisions (additive over partitions: the Dask run sums them)."""
    out = np.zeros((4, k))
    a = train["action"].to_numpy(np.int64)
    for row, col in ((0, Label.COST), (2, Label.SESSION_COST)):
        v = pd.to_numeric(train[col], errors="coerce").to_numpy(float)
        ok = np.isfinite(v)
        out[row] = np.bincount(a[ok], weights=v[ok], minlength=k)[:k]
        out[row + 1] = np.bincount(a[ok], minlength=k)[:k]
    return out


def replay_cost_sums(replays: pd.DataFrame, k: int) -> np.ndarray:
    """(4, K) the train replays' call costs in `decision_cost_sums`' layout (a replay is a
    call, not a session: rows 2-3 stay 0)."""
    out = np.zeros((4, k))
    tr = replays[replays["split"] == "train"]
    v = tr[Label.COST].to_numpy(float)
    a = tr["action"].to_numpy(np.int64)
    ok = np.isfinite(v)
    out[0] = np.bincount(a[ok], weights=v[ok], minlength=k)[:k]
    out[1] = np.bincount(a[ok], minlength=k)[:k]
    return out


def mean_from_sums(total: np.ndarray, count: np.ndarray) -> np.ndarray:
    """The mean per action; an action without any finite value: the overall mean (0 when
    there is none)."""
    overall = float(total.sum() / count.sum()) if count.sum() > 0 else 0.0
    return np.where(count > 0, total / np.maximum(count, 1), overall)


def unit_costs(sums: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The cost model from `decision_cost_sums` + `replay_cost_sums`: per-candidate mean cost
    of every train call (decisions and train replays), and per-candidate mean session cost
    of the train decisions."""
    return mean_from_sums(sums[0], sums[1]), mean_from_sums(sums[2], sums[3])
