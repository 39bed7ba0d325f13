"""The quantile boosters on a Dask cluster, through `lightgbm.dask`: the one place the code
base calls lightgbm.dask (the demand pipeline's model stage on a `DaskEngine`;
`pipelines.demand_partitions`). On a `LocalEngine` the same stage fits the local
estimator (`demand.model.QuantileDemandModel.fit`) on the collected train rows.

Same design matrix, target, early-stopping tail and hyperparameters as the local
fit; only the booster training moves to the workers. LightGBM trains data-parallel:
every worker holds a share of the rows (whole partitions of the train frame),
histograms are summed over the network, so every worker grows the same trees.

Early stopping follows the local rule (LightGBM's `early_stopping` callback, the
mean pinball loss on the model scale over the time-ordered tail of train, the
best round then refit on all of train). Each worker evaluates the WHOLE tail:
the eval set has one partition per training partition, each a copy of the tail, and
the metric reads only the first copy on a worker (`_TailPinball`), so every
worker computes the same value and stops at the same round whatever the
placement of the pieces (workers stopping apart would break the allreduce).

Differences from the local fit, small and documented: LightGBM's distributed
bin boundaries come from each worker's sample of its features; the quantile
objective's leaf outputs and initial score are means of per-worker quantiles;
`num_threads` is each worker's thread count. The fitted boosters are plain local
`lightgbm.Booster`s (rebuilt from the model string, no network state), so
prediction, export and serving stay local.

lightgbm, dask and distributed are imported inside the functions (nothing at import).
`cfg` below is a `demand.config.QuantileModelConfig` (a floor above: duck-typed here):
`lightgbm_params(q, seed)`, `n_estimators`, `early_stopping_rounds`, `max_bin`,
`refit_full_train`.
"""

from __future__ import annotations

import logging
import re
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

# native LightGBM name -> scikit-learn estimator argument (the Dask estimators are sklearn-style)
_SKLEARN_NAMES = {
    "learning_rate": "learning_rate", "num_leaves": "num_leaves",
    "min_data_in_leaf": "min_child_samples", "feature_fraction": "colsample_bytree",
    "bagging_fraction": "subsample", "bagging_freq": "subsample_freq",
    "lambda_l2": "reg_lambda", "seed": "random_state",
}


class _TailPinball:
    """Eval metric of the Dask early stopping: mean pinball loss over the first `n` eval rows.

    A worker's eval set is one or more copies of the whole tail (one per training
    piece it holds); the first copy alone gives every worker the same value.
    Equal to LightGBM's `quantile` metric (labels are float32 inside LightGBM).
    """

    def __init__(self, n: int, alpha: float) -> None:
        self.n, self.alpha = int(n), float(alpha)

    def __call__(self, y_true: np.ndarray, y_pred: np.ndarray) -> tuple[str, float, bool]:
        d = np.asarray(y_true[: self.n], dtype="float64") - np.asarray(y_pred[: self.n])
        loss = np.where(d < 0, (self.alpha - 1.0) * d, self.alpha * d)
        return "quantile", float(np.mean(loss)), False


def estimator_params(native: dict, rounds: int, max_bin: int) -> dict:
    """`QuantileModelConfig.lightgbm_params` as DaskLGBMRegressor arguments.

    Sklearn names where the estimator has an argument (no alias conflicts),
    native names for the rest. num_threads is dropped: lightgbm.dask sets each
    worker's thread count.
    """
    params = dict(native)
    params.pop("num_threads", None)
    out = {"objective": params.pop("objective"), "n_estimators": int(rounds)}
    out.update({sk: params.pop(name) for name, sk in _SKLEARN_NAMES.items()})
    out.update(params)
    out["max_bin"] = int(max_bin)
    return out


class _RanksInPartOrder:
    """The client as lightgbm.dask sees it, `who_has` answering in the order of the parts asked.

    lightgbm.dask gives LightGBM ranks (and each worker its list of parts) in the
    order of `client.who_has(parts)`, which the scheduler answers in no fixed
    order; LightGBM builds each feature's bins on one rank from that rank's rows,
    so the model changed from run to run. Answered in part order, rank r holds
    piece r and the fit is repeatable. Everything else is the client itself.

    pinned: the workers (sorted addresses) the parts go to, part i to
    pinned[i % len(pinned)] (a loose restriction: a part whose worker is gone runs
    elsewhere, and the caller sees the lost worker): which rows each rank holds then
    depends only on the partitioning and the number of workers, not on where the
    scheduler happened to keep them, so a refit on as many workers is the same model.
    """

    def __init__(self, client: object, pinned: Sequence[str] | None = None) -> None:
        self._client = client
        self._pinned = list(pinned or [])
        self._futures: list[object] = []  # what lightgbm.dask submitted, cancelled by `abort`
        self._aborted = False

    def __getattr__(self, name: str) -> object:
        return getattr(self._client, name)

    def who_has(self, futures: Sequence[object], **kwargs: object) -> dict:
        found = self._client.who_has(futures, **kwargs)
        return {f.key: found[f.key] for f in futures if f.key in found}

    def _track(self, got: object) -> object:
        if self._aborted:
            raise RuntimeError("lightgbm.dask: the fit was stopped (a worker was lost)")
        self._futures.extend(got if isinstance(got, list) else [got])
        return got

    def submit(self, *args: object, **kwargs: object) -> object:
        return self._track(self._client.submit(*args, **kwargs))

    def compute(self, collections: object, **kwargs: object) -> object:
        if not self._pinned or not isinstance(collections, list | tuple) or "workers" in kwargs:
            return self._track(self._client.compute(collections, **kwargs))
        n = len(self._pinned)
        return self._track([self._client.compute(c, workers=[self._pinned[i % n]],
                                                 allow_other_workers=True, **kwargs)
                            for i, c in enumerate(collections)])

    def abort(self) -> None:
        """Cancel what lightgbm.dask submitted (its tasks pinned to a lost worker would wait
        for it forever) and refuse what it submits next: the blocked fit raises."""
        self._aborted = True
        try:
            self._client.cancel(self._futures, force=True)
        except Exception:  # a client already closing: nothing left to free
            pass


class WorkersLost(RuntimeError):
    """lightgbm.dask lost a worker and the cluster did not return to the workers the fit
    needs for the same model; the message is one line (what the worker died of is the
    caller's to add: `pipelines.stages.DaskStages.failure` reads the nannies' logs).
    lost: the addresses of the workers lost."""

    def __init__(self, message: str, lost: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.lost = list(lost)


def live_workers(client: object) -> dict[str, str]:
    """{address: server id} of the workers the scheduler has now (a restarted worker has a
    new id, often a new address)."""
    return {a: str(w.get("id", a)) for a, w in client.scheduler_info()["workers"].items()}


def await_workers(client: object, n: int, wait_s: float) -> dict[str, str]:
    """The live workers once there are at least `n` (waiting up to wait_s seconds)."""
    import time

    deadline = time.monotonic() + max(float(wait_s), 0.0)
    while True:
        live = live_workers(client)
        if len(live) >= n or time.monotonic() >= deadline:
            return live
        time.sleep(0.5)


def _workers(client: object) -> list[str]:
    workers = sorted(client.scheduler_info()["workers"])
    if not workers:
        raise RuntimeError("the Dask cluster has no workers: cannot train the demand model")
    return workers


# the network section of a booster trained on the cluster, reset to a single machine
_NETWORK = {"num_machines": "1", "machines": "", "local_listen_port": "12400",
            "tree_learner": "serial"}


def _local_booster(estimator: Any) -> Any:
    """A plain local Booster from a fitted Dask estimator (its best iteration when early-stopped).

    Rebuilt from the model string (exact: doubles are written in full) with the
    network parameters reset, so that nothing in it refers to the cluster.
    """
    import lightgbm as lgb

    text = estimator.to_local().booster_.model_to_string()
    for name, value in _NETWORK.items():
        text = re.sub(rf"^\[{name}: [^\n]*\]$", f"[{name}: {value}]", text, count=1,
                      flags=re.MULTILINE)
    return lgb.Booster(model_str=text)


def _fit(estimator: Any, X: Any, y: Any,
         categorical: Sequence[str], **kwargs: object) -> Any:
    with warnings.catch_warnings():  # the sklearn wrapper always holds n_jobs; dask drops it
        warnings.filterwarnings("ignore", message="Parameter n_jobs will be ignored")
        estimator.fit(X, y, categorical_feature=list(categorical), **kwargs)
    return estimator


BIN_SAMPLE_ROWS = 200_000  # LightGBM's bin_construct_sample_cnt: the rows a rank bins from
MIN_SAMPLE_VALUES = 30  # expected non-missing values of a categorical in a rank's bin sample


def _piece_facts(part: pd.DataFrame, categorical: Sequence[str]) -> tuple[int, dict[str, int]]:
    return len(part), {c: int(part[c].notna().sum()) for c in categorical}


def fit_layout(X: Any, categorical: Sequence[str],
               sample_rows: int = BIN_SAMPLE_ROWS) -> tuple[list[int], list[str]]:
    """(the partitions of X that hold rows, the features of `categorical` that every rank
    can bin as categorical) for a lightgbm.dask fit on X's partitions.

    A rank with no rows fails LightGBM's Dataset ("Input data must be 2 dimensional and
    non empty") and leaves the other ranks on a dead socket: empty partitions are left
    out (the model is a function of the rows, so of the non-empty partitions).

    A categorical feature with no non-missing value in the bin-finding sample of the rank
    that bins it segfaults LightGBM's distributed Dataset construction (`QuantileDemand
    Model.lightgbm_categorical` has the cause and its proof); the model drops the features
    with no category on train, and this guards the rest, per rank: a feature is kept
    categorical when every non-empty partition has a non-missing value and, when the
    frame holds more rows than one rank samples (`sample_rows`, so a rank may sample),
    a share of them that puts >= MIN_SAMPLE_VALUES in expectation in any rank's sample
    (a rank's rows are whole partitions, so the bound holds for every rank; the chance
    of none is below e^-30). The others train as numeric codes (the same codes)."""
    import dask

    facts = dask.compute(*[dask.delayed(_piece_facts)(p, list(categorical))
                           for p in X.to_delayed()])
    keep = [i for i, (n, _) in enumerate(facts) if n]
    total = sum(n for n, _ in facts)

    def binnable(c: str) -> bool:
        return all(k[c] >= 1 and (total <= sample_rows or
                                  k[c] * int(sample_rows) >= MIN_SAMPLE_VALUES * n)
                   for n, k in facts if n)

    return keep, [c for c in categorical if binnable(c)]


def _boost_levels(ordered: object, quantiles: Sequence[float], cfg: Any,
                  seed: int, head: tuple | None, full: tuple, evals: tuple | None, n_tail: int,
                  categorical: Sequence[str],
                  ) -> tuple[list[Any], list[int], list[Any]]:
    """One booster per level on the cluster: early-stopped on `head` against the tail
    (`evals`: one copy per training partition) when `head` is given, then refit on `full`
    (`cfg.refit_full_train`); else `full` for `cfg.n_estimators` rounds. Returns (boosters,
    best round counts, the early-stopped boosters; empty without early stopping)."""
    import lightgbm as lgb

    boosters: list[Any] = []
    best: list[int] = []
    stopped: list[Any] = []
    for q in quantiles:
        native = cfg.lightgbm_params(q, seed)
        rounds = int(cfg.n_estimators)
        if head is not None:
            est = lgb.DaskLGBMRegressor(client=ordered, **estimator_params(
                {**native, "metric": "None"}, rounds, cfg.max_bin))
            _fit(est, *head, categorical, eval_X=(evals[0],), eval_y=(evals[1],),
                 eval_metric=_TailPinball(n_tail, q),
                 callbacks=[lgb.early_stopping(int(cfg.early_stopping_rounds), verbose=False)])
            rounds = max(int(est.booster_.best_iteration or rounds), 1)
            booster = _local_booster(est)
            stopped.append(booster)
            if cfg.refit_full_train:
                est = lgb.DaskLGBMRegressor(
                    client=ordered, **estimator_params(native, rounds, cfg.max_bin))
                booster = _local_booster(_fit(est, *full, categorical))
        else:
            est = lgb.DaskLGBMRegressor(
                client=ordered, **estimator_params(native, rounds, cfg.max_bin))
            booster = _local_booster(_fit(est, *full, categorical))
        boosters.append(booster)
        best.append(rounds)
    return boosters, best, stopped


def _copies(one: Any, n: int) -> Any:
    """A collection of n partitions, each the (single) partition of `one` (not gathered)."""
    import dask.dataframe as dd

    return dd.from_delayed([one.to_delayed()[0]] * n, meta=one._meta, verify_meta=False)


LOST_WORKER_WAIT_S = 120.0  # seconds a refit waits for the cluster to be back to its workers


def fit_quantile_boosters_dask(client: object, head_X: Any, head_y: Any,
                               full_X: Any, full_y: Any,
                               tail_X: Any, tail_y: Any,
                               n_tail: int, quantiles: Sequence[float],
                               cfg: Any, seed: int, *,
                               categorical: Sequence[str] = (),
                               n_workers: int | None = None,
                               wait_s: float = LOST_WORKER_WAIT_S,
                               ) -> tuple[list[Any], list[int], list[Any]]:
    """One booster per quantile level by lightgbm.dask from dask collections that stay on
    the workers (`fit_boosters` lays them out).

    head_X/head_y: the design frame and model-scale target of train without the
    early-stopping tail (partition-aligned); full_X/full_y: all of train (the refit);
    tail_X/tail_y: the tail (None or n_tail == 0: no early stopping); categorical: the
    features LightGBM bins as categorical (`fit_layout`: every partition non-empty, every
    listed feature binnable on every rank). The tail is
    brought to one partition on a worker and referenced once per training partition,
    so every worker evaluates the whole tail (`_TailPinball`).
    Returns (boosters, best round counts, the early-stopped boosters) - the caller
    scores the tail with the last on the workers instead of gathering it.

    Trained on `n_workers` workers (default: those live now), partition i on the i-th
    (sorted addresses) modulo their number (`_RanksInPartOrder`), so the model is a
    function of the rows, their partitioning and n_workers. lightgbm.dask does not
    survive a lost worker (its ranks talk over sockets): when a worker is lost during
    the fit (or the cluster has fewer than n_workers), the fit waits up to wait_s
    seconds for the cluster to be back to n_workers workers (a nanny restarts a killed
    worker; a cluster manager replaces it), then refits once from the collections (Dask
    recomputes their lost partitions from the graph): the same model as an undisturbed
    fit. Raises `WorkersLost` (one line) when the workers do not come back in time or a
    worker is lost again.
    """
    import time

    n_workers = int(n_workers or len(live_workers(client)))
    if n_workers < 1:
        raise WorkersLost("the Dask cluster has no workers: cannot train the demand model")
    lost: list[str] = []
    error: BaseException | None = None
    for _ in (1, 2):
        t0 = time.monotonic()
        before = await_workers(client, n_workers, wait_s)
        if len(before) < n_workers:
            why = f"lost worker {lost[0]} during training; " if lost else ""
            raise WorkersLost(
                f"lightgbm.dask: {why}workers up: {len(before)} of the {n_workers} the fit needs, "
                f"after waiting {time.monotonic() - t0:.0f} s; the same model needs as "
                "many workers (ranks hold fixed partitions): bring the workers back (or start "
                "new ones) and rerun", lost=lost)
        pinned = sorted(before)[:n_workers]
        ordered = _RanksInPartOrder(client, pinned)
        watch = _LostWorkerWatch(client, {a: before[a] for a in pinned}, ordered)
        try:
            result = _fit_pinned(ordered, head_X, head_y, full_X, full_y, tail_X, tail_y,
                                 n_tail, quantiles, cfg, seed, categorical)
        except Exception as e:  # judged below: a lost worker's error, or the fit's own
            result, error = None, e
        finally:
            watch.stop()
        after = live_workers(client)
        lost = watch.lost or [a for a in pinned if after.get(a) != before[a]]
        if lost:
            ordered.abort()  # free the tasks still waiting for the lost worker
            logging.getLogger("replaylab").warning(
                "lightgbm.dask: lost worker %s during training; restarting the other %d, "
                "refitting once on %d workers (waiting up to %.0f s for them)", lost[0],
                len(pinned) - len(lost), n_workers, wait_s)
            restart_survivors(client, [a for a in pinned if a not in lost], lost[0], wait_s)
        if not lost:
            if result is None:
                raise error
            return result
    raise WorkersLost(f"lightgbm.dask: lost worker {lost[0]} during the fit and again during "
                      "the refit", lost=lost)


def restart_survivors(client: object, survivors: list[str], lost: str, wait_s: float) -> None:
    """Restart (through their nannies) the workers that trained beside a lost one: their
    LightGBM may block on the lost rank's socket for minutes (connect retries, the socket
    time_out) and would hold their threads from the refit. Their data is recomputed from
    the graph. Raises `WorkersLost` when they cannot be restarted (no nanny)."""
    if not survivors:
        return
    try:
        client.restart_workers(survivors, timeout=max(float(wait_s), 30.0))
    except Exception as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:160]
        raise WorkersLost(
            f"lightgbm.dask: lost worker {lost} during training and could not restart the "
            f"others for the refit ({type(e).__name__}: {first}); start the workers with a "
            "nanny (the default of `dask worker`) or rerun", lost=[lost]) from e


class _LostWorkerWatch:
    """Polls the scheduler every `POLL_S` during a fit; when one of `expected` ({address:
    id}) is gone or restarted, records it and aborts the fit (`_RanksInPartOrder.abort`):
    lightgbm.dask would otherwise wait forever for tasks pinned to the lost worker."""

    POLL_S = 1.0

    def __init__(self, client: object, expected: dict[str, str],
                 ordered: _RanksInPartOrder) -> None:
        import threading

        self.client, self.expected, self.ordered = client, expected, ordered
        self.lost: list[str] = []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self.run, name="replaylab-lgbm-watch",
                                       daemon=True)
        self.thread.start()

    def run(self) -> None:
        while not self.done.wait(self.POLL_S):
            try:
                now = live_workers(self.client)
            except Exception:  # the scheduler unreachable: the fit's own error will say so
                return
            lost = [a for a, i in self.expected.items() if now.get(a) != i]
            if lost:
                self.lost = lost
                self.ordered.abort()
                return

    def stop(self) -> None:
        self.done.set()
        self.thread.join(timeout=10)


def _fit_pinned(ordered: _RanksInPartOrder, head_X: Any, head_y: Any,
                full_X: Any, full_y: Any, tail_X: Any,
                tail_y: Any, n_tail: int, quantiles: Sequence[float],
                cfg: Any, seed: int, categorical: Sequence[str],
                ) -> tuple[list[Any], list[int], list[Any]]:
    import dask

    with dask.config.set({"dataframe.convert-string": False}):
        early = tail_X is not None and n_tail > 0
        evals = None
        if early:
            one_X = tail_X.repartition(npartitions=1).persist()
            one_y = tail_y.repartition(npartitions=1).persist()
            evals = (_copies(one_X, head_X.npartitions), _copies(one_y, head_X.npartitions))
        return _boost_levels(ordered, quantiles, cfg, seed,
                             (head_X, head_y) if early else None,
                             (full_X, full_y), evals, n_tail, categorical)


def fit_boosters(engine: Any, head: tuple[Any, Any], full: tuple[Any, Any],
                 tail: tuple[Any, Any] | None, n_tail: int, quantiles: Sequence[float],
                 cfg: Any, seed: int, categorical: Sequence[str], n_workers: int | None = None,
                 ) -> tuple[list[Any], list[int], list[Any], list[str], int]:
    """The quantile boosters on a `DaskEngine`'s cluster from (X, y) frames of the design
    matrix and model-scale target: head = train without the early-stopping tail, full =
    all of train, tail = the tail (None: no early stopping; head is full then).

    LightGBM's ranks get no empty partition and bin as categorical only the features of
    `categorical` every rank can bin (`fit_layout`; the others train as numeric codes).
    Trained on `n_workers` workers (default: as many as the cluster has now; a run passes
    the count it started with: the model is a function of the rows, their partitioning
    and that number); a lost worker is waited for (dask config
    `replaylab.lost-worker-wait`, default LOST_WORKER_WAIT_S s) and the fit redone once.
    Returns (boosters, best round counts, early-stopped boosters, the features binned as
    categorical, the train partitions left out for holding no row)."""
    import dask

    cats = list(categorical)
    keep_full, cats_full = fit_layout(full[0], cats)
    same = head[0] is full[0]
    keep_head, cats_head = (keep_full, cats_full) if same else fit_layout(head[0], cats)
    binned = [c for c in cats if c in cats_full and c in cats_head]

    def non_empty(X: Any, y: Any, keep: list[int]) -> tuple[Any, Any]:
        return (X, y) if len(keep) == X.npartitions else (X.partitions[keep],
                                                          y.partitions[keep])

    empty = int(full[0].npartitions - len(keep_full))
    full = non_empty(*full, keep_full)
    head = full if same else non_empty(*head, keep_head)
    boosters, best, stopped = fit_quantile_boosters_dask(
        engine.client, *head, *full, *(tail or (None, None)), n_tail if tail else 0,
        quantiles, cfg, seed, categorical=binned,
        n_workers=n_workers or len(engine.client.scheduler_info()["workers"]),
        wait_s=dask.config.get("replaylab.lost-worker-wait", LOST_WORKER_WAIT_S))
    return boosters, best, stopped, binned, empty
