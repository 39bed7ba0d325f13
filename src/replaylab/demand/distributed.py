"""The quantile boosters on a Dask cluster (compute=dask), through `lightgbm.dask`.

Same design matrix, target, early-stopping tail and hyperparameters as the local
path (`QuantileDemandModel.fit`); only the booster training moves to the
workers. LightGBM trains data-parallel: every worker holds a share of the rows,
histograms are summed over the network, so every worker grows the same trees.

Rows go to the workers as pandas pieces (scattered, no graph holding the data):
a seeded random permutation split into one piece per worker, so that every
worker sees the same distribution (LightGBM averages the per-worker quantiles
for the initial score and the leaf outputs of the quantile objective; pieces cut
by time would bias them). The pieces keep the design frame's categorical dtype
with the categories fixed on train (`QuantileDemandModel.categories_`), so every
worker, and the fitted booster's `pandas_categorical`, share the local path's codes.

Early stopping follows the local rule (LightGBM's `early_stopping` callback, the
mean pinball loss on the model scale over the time-ordered tail of train, the
best round then refit on all of train). Each worker evaluates the WHOLE tail:
the eval set has one partition per training piece, each a copy of the tail, and
the metric reads only the first copy on a worker (`_TailPinball`), so every
worker computes the same value and stops at the same round whatever the
placement of the pieces (workers stopping apart would break the allreduce).

Differences from the local fit, small and documented: LightGBM's distributed
bin boundaries come from each worker's sample of its features; the quantile
objective's leaf outputs and initial score are means of per-worker quantiles;
`num_threads` is each worker's thread count. The fitted boosters are plain local
`lightgbm.Booster`s (rebuilt from the model string, no network state), so
prediction, export and serving stay local.
"""

from __future__ import annotations

import logging
import re
import warnings
from collections.abc import Sequence

import dask
import dask.dataframe as dd
import lightgbm as lgb
import numpy as np
import pandas as pd

from replaylab.demand.config import QuantileModelConfig

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


def _scatter_pieces(client: object, X: pd.DataFrame, target: np.ndarray, rows: np.ndarray,
                    workers: list[str], seed: int) -> list[tuple[object, object]]:
    """rows (positions into X) in a seeded random order, one (X, y) piece scattered per worker."""
    order = np.random.default_rng(seed).permutation(rows)
    pieces = []
    for w, idx in zip(workers, np.array_split(order, len(workers)), strict=True):
        if len(idx) == 0:
            continue
        x_piece = X.iloc[idx]
        y_piece = pd.Series(target[idx], index=x_piece.index, name="target")
        fx, fy = client.scatter([x_piece, y_piece], workers=[w], hash=False)
        pieces.append((fx, fy))
    return pieces


def _collections(pieces: Sequence[tuple[object, object]], meta_x: pd.DataFrame,
                 ) -> tuple[dd.DataFrame, dd.Series]:
    """A dask frame and series, one partition per scattered piece (aligned)."""
    meta_y = pd.Series([], dtype="float64", name="target")
    X = dd.from_delayed([p[0] for p in pieces], meta=meta_x, verify_meta=False)
    y = dd.from_delayed([p[1] for p in pieces], meta=meta_y, verify_meta=False)
    return X, y


# the network section of a booster trained on the cluster, reset to a single machine
_NETWORK = {"num_machines": "1", "machines": "", "local_listen_port": "12400",
            "tree_learner": "serial"}


def _local_booster(estimator: lgb.DaskLGBMRegressor) -> lgb.Booster:
    """A plain local Booster from a fitted Dask estimator (its best iteration when early-stopped).

    Rebuilt from the model string (exact: doubles are written in full) with the
    network parameters reset, so that nothing in it refers to the cluster.
    """
    text = estimator.to_local().booster_.model_to_string()
    for name, value in _NETWORK.items():
        text = re.sub(rf"^\[{name}: [^\n]*\]$", f"[{name}: {value}]", text, count=1,
                      flags=re.MULTILINE)
    return lgb.Booster(model_str=text)


def _fit(estimator: lgb.DaskLGBMRegressor, X: dd.DataFrame, y: dd.Series,
         categorical: Sequence[str], **kwargs: object) -> lgb.Booster:
    with warnings.catch_warnings():  # the sklearn wrapper always holds n_jobs; dask drops it
        warnings.filterwarnings("ignore", message="Parameter n_jobs will be ignored")
        estimator.fit(X, y, categorical_feature=list(categorical), **kwargs)
    return estimator


BIN_SAMPLE_ROWS = 200_000  # LightGBM's bin_construct_sample_cnt: the rows a rank bins from
MIN_SAMPLE_VALUES = 30  # expected non-missing values of a categorical in a rank's bin sample


def _piece_facts(part: pd.DataFrame, categorical: Sequence[str]) -> tuple[int, dict[str, int]]:
    return len(part), {c: int(part[c].notna().sum()) for c in categorical}


def fit_layout(X: dd.DataFrame, categorical: Sequence[str],
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
    facts = dask.compute(*[dask.delayed(_piece_facts)(p, list(categorical))
                           for p in X.to_delayed()])
    keep = [i for i, (n, _) in enumerate(facts) if n]
    total = sum(n for n, _ in facts)

    def binnable(c: str) -> bool:
        return all(k[c] >= 1 and (total <= sample_rows or
                                  k[c] * int(sample_rows) >= MIN_SAMPLE_VALUES * n)
                   for n, k in facts if n)

    return keep, [c for c in categorical if binnable(c)]


def _boost_levels(ordered: object, quantiles: Sequence[float], cfg: QuantileModelConfig,
                  seed: int, head: tuple | None, full: tuple, evals: tuple | None, n_tail: int,
                  categorical: Sequence[str],
                  ) -> tuple[list[lgb.Booster], list[int], list[lgb.Booster]]:
    """One booster per level on the cluster: early-stopped on `head` against the tail
    (`evals`: one copy per training partition) when `head` is given, then refit on `full`
    (`cfg.refit_full_train`); else `full` for `cfg.n_estimators` rounds. Returns (boosters,
    best round counts, the early-stopped boosters; empty without early stopping)."""
    boosters: list[lgb.Booster] = []
    best: list[int] = []
    stopped: list[lgb.Booster] = []
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


def fit_quantile_boosters(client: object, X: pd.DataFrame, target: np.ndarray, tail: np.ndarray,
                          quantiles: Sequence[float], cfg: QuantileModelConfig, seed: int,
                          categorical: Sequence[str] = (),
                          ) -> tuple[list[lgb.Booster], list[int], list[np.ndarray]]:
    """One booster per quantile, trained on the cluster behind `client`.

    X: the design frame (n, f) (float and fixed-category categorical columns);
    target: (n,) on the model scale; tail: (n,) bool, the early-stopping rows
    (none: no early stopping); categorical: the features LightGBM bins as categorical
    (`QuantileDemandModel.lightgbm_categorical`: pieces are a random permutation, so a
    feature with a category on train has it on every piece). Returns (boosters, best round counts, the
    early-stopped boosters' raw predictions on the tail per level, empty without
    a tail), as the local path does.
    """
    workers = _workers(client)
    ordered = _RanksInPartOrder(client)
    target = np.asarray(target, dtype="float64")
    head_rows, tail_rows = np.flatnonzero(~tail), np.flatnonzero(tail)
    meta = X.iloc[:0]
    with dask.config.set({"dataframe.convert-string": False}):
        if tail.any():
            # train = head pieces + tail pieces (the refit); early stopping on the head alone
            head = _scatter_pieces(client, X, target, head_rows, workers, seed)
            rest = _scatter_pieces(client, X, target, tail_rows, workers, seed + 1)
            full_X, full_y = _collections(head + rest, meta)
            head_X, head_y = _collections(head, meta)
            x_tail = X.iloc[tail_rows]
            y_tail = pd.Series(target[tail_rows], index=x_tail.index, name="target")
            fx, fy = client.scatter([x_tail, y_tail], broadcast=True, hash=False)
            evals = _collections([(fx, fy)] * len(head), meta)
            early = (head_X, head_y)
        else:
            full_X, full_y = _collections(
                _scatter_pieces(client, X, target, np.arange(len(X)), workers, seed), meta)
            early = evals = None
        boosters, best, stopped = _boost_levels(ordered, quantiles, cfg, seed, early,
                                                (full_X, full_y), evals, len(tail_rows),
                                                categorical)
    # the early-stopped boosters' raw predictions on the tail (none without a tail)
    tail_raw = [booster.predict(x_tail, num_iteration=rounds)
                for booster, rounds in zip(stopped, best, strict=False)]
    return boosters, best, tail_raw


def _copies(one: dd.DataFrame | dd.Series, n: int) -> dd.DataFrame | dd.Series:
    """A collection of n partitions, each the (single) partition of `one` (not gathered)."""
    return dd.from_delayed([one.to_delayed()[0]] * n, meta=one._meta, verify_meta=False)


LOST_WORKER_WAIT_S = 120.0  # seconds a refit waits for the cluster to be back to its workers


def fit_quantile_boosters_dask(client: object, head_X: dd.DataFrame, head_y: dd.Series,
                               full_X: dd.DataFrame, full_y: dd.Series,
                               tail_X: dd.DataFrame | None, tail_y: dd.Series | None,
                               n_tail: int, quantiles: Sequence[float],
                               cfg: QuantileModelConfig, seed: int, *,
                               categorical: Sequence[str] = (),
                               n_workers: int | None = None,
                               wait_s: float = LOST_WORKER_WAIT_S,
                               ) -> tuple[list[lgb.Booster], list[int], list[lgb.Booster]]:
    """`fit_quantile_boosters` from dask collections that stay on the workers.

    head_X/head_y: the design frame and model-scale target of train without the
    early-stopping tail (partition-aligned); full_X/full_y: all of train (the refit);
    tail_X/tail_y: the tail (None or n_tail == 0: no early stopping); categorical: the
    features LightGBM bins as categorical (`fit_layout`: every partition non-empty, every
    listed feature binnable on every rank). The tail is
    brought to one partition on a worker and referenced once per training partition,
    so every worker evaluates the whole tail (`_TailPinball`, as the scattered path).
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


def _fit_pinned(ordered: _RanksInPartOrder, head_X: dd.DataFrame, head_y: dd.Series,
                full_X: dd.DataFrame, full_y: dd.Series, tail_X: dd.DataFrame | None,
                tail_y: dd.Series | None, n_tail: int, quantiles: Sequence[float],
                cfg: QuantileModelConfig, seed: int, categorical: Sequence[str],
                ) -> tuple[list[lgb.Booster], list[int], list[lgb.Booster]]:
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
