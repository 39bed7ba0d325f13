"""`pipeline=router compute=dask data.ledger=DATASET`: the receipts router with the ledger
on the workers. This module is the driver (it plans the stages, sums what the partitions
return and decides); what runs on each partition is `pipelines/router_partitions.py`.

The same steps, checks and summary as `pipelines.router_receipts.train_router_receipts`
(read its module docstring first); what differs is where each row lives:

1. read and validate per partition (`contracts.dataset.read_ledger_dask`), the
   quarantine written by the workers;
2. one shuffle on session_id, then per partition the opening decision of every
   session (`router.receipts.opening_decisions`: a session's turns are all in one
   partition), its counts and the exploration counts summed on the driver;
3. the refusals from those sums, the split boundaries as exact order statistics of the
   sessions' opening times (`demand.dask_ops.order_statistics_dask`), the split and the
   embargo per partition (`receipts.assign_session_splits`);
4. the opening prompts embedded per partition on the worker that holds them, one
   encoder per worker process (`router.worker_encoder.EncoderSpec`), the embedding
   cache folder shared by all of them;
5. the head's fits on the driver: the train decisions of at most
   `receipts.max_train_decisions` sessions and the calibration decisions of at most
   `receipts.max_calibration_decisions` sessions, both chosen by a seeded hash of the
   session id (`router_fit.train_sample`: the local run draws the same sessions),
   ordered by session id as the local table is; the cost model from partition sums;
6. the test sessions judged on the workers with the served graph
   (the served head's runtime `HeadScorer`, which pickles as its graph): every estimator, paired difference and the threshold
   curve are partition sums (`router.ope_sums`, which the local run uses on all its test
   rows at once); the thresholds are exact quantiles of the test routing scores; the
   intervals' session Poisson bootstrap weights are a hash of (session id, replicate,
   seed), so partitions agree without talking and both modes report the same figures
   (to float summation order);
7. the test decisions and the label rows written as Parquet by the workers; the replay
   plan as per-partition top-k merged on the driver; a bounded hashed sample of test
   decisions (`SERVED_SAMPLE`) comes back for the exported artifact's served check.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from replaylab.compute.stages import DaskStages
from replaylab.contracts import Ledger as L
from replaylab.pipelines.router_fit import (
    FitData,
    decision_cost_sums,
    fit_router,
    replay_cost_sums,
    seed_spread,
    unit_costs,
)
from replaylab.pipelines.router_partitions import (
    conform,
    decision_part,
    decisions_part,
    emb_columns,
    embed_part,
    fit_part,
    plan_part,
    score_part,
    score_values,
    session_split_counts,
    with_split,
    with_u,
)
from replaylab.pipelines.router_receipts import (
    SPREAD_FIGURES,
    SPREAD_WHAT,
    gate,
    receipts_summary,
    spread_row,
)
from replaylab.pipelines.router_run import ReceiptsRun, golden_inputs
from replaylab.router.config import RouterEvalConfig
from replaylab.router.ope_sums import add_ope, ope_from_sums, ope_part, sweep_curve
from replaylab.router.pipeline_config import RouterPipelineConfig
from replaylab.router.receipts import (
    EMBARGO,
    OPENING_REQUEST,
    SPLITS,
    ReceiptsError,
    ReceiptsTable,
    check_candidates_present,
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
    policy_counts,
    rule_counts,
)
from replaylab.router.replay import Label
from replaylab.router.replay_plan import replay_plan, write_replay_plan
from replaylab.router.rules import ScenarioRules
from replaylab.router.worker_encoder import EncoderSpec
from replaylab.runtime.routing import choose_by_threshold

STAGES = {"read": "read and validate per partition, the quarantine written by the workers",
          "decisions": "one shuffle on session_id; the opening decisions per partition",
          "split": "refusals and exact split boundaries from partition sums; split per partition",
          "embed": "opening prompts embedded per partition (one encoder per worker, shared cache)",
          "fit": "the head fitted on the driver on bounded hashed samples of train and calibration",
          "judge": "test decisions and OPE as partition sums (session Poisson bootstrap)",
          "write": "test decisions and labels written by the workers; the replay plan"}
SERVED_SAMPLE = 2_000  # test decisions brought back for the exported artifact's check


# what the head's fits read of a decision (router_fit: decision_meta and the fit rows)
FIT_COLUMNS = (Label.SESSION_ID, OPENING_REQUEST, Label.CANDIDATE, "action", Label.REWARD,
               Label.COST, Label.PROPENSITY, Label.LABEL_SOURCE, Label.SESSION_COST,
               "category", "prompt_tokens", "split", "opening_ms")


def driver_peak_mb() -> float:
    """This process's peak RSS so far (MB): the driver's, the workers are other processes."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def gather_fit_rows(rows: Any, cols: list[str]) -> tuple[pd.DataFrame, np.ndarray]:
    """The fit rows on the driver, ordered by session id as the local table is (the head's
    minibatches follow row order): decision columns and one float32 matrix, built without
    a wide frame of embedding columns (what keeps the fit stage's peak near 2 x the matrix)."""
    import dask
    from dask import delayed

    parts = dask.compute(*[delayed(fit_part)(p, cols) for p in rows.to_delayed()])
    frame = pd.concat([f for f, _ in parts], ignore_index=True)
    E = np.concatenate([e for _, e in parts]) if parts else np.zeros((0, len(cols)), np.float32)
    del parts
    order = np.argsort(frame[Label.SESSION_ID].to_numpy(dtype=str), kind="stable")
    return frame.iloc[order].reset_index(drop=True), E[order]


def train_router_receipts_dask(spec: str, replays: pd.DataFrame | None,
                               cfg: RouterPipelineConfig, out_dir: Path, encoder: EncoderSpec,
                               head_scorer: str = "onnx",
                               progress: Callable[[str], None] | None = None
                               ) -> tuple[dict, ReceiptsRun]:
    """The receipts router over the ledger dataset `spec` on the current Dask client (module
    docstring). Returns (summary, run) as `train_router_receipts` does; the summary adds
    `dask` (what reached the driver, the bootstrap) and the artifacts are folders."""
    import dask
    from dask import delayed

    from replaylab.compute.ledger import DEFAULT_BLOCKSIZE, read_ledger_dask
    from replaylab.demand.dask_ops import (
        exact_order_statistics_dask,
        exact_quantiles_dask,
        kth_smallest_hash,
    )

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    cands = tuple(str(c) for c in cfg.candidates)
    k = len(cands)
    where = "data.ledger"
    if cfg.sequential.kind != "none":  # the betting bound reads the test rows in time order
        raise ReceiptsError(f"router.sequential.kind={cfg.sequential.kind}: the sequential "
                            "gate runs on the local engine only (compute=local)")
    if k < 2 or len(set(cands)) != k:
        raise ReceiptsError(f"{where}: router.candidates={list(cands)}: a router needs >= 2 "
                            "distinct candidates (cheapest first)")
    rc = cfg.receipts
    peaks: dict[str, float] = {}

    @contextmanager
    def step(stages: DaskStages, name: str) -> Iterator[None]:
        with stages(name):
            yield
        peaks[name] = driver_peak_mb()

    with dask.config.set({"dataframe.convert-string": False}), \
            DaskStages(STAGES, progress) as stages:
        # 1. read
        with step(stages, "read"):
            ds = read_ledger_dask(spec, DEFAULT_BLOCKSIZE).persist()
            accounting = ds.write_quarantine(str(out_dir / "quarantine"))
            acc = accounting.summary()
            q = ds.quarantine
            bad_prop = int(q["quarantine_detail"].astype(str).str.contains(
                L.PROPENSITY, regex=False).sum().compute()) if acc["rows_quarantined"] else 0
            if bad_prop:
                raise ReceiptsError(f"{where}: {bad_prop} row(s) have a {L.PROPENSITY} outside "
                                    "(0, 1] (quarantined): off-policy estimates need the exact "
                                    "logged probability of every choice")
            if not acc["rows_valid"]:
                raise ReceiptsError(f"{where}: no valid ledger-v1 rows "
                                    f"({acc.get('quarantine_by_reason')})")
            valid = ds.valid
            if L.ROUTING_SOURCE not in valid.columns or not int(
                    valid[L.ROUTING_SOURCE].count().compute()):
                raise ReceiptsError(f"{where}: column {L.ROUTING_SOURCE} is absent or empty: "
                                    "explored sessions cannot be told from the logging policy's "
                                    "own choices")
            present = set(valid[L.SELECTED_MODEL].dropna().astype(str).unique().compute())
            check_candidates_present(cands, present, where)

        # 2. opening decisions per partition, sessions whole after one shuffle
        with step(stages, "decisions"):
            shuffled = valid.shuffle(on=L.SESSION_ID, npartitions=valid.npartitions)
            parts = dask.persist(*[delayed(decision_part)(p, cands, encoder.encoder_id)
                                   for p in shuffled.to_delayed()])
            got = dask.compute(*[delayed(lambda r: {x: r[x] for x in (
                "counts", "exploration", "representation")})(p) for p in parts])
            counts: dict = {}
            expl: dict = {}
            rep_c: dict = {}
            for g in got:
                counts = add_counts(counts, g["counts"])
                expl = add_counts(expl, g["exploration"])
                rep_c = add_counts(rep_c, g["representation"])
            dec = dask.dataframe.from_delayed(
                [delayed(operator.getitem)(p, "dec") for p in parts], meta=conform(pd.DataFrame()),
                verify_meta=False)
            sessions = dask.dataframe.from_delayed(
                [delayed(operator.getitem)(p, "sessions") for p in parts],
                meta=pd.DataFrame({L.SESSION_ID: pd.Series([], dtype=object),
                                   "opening_ms": pd.Series([], dtype="int64"),
                                   "last_ms": pd.Series([], dtype="int64")}), verify_meta=False)

        # 3. refusals, boundaries, split
        with step(stages, "split"):
            n_sessions = int(counts.get("sessions", 0))
            report: dict = {"rows_read": acc["rows_read"], "rows_valid": acc["rows_valid"],
                            "rows_quarantined": acc["rows_quarantined"],
                            "quarantine_by_reason": acc.get("quarantine_by_reason", {}),
                            **counts_report({"other_models": {}, **counts})}
            facts, errors = exploration_facts(
                {"explored": 0, "own_propensity": {}, "explored_by_candidate": {},
                 "randomized_by_candidate": {}, **expl}, cands, float(cfg.exploration.cap),
                int(rc.min_explored_per_candidate), n_sessions)
            report["exploration"] = facts
            if errors:
                raise ReceiptsError(f"{where}: {errors[0]}")
            refusal = representation_refusal(rep_c, encoder.encoder_id, where)
            if refusal:
                raise ReceiptsError(refusal)
            widths = sorted(int(w) for w in rep_c.get("widths", {}))
            if widths and widths[0] != encoder.dimension:
                raise ReceiptsError(f"{where}: prompt_embedding width {widths[0]} differs from the "
                                    f"encoder's {encoder.dimension}")
            k_cal, k_test = split_ranks(n_sessions, rc)
            opening = sessions["opening_ms"].astype("float64")
            ranks, _ = exact_order_statistics_dask(opening,
                                                   [0, k_cal, k_test, n_sessions - 1])
            t_first, t_cal, t_test, t_last = (int(ranks[r]) for r in
                                              (0, k_cal, k_test, n_sessions - 1))
            emb_ms = int(rc.embargo_ms)
            per_split = sessions.map_partitions(
                session_split_counts, t_cal, t_test, emb_ms,
                meta=pd.DataFrame({"split": pd.Series([], dtype=object),
                                   "n": pd.Series([], dtype="int64")})
            ).groupby("split")["n"].sum().compute()
            boundaries = split_boundaries(t_first, t_cal, t_test, t_last, emb_ms,
                                          {str(a): int(b) for a, b in per_split.items()})
            dec_split = dec.map_partitions(with_split, t_cal, t_test, emb_ms,
                                           meta=conform(pd.DataFrame())).persist()
            dsc = dec_split["split"].value_counts().compute()
            report["decisions"] = {s: int(dsc.get(s, 0)) for s in (*SPLITS, EMBARGO)}
            kept = dec_split[dec_split["split"] != EMBARGO]
            for s in SPLITS:
                if not report["decisions"][s]:
                    raise ReceiptsError(f"data.ledger: no usable opening decision in the {s} split")
            pol = dask.compute(*[delayed(policy_counts)(p) for p in kept.to_delayed()])
            n_text = int(kept[L.PROMPT_TEXT].map_partitions(
                lambda s: s.map(lambda t: isinstance(t, str)), meta=(L.PROMPT_TEXT, bool)
            ).sum().compute())
            n_kept = int(sum(report["decisions"][s] for s in SPLITS))
            report["representation"] = {"prompt_text": n_text, "prompt_embedding": n_kept - n_text,
                                        "encoder_id": encoder.encoder_id}
            report["logging_policy"] = _policy_total(pol)
            rules_doc = logging_rules_from_counts(
                kept.map_partitions(rule_counts, meta=pd.DataFrame({
                    "scope": pd.Series([], dtype=object), "category": pd.Series([], dtype=object),
                    "candidate": pd.Series([], dtype=object),
                    "n": pd.Series([], dtype="int64")})).compute(), cands)

        # 4. embeddings per partition
        with step(stages, "embed"):
            meta_e = embed_part(conform(pd.DataFrame()), encoder)
            emb = kept.map_partitions(embed_part, encoder, meta=meta_e).persist()

        # 5. the fits on the driver
        with step(stages, "fit"):
            tr_all = emb[emb["split"] == "train"]
            sums = np.sum(dask.compute(*[delayed(decision_cost_sums)(p, k) for p in
                                         tr_all.to_delayed()]), axis=0)
            rep, rep_report, matched = _replays(replays, kept, cands, cfg)
            if len(rep):
                sums = sums + replay_cost_sums(rep, k)
            unit_cost, unit_session = unit_costs(sums)
            n_avail = {"train": report["decisions"]["train"],
                       "calibration": report["decisions"]["calibration"]}
            cols = emb_columns(encoder.dimension)
            frames, E_fit = {}, {}
            for s, cap, salt in (("train", rc.max_train_decisions, cfg.seed),
                                 ("calibration", rc.max_calibration_decisions, cfg.seed + 1)):
                rows = emb[emb["split"] == s][[*FIT_COLUMNS, *cols]]
                if cap is not None and n_avail[s] > cap:
                    u = rows.map_partitions(with_u, salt)
                    thr = kth_smallest_hash(u["u"], int(cap))
                    rows = u[u["u"] <= thr].drop(columns=["u"])
                frames[s], E_fit[s] = gather_fit_rows(rows, cols)
            n_tr = len(frames["train"])
            frames["train"].index = pd.RangeIndex(n_tr)
            frames["calibration"].index = pd.RangeIndex(n_tr, n_tr + len(frames["calibration"]))
            rep_fit = _replays_for_fit(rep, matched, frames)
            data = FitData(frames, E_fit, rep_fit)
            n_fit = {s: len(f) for s, f in frames.items()}
            say = progress or (lambda _m: None)
            fitted = fit_router(data, cfg, unit_cost, cands, head_scorer, say)
            point, fallback, rule = fitted.point, fitted.fallback, fitted.rule
            head = _portable(fitted.deployed)

        # 6. judge on the workers
        with step(stages, "judge"):
            n_boot, level = int(rc.n_boot), float(rc.level)
            tag = RouterEvalConfig(level=level).level_tag
            plan_splits = tuple(cfg.replay_plan.splits)
            meta_s = score_part(meta_e, head, 0.0, 0, rule, k, encoder.dimension, ("test",))
            scored = emb.map_partitions(
                score_part, head, float(point["threshold"]), fallback, rule, k, encoder.dimension,
                tuple(sorted({"test", *plan_splits})), meta=meta_s).persist()
            qs = np.linspace(0.0, 1.0, cfg.evaluation.n_thresholds)
            scores = scored.map_partitions(score_values, k, rule, meta=pd.Series([], dtype="float64"))
            qv, _ = exact_quantiles_dask(scores, qs)
            thresholds = np.unique(np.concatenate([[-np.inf], qv, [np.inf]]))
            n_test = report["decisions"]["test"]
            total = _ope_total(scored, k, unit_cost, unit_session, n_boot, cfg.seed, thresholds,
                               fallback, rule)
            fraction = (cfg.objective.fraction_of_strong
                        if cfg.objective.kind == "quality_floor" else None)
            ope = ope_from_sums(total, cands, n_test, level, tag, fraction)

            def spread_at(seed: int) -> dict:
                dep_j, point_j, fallback_j = fitted.refit(seed)
                sc_j = emb.map_partitions(
                    score_part, _portable(dep_j), float(point_j["threshold"]), fallback_j, rule, k,
                    encoder.dimension, ("test",), meta=meta_s)
                ope_j = ope_from_sums(_ope_total(sc_j, k, unit_cost, unit_session, n_boot,
                                                 cfg.seed, None, fallback_j, rule),
                                      cands, n_test, level, tag, fraction)
                return spread_row(seed, point_j, ope_j, cfg.objective)

            spread = seed_spread(spread_row(cfg.seed, point, ope, cfg.objective), cfg.seed,
                                 cfg.spread_seeds, spread_at, SPREAD_FIGURES, SPREAD_WHAT, say)
            verdict = gate(ope, cfg.objective, float(cfg.go.sessions_per_day),
                          test_share=float(cfg.receipts.test_share))
            curve = sweep_curve(total, thresholds)

        # 7. files
        with step(stages, "write"):
            curve.to_parquet(out_dir / "router_curves_test.parquet", index=False)
            point["curve"].assign(policy="learned").to_parquet(
                out_dir / "router_curves_calibration.parquet", index=False)
            tests = scored[scored["split"] == "test"]
            tests.map_partitions(decisions_part, cands, meta=decisions_part(
                meta_s, cands)).to_parquet(str(out_dir / "router_decisions_test"),
                                                 write_index=False)
            kept.drop(columns=[L.PROMPT_TEXT, L.PROMPT_EMBEDDING]).to_parquet(
                str(out_dir / "router_labels"), write_index=False)
            if len(rep):
                rep.assign(**{OPENING_REQUEST: rep[Label.CONTEXT_KEY]}).to_parquet(
                    out_dir / "router_labels_replays.parquet", index=False)
            budget = int(cfg.replay_plan.budget)
            plans = dask.compute(*[delayed(plan_part)(p, k, float(point["threshold"]), rule, cands,
                                                       budget, plan_splits)
                                   for p in scored.to_delayed()])
            plan = _merge_plans(list(plans), budget)
            plan_path = write_replay_plan(plan, out_dir / "replay_plan.jsonl")
            sample = _served_sample(emb, cfg.seed + 2)

    rules = ScenarioRules.from_choices(cands, rules_doc["task_candidate"],
                                       rules_doc["default_candidate"], rules_doc["note"],
                                       rules_doc["fitted_on"], cfg.rules)
    n_labels = {"train": n_fit["train"], "calibration": n_fit["calibration"],
                "calibration_available": n_avail["calibration"],
                "train_replays": int((rep_fit["split"] == "train").sum()) if len(rep_fit) else 0,
                "calibration_replays": int((rep_fit["split"] == "calibration").sum())
                if len(rep_fit) else 0}
    artifacts = {"curves": str(out_dir / "router_curves_test.parquet"),
                 "labels": str(out_dir / "router_labels"),
                 "test_decisions": str(out_dir / "router_decisions_test"),
                 "replay_plan": str(plan_path), "quarantine": str(out_dir / "quarantine")}
    if len(rep):
        artifacts["labels_replays"] = str(out_dir / "router_labels_replays.parquet")
    summary = receipts_summary(
        cands=cands, report=report, rep_report=rep_report, boundaries=boundaries, cfg=cfg,
        rules=rules, fitted=fitted, n_train_all=n_avail["train"], n_labels=n_labels, ope=ope,
        verdict=verdict, spread=spread, unit_cost=unit_cost, plan_rows=len(plan),
        artifacts=artifacts, timings=stages.timings)
    summary["dask"] = {
        "partitions": int(valid.npartitions), "stages": STAGES,
        "driver_peak_rss_mb_after": {k: round(v, 1) for k, v in peaks.items()},
        "driver_rows": {"train": n_labels["train"], "calibration": n_labels["calibration"],
                        "served_check_sample": int(len(sample))},
        "bootstrap": "session Poisson(1) weights hashed from (session_id, replicate, seed); "
                     "the local run's is a multinomial session bootstrap: the same point "
                     "estimates, intervals equal up to bootstrap noise",
        "sampling": "train and calibration sessions for the head's fits: the smallest "
                    "seeded hashes of the session id (the local run draws the same)"}
    cols = emb_columns(encoder.dimension)
    meta_s = {"category": sample["category"].to_numpy(dtype=object),
              "prompt_tokens": sample["prompt_tokens"].to_numpy(float)}
    E_s = sample[cols].to_numpy(np.float32)
    prob_s = fitted.deployed.predict_proba(E_s, meta_s) if len(sample) else np.zeros((0, k))
    choice_s = choose_by_threshold(prob_s, float(point["threshold"]), fallback=fallback, rule=rule) \
        if len(sample) else np.zeros(0, np.int64)
    texts_s = [t if isinstance(t, str) else None for t in sample[L.PROMPT_TEXT]]
    run = ReceiptsRun(config=dataclasses.replace(cfg, head=fitted.config), candidates=cands,
                      head=fitted.head, threshold=float(point["threshold"]), rules=rules,
                      summary=summary, rule=rule, fallback=int(fallback),
                      deployed=fitted.deployed if hasattr(fitted.deployed, "served_") else None,
                      golden_inputs=golden_inputs(texts_s, sample["category"].to_numpy(dtype=object),
                                                  sample["prompt_tokens"].to_numpy(float)),
                      rules_equal=None,
                      test_choice=choice_s, test_embeddings=E_s, test_meta=meta_s,
                      test_texts=texts_s,
                      test_sessions=sample[Label.SESSION_ID].astype(str).to_numpy())
    return summary, run


def _policy_total(parts: tuple) -> dict:
    by: dict = {}
    props: dict = {}
    for p in parts:
        by = add_counts(by, p["opening_by_candidate"])
        props = add_counts(props, p["propensities"])
    return {"opening_by_candidate": dict(sorted(by.items(), key=lambda kv: -kv[1])),
            "propensities": dict(sorted(props.items(), key=lambda kv: float(kv[0])))}


def _portable(deployed: Any) -> Any:
    """What the workers score with: the served graph as plain data, or (an isotonic head,
    which has no graph) the fitted head itself."""
    return getattr(deployed, "served_", deployed)


def _ope_total(scored: Any, k: int, unit_cost: np.ndarray, unit_session: np.ndarray,
               n_boot: int, seed: int, thresholds: np.ndarray | None, fallback: int,
               rule: str) -> dict:
    import dask
    from dask import delayed

    parts = [delayed(ope_part)(p, k, unit_cost, unit_session, n_boot, seed, None, thresholds,
                               fallback, rule) for p in scored.to_delayed()]
    got = dask.compute(*parts)
    total = got[0]
    for g in got[1:]:
        total = add_ope(total, g)
    return total


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


def _served_sample(emb: Any, seed: int) -> pd.DataFrame:
    """At most SERVED_SAMPLE test decisions (smallest seeded hashes), ordered by session."""
    from replaylab.demand.dask_ops import kth_smallest_hash

    test = emb[emb["split"] == "test"].map_partitions(with_u, seed)
    thr = kth_smallest_hash(test["u"], SERVED_SAMPLE)
    got = test[test["u"] <= thr].drop(columns=["u"]).compute()
    return got.sort_values(Label.SESSION_ID, kind="stable").reset_index(drop=True)


def _replays(replays: pd.DataFrame | None, kept: Any, cands: tuple[str, ...],
             cfg: RouterPipelineConfig) -> tuple[pd.DataFrame, dict, pd.DataFrame]:
    """`receipts.replay_rows` against the decisions the replays name (brought back: at most
    one per replay row), so every count is the local run's."""
    if replays is None:
        empty, report = replay_rows(None, ReceiptsTable(cands, pd.DataFrame(), [], None))
        return empty, report, pd.DataFrame()
    ids = set(replays["prompt_id"].astype(str)) if "prompt_id" in replays else set()
    matched = kept[kept[OPENING_REQUEST].isin(list(ids))][
        [OPENING_REQUEST, "split", Label.CANDIDATE, Label.SESSION_ID]
    ].compute().reset_index(drop=True)  # the columns replay_rows reads, one row per replay
    table = ReceiptsTable(cands, matched, [None] * len(matched), None)
    rep, report = replay_rows(replays, table, cfg.cost)
    return rep, report, matched


def _replays_for_fit(rep: pd.DataFrame, matched: pd.DataFrame,
                     frames: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """Replay rows re-pointed at the fit frames' rows; replays of openings left out of the
    fit samples go with them (as in the local run)."""
    if not len(rep):
        return rep
    pos = pd.concat([pd.Series(f.index, index=f[OPENING_REQUEST].astype(str).to_numpy())
                     for f in frames.values()])
    key = matched[OPENING_REQUEST].astype(str).to_numpy()[rep["row"].to_numpy(np.int64)]
    row = pos.reindex(key)
    out = rep.assign(row=row.to_numpy())
    out = out[row.notna().to_numpy()]
    return out.astype({"row": "int64"}).reset_index(drop=True)
