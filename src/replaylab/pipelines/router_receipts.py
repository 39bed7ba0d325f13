"""The router from your own receipts: a ledger in, a router and an honest go/no-go out.

`train_router_receipts(checked, replays, cfg, out_dir, embed, encoder_id)`:

1. the validated receipts ledger becomes one opening decision per session
   (`router.receipts.receipts_table`: checks, refusals, counts), split by opening
   time into train / calibration / test (the latest sessions) with an embargo;
   optional offline replays (outcomes-v1) join train and calibration openings;
2. the head learns each candidate's success from the IPS-weighted train decisions
   (weights 1 / propensity, clipped at `head.max_weight`) plus the train replays,
   Platt-calibrated on the calibration decisions and replays; the clip, teachers and
   width are chosen on calibration (`router.head_select`: the lowest DR cost per opening
   call at the step-3 operating point);
3. the threshold is chosen on CALIBRATION from logged data alone, for `router.objective`
   (router/objective.py; the incumbent is the logging policy): by default the cheapest
   point of the sweep whose doubly robust (DR) quality estimate reaches the logging
   policy's own calibration quality minus the margin (the reward model is the head,
   fitted on train);
4. TEST (the latest sessions, never seen before) judges the router as served: its
   decisions are the served graph's (`served_head`, the bytes the artifact ships;
   the entry point re-checks them through the loaded artifact). IPS, SNIPS and DR
   of its opening quality, DR of its cost per opening call and of the session cost,
   each with a session-bootstrap interval; the logging policy's own figures; and the
   paired differences learned - logging;
5. the gate judges the same objective at the served threshold (`gate`, `router.gate`):
   GO, NO-GO or NOT ENOUGH EVIDENCE (an interval straddling its line with failing
   overlap diagnostics, with the sessions and days that would decide it), read with DR
   and no clip; the OPE evidence (`ope["evidence"]`: IPS, SNIPS, DR at no clip and the
   automatic clip, ESS, the largest weight, the top 1% weight share, high-confidence
   lower bounds of the gain) says which other estimator or clip would flip it;
6. `replay_plan.jsonl`: the replays of recent openings that would teach the head most.

No simulator runs here: every figure comes from the files. Steps 2-3 (the head's fit,
its operating point and the cost model, shared with the Dask driver) are
`pipelines/router_fit.py`; steps 4-5 (the test judgement and the gate) are here.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

from replaylab.contracts import ValidationResult
from replaylab.jsonsafe import json_safe
from replaylab.pipelines.router_fit import (
    FitData,
    FittedRouter,
    decision_cost_sums,
    decision_meta,
    fit_router,
    replay_cost_sums,
    seed_spread,
    train_sample,
    unit_costs,
)
from replaylab.pipelines.router_run import ReceiptsRun, golden_inputs
from replaylab.router.config import RouterEvalConfig
from replaylab.router.gate import ope_gate as gate
from replaylab.router.metrics import default_thresholds
from replaylab.router.objective import ObjectiveConfig
from replaylab.router.ope_sums import ope_from_sums, ope_part, scored_rows, sweep_curve
from replaylab.router.pipeline_config import RouterPipelineConfig
from replaylab.router.receipts import (
    OPENING_REQUEST,
    ReceiptsError,
    ReceiptsTable,
    logging_rules,
    receipts_table,
    replay_rows,
)
from replaylab.router.replay import Label
from replaylab.router.replay_plan import replay_plan, write_replay_plan
from replaylab.router.rules import ScenarioRules
from replaylab.router.sequential import sequential_evidence
from replaylab.runtime.routing import choose_by_threshold, routing_scores


def _embeddings(table: ReceiptsTable, embed: Callable[[list[str]], np.ndarray]) -> np.ndarray:
    have = [i for i, t in enumerate(table.texts) if t is not None]
    out = None if table.embeddings is None else table.embeddings.copy()
    if have:
        e = np.asarray(embed([table.texts[i] for i in have]), dtype=np.float32)
        if out is None:
            out = np.full((len(table.texts), e.shape[1]), np.nan, dtype=np.float32)
        if out.shape[1] != e.shape[1]:
            raise ReceiptsError(f"data.ledger: prompt_embedding width {out.shape[1]} differs "
                                f"from the encoder's {e.shape[1]}")
        out[have] = e
    assert out is not None and np.isfinite(out).all()
    return out


def evaluate_test(prob: np.ndarray, choice: np.ndarray, d: pd.DataFrame, cands: tuple[str, ...],
                  unit_cost: np.ndarray, unit_session: np.ndarray, ev: RouterEvalConfig,
                  thresholds: np.ndarray | None = None, fallback: int = -1,
                  rule: str = "margin", objective_fraction: float | None = None
                  ) -> tuple[dict, pd.DataFrame | None]:
    """OPE of the served router's test choices vs the logging policy (module doc, step 4):
    the `ope` section and, with `thresholds`, the test curve (`router.ope_sums`: the Dask
    run sums the same terms per partition)."""
    k = len(cands)
    total = ope_part(scored_rows(d, prob, choice), k, unit_cost, unit_session, ev.n_boot,
                     ev.seed, ev.max_weight, thresholds, fallback % k, rule)
    ope = ope_from_sums(total, cands, len(d), ev.level, ev.level_tag, objective_fraction)
    return ope, (None if thresholds is None else sweep_curve(total, thresholds))


# the receipts headline figures over head seeds (`router_fit.seed_spread`)
SPREAD_FIGURES = {"dr_quality": lambda r: r["dr_quality"],
                  "diff_quality": lambda r: r["diff_quality"]["estimate"],
                  "diff_cost": lambda r: r["diff_cost"]["estimate"]}
SPREAD_WHAT = ("the head refitted with each seed on the same sessions and split; threshold "
               "chosen again on calibration")


def spread_row(seed: int, point: dict, ope: dict, objective: ObjectiveConfig) -> dict:
    """One head seed's headline figures for `seed_spread`."""
    g = gate(ope, objective, 1.0)
    return {"seed": seed, "threshold": point["threshold"], "dr_quality": ope["dr"]["estimate"],
            "diff_quality": ope["diff"]["quality"], "diff_cost": ope["diff"]["cost"],
            "go": g["go"], "verdict": g["verdict"]}


def receipts_summary(*, cands: tuple[str, ...], report: dict, rep_report: dict,
                     boundaries: dict, cfg: RouterPipelineConfig, rules: ScenarioRules,
                     fitted: FittedRouter, n_train_all: int, n_labels: dict, ope: dict,
                     verdict: dict, spread: dict, unit_cost: np.ndarray, plan_rows: int,
                     artifacts: dict, timings: dict) -> dict:
    """The receipts run's summary.json (both compute modes)."""
    deployed, head, point = fitted.deployed, fitted.head, fitted.point
    return json_safe({
        "pipeline": "router", "mode": "receipts", "candidates": list(cands),
        "receipts": report, "replays": rep_report, "splits": boundaries,
        "exploration": {"rate": float(report["exploration"]["explored_share"]),
                        "cap": float(cfg.exploration.cap),
                        "sessions": int(report["sessions"]),
                        "explored_sessions": int(report["exploration"]["explored_sessions"])},
        "logging_policy": {**report["logging_policy"], "rules": rules.describe()},
        "labels": {"train": {"decisions": int(n_labels["train"]),
                             "decisions_available": int(n_train_all),
                             "max_train_decisions": cfg.receipts.max_train_decisions,
                             "replays": int(n_labels["train_replays"])},
                   "calibration": {"decisions": int(n_labels["calibration"]),
                                   "decisions_available": int(n_labels.get(
                                       "calibration_available", n_labels["calibration"])),
                                   "max_calibration_decisions":
                                       cfg.receipts.max_calibration_decisions,
                                   "replays": int(n_labels["calibration_replays"])},
                   "ips_clip": fitted.config.max_weight},
        "head": deployed.report() if hasattr(deployed, "report") else head.report(),
        "head_selection": fitted.selection,
        "operating_point": {k2: v for k2, v in point.items() if k2 != "curve"}
        | {"rule": fitted.rule, "fallback_candidate": cands[fitted.fallback],
           "chosen_on": "calibration sessions (DR): "
                        + cfg.objective.label("logging policy")},
        "ope": ope, **verdict, "spread": spread,
        "test": {"learned": {"quality": ope["dr"]["estimate"], "cost": ope["cost"]["estimate"]},
                 "logging": {"quality": ope["logging"]["quality"]["estimate"],
                             "cost": ope["logging"]["cost"]["estimate"]}},
        "cost_model": {"unit_cost_usd": dict(zip(cands, unit_cost.tolist(), strict=True)),
                       "what": "per-candidate mean cost of the train calls (the DR cost model)"},
        "replay_plan": {"rows": int(plan_rows), "budget": cfg.replay_plan.budget,
                        "splits": list(cfg.replay_plan.splits), "path": artifacts["replay_plan"],
                        "ranking": "p(1-p) of the served head x exp(-|routing score - "
                                   "threshold| / 0.1) over unobserved (prompt, candidate)"},
        "artifacts": artifacts,
        "timings_s": {k2: round(v, 3) for k2, v in timings.items()},
    })


def train_router_receipts(checked: ValidationResult, replays: pd.DataFrame | None,
                          cfg: RouterPipelineConfig, out_dir: Path,
                          embed: Callable[[list[str]], np.ndarray], encoder_id: str,
                          progress: Callable[[str], None] | None = None,
                          head_scorer: str = "onnx") -> tuple[dict, ReceiptsRun]:
    """Train on a receipts ledger, judge on its latest sessions, gate (module docstring).

    checked: `read_ledger` / `validate_ledger` of the receipts file; replays: an outcomes-v1
    frame or None; embed: texts -> (n, d) float32 embeddings (the serving encoder);
    encoder_id: that encoder's id (a ledger's `prompt_embedding` is used only when its
    `embedding_model` is this). Raises ReceiptsError when the ledger cannot be used.
    Writes router_decisions_test.parquet, router_curves_test.parquet, router_labels.parquet
    and replay_plan.jsonl into out_dir; returns (summary, run)."""
    say = progress or (lambda _msg: None)
    out_dir.mkdir(parents=True, exist_ok=True)
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    table = receipts_table(checked, cfg.candidates, cfg.receipts,
                           cap=float(cfg.exploration.cap), encoder_id=encoder_id)
    cands, k, d = table.candidates, len(table.candidates), table.decisions
    rep, rep_report = replay_rows(replays, table, cfg.cost)
    timings["receipts"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    say(f"embedding {len(d)} opening prompts")
    E_all = _embeddings(table, embed)
    timings["embed"] = time.perf_counter() - t0

    masks = {s: table.split(s) for s in ("train", "calibration", "test")}
    for s, m in masks.items():
        if not m.any():
            raise ReceiptsError(f"data.ledger: no usable opening decision in the {s} split")
    idx = {s: np.flatnonzero(m) for s, m in masks.items()}
    n_train_all, cap = len(idx["train"]), cfg.receipts.max_train_decisions
    n_cal_all = len(idx["calibration"])
    unit_cost, unit_session = unit_costs(  # every train call
        decision_cost_sums(d.iloc[idx["train"]], k) + replay_cost_sums(rep, k))
    keep = train_sample(d[Label.SESSION_ID].to_numpy()[idx["train"]], cap, cfg.seed)
    if not keep.all():  # ReceiptsConfig.max_train_decisions: their replays go with them
        rep = rep[~rep["row"].isin(idx["train"][~keep])]
        idx["train"] = idx["train"][keep]
    keep = train_sample(d[Label.SESSION_ID].to_numpy()[idx["calibration"]],
                        cfg.receipts.max_calibration_decisions, cfg.seed + 1)
    if not keep.all():  # ReceiptsConfig.max_calibration_decisions (the same way)
        rep = rep[~rep["row"].isin(idx["calibration"][~keep])]
        idx["calibration"] = idx["calibration"][keep]
    data = FitData({s: d.iloc[idx[s]] for s in ("train", "calibration")},
                   {s: E_all[idx[s]] for s in ("train", "calibration")},
                   rep[rep["split"].isin(["train", "calibration"])])
    ev = RouterEvalConfig(n_boot=cfg.receipts.n_boot, level=cfg.receipts.level,
                          n_thresholds=cfg.evaluation.n_thresholds, seed=cfg.seed)
    te_d, E_te = d.iloc[idx["test"]], E_all[idx["test"]]
    meta_te = decision_meta(te_d)
    rule = cfg.policy.rule

    t0 = time.perf_counter()
    say("training the head")
    fitted = fit_router(data, cfg, unit_cost, cands, head_scorer, say)
    head, deployed, point, fallback = fitted.head, fitted.deployed, fitted.point, fitted.fallback
    timings["head"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    say("the threshold chosen on calibration (DR, logged data only)")
    prob_te = deployed.predict_proba(E_te, meta_te)
    choice_te = choose_by_threshold(prob_te, point["threshold"], fallback=fallback, rule=rule)
    say("off-policy evaluation on the test sessions")
    # the test curve's thresholds: quantiles of the test routing scores (both ends open)
    ts = default_thresholds(routing_scores(prob_te, rule), ev.n_thresholds)
    fraction = (cfg.objective.fraction_of_strong if cfg.objective.kind == "quality_floor"
                else None)
    ope, curve = evaluate_test(prob_te, choice_te, te_d, cands, unit_cost, unit_session, ev,
                               ts, fallback, rule, fraction)
    # router.sequential: the gate re-run on a growing ledger reads this look's intervals
    ope = sequential_evidence(
        ope, (choice_te == te_d["action"].to_numpy()) / te_d[Label.PROPENSITY].to_numpy(float),
        te_d[Label.REWARD].to_numpy(float), te_d[Label.COST].to_numpy(float),
        te_d["opening_ms"].to_numpy(), cfg.sequential)
    timings["ope"] = time.perf_counter() - t0
    t0 = time.perf_counter()

    def spread_at(seed: int) -> dict:
        dep_j, point_j, fallback_j = fitted.refit(seed)
        prob_j = dep_j.predict_proba(E_te, meta_te)
        choice_j = choose_by_threshold(prob_j, point_j["threshold"], fallback=fallback_j, rule=rule)
        ope_j, _ = evaluate_test(prob_j, choice_j, te_d, cands, unit_cost, unit_session, ev,
                                 fallback=fallback_j, rule=rule, objective_fraction=fraction)
        return spread_row(seed, point_j, ope_j, cfg.objective)

    spread = seed_spread(spread_row(cfg.seed, point, ope, cfg.objective), cfg.seed,
                         cfg.spread_seeds, spread_at, SPREAD_FIGURES, SPREAD_WHAT, say)
    timings["spread"] = time.perf_counter() - t0
    verdict = gate(ope, cfg.objective, float(cfg.go.sessions_per_day),
                  test_share=float(cfg.receipts.test_share))

    curve.to_parquet(out_dir / "router_curves_test.parquet", index=False)
    point["curve"].assign(policy="learned").to_parquet(
        out_dir / "router_curves_calibration.parquet", index=False)

    decisions = test_decisions(te_d, cands, prob_te, choice_te)
    decisions.to_parquet(out_dir / "router_decisions_test.parquet", index=False)
    labels = d.drop(columns=[c for c in ("prompt_text", "prompt_embedding") if c in d.columns])
    if len(rep):  # ids, labels, metadata: no text, no embeddings
        labels = pd.concat([labels, replay_labels(rep)], ignore_index=True, sort=False)
    labels.to_parquet(out_dir / "router_labels.parquet", index=False)

    plan_rows = np.flatnonzero(d["split"].isin(cfg.replay_plan.splits).to_numpy())
    plan = replay_plan(deployed.predict_proba(E_all[plan_rows], decision_meta(d.iloc[plan_rows])),
                       d["action"].to_numpy()[plan_rows], point["threshold"], rule,
                       plan_meta(d.iloc[plan_rows]), cands, cfg.replay_plan.budget)
    plan_path = write_replay_plan(plan, out_dir / "replay_plan.jsonl")

    rules_doc = logging_rules(table)
    rules = ScenarioRules.from_choices(cands, rules_doc["task_candidate"],
                                       rules_doc["default_candidate"], rules_doc["note"],
                                       rules_doc["fitted_on"], cfg.rules)
    summary = receipts_summary(
        cands=cands, report=table.report, rep_report=rep_report, boundaries=table.boundaries,
        cfg=cfg, rules=rules, fitted=fitted, n_train_all=n_train_all,
        n_labels={"train": len(idx["train"]), "calibration": len(idx["calibration"]),
                  "calibration_available": n_cal_all,
                  "train_replays": int((rep["split"] == "train").sum()),
                  "calibration_replays": int((rep["split"] == "calibration").sum())},
        ope=ope, verdict=verdict, spread=spread, unit_cost=unit_cost, plan_rows=len(plan),
        artifacts={"curves": str(out_dir / "router_curves_test.parquet"),
                   "labels": str(out_dir / "router_labels.parquet"),
                   "test_decisions": str(out_dir / "router_decisions_test.parquet"),
                   "replay_plan": str(plan_path)},
        timings=timings)
    run = ReceiptsRun(config=dataclasses.replace(cfg, head=fitted.config), candidates=cands,
                      head=head, threshold=float(point["threshold"]), rules=rules,
                      summary=summary, rule=rule, fallback=int(fallback),
                      deployed=deployed if hasattr(deployed, "served_") else None,
                      golden_inputs=golden_inputs([table.texts[i] for i in idx["test"]],
                                                  te_d["category"].to_numpy(dtype=object),
                                                  te_d["prompt_tokens"].to_numpy(float)),
                      rules_equal=None,
                      test_choice=choice_te, test_embeddings=E_te, test_meta=meta_te,
                      test_texts=[table.texts[i] for i in idx["test"]],
                      test_sessions=te_d[Label.SESSION_ID].astype(str).to_numpy())
    return summary, run


def test_decisions(te_d: pd.DataFrame, cands: tuple[str, ...], prob: np.ndarray,
                   choice: np.ndarray) -> pd.DataFrame:
    """router_decisions_test rows: ids, the logged choice and propensity, the served
    choice and its P(success) per candidate (per partition under Dask)."""
    out = pd.DataFrame({"prompt_id": te_d[OPENING_REQUEST].to_numpy(),
                        "session_id": te_d[Label.SESSION_ID].to_numpy(),
                        "logged": te_d[Label.CANDIDATE].to_numpy(),
                        "propensity": te_d[Label.PROPENSITY].to_numpy(float),
                        "candidate": np.asarray(cands, dtype=object)[choice]})
    for j, c in enumerate(cands):
        out[f"p_{c}"] = prob[:, j]
    return out


def replay_labels(rep: pd.DataFrame) -> pd.DataFrame:
    """Replay rows as router_labels rows (their opening request id is the context key)."""
    return rep.assign(**{OPENING_REQUEST: rep[Label.CONTEXT_KEY]})


def plan_meta(d: pd.DataFrame) -> pd.DataFrame:
    """The ids `replay_plan` ranks openings by."""
    return pd.DataFrame({"prompt_id": d[OPENING_REQUEST].to_numpy(),
                         "session_id": d[Label.SESSION_ID].to_numpy(),
                         "opening_ms": d["opening_ms"].to_numpy()})
