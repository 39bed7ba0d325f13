"""How an experiment's cells run: `LocalGrid` (in this process) or `EngineGrid` (on the
run's compute engine, `replaylab.compute`: compute=local or compute=dask), with the same
results. Part of the harness (`harness/__init__.py`).

The one home of a fleet experiment's fan-out: its grid of cells, run here or on Dask.

An experiment lists its cells (a (policy, window or load, seed) combination, in the
order it aggregates them) and a top-level, picklable `fn(shared, cell) -> result`
that runs one cell: one simulation (or a few that belong together) and its picklable
outcome: the SimResult (the pooled p99s and the per-window slices need its per-request
arrays) and the few facts the experiment aggregates. `shared` is what every cell reads
(pools, workloads, specs): it is handed to each call locally and sent to the Dask workers
once (`Engine.submit_all` scatters it).

    runner.map(fn, cells, shared=..., desc="overload cells")   # results in cell order

`LocalGrid` (the library's default, no engine) runs the cells in a plain loop, in order,
in this process (or, with `workers` > 1, in that many forked processes, as
`autoscaling.workers` asks). `EngineGrid(engine)` (what `python -m evaluation` hands an
experiment) runs them where the engine processes its work: on the local engine exactly
as `LocalGrid`; on Dask one task per cell (`engine.submit_all`), gathered in cell order,
under one engine stage (a log line, the cluster's task bar, a lost worker as one line).
No cell reads random state another cell left behind: every simulation is seeded by its
own cell's data (the workload was drawn with its own seed; the simulator and the policies
are deterministic), so the results are identical however and wherever the cells run.
No Dask import here: the engine package is the only one that talks to Dask.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol


class GridRunner(Protocol):
    """How a fleet experiment's cells run: `map(fn, cells, shared=, desc=, workers=)`."""

    kind: str

    def map(self, fn: Callable[[Any, Any], Any], cells: Sequence, *, shared: Any = None,
            desc: str = "cells", workers: int = 1) -> list:
        """[fn(shared, cell) for cell in cells], however they run; the order is the cells'."""
        ...


def progress_bar(total: int, desc: str):
    """tqdm on stderr (as the rest of replaylab); disabled when stderr is not a terminal."""
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="cell", disable=None)


def call_cell(fn: Callable[[Any, Any], Any], shared: Any, cell: Any) -> Any:
    """One cell: fn(shared, cell). Top level, so a process pool can pickle it."""
    return fn(shared, cell)


@dataclass(frozen=True)
class LocalGrid:
    """The cells in this process, in order (compute=local); `workers` > 1 (autoscaling's
    own option) runs them in that many forked processes, results still in cell order."""

    progress: bool = True
    kind: str = "local"

    def map(self, fn: Callable[[Any, Any], Any], cells: Sequence, *, shared: Any = None,
            desc: str = "cells", workers: int = 1) -> list:
        cells = list(cells)
        bar = progress_bar(len(cells), desc) if self.progress else None
        try:
            if workers <= 1 or len(cells) <= 1:
                out = []
                for cell in cells:
                    out.append(fn(shared, cell))
                    if bar is not None:
                        bar.update()
                return out
            from concurrent.futures import ProcessPoolExecutor
            from functools import partial
            from multiprocessing import get_context

            with ProcessPoolExecutor(min(workers, len(cells)),
                                     mp_context=get_context("fork")) as ex:
                out = []
                for r in ex.map(partial(call_cell, fn, shared), cells):
                    out.append(r)
                    if bar is not None:
                        bar.update()
                return out
        finally:
            if bar is not None:
                bar.close()


def run_cell(cell: Any, fn: Callable[[Any, Any], Any], shared: Any) -> Any:
    """One cell as an engine task (`Engine.submit_all` calls fn(item, *args)): fn(shared, cell)."""
    return fn(shared, cell)


@dataclass(frozen=True)
class EngineGrid:
    """The cells where `engine` (a `replaylab.compute.Engine`) processes its work: on the
    local engine in this process as `LocalGrid` (its bar, `workers` forked processes when
    the experiment asks); otherwise one engine task per cell, results in cell order (a
    failed cell raises its error), under one engine stage named by `desc`."""

    engine: Any
    progress: bool = True

    @property
    def kind(self) -> str:
        return self.engine.kind

    def map(self, fn: Callable[[Any, Any], Any], cells: Sequence, *, shared: Any = None,
            desc: str = "cells", workers: int = 1) -> list:
        if self.engine.kind == "local":  # this process: the loop (or autoscaling's pool)
            return LocalGrid(progress=self.progress).map(fn, cells, shared=shared, desc=desc,
                                                         workers=workers)
        cells = list(cells)
        if not cells:
            return []
        if not self.progress:
            return self.engine.submit_all(run_cell, cells, fn, shared)
        with self.engine.stage(desc):
            return self.engine.submit_all(run_cell, cells, fn, shared)


def local_grid() -> LocalGrid:
    """The default runner: today's loop."""
    return LocalGrid()
