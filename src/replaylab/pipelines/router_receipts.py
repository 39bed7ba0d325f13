"""The router from your own receipts: a ledger in, a router and an honest go/no-go out.

`train_router_receipts(ledger, replays, cfg, out_dir, encoder, engine=...)`, written once
on the compute engine (`replaylab.compute`: `compute=local` holds the ledger as pandas
partitions in this process, `compute=dask` on the workers; the same functions run on
each partition, `pipelines/router_partitions.py`, and the driver sums what they return):

1. read and validate the ledger per partition, the quarantine written beside the run;
   the refusals (`router.receipts.check_ledger`, `exploration_facts`,
   `representation_refusal`: one line each, exit 2 at the entry point) from partition
   sums;
2. one shuffle on session_id, then per partition the opening decision of every session
   (`router.receipts.opening_decisions`: a session's turns are in one partition), split
   by opening time into train / calibration / test (the latest sessions) with an
   embargo: the boundaries are exact order statistics of the sessions' opening times
   (`compute.ops.order_statistics`); optional offline replays (outcomes-v1) join train
   and calibration openings;
3. the opening prompts embedded per partition (`encoder.embed`, one encoder per
   process; a ledger's `prompt_embedding` of the configured encoder used as given);
4. the head learns each candidate's success from the IPS-weighted train decisions
   (weights 1 / propensity, clipped at `head.max_weight`) plus the train replays,
   Platt-calibrated on the calibration decisions and replays; the clip, teachers and
   width are chosen on calibration (`router_fit.choose_head`: the lowest DR cost per
   opening call at the operating point); the threshold is chosen on CALIBRATION from
   logged data alone, for `router.objective` (the incumbent is the logging policy): by
   default the cheapest point whose doubly robust (DR) quality reaches the logging
   policy's own calibration quality minus the margin. The fits read at most
   `receipts.max_train_decisions` / `max_calibration_decisions` sessions, the smallest
   seeded hashes of the session id (`router_fit.train_sample`), brought to the driver
   ordered by session id;
5. TEST (the latest sessions, never seen before) judges the router as served: its
   decisions are the served graph's (`served_head`, the bytes the artifact ships;
   the entry point re-checks them through the loaded artifact). IPS, SNIPS and DR of
   its opening quality, DR of its cost per opening call and of the session cost, each
   with a session-bootstrap interval (the hashed Poisson weights of `router.ope_sums`:
   every figure is a ratio of partition sums); the logging policy's own figures; the
   paired differences learned - logging; the test curve at exact quantiles of the test
   routing scores; `router.sequential` on the test rows in time order;
6. the gate judges the same objective at the served threshold (`router.gate.ope_gate`):
   GO, NO-GO or NOT ENOUGH EVIDENCE, read with DR and no clip; the OPE evidence says
   which other estimator or clip would flip it; the seed spread beside it
   (`router_fit.seed_spread`);
7. files: the test decisions and the label rows written per partition (the datasets
   `router_decisions_test.parquet/`, `router_labels.parquet/`), the curves, `replay_plan.jsonl` (the
   replays of recent openings that would teach the head most: per-partition top-k
   merged); a bounded hashed sample of test decisions (`SERVED_SAMPLE`, all of them on
   a small ledger) comes back for the exported artifact's served check.

No simulator runs here: every figure comes from the files.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from replaylab.compute import LedgerFrame, LocalEngine
from replaylab.compute.ops import exact_quantiles, kth_smallest, order_statistics
from replaylab.contracts import Ledger as L
from replaylab.contracts import ValidationResult
from replaylab.contracts.columns import Outcomes as O
from replaylab.jsonsafe import json_safe
from replaylab.pipelines.router_attribution import AttributionSkipped, attribute
from replaylab.pipelines.router_fit import (
    CalibrationView,
    FitData,
    FittedRouter,
    fit_router,
    replay_cost_sums,
    seed_spread,
    unit_costs,
)
from replaylab.pipelines.router_partitions import (
    EMB,
    SESSION_META,
    below,
    conform,
    cost_sums_part,
    decision_counts,
    decision_frame,
    decisions_part,
    emb_columns,
    embed_part,
    fit_part,
    kept_facts,
    label_part,
    ledger_facts,
    matched_part,
    plan_part,
    propensity_quarantined,
    rows_of,
    score_part,
    score_values,
    sequential_part,
    session_part,
    session_split_counts,
    split_counts,
    with_split,
    with_u,
    without_embargo,
)
from replaylab.pipelines.router_run import ReceiptsRun, golden_inputs
from replaylab.router.config import RouterEvalConfig
from replaylab.router.gate import ope_gate as gate
from replaylab.router.objective import ObjectiveConfig
from replaylab.router.ope_sums import add_ope, ope_from_sums, ope_part, scored_rows, sweep_curve
from replaylab.router.pipeline_config import RouterPipelineConfig
from replaylab.router.receipts import (
    EMBARGO,
    OPENING_REQUEST,
    SPLITS,
    ReceiptsError,
    absent_candidates,
    check_ledger,
    counts_report,
    replay_rows,
    representation_refusal,
    split_boundaries,
    split_ranks,
)
from replaylab.router.receipts_counts import (
    add_counts,
    exploration_facts,
    logging_rules_from_counts,
)
from replaylab.router.replay import Label
from replaylab.router.replay_plan import replay_plan, write_replay_plan
from replaylab.router.rules import ScenarioRules
from replaylab.router.sequential import sequential_evidence
from replaylab.runtime.routing import choose_by_threshold

STAGES = {"read": "read and validate per partition, the quarantine written beside the run",
          "decisions": "one shuffle on session_id; the opening decisions per partition",
          "split": "refusals and exact split boundaries from partition sums; split per partition",
          "embed": "opening prompts embedded per partition (one encoder per process)",
          "fit": "the head fitted on the driver on bounded hashed samples of train and calibration",
          "judge": "test decisions and OPE as partition sums (session Poisson bootstrap)",
          "attribute": "the gain split into own decisions / exploration / replays (refits of "
                       "the served head, judged as partition sums)",
          "write": "test decisions and labels written per partition; the replay plan"}
SERVED_SAMPLE = 2_000  # test decisions brought back for the exported artifact's check
# what the head's fits read of a decision (router_fit: decision_meta and the fit rows)
FIT_COLUMNS = [Label.SESSION_ID, OPENING_REQUEST, Label.CANDIDATE, "action", Label.REWARD,
               Label.COST, Label.PROPENSITY, Label.LABEL_SOURCE, Label.SESSION_COST,
               "category", "prompt_tokens", "split", "opening_ms"]


@dataclass(frozen=True)
class FunctionEncoder:
    """An embedding function as the partitions call an encoder (`embed`, `dimension`,
    `encoder_id`; `router.worker_encoder.EncoderSpec` is the picklable one a Dask worker
    loads): texts -> (n, d) float32, in this process. dimension: None until its first
    output (a function may fit itself on the texts it is given, e.g. the tests' TF-IDF:
    it is called once per partition, and the local engine holds one)."""

    fn: Callable[[list[str]], np.ndarray]
    encoder_id: str
    dimension: int | None = None

    def embed(self, texts: list[str]) -> np.ndarray:
        return np.asarray(self.fn(list(texts)), dtype=np.float32)


def as_encoder(encoder: Any, encoder_id: str | None) -> Any:
    """An EncoderSpec as it is; an embedding function wrapped with its encoder id."""
    if hasattr(encoder, "embed") and hasattr(encoder, "dimension"):
        return encoder
    if encoder_id is None:
        raise TypeError("an embedding function needs its encoder_id")
    return FunctionEncoder(encoder, str(encoder_id))


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
                        + cfg.objective.label(point.get("incumbent", "logging policy"))},
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


def train_router_receipts(ledger: LedgerFrame | ValidationResult, replays: pd.DataFrame | None,
                          cfg: RouterPipelineConfig, out_dir: Path, encoder: Any,
                          encoder_id: str | None = None,
                          progress: Callable[[str], None] | None = None,
                          head_scorer: str = "onnx", engine: Any = None,
                          view: CalibrationView | None = None, waive_support: bool = False
                          ) -> tuple[dict, ReceiptsRun]:
    """Train on a receipts ledger, judge on its latest sessions, gate (module docstring).

    ledger: `engine.read_ledger(spec)` (or a `validate_ledger` result, held by a
    LocalEngine); replays: an outcomes-v1 frame or None; encoder: the serving encoder as an
    `EncoderSpec` (what a Dask worker loads), or an embedding function texts -> (n, d)
    float32 with its `encoder_id` (a ledger's `prompt_embedding` is used only when its
    `embedding_model` is that id); engine: a `compute` engine (default: LocalEngine);
    view: how the operating point reads calibration (`router_fit.CalibrationView`; None:
    against the logging policy, as the test gate judges); waive_support: a candidate the
    ledger never selected, or too little exploration, is reported
    (`receipts.exploration.waived`) instead of refused: for a caller that judges the router
    on something else (the outcomes mode's full-information test), whose OPE then says how
    little support it has.
    Raises ReceiptsError when the ledger cannot be used. Writes the datasets (a folder of
    Parquet files, one per partition) router_decisions_test.parquet and
    router_labels.parquet (with replays.parquet, the replay label rows), router_curves_test.parquet,
    router_curves_calibration.parquet, replay_plan.jsonl and the quarantine into out_dir;
    returns (summary, run)."""
    eng = engine or LocalEngine()
    if isinstance(ledger, ValidationResult):
        ledger = eng.from_validated(ledger)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    say = progress or (lambda _m: None)
    cands = tuple(str(c) for c in cfg.candidates)
    k, rc, where = len(cands), cfg.receipts, "data.ledger"
    enc = as_encoder(encoder, encoder_id)

    with eng.stages(STAGES, progress) as stages:
        with stages("read"):  # 1. the ledger's refusals (router.receipts.check_ledger)
            acc = ledger.summary()
            bad_prop = sum(eng.each(propensity_quarantined, _quarantine(eng, ledger))) \
                if acc["rows_quarantined"] else 0
            valid = ledger.valid
            facts = eng.each(ledger_facts, valid) if acc["rows_valid"] else []
            check_ledger(cands, bad_prop, acc, sum(f["routing_source"] for f in facts), where)
            # support refusals: raised in order, or reported when the caller waives them
            waived = [r for r in [absent_candidates(
                cands, set().union(*[f["models"] for f in facts]), where)] if r]
            if waived and not waive_support:
                raise ReceiptsError(waived[0])
            q_path = ledger.write_quarantine(out_dir / "quarantine")

        with stages("decisions"):  # 2. sessions whole after one shuffle
            shuffled = eng.persist(eng.shuffle_by(valid, L.SESSION_ID))
            sessions = eng.persist(eng.map(session_part, shuffled, meta=SESSION_META))
            dec = eng.persist(eng.map(decision_frame, shuffled, cands,
                                      meta=conform(pd.DataFrame())))
            counts: dict = {}
            expl: dict = {}
            rep_c: dict = {}
            for g in eng.each(decision_counts, shuffled, cands, enc.encoder_id):
                counts = add_counts(counts, g["counts"])
                expl = add_counts(expl, g["exploration"])
                rep_c = add_counts(rep_c, g["representation"])

        with stages("split"):  # refusals, boundaries, split
            n_sessions = int(counts.get("sessions", 0))
            report: dict = {"rows_read": acc["rows_read"], "rows_valid": acc["rows_valid"],
                            "rows_quarantined": acc["rows_quarantined"],
                            "quarantine_by_reason": acc.get("quarantine_by_reason", {}),
                            **counts_report({"other_models": {}, **counts})}
            facts_x, errors, short = exploration_facts(
                {"explored": 0, "own_propensity": {}, "explored_by_candidate": {},
                 "randomized_by_candidate": {}, **expl}, cands, float(cfg.exploration.cap),
                int(rc.min_explored_per_candidate), n_sessions)
            report["exploration"] = facts_x
            if errors:
                raise ReceiptsError(f"{where}: {errors[0]}")
            if short and not waive_support:
                raise ReceiptsError(f"{where}: {short}")
            waived += [f"{where}: {short}"] if short else []
            if waived:
                facts_x["waived"] = waived
                say(f"support refusals waived: {'; '.join(waived)}")
            refusal = representation_refusal(rep_c, enc.encoder_id, where)
            if refusal:
                raise ReceiptsError(refusal)
            widths = sorted(int(w) for w in rep_c.get("widths", {}))
            if widths and enc.dimension is not None and widths[0] != enc.dimension:
                raise ReceiptsError(f"{where}: prompt_embedding width {widths[0]} differs from "
                                    f"the encoder's {enc.dimension}")
            k_cal, k_test = split_ranks(n_sessions, rc)
            t_first, t_cal, t_test, t_last = (int(v) for v in order_statistics(
                eng, sessions, "opening_ms", [0, k_cal, k_test, n_sessions - 1]))
            emb_ms = int(rc.embargo_ms)
            per_split: dict = {}
            for c in eng.each(session_split_counts, sessions, t_cal, t_test, emb_ms):
                per_split = add_counts(per_split, c)
            boundaries = split_boundaries(t_first, t_cal, t_test, t_last, emb_ms, per_split)
            dec_split = eng.persist(eng.map(with_split, dec, t_cal, t_test, emb_ms,
                                            meta=conform(pd.DataFrame())))
            dsc: dict = {}
            for c in eng.each(split_counts, dec_split):
                dsc = add_counts(dsc, c)
            report["decisions"] = {s: int(dsc.get(s, 0)) for s in (*SPLITS, EMBARGO)}
            for s in SPLITS:
                if not report["decisions"][s]:
                    raise ReceiptsError(f"{where}: no usable opening decision in the {s} split")
            kept = eng.persist(eng.map(without_embargo, dec_split, meta=conform(pd.DataFrame())))
            kf = eng.each(kept_facts, kept)
            n_text = sum(f["text"] for f in kf)
            n_kept = int(sum(report["decisions"][s] for s in SPLITS))
            report["representation"] = {"prompt_text": n_text, "prompt_embedding": n_kept - n_text,
                                        "encoder_id": enc.encoder_id}
            report["logging_policy"] = _policy_total([f["policy"] for f in kf])
            rules_doc = logging_rules_from_counts(
                pd.concat([f["rules"] for f in kf], ignore_index=True), cands)

        with stages("embed"):  # 3. embeddings per partition
            if enc.dimension is None:  # an embedding function: its width from its output
                emb = eng.persist(eng.map(embed_part, kept, enc))
                enc = dataclasses.replace(enc, dimension=sum(
                    c.startswith(EMB) for c in eng.columns(emb)))
                meta_e = embed_part(conform(pd.DataFrame()), enc)
            else:
                meta_e = embed_part(conform(pd.DataFrame()), enc)
                emb = eng.persist(eng.map(embed_part, kept, enc, meta=meta_e))

        with stages("fit"):  # 4. the fits on the driver
            sums = eng.each_sum(cost_sums_part, emb, k)
            rep, rep_report, matched = _replays(eng, replays, kept, cands, cfg)
            if len(rep):
                sums = sums + replay_cost_sums(rep, k)
            unit_cost, unit_session = unit_costs(sums)
            n_avail = {"train": report["decisions"]["train"],
                       "calibration": report["decisions"]["calibration"]}
            cols = emb_columns(enc.dimension)
            frames, E_fit = {}, {}
            for s, cap, salt in (("train", rc.max_train_decisions, cfg.seed),
                                 ("calibration", rc.max_calibration_decisions, cfg.seed + 1)):
                rows = eng.map(rows_of, emb, (s,), [*FIT_COLUMNS, *cols],
                               meta=meta_e[[*FIT_COLUMNS, *cols]])
                if cap is not None and n_avail[s] > cap:
                    u = eng.persist(eng.map(with_u, rows, salt,
                                            meta=meta_e[[*FIT_COLUMNS, *cols]].assign(u=0.0)))
                    thr = kth_smallest(eng, u, "u", n_avail[s], int(cap))
                    rows = eng.map(below, u, "u", thr, meta=meta_e[[*FIT_COLUMNS, *cols]])
                frames[s], E_fit[s] = gather_fit_rows(eng, rows, cols)
            n_tr = len(frames["train"])
            frames["train"].index = pd.RangeIndex(n_tr)
            frames["calibration"].index = pd.RangeIndex(n_tr, n_tr + len(frames["calibration"]))
            rep_fit = _replays_for_fit(rep, matched, frames)
            fitted = fit_router(FitData(frames, E_fit, rep_fit), cfg, unit_cost, cands,
                                head_scorer, say, view)
            point, fallback, rule = fitted.point, fitted.fallback, fitted.rule

        with stages("judge"):  # 5-6. test decisions and OPE as partition sums; the gate
            n_boot, level = int(rc.n_boot), float(rc.level)
            tag = RouterEvalConfig(level=level).level_tag
            plan_splits = tuple(cfg.replay_plan.splits)
            meta_s = score_part(meta_e, _portable(fitted.deployed), 0.0, 0, rule, k,
                                enc.dimension, ("test",))
            scored = eng.persist(eng.map(
                score_part, emb, _portable(fitted.deployed), float(point["threshold"]), fallback,
                rule, k, enc.dimension, tuple(sorted({"test", *plan_splits})), meta=meta_s))
            qs = np.linspace(0.0, 1.0, cfg.evaluation.n_thresholds)
            scores = eng.map(score_values, scored, k, rule,
                             meta=pd.DataFrame({"score": pd.Series([], dtype="float64")}))
            qv = exact_quantiles(eng, scores, "score", qs)
            thresholds = np.unique(np.concatenate([[-np.inf], qv, [np.inf]]))
            n_test = report["decisions"]["test"]
            fraction = (cfg.objective.fraction_of_strong
                        if cfg.objective.kind == "quality_floor" else None)
            total = _ope_total(eng, scored, k, unit_cost, unit_session, n_boot, cfg.seed,
                               thresholds, fallback, rule)
            ope = ope_from_sums(total, cands, n_test, level, tag, fraction)
            if cfg.sequential.kind != "none":  # the betting bound reads test rows in time order
                seq = _by_session(eng.each(sequential_part, scored))
                ope = sequential_evidence(ope, seq["weight"].to_numpy(float),
                                          seq["reward"].to_numpy(float),
                                          seq["cost"].to_numpy(float),
                                          seq["opening_ms"].to_numpy(), cfg.sequential)

            def test_totals(dep: Any, threshold: float, fallback_j: int) -> dict:
                """OPE sums of another head (a refit) scored on the test partitions."""
                sc_j = eng.map(score_part, emb, _portable(dep), float(threshold), fallback_j,
                               rule, k, enc.dimension, ("test",), meta=meta_s)
                return _ope_total(eng, sc_j, k, unit_cost, unit_session, n_boot, cfg.seed,
                                  None, fallback_j, rule)

            def spread_at(seed: int) -> dict:
                dep_j, point_j, fallback_j = fitted.refit(seed)
                ope_j = ope_from_sums(test_totals(dep_j, point_j["threshold"], fallback_j),
                                      cands, n_test, level, tag, fraction)
                return spread_row(seed, point_j, ope_j, cfg.objective)

            spread = seed_spread(spread_row(cfg.seed, point, ope, cfg.objective), cfg.seed,
                                 cfg.spread_seeds, spread_at, SPREAD_FIGURES, SPREAD_WHAT, say)
            verdict = gate(ope, cfg.objective, float(cfg.go.sessions_per_day),
                           test_share=float(rc.test_share))
            curve = sweep_curve(total, thresholds)

        with stages("attribute"):  # the gain's sources (pipelines/router_attribution.py)
            attribution, replay_value = _attribution(
                test_totals, fitted, replays, rep_fit, cfg, unit_session,
                -ope["diff"]["cost"]["estimate"] if cfg.objective.kind != "budget"
                else ope["diff"]["quality"]["estimate"], say)

        with stages("write"):  # 7. files
            curve.to_parquet(out_dir / "router_curves_test.parquet", index=False)
            point["curve"].assign(policy="learned").to_parquet(
                out_dir / "router_curves_calibration.parquet", index=False)
            eng.write(eng.map(decisions_part, scored, cands, meta=decisions_part(meta_s, cands)),
                      out_dir / "router_decisions_test.parquet")
            labels_dir = out_dir / "router_labels.parquet"  # a dataset: one file per partition
            eng.write(eng.map(label_part, kept, meta=label_part(conform(pd.DataFrame()))),
                      labels_dir)
            if len(rep):  # the replay label rows beside them, in the same schema
                label_part(conform(rep.assign(**{OPENING_REQUEST: rep[Label.CONTEXT_KEY]}))
                           ).to_parquet(labels_dir / "replays.parquet", index=False)
            budget = int(cfg.replay_plan.budget)
            plan = _merge_plans(eng.each(plan_part, scored, k, float(point["threshold"]), rule,
                                         cands, budget, plan_splits), budget)
            plan_path = write_replay_plan(plan, out_dir / "replay_plan.jsonl")
            n_test_rows = n_avail_test = report["decisions"]["test"]
            test_rows = eng.map(rows_of, emb, ("test",), meta=meta_e)
            if n_test_rows > SERVED_SAMPLE:
                test_rows = eng.persist(eng.map(with_u, test_rows, cfg.seed + 2,
                                                meta=meta_e.assign(u=0.0)))
                thr = kth_smallest(eng, test_rows, "u", n_avail_test, SERVED_SAMPLE)
                test_rows = eng.map(below, test_rows, "u", thr, meta=meta_e)
            sample = _by_session(eng.each(rows_of, test_rows, ("test",)))

    rules = ScenarioRules.from_choices(cands, rules_doc["task_candidate"],
                                       rules_doc["default_candidate"], rules_doc["note"],
                                       rules_doc["fitted_on"], cfg.rules)
    n_fit = {s: len(f) for s, f in frames.items()}
    n_labels = {"train": n_fit["train"], "calibration": n_fit["calibration"],
                "calibration_available": n_avail["calibration"],
                "train_replays": int((rep_fit["split"] == "train").sum()) if len(rep_fit) else 0,
                "calibration_replays": int((rep_fit["split"] == "calibration").sum())
                if len(rep_fit) else 0}
    artifacts = {"curves": str(out_dir / "router_curves_test.parquet"),
                 "labels": str(out_dir / "router_labels.parquet"),
                 "test_decisions": str(out_dir / "router_decisions_test.parquet"),
                 "replay_plan": str(plan_path)}
    if q_path is not None:
        artifacts["quarantine"] = str(q_path)
    summary = receipts_summary(
        cands=cands, report=report, rep_report=rep_report, boundaries=boundaries, cfg=cfg,
        rules=rules, fitted=fitted, n_train_all=n_avail["train"], n_labels=n_labels, ope=ope,
        verdict=verdict, spread=spread, unit_cost=unit_cost, plan_rows=len(plan),
        artifacts=artifacts, timings=stages.timings)
    summary["replay_plan"]["expected_gain"] = plan_gain_facts(plan, rule)
    if attribution is not None:
        summary["attribution"] = attribution
    if replay_value is not None:
        summary["replays"]["value"] = replay_value
    summary["compute"] = {
        **eng.facts(), "partitions": int(eng.npartitions(valid)), "stages": STAGES,
        "driver_rows": {"train": n_labels["train"], "calibration": n_labels["calibration"],
                        "served_check_sample": int(len(sample))},
        "bootstrap": "session Poisson(1) weights hashed from (session_id, replicate, seed): "
                     "the same figures on either engine",
        "sampling": "train and calibration sessions for the head's fits, and the served "
                    "check's test sessions: the smallest seeded hashes of the session id"}
    meta_t = {"category": sample["category"].to_numpy(dtype=object),
              "prompt_tokens": sample["prompt_tokens"].to_numpy(float)}
    E_s = sample[cols].to_numpy(np.float32) if len(sample) else np.zeros((0, enc.dimension),
                                                                          np.float32)
    prob_s = fitted.deployed.predict_proba(E_s, meta_t) if len(sample) else np.zeros((0, k))
    choice_s = choose_by_threshold(prob_s, float(point["threshold"]), fallback=fallback, rule=rule) \
        if len(sample) else np.zeros(0, np.int64)
    texts_s = [t if isinstance(t, str) else None for t in sample[L.PROMPT_TEXT]]
    run = ReceiptsRun(config=dataclasses.replace(cfg, head=fitted.config), candidates=cands,
                      head=fitted.head, threshold=float(point["threshold"]), rules=rules,
                      summary=summary, rule=rule, fallback=int(fallback),
                      deployed=fitted.deployed if hasattr(fitted.deployed, "served_") else None,
                      golden_inputs=golden_inputs(texts_s, meta_t["category"],
                                                  meta_t["prompt_tokens"]),
                      rules_equal=None, test_choice=choice_s, test_embeddings=E_s,
                      test_meta=meta_t, test_texts=texts_s,
                      test_sessions=sample[Label.SESSION_ID].astype(str).to_numpy(),
                      fitted=fitted)
    return summary, run


def plan_gain_facts(plan: pd.DataFrame, rule: str) -> dict:
    """The plan's expected gain (`router.replay_plan.expected_gain`, routing-score units):
    its total, the mean per planned (prompt, candidate) row and per planned prompt."""
    g = pd.to_numeric(plan["expected_gain"], errors="coerce").to_numpy(float) if len(plan) \
        else np.zeros(0)
    n_prompts = int(plan["prompt_id"].nunique()) if len(plan) else 0
    total = float(np.nansum(g))
    return {"total": total, "mean_per_row": total / len(g) if len(g) else 0.0,
            "mean_per_prompt": total / n_prompts if n_prompts else 0.0, "prompts": n_prompts,
            "unit": f"routing score ({rule} rule) x decisions: the expected value of the "
                    "revealed outcome to the routing decision under the served head's belief",
            "rows_without_gain": int((~np.isfinite(g)).sum())}


def _attribution(judge_test: Callable[[Any, float, int], dict], fitted: FittedRouter,
                 replays: pd.DataFrame | None, rep_fit: pd.DataFrame, cfg: RouterPipelineConfig,
                 unit_session: np.ndarray, gate_gain: float,
                 say: Callable[[str], None]) -> tuple[dict | None, dict | None]:
    """`router_attribution.attribute` with the test split judged on the engine by
    `judge_test` (the judge stage's own test scoring of a refitted head, the seed spread's
    too); (None, None) when `router.evaluation.attribution` is off; a failed check:
    {"status": "skipped", ...}."""
    if cfg.evaluation.attribution == "off":
        return None, None
    rc = cfg.receipts

    source = None
    if replays is not None and "source" in replays.columns and len(rep_fit):
        by_pair = replays.assign(_k=replays[O.PROMPT_ID].astype(str) + "\x1f"
                                 + replays[O.CANDIDATE].astype(str)
                                 ).drop_duplicates("_k").set_index("_k")["source"]
        source = by_pair.reindex(rep_fit[Label.CONTEXT_KEY].astype(str) + "\x1f"
                                 + rep_fit[Label.CANDIDATE].astype(str)).reset_index(drop=True)
    try:
        attribution, value = attribute(fitted, judge_test, unit_session, int(rc.n_boot),
                                       float(rc.level), cfg.seed, source, gate_gain, say)
    except AttributionSkipped as e:
        say(f"attribution skipped: {e}")
        return {"status": "skipped", "reason": str(e)}, None
    return {"status": "done", **attribution}, value


def _quarantine(engine: Any, ledger: LedgerFrame) -> Any:
    """The quarantined rows as a Frame of the engine (a generic op the engine's
    LedgerFrame could offer: its `result` locally, its dataset's partitions on Dask)."""
    if ledger.result is not None:
        return engine.from_pandas(ledger.result.quarantine)
    return ledger.dataset.quarantine


def _ope_total(engine: Any, scored: Any, k: int, unit_cost: np.ndarray,
               unit_session: np.ndarray, n_boot: int, seed: int,
               thresholds: np.ndarray | None, fallback: int, rule: str) -> dict:
    """`ope_sums.ope_part` of every partition's test rows, summed (`add_ope`)."""
    got = engine.each(ope_part, scored, k, unit_cost, unit_session, n_boot, seed, None,
                      thresholds, fallback, rule)
    total = got[0]
    for g in got[1:]:
        total = add_ope(total, g)
    return total


def _policy_total(parts: list[dict]) -> dict:
    by: dict = {}
    props: dict = {}
    for p in parts:
        by = add_counts(by, p["opening_by_candidate"])
        props = add_counts(props, p["propensities"])
    return {"opening_by_candidate": dict(sorted(by.items(), key=lambda kv: -kv[1])),
            "propensities": dict(sorted(props.items(), key=lambda kv: float(kv[0])))}


def _portable(deployed: Any) -> Any:
    """What the partitions score with: the served graph as plain data, or (an isotonic
    head, which has no graph) the fitted head itself."""
    return getattr(deployed, "served_", deployed)


def _merge_plans(plans: list[pd.DataFrame], budget: int) -> pd.DataFrame:
    """The per-partition top-`budget` plans merged: the global top by priority (ties: the
    later opening first, as `replay_plan` orders them), ranks renumbered."""
    plans = [p for p in plans if len(p)]
    if not plans:
        return replay_plan(np.zeros((0, 2)), np.zeros(0, np.int64), 0.0, "absolute",
                           pd.DataFrame(), ("a", "b"), budget)
    allp = pd.concat(plans, ignore_index=True)
    allp = allp.sort_values(["priority", "opening_ms"], ascending=[False, False],
                            kind="stable").head(budget).reset_index(drop=True)
    allp["rank"] = np.arange(1, len(allp) + 1)
    return allp


def _by_session(frames: list[pd.DataFrame]) -> pd.DataFrame:
    out = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    if out.empty:
        return out.reset_index(drop=True)
    order = np.argsort(out[Label.SESSION_ID].to_numpy(dtype=str), kind="stable")
    return out.iloc[order].reset_index(drop=True)


def gather_fit_rows(engine: Any, rows: Any, cols: list[str]) -> tuple[pd.DataFrame, np.ndarray]:
    """The fit rows on the driver, ordered by session id (the head's minibatches follow row
    order): decision columns and one float32 matrix, built without a wide frame of
    embedding columns (what keeps the fit stage's peak near 2 x the matrix)."""
    parts = engine.each(fit_part, rows, cols)
    frame = pd.concat([f for f, _ in parts], ignore_index=True)
    E = np.concatenate([e for _, e in parts]) if parts else np.zeros((0, len(cols)), np.float32)
    del parts
    order = np.argsort(frame[Label.SESSION_ID].to_numpy(dtype=str), kind="stable")
    return frame.iloc[order].reset_index(drop=True), E[order]


def _replays(engine: Any, replays: pd.DataFrame | None, kept: Any, cands: tuple[str, ...],
             cfg: RouterPipelineConfig) -> tuple[pd.DataFrame, dict, pd.DataFrame]:
    """`receipts.replay_rows` against the decisions the replays name (brought back: at most
    one per replay row)."""
    if replays is None:
        empty, report = replay_rows(None, pd.DataFrame(), cands)
        return empty, report, pd.DataFrame()
    ids = set(replays["prompt_id"].astype(str)) if "prompt_id" in replays else set()
    matched = pd.concat(engine.each(matched_part, kept, ids), ignore_index=True)
    rep, report = replay_rows(replays, matched, cands, cfg.cost)
    return rep, report, matched


def _replays_for_fit(rep: pd.DataFrame, matched: pd.DataFrame,
                     frames: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """Replay rows re-pointed at the fit frames' rows; replays of openings left out of the
    fit samples go with them."""
    if not len(rep):
        return rep
    pos = pd.concat([pd.Series(f.index, index=f[OPENING_REQUEST].astype(str).to_numpy())
                     for f in frames.values()])
    key = matched[OPENING_REQUEST].astype(str).to_numpy()[rep["row"].to_numpy(np.int64)]
    row = pos.reindex(key)
    out = rep.assign(row=row.to_numpy())
    out = out[row.notna().to_numpy()]
    return out.astype({"row": "int64"}).reset_index(drop=True)
